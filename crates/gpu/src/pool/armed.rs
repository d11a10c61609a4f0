//! Armed ordered copies ([`super::CopyPoolConfig::armed_depth`]): launches of the ordered-copy
//! kernel queued before their batch exists, so that posting an ordered batch makes no driver
//! call. Each device's pool keeps a stream of its own on which every armed launch is a stream
//! wait on a doorbell word (`cuStreamWaitValue32`, greater-or-equal, cyclic) followed by
//! `mori_ordered_copy_armed` reading its table from a slot of mapped pinned host memory, and
//! its slot's event. Posting a batch writes the table into the slot of the oldest armed launch
//! and then the launch's number into the doorbell: the device starts the copy with no driver
//! call on the posting thread. Launches to replace the fired ones are queued right after
//! (the posting thread's driver calls then overlap the copy).
//!
//! Why: a launch of the ordered-copy kernel takes 5.4-8.0 µs of a proxy's posting call on an
//! idle H200 and 17-25 µs under the 2 x 4 inter-node EP load (docs/PERFORMANCE.md), where a
//! whole batch-1 xgmi write in bench_engine takes about 11 µs. The inter-node EP refuses it
//! over xgmi (`mori_ep::gpu_internode::refuse_armed_launches`): under its co-resident grids an
//! armed write took 1-3 ms on an H100 (docs/PERFORMANCE.md).
//!
//! Costs: the armed launches run one after the other on their stream (a batch posted while
//! the previous one runs starts after it), and a stream waiting on its doorbell holds a
//! hardware queue: it must not share one with work the doorbell depends on
//! (`CUDA_DEVICE_MAX_CONNECTIONS` at least the process's streams). Anything that waits for the
//! whole device waits for it, forever while no batch is posted: `cuCtxSynchronize`,
//! `torch.cuda.synchronize()`, and freeing device or pinned host memory (`cuMemFree`,
//! `cuMemFreeHost` synchronise the device). So it is off unless asked for, and only for a
//! process that disarms the pool ([`Armed::disarm`], `CopyPool::disarm`) before freeing
//! anything while the pool lives, and posts nothing until it is done: every armed launch goes
//! (its table says copy nothing), the stream is waited for, and nothing is armed until the next
//! post. Dropping the pool lets them go the same way.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use super::ordered::{OrderedCopy, ARRIVAL_BYTES, ORDERED_BLOCK};
use super::slot::{drain, drain_timed_out, Slot};
use crate::error::{GpuError, Result};
use crate::memory::{DeviceBuffer, DeviceSlice, PinnedBuffer};
use crate::module::{Function, KernelArgs};
use crate::stream::Stream;
use crate::types::{Device, WaitCondition};
use crate::{LaunchConfig, Runtime};
use std::sync::Arc;

/// The environment variable that overrides [`super::CopyPoolConfig::armed_depth`] (`0` to
/// [`ARMED_MAX`]).
pub const ARMED_ENV: &str = "MORI_GPU_POOL_ARMED";

/// Most armed launches per device.
pub const ARMED_MAX: usize = 8;

/// Bytes of a table slot in the host buffer (the 232-byte table, padded).
const TABLE_STRIDE: usize = 256;

/// How long dropping the pool waits for the armed stream once every launch was let go.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// `configured`, unless `env` (the value of [`ARMED_ENV`]) says otherwise. Errors:
/// `InvalidArgument` naming the variable for a value that is not a number from 0 to
/// [`ARMED_MAX`], and for a configured depth above it.
pub(super) fn depth(configured: usize, env: Option<&str>) -> Result<usize> {
    let d = match env.map(str::trim) {
        None => configured,
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| GpuError::invalid(format!("{ARMED_ENV}={v:?}: must be a number of armed launches from 0 (off) to {ARMED_MAX}")))?,
    };
    if d > ARMED_MAX {
        return Err(GpuError::invalid(format!(
            "copy pool: {d} armed launches per device (armed_depth or {ARMED_ENV}): at most {ARMED_MAX}"
        )));
    }
    Ok(d)
}

