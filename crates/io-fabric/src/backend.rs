//! The fabric backend proper.

use crate::domain::{self, FabricDomain, HandleType, DOMAIN_ENV};
use crate::handle::{FabricHandle, Grant};
use crate::memory::{Exported, FabricMemory};
use crate::uds::{self, FdServer};
use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg, Device, Runtime, ShareableHandle, VmmAllocation};
use mori_io_core::paged_gpu::paged_job;
use mori_io_core::plan::check_segs_mapped;
use mori_io_core::status::Completion;
use mori_io_core::{
    Backend, BackendContext, BackendHandle, BackendKind, EngineDesc, IoError, IoResult, MemId, MemoryDesc, Notifier, PeerMap, Refusal,
    TransferRequest, TransferStatus,
};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Environment variable choosing the handle type: `posix-fd` (default) or `fabric`.
pub const HANDLE_ENV: &str = "MORI_IO_FABRIC_HANDLE";
/// Environment variable: deadline of a handle exchange on the Unix socket, milliseconds.
pub const TIMEOUT_ENV: &str = "MORI_IO_FABRIC_TIMEOUT_MS";

/// Settings of the fabric backend.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    /// Handle type exported and accepted (no fallback to the other one).
    pub handle: HandleType,
    /// Streams per device (bench `--num-streams`, default 64); a transfer takes the first one
    /// with nothing in flight (`mori_gpu::CopyPool`).
    pub num_streams: usize,
    /// Most transfers in flight per device (bench `--num-events`, default 64).
    pub num_events: usize,
    /// Deadline of one POSIX-FD handle exchange with an owner (default 10 s).
    pub handle_timeout: Duration,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig { handle: HandleType::PosixFd, num_streams: 64, num_events: 64, handle_timeout: Duration::from_secs(10) }
    }
}

impl FabricConfig {
    /// Defaults, with [`HANDLE_ENV`] and [`TIMEOUT_ENV`] applied. Errors: `InvalidArgs` naming
    /// the variable whose value does not parse.
    pub fn from_env() -> IoResult<Self> {
        let d = FabricConfig::default();
        let handle = match std::env::var(HANDLE_ENV) {
            Ok(v) => HandleType::parse(&v).map_err(|e| IoError::invalid(format!("{HANDLE_ENV}: {}", e.msg)))?,
            Err(_) => d.handle,
        };
        Ok(FabricConfig { handle, handle_timeout: mori_io_core::env_millis(TIMEOUT_ENV, d.handle_timeout)?, ..d })
    }
}

#[derive(Serialize, Deserialize)]
enum FabricCtrl {
    /// Initiator -> target: transfer `id` completed (all data in place). Sent by earlier
    /// builds; still accepted.
    Done(u64),
    /// Importer -> owner: the [`Grant`] of region `id` (the only bounds an importer trusts).
    Lookup(MemId),
    /// Owner -> importer: region `id` was deregistered; drop its mapping.
    Forget(MemId),
    /// Initiator -> target: these transfers completed (every completion queued while the
    /// previous message was on the wire goes in one message).
    DoneMany(Vec<u64>),
}

struct LocalReg {
    mem: Arc<Exported>,
    device: Device,
    addr: u64,
    len: u64,
    offset: u64,
    /// Engines that were granted this region (told when it is deregistered).
    grantees: Mutex<HashMap<String, Arc<EngineDesc>>>,
}

/// An imported region: the device address of its first byte here and its granted length.
struct RemoteMap {
    base: u64,
    len: u64,
    _alloc: VmmAllocation,
}

struct Inner {
    ctx: BackendContext,
    cfg: FabricConfig,
    rt: Arc<dyn Runtime>,
    domain: FabricDomain,
    socket: OnceLock<String>,
    pool: CopyPool,
    local: Mutex<FxHashMap<MemId, Arc<LocalReg>>>,
    maps: PeerMap<Arc<RemoteMap>>,
    /// Control messages sent by the notifier thread (completion must not wait on them):
    /// completions are queued, the pool's completion thread flushes (its idle hook).
    notifier: Arc<Notifier<FabricCtrl>>,
}

