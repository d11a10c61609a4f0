//! The window: one byte range per rank holding every segment the protocol writes into it,
//! their counters, and an outbox area the executor stages outgoing bytes in. Identical on
//! every rank of a configuration.

use super::record::{contrib_stride, partial_stride, record_stride};
use super::Scheme;
use crate::config::EpConfig;
use crate::error::{EpError, EpResult};
use crate::layout::Topology;
use std::fmt;
use std::ops::Range;

/// A segment of a rank's window. `W` ranks, `G` per node, `N` nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Seg {
    /// Dispatch output of origin rank `s` (0..W): records in the origin's token order.
    In(usize),
    /// Relay inbox of origin node `m` (0..N): records of origin `(m, this local index)`.
    Relay(usize),
    /// Combine rows at a relay from destination local index `d` (0..G) for origin node `m`.
    Gather(usize, usize),
    /// Combine partials at a source from node `n` (0..N).
    Partial(usize),
    /// AsyncLL combine rows at a source from destination rank `d` (0..W).
    CombineIn(usize),
}

impl fmt::Display for Seg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Seg::In(s) => write!(f, "dispatch segment of origin rank {s}"),
            Seg::Relay(m) => write!(f, "relay segment of origin node {m}"),
            Seg::Gather(d, m) => write!(f, "combine gather segment (local rank {d}, origin node {m})"),
            Seg::Partial(n) => write!(f, "combine partial segment of node {n}"),
            Seg::CombineIn(d) => write!(f, "combine segment of rank {d}"),
        }
    }
}

/// Byte offsets of every segment, its counters and the outbox inside a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowLayout {
    world: usize,
    g: usize,
    nodes: usize,
    scheme: Scheme,
    /// Data ranges per segment index.
    data: Vec<Range<usize>>,
    outbox: Range<usize>,
    size: usize,
}

impl WindowLayout {
    /// The layout for `cfg`: capacities from `max_tokens_per_rank` and the largest entry sizes
    /// (`max_token_type_size`). Errors: `SizeOverflow`.
    pub fn new(cfg: &EpConfig, topo: &Topology, scheme: Scheme) -> EpResult<Self> {
        let (world, g, nodes) = (topo.world(), topo.ranks_per_node(), topo.num_nodes());
        let t = cfg.max_tokens_per_rank;
        let ov = || EpError::SizeOverflow { what: "inter-node window bytes", limit: "usize" };
        let rec = record_stride(cfg, cfg.max_token_type_size);
        let crow = contrib_stride(cfg, cfg.max_token_type_size);
        // Partials: f32 sums at most (the source's own node's).
        let prow = partial_stride(cfg, 4.max(cfg.max_token_type_size));
        let mut caps: Vec<usize> = Vec::new();
        let bytes = |n: usize, stride: usize| t.checked_mul(n).and_then(|e| e.checked_mul(stride)).ok_or_else(ov);
        for _ in 0..world {
            caps.push(bytes(1, rec)?);
        }
        if scheme.relays() {
            let per = if scheme == Scheme::V1LL { g } else { 1 };
            for _ in 0..nodes {
                caps.push(bytes(per, rec)?);
            }
            for _ in 0..g * nodes {
                caps.push(bytes(1, crow)?);
            }
            for _ in 0..nodes {
                caps.push(bytes(1, prow)?);
            }
        } else {
            for _ in 0..world {
                caps.push(bytes(1, crow)?);
            }
        }
        let remote = world - g;
        let outbox = [bytes(remote.max(1), rec)?, bytes(remote.max(1), crow)?, bytes(nodes, prow)?].into_iter().max().unwrap_or(0);
        let mut at = caps.len().checked_mul(16).ok_or_else(ov)?;
        let mut data = Vec::with_capacity(caps.len());
        for c in caps {
            let end = at.checked_add(c).ok_or_else(ov)?;
            data.push(at..end);
            at = end.checked_add(7).ok_or_else(ov)? & !7;
        }
        let outbox = at..at.checked_add(outbox).ok_or_else(ov)?;
        let size = outbox.end.checked_add(7).ok_or_else(ov)? & !7;
        Ok(Self { world, g, nodes, scheme, data, outbox, size })
    }

    fn index(&self, seg: Seg) -> usize {
        let (w, g, n) = (self.world, self.g, self.nodes);
        match seg {
            Seg::In(s) => s.min(w - 1),
            Seg::Relay(m) => w + m.min(n - 1),
            Seg::Gather(d, m) => w + n + d.min(g - 1) * n + m.min(n - 1),
            Seg::Partial(m) => w + n + g * n + m.min(n - 1),
            Seg::CombineIn(d) => w + d.min(w - 1),
        }
    }

    /// Whether the scheme has this segment.
    pub fn has(&self, seg: Seg) -> bool {
        match seg {
            Seg::In(s) => s < self.world,
            Seg::Relay(m) | Seg::Partial(m) => self.scheme.relays() && m < self.nodes,
            Seg::Gather(d, m) => self.scheme.relays() && d < self.g && m < self.nodes,
            Seg::CombineIn(d) => !self.scheme.relays() && d < self.world,
        }
    }

    /// Byte range of the segment's data.
    pub fn data(&self, seg: Seg) -> Range<usize> {
        self.data[self.index(seg)].clone()
    }

    /// Byte offset of the segment's `arrived` counter.
    pub fn arrived(&self, seg: Seg) -> usize {
        self.index(seg) * 16
    }

    /// Byte offset of the segment's `total` counter (entries + 1; 0 = not yet known).
    pub fn total(&self, seg: Seg) -> usize {
        self.index(seg) * 16 + 8
    }

    /// Counters of the dispatch phase (zeroed by their reader after it consumed them).
    pub fn dispatch_counters(&self) -> Range<usize> {
        let end = if self.scheme.relays() { self.world + self.nodes } else { self.world };
        0..end * 16
    }

    /// Counters of the combine phase.
    pub fn combine_counters(&self) -> Range<usize> {
        let start = self.dispatch_counters().end;
        start..self.data.len() * 16
    }

    /// The outbox area (staging of outgoing bytes).
    pub fn outbox(&self) -> Range<usize> {
        self.outbox.clone()
    }

    /// Window bytes in all (a multiple of 8).
    pub fn size(&self) -> usize {
        self.size
    }
}