/// The grid of every armed launch, fixed when it is queued: 4 blocks of [`ORDERED_BLOCK`]
/// threads per multiprocessor (a launch made when posting takes up to 32 per multiprocessor
/// for a long first segment: an armed one gives it up to 8 times fewer blocks). Its divisors
/// are the group counts an armed launch takes (528 on 132 multiprocessors: packs of 5 or 7
/// batches are launched when posted).
pub(super) fn grid(sms: u32) -> u32 {
    4 * sms.max(1)
}

/// One armed launch: its number (what the doorbell must reach), the pool slot whose event was
/// recorded after it, and its table slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    seq: u32,
    slot: usize,
    table: usize,
}

/// The sans-IO part: which launches are armed, which fired and are still running, the
/// numbers the next ones take. Launches complete in the order they fired (one stream).
#[derive(Debug, Default)]
pub(super) struct Book {
    ready: VecDeque<Entry>,
    running: usize,
    /// Numbers taken by the thread arming, not yet armed (0 or 1).
    arming: usize,
    next_seq: u32,
    /// The table slot of the last number taken; each number takes the next, round the
    /// `depth` slots.
    next_table: usize,
}

impl Book {
    /// The oldest armed launch, now running: (its number, its slot, its table index).
    fn fire(&mut self) -> Option<(u32, usize, usize)> {
        let e = self.ready.pop_front()?;
        self.running += 1;
        Some((e.seq, e.slot, e.table))
    }

    /// Numbers to arm now: as many as keep armed + running + being armed at `depth`.
    fn to_arm(&self, depth: usize) -> usize {
        depth.saturating_sub(self.ready.len() + self.running + self.arming)
    }

    /// The number the next armed launch waits for (the doorbell starts at 0; the wait's
    /// comparison is cyclic, so numbers wrap) and its table slot; being armed until
    /// [`Book::armed`] or [`Book::not_armed`]. A number never armed leaves a gap the doorbell
    /// passes over (the waits compare greater-or-equal).
    fn take_seq(&mut self, depth: usize) -> (u32, usize) {
        self.next_seq = self.next_seq.wrapping_add(1);
        self.next_table = (self.next_table + 1) % depth.max(1);
        self.arming += 1;
        (self.next_seq, self.next_table)
    }

    fn armed(&mut self, seq: u32, slot: usize, table: usize) {
        self.arming = self.arming.saturating_sub(1);
        self.ready.push_back(Entry { seq, slot, table });
    }

    /// The number last taken was not armed: its table slot is the next one's again (one
    /// thread arms at a time, so it was the last taken).
    fn not_armed(&mut self, depth: usize) {
        self.arming = self.arming.saturating_sub(1);
        self.next_table = (self.next_table + depth.max(1) - 1) % depth.max(1);
    }

    fn completed(&mut self) {
        self.running = self.running.saturating_sub(1);
    }
}

/// A device's armed launches (see the module docs).
pub(super) struct Armed {
    rt: Arc<dyn Runtime>,
    stream: Stream,
    f: Function,
    depth: usize,
    grid: u32,
    /// `depth` table slots of [`TABLE_STRIDE`] bytes, then the doorbell word; mapped. Leaked
    /// rather than freed when the stream does not drain (Drop).
    host: ManuallyDrop<PinnedBuffer>,
    /// The launches' arrival words (one launch runs at a time on the stream); leaked likewise.
    arrivals: ManuallyDrop<DeviceBuffer>,
    book: Mutex<Book>,
    /// Held by the one thread arming (its driver calls are made outside `book`, so a fire
    /// never waits for them; one thread at a time keeps the stream's waits in number order).
    arming: Mutex<()>,
    /// Set after a failed arm: later batches are launched as before (said once).
    off: AtomicBool,
    /// Set by [`Armed::disarm`], cleared by the next post: completions do not arm meanwhile.
    held: AtomicBool,
}