/// The fabric transport (see the crate docs).
pub struct FabricBackend {
    inner: Arc<Inner>,
    _server: Option<FdServer>,
}

impl FabricBackend {
    /// Loads the GPU runtime, proves the handle type works by allocating and exporting a
    /// small buffer on GPU 0, determines this engine's fabric domain, and starts the copy pool,
    /// the notifier and (POSIX FD) the Unix socket server.
    ///
    /// Errors: `InvalidArgs` for zero streams/events; `NotSupported` without a GPU runtime or
    /// GPU, when GPU 0 cannot export the handle type (FABRIC on a machine without an IMEX
    /// channel: the message says so), or for FABRIC without [`DOMAIN_ENV`].
    pub fn new(ctx: BackendContext, cfg: FabricConfig) -> IoResult<Self> {
        if cfg.num_streams == 0 || cfg.num_events == 0 {
            return Err(IoError::invalid("fabric num_streams and num_events must be at least 1"));
        }
        let rt = mori_gpu::detect().map_err(|e| IoError::not_supported(format!("fabric backend: {e}")))?;
        let n = rt.device_count().map_err(|e| IoError::gpu("fabric backend: count GPUs", e))?;
        if n == 0 {
            return Err(IoError::not_supported("fabric backend: no GPU visible"));
        }
        drop(
            FabricMemory::alloc(&rt, 0, 1, cfg.handle)
                .map_err(|e| IoError::new(e.code, format!("fabric backend ({} handles): {}", cfg.handle, e.msg)))?,
        );
        let domain = match cfg.handle {
            HandleType::PosixFd => FabricDomain::this_node(&ctx.local.hostname)?,
            HandleType::Fabric => {
                let v = std::env::var(DOMAIN_ENV).map_err(|_| {
                    IoError::not_supported(format!(
                        "fabric backend with FABRIC handles: set {DOMAIN_ENV}=<cluster uuid>:<clique id> (nvidia-smi -q, section Fabric) so peers outside this domain are refused"
                    ))
                })?;
                FabricDomain::parse_fabric(&v)?
            }
        };
        let pool_cfg = CopyPoolConfig { num_streams: cfg.num_streams, num_events: cfg.num_events, ..CopyPoolConfig::default() };
        let pool = CopyPool::new(rt.clone(), pool_cfg, "mori-fabric-events").map_err(|e| IoError::gpu("fabric copy pool", e))?;
        let notifier = Arc::new(Notifier::spawn("mori-fabric-notify", ctx.ctrl.clone(), BackendKind::Fabric, FabricCtrl::DoneMany)?);
        let n2 = notifier.clone();
        pool.set_idle_hook(Box::new(move || n2.flush()));
        tracing::info!(engine = %ctx.local.key, handle = %cfg.handle, domain = %domain, "fabric backend ready");
        let inner = Arc::new(Inner {
            ctx,
            cfg,
            rt,
            domain,
            socket: OnceLock::new(),
            pool,
            local: Mutex::new(FxHashMap::default()),
            maps: PeerMap::new(),
            notifier,
        });
        let server = match inner.cfg.handle {
            HandleType::Fabric => None,
            HandleType::PosixFd => {
                let weak: Weak<Inner> = Arc::downgrade(&inner);
                let grant = move |from: &str, id: MemId| -> IoResult<(Grant, OwnedFd)> {
                    let inner = weak.upgrade().ok_or_else(|| IoError::bad_state("fabric backend is shutting down"))?;
                    let (g, reg) = inner.grant(id)?;
                    let fd = reg
                        .mem
                        .handle
                        .posix_fd()
                        .ok_or_else(|| IoError::bad_state(format!("memory {id} has no POSIX FD handle")))?
                        .try_clone_to_owned()
                        .map_err(|e| IoError::from_io("duplicate the POSIX FD handle", &e))?;
                    tracing::debug!(from, id, "fabric POSIX FD handed out");
                    Ok((g, fd))
                };
                let s = FdServer::start(&inner.ctx.local.key, inner.cfg.handle_timeout, inner.ctx.local.secret, Arc::new(grant))?;
                let _ = inner.socket.set(s.name().to_string());
                Some(s)
            }
        };
        Ok(FabricBackend { inner, _server: server })
    }

