//! The resident copier ([`super::CopyPoolConfig::resident_blocks`]): a grid of
//! `mori_ordered_copy_resident` (kernels/scatter_gather_copy.cu) that stays on the device and
//! runs ordered-copy tables as the host writes them into mapped host memory. Posting an
//! ordered batch then writes its table and a counter: no driver call, no launch to wait for,
//! and no stream wait for the device's front end to notice. Completion is the table's flag
//! (the slot's completion flag), which the last block writes after every segment landed.
//!
//! Lifecycle: the grid is launched by the first post that finds none running and exits by
//! itself once nothing was posted for [`super::CopyPoolConfig::resident_idle`] (or when the
//! pool drops): its wait has a deadline, and a device-wide synchronisation or a `cuMemFree`
//! (also the pool's own, when another path grows a slot's buffer) waits for it until posting
//! paused that long. Posting and exiting meet through the ring's `posted` and `state` words with the same
//! store-fence-load on both sides (kernels/README.md): a table posted while the grid decides
//! to exit is either run by it or finds it exited, and then launches the next grid, which
//! starts after the last table the old one ran (same stream, so after the old grid ended).
//!
//! Why: a launch of the ordered-copy kernel costs 8.6-13.3 µs of queueing inside the
//! inter-node EP process on an H100, where bench_engine's whole batch-1 write takes 11-18 µs;
//! armed launches (a stream wait, then the launch) avoid the call but stalled for milliseconds
//! beside the EP kernels' grids (docs/PERFORMANCE.md).
//!
//! Costs: the grid holds its blocks on the device while it runs (at most 4 per multiprocessor
//! and [`RESIDENT_MAX_BLOCKS`] in all), block 0 polls one word of host memory, every table runs
//! on the grid's blocks after the previous one (a launch would size its grid by the first
//! segment and run beside other launches), and every table needs every block. Each block
//! marks itself started in the ring: a grid whose blocks have not all started 100 ms after
//! its launch (the device was full) turns the copier off, and the tables already posted wait for
//! the missing blocks until the host's deadline ([`RESIDENT_DEADLINE`]) fails them. A table
//! failed by the deadline or a fault may still run later: its pool slot is retired, never
//! reused. So it is off unless asked for; HIP turns it off (never run on an AMD GPU).

use bytemuck::{Pod, Zeroable};
use parking_lot::Mutex;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ordered::{OrderedCopy, ORDERED_BLOCK};
use super::slot::{drain, drain_timed_out};
use crate::error::{GpuError, Result};
use crate::memory::{DeviceBuffer, PinnedBuffer};
use crate::module::{Function, KernelArgs};
use crate::stream::Stream;
use crate::types::Device;
use crate::{LaunchConfig, Runtime};

/// The environment variable that overrides [`super::CopyPoolConfig::resident_blocks`] (`0`
/// off, else the grid's blocks, at most [`RESIDENT_MAX_BLOCKS`]).
pub const RESIDENT_ENV: &str = "MORI_GPU_POOL_RESIDENT";

/// The environment variable that overrides [`super::CopyPoolConfig::resident_carveout`].
pub const CARVEOUT_ENV: &str = "MORI_GPU_POOL_RESIDENT_CARVEOUT";

/// The resident grid's shared-memory split by default: the largest shared-memory
/// configuration, so that the multiprocessors it holds keep room for any other kernel's blocks.
pub const RESIDENT_CARVEOUT: i32 = 100;

/// Most blocks of a resident grid.
pub const RESIDENT_MAX_BLOCKS: u32 = 1024;

/// How long the grid waits with nothing posted before it exits, by default
/// ([`super::CopyPoolConfig::resident_idle`]).
pub const RESIDENT_IDLE: Duration = Duration::from_millis(50);

/// How long a posted table may take to complete before its submission fails (and the pool
/// stops posting to the grid).
pub const RESIDENT_DEADLINE: Duration = Duration::from_secs(5);

/// Table slots (a power of two, at most 64: the kernel's limit).
pub(super) const DEPTH: u32 = 16;

/// Bytes of a table slot and of the ring's header.
const STRIDE: usize = 256;

/// Where a table slot's three GPU-clock stamps start (after the 232-byte table).
const STAMPS: usize = 232;
const _: () = assert!(STAMPS + 24 == STRIDE && std::mem::size_of::<OrderedCopy>() == STAMPS);

