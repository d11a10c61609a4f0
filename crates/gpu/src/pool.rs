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
mod flags;
mod ordered;
mod paged;
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
    /// `num_events`, resident blocks above [`RESIDENT_MAX_BLOCKS`] or a `resident_idle` outside
    /// 1 ms to 10 s, a
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

    /// One launch of `f`, `dp`'s ordered-copy kernel, for `table` (see
    /// [`CopyPool::copy_in_order_with`]), `groups` groups whose longest first segment is
    /// `first` bytes long.
    ///
    /// # Safety
    /// As [`CopyPool::copy`].
    unsafe fn copy_ordered<M, D>(
        &self,
        dp: &DevPool,
        f: &Function,
        table: ordered::OrderedCopy,
        groups: u32,
        first: u64,
        make_done: M,
    ) -> Result<()>
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let make_done = match dp.resident.as_ref().filter(|r| r.takes(&table)) {
            // SAFETY: forwarded contract.
            Some(r) => match unsafe { self.post_resident(dp, r, table, make_done) } {
                Ok(r) => return r,
                // Every table slot busy, or the copier failed (said once): launched.
                Err(m) => m,
            },
            None => make_done,
        };
        let make_done = match dp.armed.as_ref().filter(|a| a.can_fire(groups)) {
            // SAFETY: forwarded contract.
            Some(a) => match unsafe { self.fire_armed(dp, a, table, make_done) } {
                Ok(r) => return r,
                // Another thread fired the last armed launch meanwhile.
                Err(m) => m,
            },
            None => make_done,
        };
        let rt = &self.shared.rt;
        let grid = ordered::grid(first, groups, dp.sms);
        if !table.takes(grid) {
            return Err(GpuError::invalid(format!(
                "copy pool: an ordered-copy table the kernel would refuse ({groups} groups on a grid of {grid}): nothing was queued"
            )));
        }
        let enqueue = |lane: &mut Lane<'_>| -> Result<()> {
            let arrivals = lane.arrivals.ok_or_else(|| GpuError::invalid("copy pool: the slot has no arrival word"))?;
            let t = table.finish(arrivals, lane.flag);
            let mut args = KernelArgs::new();
            args.push(t);
            let cfg = LaunchConfig { grid: (grid, 1, 1), block: (ordered::ORDERED_BLOCK, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the kernel's ABI is (OrderedCopy by value) (kernels/README.md); every
            // segment's ranges are mapped device memory (forwarded contract), the arrival word
            // is this slot's (no other submission uses it until this one completed) and the
            // flag word is this slot's mapped flag.
            unsafe { rt.launch(f, lane.stream(), &cfg, &args.params()) }?;
            lane.flag_taken = lane.flag.is_some();
            stats::count_ordered();
            Ok(())
        };
        // SAFETY: forwarded contract.
        let r = unsafe { self.submit_on(dp, enqueue, make_done) };
        dp.top_up(true);
        r
    }

    /// Fires `dp`'s oldest armed launch for `table` (see [`CopyPoolConfig::armed_depth`]):
    /// the table and the launch's slot's flag written into host memory, then the doorbell; no
    /// driver call before the device starts. Then arms a launch in its place. Returns
    /// `Err(make_done)` when nothing was armed (another thread fired it).
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for the table's segments.
    unsafe fn fire_armed<M, D>(
        &self,
        dp: &DevPool,
        a: &armed::Armed,
        table: ordered::OrderedCopy,
        make_done: M,
    ) -> std::result::Result<Result<()>, M>
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let t0 = Instant::now();
        let mut flag_seq = 0;
        let fired = a.fire(table, |slot| {
            let (w, seq) = dp.next_flag(slot)?;
            flag_seq = seq;
            Some((w.ptr(), seq))
        });
        let Some(slot) = fired else { return Err(make_done) };
        let t1 = Instant::now();
        stats::count_submit([t0, t0, t1, t1]);
        stats::count_armed();
        self.pend_flagged(dp, slot, (ARMED_LANE, 0), flag_seq, t1, make_done);
        dp.top_up(true);
        Ok(Ok(()))
    }

    /// Posts `table` to `dp`'s resident copier (see [`CopyPoolConfig::resident_blocks`]): a
    /// free slot taken for its completion flag, the table written into host memory, no driver
    /// call unless no grid runs. Returns `Err(make_done)` when the copier does not take it
    /// now (every table slot busy, no flag, a failed launch: the caller launches).
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for the table's segments.
    unsafe fn post_resident<M, D>(
        &self,
        dp: &DevPool,
        r: &resident::Resident,
        table: ordered::OrderedCopy,
        make_done: M,
    ) -> std::result::Result<Result<()>, M>
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let t0 = Instant::now();
        let Ok(slot) = self.shared.take_slot(dp) else { return Err(make_done) };
        let t1 = Instant::now();
        let Some((w, flag_seq)) = dp.next_flag(slot).map(|(w, seq)| (w.ptr(), seq)) else {
            dp.free.lock().push(slot);
            return Err(make_done);
        };
        let table_slot = match r.post(table, (w, flag_seq)) {
            Ok(Some(t)) => t,
            Ok(None) | Err(_) => {
                dp.free.lock().push(slot);
                return Err(make_done);
            }
        };
        let t2 = Instant::now();
        stats::count_submit([t0, t1, t2, t2]);
        stats::count_resident();
        self.pend_flagged(dp, slot, (RESIDENT_LANE, table_slot), flag_seq, t2, make_done);
        Ok(Ok(()))
    }

    /// Adds a submission that ran with no driver call (an armed fire, a resident post) to the
    /// pending ones: slot `slot`, its (lane, table slot), the flag value that completes it and
    /// when it was posted. The completion is made and boxed only now: the device may already
    /// run the copy.
    fn pend_flagged<M, D>(&self, dp: &DevPool, slot: usize, (stream, table): (usize, usize), flag_seq: u32, at: Instant, make_done: M)
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let done: CopyDone = Box::new(make_done());
        let p = Pending { dev: dp.device.0, slot, stream, table, done, failed: None, flag_seq, asked: at };
        self.shared.pending.lock().push(p);
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