    /// This engine's fabric domain.
    pub fn domain(&self) -> &FabricDomain {
        &self.inner.domain
    }
}

impl Inner {
    fn grant(&self, id: MemId) -> IoResult<(Grant, Arc<LocalReg>)> {
        let reg = self.local.lock().get(&id).cloned().ok_or_else(|| {
            IoError::not_found(format!("memory {id} is not fabric-registered GPU memory of engine {:?}", self.ctx.local.key))
        })?;
        let g = Grant { offset: reg.offset, len: reg.len, descriptor: reg.mem.handle.descriptor().to_vec() };
        Ok((g, reg))
    }

    /// The remote region mapped here: granted by its owner, imported once, then cached.
    fn remote_region(&self, remote: &MemoryDesc, peer: &EngineDesc, dev: Device) -> IoResult<Arc<RemoteMap>> {
        if let Some(m) = self.maps.get(&remote.engine_key, remote.id) {
            return Ok(m);
        }
        let what = format!("memory {} of engine {:?}", remote.id, remote.engine_key);
        let h = FabricHandle::from_bytes(
            remote.handle(BackendKind::Fabric).ok_or_else(|| IoError::invalid(format!("{what} carries no fabric handle")))?,
        )?;
        domain::check(&self.domain, &h.domain).map_err(|r| IoError::not_supported(format!("{what}: {r}")))?;
        let ask = postcard::to_allocvec(&FabricCtrl::Lookup(remote.id)).map_err(|e| IoError::invalid(e.to_string()))?;
        let grant = Grant::from_bytes(&self.ctx.ctrl.request(peer, BackendKind::Fabric, ask)?)?;
        let sh = match self.cfg.handle {
            HandleType::Fabric => ShareableHandle::from_descriptor(&grant.descriptor, None),
            HandleType::PosixFd => {
                let sock = h.socket.as_deref().ok_or_else(|| IoError::invalid(format!("{what}: no socket name")))?;
                let (g2, fd) = uds::fetch(sock, &self.ctx.local.key, remote.id, &peer.secret, self.cfg.handle_timeout)?;
                if g2 != grant {
                    return Err(IoError::bad_state(format!("{what}: the owner's socket and control plane grant different ranges")));
                }
                ShareableHandle::from_descriptor(&g2.descriptor, Some(fd))
            }
        }
        .map_err(|e| IoError::gpu(&format!("{what}: handle"), e))?;
        if sh.kind() != self.cfg.handle.shareable() {
            return Err(IoError::invalid(format!("{what}: a {} handle arrived, this backend uses {}", sh.kind(), self.cfg.handle)));
        }
        grant.check_inside(sh.size())?;
        let alloc = self.rt.vmm_import(dev, &sh).map_err(|e| IoError::gpu(&format!("import {what} on GPU {}", dev.0), e))?;
        let m = Arc::new(RemoteMap { base: alloc.ptr() + grant.offset, len: grant.len, _alloc: alloc });
        tracing::debug!(remote = %remote.engine_key, id = remote.id, len = grant.len, "fabric memory mapped");
        // Two threads may have imported it at once: both use the first entry.
        Ok(self.maps.get_or_insert(&remote.engine_key, remote.id, m))
    }

