//! The xgmi backend proper.

use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg, Device, DeviceSlice, IpcHandle, IpcMapping, Runtime};
use mori_io_core::paged_gpu::paged_job;
use mori_io_core::plan::{check_segs, check_segs_mapped};
use mori_io_core::registry::Region;
use mori_io_core::status::Completion;
use mori_io_core::{
    Backend, BackendContext, BackendHandle, BackendKind, EngineDesc, EntryMap, IoError, IoResult, MemId, MemoryDesc, Notifier, Op,
    PagedPlan, PeerMap, Refusal, RoutedBatch, Seg, TransferRequest, TransferStatus,
};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

#[path = "many.rs"]
mod many;

/// Settings of the xgmi backend.
#[derive(Debug, Clone)]
pub struct XgmiConfig {
    /// Streams per device (bench `--num-streams`, default 64). A transfer takes the first
    /// stream with no transfer in flight (`mori_gpu::CopyPool`), so stop-and-wait traffic
    /// stays on one stream (rotating over all 64 cost about 1–1.5 µs per batch-1 transfer on
    /// the H200: docs/PERFORMANCE.md), and concurrent transfers spread out.
    pub num_streams: usize,
    /// Most transfers in flight per device, each with its event (bench `--num-events`, 64).
    pub num_events: usize,
    /// Batches with at least this many segments use the scatter/gather kernel (default 32;
    /// 0 disables the kernel): `mori_gpu::CopyPoolConfig::kernel_threshold`.
    pub kernel_threshold: usize,
    /// ... unless their segments average at least this many bytes (default 48 MiB):
    /// `mori_gpu::CopyPoolConfig::kernel_max_mean_bytes`, which gives the measurements.
    pub kernel_max_mean_bytes: u64,
    /// Ordered-copy launches armed ahead per device (default 0: none), so that posting an
    /// ordered batch (`IoEngine::post_ordered`, `post_ordered_multi`) makes no driver call:
    /// `mori_gpu::CopyPoolConfig::armed_depth`, which says when it is safe
    /// (`MORI_GPU_POOL_ARMED` overrides it).
    pub armed_depth: usize,
}

impl Default for XgmiConfig {
    fn default() -> Self {
        XgmiConfig { num_streams: 64, num_events: 64, kernel_threshold: 32, kernel_max_mean_bytes: 48 << 20, armed_depth: 0 }
    }
}

#[derive(Serialize, Deserialize)]
enum XgmiCtrl {
    /// Initiator -> target: transfer `id` completed (all data in place). Sent by earlier
    /// builds; still accepted.
    Done(u64),
    /// Initiator -> owner: the registered (address, length) of region `id`, the only bounds
    /// an initiator trusts (a descriptor's own `len` could be forged).
    Lookup(MemId),
    /// Initiator -> target: these transfers completed (every completion queued while the
    /// previous notification was on the wire goes in one message).
    DoneMany(Vec<u64>),
    /// Owner -> every engine that looked region `id` up: it was deregistered; drop the
    /// mapping (sessions using it then fail with `NotFound`). Delivered asynchronously: the
    /// owner must still not free memory a transfer may be writing (as with NIXL).
    Forget(MemId),
}

#[derive(Clone)]
struct RemoteRegion {
    len: u64,
    base: u64,
    /// The IPC mapping (none in the same process). The cache holds it; transfers in flight
    /// hold it; sessions' routes only refer to it, so it closes once the cache entry is gone
    /// (Forget, disconnect) and the last transfer using it completed.
    map: Option<Arc<IpcMapping>>,
    /// Cleared when the cache entry is dropped (Forget from the owner, or the peer
    /// deregistered here): routes referring to it then fail with `NotFound`.
    live: Arc<AtomicBool>,
}

struct LocalGpu {
    device: Device,
    addr: u64,
    len: u64,
    /// Engines that looked this region up (told `Forget` when it is deregistered).
    lookers: Vec<Arc<EngineDesc>>,
}

/// Where a transfer's bytes are: the local registration and the remote region as mapped here.
#[derive(Clone, Copy)]
struct Place {
    dev: Device,
    laddr: u64,
    llen: u64,
    rbase: u64,
    rlen: u64,
}

