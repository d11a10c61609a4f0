//! Completion flags ([`super::CopyPoolConfig::host_flags`]): each slot has a 32-bit word in
//! pinned host memory mapped into the device. A submission queues, after its work, a stream
//! write of the slot's next sequence number into that word (`cuStreamWriteValue32` with flags
//! 0, which fences the work's writes before it; `hipStreamWriteValue32`, which runs after
//! earlier work on the stream and documents no fence: compiled, never run), or its work writes
//! the word itself after a system-scope fence (the ordered-copy kernel); a completion step
//! then learns that the work finished by reading host memory, with no driver call. Polling
//! events instead takes the driver's locks on every look, and threads that poll hold up other
//! threads' copies and launches in the same process. The slot's event is still recorded after
//! the flag write and asked once a millisecond, for errors and for flags that never arrive
//! (counted in [`super::SubmitStats::flag_misses`], warned once).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use crate::error::{GpuError, Result};
use crate::memory::{DeviceSlice, PinnedBuffer};
use crate::types::Device;
use crate::Runtime;

/// One slot's word: `index` in the pool's shared buffer, and the last sequence number armed.
pub(super) struct SlotFlag {
    /// Shared by the pool's slots; a slot that leaks its buffers (its last submission never
    /// finished) leaks its reference too, so the word stays mapped for a late write.
    buf: Arc<PinnedBuffer>,
    index: usize,
    seq: AtomicU32,
}

/// `n` slot flags over one mapped pinned buffer of `dev` (4 bytes each). Errors: the
/// allocation's (`alloc_mapped`).
pub(super) fn alloc(rt: &Arc<dyn Runtime>, dev: Device, n: usize) -> Result<Vec<SlotFlag>> {
    let buf = Arc::new(rt.alloc_mapped(dev, (n * 4).max(4))?);
    if buf.device_ptr().is_none() {
        return Err(GpuError::invalid(format!("copy pool: the completion-flag buffer on {dev} is not mapped into the device")));
    }
    Ok((0..n).map(|index| SlotFlag { buf: buf.clone(), index, seq: AtomicU32::new(0) }).collect())
}

/// Whether the process was told that a flag write failed, and that a flag was missed.
pub(super) static SAID_WRITE_FAILED: AtomicBool = AtomicBool::new(false);
pub(super) static SAID_MISSED: AtomicBool = AtomicBool::new(false);
/// Whether the process was told that a device's flag memory could not be set up.
pub(super) static SAID_ALLOC_FAILED: AtomicBool = AtomicBool::new(false);

/// Warns `what` unless `said` says it was warned already (once per process and kind).
pub(super) fn warn_once(said: &AtomicBool, what: &str) {
    if !said.swap(true, Ordering::Relaxed) {
        tracing::warn!("copy pool: {what}");
    }
}

/// The sequence number after `s`, never 0 (the word's value before any write).
fn next_seq(s: u32) -> u32 {
    match s.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}

impl SlotFlag {
    /// This slot's word (mapped into the device) and its next sequence number, for the work
    /// to write (a stream write queued after it, or the ordered-copy kernel); the number is
    /// taken even if nothing writes it. The slot must be free. Errors: a lost mapping.
    pub(super) fn next_word(&self) -> Result<(DeviceSlice<'_>, u32)> {
        let seq = next_seq(self.seq.load(Ordering::Relaxed));
        self.seq.store(seq, Ordering::Relaxed);
        let whole = self.buf.device_slice().ok_or_else(|| GpuError::invalid("copy pool: completion flags lost their mapping"))?;
        Ok((whole.sub(self.index * 4, 4)?, seq))
    }

    /// Whether the write of `seq` has landed (and with it, the work queued before it).
    pub(super) fn fired(&self, seq: u32) -> bool {
        let p = (self.buf.ptr() as usize + self.index * 4) as *mut u32;
        // SAFETY: the word lies inside the live buffer (index < n, 4-aligned: the allocation
        // is page-aligned), and this process only ever accesses it atomically (the device
        // writes it from outside).
        let word = unsafe { AtomicU32::from_ptr(p) };
        word.load(Ordering::Acquire) == seq
    }

    /// Leaks this slot's reference to the buffer (see [`SlotFlag::buf`]).
    pub(super) fn leak(self) {
        std::mem::forget(self.buf);
    }
}

#[cfg(test)]
mod tests {
    use super::next_seq;

    #[test]
    fn sequence_numbers_skip_zero() {
        assert_eq!(next_seq(0), 1);
        assert_eq!(next_seq(41), 42);
        assert_eq!(next_seq(u32::MAX), 1);
    }
}
