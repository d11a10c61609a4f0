//! The transport trait every backend implements, and what the engine hands it.

use crate::desc::{EngineDesc, MemoryDesc};
use crate::error::IoResult;
use crate::inbound::InboundTable;
use crate::plan::Seg;
use crate::registry::MemRegistry;
use crate::status::{TransferId, TransferStatus};
use serde::{Deserialize, Serialize};
use std::net::TcpStream;
use std::sync::Arc;

/// The transports, in the engine's preference order (first that serves wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BackendKind {
    /// Same-node GPU P2P through CUDA/HIP IPC (NVLink, xGMI, PCIe P2P).
    Xgmi,
    /// VMM shareable handles (POSIX FD within a node, FABRIC across a scale-up domain).
    Fabric,
    /// RDMA RC queue pairs over ibverbs.
    Rdma,
    /// TCP streams; any host, host memory.
    Tcp,
}

impl BackendKind {
    /// Lower-case name as the CLI spells it (`xgmi`, `fabric`, `rdma`, `tcp`).
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Xgmi => "xgmi",
            BackendKind::Fabric => "fabric",
            BackendKind::Rdma => "rdma",
            BackendKind::Tcp => "tcp",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a backend will not serve a (local, remote, peer) triple, in words a user can act on
/// ("remote memory is on a GPU; the tcp backend moves host memory only").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The backend that refused.
    pub backend: BackendKind,
    /// The reason.
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.backend, self.reason)
    }
}

/// Direction of a transfer, seen from the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Remote memory -> local memory.
    Read,
    /// Local memory -> remote memory.
    Write,
}

impl Op {
    /// (source, destination) of a segment at local address `local` and remote address
    /// `remote` (both already offset by the segment's own offsets).
    pub fn endpoints(self, local: u64, remote: u64) -> (u64, u64) {
        match self {
            Op::Write => (local, remote),
            Op::Read => (remote, local),
        }
    }
}

/// A checked, merged batch ready for a backend. The engine has verified every segment
/// against both regions' sizes; the backend still checks the local region is registered
/// (and the target checks its side again) before touching memory.
#[derive(Debug, Clone)]
pub struct TransferRequest {
    /// Read or write.
    pub op: Op,
    /// Transfer id (the target reports inbound completion under it).
    pub id: TransferId,
    /// The target engine.
    pub peer: Arc<EngineDesc>,
    /// Local region.
    pub local: Arc<MemoryDesc>,
    /// The local region's registration, taken when the caller posted: held until the backend
    /// has its own hold, so a deregistration that starts meanwhile waits for this transfer
    /// instead of failing it (posts may run later, on the engine's connector thread).
    pub local_region: Arc<crate::Region>,
    /// Remote region.
    pub remote: Arc<MemoryDesc>,
    /// Non-empty segments in batch order (adjacent contiguous entries merged).
    pub segs: Vec<Seg>,
    /// Which of the caller's batch entries each segment carries, for errors and per-entry
    /// outcomes ([`crate::TransferStatus::failed_entries`]).
    pub entries: Arc<crate::plan::EntryMap>,
    /// A paged batch for a backend that takes one ([`Backend::takes_paged`]): then `segs` is
    /// empty and the plan is the transfer (its segments in stream order are
    /// [`crate::PagedPlan::segs`]). `None` for every other request (a paged batch for any
    /// other backend arrives expanded into `segs`).
    pub paged: Option<Arc<crate::PagedPlan>>,
    /// The segments must land in order: every byte of a segment visible at the target before
    /// any byte of the next one is written (`IoEngine::post_ordered`); only ever set for a
    /// backend whose [`Backend::orders_segments`] is true.
    pub ordered: bool,
}

/// Sends a backend's control request to a peer engine's same backend over the engine's
/// control plane and returns the reply (with the engine's control deadline).
pub trait ControlClient: Send + Sync {
    /// Request/reply with `peer`'s backend `backend`. Errors: `NotSupported` when the peer has
    /// no such backend, the peer backend's own error, or `Timeout`/`RemoteDisconnect`.
    fn request(&self, peer: &EngineDesc, backend: BackendKind, payload: Vec<u8>) -> IoResult<Vec<u8>>;
}

/// What a backend shares with its engine.
#[derive(Clone)]
pub struct BackendContext {
    /// The engine's control plane, for backend handshakes.
    pub ctrl: Arc<dyn ControlClient>,
    /// This engine's descriptor.
    pub local: Arc<EngineDesc>,
    /// This engine's registrations (the bounds check for inbound requests).
    pub registry: Arc<MemRegistry>,
    /// Where inbound completions are recorded for `pop_inbound_status`.
    pub inbound: Arc<InboundTable>,
    /// This engine's inbound connections per initiator (the engine counts its control
    /// connections here; a backend with data connections of its own, such as tcp, counts
    /// those).
    pub links: Arc<crate::PeerLinks>,
}

