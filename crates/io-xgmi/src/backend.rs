//! The xgmi backend proper.

use mori_gpu::{Device, DeviceSlice, Event, Function, IpcHandle, IpcMapping, KernelArgs, LaunchConfig, ModuleImage, Runtime, Stream};
use mori_io_core::{
    Backend, BackendContext, BackendHandle, BackendKind, EngineDesc, IoError, IoResult, MemId, MemLoc, MemoryDesc, Op,
    Refusal, TransferRequest, TransferStatus,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

static CUBIN: &[u8] = include_bytes!("../../../kernels/prebuilt/scatter_gather_copy.sm_90.cubin");
static PTX: &str = include_str!("../../../kernels/prebuilt/scatter_gather_copy.sm_90.ptx");
static GFX942: &[u8] = include_bytes!("../../../kernels/prebuilt/scatter_gather_copy.gfx942.hsaco");

/// Settings of the xgmi backend.
#[derive(Debug, Clone)]
pub struct XgmiConfig {
    /// Streams per device (bench `--num-streams`, default 64). A transfer takes the first
    /// stream with no transfer in flight, so stop-and-wait traffic stays on one stream
    /// (rotating over all 64 cost about 1.3 µs per batch-1 transfer on the H200:
    /// docs/PERFORMANCE.md), and concurrent transfers spread out; with every stream busy the
    /// next one in turn is shared.
    pub num_streams: usize,
    /// Most transfers in flight per device, each with its event (bench `--num-events`, 64).
    pub num_events: usize,
    /// Batches with at least this many segments use the scatter/gather kernel (default 32;
    /// 0 disables the kernel).
    pub kernel_threshold: usize,
    /// ... unless their segments average at least this many bytes (default 48 MiB): then one
    /// async copy per segment, each streaming through its own range, does not spread the
    /// kernel's threads over the whole batch at once (which thrashed the TLB on gigabyte IPC
    /// mappings). Measured on the H200, two processes, batch 128 (docs/PERFORMANCE.md): the
    /// kernel gave 1165-1510 GB/s for 4-32 MiB segments but 411-620 at 64 MiB; one copy per
    /// segment gave 533-616 GB/s at 4 MiB (host-bound: 128 submissions of a few µs each) and
    /// 1402-1500 at 64 MiB.
    pub kernel_max_mean_bytes: u64,
}

impl Default for XgmiConfig {
    fn default() -> Self {
        XgmiConfig { num_streams: 64, num_events: 64, kernel_threshold: 32, kernel_max_mean_bytes: 48 << 20 }
    }
}

/// The 24-byte descriptor of the scatter/gather kernel (kernels/README.md).
#[repr(C)]
#[derive(Clone, Copy)]
struct CopyDesc {
    src: u64,
    dst: u64,
    len: u64,
}

#[derive(Serialize, Deserialize)]
enum XgmiCtrl {
    /// Initiator -> target: transfer `id` completed (all data in place).
    Done(u64),
    /// Initiator -> owner: the registered (address, length) of region `id`, the only bounds
    /// an initiator trusts (a descriptor's own `len` could be forged).
    Lookup(MemId),
    /// Initiator -> target: these transfers completed (every completion queued while the
    /// previous notification was on the wire goes in one message).
    DoneMany(Vec<u64>),
}

/// Most transfer ids in one `DoneMany` (keeps the frame far below the control-plane limit).
const MAX_IDS_PER_NOTE: usize = 4096;

#[derive(Clone)]
struct RemoteRegion {
    len: u64,
    base: u64,
    _map: Option<Arc<IpcMapping>>,
}

struct LocalGpu {
    device: Device,
    addr: u64,
    len: u64,
}

/// One in-flight slot of a device: its completion event and the device copy of the
/// scatter/gather descriptor table (grown on demand, reused), both created once and reused
/// by every transfer that takes the slot (a slot is free again only after its event fired).
struct Slot {
    event: Event,
    table: Mutex<Option<mori_gpu::DeviceBuffer>>,
}

struct DevState {
    device: Device,
    streams: Vec<Stream>,
    /// Transfers in flight per stream.
    busy: Vec<AtomicUsize>,
    next: AtomicUsize,
    kernel: Option<Function>,
    /// Multiprocessors (sizes the kernel's grid), read once.
    sms: u32,
    slots: Vec<Slot>,
    /// Indices of the free slots.
    free: Mutex<Vec<usize>>,
}

struct Pending {
    dev: Arc<DevState>,
    slot: usize,
    /// Index of the stream the copies went on (its busy count drops at completion).
    stream: usize,
    status: TransferStatus,
    peer: Arc<EngineDesc>,
    id: u64,
    /// The host descriptor table of a kernel launch, read by its async upload: kept until the
    /// slot's event fired.
    _host_table: Option<Vec<CopyDesc>>,
    /// Queuing failed part-way: the transfer fails with this once the event fired.
    failed: Option<IoError>,
}

struct Inner {
    ctx: BackendContext,
    cfg: XgmiConfig,
    rt: Arc<dyn Runtime>,
    local: Mutex<HashMap<MemId, LocalGpu>>,
    /// Remote regions in use: engine -> region -> (owner-confirmed length, device address as
    /// seen here, the IPC mapping keeping it mapped; none for the same process).
    maps: Mutex<HashMap<String, HashMap<MemId, RemoteRegion>>>,
    devs: Mutex<HashMap<u32, Arc<DevState>>>,
    pending: Mutex<Vec<Pending>>,
    /// The transfers being reaped, owned by whichever thread runs the completion step (the
    /// completion thread, or a waiter through [`mori_io_core::Progress`]).
    reap: Mutex<Vec<Pending>>,
    /// Completed transfers whose target still has to be told: filled by the completion step
    /// (no system call there), handed to the notifier thread by the completion thread, so
    /// neither a control-plane round trip nor a thread wake-up delays a completion.
    outbox: Mutex<Vec<(Arc<EngineDesc>, u64)>>,
    notify_tx: Mutex<std::sync::mpsc::Sender<(Arc<EngineDesc>, u64)>>,
    /// Bumped by every waiter-driven completion step: while it moves, a waiter is doing the
    /// completion work and the completion thread stands back.
    driven: AtomicU64,
    shutdown: AtomicBool,
}

/// The xgmi transport (see the crate docs).
pub struct XgmiBackend {
    inner: Arc<Inner>,
    reaper: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn gpu_err(what: &str, e: mori_gpu::GpuError) -> IoError {
    IoError::new(mori_io_core::ErrorCode::GpuOp, format!("{what}: {e}"))
}

impl XgmiBackend {
    /// Loads the GPU runtime (CUDA or HIP, whichever is present) and starts the completion
    /// thread. Errors: `NotSupported` when no GPU runtime is present (naming the libraries).
    pub fn new(ctx: BackendContext, cfg: XgmiConfig) -> IoResult<Self> {
        if cfg.num_streams == 0 || cfg.num_events == 0 {
            return Err(IoError::invalid("xgmi num_streams and num_events must be at least 1"));
        }
        let rt = mori_gpu::detect().map_err(|e| IoError::not_supported(format!("xgmi backend: {e}")))?;
        let (notify_tx, notify_rx) = std::sync::mpsc::channel::<(Arc<EngineDesc>, u64)>();
        let ctrl = ctx.ctrl.clone();
        std::thread::Builder::new()
            .name("mori-xgmi-notify".into())
            .spawn(move || notify_loop(&*ctrl, &notify_rx))
            .map_err(|e| IoError::transport(format!("spawn xgmi notifier thread: {e}")))?;
        let inner = Arc::new(Inner {
            notify_tx: Mutex::new(notify_tx),
            ctx,
            cfg,
            rt,
            local: Mutex::new(HashMap::new()),
            maps: Mutex::new(HashMap::new()),
            devs: Mutex::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
            reap: Mutex::new(Vec::new()),
            outbox: Mutex::new(Vec::new()),
            driven: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
        });
        let i2 = inner.clone();
        let h = std::thread::Builder::new()
            .name("mori-xgmi-events".into())
            .spawn(move || i2.reap_loop())
            .map_err(|e| IoError::transport(format!("spawn xgmi completion thread: {e}")))?;
        Ok(XgmiBackend { inner, reaper: Mutex::new(Some(h)) })
    }
}

impl Drop for XgmiBackend {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        if let Some(h) = self.reaper.lock().take() {
            let _ = h.join();
        }
    }
}

/// Sends completion notifications until the backend is dropped: waits for one, then takes
/// every other one already queued and sends them per peer in one `DoneMany` (a single `Done`
/// when alone), so the control plane carries one round trip per burst, not per transfer.
fn notify_loop(ctrl: &dyn mori_io_core::ControlClient, rx: &std::sync::mpsc::Receiver<(Arc<EngineDesc>, u64)>) {
    while let Ok(first) = rx.recv() {
        let mut by_peer: Vec<(Arc<EngineDesc>, Vec<u64>)> = Vec::new();
        for (peer, id) in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match by_peer.iter_mut().find(|(p, ids)| p.key == peer.key && ids.len() < MAX_IDS_PER_NOTE) {
                Some((_, ids)) => ids.push(id),
                None => by_peer.push((peer, vec![id])),
            }
        }
        for (peer, ids) in by_peer {
            let note = if ids.len() == 1 { XgmiCtrl::Done(ids[0]) } else { XgmiCtrl::DoneMany(ids) };
            let msg = postcard::to_allocvec(&note).unwrap_or_default();
            if let Err(e) = ctrl.request(&peer, BackendKind::Xgmi, msg) {
                tracing::warn!(peer = %peer.key, error = %e, "xgmi completion notification failed");
            }
        }
    }
}

