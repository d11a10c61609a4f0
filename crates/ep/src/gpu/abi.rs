//! The intranode kernels' ABI: the heap layout every rank shares, the by-value parameter
//! structs of kernels/ep_intranode.cu, the wrap-safe sequence numbers and the launch flags.

use super::{GpuResult, MAX_GPU_WORLD};
use crate::config::EpConfig;
use crate::error::EpError;

/// Byte offsets of the regions inside every rank's heap (256-byte aligned), for
/// `max_recv_tokens` slots. Sizes: `recv_x` and `comb_x` hold `hidden x max_token_type_size`
/// bytes per slot, weights `top_k x 4`, indices `top_k x 8`, scales `scale_dim x
/// scale_type_size`, sources 4; then two u32 slot counters and two `u64[world x block_num]`
/// flag arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct HeapLayout {
    /// Received rows.
    pub recv_x: u64,
    /// Received weights (f32).
    pub recv_w: u64,
    /// Received expert ids.
    pub recv_idx: u64,
    /// Received scales.
    pub recv_scales: u64,
    /// Received flat source positions (i32, `src_rank * max_tokens_per_rank + token`).
    pub recv_src: u64,
    /// Combine input rows.
    pub comb_x: u64,
    /// Combine input weights (f32).
    pub comb_w: u64,
    /// Slot counters.
    pub counters: u64,
    /// Dispatch signals.
    pub signals: u64,
    /// Combine arrival flags.
    pub comb_flags: u64,
    /// Total bytes.
    pub total: u64,
}

impl HeapLayout {
    /// The layout for `cfg`. Errors: [`EpError::SizeOverflow`] when a region overflows.
    pub fn new(cfg: &EpConfig) -> GpuResult<Self> {
        let n = cfg.max_recv_tokens as u64;
        let row = (cfg.hidden * cfg.max_token_type_size) as u64;
        let flags = (cfg.world_size as u64).checked_mul(cfg.block_num as u64).and_then(|v| v.checked_mul(8));
        let sizes = [
            n.checked_mul(row),
            n.checked_mul(cfg.top_k as u64 * 4),
            n.checked_mul(cfg.top_k as u64 * 8),
            n.checked_mul((cfg.scale_dim * cfg.scale_type_size) as u64),
            n.checked_mul(4),
            n.checked_mul(row),
            n.checked_mul(cfg.top_k as u64 * 4),
            Some(16),
            flags,
            flags,
        ];
        let mut offs = [0u64; 11];
        let mut at = 0u64;
        for (i, s) in sizes.iter().enumerate() {
            offs[i] = at;
            let s = s.ok_or(EpError::SizeOverflow { what: "heap region bytes", limit: "u64" })?;
            at = at.checked_add(s.div_ceil(256) * 256).ok_or(EpError::SizeOverflow { what: "heap bytes", limit: "u64" })?;
        }
        offs[10] = at;
        let [recv_x, recv_w, recv_idx, recv_scales, recv_src, comb_x, comb_w, counters, signals, comb_flags, total] = offs;
        Ok(HeapLayout { recv_x, recv_w, recv_idx, recv_scales, recv_src, comb_x, comb_w, counters, signals, comb_flags, total })
    }
}

/// `EpRankArgs` of the kernel ABI (kernels/ep_intranode.cu).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C)]
pub(super) struct RankArgs {
    pub(super) rank: u32,
    pub(super) num_tokens: u32,
    pub(super) comb_in_rows: u32,
    pub(super) comb_w_rows: u32,
    pub(super) x: u64,
    pub(super) weights: u64,
    pub(super) idx: u64,
    pub(super) scales: u64,
    pub(super) send_map: u64,
    pub(super) comb_in: u64,
    pub(super) comb_w_in: u64,
    pub(super) out: u64,
    pub(super) out_w: u64,
    pub(super) status: u64,
    pub(super) trace: u64,
    /// `u32 [2]` (dispatch, combine) sequence words on the device, or 0 (use `Params::seq`).
    pub(super) seq_word: u64,
}

/// `EpParams` of the kernel ABI: 672 bytes.
#[derive(Clone, Copy)]
#[repr(C)]
pub(super) struct Params {
    pub(super) heap: [u64; MAX_GPU_WORLD],
    pub(super) lay: [u64; 10],
    pub(super) rank_args: u64,
    pub(super) timeout_ns: u64,
    pub(super) num_local: u32,
    pub(super) world: u32,
    pub(super) blocks_per_rank: u32,
    pub(super) row_bytes: u32,
    pub(super) hidden: u32,
    pub(super) top_k: u32,
    pub(super) idx_size: u32,
    pub(super) scale_bytes: u32,
    pub(super) experts_per_rank: u32,
    pub(super) max_tokens: u32,
    pub(super) max_recv: u32,
    pub(super) seq: u32,
    pub(super) flags: u32,
    pub(super) comb_in_elem: u32,
    pub(super) comb_out_elem: u32,
    pub(super) pad: u32,
}

/// The sequence number of the operation after `seq`: dispatches and combines each count
/// their own, wrapping at 2^32 with 0 an ordinary value. Skipping 0 would break the kernels'
/// slot-counter parity ([`counter_parity`]) at the wrap: `u32::MAX` and 1 are both odd.
pub(super) const fn next_seq(seq: u32) -> u32 {
    seq.wrapping_add(1)
}

