//! [`CopyPool`]: device work (copies, kernels) on a pool of streams per device, each
//! submission closed by the event of an in-flight slot (and, with
//! [`CopyPoolConfig::host_flags`], a flag word the stream writes in mapped host memory first:
//! `flags`), and completed either by the pool's completion thread or by a waiting thread
//! through [`CopyPool::progress`]; `stats` counts where submissions spend their time.
//! Transport backends (xgmi, fabric) queue their transfers here and learn of completion
//! without blocking the caller.
//!
//! Choices measured on an H200 (docs/PERFORMANCE.md, xgmi section): a submission takes the
//! first stream with nothing in flight (rotating over 64 streams cost about 1–1.5 µs per
//! stop-and-wait transfer); events are created once per slot and reused; a waiter that runs
//! the completion step itself saves the hand-off from the completion thread (0.6–1.7 µs);
//! batches of many small segments go through the scatter/gather kernel
//! (`kernels/scatter_gather_copy.cu`: 0.15 µs per 4 KiB descriptor at batch 128 against
//! about 6 µs as separate copies); paged KV-cache copies ([`CopyPool::copy_paged`]) go
//! through the paged-copy kernel of the same module, which computes the addresses itself.
//!
//! Kernel tables (descriptors, block runs) are written into the slot's pinned host staging
//! buffer and uploaded with an async copy on the submission's stream (stream-ordered, no
//! staging by the driver); both staging and device scratch grow to the next power of two and
//! are reused, so a steady stream of batches allocates nothing.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{GpuError, Result};
use crate::memory::DeviceSlice;
use crate::module::{Function, KernelArgs, KernelImages};
use crate::stream::Stream;
use crate::types::Device;
use crate::LaunchConfig;
use crate::Runtime;

static SG_CUBIN: &[u8] = include_bytes!("../../../kernels/prebuilt/scatter_gather_copy.sm_90.cubin");
static SG_PTX: &str = include_str!("../../../kernels/prebuilt/scatter_gather_copy.sm_90.ptx");
static SG_GFX942: &[u8] = include_bytes!("../../../kernels/prebuilt/scatter_gather_copy.gfx942.hsaco");

mod armed;
mod config;
mod devices;
mod flags;
mod ordered;
mod paged;
mod posting;
mod reap;
mod resident;
mod slot;
mod stats;
mod words;
pub use armed::{ARMED_ENV, ARMED_MAX};
pub use config::{env_switch, env_text, CopyPoolConfig, FLAGS_ENV, FLAG_FALLBACK, SPIN_ENV};
pub use ordered::{ORDERED_ENV, ORDERED_REST_MAX, ORDERED_SEGS};
pub use paged::{PagedCopy, PagedRun, PagedSide, PAGED_INLINE_RUNS};
pub use resident::{CARVEOUT_ENV, RESIDENT_CARVEOUT, RESIDENT_DEADLINE, RESIDENT_ENV, RESIDENT_IDLE, RESIDENT_MAX_BLOCKS};
pub use slot::Lane;
use slot::Slot;
pub use stats::{submit_stats, SubmitStats};

// The kernels' tables are little endian (kernels/README.md); they are written as host bytes.
const _: () = assert!(cfg!(target_endian = "little"), "mori-gpu's kernel tables assume a little-endian host");

/// One copy: `len` bytes from device address `src` to device address `dst`. Laid out as the
/// scatter/gather kernel's 24-byte descriptor (kernels/README.md).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopySeg {
    /// Source device address.
    pub src: u64,
    /// Destination device address.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

/// Called once with the submission's outcome, by whichever thread completes it (the pool's
/// completion thread, or a thread inside [`CopyPool::progress`]).
pub type CopyDone = Box<dyn FnOnce(Result<()>) + Send>;