impl Armed {
    /// The stream, the table slots and the doorbell, the arrival words; nothing armed yet.
    /// Errors: the allocations', a host buffer that is not mapped.
    pub(super) fn new(rt: &Arc<dyn Runtime>, dev: Device, f: Function, depth: usize, sms: u32) -> Result<Armed> {
        let host = rt.alloc_mapped(dev, depth * TABLE_STRIDE + 64)?;
        if host.device_ptr().is_none() {
            return Err(GpuError::invalid(format!("copy pool: the armed launches' table buffer on {dev} is not mapped into the device")));
        }
        // Zeroed tables copy nothing; the doorbell starts at 0, below every launch's number.
        // SAFETY: the buffer is ours, live and `len` bytes long; nothing reads it yet.
        unsafe { std::ptr::write_bytes(host.ptr() as *mut u8, 0, host.len()) };
        let arrivals = rt.alloc(dev, ARRIVAL_BYTES as usize)?;
        rt.memset(&arrivals.slice(), 0)?;
        Ok(Armed {
            stream: rt.stream(dev)?,
            rt: rt.clone(),
            f,
            depth,
            grid: grid(sms),
            host: ManuallyDrop::new(host),
            arrivals: ManuallyDrop::new(arrivals),
            book: Mutex::new(Book::default()),
            arming: Mutex::new(()),
            off: AtomicBool::new(false),
            held: AtomicBool::new(false),
        })
    }

    /// Whether a table of `groups` groups can be fired: the armed grid is a multiple of the
    /// group count (the kernel takes no other: every block arrives before the flag, so none
    /// reads the table slot after it may be reused) and some launch is armed. Launches armed
    /// before a failed arm are fired too.
    pub(super) fn can_fire(&self, groups: u32) -> bool {
        self.grid.is_multiple_of(groups.max(1)) && !self.book.lock().ready.is_empty()
    }

    fn doorbell(&self) -> &AtomicU32 {
        let p = (self.host.ptr() as usize + self.depth * TABLE_STRIDE) as *mut u32;
        // SAFETY: the word lies inside the live buffer (page-aligned allocation, offset a
        // multiple of 256); the host only writes it atomically, the device only reads it.
        unsafe { AtomicU32::from_ptr(p) }
    }

    /// Writes `table` (its arrival words set here, its flag `flag_of(the pool slot)`) into the
    /// oldest armed launch's table slot and rings the doorbell: the device starts the copy.
    /// Returns the pool slot whose event follows the launch, or `None` when nothing is armed
    /// (the caller launches).
    pub(super) fn fire(&self, table: OrderedCopy, flag_of: impl FnOnce(usize) -> Option<(u64, u32)>) -> Option<usize> {
        let mut book = self.book.lock();
        let (seq, slot, index) = book.fire()?;
        let t = table.finish(self.arrivals.ptr(), flag_of(slot));
        let dst = (self.host.ptr() as usize + index * TABLE_STRIDE) as *mut u8;
        let bytes = bytemuck::bytes_of(&t);
        // SAFETY: the table slot lies inside the live buffer; the launch that read it last
        // completed before this number was armed (`Book::to_arm`: at most `depth` consecutive
        // numbers are live, each on the next slot round), and the launch that reads it next
        // waits for the doorbell written below.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        // The table's bytes before the doorbell's (a full fence: pinned memory may be
        // write-combined).
        std::sync::atomic::fence(Ordering::SeqCst);
        self.doorbell().store(seq, Ordering::Release);
        Some(slot)
    }

    /// A fired launch completed (its slot's flag or event said so).
    pub(super) fn completed(&self) {
        self.book.lock().completed();
    }