/// (seen to relayed, relayed to flagged) in ns from a table's stamps (seen, relayed, flagged,
/// GPU clock), or None when one is 0 (not written) or they go backwards or span over a second
/// (a stamp from another run).
pub(super) fn stamp_spans([seen, relayed, flagged]: [u64; 3]) -> Option<(u64, u64)> {
    if seen == 0 || relayed < seen || flagged < relayed || flagged - seen > 1_000_000_000 {
        return None;
    }
    Some((relayed - seen, flagged - relayed))
}

/// How long after a launch every block must have started (else the copier turns off): the
/// grid may wait behind the previous one's last blocks, another context's time slice or a
/// long kernel on a shared hardware queue; only a grid still short after this is taken for a
/// device without room for it. Checked from 1 ms on, once a millisecond.
const START_WAIT: Duration = Duration::from_millis(100);

/// How long dropping the pool waits for the grid to exit.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// The ring's state word (kernels/README.md): launched (set by the host), running, deciding to
/// exit, exited.
const LAUNCHED: u32 = 0;
const RUNNING: u32 = 1;
const EXITING: u32 = 2;
const EXITED: u32 = 3;

/// `mori_ordered_copy_resident`'s parameter (kernels/README.md): 40 bytes, by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct ResidentParams {
    ring: u64,
    scratch: u64,
    idle_ns: u64,
    depth: u32,
    start: u32,
    gen: u32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<ResidentParams>() == 40);

/// `configured`, unless `env` (the value of [`RESIDENT_ENV`]) says otherwise. Errors:
/// `InvalidArgument` naming the variable for a value that is not a number from 0 to
/// [`RESIDENT_MAX_BLOCKS`], and for a configured count above it.
pub(super) fn blocks(configured: u32, env: Option<&str>) -> Result<u32> {
    let b = match env.map(str::trim) {
        None => configured,
        Some(v) => v.parse::<u32>().map_err(|_| {
            GpuError::invalid(format!("{RESIDENT_ENV}={v:?}: must be the resident copier's blocks, 0 (off) to {RESIDENT_MAX_BLOCKS}"))
        })?,
    };
    if b > RESIDENT_MAX_BLOCKS {
        return Err(GpuError::invalid(format!(
            "copy pool: a resident copier of {b} blocks (resident_blocks or {RESIDENT_ENV}): at most {RESIDENT_MAX_BLOCKS}"
        )));
    }
    Ok(b)
}

/// `configured`, unless `env` (the value of [`CARVEOUT_ENV`]) says otherwise. Errors:
/// `InvalidArgument` naming the input for a value that is not a number from -1 to 100.
pub(super) fn carveout(configured: i32, env: Option<&str>) -> Result<i32> {
    let (c, what) = match env.map(str::trim) {
        None => (configured, format!("resident_carveout {configured}")),
        Some(v) => (v.parse::<i32>().unwrap_or(i32::MIN), format!("{CARVEOUT_ENV}={v:?}")),
    };
    if !(-1..=100).contains(&c) {
        return Err(GpuError::invalid(format!(
            "copy pool: {what}: must be the resident copier's shared-memory split, -1 (the driver's choice) or 0 to 100 (percent)"
        )));
    }
    Ok(c)
}

/// The sans-IO part: the last number posted, which table slots hold a table not yet complete,
/// the launch count.
#[derive(Debug, Default)]
pub(super) struct Book {
    posted: u32,
    busy: [bool; DEPTH as usize],
    gen: u32,
    /// The last launch, until every block of it was seen started.
    starting: Option<Instant>,
    /// Most tables in flight: below the pool's event slots, so that tables failed by the
    /// deadline (their slots retired for good) never take the pool's last slot.
    limit: usize,
}

impl Book {
    /// The next table's number and slot, if that slot is free (its table of `DEPTH` numbers
    /// earlier completed).
    fn next(&self) -> Option<(u32, usize)> {
        let seq = self.posted.wrapping_add(1);
        let slot = (seq % DEPTH) as usize;
        let room = self.busy.iter().filter(|&&b| b).count() < self.limit.min(DEPTH as usize);
        (room && !self.busy[slot]).then_some((seq, slot))
    }

