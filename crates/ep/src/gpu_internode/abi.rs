//! `#[repr(C)]` mirrors of kernels/ep_internode.h's parameter structs (field for field, same
//! order, natural alignment); sizes checked in the tests below.

use crate::gpu_ring::RingDev;

/// `IeLayout`: byte offsets inside every rank's window.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IeLayout {
    /// Dispatch segment of source `s` at `disp_in + s * seg_rec`.
    pub disp_in: u64,
    /// Combine segment of rank `e` at `comb_in + e * seg_comb`.
    pub comb_in: u64,
    /// Staging of records for destination `d` at `out_disp + d * seg_rec`.
    pub out_disp: u64,
    /// Staging of combine rows for source `s` at `out_comb + s * seg_comb`.
    pub out_comb: u64,
    /// `max_tokens * rec_bytes`.
    pub seg_rec: u64,
    /// `max_tokens * max(comb_bytes, part_bytes)` (V1 and V1-LL partials land in `comb_in`).
    pub seg_comb: u64,
    /// Other nodes' counter pairs, u64 `[phase 2][writer W][arrived, total]` (written by their
    /// proxies' tail writes).
    pub ctr: u64,
    /// This rank's outgoing pairs, u64 `[phase 2][destination W][arrived, total]` (the tail
    /// writes' sources).
    pub sig: u64,
    /// V1-LL: relay segment from origin node `m` at `relay_in + m * seg_relay`.
    pub relay_in: u64,
    /// V1-LL: staging of the relay segment for node `m` at `out_relay + m * seg_relay`.
    pub out_relay: u64,
    /// `relay_hdr + max_tokens * (V1-LL gpn, V1 1) * rec_bytes` (0 under AsyncLL).
    pub seg_relay: u64,
    /// Header bytes of a relay segment: u32 `[gpn]` records per destination, then u32 records;
    /// 16-aligned.
    pub relay_hdr: u64,
    /// V1-LL: rows for origin node `m` from local rank `l` at `gather + (m * gpn + l) * seg_gather`
    /// ([`FLAG_COMB_ROWS`]: the relay's partials for origin node `m` at
    /// `gather + m * gpn * seg_gather` instead).
    pub gather: u64,
    /// `max_tokens * comb_bytes` (0 under AsyncLL).
    pub seg_gather: u64,
    /// u32 `[W]`: the rank's first received row per source (its `recv_base`), written by its
    /// dispatch; with [`FLAG_COMB_ROWS`] a same-node source's sum (V1, V1-LL: and a relay)
    /// reads its rows in place, at `out_comb + (rbase[s] + index) * comb_bytes`.
    pub rbase: u64,
}

/// `IeRank`: one local rank's buffers (device addresses).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct IeRank {
    pub rank: u32,
    pub num_tokens: u32,
    pub comb_rows: u32,
    pub pad: u32,
    pub x: u64,
    pub weights: u64,
    pub idx: u64,
    pub scales: u64,
    pub mask: u64,
    pub pre: u64,
    pub npre: u64,
    pub cnt: u64,
    pub recv_cnt: u64,
    pub recv_base: u64,
    pub done: u64,
    pub out_x: u64,
    pub out_w: u64,
    pub out_idx: u64,
    pub out_scales: u64,
    pub out_src: u64,
    pub comb_x: u64,
    pub comb_w: u64,
    pub comb_out: u64,
    pub comb_out_w: u64,
    pub status: u64,
    /// u64 trace stamps ([`super::trace`]), or 0.
    pub trace: u64,
    pub ring: RingDev,
}