fn gpu_of(d: &MemoryDesc) -> Option<u32> {
    match d.loc {
        MemLoc::Gpu { device } => Some(device),
        MemLoc::Host { .. } => None,
    }
}

impl DevState {
    /// Index of the stream for a new transfer, counted busy (see [`claim_lane`]).
    fn claim_stream(&self) -> usize {
        claim_lane(&self.busy, &self.next)
    }
}

/// Claims a lane (a stream) for one more transfer and returns its index: the first lane with
/// nothing in flight, else the next in turn (`next` counts the turns); its count is raised by
/// one either way. `busy` must not be empty.
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

impl Inner {
    fn dev_state(&self, dev: Device) -> IoResult<Arc<DevState>> {
        if let Some(s) = self.devs.lock().get(&dev.0) {
            return Ok(s.clone());
        }
        let mut streams = Vec::with_capacity(self.cfg.num_streams);
        for _ in 0..self.cfg.num_streams {
            streams.push(self.rt.stream(dev).map_err(|e| gpu_err("create stream", e))?);
        }
        let mut slots = Vec::with_capacity(self.cfg.num_events);
        for _ in 0..self.cfg.num_events {
            let event = self.rt.event(dev, false).map_err(|e| gpu_err("create event", e))?;
            slots.push(Slot { event, table: Mutex::new(None) });
        }
        let kernel = if self.cfg.kernel_threshold > 0 { self.load_kernel(dev) } else { None };
        let sms = self.rt.device_properties(dev).map_err(|e| gpu_err("device properties", e))?.multiprocessors.max(1);
        let free = Mutex::new((0..slots.len()).rev().collect());
        let busy = streams.iter().map(|_| AtomicUsize::new(0)).collect();
        let s = Arc::new(DevState { device: dev, streams, busy, next: AtomicUsize::new(0), kernel, sms, slots, free });
        Ok(self.devs.lock().entry(dev.0).or_insert(s).clone())
    }