    fn posted(&mut self, seq: u32, slot: usize) {
        self.posted = seq;
        self.busy[slot] = true;
    }

    /// The table posted as `seq` into `slot` was taken back (its grid could not be launched).
    fn unposted(&mut self, seq: u32, slot: usize) {
        self.posted = seq.wrapping_sub(1);
        self.busy[slot] = false;
    }

    fn completed(&mut self, slot: usize) {
        if let Some(b) = self.busy.get_mut(slot) {
            *b = false;
        }
    }

    /// The next launch's number: 1 to 2^31 - 1 (the kernel compares 31 bits), never 0 (the
    /// scratch word's value before any launch).
    fn next_gen(&mut self) -> u32 {
        self.gen = match (self.gen + 1) & 0x7fff_ffff {
            0 => 1,
            g => g,
        };
        self.gen
    }
}

/// A device's resident copier (see the module docs).
pub(super) struct Resident {
    rt: Arc<dyn Runtime>,
    stream: Stream,
    /// Leaked with the buffers when the grid does not exit (its module stays loaded).
    f: ManuallyDrop<Function>,
    grid: u32,
    /// How long the grid waits with nothing posted before it exits.
    idle: Duration,
    /// The header (posted, stop, state, done), `DEPTH` table slots and a started word per
    /// block; mapped. Leaked rather than freed when the grid does not exit (Drop).
    ring: ManuallyDrop<PinnedBuffer>,
    /// The grid's word and table copies, then `DEPTH` arrival blocks of 64 bytes; leaked
    /// likewise.
    scratch: ManuallyDrop<DeviceBuffer>,
    book: Mutex<Book>,
    /// Held by a post from its first look at the book to its end, and by
    /// [`Resident::quiesce`] across its wait: posts and stops never overlap. The book itself is
    /// held only while it changes, so a completion (which frees a slot) never waits for a
    /// post's wait on a grid deciding to exit, or for a stop's drain.
    posts: Mutex<()>,
    /// Set after a failed launch or a table past its deadline: later batches are launched as
    /// before (said once).
    off: AtomicBool,
    /// When [`Resident::fault`] last asked the stream.
    asked: Mutex<Instant>,
}

impl Resident {
    /// The stream, the ring and the scratch; no grid yet (the first post launches it). The
    /// grid's blocks, its idle time and its shared-memory split (percent, -1: the driver's)
    /// come as one triple; a grid above 4 blocks per multiprocessor (`sms` of them) is cut to
    /// that, and a split the driver refuses is logged, each said once. `slots`: the pool's
    /// event slots (at most `slots - 1` tables are in flight). Errors: the allocations', a
    /// ring that is not mapped, a grid of 0 blocks, fewer than 2 slots.
    pub(super) fn new(
        rt: &Arc<dyn Runtime>,
        dev: Device,
        f: Function,
        (grid, idle, carveout): (u32, Duration, i32),
        sms: u32,
        slots: usize,
    ) -> Result<Resident> {
        if slots < 2 {
            return Err(GpuError::invalid(format!("copy pool: a resident copier needs 2 event slots or more (the pool has {slots})")));
        }
        if grid == 0 || grid > RESIDENT_MAX_BLOCKS {
            return Err(GpuError::invalid(format!("copy pool: a resident copier of {grid} blocks: 1 to {RESIDENT_MAX_BLOCKS}")));
        }
        let cap = 4 * sms.max(1);
        let grid = if grid > cap {
            tracing::warn!(
                device = dev.0,
                asked = grid,
                blocks = cap,
                "copy pool: the resident copier's grid is cut to 4 blocks per multiprocessor (every block must stay on the device)"
            );
            cap
        } else {
            grid
        };
        // A hint: refused, the grid runs with the driver's split (said, not silent).
        if let Err(e) = f.set_shared_carveout(carveout) {
            tracing::warn!(device = dev.0, carveout, error = %e, "copy pool: the resident copier's shared-memory split of {carveout}% was refused: its grid keeps the driver's");
        }
        let ring = rt.alloc_mapped(dev, STRIDE * (1 + DEPTH as usize) + 4 * RESIDENT_MAX_BLOCKS as usize)?;
        if ring.device_ptr().is_none() {
            return Err(GpuError::invalid(format!("copy pool: the resident copier's ring on {dev} is not mapped into the device")));
        }
        // SAFETY: the buffer is ours, live and `len` bytes long; nothing reads it yet.
        unsafe { std::ptr::write_bytes(ring.ptr() as *mut u8, 0, ring.len()) };
        let scratch = rt.alloc(dev, STRIDE * (1 + DEPTH as usize) + 64 * DEPTH as usize)?;
        rt.memset(&scratch.slice(), 0)?;
        let r = Resident {
            stream: rt.stream(dev)?,
            rt: rt.clone(),
            f: ManuallyDrop::new(f),
            grid,
            idle,
            ring: ManuallyDrop::new(ring),
            scratch: ManuallyDrop::new(scratch),
            book: Mutex::new(Book { limit: slots - 1, ..Book::default() }),
            posts: Mutex::new(()),
            off: AtomicBool::new(false),
            asked: Mutex::new(Instant::now()),
        };
        // No grid ran: the first post launches one, starting after number 0.
        r.word(2).store(EXITED, Ordering::Release);
        Ok(r)
    }