// Fields drop in declaration order: the resident copier (its grid exited), the armed launches
// (let go, their stream drained) and the slots (each waits for its last submission, or leaks what it may still touch) before the
// kernels' module and the streams.
struct DevPool {
    /// The resident copier ([`CopyPoolConfig::resident_blocks`]), when on.
    resident: Option<resident::Resident>,
    /// The armed ordered-copy launches ([`CopyPoolConfig::armed_depth`]), when on.
    armed: Option<armed::Armed>,
    device: Device,
    slots: Vec<Slot>,
    /// The scatter/gather kernel (none when disabled or when no image loads) and the
    /// multiprocessor count that sizes its grid.
    kernel: Option<Function>,
    /// The paged-copy kernels of the same module (none exactly when `kernel` is none).
    paged: Option<paged::PagedKernels>,
    /// The ordered-copy kernel of the same module (none when `kernel` is none or
    /// [`CopyPoolConfig::ordered_kernel`] is off, or when the arrival words could not be
    /// allocated).
    ordered: Option<Function>,
    sms: u32,
    streams: Vec<Stream>,
    /// Submissions in flight per stream.
    busy: Vec<AtomicUsize>,
    next: AtomicUsize,
    /// Indices of the free slots.
    free: Mutex<Vec<usize>>,
    /// Slots retired for good: after a failed event record, or a resident-copier table failed
    /// by its deadline or a fault (it may still run).
    retired: AtomicUsize,
    /// A completion-flag write failed on this device: its later submissions are told complete
    /// by their events, without trying the write again.
    flags_failed: AtomicBool,
}

/// The armed depth a pool configured with `configured` ([`CopyPoolConfig::armed_depth`]) arms
/// on CUDA with the ordered-copy kernel: [`ARMED_ENV`] when set. Errors: `InvalidArgument`
/// naming the variable for a value that is not a number from 0 to [`ARMED_MAX`].
pub fn armed_depth(configured: usize) -> Result<usize> {
    armed::depth(configured, env_text(ARMED_ENV)?.as_deref())
}

/// [`Pending::stream`] of a fired armed launch (on the armed stream, not a lane).
const ARMED_LANE: usize = usize::MAX;

/// [`Pending::stream`] of a table posted to the resident copier ([`Pending::table`] its table
/// slot): no event follows it, its flag alone tells.
const RESIDENT_LANE: usize = usize::MAX - 1;

struct Pending {
    /// Device ordinal: the index of its pool in `Shared::devs`.
    dev: u32,
    slot: usize,
    /// Its lane, [`ARMED_LANE`] or [`RESIDENT_LANE`].
    stream: usize,
    /// Its table slot in the resident copier ([`RESIDENT_LANE`] only).
    table: usize,
    done: CopyDone,
    /// Enqueueing failed part-way: the submission fails with this once the event fired.
    failed: Option<GpuError>,
    /// The sequence number its slot's completion flag will hold once it finished (0: no
    /// flag; the event tells), and when a completion step last asked the event.
    flag_seq: u32,
    asked: Instant,
}

impl Pending {
    /// When it was posted: a resident table's ([`RESIDENT_LANE`]) `asked` is not moved by the
    /// checks of its grid, so it is that instant (the deadline counts from it).
    fn posted_at(&self) -> Instant {
        self.asked
    }
}

/// The copy module's kernels on a device (all none when it does not load).
#[derive(Default)]
struct Kernels {
    sg: Option<Function>,
    paged: Option<paged::PagedKernels>,
    ordered: Option<Function>,
    armed: Option<Function>,
    resident: Option<Function>,
}

/// Called by the completion thread between rounds (see [`CopyPool::set_idle_hook`]).
type Hook = Box<dyn Fn() + Send + Sync>;

struct Shared {
    rt: Arc<dyn Runtime>,
    cfg: CopyPoolConfig,
    /// Per device ordinal, created on first use (no lock and no hashing on the hot path).
    devs: Vec<OnceLock<DevPool>>,
    /// Held while a device's pool is created.
    dev_init: Mutex<()>,
    /// Submissions not yet seen by a completion step.
    pending: Mutex<Vec<Pending>>,
    /// The submissions being reaped, owned by whichever thread runs the completion step.
    reap: Mutex<Vec<Pending>>,
    /// Bumped by every [`CopyPool::progress`] call: while it moves, waiters do the completion
    /// work and the completion thread stands back.
    driven: AtomicU64,
    hook: OnceLock<Hook>,
    shutdown: AtomicBool,
    /// Set once the per-range path of paged copies was reported (logged once per pool).
    paged_fallback_noted: AtomicBool,
}

