//! Trace stamps of `kernels/ep_internode.cu` and their Perfetto form.
//!
//! With tracing on, every rank has a buffer of u64 GPU-clock stamps (ns; `%globaltimer` on
//! NVIDIA): `[phase 2][pushed, seen][W]` per peer, then `[trace_blocks][19]` per block
//! ([`slot`]). A stamp never reached stays 0.
//!
//! [`perfetto`] turns the stamps of every rank into one trace per rank, in the seed's lane
//! names where a phase is one of them (so `mori trace analyze` puts them in its lanes):
//! - per block (tid = block): `dispatch_layout` (each block's share), `ep_dispatch_copy_to_staging`
//!   (the staging kernel: records for other nodes staged; its last block then hands them to
//!   the proxy), `dispatch_intra` (the dispatch kernel's start to its P2P stores to this
//!   node's ranks done), `dispatch_relay_forward` (V1, V1-LL: this rank as the relay,
//!   waiting for each other node's relay segment and forwarding its records inside the node),
//!   `dispatch_sync` (block 0 waiting for every source; under V1/V1-LL from the end of its
//!   own relay forwarding), `dispatch_copy_out`,
//!   `combine_copy_to_staging` (the staging kernel: every received row where it goes, P2P stores
//!   to this node's ranks included), `combine_intra_node` (combine send's start to its signals
//!   and AsyncLL's hand-over done), `combine_relay_reduce` (V1, V1-LL: the relay kernel, this
//!   rank as the relay, waiting for this node's rows of each other node's tokens and handing
//!   their partial sums to the proxy), `combine_sync` (block 0 waiting for every rank's rows,
//!   until the sum kernel started), `ep_combine_all` (the sum). The stagings, the copy-out, the
//!   relay's sums and the sum run on `copy_blocks` blocks per rank, the others on `blocks_per_rank`: a block
//!   past either grid has only the other kernels' spans;
//! - per other-node peer `d` (tid = 1000 + d): `dispatch_inter_node_send` and
//!   `combine_inter_node`, from this rank pushing its command for `d` to `d` seeing the
//!   segment complete (ring, proxy, copy and signal: the whole inter-node leg, on one clock);
//! - per other-node source `s` (tid = 2000 + s): `dispatch_inter_node_recv`, block 0 of this
//!   rank waiting for `s`'s segment after its own sends.

use crate::gpu::{PerfettoTrace, TraceEvent};

/// Per-block slots (`IE_T_*` in the kernel).
pub mod slot {
    /// Layout of the block's share of the tokens start (in the dispatch staging kernel).
    pub const LAYOUT0: usize = 0;
    /// Layout of the block's share end.
    pub const LAYOUT1: usize = 1;
    /// Dispatch staging start.
    pub const DISP0: usize = 2;
    /// Dispatch staging end: records for other nodes staged.
    pub const STAGED: usize = 3;
    /// Records for this node stored and signalled.
    pub const INTRA: usize = 4;
    /// Block 0: every source's segment complete.
    pub const RECVD: usize = 5;
    /// Copy-out start.
    pub const COPY0: usize = 6;
    /// Copy-out end.
    pub const COPY1: usize = 7;
    /// Combine staging start.
    pub const COMB0: usize = 8;
    /// Combine staging end: every row stored (this node's sources') or staged.
    pub const CSTAGED: usize = 9;
    /// Combine send: this node's rows signalled (AsyncLL: the other nodes' handed over).
    pub const CINTRA: usize = 10;
    /// Block 0, at the end of combine send: its wait for every rank's rows starts.
    pub const RED0: usize = 11;
    /// The sum kernel starts (every rank's rows complete; block 0 stamps it at the end of its
    /// wait too, which the sum kernel's start then overwrites).
    pub const CRECVD: usize = 12;
    /// The sum kernel ends.
    pub const RED1: usize = 13;
    /// V1 and V1-LL: this rank's relay forwarding done (dispatch; 0 under AsyncLL).
    pub const FWD1: usize = 14;
    /// V1 and V1-LL: this rank's relay partial sums handed over (the combine relay kernel; 0
    /// under AsyncLL).
    pub const RRED1: usize = 15;
    /// Dispatch start (it stores this node's records; the staging kernel handed the others over).
    pub const DISP1: usize = 16;
    /// Combine send start (it signals the staged rows, AsyncLL hands those for other nodes over).
    pub const COMB1: usize = 17;
    /// V1, V1-LL: this rank's relay partial sums start (the combine relay kernel).
    pub const RRED0: usize = 18;
    /// Slots per block.
    pub const SLOTS: usize = 19;
}