    /// The grid's blocks.
    pub(super) fn grid(&self) -> u32 {
        self.grid
    }

    /// Word `i` of the ring's header (0 posted, 1 stop, 2 state, 3 done).
    fn word(&self, i: usize) -> &AtomicU32 {
        let p = (self.ring.ptr() as usize + 4 * i) as *mut u32;
        // SAFETY: the word lies inside the live buffer (page-aligned allocation); the host
        // only accesses it atomically, the device from outside.
        unsafe { AtomicU32::from_ptr(p) }
    }

    /// Whether `table` can be posted now: the copier is on, the kernel runs the table on this
    /// grid (its group count divides the grid, and the rest of its checks), and the next
    /// table slot is free. Waits for a post or a stop in progress first (the caller then takes
    /// a pool slot: it must not hold one through another post's wait on an exiting grid or a
    /// stop's drain).
    pub(super) fn takes(&self, table: &OrderedCopy) -> bool {
        if self.off.load(Ordering::Relaxed) || !table.takes(self.grid) {
            return false;
        }
        let _posts = self.posts.lock();
        let next = self.book.lock().next();
        next.is_some()
    }

    /// Writes `table` (its arrival words set here, its flag `flag`) into the next table slot
    /// and posts it; launches a grid when none runs. Returns the table slot (for
    /// [`Resident::completed`]), or `Ok(None)` when the next slot still holds a table not yet
    /// complete (the caller launches). Once posted, a table is the copier's: a grid that stays
    /// in its exit decision past [`RESIDENT_DEADLINE`] turns the copier off and the table is
    /// left to the deadline (`Ok`). Errors: a failed launch (the table is taken back before any
    /// grid could see it and the copier is off from then on: the caller launches this batch
    /// and every later one).
    pub(super) fn post(&self, table: OrderedCopy, flag: (u64, u32)) -> Result<Option<usize>> {
        let _posts = self.posts.lock();
        let mut book = self.book.lock();
        // Off since `takes` said yes: nothing published yet, the caller launches.
        if self.off.load(Ordering::Acquire) {
            return Ok(None);
        }
        let Some((seq, slot)) = book.next() else { return Ok(None) };
        let arrivals = self.scratch.ptr() + (STRIDE * (1 + DEPTH as usize) + 64 * slot) as u64;
        let t = table.finish(arrivals, Some(flag));
        let bytes = bytemuck::bytes_of(&t);
        let dst = (self.ring.ptr() as usize + STRIDE * (1 + slot)) as *mut u8;
        // SAFETY: the slot lies inside the live buffer; the grid read the table it held last
        // before that table completed (every block reads a table before the last one arrives),
        // and it reads this one only after `posted` below.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        // Its stamps zeroed (a stamp the grid did not write then reads 0).
        for w in 0..3 {
            self.stamp(slot, w).store(0, Ordering::Relaxed);
        }
        // The table's bytes before `posted` (a full fence: pinned memory may be write-combined).
        std::sync::atomic::fence(Ordering::SeqCst);
        self.word(0).store(seq, Ordering::Release);
        book.posted(seq, slot);
        drop(book);
        // Store `posted`, fence, load `state`: the grid does the same the other way round.
        std::sync::atomic::fence(Ordering::SeqCst);
        let t0 = Instant::now();
        loop {
            match self.word(2).load(Ordering::Acquire) {
                LAUNCHED | RUNNING => return Ok(Some(slot)),
                EXITED => break,
                // The grid holds this state for one fence and one read of host memory.
                EXITING if t0.elapsed() < RESIDENT_DEADLINE => std::thread::yield_now(),
                s => {
                    self.stop(&GpuError::timed_out(
                        "copy pool: posting to the resident copier",
                        format!(
                            "its grid on {} in state {s} after {:?} (2: deciding to exit; 0-3 are the only states)",
                            self.stream.device(),
                            t0.elapsed()
                        ),
                    ));
                    return Ok(Some(slot));
                }
            }
        }
        let mut book = self.book.lock();
        match self.launch(&mut book) {
            Ok(()) => Ok(Some(slot)),
            Err(e) => {
                book.unposted(seq, slot);
                self.word(0).store(seq.wrapping_sub(1), Ordering::Release);
                self.stop(&e);
                Err(e)
            }
        }
    }

