//! MORI-IO xgmi backend: GPU memory to GPU memory on one node, through CUDA/HIP IPC handles
//! (NVLink, xGMI or PCIe peer-to-peer), on a pool of streams with completion events.
//!
//! - Registration exports an IPC handle of the base allocation plus the region's offset in it
//!   (the `MemoryDesc` handle); the peer maps it once (cached per remote region, closed when
//!   the peer is forgotten) and addresses `base + offset + remote offset`.
//! - Serves a pair when both regions are GPU memory, both engines are on the same node
//!   (`EngineDesc::node_id`), and the local device can reach the remote one (same device, or
//!   peer access); every refusal says which of these failed.
//! - Every segment is bounds-checked against both regions before a copy is queued (upstream
//!   does not). Contiguous descriptors arrive merged (the engine merges them); batches of at
//!   least `kernel_threshold` segments averaging under `kernel_max_mean_bytes` go through the
//!   scatter/gather kernel (`kernels/scatter_gather_copy.cu`), others as one async copy each.
//! - Hot path: nothing is created per transfer. Streams, slots and completion come from
//!   `mori_gpu::CopyPool`: each device has `num_events` slots made once (an event, plus a
//!   scratch buffer that holds the kernel's descriptor table, grown on demand and uploaded
//!   asynchronously on the transfer's stream); a transfer takes a free slot and the first of
//!   `num_streams` streams with nothing in flight, queues its work and records the slot's
//!   event. The multiprocessor count is read once.
//! - A transfer completes when its event has fired: a thread spin-waiting on it
//!   (`TransferStatus::spin_for`) queries the events itself (`mori_io_core::Progress`),
//!   otherwise the pool's completion thread does. The target then learns of it through a
//!   control-plane notification (`pop_inbound_status`), queued without a system call and sent
//!   by another thread that packs every completion queued meanwhile into one message.

mod backend;

pub use backend::{XgmiBackend, XgmiConfig};