/// A path a backend prepared for one session (one local and one remote region, resolved and
/// mapped once): it posts without the per-transfer lookups of [`Backend::post`] (the idea of
/// NIXL's prepared descriptor lists). Sessions use it when the backend offers one
/// ([`Backend::route`]). A route must not outlive what it refers to: once its local region is
/// deregistered, its peer is deregistered here, or the owner deregistered the remote region
/// (and said so), its transfers fail with `NotFound` as the one-shot calls do.
pub trait Route: Send + Sync {
    /// Posts `op` over `segs` (already checked by the session against both descriptors'
    /// lengths) as transfer `id` and returns its status (one piece; the route creates it, so
    /// it may do so after the work is queued); errors are reported through the status.
    fn post(&self, op: Op, id: TransferId, segs: &[Seg]) -> TransferStatus;

    /// Posts a paged batch (checked by the session against both descriptors' lengths).
    /// Default: expanded into segments ([`crate::PagedPlan::expand`]) and posted as those.
    fn post_paged(&self, op: Op, id: TransferId, plan: &Arc<crate::PagedPlan>) -> TransferStatus {
        self.post(op, id, &plan.expand())
    }

    /// This route as `Any`, so that its backend can recognise its own routes among the
    /// batches handed to [`Backend::post_ordered_routes`].
    fn as_any(&self) -> &dyn std::any::Any;
}

/// One ordered batch over a session's [`Route`] ([`Backend::post_ordered_routes`]).
pub struct RoutedBatch {
    /// The session's route (made by the backend it is handed to).
    pub route: Arc<dyn Route>,
    /// The transfer id (reserved by the session).
    pub id: TransferId,
    /// One segment per non-empty entry, in the caller's order, checked by the session against
    /// both descriptors' lengths; each must land before the next one is written.
    pub segs: Vec<Seg>,
    /// Words stored into the remote region after every segment landed, in order
    /// ([`Backend::posts_tail_words`]; empty for a plain ordered batch), checked by the session.
    pub words: Vec<TailWord>,
    /// The status the backend completes (one piece).
    pub status: TransferStatus,
}

/// A `u64` stored at byte `offset` of a session's remote region once an ordered batch's
/// entries landed there (8-aligned, inside the region, at an 8-aligned address; at most
/// [`crate::plan::MAX_TAIL_WORDS`] a batch): a counter or flag the peer polls, so the batch
/// needs no source bytes for it (`Session::post_ordered_many`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailWord {
    /// Byte offset in the remote region (a multiple of 8).
    pub offset: u64,
    /// The value (little-endian in memory).
    pub value: u64,
}

/// One of an engine's inbound connections, counted against its cap
/// (`EngineConfig::max_inbound`) until dropped.
pub struct InboundSlot {
    count: Arc<std::sync::atomic::AtomicUsize>,
    idle: std::time::Duration,
}

impl InboundSlot {
    /// Takes a slot of `count` unless `max` are taken; `None` then. `idle`: how long the
    /// connection may stay idle.
    pub fn take(count: &Arc<std::sync::atomic::AtomicUsize>, max: usize, idle: std::time::Duration) -> Option<InboundSlot> {
        use std::sync::atomic::Ordering;
        count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(InboundSlot { count: count.clone(), idle })
    }

    /// How long the connection may stay without a request before it is closed.
    pub fn idle_timeout(&self) -> std::time::Duration {
        self.idle
    }
}