    /// The scatter/gather kernel for `dev` (cubin, then PTX, or the gfx942 object on HIP);
    /// `None` (logged) if none loads, and batches then use one copy per segment.
    fn load_kernel(&self, dev: Device) -> Option<Function> {
        let images: &[ModuleImage<'_>] = match self.rt.kind() {
            mori_gpu::RuntimeKind::Cuda => &[ModuleImage::Cubin(CUBIN), ModuleImage::Ptx(PTX)],
            mori_gpu::RuntimeKind::Hip => &[ModuleImage::HipCodeObject(GFX942)],
        };
        for img in images {
            match self.rt.load_module(dev, *img).and_then(|m| m.function("mori_scatter_gather_copy")) {
                Ok(f) => return Some(f),
                Err(e) => tracing::info!(device = dev.0, error = %e, "scatter/gather kernel image not usable"),
            }
        }
        tracing::warn!(device = dev.0, "no scatter/gather kernel: batches use one copy per descriptor");
        None
    }

    /// The remote region as the owner registered it: its confirmed length and the device
    /// address of its first byte as seen from `dev` (mapped through IPC once, then cached).
    fn remote_region(&self, remote: &MemoryDesc, peer: &EngineDesc, dev: Device) -> IoResult<RemoteRegion> {
        if let Some(r) = self.maps.lock().get(&remote.engine_key).and_then(|m| m.get(&remote.id)) {
            return Ok(r.clone());
        }
        let ask = postcard::to_allocvec(&XgmiCtrl::Lookup(remote.id)).map_err(|e| IoError::invalid(e.to_string()))?;
        let rep = self.ctx.ctrl.request(peer, BackendKind::Xgmi, ask)?;
        let (addr, len): (u64, u64) =
            postcard::from_bytes(&rep).map_err(|e| IoError::transport(format!("xgmi lookup reply from {:?}: {e}", peer.key)))?;
        let r = if peer.pid == self.ctx.local.pid && peer.node_id == self.ctx.local.node_id {
            // Same process: same address space. Another device's memory needs peer access
            // (an IPC mapping enables it lazily; a raw pointer does not).
            if let Some(rdev) = gpu_of(remote).filter(|&r| r != dev.0) {
                self.rt
                    .enable_peer_access(dev, Device(rdev))
                    .map_err(|e| gpu_err(&format!("enable peer access GPU {} -> GPU {rdev}", dev.0), e))?;
            }
            RemoteRegion { len, base: addr, _map: None }
        } else {
            let bytes = remote.handle(BackendKind::Xgmi).ok_or_else(|| {
                IoError::invalid(format!("remote memory {} of engine {:?} carries no IPC handle", remote.id, remote.engine_key))
            })?;
            let h = IpcHandle::from_bytes(bytes).map_err(|e| gpu_err("remote IPC handle", e))?;
            if h.len() < len {
                return Err(IoError::invalid(format!(
                    "remote memory {} of engine {:?}: IPC handle covers {} bytes, the region {len}",
                    remote.id,
                    remote.engine_key,
                    h.len()
                )));
            }
            let m = self
                .rt
                .ipc_import(dev, &h)
                .map_err(|e| gpu_err(&format!("open IPC handle of engine {:?} memory {}", remote.engine_key, remote.id), e))?;
            RemoteRegion { len, base: m.slice().ptr(), _map: Some(Arc::new(m)) }
        };
        self.maps.lock().entry(remote.engine_key.clone()).or_default().insert(remote.id, r.clone());
        Ok(r)
    }

