//! MORI-EP across nodes on GPUs, AsyncLL, V1-LL and V1 ([`crate::internode::Scheme`]): the
//! layout and kernel ABI of `kernels/ep_internode.cu`.
//! - AsyncLL: direct puts to every destination rank, same-node ones by P2P stores, other
//!   nodes' through the rank's proxy ring as MORI-IO writes; the source sums the returned rows
//!   over ranks ascending.
//! - V1-LL: one record per (token, destination rank) crosses to the destination node's relay
//!   (the rank with the source's local index), one proxy command per relay; the relay forwards
//!   each record by P2P stores. In combine the relay sums its node's rows per token in f32 and
//!   sends one partial per token back in the combine input's dtype (bf16: half the bytes, as
//!   MORI's combine); the source sums per node ([`crate::SumOrder::PerNodeRounded`]).
//! - V1: V1-LL with one record per (token, node), naming every destination on the relay's
//!   node; the relay stores it to each. Combine as V1-LL.
//!
//! Every rank has a window ([`InterLayout::window_bytes`]: dispatch segments per source,
//! combine segments per destination, two staging areas the proxy reads from, for V1-LL the
//! relay segments, their staging and the relay's gather area, the counter pairs other nodes'
//! proxies write, and the pairs this rank's proxy sends) and a device counter block of
//! [`InterLayout::counter_bytes`] for same-node writers. Another node's segment is complete
//! once its pair landed: the writer's proxy copies the pair only after the segment's bytes
//! landed (a tail write, the same path as the data; no control message). The kernels and their
//! order are described in the kernel file; [`abi`] mirrors its structs.

pub mod abi;
mod run;
pub mod trace;
mod types;

pub use run::{
    max_xgmi_ranks, needed_connections, refuse_armed_launches, CombineInputBuf, DeviceCombined, DeviceRankInputs, DeviceRecv, DeviceTicket,
    InterNodeGpu, XGMI_COPY_STREAMS,
};
pub use types::{ElemSizes, InterNodeOptions, InterPath, InterTicket, PhaseTimes, RankBytes, RecvBytes};

use crate::config::EpConfig;
use crate::error::{EpError, EpResult};
use crate::internode::Scheme;

/// Most ranks the kernels address.
pub const MAX_WORLD: usize = 64;

fn round16(n: usize) -> usize {
    n.div_ceil(16) * 16
}

/// Sizes and byte offsets of one configuration (identical on every rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterLayout {
    /// Ranks.
    pub world: usize,
    /// Ranks per node.
    pub gpn: usize,
    /// Tokens per rank at most.
    pub max_tokens: usize,
    /// Records a rank receives at most.
    pub max_recv: usize,
    /// Bytes of a token row (hidden x element size, a multiple of 16).
    pub row_bytes: usize,
    /// Elements per row.
    pub hidden: usize,
    /// Top-k.
    pub top_k: usize,
    /// Bytes per expert id (4 or 8).
    pub idx_size: usize,
    /// Bytes of a token's scales (a multiple of 4; 0 = none).
    pub scale_bytes: usize,
    /// Bytes of a dispatch record: row, K f32 weights, K ids, scales, i32 source; 16-aligned.
    pub rec_bytes: usize,
    /// Bytes of a combine row: H elements of `comb_elem` bytes, K f32 weights; 16-aligned.
    pub comb_bytes: usize,
    /// Combine input element bytes (2 bf16, 4 f32).
    pub comb_elem: usize,
    /// The scheme the layout serves.
    pub scheme: Scheme,
    /// V1 and V1-LL: bytes of a relay's partial sum row (H elements of `comb_elem` bytes, K
    /// f32; 16-aligned: `comb_bytes`); 0 under AsyncLL.
    pub part_bytes: usize,
    /// The kernel ABI's offsets.
    pub lay: abi::IeLayout,
    /// Window bytes per rank.
    pub window_bytes: usize,
}

