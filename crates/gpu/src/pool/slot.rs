//! A submission's lane (its stream and its slot's buffers) and the in-flight slots themselves.

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::flags;
#[cfg(doc)]
use super::CopyPool;
use crate::error::{GpuError, Result};
use crate::memory::{DeviceBuffer, DeviceSlice, PinnedBuffer};
use crate::stream::{Event, Stream};
use crate::types::Device;
use crate::Runtime;

/// What a submission enqueues its work with (see [`CopyPool::submit`]): the stream chosen for
/// it, its slot's scratch device buffer and its slot's pinned host staging buffer.
pub struct Lane<'a> {
    pub(super) rt: &'a Arc<dyn Runtime>,
    pub(super) device: Device,
    pub(super) stream: &'a Stream,
    /// The slot's scratch buffer, locked on first use (copies never touch it).
    pub(super) slot_scratch: &'a Mutex<Option<DeviceBuffer>>,
    pub(super) scratch: Option<MutexGuard<'a, Option<DeviceBuffer>>>,
    /// The slot's pinned host staging buffer, locked on first use.
    pub(super) slot_staging: &'a Mutex<Option<PinnedBuffer>>,
    pub(super) staging: Option<MutexGuard<'a, Option<PinnedBuffer>>>,
    /// Device address of the slot's arrival word (the ordered-copy kernel's), if any.
    pub(super) arrivals: Option<u64>,
    /// The slot's completion flag word (device address) and the value that marks this
    /// submission done, when flags are on.
    pub(super) flag: Option<(u64, u32)>,
    /// Set by work that writes `flag` itself: no stream write is queued after it.
    pub(super) flag_taken: bool,
}

/// Capacity a slot buffer grows to for `len` bytes: the next power of two, at least 4 KiB.
fn grown_capacity(len: usize) -> usize {
    len.checked_next_power_of_two().unwrap_or(len).max(4096)
}

impl<'a> Lane<'a> {
    /// The stream to enqueue on.
    pub fn stream(&self) -> &'a Stream {
        self.stream
    }

    /// The device of the stream.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The first `len` bytes of this slot's scratch buffer (e.g. for a descriptor table a
    /// kernel reads), contents undefined. Grown to the next power of two (at least 4 KiB)
    /// when smaller, so a slot reallocates O(log n) times in its life; no other submission
    /// uses it until this one completed. Errors: the allocation's.
    pub fn scratch(&mut self, len: usize) -> Result<DeviceSlice<'_>> {
        let slot = self.slot_scratch;
        let buf = self.scratch.get_or_insert_with(|| slot.lock());
        if buf.as_ref().is_none_or(|b| b.len() < len) {
            **buf = None;
            **buf = Some(self.rt.alloc(self.device, grown_capacity(len))?);
        }
        match buf.as_ref() {
            Some(b) => b.sub(0, len),
            None => Err(GpuError::invalid("copy pool: scratch buffer missing")),
        }
    }

    /// A table of `len > 0` bytes for a kernel of this submission: `fill` writes it into the
    /// slot's pinned host staging buffer, which is then copied (async, on this lane's stream)
    /// into the first `len` bytes of the slot's scratch buffer; returns that device range.
    /// Both buffers grow as [`Lane::scratch`] does (never shrink, allocated on first use); no
    /// other submission uses them until this one completed, so nothing here waits. An error
    /// of `fill` or of an allocation is returned before anything is queued. The table lives
    /// in the same scratch buffer [`Lane::scratch`] hands out (one per slot, not two).
    pub fn stage<F>(&mut self, len: usize, fill: F) -> Result<DeviceSlice<'_>>
    where
        F: FnOnce(&mut [u8]) -> Result<()>,
    {
        if len == 0 {
            return Err(GpuError::invalid("copy pool: staging a table of 0 bytes"));
        }
        let slot_h = self.slot_staging;
        let host = self.staging.get_or_insert_with(|| slot_h.lock());
        if host.as_ref().is_none_or(|b| b.len() < len) {
            **host = None;
            **host = Some(self.rt.alloc_pinned(self.device, grown_capacity(len))?);
        }
        let Some(hb) = host.as_mut() else {
            return Err(GpuError::invalid("copy pool: staging buffer missing"));
        };
        fill(&mut hb.as_mut_slice()[..len])?;
        let slot_d = self.slot_scratch;
        let dev = self.scratch.get_or_insert_with(|| slot_d.lock());
        if dev.as_ref().is_none_or(|b| b.len() < len) {
            **dev = None;
            **dev = Some(self.rt.alloc(self.device, grown_capacity(len))?);
        }
        let Some(db) = dev.as_ref() else {
            return Err(GpuError::invalid("copy pool: scratch buffer missing"));
        };
        let table = db.sub(0, len)?;
        // SAFETY: the staging bytes are pinned host memory owned by this slot, which no other
        // submission touches until this one's event fired (after the copy ran), and which is
        // freed only after that event fired (`Slot`'s drop); the scratch range is this slot's.
        unsafe { self.rt.copy_htod_async(&table, &hb.as_slice()[..len], self.stream) }?;
        Ok(table)
    }
}