    fn post(&self, req: &TransferRequest, status: &TransferStatus) -> IoResult<()> {
        let (dev, laddr, llen) = {
            let g = self.local.lock();
            let l = g.get(&req.local.id).ok_or_else(|| IoError::not_found(format!("local memory {} is not xgmi-registered", req.local.id)))?;
            (l.device, l.addr, l.len)
        };
        let rr = self.remote_region(&req.remote, &req.peer, dev)?;
        let rbase = rr.base;
        // Bounds, on both sides (remote: the owner-confirmed length), before anything is queued.
        for (i, s) in req.segs.iter().enumerate() {
            mori_io_core::registry::check_range(req.local.id, llen, s.local_off, s.len)
                .map_err(|e| IoError::invalid(format!("segment {i}: local {}", e.msg)))?;
            mori_io_core::registry::check_range(req.remote.id, rr.len, s.remote_off, s.len)
                .map_err(|e| IoError::invalid(format!("segment {i}: remote {}", e.msg)))?;
        }
        let ds = self.dev_state(dev)?;
        let slot = self.take_slot(&ds)?;
        let si = ds.claim_stream();
        let stream = &ds.streams[si];
        let (host_table, failed) = match self.queue(req, &ds, stream, slot, laddr, rbase) {
            Ok(t) => (t, None),
            Err(e) => {
                // Part of the batch may be queued: the slot (and its table) goes back only
                // after the stream ran it, so the event is recorded anyway and the transfer
                // fails when it fires. If even that fails, the slot is retired.
                if let Err(e2) = ds.slots[slot].event.record(stream) {
                    tracing::warn!(device = dev.0, error = %e2, "xgmi: an event slot is retired after a failed record");
                    ds.busy[si].fetch_sub(1, Ordering::AcqRel);
                    return Err(e);
                }
                (None, Some(e))
            }
        };
        self.pending.lock().push(Pending {
            dev: ds.clone(),
            slot,
            stream: si,
            status: status.clone(),
            peer: req.peer.clone(),
            id: req.id,
            _host_table: host_table,
            failed,
        });
        Ok(())
    }