/// Streams, slots and a completion thread per pool (see the module docs). Dropping it stops
/// the thread; submissions still in flight then never call back.
pub struct CopyPool {
    shared: Arc<Shared>,
    reaper: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for CopyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CopyPool({:?})", self.shared.cfg)
    }
}

/// How long the completion thread sleeps between looks while waiters drive completions.
const STAND_BACK: Duration = Duration::from_micros(50);

/// Claims a lane (a stream) for one more submission and returns its index: the first lane
/// with nothing in flight, else the next in turn (`next` counts the turns); its count is
/// raised by one either way. `busy` must not be empty.
fn claim_lane(busy: &[AtomicUsize], next: &AtomicUsize) -> usize {
    for (i, b) in busy.iter().enumerate() {
        if b.load(Ordering::Relaxed) == 0 && b.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return i;
        }
    }
    let i = next.fetch_add(1, Ordering::Relaxed) % busy.len();
    busy[i].fetch_add(1, Ordering::AcqRel);
    i
}

/// Queues `segs` on `stream` as one async device-to-device copy each (the copy engines), in
/// order.
///
/// # Safety
/// Every segment's ranges are device memory mapped in this process and accessible from `dev`
/// until the stream ran the copies.
unsafe fn copy_engine(rt: &Arc<dyn Runtime>, dev: Device, segs: impl Iterator<Item = CopySeg>, stream: &Stream) -> Result<()> {
    for seg in segs {
        let len = usize::try_from(seg.len).map_err(|_| GpuError::invalid(format!("copy of {} bytes exceeds usize", seg.len)))?;
        // SAFETY: forwarded contract: both ranges are mapped device memory of this process.
        let (d, sr) = unsafe { (DeviceSlice::from_raw(seg.dst, len, dev), DeviceSlice::from_raw(seg.src, len, dev)) };
        rt.copy_dtod_async(&d, &sr, stream)?;
    }
    Ok(())
}

