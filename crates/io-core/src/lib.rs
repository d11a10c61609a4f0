//! MORI-IO engine core: the types every layer above shares.
//!
//! - [`EngineDesc`], [`MemoryDesc`]: descriptors exchanged out of band (postcard + version byte).
//! - [`TransferStatus`]: completion handle (poll, spin, `wait_for`; first error sticks).
//! - [`IoError`] / [`ErrorCode`]: codes compatible with upstream MORI-IO's `StatusCode`.
//! - [`Backend`]: the transport trait; [`Refusal`] says why a backend will not serve a pair.
//! - Sans-IO pieces: [`wire`] (control-plane framing), [`plan`] (batch checks and striping), [`paged`]
//!   (block-table batches),
//!   [`registry`] (bounds checks), [`counter`] (signal counters' checks), [`inbound`] (target-side completion records), [`links`] (inbound connections per initiator), [`notif`]
//!   (target-side notification queue), [`peer_map`]
//!   (a backend's per-peer cache of remote regions).

pub mod backend;
pub mod counter;
pub mod desc;
pub mod error;
pub mod handshake;
pub mod inbound;
pub mod links;
pub mod notif;
pub mod outbox;
pub mod paged;
#[cfg(feature = "gpu")]
pub mod paged_gpu;
pub mod peer_map;
pub mod plan;
pub mod registry;
pub mod status;
pub mod wire;
pub mod wr_plan;

pub use backend::{
    Backend, BackendContext, BackendKind, ControlClient, InboundSlot, Op, Refusal, Route, RoutedBatch, TailWord, TransferRequest,
};
pub use counter::SignalOp;
pub use desc::{new_epoch, BackendHandle, EngineDesc, MemId, MemLoc, MemoryDesc, Secret, DESC_VERSION};
pub use error::{ErrorCode, IoError, IoResult};
pub use inbound::InboundTable;
pub use links::{LinkGuard, PeerLinks};
pub use notif::{NotifQueue, MAX_NOTIF_LEN};
pub use outbox::Notifier;
pub use paged::{BlockRun, PagedBatch, PagedLayout, PagedPlan};
pub use peer_map::PeerMap;
pub use plan::{EntryMap, Piece, Seg};
pub use registry::{MemRegistry, Region};
pub use status::{EntryFailure, Progress, TransferId, TransferStatus, WeakTransferStatus, CALLER_PROGRESS_ENV};

/// Reads a duration in milliseconds from environment variable `var`, else `default`.
/// Errors: `InvalidArgs` naming the variable and its value when it does not parse.
pub fn env_millis(var: &str, default: std::time::Duration) -> IoResult<std::time::Duration> {
    match std::env::var(var) {
        Ok(v) => v.trim().parse::<u64>().ok().filter(|&ms| ms > 0).map(std::time::Duration::from_millis).ok_or_else(|| {
            IoError::invalid(format!("{var}={v:?} is not a whole number of milliseconds of at least 1 (0 would turn the deadline off)"))
        }),
        Err(_) => Ok(default),
    }
}