/// Bytes of one rank's trace buffer for `world` ranks and `blocks` traced blocks.
pub fn trace_bytes(world: usize, blocks: u32) -> usize {
    8 * (4 * world + blocks as usize * slot::SLOTS)
}

/// One rank's stamps (ns of the GPU clock, 0 = not reached).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankStamps {
    /// The rank.
    pub rank: usize,
    /// `[phase][peer]`: when this rank pushed its command for the peer (other nodes only).
    pub pushed: [Vec<u64>; 2],
    /// `[phase][source]`: when this rank saw the source's segment complete.
    pub seen: [Vec<u64>; 2],
    /// Per block, [`slot`] stamps.
    pub blocks: Vec<[u64; slot::SLOTS]>,
}

impl RankStamps {
    /// Parses a rank's buffer (little-endian u64s, [`trace_bytes`] long). `None` when the
    /// length does not match.
    pub fn parse(rank: usize, world: usize, blocks: u32, bytes: &[u8]) -> Option<Self> {
        if bytes.len() != trace_bytes(world, blocks) {
            return None;
        }
        let v: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        let part = |i: usize| v[i * world..(i + 1) * world].to_vec();
        let blocks = v[4 * world..]
            .chunks_exact(slot::SLOTS)
            .map(|c| {
                let mut a = [0u64; slot::SLOTS];
                a.copy_from_slice(c);
                a
            })
            .collect();
        Some(Self { rank, pushed: [part(0), part(2)], seen: [part(1), part(3)], blocks })
    }
}

/// Per-block spans: (name, start slot, end slot, block 0 only).
const BLOCK_SPANS: [(&str, usize, usize, bool); 11] = [
    ("dispatch_layout", slot::LAYOUT0, slot::LAYOUT1, false),
    ("ep_dispatch_copy_to_staging", slot::DISP0, slot::STAGED, false),
    ("dispatch_intra", slot::DISP1, slot::INTRA, false),
    ("dispatch_relay_forward", slot::INTRA, slot::FWD1, false),
    ("dispatch_sync", slot::INTRA, slot::RECVD, true),
    ("dispatch_copy_out", slot::COPY0, slot::COPY1, false),
    ("combine_copy_to_staging", slot::COMB0, slot::CSTAGED, false),
    ("combine_intra_node", slot::COMB1, slot::CINTRA, false),
    ("combine_relay_reduce", slot::RRED0, slot::RRED1, false),
    ("combine_sync", slot::RED0, slot::CRECVD, true),
    ("ep_combine_all", slot::CRECVD, slot::RED1, false),
];

