//! MORI-IO transfer engine.
//!
//! ```text
//! let eng = IoEngine::new("prefill-0", EngineConfig::new("10.0.0.1", 18516)?)?;
//! eng.create_backend(BackendConfig::Tcp(TcpConfig::from_env()?))?;
//! let mem = unsafe { eng.register_memory(ptr, len, MemLoc::Host { numa: None })? };
//! // exchange eng.desc().pack() and mem.pack() with the peer out of band, then:
//! eng.register_remote_engine(EngineDesc::unpack(&peer_desc)?)?;
//! let sess = eng.create_session(&mem, &MemoryDesc::unpack(&peer_mem)?)?;
//! sess.batch_write(&offs, &offs, &sizes, eng.allocate_transfer_uid()).wait_for(timeout)?;
//! ```
//!
//! Backends are asked in the fixed preference order xgmi, fabric, rdma, tcp; the engine logs
//! (tracing, target `mori_io`) which backend serves each (local, remote) pair and why the
//! others refused.
//!
//! Cargo features: tcp is always built; `rdma`, `xgmi` and `fabric` each add that backend
//! (and its bindings: sideway for rdma, which needs cmake and libclang to build; mori-gpu's
//! cudarc and cubecl-hip-sys for xgmi and fabric, loaded at run time); `all-backends` adds the
//! three.

mod connector;
mod control;
mod engine;
mod inflight;
mod listener;
mod notify;
mod paged;
mod session;
mod session_ordered;
mod signal;

pub use engine::{auth_from_env, BackendConfig, EngineConfig, IoEngine, MAX_INBOUND_LIMIT, MAX_KEY_LEN};
pub use mori_io_core::plan::MAX_TAIL_WORDS;
pub use mori_io_core::{
    BackendKind, EngineDesc, EntryFailure, ErrorCode, IoError, IoResult, MemId, MemLoc, MemoryDesc, PagedBatch, PagedLayout, Secret,
    TailWord, TransferId, TransferStatus,
};
pub use mori_io_core::{Op, MAX_NOTIF_LEN};
#[cfg(feature = "fabric")]
pub use mori_io_fabric::{FabricConfig, FabricMemory, HandleType};
#[cfg(feature = "rdma")]
pub use mori_io_rdma::{DmabufExporter, DmabufSource, PollMode, RdmaConfig, MAX_GID_INDEX, MAX_POLL_SPIN_US, MAX_SERVICE_LEVEL};
pub use mori_io_tcp::TcpConfig;
#[cfg(feature = "xgmi")]
pub use mori_io_xgmi::XgmiConfig;
pub use notify::RegionBatch;
pub use session::Session;
pub use session_ordered::SessionBatch;
pub use signal::{Signal, SignalOp};