impl Shared {
    fn dev_pool(&self, dev: Device) -> Result<&DevPool> {
        let cell = self
            .devs
            .get(dev.0 as usize)
            .ok_or_else(|| GpuError::invalid(format!("copy pool: {dev} does not exist ({} device(s) present)", self.devs.len())))?;
        if let Some(p) = cell.get() {
            return Ok(p);
        }
        let _creating = self.dev_init.lock();
        if let Some(p) = cell.get() {
            return Ok(p);
        }
        let streams = (0..self.cfg.num_streams).map(|_| self.rt.stream(dev)).collect::<Result<Vec<_>>>()?;
        let mut flags = match self.cfg.host_flags {
            Some(true) => match flags::alloc(&self.rt, dev, self.cfg.num_events) {
                Ok(f) => f.into_iter().map(Some).collect(),
                Err(e) => {
                    flags::warn_once(
                        &flags::SAID_ALLOC_FAILED,
                        &format!("completion flags unavailable on {dev} ({e}): its completions are told by events"),
                    );
                    Vec::new()
                }
            },
            _ => Vec::new(),
        };
        flags.resize_with(self.cfg.num_events, || None);
        let Kernels { sg: kernel, paged, ordered, armed: armed_fn, resident: resident_fn } =
            if self.cfg.kernel_threshold > 0 { self.load_kernels(dev) } else { Kernels::default() };
        let arrivals = match ordered.as_ref().filter(|_| self.cfg.ordered_kernel == Some(true)) {
            Some(_) => match ordered::alloc_arrivals(&self.rt, dev, self.cfg.num_events) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!(device = dev.0, error = %e, "copy pool: no arrival words: ordered batches are queued as one copy per segment");
                    None
                }
            },
            None => None,
        };
        let mut slots = Vec::with_capacity(self.cfg.num_events);
        for (i, flag) in flags.into_iter().enumerate() {
            slots.push(Slot {
                event: self.rt.event(dev, false)?,
                scratch: Mutex::new(None),
                staging: Mutex::new(None),
                flag,
                arrivals: arrivals.as_ref().map(|b| (b.clone(), i)),
                retired: AtomicBool::new(false),
            });
        }
        let ordered = ordered.filter(|_| arrivals.is_some());
        let sms = self.rt.device_properties(dev)?.multiprocessors.max(1);
        let armed = self.arm(dev, ordered.is_some(), armed_fn, sms);
        let resident = self.resident(dev, ordered.is_some() && slots.iter().all(|s| s.flag.is_some()), resident_fn, sms);
        Ok(cell.get_or_init(|| DevPool {
            resident,
            armed,
            device: dev,
            kernel,
            paged,
            ordered,
            sms,
            busy: streams.iter().map(|_| AtomicUsize::new(0)).collect(),
            streams,
            next: AtomicUsize::new(0),
            free: Mutex::new((0..slots.len()).rev().collect()),
            retired: AtomicUsize::new(0),
            flags_failed: AtomicBool::new(false),
            slots,
        }))
    }

    /// The scatter/gather, paged-copy, ordered-copy, armed and resident ordered-copy kernels
    /// on `dev` (one module); all none (logged) if no image loads or any is missing, and
    /// batches then use one copy per segment, paged copies one copy per range.
    fn load_kernels(&self, dev: Device) -> Kernels {
        let images = KernelImages { cubin: SG_CUBIN, ptx: SG_PTX, hsaco: SG_GFX942 };
        let loaded = images.load(&*self.rt, dev).and_then(|m| {
            Ok(Kernels {
                sg: Some(m.function("mori_scatter_gather_copy")?),
                paged: Some(paged::PagedKernels { table: m.function("mori_paged_copy")?, inline: m.function("mori_paged_copy_inline")? }),
                ordered: Some(m.function("mori_ordered_copy")?),
                armed: Some(m.function("mori_ordered_copy_armed")?),
                resident: Some(m.function("mori_ordered_copy_resident")?),
            })
        });
        match loaded {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(
                    device = dev.0,
                    error = %e,
                    "no scatter/gather kernels: batches use one copy per segment, paged copies one per range"
                );
                Kernels::default()
            }
        }
    }

    /// `dev`'s resident copier when [`CopyPoolConfig::resident_blocks`] asks for one and the
    /// ordered-copy kernel and flags are in use (`usable`); the path taken is logged either way.
    fn resident(&self, dev: Device, usable: bool, f: Option<Function>, sms: u32) -> Option<resident::Resident> {
        let blocks = self.cfg.resident_blocks;
        if blocks == 0 {
            return None;
        }
        let Some(f) = f.filter(|_| usable) else {
            tracing::warn!(device = dev.0, "copy pool: a resident copier of {blocks} blocks asked for, but ordered batches do not use the ordered-copy kernel with flags here: each is launched when posted");
            return None;
        };
        match resident::Resident::new(
            &self.rt,
            dev,
            f,
            (blocks, self.cfg.resident_idle, self.cfg.resident_carveout),
            sms,
            self.cfg.num_events,
        ) {
            Ok(r) => {
                tracing::info!(
                    device = dev.0,
                    blocks = r.grid(),
                    carveout = self.cfg.resident_carveout,
                    "copy pool: ordered batches go to a resident copier (no driver call to post one)"
                );
                Some(r)
            }
            Err(e) => {
                tracing::warn!(device = dev.0, error = %e, "copy pool: no resident copier: ordered batches are launched when posted");
                None
            }
        }
    }

    /// `dev`'s armed launches when [`CopyPoolConfig::armed_depth`] asks for them and the
    /// ordered-copy kernel is in use; the path taken is logged either way.
    fn arm(&self, dev: Device, ordered: bool, f: Option<Function>, sms: u32) -> Option<armed::Armed> {
        let depth = self.cfg.armed_depth;
        if depth == 0 {
            return None;
        }
        let Some(f) = f.filter(|_| ordered) else {
            tracing::warn!(device = dev.0, "copy pool: {depth} armed launches asked for, but ordered batches do not use the ordered-copy kernel here: each is queued when posted");
            return None;
        };
        match armed::Armed::new(&self.rt, dev, f, depth, sms) {
            Ok(a) => {
                tracing::info!(
                    device = dev.0,
                    depth,
                    grid = armed::grid(sms),
                    "copy pool: ordered batches fire armed launches (no driver call to post one)"
                );
                Some(a)
            }
            Err(e) => {
                tracing::warn!(device = dev.0, error = %e, "copy pool: no armed launches: ordered batches are launched when posted");
                None
            }
        }
    }

    /// A free slot of `dp`; waits (`admission_timeout` at most) while all are in flight,
    /// running completion steps meanwhile.
    fn take_slot(&self, dp: &DevPool) -> Result<usize> {
        if let Some(i) = dp.free.lock().pop() {
            return Ok(i);
        }
        let t0 = Instant::now();
        loop {
            if let Some(mut mine) = self.reap.try_lock() {
                self.reap_once(&mut mine);
            }
            if let Some(i) = dp.free.lock().pop() {
                return Ok(i);
            }
            let retired = dp.retired.load(Ordering::Acquire);
            if retired >= dp.slots.len() || t0.elapsed() > self.cfg.admission_timeout {
                let why = if retired >= dp.slots.len() {
                    format!(
                        "all {retired} event slots of {} were retired (failed event records, or resident-copier tables failed that may still run)",
                        dp.device
                    )
                } else {
                    format!(
                        "{} submissions still in flight on {} after {:?} ({retired} slot(s) retired: failed event records, or resident-copier tables failed that may still run)",
                        dp.slots.len() - retired,
                        dp.device,
                        self.cfg.admission_timeout
                    )
                };
                return Err(GpuError::timed_out("copy pool admission", why));
            }
            std::thread::yield_now();
        }
    }

    /// Completes every submission whose event fired (slot freed, stream released, `done`
    /// called). `mine` is the step's own list (the `reap` lock); the submitters' list is
    /// taken over first, so submitting never waits for a driver call made here. Returns
    /// (completed, still in flight).
    fn reap_once(&self, mine: &mut Vec<Pending>) -> (usize, usize) {
        mine.append(&mut self.pending.lock());
        let mut tally = stats::StepTally::default();
        let mut done = 0;
        // Devices whose armed launches completed: armed again once the callbacks ran.
        let mut rearm: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < mine.len() {
            let Some(dp) = self.devs.get(mine[i].dev as usize).and_then(OnceLock::get) else {
                // Unreachable: a pending entry's device pool was created before it was queued.
                i += 1;
                continue;
            };
            let p = &mut mine[i];
            let flag = dp.slots[p.slot].flag.as_ref().filter(|_| p.flag_seq != 0);
            let fired = match (flag, dp.resident.as_ref().filter(|_| p.stream == RESIDENT_LANE)) {
                // A resident table: no event follows it; its flag, the grid's stream (a
                // fault) and the deadline tell.
                (Some(f), Some(_)) if f.fired(p.flag_seq) => Ok(true),
                (_, Some(r)) => match r.fault() {
                    Some(e) => Err(e),
                    None if p.posted_at().elapsed() > resident::RESIDENT_DEADLINE => Err(r.overdue()),
                    None => Ok(false),
                },
                (flag, None) => match flag {
                    Some(f) if f.fired(p.flag_seq) => Ok(true),
                    Some(_) if p.asked.elapsed() < FLAG_FALLBACK => Ok(false),
                    _ => {
                        p.asked = Instant::now();
                        let r = dp.slots[p.slot].event.query();
                        tally.query(p.asked);
                        // The flag is written before the event is recorded: an event that fired
                        // with its flag unseen means flags do not reach this host.
                        if matches!(r, Ok(true)) && flag.is_some_and(|f| !f.fired(p.flag_seq)) {
                            tally.flag_miss();
                            flags::warn_once(&flags::SAID_MISSED, "an event fired before its completion flag was seen: flags do not reach the host here; completions wait for the once-a-millisecond event check");
                        }
                        r
                    }
                },
            };
            let r = match fired {
                Ok(false) => {
                    i += 1;
                    continue;
                }
                Ok(true) => mine[i].failed.take().map_or(Ok(()), Err),
                Err(e) => Err(e),
            };
            let p = mine.swap_remove(i);
            if p.stream == RESIDENT_LANE {
                match (dp.resident.as_ref(), r.as_ref()) {
                    (Some(res), Ok(_)) => res.completed(p.table),
                    // Failed by the deadline or a fault, the table may still run: its flag
                    // word is never handed out again.
                    (_, Err(_)) => {
                        dp.slots[p.slot].retired.store(true, Ordering::Release);
                        dp.retired.fetch_add(1, Ordering::AcqRel);
                    }
                    _ => {}
                }
            }
            match (p.stream, dp.armed.as_ref()) {
                (ARMED_LANE, Some(a)) => {
                    a.completed();
                    rearm.push(p.dev);
                }
                (ARMED_LANE | RESIDENT_LANE, _) => {}
                (lane, _) => {
                    dp.busy[lane].fetch_sub(1, Ordering::AcqRel);
                }
            }
            if !dp.slots[p.slot].retired.load(Ordering::Acquire) {
                dp.free.lock().push(p.slot);
            }
            // A panicking callback must not take the completion thread (or a waiter's step)
            // down with it: every later submission would then never complete.
            let done_fn = p.done;
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || done_fn(r))).is_err() {
                tracing::error!(device = p.dev, "copy pool: a completion callback panicked");
            }
            done += 1;
        }
        rearm.sort_unstable();
        rearm.dedup();
        for d in rearm {
            if let Some(dp) = self.devs.get(d as usize).and_then(OnceLock::get) {
                dp.top_up(false);
            }
        }
        (done, mine.len())
    }

    fn run_hook(&self) {
        if let Some(h) = self.hook.get() {
            h();
        }
    }

    /// The completion thread. While waiters drive completions (`driven` moves) it only runs
    /// the idle hook, every [`STAND_BACK`]. Otherwise it runs the completion step: spinning
    /// while submissions are in flight (completion latency is what stop-and-wait transfers
    /// measure), backing off to yields and then short sleeps when idle.
    fn reap_loop(&self) {
        let mut idle = 0u32;
        let mut seen = self.driven.load(Ordering::Acquire);
        while !self.shutdown.load(Ordering::Acquire) {
            let d = self.driven.load(Ordering::Acquire);
            if d != seen {
                seen = d;
                self.run_hook();
                std::thread::sleep(STAND_BACK);
                continue;
            }
            let (done, in_flight) = self.reap_once(&mut self.reap.lock());
            self.run_hook();
            if done > 0 {
                idle = 0;
            } else if in_flight > 0 {
                if self.cfg.spin_in_flight {
                    for _ in 0..8 {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
            } else {
                idle = idle.saturating_add(1);
                if idle < 256 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
        self.run_hook();
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