    fn post(&self, req: &TransferRequest, status: &TransferStatus) -> IoResult<()> {
        let l = self.local.lock().get(&req.local.id).cloned().ok_or_else(|| {
            IoError::not_found(format!("local memory {} is not fabric-registered (allocate it with FabricMemory::alloc)", req.local.id))
        })?;
        let rm = self.remote_region(&req.remote, &req.peer, l.device)?;
        let (lr, rr) = ((req.local.id, l.len), (req.remote.id, rm.len));
        match &req.paged {
            Some(p) => p.check_regions(lr, rr)?,
            None => check_segs_mapped(lr, rr, &req.segs, &req.entries)?,
        }
        let (laddr, rbase, dev) = (l.addr, rm.base, l.device);
        // The completion, made once the copies are queued; both mappings stay alive until the
        // copies finished.
        let make_done = || {
            let (st, peer, id, notifier) = (status.clone(), req.peer.clone(), req.id, self.notifier.clone());
            move |r: mori_gpu::Result<()>| {
                let _keep = (rm, l);
                let ok = r.is_ok();
                st.complete_piece(r.map_err(|e| IoError::gpu("fabric copy", e)));
                if ok {
                    notifier.push_done(peer, id);
                }
            }
        };
        // SAFETY: every segment (every block of a paged plan) was bounds-checked against the
        // local registration (memory this backend holds via `LocalReg`) and the owner-granted
        // remote range (mapped by `RemoteMap`); both are kept alive by `done` until the copies
        // finished.
        match &req.paged {
            Some(p) => {
                let (job, runs) = paged_job(p, req.op, laddr, rbase);
                unsafe { self.pool.copy_paged(dev, &job, runs, make_done) }
            }
            None => {
                let copies = req.segs.iter().map(|s| {
                    let (src, dst) = req.op.endpoints(laddr + s.local_off, rbase + s.remote_off);
                    CopySeg { src, dst, len: s.len }
                });
                unsafe { self.pool.copy_with(dev, copies, make_done) }
            }
        }
        .map_err(|e| IoError::gpu("queue fabric copies", e))
    }
}

impl mori_io_core::Progress for Inner {
    /// A waiter's completion step (skipped while another thread runs one).
    fn progress(&self) -> bool {
        self.pool.progress()
    }
}