impl CopyPool {
    /// Starts the completion thread (named `thread_name`). Streams and slots are created per
    /// device on first use. `MORI_GPU_PAGED_INLINE_RUNS`, when set, replaces
    /// `cfg.paged_inline_runs`, [`SPIN_ENV`] `cfg.spin_in_flight` and [`FLAGS_ENV`]
    /// `cfg.host_flags`, [`ARMED_ENV`] `cfg.armed_depth` (which HIP, and a pool without the
    /// ordered-copy kernel, set to 0), [`RESIDENT_ENV`] `cfg.resident_blocks` (which HIP, and a
    /// pool without the ordered-copy kernel or flags, set to 0). Errors: `InvalidArgument` for
    /// zero streams or events, an armed depth above [`ARMED_MAX`] or (where it arms) not below
    /// `num_events`, resident blocks above [`RESIDENT_MAX_BLOCKS`], a `resident_idle` outside
    /// 1 ms to 10 s or a `resident_carveout` (or [`CARVEOUT_ENV`]) outside -1 to 100 (checked
    /// even where the copier is off), a
    /// `paged_inline_runs` (or that variable) that is not a number from 0 to
    /// [`PAGED_INLINE_RUNS`], or a [`SPIN_ENV`] or [`FLAGS_ENV`] other than 0 or 1 (any of
    /// the three not UTF-8 too); `Io` if the thread cannot be spawned.
    pub fn new(rt: Arc<dyn Runtime>, mut cfg: CopyPoolConfig, thread_name: &str) -> Result<Self> {
        if cfg.num_streams == 0 || cfg.num_events == 0 {
            return Err(GpuError::invalid(format!(
                "copy pool: num_streams ({}) and num_events ({}) must be at least 1",
                cfg.num_streams, cfg.num_events
            )));
        }
        cfg.paged_inline_runs = paged::inline_runs(cfg.paged_inline_runs, env_text(paged::INLINE_ENV)?.as_deref())?;
        cfg.spin_in_flight = env_switch(SPIN_ENV, cfg.spin_in_flight, env_text(SPIN_ENV)?.as_deref())?;
        // Unset: flags on CUDA; events on HIP, where hipStreamWriteValue32 documents no fence
        // and the flag path never ran on an AMD GPU.
        let auto = rt.kind() != crate::RuntimeKind::Hip;
        cfg.host_flags = Some(env_switch(FLAGS_ENV, cfg.host_flags.unwrap_or(auto), env_text(FLAGS_ENV)?.as_deref())?);
        cfg.ordered_kernel =
            Some(ordered::enabled(cfg.ordered_kernel, rt.kind() == crate::RuntimeKind::Hip, env_text(ORDERED_ENV)?.as_deref())?);
        cfg.armed_depth = armed_depth(cfg.armed_depth)?;
        if rt.kind() == crate::RuntimeKind::Hip && cfg.armed_depth > 0 {
            tracing::info!("copy pool: HIP runtime: ordered batches are launched when posted (armed launches never ran on an AMD GPU)");
            cfg.armed_depth = 0;
        }
        if cfg.armed_depth > 0 && (cfg.ordered_kernel != Some(true) || cfg.kernel_threshold == 0) {
            tracing::info!("copy pool: armed launches need the ordered-copy kernel, which this pool does not use: none armed");
            cfg.armed_depth = 0;
        }
        cfg.resident_blocks = resident::blocks(cfg.resident_blocks, env_text(RESIDENT_ENV)?.as_deref())?;
        cfg.resident_carveout = resident::carveout(cfg.resident_carveout, env_text(CARVEOUT_ENV)?.as_deref())?;
        if !(Duration::from_millis(1)..=Duration::from_secs(10)).contains(&cfg.resident_idle) {
            return Err(GpuError::invalid(format!("copy pool: resident_idle {:?}: 1 ms to 10 s", cfg.resident_idle)));
        }
        if rt.kind() == crate::RuntimeKind::Hip && cfg.resident_blocks > 0 {
            tracing::info!(
                "copy pool: HIP runtime: ordered batches are launched when posted (the resident copier never ran on an AMD GPU)"
            );
            cfg.resident_blocks = 0;
        }
        if cfg.resident_blocks > 0 && (cfg.ordered_kernel != Some(true) || cfg.kernel_threshold == 0 || cfg.host_flags != Some(true)) {
            tracing::warn!("copy pool: the resident copier needs the ordered-copy kernel and completion flags, which this pool does not use: ordered batches take the pool's other paths");
            cfg.resident_blocks = 0;
        }
        if cfg.resident_blocks > 0 && cfg.armed_depth > 0 {
            // The copier takes the ordered batches first: armed launches would never fire, yet
            // hold event slots and make device-wide calls wait.
            tracing::warn!("copy pool: both armed launches and a resident copier asked for: the resident copier takes the ordered batches, none is armed");
            cfg.armed_depth = 0;
        }
        if cfg.armed_depth > 0 && cfg.armed_depth >= cfg.num_events {
            // Each armed launch holds a slot until fired: other submissions need one left.
            return Err(GpuError::invalid(format!(
                "copy pool: {} armed launches (armed_depth or {ARMED_ENV}) with {} event slots: at most {} (each holds a slot until fired)",
                cfg.armed_depth,
                cfg.num_events,
                cfg.num_events - 1
            )));
        }
        if rt.kind() == crate::RuntimeKind::Hip && cfg.paged_inline_runs > 0 {
            // HIP adds 256 bytes of hidden kernel arguments: 3928 + 256 = 4184 bytes of
            // kernarg, over the 4 KiB a launch is documented to take, and never run on an AMD
            // GPU here; tables are uploaded instead.
            tracing::info!("copy pool: HIP runtime: paged run tables are uploaded (the inline-table kernel is CUDA only)");
            cfg.paged_inline_runs = 0;
        }
        let n_dev = rt.device_count()?;
        let shared = Arc::new(Shared {
            rt,
            cfg,
            devs: (0..n_dev).map(|_| OnceLock::new()).collect(),
            dev_init: Mutex::new(()),
            pending: Mutex::new(Vec::new()),
            reap: Mutex::new(Vec::new()),
            driven: AtomicU64::new(0),
            hook: OnceLock::new(),
            shutdown: AtomicBool::new(false),
            paged_fallback_noted: AtomicBool::new(false),
        });
        let s2 = shared.clone();
        let reaper = std::thread::Builder::new()
            .name(thread_name.to_string())
            .spawn(move || s2.reap_loop())
            .map_err(|e| GpuError::io("spawn copy-pool completion thread", e))?;
        Ok(CopyPool { shared, reaper: Some(reaper) })
    }