/// What a transfer keeps alive until its copies completed: the engine registry's handle on the
/// local region (deregistration waits for it) and the remote IPC mapping (none in-process).
type Keep = (Arc<Region>, Option<Arc<IpcMapping>>);

struct Inner {
    /// Streams, in-flight slots (event + descriptor table each) and completion; first, so
    /// it is dropped (its thread joined) before the mappings and the kernel below.
    pool: CopyPool,
    ctx: BackendContext,
    rt: Arc<dyn Runtime>,
    local: Mutex<FxHashMap<MemId, LocalGpu>>,
    /// Remote regions in use: engine -> region -> (owner-confirmed length, device address as
    /// seen here, the IPC mapping keeping it mapped; none for the same process). An entry goes
    /// on Forget from the owner or when the peer is deregistered here.
    maps: PeerMap<RemoteRegion>,
    /// Tells targets of completed transfers: queued on the completion path, flushed by the
    /// pool's completion thread (its idle hook), packed per burst (`DoneMany`).
    notifier: Arc<Notifier<XgmiCtrl>>,
}

/// The xgmi transport (see the crate docs).
pub struct XgmiBackend {
    inner: Arc<Inner>,
}

impl XgmiBackend {
    /// Loads the GPU runtime (CUDA or HIP, whichever is present) and starts the completion
    /// and notifier threads. Errors: `NotSupported` when no GPU runtime is present (naming
    /// the libraries); `InvalidArgs` for zero streams or events.
    pub fn new(ctx: BackendContext, cfg: XgmiConfig) -> IoResult<Self> {
        if cfg.num_streams == 0 || cfg.num_events == 0 {
            return Err(IoError::invalid("xgmi num_streams and num_events must be at least 1"));
        }
        let rt = mori_gpu::detect().map_err(|e| IoError::not_supported(format!("xgmi backend: {e}")))?;
        let notifier = Arc::new(Notifier::spawn("mori-xgmi-notify", ctx.ctrl.clone(), BackendKind::Xgmi, XgmiCtrl::DoneMany)?);
        let pool_cfg = CopyPoolConfig {
            num_streams: cfg.num_streams,
            num_events: cfg.num_events,
            kernel_threshold: cfg.kernel_threshold,
            kernel_max_mean_bytes: cfg.kernel_max_mean_bytes,
            armed_depth: cfg.armed_depth,
            ..CopyPoolConfig::default()
        };
        let pool = CopyPool::new(rt.clone(), pool_cfg, "mori-xgmi-events").map_err(|e| IoError::gpu("xgmi copy pool", e))?;
        let n2 = notifier.clone();
        pool.set_idle_hook(Box::new(move || n2.flush()));
        let inner = Arc::new(Inner { ctx, rt, local: Mutex::new(FxHashMap::default()), maps: PeerMap::new(), pool, notifier });
        Ok(XgmiBackend { inner })
    }
}

