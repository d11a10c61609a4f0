//! MORI-IO fabric backend: GPU memory shared between processes through VMM shareable handles
//! instead of legacy IPC handles (the MORI-IO seed's `--backend fabric`).
//!
//! - Memory: [`FabricMemory::alloc`] makes VMM memory exportable as one [`HandleType`]
//!   (`cuMemCreate`/`hipMemCreate` with POSIX FD or FABRIC) and exports it; registering a range
//!   of it with an engine that has this backend adopts it and puts a [`FabricHandle`] (the
//!   owner's [`FabricDomain`] and, for POSIX FD, its socket name) in the `MemoryDesc`. GPU
//!   memory from elsewhere is registered without one, and this backend refuses it.
//! - Handles: POSIX FDs travel over an abstract Unix socket with `SCM_RIGHTS` (same node, same
//!   user); FABRIC handles as bytes. The importer maps the allocation once per remote region
//!   (`cuMemImportFromShareableHandle`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`),
//!   caches it, and drops it when the owner deregisters the region or the peer is forgotten.
//! - Bounds: every (offset, len) is checked against the local registration and against the
//!   owner's [`Grant`] (fetched over the control plane), never against the descriptor's claims.
//! - Domains: engines in different domains (POSIX FD: another boot id or network namespace;
//!   FABRIC: another cluster or clique, `MORI_FABRIC_DOMAIN`) are refused by `can_serve`, so
//!   session creation fails naming why. Creating the backend proves the handle type works
//!   (FABRIC without an IMEX channel: `NotSupported` with that diagnosis). No fallback to
//!   another handle type or backend.
//! - Copies: `mori_gpu::CopyPool` (streams and reused event slots per device; batches of many
//!   small segments through the scatter/gather kernel; a waiter spinning on a transfer
//!   completes it itself, else the pool's completion thread); the target learns of a
//!   finished transfer through a control-plane notification.
//!
//! Handle decoding, domain rules and the Unix-socket FD passing are tested on the CPU
//! (`tests/fd_passing.rs` with memfd stand-ins); `tests/fabric_gpu.rs` holds the GPU tests
//! (ignored; run on the GPU machine by `scripts/gpu-parts/fabric.sh`).

mod backend;
pub mod domain;
pub mod handle;
mod memory;
pub mod uds;

pub use backend::{FabricBackend, FabricConfig, HANDLE_ENV, TIMEOUT_ENV};
pub use domain::{FabricDomain, HandleType, DOMAIN_ENV};
pub use handle::{FabricHandle, Grant};
pub use memory::{fabric_diagnosis, FabricMemory};