    /// A free slot of `ds`; waits (30 s at most) while all `num_events` are in flight.
    fn take_slot(&self, ds: &DevState) -> IoResult<usize> {
        if let Some(i) = ds.free.lock().pop() {
            return Ok(i);
        }
        let t0 = std::time::Instant::now();
        loop {
            std::thread::yield_now();
            if let Some(i) = ds.free.lock().pop() {
                return Ok(i);
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(IoError::timeout(format!(
                    "{} xgmi transfers in flight on device {} for 30 s",
                    self.cfg.num_events, ds.device.0
                )));
            }
        }
    }

    /// Queues the copies of `req` on the next stream and records slot `slot`'s event after
    /// them. Returns the host descriptor table to keep until the event fired (kernel path).
    fn queue(&self, req: &TransferRequest, ds: &DevState, stream: &Stream, slot: usize, laddr: u64, rbase: u64) -> IoResult<Option<Vec<CopyDesc>>> {
        let dev = ds.device;
        let total: u64 = req.segs.iter().map(|s| s.len).sum();
        let n = req.segs.len();
        let mut host_table = None;
        match &ds.kernel {
            Some(f) if n >= self.cfg.kernel_threshold && total / (n as u64).max(1) < self.cfg.kernel_max_mean_bytes => {
                let descs: Vec<CopyDesc> = req
                    .segs
                    .iter()
                    .map(|s| {
                        let (src, dst) = endpoints(req.op, laddr, rbase, s);
                        CopyDesc { src, dst, len: s.len }
                    })
                    .collect();
                let n32 = u32::try_from(n).map_err(|_| IoError::invalid(format!("{n} segments in one xgmi batch: at most {}", u32::MAX)))?;
                let mut tg = ds.slots[slot].table.lock();
                let need = n * std::mem::size_of::<CopyDesc>();
                if tg.as_ref().is_none_or(|t| t.len() < need) {
                    // Grown by powers of two, so a slot reallocates O(log n) times in its life.
                    *tg = None;
                    let cap = need.next_power_of_two().max(4096);
                    *tg = Some(self.rt.alloc(dev, cap).map_err(|e| gpu_err("allocate descriptor table", e))?);
                }
                let table = tg.as_ref().ok_or_else(|| IoError::invalid("descriptor table missing"))?;
                let dst = table.sub(0, need).map_err(|e| gpu_err("descriptor table", e))?;
                // SAFETY: CopyDesc is plain old data (three u64, repr(C)); the byte view covers
                // exactly the vector's initialized elements.
                let bytes = unsafe { std::slice::from_raw_parts(descs.as_ptr() as *const u8, need) };
                // SAFETY: `descs` is moved into the pending entry below, unmodified, and dropped
                // only after the slot's event (recorded after this upload) fired; the table
                // buffer belongs to this slot, which no other transfer takes until then.
                unsafe { self.rt.copy_htod_async(&dst, bytes, stream) }.map_err(|e| gpu_err("upload descriptor table", e))?;
                let grid = (128 * ds.sms).min((n as u64).max(total.div_ceil(16 << 10)).min(u32::MAX as u64) as u32).max(1);
                let mut args = KernelArgs::new();
                args.push_ptr(&dst).push(n32);
                let cfg = LaunchConfig { grid: (grid, 1, 1), block: (64, 1, 1), shared_mem_bytes: 0 };
                // SAFETY: the kernel's ABI is (const CopyDesc*, uint32_t) (kernels/README.md);
                // every descriptor was bounds-checked against both registrations, and the
                // table stays allocated (owned by the slot) until the event fires.
                unsafe { self.rt.launch(f, stream, &cfg, &args.params()) }.map_err(|e| gpu_err("launch scatter/gather kernel", e))?;
                host_table = Some(descs);
            }
            _ => {
                for s in &req.segs {
                    let (src, dst) = endpoints(req.op, laddr, rbase, s);
                    // SAFETY: both ranges were bounds-checked against their registrations (and
                    // the remote one is mapped for as long as the mapping is cached).
                    let (d, sr) = unsafe { (DeviceSlice::from_raw(dst, s.len as usize, dev), DeviceSlice::from_raw(src, s.len as usize, dev)) };
                    self.rt.copy_dtod_async(&d, &sr, stream).map_err(|e| gpu_err("queue device copy", e))?;
                }
            }
        }
        ds.slots[slot].event.record(stream).map_err(|e| gpu_err("record event", e))?;
        Ok(host_table)
    }