impl Backend for FabricBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Fabric
    }

    fn handles_gpu_memory(&self) -> bool {
        true
    }

    /// Paged batches go to the GPU whole: one kernel reads the block runs.
    fn takes_paged(&self) -> bool {
        true
    }

    fn on_register(&self, desc: &mut MemoryDesc) -> IoResult<()> {
        let Some(d) = desc.loc.gpu() else { return Ok(()) };
        let i = &self.inner;
        let Some((mem, offset)) = crate::memory::find(d, desc.addr, desc.len) else {
            tracing::info!(
                id = desc.id,
                device = d,
                "GPU memory not allocated by FabricMemory::alloc: the fabric backend will not serve it"
            );
            return Ok(());
        };
        if mem.kind != i.cfg.handle {
            tracing::warn!(id = desc.id, "memory exportable as {} but the fabric backend uses {}: not served", mem.kind, i.cfg.handle);
            return Ok(());
        }
        if desc.bus_id.is_none() {
            desc.bus_id = i.rt.device_properties(Device(d)).ok().map(|p| p.pci_bus_id.to_string());
        }
        let h = FabricHandle { domain: i.domain.clone(), socket: i.socket.get().cloned() };
        desc.handles.retain(|x| x.backend != BackendKind::Fabric);
        desc.handles.push(BackendHandle { backend: BackendKind::Fabric, bytes: h.to_bytes() });
        let reg = LocalReg { mem, device: Device(d), addr: desc.addr, len: desc.len, offset, grantees: Mutex::new(HashMap::new()) };
        i.local.lock().insert(desc.id, Arc::new(reg));
        Ok(())
    }

    fn on_deregister(&self, desc: &MemoryDesc) -> IoResult<()> {
        if let Some(reg) = self.inner.local.lock().remove(&desc.id) {
            for (_, peer) in reg.grantees.lock().drain() {
                // A grantee that has gone holds no mapping any more: nothing to warn about.
                self.inner.notifier.send_if_alive(peer, FabricCtrl::Forget(desc.id));
            }
        }
        Ok(())
    }

    fn can_serve(&self, local: &MemoryDesc, remote: &MemoryDesc, peer: &EngineDesc) -> Result<(), Refusal> {
        let refuse = |reason: String| Err(Refusal { backend: BackendKind::Fabric, reason });
        let (Some(ld), Some(_)) = (local.loc.gpu(), remote.loc.gpu()) else {
            return refuse("fabric moves GPU memory only (--mem-type gpu); one side is host memory".into());
        };
        let i = &self.inner;
        if !i.local.lock().contains_key(&local.id) {
            return refuse(format!(
                "local memory {} has no {} handle: allocate it with mori_io_fabric::FabricMemory::alloc before registering",
                local.id, i.cfg.handle
            ));
        }
        let Some(bytes) = remote.handle(BackendKind::Fabric) else {
            return refuse(format!(
                "remote memory {} of engine {:?} carries no fabric handle (not FabricMemory, or its engine has no fabric backend)",
                remote.id, peer.key
            ));
        };
        let h = match FabricHandle::from_bytes(bytes) {
            Ok(h) => h,
            Err(e) => return refuse(format!("remote memory {}: {}", remote.id, e.msg)),
        };
        if let Err(r) = domain::check(&i.domain, &h.domain) {
            return refuse(format!("engine {:?}: {r}", peer.key));
        }
        let rdev = remote.bus_id.as_ref().and_then(|bus| {
            (0..i.rt.device_count().unwrap_or(0))
                .find(|&d| i.rt.device_properties(Device(d)).is_ok_and(|p| p.pci_bus_id.to_string() == *bus))
        });
        match rdev.map(|r| (r, i.rt.can_access_peer(Device(ld), Device(r)))) {
            None | Some((_, Ok(true))) => Ok(()),
            Some((r, Ok(false))) => refuse(format!("GPU {ld} cannot access GPU {r} (no peer access)")),
            Some((r, Err(e))) => refuse(format!("peer-access query GPU {ld} -> GPU {r} failed: {e}")),
        }
    }

    /// Ready once the remote region was looked up and mapped (the first post asks its owner).
    fn ready(&self, _peer: &EngineDesc, remote: &MemoryDesc) -> bool {
        self.inner.maps.get(&remote.engine_key, remote.id).is_some()
    }

    fn post(&self, req: TransferRequest, status: TransferStatus) {
        if let Err(e) = self.inner.post(&req, &status) {
            status.complete_piece(Err(e));
        }
        // After the copies are queued (nobody waits on the status before this returns).
        let me: Weak<dyn mori_io_core::Progress> = Arc::downgrade(&self.inner) as _;
        status.set_progress(me);
    }

    fn disconnect(&self, peer_key: &str) {
        drop(self.inner.maps.remove_engine(peer_key));
    }

    fn control(&self, from: &EngineDesc, payload: &[u8]) -> IoResult<Vec<u8>> {
        match postcard::from_bytes::<FabricCtrl>(payload) {
            Ok(FabricCtrl::Done(id)) => {
                self.inner.ctx.inbound.transfers_done(&from.key, [id]);
                Ok(Vec::new())
            }
            Ok(FabricCtrl::DoneMany(ids)) => {
                self.inner.ctx.inbound.transfers_done(&from.key, ids);
                Ok(Vec::new())
            }
            Ok(FabricCtrl::Lookup(id)) => {
                let (g, reg) = self.inner.grant(id)?;
                reg.grantees.lock().insert(from.key.clone(), Arc::new(from.clone()));
                Ok(g.to_bytes())
            }
            Ok(FabricCtrl::Forget(id)) => {
                drop(self.inner.maps.remove(&from.key, id));
                Ok(Vec::new())
            }
            Err(e) => Err(IoError::invalid(format!("malformed fabric control message from {:?}: {e}", from.key))),
        }
    }
}