    /// Sets a function the completion thread calls after every completion round, and every
    /// 50 µs while waiters drive completions (e.g. to hand queued notifications to another
    /// thread, off the completion path). Only the first call takes effect.
    pub fn set_idle_hook(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.shared.hook.set(hook);
    }

    /// Takes a free slot and a stream of `dev`, lets `enqueue` queue the work on the stream,
    /// records the slot's event after it and returns; `done` runs once the event fired. When
    /// `num_events` submissions are in flight on `dev` it waits for a slot, at most
    /// `admission_timeout` (then `Io` with `TimedOut`).
    ///
    /// If `enqueue` fails, part of the work may be queued: the event is recorded anyway and
    /// `done` gets the error once it fired (so the slot and whatever `done` keeps alive are
    /// released only after the stream ran the queued part), and `submit` returns `Ok`. An
    /// error return (device setup, admission, event record) leaves nothing pending and drops
    /// `done` uncalled.
    ///
    /// # Safety
    /// All device memory the enqueued work touches must be mapped in this process and
    /// accessible from `dev`, and must stay mapped until `done` has been called.
    pub unsafe fn submit<F, D>(&self, dev: Device, enqueue: F, done: D) -> Result<()>
    where
        F: FnOnce(&mut Lane<'_>) -> Result<()>,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let dp = self.shared.dev_pool(dev)?;
        // SAFETY: forwarded contract.
        unsafe { self.submit_on(dp, enqueue, || done) }
    }

    /// [`CopyPool::submit`] on a device's pool; the completion is made by `make_done` once
    /// the work and the event are queued.
    ///
    /// # Safety
    /// As [`CopyPool::submit`].
    unsafe fn submit_on<F, M, D>(&self, dp: &DevPool, enqueue: F, make_done: M) -> Result<()>
    where
        F: FnOnce(&mut Lane<'_>) -> Result<()>,
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let s = &self.shared;
        let dev = dp.device;
        let t0 = Instant::now();
        let slot = s.take_slot(dp)?;
        let t1 = Instant::now();
        let si = claim_lane(&dp.busy, &dp.next);
        let stream = &dp.streams[si];
        let word = dp.next_flag(slot);
        let (failed, flag_taken) = {
            let mut lane = Lane {
                rt: &s.rt,
                device: dev,
                stream,
                slot_scratch: &dp.slots[slot].scratch,
                scratch: None,
                slot_staging: &dp.slots[slot].staging,
                staging: None,
                arrivals: dp.slots[slot].arrivals.as_ref().map(|(b, i)| b.ptr() + ordered::ARRIVAL_BYTES * *i as u64),
                flag: word.as_ref().map(|(w, seq)| (w.ptr(), *seq)),
                flag_taken: false,
            };
            (enqueue(&mut lane).err(), lane.flag_taken)
        };
        let t2 = Instant::now();
        let flag_seq = match word {
            // The work writes the flag itself; if queueing it failed, the event tells.
            Some((_, seq)) if flag_taken && failed.is_none() => seq,
            Some(_) if flag_taken => 0,
            Some((w, seq)) => match stream.write_value32(&w, seq) {
                Ok(()) => seq,
                Err(e) => {
                    dp.flags_failed_with(e);
                    0
                }
            },
            None => 0,
        };
        let recorded = dp.slots[slot].event.record(stream);
        stats::count_submit([t0, t1, t2, Instant::now()]);
        if let Err(e) = recorded {
            dp.slots[slot].retired.store(true, Ordering::Release);
            // Work may be queued with no event after it: this slot is retired for good.
            dp.busy[si].fetch_sub(1, Ordering::AcqRel);
            dp.retired.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(device = dev.0, error = %e, "copy pool: an event slot is retired after a failed record");
            return Err(failed.unwrap_or(e));
        }
        // Made and boxed only now: the device work is already queued, so this overlaps it.
        let done: CopyDone = Box::new(make_done());
        s.pending.lock().push(Pending { dev: dev.0, slot, stream: si, table: 0, done, failed, flag_seq, asked: Instant::now() });
        Ok(())
    }