    /// One completion step: completes every transfer whose event fired (slot freed, status
    /// set, target notification queued in the outbox). `mine` is the step's own list (the
    /// `reap` lock); the posting threads' list is taken over first, so posting never waits
    /// for a driver call made here. Returns (completed, still in flight).
    fn reap_once(&self, mine: &mut Vec<Pending>) -> (usize, usize) {
        mine.append(&mut self.pending.lock());
        let mut done = 0;
        let mut i = 0;
        while i < mine.len() {
            let r = match mine[i].dev.slots[mine[i].slot].event.query() {
                Ok(false) => {
                    i += 1;
                    continue;
                }
                Ok(true) => mine[i].failed.take().map_or(Ok(()), Err),
                Err(e) => Err(gpu_err("xgmi copy", e)),
            };
            let p = mine.swap_remove(i);
            p.dev.busy[p.stream].fetch_sub(1, Ordering::AcqRel);
            p.dev.free.lock().push(p.slot);
            let ok = r.is_ok();
            p.status.complete_piece(r);
            if ok {
                self.outbox.lock().push((p.peer.clone(), p.id));
            }
            done += 1;
        }
        (done, mine.len())
    }

    /// Hands queued completion notifications to the notifier thread.
    fn flush_outbox(&self) {
        let notes = std::mem::take(&mut *self.outbox.lock());
        if !notes.is_empty() {
            let tx = self.notify_tx.lock();
            for n in notes {
                let _ = tx.send(n);
            }
        }
    }