/// Whether a flag holding sequence `flag` has reached operation `want`: the kernels'
/// `ep_seq_reached` (kernels/ep_intranode.cu), serial-number arithmetic over 2^32. `flag` may
/// be `want` or up to 2^31 - 1 past it; every block signals every rank on every operation, so
/// a flag is at most one operation behind (not reached) or one ahead (a peer already past this
/// barrier). A plain `flag >= want` took a flag left at `u32::MAX` for operation 0's.
/// (The kernels decide; the host keeps this mirror for its tests.)
#[cfg(test)]
const fn seq_reached(flag: u32, want: u32) -> bool {
    flag.wrapping_sub(want) as i32 >= 0
}

/// Which of a rank's two slot counters a dispatch reserves on (the kernels' `seq & 1`): it
/// alternates between consecutive dispatches, so a dispatch never adds to the counter the
/// previous one's receiver is still resetting.
#[cfg(test)]
const fn counter_parity(seq: u32) -> u32 {
    seq & 1
}

pub(super) const FLAG_DROP_OUT_OF_RANGE: u32 = 1;
pub(super) const FLAG_WEIGHTED: u32 = 2;
/// Every rank's heap is on the one GPU of the launch: the kernels synchronize at device scope.
pub(super) const FLAG_ONE_DEVICE: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::EpGpuError;

    #[test]
    fn abi_sizes_match_the_kernel() {
        assert_eq!(std::mem::size_of::<Params>(), 672);
        assert_eq!(std::mem::size_of::<RankArgs>(), 112);
    }

    #[test]
    fn layout_regions_are_disjoint_aligned_and_sized() {
        let mut cfg = EpConfig::new(8, 7168, 256, 8, 4096).unwrap();
        cfg.max_token_type_size = 2;
        cfg.scale_dim = 56;
        cfg.block_num = 16;
        let l = HeapLayout::new(&cfg).unwrap();
        let n = 8 * 4096u64;
        let starts =
            [l.recv_x, l.recv_w, l.recv_idx, l.recv_scales, l.recv_src, l.comb_x, l.comb_w, l.counters, l.signals, l.comb_flags, l.total];
        let sizes = [n * 7168 * 2, n * 32, n * 64, n * 56 * 4, n * 4, n * 7168 * 2, n * 32, 16, 8 * 16 * 8, 8 * 16 * 8];
        for i in 0..10 {
            assert_eq!(starts[i] % 256, 0, "region {i}");
            assert!(starts[i] + sizes[i] <= starts[i + 1], "region {i} overlaps the next");
        }
        assert_eq!(l.recv_x, 0);
        assert!(l.total < 1_200_000_000, "{}", l.total);
    }

    #[test]
    fn layout_refuses_overflowing_flag_arrays() {
        let mut cfg = EpConfig::new(8, 7168, 256, 8, 16).unwrap();
        cfg.block_num = usize::MAX / 4;
        assert!(matches!(HeapLayout::new(&cfg), Err(EpGpuError::Ep(EpError::SizeOverflow { .. }))));
    }

    /// Dispatches (or combines) near the 2^32 wrap, simulated as the receiver's kernel sees
    /// them: 3 ranks x 2 blocks of flags, each operation's signals arriving one by one.
    #[test]
    fn sequence_and_flags_across_the_wrap() {
        let mut seq = u32::MAX - 2;
        let mut flags = [seq; 6];
        let mut seqs = Vec::new();
        for _ in 0..6 {
            let prev = seq;
            seq = next_seq(seq);
            seqs.push(seq);
            assert_ne!(counter_parity(seq), counter_parity(prev), "parity must alternate: {prev} -> {seq}");
            // Before any sender signals, no flag (all at the previous operation) counts.
            assert!(flags.iter().all(|&f| !seq_reached(f, seq)), "{seq}: {flags:?}");
            for i in 0..flags.len() {
                flags[i] = seq;
                let reached: Vec<bool> = flags.iter().map(|&f| seq_reached(f, seq)).collect();
                assert_eq!(reached, (0..flags.len()).map(|j| j <= i).collect::<Vec<_>>(), "{seq}: {flags:?}");
            }
            // A peer already past this barrier (signalling the next operation) counts too.
            assert!(seq_reached(next_seq(seq), seq));
        }
        assert_eq!(seqs, [u32::MAX - 1, u32::MAX, 0, 1, 2, 3]);
        // A fresh heap (flags 0) does not satisfy the first operation (1).
        assert_eq!(next_seq(0), 1);
        assert!(!seq_reached(0, 1));
        // What the old rule (`flag >= want`, 0 skipped) did at the wrap: operation 1 followed
        // u32::MAX (same parity), and its stale flags already counted.
        let old_next = |s: u32| s.wrapping_add(1).max(1);
        assert_eq!((old_next(u32::MAX), old_next(u32::MAX) & 1), (1, counter_parity(u32::MAX)));
        let old_reached = |flag: u32, want: u32| flag >= want;
        assert!(old_reached(u32::MAX, old_next(u32::MAX)));
        assert!(!seq_reached(u32::MAX, next_seq(u32::MAX)));
    }

    /// The kernels compare with the rule the host mirrors (kernels/ep_intranode.cu).
    #[test]
    fn kernel_source_compares_sequences_wrap_safe() {
        let src = include_str!("../../../../kernels/ep_intranode.cu");
        assert!(src.contains("MORI_DEVICE bool ep_seq_reached(uint32_t flag, uint32_t want) { return (int32_t)(flag - want) >= 0; }"));
        assert!(src.contains("if (ep_seq_reached((uint32_t)(high ? (v >> 32) : v), want)) break;"));
        assert!(!src.contains(">= want"), "a plain >= comparison of sequences is back");
        assert_eq!(src.matches("ep_wait_flags(p, a,").count(), 2);
    }
}