    /// Queues `segs` (empty ones skipped) as one submission: through the scatter/gather
    /// kernel when there are at least `kernel_threshold` segments averaging under
    /// `kernel_max_mean_bytes` (the descriptor table written into the slot's pinned staging
    /// buffer and uploaded to its scratch buffer on the same stream: [`Lane::stage`]), else as one
    /// `cuMemcpyDtoDAsync` (or HIP's) per segment, with no allocation before the copies. See
    /// [`CopyPool::submit`] for slots, errors and `done`; more than `u32::MAX` segments on the
    /// kernel path is `InvalidArgument`.
    ///
    /// # Safety
    /// Every segment's `src..src+len` and `dst..dst+len` must be device memory mapped in this
    /// process and accessible from `dev`, and must stay mapped until `done` has been called.
    pub unsafe fn copy<D>(&self, dev: Device, segs: &[CopySeg], done: D) -> Result<()>
    where
        D: FnOnce(Result<()>) + Send + 'static,
    {
        // SAFETY: forwarded contract.
        unsafe { self.copy_with(dev, segs.iter().copied(), || done) }
    }

    /// [`CopyPool::copy`] whose completion is made by `make_done` only after the copies and
    /// the event are queued (so whatever it allocates or clones is off the latency path: the
    /// device already runs the copies), and whose segments come from an iterator (walked
    /// twice: once to count, once to write the table or queue the copies; nothing is
    /// collected). `make_done` is called exactly when `Ok` is returned. An iterator that
    /// yields a different number of non-empty segments the second time fails the submission.
    ///
    /// # Safety
    /// As [`CopyPool::copy`].
    pub unsafe fn copy_with<S, M, D>(&self, dev: Device, segs: S, make_done: M) -> Result<()>
    where
        S: IntoIterator<Item = CopySeg>,
        S::IntoIter: Clone,
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        // SAFETY: forwarded contract.
        unsafe { self.copy_with_in(dev, segs, make_done, false) }
    }

    /// [`CopyPool::copy_with`] with the segments copied in order, so each segment's bytes are
    /// written only after the previous segment's landed (never the scatter/gather kernel,
    /// whose threads write every segment at once): 1 to [`ORDERED_SEGS`] segments with at
    /// most [`ORDERED_REST_MAX`] bytes after the first go through one launch of the
    /// ordered-copy kernel ([`CopyPoolConfig::ordered_kernel`]: the grid copies the first,
    /// the last block to finish the others, then writes the completion flag); other batches
    /// as one async copy per segment, all on the submission's one stream.
    ///
    /// # Safety
    /// As [`CopyPool::copy`].
    pub unsafe fn copy_in_order_with<S, M, D>(&self, dev: Device, segs: S, make_done: M) -> Result<()>
    where
        S: IntoIterator<Item = CopySeg>,
        S::IntoIter: Clone,
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        // SAFETY: forwarded contract.
        unsafe { self.copy_with_in(dev, segs, make_done, true) }
    }

    /// # Safety
    /// As [`CopyPool::copy`].
    unsafe fn copy_with_in<S, M, D>(&self, dev: Device, segs: S, make_done: M, in_order: bool) -> Result<()>
    where
        S: IntoIterator<Item = CopySeg>,
        S::IntoIter: Clone,
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let s = &self.shared;
        let dp = s.dev_pool(dev)?;
        let segs = segs.into_iter().filter(|g| g.len > 0);
        let (n, total) = segs.clone().fold((0usize, 0u64), |(n, t), g| (n + 1, t + g.len));
        let kernel = dp.kernel.as_ref().filter(|_| {
            !in_order
                && s.cfg.kernel_threshold > 0
                && n >= s.cfg.kernel_threshold
                && total / (n as u64).max(1) < s.cfg.kernel_max_mean_bytes
        });
        let ordered_kernel = dp.ordered.as_ref().filter(|_| in_order);
        if let Some((f, (table, first))) = ordered_kernel.and_then(|f| Some((f, ordered::OrderedCopy::table(segs.clone())?))) {
            // SAFETY: forwarded contract.
            return unsafe { self.copy_ordered(dp, f, table, 1, first, make_done) };
        }
        if let Some(f) = kernel {
            let n32 = u32::try_from(n)
                .map_err(|_| GpuError::invalid(format!("{n} segments in one scatter/gather batch: at most {}", u32::MAX)))?;
            let seg_len = std::mem::size_of::<CopySeg>();
            let need = n * seg_len;
            let grid = (128 * dp.sms).min((n as u64).max(total.div_ceil(16 << 10)).min(u32::MAX as u64) as u32).max(1);
            let rt = &s.rt;
            let enqueue = |lane: &mut Lane<'_>| -> Result<()> {
                let stream = lane.stream();
                let table = lane.stage(need, |buf| {
                    // Exactly n: fewer would leave stale descriptors of an earlier batch in
                    // the table, more would not fit.
                    let mut it = segs;
                    let short = || GpuError::invalid(format!("copy pool: the segment iterator yielded {n} segments, then fewer"));
                    for dst in buf.chunks_exact_mut(seg_len) {
                        let seg = it.next().ok_or_else(short)?;
                        dst.copy_from_slice(bytemuck::bytes_of(&seg));
                    }
                    if it.next().is_some() {
                        return Err(GpuError::invalid(format!("copy pool: the segment iterator yielded {n} segments, then more")));
                    }
                    Ok(())
                })?;
                let mut args = KernelArgs::new();
                args.push_ptr(&table).push(n32);
                let cfg = LaunchConfig { grid: (grid, 1, 1), block: (64, 1, 1), shared_mem_bytes: 0 };
                // SAFETY: the kernel's ABI is (const CopySeg*, uint32_t) (kernels/README.md);
                // every descriptor's ranges are mapped device memory (forwarded contract).
                unsafe { rt.launch(f, stream, &cfg, &args.params()) }
            };
            // SAFETY: forwarded contract.
            return unsafe { self.submit_on(dp, enqueue, make_done) };
        }
        let rt = &s.rt;
        // SAFETY: forwarded contract.
        let enqueue = |lane: &mut Lane<'_>| unsafe { copy_engine(rt, dev, segs, lane.stream()) };
        // SAFETY: forwarded contract.
        unsafe { self.submit_on(dp, enqueue, make_done) }
    }

    /// Lets every armed ordered-copy launch go ([`CopyPoolConfig::armed_depth`]) and stops the
    /// resident copier's grid ([`CopyPoolConfig::resident_blocks`]), and waits for them:
    /// afterwards nothing this pool queued waits for the host, so the process may free device
    /// or pinned memory, allocate, or synchronise the device, as long as it posts nothing
    /// meanwhile: the next ordered batch posted on that device arms again (or launches the
    /// grid again); completions do not. Nothing to do (Ok) without either. Errors: `Io` (timed
    /// out) when a device's armed stream or grid did not finish in 10 s (the first such
    /// device's; every device is tried).
    pub fn disarm(&self) -> Result<()> {
        // Every device asked (`fold` runs them all), the first error kept (`and`).
        let devs = self.shared.devs.iter().filter_map(OnceLock::get);
        let armed =
            devs.clone().filter_map(|dp| Some((dp, dp.armed.as_ref()?))).map(|(dp, a)| a.disarm().map(|back| dp.free.lock().extend(back)));
        let resident = devs.filter_map(|dp| dp.resident.as_ref()).map(|r| r.quiesce());
        armed.chain(resident).fold(Ok(()), Result::and)
    }

    /// One completion step, run by the calling thread: completes every submission whose
    /// event fired (calling its `done` here). Skipped, returning false, while another thread
    /// runs one; never blocks otherwise. Returns true when it completed anything. A thread
    /// spin-waiting on a transfer calls this (through the backend's `Progress`), so it does
    /// not wait for the completion thread to notice and hand over.
    pub fn progress(&self) -> bool {
        let s = &self.shared;
        s.driven.fetch_add(1, Ordering::AcqRel);
        match s.reap.try_lock() {
            Some(mut mine) => s.reap_once(&mut mine).0 > 0,
            None => false,
        }
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        if let Some(h) = self.reaper.take() {
            let _ = h.join();
        }
    }
}