    /// The completion thread. While waiters drive completions themselves (`driven` moves) it
    /// only forwards their notifications, every 50 µs. Otherwise it runs the completion step:
    /// spinning while copies are in flight (a short pause between rounds leaves the driver
    /// to the posting threads), backing off to sleeps when idle.
    fn reap_loop(&self) {
        let mut idle = 0u32;
        let mut seen = self.driven.load(Ordering::Acquire);
        while !self.shutdown.load(Ordering::Acquire) {
            let d = self.driven.load(Ordering::Acquire);
            if d != seen {
                seen = d;
                self.flush_outbox();
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            let (done, in_flight) = self.reap_once(&mut self.reap.lock());
            self.flush_outbox();
            if done > 0 {
                idle = 0;
            } else if in_flight > 0 {
                for _ in 0..8 {
                    std::hint::spin_loop();
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
        self.flush_outbox();
    }
}

impl mori_io_core::Progress for Inner {
    /// A waiter's completion step (skipped while another thread runs one).
    fn progress(&self) -> bool {
        self.driven.fetch_add(1, Ordering::AcqRel);
        self.reap.try_lock().is_some_and(|mut mine| self.reap_once(&mut mine).0 > 0)
    }
}

/// (source, destination) device addresses of a segment.
fn endpoints(op: Op, laddr: u64, rbase: u64, s: &mori_io_core::Seg) -> (u64, u64) {
    match op {
        Op::Write => (laddr + s.local_off, rbase + s.remote_off),
        Op::Read => (rbase + s.remote_off, laddr + s.local_off),
    }
}

impl Backend for XgmiBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Xgmi
    }

    fn handles_gpu_memory(&self) -> bool {
        true
    }

    fn on_register(&self, desc: &mut MemoryDesc) -> IoResult<()> {
        let Some(d) = gpu_of(desc) else { return Ok(()) };
        let dev = Device(d);
        let rt = &self.inner.rt;
        // SAFETY: the engine's caller promised the range is valid device memory of `dev`
        // until deregistration.
        let slice = unsafe { DeviceSlice::from_raw(desc.addr, desc.len as usize, dev) };
        let h = rt.ipc_export(&slice).map_err(|e| gpu_err(&format!("export IPC handle of memory {}", desc.id), e))?;
        if desc.bus_id.is_none() {
            desc.bus_id = rt.device_properties(dev).ok().map(|p| p.pci_bus_id.to_string());
        }
        desc.handles.retain(|x| x.backend != BackendKind::Xgmi);
        desc.handles.push(BackendHandle { backend: BackendKind::Xgmi, bytes: h.to_bytes().to_vec() });
        self.inner.local.lock().insert(desc.id, LocalGpu { device: dev, addr: desc.addr, len: desc.len });
        Ok(())
    }

    fn on_deregister(&self, desc: &MemoryDesc) -> IoResult<()> {
        self.inner.local.lock().remove(&desc.id);
        Ok(())
    }

    fn can_serve(&self, local: &MemoryDesc, remote: &MemoryDesc, peer: &EngineDesc) -> Result<(), Refusal> {
        let refuse = |reason: String| Err(Refusal { backend: BackendKind::Xgmi, reason });
        let (Some(ld), Some(rd)) = (gpu_of(local), gpu_of(remote)) else {
            return refuse("xgmi moves GPU memory to GPU memory; one side is host memory".into());
        };
        if peer.node_id != self.inner.ctx.local.node_id {
            return refuse(format!("engine {:?} is on another node ({}); xgmi is intra-node", peer.key, peer.hostname));
        }
        if remote.handle(BackendKind::Xgmi).is_none() && peer.pid != self.inner.ctx.local.pid {
            return refuse(format!("remote memory {} carries no IPC handle (its engine has no xgmi backend)", remote.id));
        }
        // The peer's device ordinal may differ from ours: match by PCI bus id when known.
        let rdev = match &remote.bus_id {
            Some(bus) => (0..self.inner.rt.device_count().unwrap_or(0))
                .find(|&i| self.inner.rt.device_properties(Device(i)).map(|p| p.pci_bus_id.to_string() == *bus).unwrap_or(false))
                .unwrap_or(rd),
            None => rd,
        };
        match self.inner.rt.can_access_peer(Device(ld), Device(rdev)) {
            Ok(true) => Ok(()),
            Ok(false) => refuse(format!("GPU {ld} cannot reach GPU {rdev} by peer-to-peer")),
            Err(e) => refuse(format!("peer-access query GPU {ld} -> GPU {rdev} failed: {e}")),
        }
    }

    fn post(&self, req: TransferRequest, status: TransferStatus) {
        let me: std::sync::Weak<dyn mori_io_core::Progress> = Arc::downgrade(&self.inner) as _;
        status.set_progress(me);
        if let Err(e) = self.inner.post(&req, &status) {
            status.complete_piece(Err(e));
        }
    }

    fn disconnect(&self, peer_key: &str) {
        self.inner.maps.lock().remove(peer_key);
    }

    fn control(&self, from: &EngineDesc, payload: &[u8]) -> IoResult<Vec<u8>> {
        match postcard::from_bytes::<XgmiCtrl>(payload) {
            Ok(XgmiCtrl::Done(id)) => {
                self.inner.ctx.inbound.piece_done(&from.key, id, 1, Ok(()));
                Ok(Vec::new())
            }
            Ok(XgmiCtrl::DoneMany(ids)) => {
                for id in ids {
                    self.inner.ctx.inbound.piece_done(&from.key, id, 1, Ok(()));
                }
                Ok(Vec::new())
            }
            Ok(XgmiCtrl::Lookup(id)) => {
                let g = self.inner.local.lock();
                let l = g.get(&id).ok_or_else(|| {
                    IoError::not_found(format!("memory {id} is not a GPU region registered at engine {:?}", self.inner.ctx.local.key))
                })?;
                postcard::to_allocvec(&(l.addr, l.len)).map_err(|e| IoError::invalid(e.to_string()))
            }
            Err(e) => Err(IoError::invalid(format!("malformed xgmi control message from {:?}: {e}", from.key))),
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
        // Concurrent transfers spread over the idle lanes first.
        assert_eq!([claim_lane(&busy, &next), claim_lane(&busy, &next), claim_lane(&busy, &next)], [0, 1, 2]);
        // All busy: shared in turn.
        assert_eq!([claim_lane(&busy, &next), claim_lane(&busy, &next), claim_lane(&busy, &next), claim_lane(&busy, &next)], [0, 1, 2, 0]);
        assert_eq!(busy.iter().map(|b| b.load(Ordering::Relaxed)).collect::<Vec<_>>(), vec![3, 2, 2]);
        // Lane 1 drains: it is the first idle one again.
        busy[1].store(0, Ordering::Relaxed);
        assert_eq!(claim_lane(&busy, &next), 1);
    }
}
