//! [`IoEngine`]: registrations, remote engines, backend choice and one-shot transfers.

use crate::connector::Connector;
use crate::control::CtrlPool;
use crate::inflight::InFlight;
use crate::notify::RegionBatch;
use crate::paged::Batch;
use crate::session::Session;
use mori_io_core::status::Completion;
use mori_io_core::wire::{CtrlReply, CtrlRequest};
use mori_io_core::{
    Backend, BackendContext, BackendKind, EngineDesc, InboundTable, IoError, IoResult, MemId, MemLoc, MemRegistry, MemoryDesc, Op, Refusal,
    Region, Secret, TransferId, TransferRequest, TransferStatus,
};
#[cfg(feature = "fabric")]
use mori_io_fabric::{FabricBackend, FabricConfig};
#[cfg(feature = "rdma")]
use mori_io_rdma::{RdmaBackend, RdmaConfig};
use mori_io_tcp::{TcpBackend, TcpConfig};
#[cfg(feature = "xgmi")]
use mori_io_xgmi::{XgmiBackend, XgmiConfig};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Settings of an engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Address to listen on and advertise in the [`EngineDesc`] (must be reachable by peers;
    /// `0.0.0.0` is refused because peers would dial their own host).
    pub host: String,
    /// Control-plane port; 0 picks a free one (the descriptor carries the real port).
    pub port: u16,
    /// Deadline of control-plane connects, hellos and lookups (default 10 s, env
    /// `MORI_IO_CONTROL_TIMEOUT_MS`).
    pub control_timeout: Duration,
    /// Longest control frame accepted, bytes (default 16 MiB).
    pub max_frame: usize,
    /// How long `deregister_memory` waits for in-flight operations (default 10 s).
    pub drain_timeout: Duration,
    /// Require every connection to present this engine's secret (default on; env
    /// `MORI_IO_AUTH=off` turns it off, for benchmarks: anyone who can reach the port may then
    /// read and write registered memory within bounds). See `mori_io_core::desc`.
    pub auth: bool,
    /// Most inbound connections (control and data, from all peers) served at once; more are
    /// refused with `Refused` naming the limit (default 1024, env `MORI_IO_MAX_INBOUND`,
    /// 1..=65536: a peer uses one control connection plus one per tcp lane).
    pub max_inbound: usize,
    /// An inbound connection idle this long is closed (default 300 s, env
    /// `MORI_IO_IDLE_TIMEOUT_MS`); peers reconnect on their next request.
    pub idle_timeout: Duration,
}

/// Longest engine key, bytes (it travels in every connection's hello).
pub const MAX_KEY_LEN: usize = 1024;

/// Largest [`EngineConfig::max_inbound`].
pub const MAX_INBOUND_LIMIT: usize = 65536;

/// Whether engines of this process check secrets: `MORI_IO_AUTH` unset or on (`1`, `true`,
/// `on`, `yes`) -> true, off (`0`, `false`, `off`, `no`) -> false. Errors: `InvalidArgs` for
/// any other value, naming it.
pub fn auth_from_env() -> IoResult<bool> {
    match std::env::var("MORI_IO_AUTH") {
        Err(_) => Ok(true),
        Ok(v) => mori_io_core::status::parse_switch(&v)
            .ok_or_else(|| IoError::invalid(format!("MORI_IO_AUTH={v:?} is not one of {}", mori_io_core::status::SWITCH_VALUES))),
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            host: "127.0.0.1".into(),
            port: 0,
            control_timeout: Duration::from_secs(10),
            max_frame: mori_io_core::wire::DEFAULT_MAX_FRAME,
            drain_timeout: Duration::from_secs(10),
            auth: true,
            max_inbound: 1024,
            idle_timeout: Duration::from_secs(300),
        }
    }
}

impl EngineConfig {
    /// `host` and `port` with the other fields from defaults and the environment.
    /// Errors: `InvalidArgs` naming an environment variable that does not parse.
    pub fn new(host: impl Into<String>, port: u16) -> IoResult<Self> {
        let d = EngineConfig::default();
        Ok(EngineConfig {
            host: host.into(),
            port,
            control_timeout: mori_io_core::env_millis("MORI_IO_CONTROL_TIMEOUT_MS", d.control_timeout)?,
            auth: auth_from_env()?,
            max_inbound: match std::env::var("MORI_IO_MAX_INBOUND") {
                Err(_) => d.max_inbound,
                Ok(v) => v.trim().parse::<usize>().ok().filter(|n| (1..=MAX_INBOUND_LIMIT).contains(n)).ok_or_else(|| {
                    IoError::invalid(format!("MORI_IO_MAX_INBOUND={v:?} is not a connection count in 1..={MAX_INBOUND_LIMIT}"))
                })?,
            },
            idle_timeout: mori_io_core::env_millis("MORI_IO_IDLE_TIMEOUT_MS", d.idle_timeout)?,
            ..d
        })
    }
}

