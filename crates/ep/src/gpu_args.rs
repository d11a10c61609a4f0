//! The kernels' per-rank arguments, kept on the device as immutable snapshots, one per
//! distinct argument set.
//!
//! A dispatch or combine looks its rank arguments up by content; the first call with a new
//! set (new input tensors) uploads it once, in stream order, from page-locked memory into a
//! new slot of a device slab, and every launch names its slot in the kernel parameters. So:
//! - a call with known arguments copies nothing (no host synchronisation, no copy at all);
//! - no call copies from pageable memory;
//! - a CUDA graph that captured a call keeps reading the slot it captured, which no later call
//!   overwrites, so it replays with its own arguments whatever eager calls ran in between.
//!
//! Slots live as long as the [`crate::gpu::IntranodeEp`]: a few hundred bytes per distinct
//! argument set, in 1 MiB slabs (device and pinned host) allocated as needed; the first pair
//! is allocated with the EP object, so a capture with arguments already seen allocates nothing.

use crate::gpu::{EpGpuError, GpuResult};
use mori_gpu::{Device, DeviceBuffer, PinnedBuffer, Runtime, Stream};
use std::collections::HashMap;
use std::sync::Arc;

/// Bytes of one slab.
const SLAB: usize = 1 << 20;

/// Device snapshots of argument sets of one device, by content.
pub(crate) struct ArgSnapshots {
    rt: Arc<dyn Runtime>,
    dev: Device,
    /// (device slab, its pinned host twin the uploads read from).
    slabs: Vec<(DeviceBuffer, PinnedBuffer)>,
    /// Bytes taken in the last slab pair.
    used: usize,
    /// Device address of the snapshot of each argument set.
    index: HashMap<Vec<u8>, u64>,
}

impl ArgSnapshots {
    /// Allocates the first slab pair on `dev`.
    pub(crate) fn new(rt: Arc<dyn Runtime>, dev: Device) -> GpuResult<Self> {
        let mut s = ArgSnapshots { rt, dev, slabs: Vec::new(), used: 0, index: HashMap::new() };
        s.grow()?;
        Ok(s)
    }

    fn grow(&mut self) -> GpuResult<()> {
        let d = self.rt.alloc(self.dev, SLAB).map_err(EpGpuError::from)?;
        let h = self.rt.alloc_pinned(self.dev, SLAB).map_err(EpGpuError::from)?;
        self.slabs.push((d, h));
        self.used = 0;
        Ok(())
    }

    /// The device address of a snapshot holding `bytes`; a new one is uploaded on `stream`
    /// (ahead of the launch that reads it).
    pub(crate) fn get(&mut self, bytes: &[u8], stream: &Stream) -> GpuResult<u64> {
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
        let mut at = self.used.next_multiple_of(256);
        if at + bytes.len() > SLAB {
            self.grow()?;
            at = 0;
        }
        let Some((dslab, hslab)) = self.slabs.last_mut() else {
            return Err(EpGpuError::Ep(crate::config::invalid_arg("rank arguments", bytes.len(), "no slab is left")));
        };
        hslab.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
        let dst = dslab.sub(at, bytes.len()).map_err(EpGpuError::from)?;
        // SAFETY: the host bytes are pinned memory of a slab owned by `self`, never written
        // again (each slot is written once) and freed only with the EP object.
        let src = unsafe { std::slice::from_raw_parts((hslab.ptr() as usize + at) as *const u8, bytes.len()) };
        // SAFETY: as above: valid and unmodified until the stream ran the copy.
        unsafe { self.rt.copy_htod_async(&dst, src, stream) }.map_err(EpGpuError::from)?;
        self.used = at + bytes.len();
        let addr = dst.ptr();
        self.index.insert(bytes.to_vec(), addr);
        Ok(addr)
    }

    /// Distinct argument sets held.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }
}