/// `IeParams`: the by-value parameter of every kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct IeParams {
    pub win: [u64; super::MAX_WORLD],
    pub dev_ctr: [u64; super::MAX_WORLD],
    pub lay: IeLayout,
    pub ranks: u64,
    pub timeout_ns: u64,
    pub num_local: u32,
    pub world: u32,
    pub gpn: u32,
    pub blocks_per_rank: u32,
    pub row_bytes: u32,
    pub hidden: u32,
    pub top_k: u32,
    pub idx_size: u32,
    pub scale_bytes: u32,
    pub experts_per_rank: u32,
    pub max_tokens: u32,
    pub max_recv: u32,
    pub rec_bytes: u32,
    pub comb_bytes: u32,
    pub comb_elem: u32,
    pub out_elem: u32,
    pub flags: u32,
    /// Per-block trace rows per rank (blocks at or past it stamp nothing).
    pub trace_blocks: u32,
    /// V1-LL partial row bytes (H elements of `comb_elem` bytes, K f32, 16-aligned); 0 under
    /// AsyncLL.
    pub part_bytes: u32,
}

/// `IE_FLAG_DROP_OUT_OF_RANGE`: out-of-range expert ids are skipped without a fault.
pub const FLAG_DROP_OUT_OF_RANGE: u32 = 1;
/// `IE_FLAG_WEIGHTED`: combine scales each row by the receiving rank's weights of the token's
/// slots it owns ([`crate::Weighting::RankSlotSum`]).
pub const FLAG_WEIGHTED: u32 = 2;
/// `IE_FLAG_RELAY`: V1-LL and V1 (other nodes through the same-local-index relay).
pub const FLAG_RELAY: u32 = 4;
/// `IE_FLAG_DEDUP`: with [`FLAG_RELAY`], V1 (one record per (token, node)).
pub const FLAG_DEDUP: u32 = 8;
/// `IE_FLAG_COMB_ROWS`: the combine input as rows of `comb_bytes` in the window's `out_comb`
/// area ([`super::InterLayout::combine_rows`]), and combine stores no row: a same-node
/// source's sum reads its rows there in place; AsyncLL's proxy moves another node's source's
/// rows from there; V1's and V1-LL's relays read theirs there too and stage their partials in
/// the (then unused) gather area.
pub const FLAG_COMB_ROWS: u32 = 16;
/// `IE_FLAG_RECV_WIN`: the received records stay in the window (source `s`'s at
/// `disp_in + s * seg_rec`, read by the host: [`super::InterLayout::gather_records`]); the
/// copy-out kernel is not launched and the dispatch kernel's last block zeroes the dispatch
/// counters.
pub const FLAG_RECV_WIN: u32 = 32;

/// The scheme's flags.
pub fn scheme_flags(scheme: crate::internode::Scheme) -> u32 {
    use crate::internode::Scheme;
    match scheme {
        Scheme::AsyncLL => 0,
        Scheme::V1LL => FLAG_RELAY,
        Scheme::V1 => FLAG_RELAY | FLAG_DEDUP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_kernel() {
        assert_eq!(std::mem::size_of::<IeLayout>(), 120);
        assert_eq!(std::mem::size_of::<IeRank>(), 16 + 22 * 8 + 24);
        // 19 u32 fields, then padding to the struct's 8-byte alignment.
        assert_eq!(std::mem::size_of::<IeParams>(), 2 * 64 * 8 + 120 + 16 + 19 * 4 + 4);
        let src = include_str!("../../../../kernels/ep_internode.h");
        for needle in [
            "#define IE_MAX_WORLD 64",
            "#define IE_FLAG_DROP_OUT_OF_RANGE 1u",
            "#define IE_FLAG_WEIGHTED 2u",
            "#define IE_FLAG_RELAY 4u",
            "#define IE_FLAG_DEDUP 8u",
            "#define IE_FLAG_COMB_ROWS 16u",
            "#define IE_FLAG_RECV_WIN 32u",
            "#define IE_DONE_GATHER(world) (4u + 2u * (world))",
            "#define IE_DONE_CSTAGED(world) (5u + 2u * (world))",
        ] {
            assert!(src.contains(needle), "ep_internode.h lost {needle}");
        }
        let slots = format!("#define IE_T_SLOTS {}", super::super::trace::slot::SLOTS);
        assert!(src.contains(&slots), "ep_internode.h and trace::slot disagree: {slots}");
    }
}