impl Inner {
    /// The remote region as the owner registered it: its confirmed length and the device
    /// address of its first byte as seen from `dev` (mapped through IPC once, then cached).
    fn remote_region(&self, remote: &MemoryDesc, peer: &EngineDesc, dev: Device) -> IoResult<RemoteRegion> {
        if let Some(r) = self.maps.get(&remote.engine_key, remote.id) {
            return Ok(r);
        }
        let ask = postcard::to_allocvec(&XgmiCtrl::Lookup(remote.id)).map_err(|e| IoError::invalid(e.to_string()))?;
        let rep = self.ctx.ctrl.request(peer, BackendKind::Xgmi, ask)?;
        let (addr, len): (u64, u64) =
            postcard::from_bytes(&rep).map_err(|e| IoError::transport(format!("xgmi lookup reply from {:?}: {e}", peer.key)))?;
        let r = if peer.pid == self.ctx.local.pid && peer.node_id == self.ctx.local.node_id {
            // Same process: same address space. Another device's memory needs peer access
            // (an IPC mapping enables it lazily; a raw pointer does not).
            if let Some(rdev) = remote.loc.gpu().filter(|&r| r != dev.0) {
                self.rt
                    .enable_peer_access(dev, Device(rdev))
                    .map_err(|e| IoError::gpu(&format!("enable peer access GPU {} -> GPU {rdev}", dev.0), e))?;
            }
            RemoteRegion { len, base: addr, map: None, live: Arc::new(AtomicBool::new(true)) }
        } else {
            let bytes = remote.handle(BackendKind::Xgmi).ok_or_else(|| {
                IoError::invalid(format!("remote memory {} of engine {:?} carries no IPC handle", remote.id, remote.engine_key))
            })?;
            let h = IpcHandle::from_bytes(bytes).map_err(|e| IoError::gpu("remote IPC handle", e))?;
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
                .map_err(|e| IoError::gpu(&format!("open IPC handle of engine {:?} memory {}", remote.engine_key, remote.id), e))?;
            RemoteRegion { len, base: m.slice().ptr(), map: Some(Arc::new(m)), live: Arc::new(AtomicBool::new(true)) }
        };
        // Two threads may have mapped it at once: both use the first entry (CUDA counts the
        // second open of the handle; dropping it closes one reference).
        Ok(self.maps.get_or_insert(&remote.engine_key, remote.id, r))
    }

    /// The local registration and the remote region (mapped once, then cached) of a request.
    /// `hold`: the local registration when the caller already holds it (a one-shot post).
    fn resolve(
        &self,
        local: &MemoryDesc,
        remote: &MemoryDesc,
        peer: &EngineDesc,
        hold: Option<Arc<Region>>,
    ) -> IoResult<(Place, Keep, RemoteRegion)> {
        let (dev, laddr, llen) = {
            let g = self.local.lock();
            let l = g.get(&local.id).ok_or_else(|| IoError::not_found(format!("local memory {} is not xgmi-registered", local.id)))?;
            (l.device, l.addr, l.len)
        };
        let hold = match hold {
            Some(h) => h,
            None => self.ctx.registry.get(local.id)?,
        };
        let region = self.remote_region(remote, peer, dev)?;
        let place = Place { dev, laddr, llen, rbase: region.base, rlen: region.len };
        Ok((place, (hold, region.map.clone()), region))
    }

    fn post(&self, req: &TransferRequest, status: &TransferStatus) -> IoResult<()> {
        let (at, keep, _) = self.resolve(&req.local, &req.remote, &req.peer, Some(req.local_region.clone()))?;
        let ids = (req.local.id, req.remote.id);
        let work = match &req.paged {
            Some(p) => Work::Paged(p),
            None => Work::Segs(&req.segs, Some(&req.entries)),
        };
        self.submit(at, keep, req.op, req.id, &req.peer, ids, work, req.ordered, &mut Some(status.clone()))
    }

    /// Queues `segs` between the regions at `at` (ids `ids`, for messages) as transfer `id` of
    /// `peer`, completing `status`; when `status` is `None`, a status is created once the
    /// copies are queued and left there. The completion owns `keep` (so deregistering the
    /// local region waits for the copies, and the remote mapping stays open for them).
    /// `ordered`: the segments are copied one after the other on one stream (never by the
    /// scatter/gather kernel), so each lands before the next is written.
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        at: Place,
        keep: Keep,
        op: Op,
        id: u64,
        peer: &Arc<EngineDesc>,
        ids: (MemId, MemId),
        work: Work<'_>,
        ordered: bool,
        status: &mut Option<TransferStatus>,
    ) -> IoResult<()> {
        // Bounds, on both sides (remote: the owner-confirmed length), before anything is queued;
        // errors name the caller's batch entries when the map is known (one-shot posts).
        let (l, r) = ((ids.0, at.llen), (ids.1, at.rlen));
        match work {
            Work::Segs(segs, Some(m)) => check_segs_mapped(l, r, segs, m)?,
            Work::Segs(segs, None) => check_segs(l, r, segs)?,
            Work::Paged(p) => p.check_regions(l, r)?,
        }
        // The completion, made once the copies are queued: sets the status, queues the
        // target's notification, and drops the remote mapping's reference only then.
        let make_done = || {
            let status = status.get_or_insert_with(|| TransferStatus::new(1)).clone();
            let (done, notifier) = (Done { status, peer: peer.clone(), id, keep }, self.notifier.clone());
            move |r: mori_gpu::Result<()>| done.finish(&r, &notifier)
        };
        // SAFETY: every segment (every block of a paged plan) lies inside the local
        // registration and the remote region (owner-confirmed length), both mapped for as long
        // as the completion lives (it holds the remote mapping, and the registry handle that
        // deregistration waits for).
        match work {
            Work::Segs(segs, _) => {
                let seg = |s: &Seg| copy_seg(op, &at, s);
                // Mapped as the pool walks them: nothing is allocated before the copies are queued.
                if ordered {
                    unsafe { self.pool.copy_in_order_with(at.dev, segs.iter().map(seg), make_done) }
                } else {
                    unsafe { self.pool.copy_with(at.dev, segs.iter().map(seg), make_done) }
                }
            }
            Work::Paged(p) => {
                let (job, runs) = paged_job(p, op, at.laddr, at.rbase);
                unsafe { self.pool.copy_paged(at.dev, &job, runs, make_done) }
            }
        }
        .map_err(|e| IoError::gpu("queue xgmi transfer", e))
    }
}