impl InterLayout {
    /// The layout for `cfg` (validated) under `scheme` with dispatch rows of `elem` bytes per
    /// element, ids of `idx_size` bytes and combine inputs of `comb_elem` bytes per element.
    /// Errors: `InvalidConfig` naming the field for a world above [`MAX_WORLD`], a row that is
    /// not a multiple of 16 bytes, a hidden size that is not a multiple of 8, an id size other
    /// than 4 or 8, a combine element size other than 2 or 4; `SizeOverflow` for a window above
    /// `u64`.
    pub fn new(cfg: &EpConfig, scheme: Scheme, elem: usize, idx_size: usize, comb_elem: usize) -> EpResult<Self> {
        cfg.validate()?;
        let bad = |field: &'static str, value: String, reason: &str| Err(EpError::InvalidConfig { field, value, reason: reason.into() });
        if cfg.world_size > MAX_WORLD {
            return bad("world_size", cfg.world_size.to_string(), "the inter-node GPU kernels address at most 64 ranks");
        }
        let row_bytes = cfg.hidden * elem;
        if row_bytes == 0 || !row_bytes.is_multiple_of(16) {
            return bad("hidden x element size", format!("{} x {elem} B", cfg.hidden), "must be a non-zero multiple of 16 bytes");
        }
        if !cfg.hidden.is_multiple_of(8) {
            return bad("hidden", cfg.hidden.to_string(), "must be a multiple of 8 (combine rows of bf16 are copied 16 bytes at a time)");
        }
        if idx_size != 4 && idx_size != 8 {
            return bad("expert id size", idx_size.to_string(), "must be 4 (i32) or 8 (i64)");
        }
        if comb_elem != 2 && comb_elem != 4 {
            return bad("combine element size", comb_elem.to_string(), "must be 2 (bf16) or 4 (f32)");
        }
        let scale_bytes = cfg.scale_dim * cfg.scale_type_size;
        if !scale_bytes.is_multiple_of(4) {
            return bad("scale_dim x scale_type_size", scale_bytes.to_string(), "must be a multiple of 4 bytes");
        }
        let k = cfg.top_k;
        let relay = scheme.relays();
        // Record tail: i32 source; V1-LL adds u32 destination, index at it, index in its node;
        // V1 u32 index in its node and per local index u32 the index at that rank.
        let tail = match scheme {
            Scheme::AsyncLL => 4,
            Scheme::V1LL => 16,
            Scheme::V1 => 8 + 4 * cfg.gpus_per_node,
        };
        let rec_bytes = round16(row_bytes + k * 4 + k * idx_size + scale_bytes + tail);
        let comb_bytes = round16(cfg.hidden * comb_elem + k * 4);
        let part_bytes = if relay { round16(cfg.hidden * comb_elem + k * 4) } else { 0 };
        let ov = || EpError::SizeOverflow { what: "inter-node GPU window bytes", limit: "u64" };
        let (w, g) = (cfg.world_size as u64, cfg.gpus_per_node as u64);
        let nodes = w / g.max(1);
        let mt = cfg.max_tokens_per_rank as u64;
        let seg_rec = mt.checked_mul(rec_bytes as u64).ok_or_else(ov)?;
        let seg_comb = mt.checked_mul(comb_bytes.max(part_bytes) as u64).ok_or_else(ov)?;
        let half = w.checked_mul(seg_rec.checked_add(seg_comb).ok_or_else(ov)?).ok_or_else(ov)?;
        let relay_hdr = if relay { round16(4 * cfg.gpus_per_node + 4) as u64 } else { 0 };
        // Records per relay segment at most: V1-LL one per (token, destination on the node).
        let per_token = if scheme == Scheme::V1LL { g } else { 1 };
        let seg_relay =
            if relay { mt.checked_mul(per_token).and_then(|x| x.checked_mul(rec_bytes as u64)).ok_or_else(ov)? + relay_hdr } else { 0 };
        let relays = nodes.checked_mul(seg_relay).ok_or_else(ov)?;
        // The relay's gather area holds combine rows only.
        let seg_gather = if relay { mt.checked_mul(comb_bytes as u64).ok_or_else(ov)? } else { 0 };
        let gather = w.checked_mul(seg_gather).ok_or_else(ov)?;
        let pairs = w * 2 * 2 * 8;
        let relay_in = half.checked_mul(2).ok_or_else(ov)?;
        let top = relay_in.checked_add(2 * relays).and_then(|x| x.checked_add(gather)).ok_or_else(ov)?;
        let lay = abi::IeLayout {
            disp_in: 0,
            comb_in: w * seg_rec,
            out_disp: half,
            out_comb: half + w * seg_rec,
            seg_rec,
            seg_comb,
            ctr: top,
            sig: top + pairs,
            relay_in,
            out_relay: relay_in + relays,
            seg_relay,
            relay_hdr,
            gather: relay_in + 2 * relays,
            seg_gather,
            rbase: top + 2 * pairs,
        };
        let window = top.checked_add(2 * pairs + round16(4 * cfg.world_size) as u64).ok_or_else(ov)?;
        Ok(Self {
            world: cfg.world_size,
            gpn: cfg.gpus_per_node,
            max_tokens: cfg.max_tokens_per_rank,
            max_recv: cfg.max_recv_tokens,
            row_bytes,
            hidden: cfg.hidden,
            top_k: k,
            idx_size,
            scale_bytes,
            rec_bytes,
            comb_bytes,
            comb_elem,
            scheme,
            part_bytes,
            lay,
            window_bytes: usize::try_from(window.max(64)).map_err(|_| ov())?,
        })
    }

    /// Bytes of a device counter block: u64 `[phase 3][writer W][arrived, total]` (phase 2:
    /// the V1-LL relay's gather segments, writer slot `node * gpn + local index`).
    pub fn counter_bytes(&self) -> usize {
        self.world * 3 * 2 * 8
    }

    /// Bytes of each pair area of the window (`lay.ctr`, `lay.sig`): u64
    /// `[phase 2][rank W][arrived, total]`.
    pub fn pair_bytes(&self) -> usize {
        self.world * 2 * 2 * 8
    }