/// Which backend to create, with its settings.
#[derive(Debug, Clone)]
pub enum BackendConfig {
    /// TCP streams (any host, host memory).
    Tcp(TcpConfig),
    /// RDMA RC queue pairs over ibverbs (needs libibverbs and an active RDMA port). Feature `rdma`.
    #[cfg(feature = "rdma")]
    Rdma(RdmaConfig),
    /// Same-node GPU P2P over CUDA/HIP IPC (needs a GPU runtime at run time). Feature `xgmi`.
    #[cfg(feature = "xgmi")]
    Xgmi(XgmiConfig),
    /// GPU memory through VMM shareable handles (POSIX FD within a node, FABRIC across a
    /// scale-up domain); needs a GPU runtime and memory from `mori_io_fabric::FabricMemory`.
    /// Feature `fabric`.
    #[cfg(feature = "fabric")]
    Fabric(FabricConfig),
}

/// Which GPU-capable backends this build lacks (cargo features of mori-io).
const GPU_FEATURES_HINT: &str = if cfg!(all(feature = "xgmi", feature = "fabric", feature = "rdma")) {
    ""
} else {
    "; this build of mori-io has only the backends its cargo features enable (rdma, xgmi, fabric)"
};

/// (peer engine key, local region, remote region): the unit a backend choice is cached for.
type ChoiceKey = (String, MemId, MemId);

pub(crate) struct EngineInner {
    pub(crate) desc: Arc<EngineDesc>,
    pub(crate) cfg: EngineConfig,
    pub(crate) shutdown: Arc<AtomicBool>,
    /// Posts that must wait for a connection run here, off the caller's thread.
    connector: Arc<Connector>,
    registry: Arc<MemRegistry>,
    inbound: Arc<InboundTable>,
    /// Inbound control and data connections per initiator ([`IoEngine::closed_by_peer`]).
    pub(crate) links: Arc<mori_io_core::PeerLinks>,
    local_descs: RwLock<HashMap<MemId, MemoryDesc>>,
    backends: RwLock<Vec<Arc<dyn Backend>>>,
    remotes: RwLock<HashMap<String, Arc<EngineDesc>>>,
    choice: Mutex<HashMap<ChoiceKey, Arc<dyn Backend>>>,
    ctrl: Arc<CtrlPool>,
    next_mem: AtomicU64,
    next_transfer: AtomicU64,
    /// Bumped whenever a remote engine is deregistered or replaced: sessions re-check their
    /// peer only when it moved (one atomic load per post otherwise).
    pub(crate) remote_gen: AtomicU64,
    pub(crate) inflight: InFlight,
    /// Inbound connections being served (against `cfg.max_inbound`).
    pub(crate) inbound_conns: Arc<std::sync::atomic::AtomicUsize>,
    /// Messages for peers, sent by the notification thread (`crate::notify`).
    pub(crate) notif_tx: crossbeam_channel::Sender<crate::notify::Job>,
    /// Notifications received, unread.
    pub(crate) notifs: mori_io_core::NotifQueue,
}

/// A MORI-IO transfer engine: one control-plane listener, the backends created on it, the
/// memory registered with it, and the remote engines it knows.
///
/// Dropping it releases the backends in the dropping thread (streams, events and mappings
/// freed, unless a [`Session`](crate::Session) or a thread spin-waiting on a transfer still
/// holds one; a GPU backend first sends the target notifications it queued, waiting up to 2 s
/// for a slow peer) and stops the listener within ~100 ms. Backend threads are told to stop
/// and end on their own: a tcp connection thread finishes the request it is serving and takes
/// no new one, within its 200 ms idle poll. It does not wait for transfers in flight:
/// deregister memory first (`deregister_memory` waits for the operations using it), and only
/// then free it.
pub struct IoEngine {
    pub(crate) inner: Arc<EngineInner>,
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for 256 bytes; gethostname NUL-terminates within it or
    // truncates, and we read only up to the first NUL.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn node_id(host: &str) -> String {
    std::fs::read_to_string("/etc/machine-id")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| host.to_string())
}

