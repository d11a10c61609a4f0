//! The inter-node protocol as a sans-IO core: what each rank writes where, and when a rank's
//! phase is complete, with no transport inside. An executor (the host executor over MORI-IO
//! and shared memory, or GPU kernels through the proxy) carries out the [`Put`]s of an
//! [`Outbox`] and answers reads of the rank's own [`Window`].
//!
//! Schemes ([`Scheme`]), W ranks, G ranks per node, N = W / G nodes; rank `(n, l)` = `n * G + l`:
//! - **V1**: a token crosses to each remote node that holds one of its experts once, to the
//!   rank with the same local index (its *relay*), which forwards it inside the node to every
//!   destination rank there; tokens for the source's own node go directly. Combine in reverse:
//!   each destination returns its row to the relay, the relay sums its node's rows per token
//!   (in f32, ranks ascending) and sends one partial back, in the combine dtype when the source
//!   is on another node; the source adds the partials over nodes ascending
//!   ([`crate::SumOrder::PerNodeRounded`]).
//! - **V1-LL**: V1 without the per-node de-duplication: one record per (token, destination
//!   rank) crosses to the relay, which forwards each to its destination. Combine as V1.
//! - **AsyncLL**: direct puts to every destination rank, no forwarding; combine rows go back
//!   directly and the source sums them over ranks ascending ([`crate::SumOrder::Ascending`]).
//!
//! Completion is counter-based: every segment of a window has two u64 counters, `arrived`
//! (each data put adds its entry count, applied after its bytes are visible: a signalled
//! write) and `total` (the end marker: set to `entries + 1`, so 0 means "not yet known").
//! A segment is complete when `total != 0` and `arrived == total - 1`; a count above the
//! segment's capacity is [`EpError::SegmentOverflow`] before anything is read. Puts may land in
//! any order (several lanes or QPs); nothing relies on ordering between puts.

mod combine;
mod dispatch;
mod record;
mod window;

pub use combine::{CombineRank, CombineState};
pub use dispatch::DispatchRank;
pub use window::{Seg, WindowLayout};

use crate::combine::SumOrder;
use crate::config::{EpConfig, KernelType};
use crate::error::{EpError, EpResult};
use crate::layout::{OutOfRange, Topology};
use std::ops::Range;

/// Which inter-node scheme runs (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Scheme {
    /// Per-node de-duplicated tokens through the same-local-index relay.
    V1,
    /// V1 without de-duplication (one record per (token, destination rank)).
    V1LL,
    /// Direct puts to every destination rank.
    AsyncLL,
}

impl Scheme {
    /// The scheme of a kernel type (`IntraNode` runs as V1: on one node it is plain direct
    /// puts).
    pub fn from_kernel_type(k: KernelType) -> Self {
        match k {
            KernelType::IntraNode | KernelType::InterNodeV1 => Scheme::V1,
            KernelType::InterNodeV1LL => Scheme::V1LL,
            KernelType::AsyncLL => Scheme::AsyncLL,
        }
    }

    /// The combine summation order this scheme produces, on the host executor and the GPU
    /// kernels alike (compare with the reference under it): V1 and V1-LL send a relay's
    /// partial to another node in the combine input's dtype ([`SumOrder::PerNodeRounded`]).
    pub fn sum_order(self) -> SumOrder {
        match self {
            Scheme::V1 | Scheme::V1LL => SumOrder::PerNodeRounded,
            Scheme::AsyncLL => SumOrder::Ascending,
        }
    }

    /// Whether tokens pass through a relay rank.
    pub fn relays(self) -> bool {
        self != Scheme::AsyncLL
    }
}

/// A counter operation applied at the destination after the put's bytes are visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOp {
    /// `fetch_add` (an `arrived` counter).
    Add(u64),
    /// Store (a `total` end marker: entries + 1).
    Set(u64),
}

/// One write into rank `dst`'s window: `src` bytes of the outbox at byte `offset` of the
/// window, then `signal` on the u64 at byte `counter` of the window. End markers carry no
/// bytes (`src` empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Put {
    /// Destination rank.
    pub dst: usize,
    /// The segment written (for errors and accounting).
    pub seg: Seg,
    /// Byte offset in the destination's window.
    pub offset: usize,
    /// Byte range of [`Outbox::bytes`].
    pub src: Range<usize>,
    /// Byte offset of the counter in the destination's window (8-byte aligned).
    pub counter: usize,
    /// The counter operation.
    pub signal: SignalOp,
}

/// What a rank writes next: bytes and the puts that refer to them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outbox {
    /// Staged bytes (records or rows).
    pub bytes: Vec<u8>,
    /// Puts, data puts before end markers.
    pub puts: Vec<Put>,
}