    /// Arms launches until `depth` are armed or running, each on a free pool slot from
    /// `take_slot` (none free: arming waits for a later call), whose event `slots` gives; the
    /// slot stays the launch's until it fired and completed. `post`: called after a post,
    /// which ends a [`Armed::disarm`]; otherwise (after a completion) nothing is armed while
    /// disarmed. A thread that finds another one arming leaves it to that one. A failed driver
    /// call stops arming for good on this device, logged once; launches armed before it stay
    /// usable. Returns the slots taken for launches that failed to arm (no event recorded),
    /// for the caller to free.
    pub(super) fn top_up(&self, post: bool, mut take_slot: impl FnMut() -> Option<usize>, slots: &[Slot]) -> Vec<usize> {
        let mut give_back = Vec::new();
        if post {
            self.held.store(false, Ordering::Release);
        }
        if self.off.load(Ordering::Relaxed) {
            return give_back;
        }
        let (Some(base), Some(_arming)) = (self.host.device_ptr(), self.arming.try_lock()) else {
            return give_back;
        };
        // Checked again holding `arming`: a disarm that began before it returns first (it
        // holds `arming` while it lets the launches go), one that begins after waits for this
        // thread and lets go of what it armed.
        if self.held.load(Ordering::Acquire) || self.off.load(Ordering::Relaxed) {
            return give_back;
        }
        while self.book.lock().to_arm(self.depth) > 0 {
            let Some(slot) = take_slot() else { break };
            let (seq, index) = self.book.lock().take_seq(self.depth);
            // A table that copies nothing until the fire writes one (a launch that gets queued
            // without its event, below, then does no harm when the drop lets it go).
            let dst = (self.host.ptr() as usize + index * TABLE_STRIDE) as *mut u8;
            // SAFETY: inside the live buffer; the launch that read this slot last completed
            // (see `fire`).
            unsafe { std::ptr::write_bytes(dst, 0, TABLE_STRIDE) };
            let queued = (|| -> Result<()> {
                // SAFETY: the doorbell is a word of this pool's mapped buffer, live until the
                // stream drained (Drop).
                let bell = unsafe { DeviceSlice::from_raw(base + (self.depth * TABLE_STRIDE) as u64, 4, self.stream.device()) };
                self.stream.wait_value32(&bell, seq, WaitCondition::Geq)?;
                let mut args = KernelArgs::new();
                args.push(base + (index * TABLE_STRIDE) as u64);
                let cfg = LaunchConfig { grid: (self.grid, 1, 1), block: (ORDERED_BLOCK, 1, 1), shared_mem_bytes: 0 };
                // SAFETY: the kernel's ABI is (const OrderedCopy*) (kernels/README.md); the
                // table slot is mapped host memory of this pool, written before the doorbell
                // reaches seq; the segments it will name are the fired batch's (the poster's
                // contract, as for a launch).
                unsafe { self.rt.launch(&self.f, &self.stream, &cfg, &args.params()) }?;
                slots
                    .get(slot)
                    .ok_or_else(|| GpuError::invalid("copy pool: an armed launch's slot is out of range"))?
                    .event
                    .record(&self.stream)
            })();
            let mut book = self.book.lock();
            match queued {
                Ok(()) => book.armed(seq, slot, index),
                Err(e) => {
                    // A wait may be queued with nothing recorded after it: arming stops (the
                    // drop rings past every number taken).
                    book.not_armed(self.depth);
                    give_back.push(slot);
                    self.stop(&e);
                    break;
                }
            }
        }
        give_back
    }

    /// Lets every armed launch go: the ones armed run with tables that copy nothing, and it
    /// waits (up to [`DRAIN_WAIT`]) for the stream, so that nothing queued on the device waits
    /// for the host any more; none is armed again until the next post ([`Armed::top_up`]).
    /// Launches fired before it complete as usual. Returns the pool slots the let-go launches
    /// held (their events recorded and complete), for the caller to free. Errors: `Io` (timed
    /// out) when the stream did not drain (the slots are kept: the caller frees none).
    pub(super) fn disarm(&self) -> Result<Vec<usize>> {
        self.held.store(true, Ordering::Release);
        // A thread arming finishes first (its number is then in the book and let go below).
        let _arming = self.arming.lock();
        let (last, slots) = {
            let mut b = self.book.lock();
            (b.next_seq, b.ready.drain(..).map(|e| e.slot).collect::<Vec<_>>())
        };
        std::sync::atomic::fence(Ordering::SeqCst);
        self.doorbell().store(last, Ordering::Release);
        match drain(DRAIN_WAIT, || self.stream.query()) {
            Ok(()) => Ok(slots),
            Err(r) => Err(drain_timed_out(
                "copy pool: letting the armed launches go",
                format!("their stream on {}", self.stream.device()),
                DRAIN_WAIT,
                r,
            )),
        }
    }