impl Drop for DevPool {
    fn drop(&mut self) {
        // The resident grid first (it may still write the slots' flags and copy their
        // tables): a grid that does not exit leaves every slot retired, so their flags leak.
        if let Some(r) = self.resident.take() {
            if !r.shut() {
                self.slots.iter().for_each(|s| s.retired.store(true, Ordering::Release));
            }
        }
    }
}

impl DevPool {
    /// Slot `slot`'s completion-flag word and its next sequence number, when this device's
    /// submissions use flags (none: the event tells).
    fn next_flag(&self, slot: usize) -> Option<(DeviceSlice<'_>, u32)> {
        let flag = self.slots.get(slot)?.flag.as_ref().filter(|_| !self.flags_failed.load(Ordering::Relaxed))?;
        flag.next_word().map_err(|e| self.flags_failed_with(e)).ok()
    }

    /// A flag that cannot be set up or written leaves this submission, and every later one on
    /// this device, to its event (the work itself was queued), said once per process.
    fn flags_failed_with(&self, e: GpuError) {
        self.flags_failed.store(true, Ordering::Relaxed);
        flags::warn_once(
            &flags::SAID_WRITE_FAILED,
            &format!(
                "a completion flag write failed on {} ({e}): this device's submissions are told complete by their events from now on",
                self.device
            ),
        );
    }