impl Outbox {
    /// A data put of `entries` entries (`data`) at byte `at` of `dst`'s segment `seg`.
    fn put(&mut self, dst: usize, seg: Seg, lay: &WindowLayout, at: usize, data: &[u8], entries: usize) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(data);
        let offset = lay.data(seg).start + at;
        let counter = lay.arrived(seg);
        self.puts.push(Put { dst, seg, offset, src: start..self.bytes.len(), counter, signal: SignalOp::Add(entries as u64) });
    }

    fn end(&mut self, dst: usize, seg: Seg, lay: &WindowLayout, entries: usize) {
        let (offset, counter) = (lay.data(seg).start, lay.total(seg));
        self.puts.push(Put { dst, seg, offset, src: 0..0, counter, signal: SignalOp::Set(entries as u64 + 1) });
    }

    /// Bytes of the puts whose destination is on another node than `me` (the inter-node leg).
    pub fn inter_node_bytes(&self, proto: &Proto, me: usize) -> u64 {
        self.puts.iter().filter(|p| !proto.same_node(p.dst, me)).map(|p| p.src.len() as u64).sum()
    }
}

/// Read access to a rank's own window (shared memory, registered memory, or a test's vector).
pub trait Window {
    /// Acquire-load of the u64 at byte `off`.
    fn load(&self, off: usize) -> u64;
    /// Copies `out.len()` bytes from byte `off` (only called on ranges a complete counter
    /// covers).
    fn read(&self, off: usize, out: &mut [u8]);
}

/// The protocol's constants for one configuration: topology, scheme, window layout.
#[derive(Debug, Clone)]
pub struct Proto {
    cfg: EpConfig,
    topo: Topology,
    scheme: Scheme,
    chunk: usize,
    policy: OutOfRange,
    layout: WindowLayout,
}

impl Proto {
    /// The protocol for `cfg` (validated) under `scheme`, sending inter-node data in chunks of
    /// at most `chunk_tokens` entries (one signalled write each), routing ids checked under
    /// `policy`. Errors: [`EpConfig::validate`]'s; `InvalidConfig` for `chunk_tokens = 0`;
    /// `SizeOverflow` for a window above `usize`.
    pub fn new(cfg: &EpConfig, scheme: Scheme, chunk_tokens: usize, policy: OutOfRange) -> EpResult<Self> {
        cfg.validate()?;
        if chunk_tokens == 0 {
            return Err(EpError::InvalidConfig { field: "chunk_tokens", value: "0".into(), reason: "must be at least 1".into() });
        }
        let topo = cfg.topology()?;
        let layout = WindowLayout::new(cfg, &topo, scheme)?;
        Ok(Self { cfg: cfg.clone(), topo, scheme, chunk: chunk_tokens, policy, layout })
    }

    /// The configuration.
    pub fn config(&self) -> &EpConfig {
        &self.cfg
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The window layout (identical on every rank).
    pub fn layout(&self) -> &WindowLayout {
        &self.layout
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    fn g(&self) -> usize {
        self.topo.ranks_per_node()
    }

    fn node(&self, r: usize) -> usize {
        self.topo.node_of_rank(r)
    }

    /// Whether ranks `a` and `b` share a node.
    pub fn same_node(&self, a: usize, b: usize) -> bool {
        self.node(a) == self.node(b)
    }

    /// The relay of source `src` on node `node`: the rank there with `src`'s local index.
    pub fn relay_of(&self, src: usize, node: usize) -> usize {
        node * self.g() + src % self.g()
    }

    fn node_ranks(&self, node: usize) -> Range<usize> {
        node * self.g()..(node + 1) * self.g()
    }

    /// Data puts from `me` to `dst`'s `seg` for the `stride`-byte entries in `data`, starting
    /// at entry `first`: one put on the same node, chunks of `chunk_tokens` entries across
    /// nodes (one signalled write each).
    #[allow(clippy::too_many_arguments)]
    fn chunked(&self, out: &mut Outbox, me: usize, dst: usize, seg: Seg, first: usize, stride: usize, data: &[u8]) {
        let n = data.len() / stride.max(1);
        let chunk = if self.same_node(dst, me) { n.max(1) } else { self.chunk };
        let mut i = 0;
        while i < n {
            let m = chunk.min(n - i);
            out.put(dst, seg, &self.layout, (first + i) * stride, &data[i * stride..(i + m) * stride], m);
            i += m;
        }
    }

    /// The state of segment `seg` of `me`'s window written by `writer`: `Some(entries)` once
    /// complete. Errors: `SegmentOverflow` when the end marker or the arrivals exceed its
    /// capacity in entries of `stride` bytes.
    pub fn seg_complete(&self, win: &dyn Window, me: usize, seg: Seg, writer: usize, stride: usize) -> EpResult<Option<usize>> {
        let (arrived, total) = (win.load(self.layout.arrived(seg)), win.load(self.layout.total(seg)));
        let cap = self.layout.data(seg).len() / stride.max(1);
        let over = |entries: u64| EpError::SegmentOverflow {
            rank: me,
            segment: seg.to_string(),
            writer,
            entries: usize::try_from(entries).unwrap_or(usize::MAX),
            capacity: cap,
        };
        if arrived > cap as u64 {
            return Err(over(arrived));
        }
        if total == 0 {
            return Ok(None);
        }
        if total - 1 > cap as u64 {
            return Err(over(total - 1));
        }
        if arrived > total - 1 {
            return Err(EpError::Protocol {
                rank: me,
                segment: seg.to_string(),
                writer,
                detail: format!("{arrived} entries arrived, the end marker says {}", total - 1),
            });
        }
        Ok((arrived == total - 1).then_some(arrived as usize))
    }
}