impl Drop for InboundSlot {
    fn drop(&mut self) {
        self.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A transport. Implementations never block the caller without a deadline, never complete a
/// write before its data is at the target, and never touch memory outside a registration.
pub trait Backend: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> BackendKind;

    /// Whether this backend moves GPU memory (the engine accepts GPU registrations only when
    /// one of its backends does).
    fn handles_gpu_memory(&self) -> bool {
        false
    }

    /// Called when the engine registers memory; may attach handles to `desc`.
    fn on_register(&self, _desc: &mut MemoryDesc) -> IoResult<()> {
        Ok(())
    }

    /// Called when the engine deregisters memory (after in-flight operations drained).
    fn on_deregister(&self, _desc: &MemoryDesc) -> IoResult<()> {
        Ok(())
    }

    /// Whether this backend can move data between `local` and `remote` owned by `peer`.
    fn can_serve(&self, local: &MemoryDesc, remote: &MemoryDesc, peer: &EngineDesc) -> Result<(), Refusal>;

    /// Sets up connections to `peer` ahead of the first transfer (sessions call it). Default:
    /// nothing to set up (backends whose connections are made lazily or need none).
    fn connect(&self, _peer: &EngineDesc) -> IoResult<()> {
        Ok(())
    }

    /// Whether a post to `remote` of `peer` can go without a network round trip (connection,
    /// handshake or lookup already made), so the engine may run it on the caller's thread.
    /// When false the engine hands the post to a connector thread, so posting never waits on
    /// the network. Must not block. Default: true (a backend that never connects).
    fn ready(&self, _peer: &EngineDesc, _remote: &MemoryDesc) -> bool {
        true
    }

    /// Whether [`Backend::post`] takes a paged batch as its plan
    /// ([`TransferRequest::paged`]) instead of its expanded segments. Default: false.
    fn takes_paged(&self) -> bool {
        false
    }

    /// Whether the backend can land a request's segments in order ([`TransferRequest::ordered`]).
    /// Default: false.
    fn orders_segments(&self) -> bool {
        false
    }

    /// Posts a request; the backend completes `status` (which the engine created with one
    /// piece; the backend may `add_pieces`). Errors are reported through `status`. May
    /// connect (with the backend's deadlines) when [`Backend::ready`] said false.
    fn post(&self, req: TransferRequest, status: TransferStatus);

    /// Posts several requests made together (one caller's burst, possibly to several peers),
    /// each completing its own status as [`Backend::post`]. A backend may queue them with
    /// fewer calls into its device than one post each (xgmi: ordered requests share kernel
    /// launches). Default: one [`Backend::post`] each, in order.
    fn post_many(&self, jobs: Vec<(TransferRequest, TransferStatus)>) {
        for (req, status) in jobs {
            self.post(req, status);
        }
    }

    /// Whether [`Backend::post_ordered_routes`] posts batches (default false: it refuses them
    /// all). Sessions ask it before taking ordered batches (`Session::posts_ordered`).
    fn posts_ordered_routes(&self) -> bool {
        false
    }

    /// Whether [`Backend::post_ordered_routes`] takes batches with [`RoutedBatch::words`]
    /// (default false: a session refuses such batches with `NotSupported`).
    fn posts_tail_words(&self) -> bool {
        false
    }

    /// Posts ordered batches over sessions' routes, made together (one caller's burst), each
    /// completing its own status; a backend may queue them with fewer device calls than one
    /// post each (xgmi: up to 8 segments of several batches in one kernel launch). Default:
    /// every status fails with `NotSupported` (the backend prepares no routes, or does not
    /// keep a batch's order).
    fn post_ordered_routes(&self, _op: Op, batches: Vec<RoutedBatch>) {
        use crate::status::Completion;
        for b in batches {
            b.status.complete_piece(Err(crate::IoError::not_supported(format!(
                "an ordered batch over a session's route: the {} backend does not post one",
                self.kind()
            ))));
        }
    }

    /// A prepared [`Route`] between `local` and `remote` (owned by `peer`) for a session, or
    /// `None` (the default) to have the session call [`Backend::post`]. Errors: as the first
    /// transfer's would be (the session is then refused).
    fn route(&self, _local: &Arc<MemoryDesc>, _remote: &Arc<MemoryDesc>, _peer: &Arc<EngineDesc>) -> IoResult<Option<Arc<dyn Route>>> {
        Ok(None)
    }

    /// Takes over an inbound data connection whose hello named this backend, sent by the
    /// engine `from`. The backend owns the stream from now on, and keeps `slot` for as long as
    /// it serves it (the engine's inbound connection cap counts it until dropped); it closes a
    /// connection idle for [`InboundSlot::idle_timeout`]. Default: `NotSupported` (the backend
    /// moves data without engine data connections).
    fn accept(&self, _stream: TcpStream, from: EngineDesc, _lane: u32, _slot: InboundSlot) -> IoResult<()> {
        Err(crate::IoError::not_supported(format!("the {} backend takes no data connections (from engine {:?})", self.kind(), from.key)))
    }

    /// Lets go of work this backend queued ahead on a device that waits for the host (xgmi's
    /// armed ordered-copy launches, `mori_gpu::CopyPool::disarm`) and waits for it, so that the
    /// process may free device or pinned memory or synchronise the device while the engine
    /// lives, posting nothing meanwhile (the next post may queue work ahead again). Default:
    /// nothing queued ahead.
    /// Errors: the device work did not finish in its deadline.
    fn quiesce(&self) -> IoResult<()> {
        Ok(())
    }

    /// Forgets connections to a peer (the engine deregistered it).
    fn disconnect(&self, _peer_key: &str) {}

    /// Answers a control request sent by engine `from`'s backend of the same kind.
    fn control(&self, from: &EngineDesc, _payload: &[u8]) -> IoResult<Vec<u8>> {
        Err(crate::IoError::not_supported(format!("the {} backend takes no control requests (from engine {:?})", self.kind(), from.key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemLoc;

    #[test]
    fn endpoints_and_gpu_ordinal() {
        assert_eq!(Op::Write.endpoints(10, 20), (10, 20));
        assert_eq!(Op::Read.endpoints(10, 20), (20, 10));
        assert_eq!(MemLoc::Gpu { device: 3 }.gpu(), Some(3));
        assert_eq!(MemLoc::Host { numa: Some(1) }.gpu(), None);
    }
}