    /// Arms this device's launches back up to [`CopyPoolConfig::armed_depth`] on free slots
    /// (none free: left for a later post or completion); nothing when the device has none.
    /// Called after a post (`post`: it also ends a [`CopyPool::disarm`]) and after a
    /// completion step that completed an armed launch.
    fn top_up(&self, post: bool) {
        if let Some(a) = self.armed.as_ref() {
            let back = a.top_up(post, || self.free.lock().pop(), &self.slots);
            if !back.is_empty() {
                self.free.lock().extend(back);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_first_idle_then_in_turn() {
        let busy: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        let next = AtomicUsize::new(0);
        // Stop-and-wait: claim, complete, claim again -> always lane 0.
        for _ in 0..5 {
            assert_eq!(claim_lane(&busy, &next), 0);
            busy[0].fetch_sub(1, Ordering::AcqRel);
        }
        // Concurrent submissions spread over the idle lanes first.
        assert_eq!([claim_lane(&busy, &next), claim_lane(&busy, &next), claim_lane(&busy, &next)], [0, 1, 2]);
        // All busy: shared in turn.
        assert_eq!([claim_lane(&busy, &next), claim_lane(&busy, &next), claim_lane(&busy, &next), claim_lane(&busy, &next)], [0, 1, 2, 0]);
        assert_eq!(busy.iter().map(|b| b.load(Ordering::Relaxed)).collect::<Vec<_>>(), vec![3, 2, 2]);
        // Lane 1 drains: it is the first idle one again.
        busy[1].store(0, Ordering::Relaxed);
        assert_eq!(claim_lane(&busy, &next), 1);
    }
}