    /// Bytes of a rank's `done` words (u32 `[6 + 2W]`, see `IeRank.done` in the kernel header).
    pub fn done_bytes(&self) -> usize {
        4 * (6 + 2 * self.world)
    }

    /// The combine input as the kernels read it with `IE_FLAG_COMB_ROWS` (over xgmi):
    /// one row of `comb_bytes` per received row, its `H` elements from `x` (`[N, H]` of
    /// `comb_elem` bytes), then its `K` f32 weights from `w` (`[N, K]`, or zeros when `w` is
    /// empty), zero-padded. `x` must hold whole rows and `w` none or as many rows.
    pub fn combine_rows(&self, x: &[u8], w: &[u8]) -> Vec<u8> {
        let (xb, kw) = (self.hidden * self.comb_elem, self.top_k * 4);
        let n = x.len() / xb.max(1);
        let mut out = vec![0u8; n * self.comb_bytes];
        for (i, row) in out.chunks_exact_mut(self.comb_bytes).enumerate() {
            row[..xb].copy_from_slice(&x[i * xb..(i + 1) * xb]);
            if let Some(wr) = w.get(i * kw..(i + 1) * kw) {
                row[xb..xb + kw].copy_from_slice(wr);
            }
        }
        out
    }

    /// Splits whole dispatch records (`recs`: `n` records of `rec_bytes`, as a source's segment
    /// holds them) into what a rank received: for each record its row, `K` f32 weights, `K`
    /// ids, scales and i32 flat source, each field's records concatenated (the tail of V1 and
    /// V1-LL records, their routing, is dropped). A partial record at the end is ignored.
    pub fn split_records(&self, recs: &[u8]) -> RecvBytes {
        let fields = self.record_fields();
        let n = recs.len() / self.rec_bytes.max(1);
        let mut out: [Vec<u8>; 5] = std::array::from_fn(|f| Vec::with_capacity(n * fields[f]));
        for rec in recs.chunks_exact(self.rec_bytes) {
            let mut at = 0;
            for (o, &len) in out.iter_mut().zip(&fields) {
                o.extend_from_slice(&rec[at..at + len]);
                at += len;
            }
        }
        let [x, weights, idx, scales, src] = out;
        RecvBytes { x, weights, idx, scales, src }
    }

    /// The lengths in bytes of a received record's fields, in their order: the x row
    /// (`row_bytes`), `top_k` f32 weights, `top_k` ids of `idx_size` bytes, `scale_bytes` of
    /// scales, the i32 source token.
    pub fn record_fields(&self) -> [usize; 5] {
        [self.row_bytes, self.top_k * 4, self.top_k * self.idx_size, self.scale_bytes, 4]
    }

    /// What a rank received (`recs.len() / rec_bytes` records in all, `n`), gathered from its
    /// window's dispatch segments as [`InterNodeOptions::recv_in_window`] leaves them into
    /// `recs` (the caller's buffer, e.g. pinned memory), then split
    /// ([`InterLayout::split_records`]): `recv_cnt` is the rank's `[W]` records per source, and `read(off, buf)` fills `buf` from window byte `off` (source `s`'s
    /// segment at `disp_in + s * seg_rec`). Errors: `InvalidConfig` when a count runs past
    /// `n` or the counts do not add up to `n`; `read`'s.
    pub fn gather_records<E: From<EpError>>(
        &self,
        recv_cnt: &[u32],
        recs: &mut [u8],
        mut read: impl FnMut(usize, &mut [u8]) -> Result<(), E>,
    ) -> Result<RecvBytes, E> {
        let n = recs.len() / self.rec_bytes.max(1);
        let bad = |value: String| EpError::InvalidConfig { field: "received records", value, reason: format!("{n} records received") };
        let recs = &mut recs[..n * self.rec_bytes];
        let mut at = 0usize;
        for (s, &c) in recv_cnt.iter().take(self.world).enumerate() {
            let bytes = c as usize * self.rec_bytes;
            let Some(dst) = recs.get_mut(at..at + bytes) else {
                return Err(bad(format!("source {s}'s count passes them")).into());
            };
            if bytes > 0 {
                read(self.lay.disp_in as usize + s * self.lay.seg_rec as usize, dst)?;
            }
            at += bytes;
        }
        if at != recs.len() {
            return Err(bad(format!("the sources' counts add up to {}", at / self.rec_bytes.max(1))).into());
        }
        Ok(self.split_records(recs))
    }

    /// Nodes (`world / gpn`).
    pub fn nodes(&self) -> usize {
        self.world / self.gpn
    }

    /// Byte offset of counter (phase 0 dispatch / 1 combine, writer `w`, 0 arrived / 1 total)
    /// in a counter block (`ie_ctr` in the kernel).
    pub fn counter(&self, phase: usize, w: usize, which: usize) -> usize {
        8 * ((phase * self.world + w) * 2 + which)
    }
}

#[cfg(test)]
#[path = "emu_tests.rs"]
mod emu_tests;