    fn stop(&self, e: &GpuError) {
        if !self.off.swap(true, Ordering::Relaxed) {
            tracing::warn!(device = self.stream.device().0, error = %e, "copy pool: arming an ordered-copy launch failed: this device's ordered batches are launched when posted from now on");
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        // Let every armed launch go (their tables copy nothing until fired: `top_up`) by
        // ringing past every number taken, then wait for the stream before the buffers go.
        std::sync::atomic::fence(Ordering::SeqCst);
        let last = self.book.get_mut().next_seq;
        self.doorbell().store(last, Ordering::Release);
        if let Err(r) = drain(DRAIN_WAIT, || self.stream.query()) {
            tracing::warn!(device = self.stream.device().0, outcome = ?r.map(|_| "still running"), "copy pool: the armed launches' stream did not drain in {DRAIN_WAIT:?}: its buffers are leaked");
            return;
        }
        // SAFETY: dropped once, here; nothing queued on the stream reads them any more.
        unsafe {
            ManuallyDrop::drop(&mut self.host);
            ManuallyDrop::drop(&mut self.arrivals);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_comes_from_the_config_unless_the_variable_says_otherwise() {
        assert_eq!(depth(0, None).unwrap(), 0);
        assert_eq!(depth(2, None).unwrap(), 2);
        assert_eq!(depth(2, Some("0")).unwrap(), 0);
        assert_eq!(depth(0, Some(" 3")).unwrap(), 3);
        let e = depth(0, Some("two")).unwrap_err().to_string();
        assert!(e.contains("MORI_GPU_POOL_ARMED=\"two\"") && e.contains("0 (off) to 8"), "{e}");
        let e = depth(0, Some("9")).unwrap_err().to_string();
        assert!(e.contains("9 armed launches") && e.contains("at most 8"), "{e}");
        assert!(depth(9, None).is_err());
    }

    #[test]
    fn numbers_are_armed_in_order_fire_oldest_first_and_wrap() {
        let mut b = Book::default();
        assert_eq!(b.to_arm(2), 2);
        let (s, t) = b.take_seq(2);
        assert_eq!(b.to_arm(2), 1, "a number being armed counts");
        b.armed(s, 5, t);
        let (s, t) = b.take_seq(2);
        b.armed(s, 6, t);
        assert_eq!(b.to_arm(2), 0);
        assert_eq!(b.fire(), Some((1, 5, 1)));
        // Running counts against the depth until it completed.
        assert_eq!(b.to_arm(2), 0);
        b.completed();
        assert_eq!(b.to_arm(2), 1);
        let (s, t) = b.take_seq(2);
        b.armed(s, 7, t);
        assert_eq!(b.fire(), Some((2, 6, 0)));
        assert_eq!(b.fire(), Some((3, 7, 1)));
        assert_eq!(b.fire(), None);
        b.next_seq = u32::MAX;
        assert_eq!(b.take_seq(2).0, 0, "numbers wrap (the wait compares cyclically)");
    }

    #[test]
    fn live_numbers_never_share_a_table_slot() {
        // Whatever the order of fires, completions and top-ups, and across the numbers' wrap,
        // at most `depth` launches are armed or running and their table slots differ.
        for depth in 1..=ARMED_MAX {
            let mut b = Book { next_seq: u32::MAX - 700, ..Book::default() };
            let mut live: VecDeque<usize> = VecDeque::new();
            let mut x = 0x9E37_79B9u32;
            for _ in 0..2000 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match x % 3 {
                    0 => {
                        for i in 0..b.to_arm(depth) {
                            let (s, t) = b.take_seq(depth);
                            if i == 1 && x.is_multiple_of(7) {
                                // A failed arm: its number goes unused, its table slot is
                                // the next one's.
                                b.not_armed(depth);
                                break;
                            }
                            b.armed(s, 0, t);
                            live.push_back(t);
                        }
                    }
                    1 => {
                        let _ = b.fire();
                    }
                    _ => {
                        if b.running > 0 {
                            b.completed();
                            live.pop_front();
                        }
                    }
                }
                assert!(live.len() <= depth);
                let mut slots: Vec<usize> = live.iter().copied().collect();
                slots.sort_unstable();
                slots.dedup();
                assert_eq!(slots.len(), live.len(), "depth {depth}: live numbers {live:?}");
            }
        }
    }
}
