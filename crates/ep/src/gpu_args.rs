//! The kernels' per-rank arguments, uploaded in stream order from immutable pinned snapshots.
//!
//! Each dispatch and combine queues one `cuMemcpyHtoDAsync` of its rank arguments into the
//! group's device argument buffer, on the caller's stream, right before the launch. The host
//! side is a snapshot in page-locked memory made once per distinct argument set and never
//! changed afterwards, so:
//! - no call synchronizes the host or copies from pageable memory (the driver reads pinned
//!   memory when the stream gets there);
//! - a CUDA graph that captured a call holds a copy node reading its snapshot, and replays with
//!   the arguments it captured even after eager calls with other tensors rewrote the device
//!   buffer.
//!
//! Snapshots live as long as the [`crate::gpu::IntranodeEp`]: a few hundred bytes per distinct
//! argument set (new input tensors), in 1 MiB pinned slabs.

use crate::gpu::{EpGpuError, GpuResult};
use mori_gpu::{DeviceSlice, PinnedBuffer, Runtime, Stream};
use std::collections::HashMap;
use std::sync::Arc;

/// Bytes of one pinned slab.
const SLAB: usize = 1 << 20;

/// Immutable pinned copies of argument sets, by content.
pub(crate) struct ArgSnapshots {
    rt: Arc<dyn Runtime>,
    slabs: Vec<PinnedBuffer>,
    /// Bytes taken in the last slab.
    used: usize,
    /// Host address of the snapshot of each argument set.
    index: HashMap<Vec<u8>, u64>,
}

impl ArgSnapshots {
    /// Allocates the first slab (so that a call under stream capture allocates nothing).
    pub(crate) fn new(rt: Arc<dyn Runtime>, dev: mori_gpu::Device) -> GpuResult<Self> {
        let slab = rt.alloc_pinned(dev, SLAB).map_err(EpGpuError::from)?;
        Ok(ArgSnapshots { rt, slabs: vec![slab], used: 0, index: HashMap::new() })
    }

    /// The host address of a pinned snapshot holding `bytes`.
    fn snapshot(&mut self, bytes: &[u8]) -> GpuResult<u64> {
        if let Some(&a) = self.index.get(bytes) {
            return Ok(a);
        }
        if bytes.len() > SLAB {
            return Err(EpGpuError::Ep(crate::config::invalid_arg(
                "rank arguments",
                bytes.len(),
                &format!("bytes exceed a {SLAB}-byte slab"),
            )));
        }
        // 16-byte aligned snapshots.
        let at = self.used.next_multiple_of(16);
        if at + bytes.len() > SLAB {
            let dev = self.slabs[0].device();
            self.slabs.push(self.rt.alloc_pinned(dev, SLAB).map_err(EpGpuError::from)?);
            self.used = 0;
            return self.snapshot(bytes);
        }
        let Some(slab) = self.slabs.last_mut() else {
            return Err(EpGpuError::Ep(crate::config::invalid_arg("rank arguments", bytes.len(), "no pinned slab is left")));
        };
        slab.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
        self.used = at + bytes.len();
        let addr = slab.ptr() + at as u64;
        self.index.insert(bytes.to_vec(), addr);
        Ok(addr)
    }

    /// Queues the copy of `bytes` into `dst` on `stream`, from their snapshot.
    pub(crate) fn upload(&mut self, dst: &DeviceSlice<'_>, bytes: &[u8], stream: &Stream) -> GpuResult<()> {
        let addr = self.snapshot(bytes)?;
        // SAFETY: the snapshot is `bytes.len()` bytes of pinned memory owned by a slab of
        // `self`, never written again and freed only with the EP object (after its streams'
        // work, as for its device buffers).
        let src = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, bytes.len()) };
        // SAFETY: as above: valid and unmodified until the stream ran the copy.
        unsafe { self.rt.copy_htod_async(dst, src, stream) }.map_err(EpGpuError::from)
    }

    /// Distinct argument sets held.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }
}
