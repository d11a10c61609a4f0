//! MORI-IO RDMA backend: RC queue pairs over ibverbs through `sideway` (libibverbs is loaded
//! at run time: a host without it builds and starts, and `create_backend` says what is
//! missing).
//!
//! - Memory: host memory through `ibv_reg_mr` at registration (local write, remote
//!   read/write); GPU memory through a dmabuf of the range exported by the GPU runtime and
//!   `ibv_reg_dmabuf_mr` (offset of the range inside the page-widened dmabuf, iova = the
//!   range's GPU address), with `NotSupported` naming the device when it has no dmabuf MRs
//!   and naming the missing GPU runtime when none loads (never staged through host memory).
//!   Both kinds live in the `mori-mr` cache; the rkey travels in the `MemoryDesc` handle.
//!   No machine here has a GPU and an RDMA device together: the GPU path has only run up to
//!   `ibv_reg_dmabuf_mr` on SoftRoCE (which refuses it) with a memfd as stand-in.
//! - Connections: `qps_per_transfer` RC QPs per peer, set up through the engine's control
//!   plane (QPN, PSN, GID, LID, MTU exchange; GID chosen RoCEv2 IPv4-mapped first,
//!   `MORI_IB_GID_INDEX` overriding).
//! - Transfers: planned by `mori_io_core::wr_plan` (sort by remote offset, merge, chunking,
//!   QP round-robin from `transfer_id % qps`, minimal signaling); send-queue admission waits
//!   for room up to `sq_timeout`, then fails with `Timeout`.
//! - Completion: a completion thread reaps the CQ, standing back while a thread spin-waiting
//!   on a transfer reaps it itself (`MORI_IO_CALLER_PROGRESS`); error completions reach the transfer's status with
//!   a hint (retry exceeded: GID/TC/SL; remote access: bounds/registration; RNR: receive depth).
//! - Notification: once every WR of a transfer completed, a 16-byte SEND tells the target,
//!   which records it for `pop_inbound_status` (so the target learns only after all data
//!   landed); receive buffers are reposted (nothing leaks).

mod config;
mod conn;
mod device;
pub mod dmabuf;
mod engine;

pub use config::{PollMode, RdmaConfig, MAX_GID_INDEX, MAX_POLL_SPIN_US, MAX_SERVICE_LEVEL};
pub use dmabuf::{DmabufExporter, DmabufSource, RuntimeDmabuf};
pub use engine::RdmaBackend;

/// The rkey and address a peer needs to address a registered region (the `MemoryDesc`
/// handle of the rdma backend, postcard-encoded).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct RdmaMemHandle {
    /// Remote key.
    pub rkey: u32,
    /// Virtual address of the region's first byte in the owner's address space.
    pub addr: u64,
}