impl IoEngine {
    /// Starts an engine named `key` listening on `cfg.host:cfg.port`.
    ///
    /// `cfg.host` is a name or an IP literal (IPv6 bare or bracketed); the descriptor carries it
    /// without brackets.
    ///
    /// Errors: `InvalidArgs` for an empty key or one over [`MAX_KEY_LEN`] bytes, a host resolving to an unspecified address in any
    /// spelling (`0.0.0.0`, `0`, `::`, `::0`, `::ffff:0.0.0.0`, ...: peers would dial their own
    /// loopback and fail with "connection refused"), or an unresolvable host; `BadState`
    /// naming the port when it is already in use.
    pub fn new(key: &str, cfg: EngineConfig) -> IoResult<Self> {
        // Read (and, if malformed, reported) once per process whatever the backends.
        let _ = mori_io_core::status::caller_progress_enabled();
        if key.is_empty() {
            return Err(IoError::invalid("engine key is empty"));
        }
        if key.len() > MAX_KEY_LEN {
            return Err(IoError::invalid(format!("engine key is {} bytes, at most {MAX_KEY_LEN} are allowed", key.len())));
        }
        if !(1..=MAX_INBOUND_LIMIT).contains(&cfg.max_inbound) {
            return Err(IoError::invalid(format!("max_inbound = {}, allowed 1..={MAX_INBOUND_LIMIT}", cfg.max_inbound)));
        }
        if cfg.idle_timeout.is_zero() {
            return Err(IoError::invalid("idle_timeout (env MORI_IO_IDLE_TIMEOUT_MS) is 0: every connection would close at once"));
        }
        if cfg.control_timeout.is_zero() {
            return Err(IoError::invalid("control_timeout (env MORI_IO_CONTROL_TIMEOUT_MS) is 0: it would turn the control deadlines off"));
        }
        let secret = if cfg.auth {
            Secret::random()?
        } else {
            tracing::warn!(key, "MORI_IO_AUTH=off: this engine serves any connection that reaches its port, without its secret");
            Secret::NONE
        };
        let addr = mori_bootstrap::addr::advertised("engine host", &cfg.host, cfg.port).map_err(|e| IoError::invalid(e.to_string()))?;
        let listener = TcpListener::bind(addr).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                IoError::bad_state(format!("control-plane port {} on {} is already in use", cfg.port, cfg.host))
            } else {
                IoError::from_io(&format!("bind control plane on {addr}"), &e)
            }
        })?;
        let port = listener.local_addr().map_err(|e| IoError::from_io("listener address", &e))?.port();
        let hn = hostname();
        let desc = Arc::new(EngineDesc {
            key: key.to_string(),
            node_id: node_id(&hn),
            hostname: hn,
            host: mori_bootstrap::addr::unbracket(&cfg.host).to_string(),
            port,
            pid: std::process::id(),
            epoch: mori_io_core::new_epoch(),
            secret,
        });
        let ctrl = Arc::new(CtrlPool::new(desc.clone(), cfg.control_timeout, cfg.max_frame));
        let shutdown = Arc::new(AtomicBool::new(false));
        let notif_tx = crate::notify::spawn(ctrl.clone(), shutdown.clone())?;
        let inner = Arc::new(EngineInner {
            desc,
            cfg,
            shutdown,
            connector: Arc::new(Connector::default()),
            registry: Arc::new(MemRegistry::new()),
            inbound: Arc::new(InboundTable::new()),
            links: Arc::new(mori_io_core::PeerLinks::new()),
            local_descs: RwLock::new(HashMap::new()),
            backends: RwLock::new(Vec::new()),
            remotes: RwLock::new(HashMap::new()),
            choice: Mutex::new(HashMap::new()),
            ctrl,
            next_mem: AtomicU64::new(1),
            next_transfer: AtomicU64::new(1),
            remote_gen: AtomicU64::new(0),
            inflight: InFlight::new(),
            inbound_conns: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            notif_tx,
            notifs: mori_io_core::NotifQueue::new(mori_io_core::notif::DEFAULT_MAX_QUEUED),
        });
        let e = inner.clone();
        std::thread::Builder::new()
            .name("mori-io-listen".into())
            .spawn(move || crate::listener::accept_loop(listener, e))
            .map_err(|e| IoError::transport(format!("spawn listener thread: {e}")))?;
        tracing::info!(key, host = %inner.desc.host, port, "engine listening");
        Ok(IoEngine { inner })
    }

    /// This engine's descriptor (give it to peers).
    pub fn desc(&self) -> &EngineDesc {
        &self.inner.desc
    }

    /// Creates a backend. Errors: `InvalidArgs` for a backend already created or bad settings;
    /// `NotSupported` for `rdma` on a host without libibverbs or an active RDMA port, for
    /// `xgmi` without a CUDA/HIP runtime, and for `fabric` without a GPU runtime or when the
    /// handle type cannot be exported here (FABRIC without an IMEX channel); the message says which.
    pub fn create_backend(&self, cfg: BackendConfig) -> IoResult<()> {
        let ctx = BackendContext {
            ctrl: self.inner.ctrl.clone(),
            local: self.inner.desc.clone(),
            registry: self.inner.registry.clone(),
            inbound: self.inner.inbound.clone(),
            links: self.inner.links.clone(),
        };
        let b: Arc<dyn Backend> = match cfg {
            BackendConfig::Tcp(c) => Arc::new(TcpBackend::new(ctx, c)?),
            #[cfg(feature = "rdma")]
            BackendConfig::Rdma(c) => Arc::new(RdmaBackend::new(ctx, c)?),
            #[cfg(feature = "xgmi")]
            BackendConfig::Xgmi(c) => Arc::new(XgmiBackend::new(ctx, c)?),
            #[cfg(feature = "fabric")]
            BackendConfig::Fabric(c) => Arc::new(FabricBackend::new(ctx, c)?),
        };
        let mut g = self.inner.backends.write();
        if g.iter().any(|x| x.kind() == b.kind()) {
            return Err(IoError::invalid(format!("backend {} was already created on engine {:?}", b.kind(), self.inner.desc.key)));
        }
        for d in self.inner.local_descs.write().values_mut() {
            b.on_register(d)?;
        }
        tracing::info!(engine = %self.inner.desc.key, backend = %b.kind(), "backend created");
        g.push(b);
        g.sort_by_key(|x| x.kind());
        self.inner.choice.lock().clear();
        Ok(())
    }

    /// Creates the rdma backend when this host has an active RDMA port, and the tcp backend in
    /// any case; the engine then prefers rdma for every pair it can serve. When rdma is not
    /// available an INFO line names why. Returns the backends created, in preference order.
    /// Errors: those of creating the tcp backend. Feature `rdma`.
    #[cfg(feature = "rdma")]
    pub fn create_backends_auto(&self, tcp: TcpConfig, rdma: RdmaConfig) -> IoResult<Vec<BackendKind>> {
        let mut made = Vec::new();
        match self.create_backend(BackendConfig::Rdma(rdma)) {
            Ok(()) => made.push(BackendKind::Rdma),
            Err(e) => tracing::info!(engine = %self.inner.desc.key, reason = %e, "rdma backend not available; transfers will use tcp"),
        }
        self.create_backend(BackendConfig::Tcp(tcp))?;
        made.push(BackendKind::Tcp);
        Ok(made)
    }

    /// Registers `len` bytes at `ptr` and returns the descriptor peers use to address them.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes by this engine's threads (and, through
    /// them, by remote engines) from now until [`IoEngine::deregister_memory`] returns `Ok`,
    /// and must not be freed before that. Concurrent access by the caller while a transfer
    /// touches the same bytes yields unspecified contents, as with DMA.
    ///
    /// Errors: `InvalidArgs` for a null pointer, zero length or a wrapping range;
    /// `NotSupported` for GPU memory when no backend of this engine moves GPU memory (xgmi,
    /// fabric, rdma); a backend's own registration error (IPC export, ibv_reg_mr, dmabuf
    /// export or ibv_reg_dmabuf_mr: `NotSupported` naming a missing GPU runtime or an RDMA
    /// device without dmabuf MRs).
    pub unsafe fn register_memory(&self, ptr: *mut u8, len: usize, loc: MemLoc) -> IoResult<MemoryDesc> {
        if ptr.is_null() {
            return Err(IoError::invalid("register_memory: null pointer"));
        }
        if let MemLoc::Gpu { device } = loc {
            if !self.inner.backends.read().iter().any(|b| b.handles_gpu_memory()) {
                return Err(IoError::not_supported(format!(
                    "register_memory: GPU memory (device {device}) needs a GPU backend; create_backend(BackendConfig::Xgmi(..)) or BackendConfig::Fabric(..) first (both need a CUDA or HIP runtime), or Rdma (dmabuf MRs){}",
                    GPU_FEATURES_HINT
                )));
            }
        }
        let id = self.inner.next_mem.fetch_add(1, Ordering::Relaxed);
        let mut desc = MemoryDesc {
            engine_key: self.inner.desc.key.clone(),
            engine_epoch: self.inner.desc.epoch,
            id,
            addr: ptr as u64,
            len: len as u64,
            loc,
            bus_id: None,
            handles: Vec::new(),
        };
        for b in self.inner.backends.read().iter() {
            b.on_register(&mut desc)?;
        }
        self.inner.registry.insert(Region { id, addr: ptr as usize, len: len as u64, loc })?;
        self.inner.local_descs.write().insert(id, desc.clone());
        Ok(desc)
    }

    /// Lets go of device work the backends queued ahead that waits for the host (xgmi's armed
    /// ordered-copy launches: `XgmiConfig::armed_depth`, `MORI_GPU_POOL_ARMED`) and waits for
    /// it: call before freeing device or pinned memory, or synchronising the device, while
    /// this engine lives, posting nothing meanwhile (the next post arms again). Errors: the
    /// first backend's that failed (its device work did not finish in its deadline); every
    /// backend is asked.
    pub fn quiesce(&self) -> IoResult<()> {
        // Every backend asked (`fold` runs them all), the first error kept (`and`).
        self.inner.backends.read().iter().map(|b| b.quiesce()).fold(Ok(()), Result::and)
    }

    /// Deregisters memory: no new transfer can use it; waits (up to the drain timeout) for
    /// in-flight ones. Errors: `NotFound` if not registered here (double deregistration);
    /// `InvalidArgs` if `desc` belongs to another engine; `Timeout` if operations still use it
    /// after the drain timeout: the region then stays draining (new transfers refused) and must
    /// not be freed yet; call `deregister_memory` again to wait again, until it returns `Ok`.
    pub fn deregister_memory(&self, desc: &MemoryDesc) -> IoResult<()> {
        self.own(desc)?;
        self.inner.registry.remove(desc.id, self.inner.cfg.drain_timeout)?;
        self.inner.local_descs.write().remove(&desc.id);
        for b in self.inner.backends.read().iter() {
            b.on_deregister(desc)?;
        }
        Ok(())
    }

    /// Makes a remote engine known (its descriptor came out of band). Registering a key again
    /// with a different descriptor (the peer restarted, or another engine took the key) drops
    /// the connections and cached choices of the old one first; sessions made against the old
    /// one then fail with `RemoteDisconnect`, and so do transfers naming memory descriptors of
    /// the old one (their `engine_epoch` is not the new engine's epoch: region ids restart with
    /// each engine, so they would otherwise address another region). Connections check the
    /// epoch too: an engine of that key but another epoch answering is refused.
    /// Errors: `InvalidArgs` for this engine's own key.
    pub fn register_remote_engine(&self, desc: EngineDesc) -> IoResult<()> {
        if desc.key == self.inner.desc.key {
            return Err(IoError::invalid(format!("remote engine key {:?} equals this engine's key", desc.key)));
        }
        let known = self.inner.remotes.read().get(&desc.key).cloned();
        match known {
            Some(old) if *old == desc => return Ok(()),
            Some(old) => {
                // Another engine now answers to this key (restarted, moved): drop everything
                // tied to the old one, so no transfer reaches it by mistake.
                tracing::info!(
                    key = %desc.key, old = %format!("{}:{} pid {}", old.host, old.port, old.pid),
                    new = %format!("{}:{} pid {}", desc.host, desc.port, desc.pid),
                    "remote engine re-registered with a new descriptor; its connections are dropped"
                );
                self.deregister_remote_engine(&desc.key);
            }
            None => {}
        }
        self.inner.remotes.write().insert(desc.key.clone(), Arc::new(desc));
        Ok(())
    }

    /// Forgets a remote engine and its connections; its sessions fail from now on
    /// (`RemoteDisconnect`).
    pub fn deregister_remote_engine(&self, key: &str) {
        if self.inner.remotes.write().remove(key).is_some() {
            self.inner.remote_gen.fetch_add(1, Ordering::AcqRel);
        }
        self.inner.ctrl.forget(key);
        self.inner.choice.lock().retain(|k, _| k.0 != key);
        for b in self.inner.backends.read().iter() {
            b.disconnect(key);
        }
    }

    /// Asks engine `remote_key` over the control plane for its region `id`.
    /// Errors: `NotFound` for an unknown engine or region; `Timeout`/`RemoteDisconnect`.
    pub fn lookup_remote_memory(&self, remote_key: &str, id: MemId) -> IoResult<MemoryDesc> {
        self.inner.lookup(remote_key, id)
    }

    /// A fresh transfer id (unique within this engine).
    pub fn allocate_transfer_uid(&self) -> TransferId {
        self.inner.next_transfer.fetch_add(1, Ordering::Relaxed)
    }

    /// Final status of an inbound transfer `id` from engine `remote_key` once all its data
    /// landed here; `None` while unknown or incomplete. Each status is returned once.
    pub fn pop_inbound_status(&self, remote_key: &str, id: TransferId) -> Option<Result<(), IoError>> {
        self.inner.inbound.pop(remote_key, id)
    }

    /// Whether engine `remote_key` has no inbound connection open to this engine (its control
    /// connection, which carries signals, notifications and backend handshakes, and its tcp
    /// data connections) and ended the last one itself (end of stream or reset), rather than
    /// this engine ending it (idle timeout, shutdown, a refused request, a poll error).
    ///
    /// A peer process that exits or is killed closes its connections this way within moments;
    /// a stopped or slow one keeps them open. A live peer closes them too when it drops its
    /// engine, deregisters this engine (`deregister_remote_engine`) or registers this key
    /// again, or after one of its requests failed on the connection (it reconnects for the
    /// next one). So "true" means the peer cannot still be writing over the connections it had,
    /// not that its process is gone. False for a peer that never connected here (over rdma,
    /// xgmi and fabric the data path has no connection: only a peer that sent signals,
    /// notifications or handshakes is seen). A new connection from the peer clears it.
    pub fn closed_by_peer(&self, remote_key: &str) -> bool {
        self.inner.links.closed_by_peer(remote_key)
    }

    /// Reads `size` bytes at `remote_off` of `remote` into `local` at `local_off`.
    pub fn read(
        &self,
        local: &MemoryDesc,
        local_off: u64,
        remote: &MemoryDesc,
        remote_off: u64,
        size: u64,
        id: TransferId,
    ) -> TransferStatus {
        self.post_batch(Op::Read, local, remote, Batch::Ranges(&[local_off], &[remote_off], &[size]), id)
    }

    /// Writes `size` bytes at `local_off` of `local` to `remote` at `remote_off`.
    pub fn write(
        &self,
        local: &MemoryDesc,
        local_off: u64,
        remote: &MemoryDesc,
        remote_off: u64,
        size: u64,
        id: TransferId,
    ) -> TransferStatus {
        self.post_batch(Op::Write, local, remote, Batch::Ranges(&[local_off], &[remote_off], &[size]), id)
    }

    /// Batch read: entry `i` moves `sizes[i]` bytes from `remote_offs[i]` to `local_offs[i]`.
    ///
    /// Never waits on the network: a first transfer to a peer (no connection yet) is posted by
    /// a connector thread, and a connect that fails or passes its deadline fails the status
    /// (`Timeout` naming the deadline). The status ends only when no byte of the batch can
    /// still move; then `failed_entries` / `entry_landed` tell which entries landed.
    /// Errors (through the returned status): see [`mori_io_core::plan::check_batch`] for the
    /// argument rules; `InvalidArgs` for an `id` of a transfer to that engine not finished yet;
    /// `NotFound` for an unregistered engine; `RemoteDisconnect` for a stale `remote` (made by
    /// an earlier engine of that key, see [`IoEngine::register_remote_engine`]);
    /// `NotSupported` with every backend's refusal when none serves the pair.
    pub fn batch_read(
        &self,
        local: &MemoryDesc,
        local_offs: &[u64],
        remote: &MemoryDesc,
        remote_offs: &[u64],
        sizes: &[u64],
        id: TransferId,
    ) -> TransferStatus {
        self.post_batch(Op::Read, local, remote, Batch::Ranges(local_offs, remote_offs, sizes), id)
    }

    /// Batch write: entry `i` moves `sizes[i]` bytes from `local_offs[i]` to `remote_offs[i]`.
    /// Errors as [`IoEngine::batch_read`].
    pub fn batch_write(
        &self,
        local: &MemoryDesc,
        local_offs: &[u64],
        remote: &MemoryDesc,
        remote_offs: &[u64],
        sizes: &[u64],
        id: TransferId,
    ) -> TransferStatus {
        self.post_batch(Op::Write, local, remote, Batch::Ranges(local_offs, remote_offs, sizes), id)
    }

    /// Checks and posts a batch of either form (one-shot calls).
    pub(crate) fn post_batch(&self, op: Op, local: &MemoryDesc, remote: &MemoryDesc, batch: Batch<'_>, id: TransferId) -> TransferStatus {
        self.post_batch_in(op, local, remote, batch, id, false)
    }

    /// [`IoEngine::post_batch`], with the segments landing in order when `ordered` (refused
    /// with `NotSupported` by a backend that cannot).
    pub(crate) fn post_batch_in(
        &self,
        op: Op,
        local: &MemoryDesc,
        remote: &MemoryDesc,
        batch: Batch<'_>,
        id: TransferId,
        ordered: bool,
    ) -> TransferStatus {
        match self.prepare(op, local, remote, batch, id, ordered) {
            Err(st) => st,
            Ok((b, req, st)) => {
                self.inner.connector.post(b, req, st.clone(), self.inner.shutdown.clone());
                st
            }
        }
    }

    /// Several ordered batches ([`IoEngine::post_ordered`]), each between its own pair of
    /// regions and with its own id, posted together: one status per batch, in order. When
    /// every batch's backend is ready for its peer (and no connection is being made), batches
    /// that go through the same backend are handed to it at once, so it may queue them with
    /// fewer device calls (xgmi: one kernel launch for up to 8 segments of several batches,
    /// `mori_gpu::CopyPool::copy_groups_in_order_with`); otherwise each is posted on its own,
    /// in order. Each batch is checked on its own, with the errors of
    /// [`IoEngine::post_ordered`] (`NotSupported` for a backend that cannot keep the order);
    /// a device failure fails every batch that shares the failed launch (and, on xgmi, the
    /// batches after it, which are then not queued).
    pub fn post_ordered_multi(&self, op: Op, batches: &[RegionBatch<'_>]) -> Vec<TransferStatus> {
        let mut out = Vec::with_capacity(batches.len());
        let mut jobs = Vec::with_capacity(batches.len());
        for b in batches {
            let batch = Batch::Ranges(b.local_offs, b.remote_offs, b.sizes);
            match self.prepare(op, b.local, b.remote, batch, b.id, true) {
                Err(st) => out.push(st),
                Ok((be, req, st)) => {
                    out.push(st.clone());
                    jobs.push((be, req, st));
                }
            }
        }
        self.inner.connector.post_many(jobs, &self.inner.shutdown);
        out
    }

    /// The checks of a post and its request, with the status the backend completes; `Err`:
    /// the failed status (nothing posted).
    fn prepare(
        &self,
        op: Op,
        local: &MemoryDesc,
        remote: &MemoryDesc,
        batch: Batch<'_>,
        id: TransferId,
        ordered: bool,
    ) -> Result<(Arc<dyn Backend>, TransferRequest, TransferStatus), TransferStatus> {
        let r = (|| {
            self.own(local)?;
            let peer = self.inner.remote(&remote.engine_key)?;
            check_incarnation(remote, &peer)?;
            let checked = batch.check((local.id, local.len), (remote.id, remote.len))?;
            let local_region = self.inner.registry.get(local.id)?;
            let b = self.inner.choose(local, remote, &peer)?;
            if ordered && !b.orders_segments() {
                return Err(IoError::not_supported(format!(
                    "an ordered batch: the {} backend chosen for memory {} -> engine {:?} memory {} does not land a batch's segments in order",
                    b.kind(),
                    local.id,
                    peer.key,
                    remote.id
                )));
            }
            let slot = self.inner.inflight.reserve(peer.epoch, &peer.key, id)?;
            Ok((peer, checked, local_region, b, slot))
        })();
        match r {
            Err(e) => Err(TransferStatus::failed(e)),
            Ok((peer, checked, local_region, b, slot)) => {
                let st = TransferStatus::new(1);
                self.inner.inflight.fill(slot, &st);
                let (mut segs, entries, paged) = checked.for_backend(b.takes_paged());
                if ordered {
                    // One segment per non-empty entry: entries contiguous with the one before
                    // them would otherwise merge into one copy, inside which bytes land in no
                    // particular order.
                    if let Batch::Ranges(lo, ro, sz) = batch {
                        segs = mori_io_core::plan::unmerged_segments(lo, ro, sz);
                    }
                }
                let req = TransferRequest {
                    op,
                    id,
                    peer,
                    local: Arc::new(local.clone()),
                    local_region,
                    remote: Arc::new(remote.clone()),
                    segs,
                    entries: Arc::new(entries),
                    paged,
                    ordered,
                };
                Ok((b, req, st))
            }
        }
    }

    /// Opens a session between a local and a remote region: resolves the backend, checks the
    /// remote region exists (control-plane lookup: `NotFound` otherwise) and connects.
    /// Errors also: `RemoteDisconnect` for a stale `remote` (see [`IoEngine::batch_read`]).
    /// The session fails with `RemoteDisconnect` once its peer is deregistered or replaced
    /// here, and with `BadState` once this engine is dropped.
    pub fn create_session(&self, local: &MemoryDesc, remote: &MemoryDesc) -> IoResult<Session> {
        self.own(local)?;
        // Read before the peer: a replacement racing with this call is then noticed at the
        // session's first post.
        let gen = self.inner.remote_gen.load(Ordering::Acquire);
        let peer = self.inner.remote(&remote.engine_key)?;
        check_incarnation(remote, &peer)?;
        // The lookup's connection was accepted only from the engine of `peer.epoch`, which
        // check_incarnation compared with the descriptor's.
        let found = self.inner.lookup(&remote.engine_key, remote.id)?;
        if found.len != remote.len || found.addr != remote.addr {
            return Err(IoError::invalid(format!(
                "remote memory {} of engine {:?} is registered as {} bytes at {:#x}, the descriptor says {} bytes at {:#x}",
                remote.id, remote.engine_key, found.len, found.addr, remote.len, remote.addr
            )));
        }
        let b = self.inner.choose(local, remote, &peer)?;
        b.connect(&peer)?;
        Session::new(self.inner.clone(), Arc::new(local.clone()), Arc::new(remote.clone()), peer, b, gen)
    }

    /// The backend that would serve this pair (creating the cache entry), for diagnostics.
    pub fn backend_for(&self, local: &MemoryDesc, remote: &MemoryDesc) -> IoResult<BackendKind> {
        let peer = self.inner.remote(&remote.engine_key)?;
        Ok(self.inner.choose(local, remote, &peer)?.kind())
    }

    pub(crate) fn own(&self, d: &MemoryDesc) -> IoResult<()> {
        if d.engine_key != self.inner.desc.key {
            return Err(IoError::invalid(format!(
                "memory {} belongs to engine {:?}, not to this engine {:?}",
                d.id, d.engine_key, self.inner.desc.key
            )));
        }
        Ok(())
    }
}

