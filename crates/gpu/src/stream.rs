//! Streams and events, destroyed on drop.

use std::fmt;
use std::sync::Arc;

use crate::error::{GpuError, Result};
use crate::memory::DeviceSlice;
use crate::types::{Device, WaitCondition};
use crate::Runtime;

/// A non-blocking stream of one device.
pub struct Stream {
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) device: Device,
    pub(crate) raw: u64,
    /// Destroyed on drop (false for a stream another library owns, [`Stream::borrowed`]).
    pub(crate) owned: bool,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:#x} on {})", self.raw, self.device)
    }
}

fn check_word(what: &str, stream: Device, target: &DeviceSlice<'_>) -> Result<()> {
    if target.len() < 4 {
        return Err(GpuError::invalid(format!("{what} needs a 4-byte word, the slice has {} bytes", target.len())));
    }
    if !target.ptr().is_multiple_of(4) {
        return Err(GpuError::invalid(format!("{what} needs a 4-byte aligned address, got {:#x}", target.ptr())));
    }
    if target.device() != stream {
        return Err(GpuError::invalid(format!("{what}: word on {} but stream on {stream}", target.device())));
    }
    Ok(())
}

impl Stream {
    /// A stream another library created and owns (e.g. PyTorch's current CUDA stream, whose
    /// `cuda_stream` is the `CUstream`), for queueing work on it; never destroyed by this
    /// handle.
    ///
    /// # Safety
    /// `raw` must be a live stream of `device` in the primary context this runtime uses (the
    /// one PyTorch and the CUDA runtime use), or 0 for the legacy default stream, and stay
    /// live as long as this handle and the work queued through it.
    pub unsafe fn borrowed(rt: Arc<dyn Runtime>, device: Device, raw: u64) -> Stream {
        Stream { rt, device, raw, owned: false }
    }

    /// Device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The vendor handle (`CUstream` / `hipStream_t`) as an integer, for kernels launched elsewhere.
    pub fn raw(&self) -> u64 {
        self.raw
    }

    /// Blocks until all work queued so far has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: raw is a live stream of this runtime and device.
        unsafe { self.rt.raw().stream_synchronize(self.device, self.raw) }
    }

    /// Whether all work queued so far has completed.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: as in `synchronize`.
        unsafe { self.rt.raw().stream_query(self.device, self.raw) }
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles are live objects of this runtime.
        unsafe { self.rt.raw().stream_wait_event(self.device, self.raw, event.raw) }
    }

    /// Queues a 32-bit write of `value` to the first word of `target`.
    pub fn write_value32(&self, target: &DeviceSlice<'_>, value: u32) -> Result<()> {
        check_word("write_value32", self.device, target)?;
        // SAFETY: the word is inside a live device slice of this stream's device.
        unsafe { self.rt.raw().stream_write_value32(self.device, self.raw, target.ptr(), value) }
    }

    /// Queues a wait until the first word of `target` satisfies `cond` against `value`.
    pub fn wait_value32(&self, target: &DeviceSlice<'_>, value: u32, cond: WaitCondition) -> Result<()> {
        check_word("wait_value32", self.device, target)?;
        // SAFETY: as in `write_value32`.
        unsafe { self.rt.raw().stream_wait_value32(self.device, self.raw, target.ptr(), value, cond) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: raw came from stream_create and is destroyed exactly once.
        if let Err(e) = unsafe { self.rt.raw().stream_destroy(self.device, self.raw) } {
            tracing::warn!(device = self.device.0, "destroying a stream failed: {e}");
        }
    }
}

/// An event of one device.
pub struct Event {
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) device: Device,
    pub(crate) raw: u64,
    pub(crate) timing: bool,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({:#x} on {}, timing {})", self.raw, self.device, self.timing)
    }
}

impl Event {
    /// Device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live objects of this runtime.
        unsafe { self.rt.raw().event_record(self.device, self.raw, stream.raw) }
    }

    /// Blocks until the recorded work has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: raw is a live event of this runtime.
        unsafe { self.rt.raw().event_synchronize(self.device, self.raw) }
    }

    /// Whether the recorded work has completed.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: raw is a live event of this runtime.
        unsafe { self.rt.raw().event_query(self.device, self.raw) }
    }

    /// Milliseconds from `self` to `end` (both recorded, completed, created with timing).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        if !self.timing || !end.timing {
            return Err(GpuError::invalid("elapsed time between events created without timing"));
        }
        // SAFETY: both handles are live events of this runtime.
        unsafe { self.rt.raw().event_elapsed_ms(self.device, self.raw, end.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: raw came from event_create and is destroyed exactly once.
        if let Err(e) = unsafe { self.rt.raw().event_destroy(self.device, self.raw) } {
            tracing::warn!(device = self.device.0, "destroying an event failed: {e}");
        }
    }
}