/// One Perfetto trace per rank of `all` (ranks of `gpn` per node), times in µs from the
/// earliest stamp of the whole job (so the files line up): see the module text for the
/// spans, each a `B` event followed by its `E`. A span whose start is unstamped or whose end
/// precedes its start is left out.
pub fn perfetto(all: &[RankStamps], gpn: usize) -> Vec<(usize, PerfettoTrace)> {
    let t0 = all
        .iter()
        .flat_map(|r| r.blocks.iter().flatten().chain(r.pushed.iter().flatten()).chain(r.seen.iter().flatten()))
        .filter(|&&v| v > 0)
        .min()
        .copied()
        .unwrap_or(0);
    let us = |v: u64| v.saturating_sub(t0) as f64 / 1000.0;
    let by_rank = |r: usize| all.iter().find(|x| x.rank == r);
    let node = |r: usize| r / gpn.max(1);
    let mut out = Vec::with_capacity(all.len());
    for rs in all {
        let mut ev = Vec::new();
        let mut span = |name: &str, s: u64, e: u64, tid: usize| {
            if s > 0 && e >= s {
                for (ph, at) in [("B", s), ("E", e)] {
                    ev.push(TraceEvent { name: name.to_string(), ph, ts: us(at), pid: rs.rank, tid });
                }
            }
        };
        for (b, t) in rs.blocks.iter().enumerate() {
            for (name, s, e, only0) in BLOCK_SPANS {
                // V1/V1-LL: block 0 forwards as the relay before it waits, so its wait starts
                // when its forwarding ended (spans of one tid must not start together).
                let s = if name == "dispatch_sync" && t[slot::FWD1] > 0 { slot::FWD1 } else { s };
                if !only0 || b == 0 {
                    span(name, t[s], t[e], b);
                }
            }
        }
        let peers = (0..rs.pushed[0].len()).filter(|&q| node(q) != node(rs.rank));
        for q in peers {
            let Some(peer) = by_rank(q) else { continue };
            for (ph, name) in [(0, "dispatch_inter_node_send"), (1, "combine_inter_node")] {
                span(name, rs.pushed[ph][q], peer.seen[ph].get(rs.rank).copied().unwrap_or(0), 1000 + q);
            }
            let waited_from = rs.blocks.first().map_or(0, |b| b[slot::INTRA]);
            span("dispatch_inter_node_recv", waited_from, rs.seen[0][q], 2000 + q);
        }
        out.push((rs.rank, PerfettoTrace { trace_events: ev, display_time_unit: "ns" }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamps(rank: usize, base: u64) -> RankStamps {
        let mut b = [0u64; slot::SLOTS];
        for (i, v) in b.iter_mut().enumerate().take(14) {
            *v = base + 1000 * i as u64;
        }
        RankStamps { rank, pushed: [vec![0, base + 3000], vec![0, base + 9000]], seen: [vec![base + 5000, 0], vec![0; 2]], blocks: vec![b] }
    }

    #[test]
    fn spans_per_block_and_per_peer_in_microseconds() {
        // Two nodes of one rank: rank 0's command to rank 1 at 3 µs, seen by rank 1 at 7 µs
        // (rank 1's base is 2 µs later).
        let mut r1 = stamps(1, 2000);
        r1.pushed = [vec![2000 + 3000, 0], vec![2000 + 9000, 0]];
        r1.seen = [vec![7000, 0], vec![13000, 0]];
        let mut r0 = stamps(0, 1000);
        r0.seen = [vec![0, 9500], vec![0, 15000]];
        let t = perfetto(&[r0.clone(), r1], 1);
        let ev = &t[0].1.trace_events;
        let find = |name: &str, ph: &str| ev.iter().find(|e| e.name == name && e.ph == ph).map(|e| (e.ts, e.tid));
        // t0 = 1000 ns (rank 0's layout start).
        assert_eq!(find("dispatch_layout", "B"), Some((0.0, 0)));
        assert_eq!(find("ep_dispatch_copy_to_staging", "B"), Some((2.0, 0)));
        assert_eq!(find("ep_dispatch_copy_to_staging", "E"), Some((3.0, 0)));
        assert_eq!(find("dispatch_inter_node_send", "B"), Some((3.0, 1001)));
        assert_eq!(find("dispatch_inter_node_send", "E"), Some((6.0, 1001)));
        assert_eq!(find("combine_inter_node", "E"), Some((12.0, 1001)));
        // Waited for rank 1 from its own INTRA stamp (5 µs) to seeing it (9.5 µs).
        assert_eq!(find("dispatch_inter_node_recv", "B"), Some((4.0, 2001)));
        assert_eq!(find("dispatch_inter_node_recv", "E"), Some((8.5, 2001)));
        assert_eq!(ev.iter().filter(|e| e.ph == "B").count(), ev.iter().filter(|e| e.ph == "E").count());
        // An unstamped start leaves the span out.
        let mut r0b = r0;
        r0b.blocks[0][slot::COMB0] = 0;
        let t = perfetto(&[r0b], 1);
        assert!(!t[0].1.trace_events.iter().any(|e| e.name == "combine_copy_to_staging"));
    }

    #[test]
    fn parse_checks_the_length_and_splits_the_parts() {
        let (w, b) = (2usize, 1u32);
        let v: Vec<u8> = (0..(4 * w + slot::SLOTS) as u64).flat_map(|i| i.to_le_bytes()).collect();
        let s = RankStamps::parse(3, w, b, &v).unwrap();
        assert_eq!(s.pushed, [vec![0, 1], vec![4, 5]]);
        assert_eq!(s.seen, [vec![2, 3], vec![6, 7]]);
        assert_eq!(s.blocks[0][0], 8);
        assert_eq!(s.blocks[0][slot::COMB1], 8 + slot::COMB1 as u64);
        assert!(RankStamps::parse(3, w, b, &v[8..]).is_none());
    }
}