/// `RemoteDisconnect` unless `remote` was registered by the incarnation of its engine that is
/// registered here (`peer`).
pub(crate) fn check_incarnation(remote: &MemoryDesc, peer: &EngineDesc) -> IoResult<()> {
    if remote.engine_epoch == peer.epoch {
        return Ok(());
    }
    Err(IoError::disconnected(format!(
        "stale descriptor: memory {} was registered by engine {:?} epoch {:#x}, but the engine of that key now has epoch {:#x} \
         (pid {}): it restarted or was replaced; take a fresh descriptor from it (or lookup_remote_memory)",
        remote.id, remote.engine_key, remote.engine_epoch, peer.epoch, peer.pid
    )))
}

impl Drop for IoEngine {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        // The listener and connection threads hold the engine's state for up to their poll
        // interval. Backends own device resources: were the last reference dropped there, a
        // process returning from main could see the GPU driver torn down first
        // (CUDA_ERROR_DEINITIALIZED when destroying streams). So they go now, here.
        self.inner.choice.lock().clear();
        let backends = std::mem::take(&mut *self.inner.backends.write());
        drop(backends);
    }
}

impl EngineInner {
    pub(crate) fn backend(&self, k: BackendKind) -> Option<Arc<dyn Backend>> {
        self.backends.read().iter().find(|b| b.kind() == k).cloned()
    }