    /// Launches a grid that starts after the last table the previous one ran.
    fn launch(&self, book: &mut Book) -> Result<()> {
        let (Some(ring), start) = (self.ring.device_ptr(), self.word(3).load(Ordering::Acquire)) else {
            return Err(GpuError::invalid("copy pool: the resident copier's ring lost its mapping"));
        };
        let gen = book.next_gen();
        self.word(2).store(LAUNCHED, Ordering::Release);
        let p = ResidentParams {
            ring,
            scratch: self.scratch.ptr(),
            idle_ns: self.idle.as_nanos().min(u64::MAX as u128) as u64,
            depth: DEPTH,
            start,
            gen,
            pad: 0,
        };
        let mut args = KernelArgs::new();
        args.push(p);
        let cfg = LaunchConfig { grid: (self.grid, 1, 1), block: (ORDERED_BLOCK, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernel's ABI is (ResidentParams by value) (kernels/README.md); the ring
        // is this copier's mapped host buffer and the scratch its device buffer, both live
        // until the stream drained (Drop); the tables' segments are the posters' (their
        // contract, as for a launch).
        let r = unsafe { self.rt.launch(&self.f, &self.stream, &cfg, &args.params()) };
        match r {
            Ok(()) => {
                super::stats::count_resident_launch();
                book.starting = Some(Instant::now());
                tracing::debug!(device = self.stream.device().0, gen, start, "copy pool: resident copier launched");
            }
            Err(_) => self.word(2).store(EXITED, Ordering::Release),
        }
        r
    }

    /// The table in `slot` completed (its flag said so): the slot is free again.
    pub(super) fn completed(&self, slot: usize) {
        self.book.lock().completed(slot);
    }

    /// Stamp `w` (0 seen, 1 relayed, 2 flagged: kernels/README.md) of table slot `slot`.
    fn stamp(&self, slot: usize, w: usize) -> &AtomicU64 {
        let p = (self.ring.ptr() as usize + STRIDE * (1 + slot) + STAMPS + 8 * w) as *mut u64;
        // SAFETY: the three words lie inside the live buffer's slot (STAMPS + 24 == STRIDE),
        // 8-aligned (the buffer is page-aligned); the host only accesses them atomically, the
        // device from outside.
        unsafe { AtomicU64::from_ptr(p) }
    }

    /// The GPU-clock stamps of the table that completed in `slot` (read before
    /// [`Resident::completed`] frees the slot): (seen to relayed, relayed to flagged) in ns, or
    /// None when one is missing or they are out of order (see [`stamp_spans`]).
    pub(super) fn spans(&self, slot: usize) -> Option<(u64, u64)> {
        stamp_spans([0, 1, 2].map(|w| self.stamp(slot, w).load(Ordering::Acquire)))
    }

    /// A table has waited [`RESIDENT_DEADLINE`]: its slot stays taken (the grid may still write
    /// it) and the copier is off from then on.
    pub(super) fn overdue(&self) -> GpuError {
        let e = GpuError::timed_out(
            "copy pool: waiting for the resident copier",
            format!(
                "a table posted to its grid of {} blocks on {} did not complete in {RESIDENT_DEADLINE:?} (state {})",
                self.grid,
                self.stream.device(),
                self.word(2).load(Ordering::Acquire)
            ),
        );
        self.stop(&e);
        e
    }

    /// An error of the grid's stream (a fault), if any.
    /// Asks the stream at most once per [`super::FLAG_FALLBACK`] (a driver call; the
    /// completion steps spin): `None` between. The copier is off from then on. Also checks
    /// that every block of the last launch started: still short [`START_WAIT`] after it, the
    /// copier turns off (said once) and the tables posted wait for the missing blocks.
    pub(super) fn fault(&self) -> Option<GpuError> {
        {
            let mut last = self.asked.try_lock()?;
            if last.elapsed() < super::FLAG_FALLBACK {
                return None;
            }
            *last = Instant::now();
        }
        self.check_started();
        let e = self.stream.query().err()?;
        self.stop(&e);
        Some(e)
    }

    /// Counts the blocks of the last launch that marked themselves started, once
    /// [`START_WAIT`] passed (see [`Resident::fault`]).
    fn check_started(&self) {
        let Some(mut book) = self.book.try_lock() else { return };
        let Some(at) = book.starting.filter(|at| at.elapsed() > Duration::from_millis(1)) else { return };
        let base = self.ring.ptr() as usize + STRIDE * (1 + DEPTH as usize);
        let started = (0..self.grid as usize)
            .filter(|b| {
                // SAFETY: word b lies inside the live ring (RESIDENT_MAX_BLOCKS words follow the
                // tables, grid <= RESIDENT_MAX_BLOCKS); only the device writes it, and the host
                // reads it atomically.
                let w = unsafe { AtomicU32::from_ptr((base + 4 * b) as *mut u32) };
                w.load(Ordering::Acquire) == book.gen
            })
            .count();
        if started == self.grid as usize {
            book.starting = None;
        } else if started == 0 && matches!(self.word(2).load(Ordering::Acquire), EXITED) {
            // The launch failed (the host wrote EXITED back): nothing started, nothing to learn.
            book.starting = None;
        } else if at.elapsed() > START_WAIT {
            book.starting = None;
            self.stop(&GpuError::invalid(format!(
                "only {started} of its {} blocks started {:?} after the launch on {} (the device is full: every block must stay on it)",
                self.grid,
                at.elapsed(),
                self.stream.device()
            )));
        }
    }

    fn stop(&self, e: &GpuError) {
        if !self.off.swap(true, Ordering::Relaxed) {
            tracing::warn!(device = self.stream.device().0, error = %e, "copy pool: the resident copier failed: this device's ordered batches are launched when posted from now on");
        }
    }
}

impl Resident {
    /// Stops the grid if one runs (it exits once nothing is posted, without its idle wait) and
    /// waits for it ([`DRAIN_WAIT`] at most); the next post launches one again. Posts wait
    /// meanwhile. Errors: `Io` (timed out) when the grid did not exit.
    pub(super) fn quiesce(&self) -> Result<()> {
        let _posts = self.posts.lock();
        self.word(1).store(1, Ordering::Release);
        let r = drain(DRAIN_WAIT, || self.stream.query());
        self.word(1).store(0, Ordering::Release);
        r.map_err(|r| {
            drain_timed_out("copy pool: stopping the resident copier", format!("its grid on {}", self.stream.device()), DRAIN_WAIT, r)
        })
    }

    /// Stops the grid (it exits once nothing is posted, without its idle wait) and waits for it
    /// ([`DRAIN_WAIT`] at most). Returns false when it did not exit: the caller must then leak
    /// whatever the posted tables name (the pool's completion flags), as this leaks the ring,
    /// the scratch and the module.
    pub(super) fn shut(mut self) -> bool {
        self.word(1).store(1, Ordering::Release);
        if let Err(r) = drain(DRAIN_WAIT, || self.stream.query()) {
            tracing::warn!(device = self.stream.device().0, outcome = ?r.map(|_| "still running"), "copy pool: the resident copier's grid did not exit in {DRAIN_WAIT:?}: its buffers, its module and the pool's completion flags are leaked");
            return false;
        }
        // SAFETY: dropped once, here (`shut` takes self; Drop drops nothing else); the grid
        // has exited.
        unsafe {
            ManuallyDrop::drop(&mut self.ring);
            ManuallyDrop::drop(&mut self.scratch);
            ManuallyDrop::drop(&mut self.f);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_give_spans_only_when_all_three_are_written_in_order() {
        assert_eq!(stamp_spans([1_000, 3_500, 10_000]), Some((2_500, 6_500)));
        assert_eq!(stamp_spans([7, 7, 7]), Some((0, 0)));
        assert_eq!(stamp_spans([0, 3_500, 10_000]), None, "seen not written");
        assert_eq!(stamp_spans([1_000, 0, 10_000]), None, "relayed not written");
        assert_eq!(stamp_spans([1_000, 3_500, 0]), None, "flagged not written");
        assert_eq!(stamp_spans([5_000, 3_500, 10_000]), None, "backwards");
        assert_eq!(stamp_spans([1, 2, 2_000_000_000]), None, "over a second");
    }

    #[test]
    fn the_carveout_comes_from_the_config_unless_the_variable_says_otherwise() {
        assert_eq!(carveout(100, None).unwrap(), 100);
        assert_eq!(carveout(100, Some(" -1")).unwrap(), -1);
        assert_eq!(carveout(-1, Some("0")).unwrap(), 0);
        let e = carveout(100, Some("101")).unwrap_err().to_string();
        assert!(e.contains("MORI_GPU_POOL_RESIDENT_CARVEOUT=\"101\"") && e.contains("-1") && e.contains("0 to 100"), "{e}");
        let e = carveout(100, Some("half")).unwrap_err().to_string();
        assert!(e.contains("\"half\""), "{e}");
        let e = carveout(-2, None).unwrap_err().to_string();
        assert!(e.contains("resident_carveout -2"), "{e}");
    }

    #[test]
    fn the_blocks_come_from_the_config_unless_the_variable_says_otherwise() {
        assert_eq!(blocks(0, None).unwrap(), 0);
        assert_eq!(blocks(24, None).unwrap(), 24);
        assert_eq!(blocks(24, Some("0")).unwrap(), 0);
        assert_eq!(blocks(0, Some(" 120")).unwrap(), 120);
        let e = blocks(0, Some("many")).unwrap_err().to_string();
        assert!(e.contains("MORI_GPU_POOL_RESIDENT=\"many\"") && e.contains("0 (off) to 1024"), "{e}");
        let e = blocks(0, Some("1025")).unwrap_err().to_string();
        assert!(e.contains("1025 blocks") && e.contains("at most 1024"), "{e}");
    }

    #[test]
    fn a_slot_is_posted_again_only_once_its_table_completed() {
        let mut b = Book { limit: 64, ..Book::default() };
        let mut live = std::collections::VecDeque::new();
        for round in 0..3 * DEPTH {
            let (seq, slot) = b.next().expect("a free slot");
            assert_eq!(seq, round + 1);
            assert_eq!(slot, ((round + 1) % DEPTH) as usize);
            b.posted(seq, slot);
            live.push_back(slot);
            if live.len() == DEPTH as usize {
                assert_eq!(b.next(), None, "every slot holds a live table");
                b.completed(live.pop_front().unwrap());
            }
        }
        // A table taken back leaves its number for the next post.
        let (seq, slot) = b.next().unwrap();
        b.posted(seq, slot);
        b.unposted(seq, slot);
        assert_eq!(b.next(), Some((seq, slot)));
        // Launch numbers: 31 bits (the kernel compares 31), never 0.
        let mut g = Book::default();
        assert_eq!(g.next_gen(), 1);
        g.gen = 0x7fff_fffe;
        assert_eq!((g.next_gen(), g.next_gen(), g.next_gen()), (0x7fff_ffff, 1, 2));
        // At most `limit` in flight (below the pool's slots), whichever slots are free.
        let mut l = Book { limit: 3, ..Book::default() };
        for _ in 0..3 {
            let (seq, slot) = l.next().unwrap();
            l.posted(seq, slot);
        }
        assert_eq!(l.next(), None, "3 in flight: the limit");
        l.completed(2);
        assert!(l.next().is_some());
        // Numbers wrap.
        let mut b = Book { posted: u32::MAX, limit: 64, ..Book::default() };
        assert_eq!(b.next(), Some((0, 0)));
        b.posted(0, 0);
        assert_eq!(b.next(), Some((1, 1)));
    }
}