/// What completes one request once its copies landed.
struct Done {
    status: TransferStatus,
    peer: Arc<EngineDesc>,
    id: u64,
    keep: Keep,
}

impl Done {
    /// Sets the status, queues the target's notification (on success) and only then drops
    /// the request's holds (the remote mapping's reference among them).
    fn finish(self, r: &mori_gpu::Result<()>, notifier: &Notifier<XgmiCtrl>) {
        let ok = r.is_ok();
        self.status.complete_piece(r.as_ref().map(|_| ()).map_err(|e| IoError::gpu("xgmi copy", e)));
        if ok {
            notifier.push_done(self.peer, self.id);
        }
        drop(self.keep);
    }
}

/// The copy of segment `s` of a transfer at `at`.
fn copy_seg(op: Op, at: &Place, s: &Seg) -> CopySeg {
    let (src, dst) = op.endpoints(at.laddr + s.local_off, at.rbase + s.remote_off);
    CopySeg { src, dst, len: s.len }
}

/// What one transfer moves: segments (with the caller's entry map when known), or a paged plan.
#[derive(Clone, Copy)]
enum Work<'a> {
    Segs(&'a [Seg], Option<&'a EntryMap>),
    Paged(&'a PagedPlan),
}

/// A session's prepared path (see [`mori_io_core::Route`]): the regions resolved once. It only
/// refers to the local registration and the remote mapping (weakly), so neither outlives its
/// deregistration because a session is open.
struct XgmiRoute {
    inner: Arc<Inner>,
    ids: (MemId, MemId),
    /// The remote region's engine.
    peer: Arc<EngineDesc>,
    at: Place,
    hold: Weak<Region>,
    map: Option<Weak<IpcMapping>>,
    live: Arc<AtomicBool>,
}

impl XgmiRoute {
    /// What a transfer keeps alive, if both regions are still there (one reference count
    /// taken on each before anything is queued: that is what makes deregistration wait).
    fn keep(&self) -> IoResult<Keep> {
        let hold = self.hold.upgrade().ok_or_else(|| {
            IoError::not_found(format!(
                "local memory {} is not xgmi-registered any more (deregistered since the session was opened)",
                self.ids.0
            ))
        })?;
        let gone = || {
            IoError::not_found(format!(
                "memory {} of engine {:?} is gone from this engine (its owner deregistered it, or the engine was deregistered here) since the session was opened",
                self.ids.1, self.peer.key
            ))
        };
        if !self.live.load(Ordering::Acquire) {
            return Err(gone());
        }
        let map = match &self.map {
            Some(w) => Some(w.upgrade().ok_or_else(gone)?),
            None => None,
        };
        Ok((hold, map))
    }
}

impl mori_io_core::Route for XgmiRoute {
    fn post(&self, op: Op, id: u64, segs: &[Seg]) -> TransferStatus {
        self.post_work(op, id, Work::Segs(segs, None))
    }