/// One in-flight slot: its completion event, scratch buffer and pinned staging buffer,
/// created once and reused (a slot is free again only after its event fired).
pub(super) struct Slot {
    pub(super) event: Event,
    pub(super) scratch: Mutex<Option<DeviceBuffer>>,
    pub(super) staging: Mutex<Option<PinnedBuffer>>,
    /// Its completion flag ([`CopyPoolConfig::host_flags`]).
    pub(super) flag: Option<flags::SlotFlag>,
    /// Its arrival word for the ordered-copy kernel: the pool's buffer and the word's index.
    pub(super) arrivals: Option<(Arc<DeviceBuffer>, usize)>,
    /// Retired after a failed event record (work may still be queued with no event after it),
    /// or after a resident-copier table it flagged failed (the grid may still write its flag),
    /// so dropping the slot leaks its buffers and flag rather than free them under it.
    pub(super) retired: AtomicBool,
}

/// How long dropping a slot waits for its last submission before it leaks the slot's buffers
/// rather than free memory a queued copy may still read or write.
pub(super) const SLOT_DROP_WAIT: Duration = Duration::from_secs(10);

impl Drop for Slot {
    fn drop(&mut self) {
        let leak = |slot: &mut Slot| {
            std::mem::forget(slot.scratch.get_mut().take());
            std::mem::forget(slot.staging.get_mut().take());
            if let Some(f) = slot.flag.take() {
                f.leak();
            }
            std::mem::forget(slot.arrivals.take());
        };
        if *self.retired.get_mut() {
            return leak(self);
        }
        if self.scratch.get_mut().is_none() && self.staging.get_mut().is_none() {
            // A flag word and an arrival word alone (4 bytes each of shared buffers) are not
            // worth waiting for: leaked unless the slot's last submission is known to be done
            // (an ordered-copy kernel still running would write both).
            if !matches!(self.event.query(), Ok(true)) {
                leak(self);
            }
            return;
        }
        if let Err(r) = drain(SLOT_DROP_WAIT, || self.event.query()) {
            tracing::warn!(
                device = self.event.device().0,
                outcome = ?r.map(|_| "still in flight"),
                "copy pool: a slot's last submission did not finish in {SLOT_DROP_WAIT:?}: its buffers are leaked"
            );
            leak(self);
        }
    }
}

/// [`drain`]'s failure `r` after `limit` as a timed-out error of `op`: `what` (such as "its
/// grid on GPU 0") still running, or failing with the error it answered.
pub(super) fn drain_timed_out(op: &'static str, what: String, limit: Duration, r: Result<bool>) -> GpuError {
    let state = match r {
        Ok(_) => "running".to_string(),
        Err(e) => format!("failing ({e})"),
    };
    GpuError::timed_out(op, format!("{what} still {state} after {limit:?}"))
}

/// Asks `query` (an event's or a stream's: has the work finished?) every 50 µs until it says
/// so or `limit` passed. Errors: its last answer (`Ok(false)`: still running) or error.
pub(super) fn drain(limit: Duration, mut query: impl FnMut() -> Result<bool>) -> std::result::Result<(), Result<bool>> {
    let t0 = Instant::now();
    loop {
        match query() {
            Ok(true) => return Ok(()),
            Ok(false) if t0.elapsed() < limit => std::thread::sleep(Duration::from_micros(50)),
            r => return Err(r),
        }
    }
}