    /// The registration of local region `id` (held: deregistration waits for it).
    pub(crate) fn local_region(&self, id: MemId) -> IoResult<Arc<Region>> {
        self.registry.get(id)
    }

    pub(crate) fn local_memory(&self, id: MemId) -> Option<MemoryDesc> {
        self.local_descs.read().get(&id).cloned()
    }

    pub(crate) fn registered_remote(&self, key: &str) -> Option<Arc<EngineDesc>> {
        self.remotes.read().get(key).cloned()
    }

    pub(crate) fn remote(&self, key: &str) -> IoResult<Arc<EngineDesc>> {
        self.remotes.read().get(key).cloned().ok_or_else(|| {
            IoError::not_found(format!("engine {key:?} is not registered here; call register_remote_engine with its descriptor"))
        })
    }

    /// Asks the backends in preference order; caches and logs the choice and the refusals.
    fn choose(&self, local: &MemoryDesc, remote: &MemoryDesc, peer: &EngineDesc) -> IoResult<Arc<dyn Backend>> {
        let key = (peer.key.clone(), local.id, remote.id);
        if let Some(b) = self.choice.lock().get(&key) {
            return Ok(b.clone());
        }
        let backends = self.backends.read().clone();
        if backends.is_empty() {
            return Err(IoError::not_supported(format!("engine {:?} has no backend; call create_backend first", self.desc.key)));
        }
        let mut refusals: Vec<Refusal> = Vec::new();
        for b in backends {
            match b.can_serve(local, remote, peer) {
                Ok(()) => {
                    for r in &refusals {
                        tracing::info!(backend = %r.backend, reason = %r.reason, "backend refused");
                    }
                    tracing::info!(
                        backend = %b.kind(), local_mem = local.id, peer = %peer.key, remote_mem = remote.id,
                        "backend chosen"
                    );
                    self.choice.lock().insert(key, b.clone());
                    return Ok(b);
                }
                Err(r) => refusals.push(r),
            }
        }
        let list: Vec<String> = refusals.iter().map(|r| r.to_string()).collect();
        Err(IoError::not_supported(format!(
            "no backend can move local memory {} -> engine {:?} memory {}: {}",
            local.id,
            peer.key,
            remote.id,
            list.join("; ")
        )))
    }

    fn lookup(&self, key: &str, id: MemId) -> IoResult<MemoryDesc> {
        let peer = self.remote(key)?;
        match self.ctrl.call(&peer, &CtrlRequest::LookupMemory(id), &format!("looking up memory {id}"))? {
            CtrlReply::Memory(d) => Ok(d),
            other => Err(IoError::transport(format!("engine {key:?} sent an unexpected control reply {other:?}"))),
        }
    }
}

#[cfg(test)]
#[path = "engine_multi_tests.rs"]
mod multi_tests;