    fn post_paged(&self, op: Op, id: u64, plan: &Arc<PagedPlan>) -> TransferStatus {
        self.post_work(op, id, Work::Paged(plan))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl XgmiRoute {
    fn post_work(&self, op: Op, id: u64, work: Work<'_>) -> TransferStatus {
        let mut status = None;
        let r = self.keep().and_then(|keep| self.inner.submit(self.at, keep, op, id, &self.peer, self.ids, work, false, &mut status));
        // No status yet: the submission failed before anything was queued.
        let status = status.unwrap_or_else(|| TransferStatus::new(1));
        if let Err(e) = r {
            status.complete_piece(Err(e));
        }
        let me: std::sync::Weak<dyn mori_io_core::Progress> = Arc::downgrade(&self.inner) as _;
        status.set_progress(me);
        status
    }
}

impl mori_io_core::Progress for Inner {
    /// A waiter's completion step (skipped while another thread runs one).
    fn progress(&self) -> bool {
        self.pool.progress()
    }
}

impl XgmiBackend {
    /// Lets a thread waiting on `status` drive the pool's completions (`Progress`).
    fn drive(&self, status: &TransferStatus) {
        let me: std::sync::Weak<dyn mori_io_core::Progress> = Arc::downgrade(&self.inner) as _;
        status.set_progress(me);
    }
}

impl Backend for XgmiBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Xgmi
    }

    /// One stream per request, copies in order (a paged plan is never ordered: the engine
    /// only orders range batches).
    fn orders_segments(&self) -> bool {
        true
    }

    fn handles_gpu_memory(&self) -> bool {
        true
    }

    fn on_register(&self, desc: &mut MemoryDesc) -> IoResult<()> {
        let Some(d) = desc.loc.gpu() else { return Ok(()) };
        let dev = Device(d);
        let rt = &self.inner.rt;
        // SAFETY: the engine's caller promised the range is valid device memory of `dev`
        // until deregistration.
        let slice = unsafe { DeviceSlice::from_raw(desc.addr, desc.len as usize, dev) };
        let h = rt.ipc_export(&slice).map_err(|e| IoError::gpu(&format!("export IPC handle of memory {}", desc.id), e))?;
        if desc.bus_id.is_none() {
            desc.bus_id = rt.device_properties(dev).ok().map(|p| p.pci_bus_id.to_string());
        }
        desc.handles.retain(|x| x.backend != BackendKind::Xgmi);
        desc.handles.push(BackendHandle { backend: BackendKind::Xgmi, bytes: h.to_bytes().to_vec() });
        self.inner.local.lock().insert(desc.id, LocalGpu { device: dev, addr: desc.addr, len: desc.len, lookers: Vec::new() });
        Ok(())
    }

    fn on_deregister(&self, desc: &MemoryDesc) -> IoResult<()> {
        let gone = self.inner.local.lock().remove(&desc.id);
        for peer in gone.map(|l| l.lookers).unwrap_or_default() {
            // An engine that has gone holds no mapping any more: nothing to warn about.
            self.inner.notifier.send_if_alive(peer, XgmiCtrl::Forget(desc.id));
        }
        Ok(())
    }

    fn can_serve(&self, local: &MemoryDesc, remote: &MemoryDesc, peer: &EngineDesc) -> Result<(), Refusal> {
        let refuse = |reason: String| Err(Refusal { backend: BackendKind::Xgmi, reason });
        let (Some(ld), Some(rd)) = (local.loc.gpu(), remote.loc.gpu()) else {
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

    /// Ready once the remote region was looked up and mapped (the first post asks its owner).
    fn ready(&self, _peer: &EngineDesc, remote: &MemoryDesc) -> bool {
        self.inner.maps.get(&remote.engine_key, remote.id).is_some()
    }

    /// Paged batches go to the GPU whole: one kernel reads the block runs (see `paged_job`).
    fn takes_paged(&self) -> bool {
        true
    }

    fn post(&self, req: TransferRequest, status: TransferStatus) {
        if let Err(e) = self.inner.post(&req, &status) {
            status.complete_piece(Err(e));
        }
        // After the copy is queued (nobody waits on the status before this returns).
        self.drive(&status);
    }

    /// Ordered requests of plain segments share ordered-copy kernel launches (up to 8
    /// segments of several requests in one); the others are posted one by one, ahead of them
    /// (the engine hands over only ordered ones) (`many.rs`).
    fn post_many(&self, jobs: Vec<(TransferRequest, TransferStatus)>) {
        let statuses: Vec<TransferStatus> = jobs.iter().map(|(_, s)| s.clone()).collect();
        self.inner.post_many(jobs);
        for s in &statuses {
            self.drive(s);
        }
    }

    fn posts_ordered_routes(&self) -> bool {
        true
    }

    /// Tail words follow the copies in one stream memory-operation batch (`many.rs`), on
    /// CUDA, whose stream writes fence the work before them; not on HIP, where
    /// `hipStreamWriteValue*` documents no such fence (and which never ran here).
    fn posts_tail_words(&self) -> bool {
        self.inner.rt.kind() != mori_gpu::RuntimeKind::Hip
    }

    /// Ordered batches over this backend's routes share ordered-copy kernel launches, as
    /// [`Backend::post_many`]'s ordered requests do, without the one-shot lookups (`many.rs`).
    fn post_ordered_routes(&self, op: Op, batches: Vec<RoutedBatch>) {
        let statuses: Vec<TransferStatus> = batches.iter().map(|b| b.status.clone()).collect();
        self.inner.post_routed(op, batches);
        for s in &statuses {
            self.drive(s);
        }
    }

    fn route(
        &self,
        local: &Arc<MemoryDesc>,
        remote: &Arc<MemoryDesc>,
        peer: &Arc<EngineDesc>,
    ) -> IoResult<Option<Arc<dyn mori_io_core::Route>>> {
        let (at, (hold, _), region) = self.inner.resolve(local, remote, peer, None)?;
        Ok(Some(Arc::new(XgmiRoute {
            inner: self.inner.clone(),
            ids: (local.id, remote.id),
            peer: peer.clone(),
            at,
            hold: Arc::downgrade(&hold),
            map: region.map.as_ref().map(Arc::downgrade),
            live: region.live,
        })))
    }

    /// The copy pool's armed launches let go (`mori_gpu::CopyPool::disarm`).
    fn quiesce(&self) -> IoResult<()> {
        self.inner.pool.disarm().map_err(|e| IoError::gpu("xgmi copy pool: disarm", e))
    }

    fn disconnect(&self, peer_key: &str) {
        for r in self.inner.maps.remove_engine(peer_key) {
            r.live.store(false, Ordering::Release);
        }
    }

    fn control(&self, from: &EngineDesc, payload: &[u8]) -> IoResult<Vec<u8>> {
        match postcard::from_bytes::<XgmiCtrl>(payload) {
            Ok(XgmiCtrl::Done(id)) => {
                self.inner.ctx.inbound.transfers_done(&from.key, [id]);
                Ok(Vec::new())
            }
            Ok(XgmiCtrl::DoneMany(ids)) => {
                self.inner.ctx.inbound.transfers_done(&from.key, ids);
                Ok(Vec::new())
            }
            Ok(XgmiCtrl::Lookup(id)) => {
                let mut g = self.inner.local.lock();
                let l = g.get_mut(&id).ok_or_else(|| {
                    IoError::not_found(format!("memory {id} is not a GPU region registered at engine {:?}", self.inner.ctx.local.key))
                })?;
                if !l.lookers.iter().any(|p| p.key == from.key) {
                    l.lookers.push(Arc::new(from.clone()));
                }
                postcard::to_allocvec(&(l.addr, l.len)).map_err(|e| IoError::invalid(e.to_string()))
            }
            Ok(XgmiCtrl::Forget(id)) => {
                if let Some(r) = self.inner.maps.remove(&from.key, id) {
                    r.live.store(false, Ordering::Release);
                }
                Ok(Vec::new())
            }
            Err(e) => Err(IoError::invalid(format!("malformed xgmi control message from {:?}: {e}", from.key))),
        }
    }
}
