//! The backend proper: registrations, connections, posting, completion reaping.

use crate::config::{PollMode, RdmaConfig};
use crate::conn::{connect_qps, create_qps, endpoint, psn, Conn, QpParams, RdmaCtrl};
use crate::device::{open, Device};
use crate::dmabuf::{dmabuf_mr_args, reg_dmabuf_error, DmabufExporter, RuntimeDmabuf};
use crate::RdmaMemHandle;
use mori_io_core::status::Completion;
use mori_io_core::wr_plan::{plan_wrs, EndpointLimits, WrPlanConfig};
use mori_io_core::{
    Backend, BackendContext, BackendHandle, BackendKind, EngineDesc, EntryMap, IoError, IoResult, MemId, MemLoc, MemoryDesc, Op, Refusal,
    Region, TransferRequest, TransferStatus,
};
use mori_mr::{MemDomain, MrCache, MrError, RegId, Registrar};
use parking_lot::Mutex;
use rdma_mummy_sys::ibv_sge;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::queue_pair::{PostSendGuard, QueuePair, SetInlineData, SetScatterGatherEntry, WorkRequestFlags};
use sideway::ibverbs::AccessFlags;
use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receive buffers posted per target-side QP (for completion notifications).
const RECV_DEPTH: usize = 64;
/// Size of one notification message and receive buffer, bytes.
const NOTE: usize = 16;
const KIND_RECV: u64 = 1 << 62;

type PostJob = Box<dyn FnOnce() + Send>;

/// One posted transfer. Its status has one piece per signaled chunk, so it turns terminal
/// only when every chunk completed, failed or was never posted: no WR of it moves bytes then.
/// A failed chunk's entries are named from the remote span its WRs covered.
struct Xfer {
    status: TransferStatus,
    /// Chunks not ended yet; the last successful end notifies the target first.
    remaining: AtomicUsize,
    /// Set (before the decrement) by every failed end: the target is then not notified.
    failed: AtomicBool,
    id: u64,
    conn: Arc<Conn>,
    _region: Arc<Region>,
    /// The request's segments and entry map, for naming failed entries.
    segs: Vec<mori_io_core::Seg>,
    entries: Arc<EntryMap>,
    /// The plan's queues (posted from here; a failed chunk's WRs are looked up in them).
    queues: Vec<mori_io_core::wr_plan::QpWrs>,
}

impl Xfer {
    /// Ends `n` chunks that failed with `e`; `wrs` are their WRs (each named by the caller's
    /// batch entries it carried).
    fn fail<'a>(&self, n: usize, wrs: impl Iterator<Item = &'a mori_io_core::wr_plan::Wr>, e: IoError) {
        if n == 0 {
            return;
        }
        let mut ranges: Vec<std::ops::Range<u32>> =
            wrs.filter_map(|w| self.entries.of_remote(&self.segs, w.remote_off..w.remote_off + w.len)).collect();
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<std::ops::Range<u32>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(m) if r.start <= m.end => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let e = match merged.as_slice() {
            [] => e,
            [r] => IoError::new(e.code, format!("{}: {}", EntryMap::describe(r), e.msg)),
            [r, rest @ ..] => IoError::new(e.code, format!("{} and {} more entry ranges: {}", EntryMap::describe(r), rest.len(), e.msg)),
        };
        self.failed.store(true, Ordering::Release);
        self.remaining.fetch_sub(n, Ordering::AcqRel);
        self.status.cancel_pieces_in(n as u32, merged, e);
    }

    /// Ends one chunk that succeeded. Returns true when it was the transfer's last end and no
    /// chunk failed: the caller then notifies the target and completes the last piece itself.
    fn chunk_ok(&self) -> bool {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 && !self.failed.load(Ordering::Acquire) {
            return true;
        }
        self.status.complete_piece(Ok(()));
        false
    }
}

/// Signaled WRs (= chunks posted by `post_chunk`) of `wrs`, the tail of a queue.
fn chunks_in(wrs: &[mori_io_core::wr_plan::Wr]) -> usize {
    wrs.iter().enumerate().filter(|(i, w)| w.signaled || i + 1 == wrs.len()).count()
}

struct Piece {
    xfer: Option<Arc<Xfer>>,
    conn: Arc<Conn>,
    qp: usize,
    covered: usize,
    /// Where the chunk's WRs are in its transfer's plan: queue index and WR range.
    wrs: (usize, std::ops::Range<usize>),
}

struct InboundConn {
    from: String,
    conn: Conn,
    bufs: Box<[u8]>,
    mr: Arc<MemoryRegion>,
}

struct Inner {
    ctx: BackendContext,
    cfg: RdmaConfig,
    params: QpParams,
    dev: Device,
    cq: Arc<BasicCompletionQueue>,
    /// Completion channel: the reaper sleeps on it when the CQ stays empty (at once in event
    /// mode, after `poll_spin` of spinning in polling mode).
    channel: Arc<CompletionChannel>,
    /// Engine region id -> (cache registration, lkey).
    mrs: Mutex<HashMap<MemId, (RegId, u32)>>,
    mr_cache: Mutex<MrCache<VerbsRegistrar>>,
    out: Mutex<HashMap<String, Arc<Conn>>>,
    inbound: Mutex<HashMap<u32, Arc<InboundConn>>>,
    inbound_by_peer: Mutex<HashMap<String, u32>>,
    pieces: Mutex<HashMap<u64, Piece>>,
    notes: Mutex<VecDeque<(Arc<Conn>, [u8; NOTE])>>,
    /// Posting threads 1..workers (worker 0 posts on the caller's thread).
    posters: Vec<Mutex<std::sync::mpsc::Sender<PostJob>>>,
    next_piece: AtomicU64,
    next_token: AtomicU32,
    next_conn: AtomicU64,
    /// Held while the CQ is polled: by the completion thread, or by one waiter at a time
    /// (through [`mori_io_core::Progress`]).
    poll_lock: Mutex<()>,
    /// Bumped by every waiter-driven poll: while it moves, a waiter reaps the CQ itself and
    /// the completion thread stands back (one thread spinning on the CQ, not two).
    driven: AtomicU64,
    shutdown: AtomicBool,
}

/// How long the completion thread sleeps between looks while a waiter drives completions
/// (`mori_gpu::CopyPool` stands back the same way for 50 µs, as it also hands the queued
/// target notifications to their thread on each look; here notifications are posted inline by
/// whoever completes the transfer, so a longer look interval costs nothing here).
const STAND_BACK: Duration = Duration::from_micros(200);

/// The RDMA transport (see the crate docs).
pub struct RdmaBackend {
    inner: Arc<Inner>,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl RdmaBackend {
    /// Opens the device and starts the completion thread.
    /// Errors: `InvalidArgs`/`NotSupported` from the config; `NotSupported` naming why no
    /// device or active port is usable; `Transport` for a failing verbs call.
    pub fn new(ctx: BackendContext, cfg: RdmaConfig) -> IoResult<Self> {
        cfg.validate()?;
        let dev = open(&cfg)?;
        let params = QpParams {
            traffic_class: cfg.traffic_class,
            service_level: cfg.service_level,
            max_send_wr: cfg.max_send_wr.min(dev.max_qp_wr),
            max_recv_wr: RECV_DEPTH as u32,
            max_sge: cfg.max_msg_sge.min(dev.max_sge),
        };
        let cqe = cfg.max_cqe.min(dev.max_cqe);
        let mr_budget = cfg.mr_budget;
        let dev_name = dev.name.clone();
        let dmabuf: Arc<dyn DmabufExporter> = match &cfg.dmabuf {
            Some(s) => s.0.clone(),
            None => Arc::new(RuntimeDmabuf::new()),
        };
        let pd = dev.pd.clone();
        let channel = CompletionChannel::new(&dev.ctx).map_err(|e| IoError::transport(format!("{}: completion channel: {e}", dev.name)))?;
        channel.set_nonblocking(true).map_err(|e| IoError::transport(format!("completion channel: {e}")))?;
        let mut cqb = dev.ctx.create_cq_builder();
        cqb.setup_cqe(cqe);
        cqb.setup_comp_channel(&channel, 0);
        let cq = cqb.build().map_err(|e| IoError::transport(format!("{}: create CQ of {cqe}: {e}", dev.name)))?;
        let mut posters = Vec::new();
        for w in 1..cfg.workers {
            let (tx, rx) = std::sync::mpsc::channel::<PostJob>();
            std::thread::Builder::new()
                .name(format!("mori-rdma-post{w}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .map_err(|e| IoError::transport(format!("spawn rdma posting thread: {e}")))?;
            posters.push(Mutex::new(tx));
        }
        let inner = Arc::new(Inner {
            posters,
            ctx,
            cfg,
            params,
            dev,
            cq,
            channel,
            mrs: Mutex::new(HashMap::new()),
            mr_cache: Mutex::new(MrCache::new(VerbsRegistrar { pd: pd.clone(), dev: dev_name, dmabuf }, mr_budget)),
            out: Mutex::new(HashMap::new()),
            inbound: Mutex::new(HashMap::new()),
            inbound_by_peer: Mutex::new(HashMap::new()),
            pieces: Mutex::new(HashMap::new()),
            notes: Mutex::new(VecDeque::new()),
            next_piece: AtomicU64::new(1),
            next_token: AtomicU32::new(1),
            next_conn: AtomicU64::new(1),
            poll_lock: Mutex::new(()),
            driven: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
        });
        let i2 = inner.clone();
        let h = std::thread::Builder::new()
            .name("mori-rdma-cq".into())
            .spawn(move || i2.reap_loop())
            .map_err(|e| IoError::transport(format!("spawn rdma completion thread: {e}")))?;
        Ok(RdmaBackend { inner, poller: Mutex::new(Some(h)) })
    }

    /// Name of the device in use.
    pub fn device_name(&self) -> &str {
        &self.inner.dev.name
    }
}

impl Drop for RdmaBackend {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        if let Some(h) = self.poller.lock().take() {
            let _ = h.join();
        }
    }
}

/// The registration cache's leaf calls: `ibv_reg_mr` for host memory, a dmabuf export plus
/// `ibv_reg_dmabuf_mr` for GPU memory; `ibv_dereg_mr` when the last reference goes.
struct VerbsRegistrar {
    pd: Arc<sideway::ibverbs::protection_domain::ProtectionDomain>,
    /// Device name, for errors.
    dev: String,
    /// Where GPU ranges' dmabufs come from.
    dmabuf: Arc<dyn DmabufExporter>,
}

impl VerbsRegistrar {
    /// GPU memory: export a dmabuf of the range and register exactly the range in it, with
    /// the range's GPU address as iova. The dmabuf fd is closed afterwards (the MR holds its
    /// own reference to the dmabuf).
    fn register_gpu(&self, device: u32, addr: u64, len: u64, flags: AccessFlags) -> Result<Arc<MemoryRegion>, IoError> {
        let buf = self.dmabuf.export(device, addr, len)?;
        let a = dmabuf_mr_args(addr, len, buf.start, buf.len, buf.offset)?;
        // SAFETY: `buf.fd` is a dmabuf covering `a.offset..a.offset+a.len` (checked against
        // the exporter's window), of memory the engine's caller keeps alive until
        // deregistration, when on_deregister invalidates the cache entry.
        let r = unsafe { self.pd.reg_dmabuf_mr(a.offset, a.len, a.iova, buf.fd.as_raw_fd(), flags) };
        r.map_err(|e| {
            let (errno, text) = match &e.0 {
                sideway::ibverbs::memory_region::RegisterMemoryRegionErrorKind::Ibverbs(io) => (io.raw_os_error(), io.to_string()),
                other => (None, other.to_string()),
            };
            reg_dmabuf_error(&self.dev, device, addr, &a, errno, &text)
        })
    }
}

impl Registrar for VerbsRegistrar {
    type Handle = Arc<MemoryRegion>;
    type Error = IoError;
    fn register(&mut self, domain: MemDomain, addr: u64, len: u64) -> Result<Arc<MemoryRegion>, IoError> {
        let flags = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
        match domain {
            // SAFETY: ranges come from engine registrations, whose caller promised validity
            // until deregistration; on_deregister releases and invalidates the cache entry then.
            MemDomain::Host => unsafe { self.pd.reg_mr(addr as usize, len as usize, flags) }
                .map_err(|e| IoError::transport(format!("{}: ibv_reg_mr of {len} bytes at {addr:#x}: {e}", self.dev))),
            MemDomain::Gpu(device) => self.register_gpu(device, addr, len, flags),
        }
    }
    fn deregister(&mut self, handle: Arc<MemoryRegion>) {
        drop(handle); // ibv_dereg_mr when the last reference goes
    }
}

/// The hint attached to an error completion (`ibv_wc_status` value).
pub fn wc_hint(status: u32) -> (mori_io_core::ErrorCode, String) {
    use mori_io_core::ErrorCode::*;
    match status {
        5 => (Transport, "work request flushed (the QP failed on an earlier error)".into()),
        10 => (InvalidArgs, "remote access error: the remote range is out of bounds or not registered (rkey)".into()),
        12 => (RemoteDisconnect, "transport retry counter exceeded: the peer is unreachable or gone; check the GID index (MORI_IB_GID_INDEX), traffic class and service level (MORI_IO_TC/MORI_IO_SL)".into()),
        13 => (Transport, "receiver not ready (RNR) retries exceeded: the peer's receive queue is empty (receive depth)".into()),
        4 | 8 => (InvalidArgs, "local protection/access error: the local range is not inside a registration".into()),
        1 => (InvalidArgs, "local length error".into()),
        s => (Transport, format!("work completion status {s}")),
    }
}

impl Inner {
    fn conn_for(&self, peer: &EngineDesc) -> IoResult<Arc<Conn>> {
        if let Some(c) = self.out.lock().get(&peer.key) {
            if !c.broken.load(Ordering::Acquire) {
                return Ok(c.clone());
            }
        }
        let n = self.cfg.qps_per_transfer;
        let mut qps = create_qps(&self.dev, &self.cq, n, &self.params)?;
        let psns: Vec<u32> = (0..n).map(psn).collect();
        let ep = endpoint(&self.dev, &qps, &psns);
        let conn_id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let req = postcard::to_allocvec(&RdmaCtrl::Connect { conn_id, ep }).map_err(|e| IoError::invalid(e.to_string()))?;
        let rep = self.ctx.ctrl.request(peer, BackendKind::Rdma, req)?;
        let remote = match postcard::from_bytes::<RdmaCtrl>(&rep) {
            Ok(RdmaCtrl::Accepted(ep)) => ep,
            other => return Err(IoError::transport(format!("engine {:?} answered the rdma connect with {other:?}", peer.key))),
        };
        connect_qps(&self.dev, &mut qps, &psns, &remote, &self.params)?;
        let c = Arc::new(Conn {
            peer: peer.key.clone(),
            outstanding: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            qps: qps.into_iter().map(Mutex::new).collect(),
            broken: AtomicBool::new(false),
            max_msg_sz: self.dev.max_msg_sz.min(remote.max_msg_sz).max(1),
        });
        tracing::info!(peer = %peer.key, qps = n, device = %self.dev.name, "rdma connection established");
        self.out.lock().insert(peer.key.clone(), c.clone());
        Ok(c)
    }

    fn accept(&self, from: &EngineDesc, conn_id: u64, ep: crate::conn::Endpoint) -> IoResult<Vec<u8>> {
        let n = ep.qps.len();
        if n == 0 || n > 64 {
            return Err(IoError::invalid(format!("engine {:?} asks for {n} QPs (1..=64)", from.key)));
        }
        let mut qps = create_qps(&self.dev, &self.cq, n, &self.params)?;
        let psns: Vec<u32> = (0..n).map(|i| psn(i + 7)).collect();
        let mine = endpoint(&self.dev, &qps, &psns);
        let mut bufs = vec![0u8; n * RECV_DEPTH * NOTE].into_boxed_slice();
        // SAFETY: `bufs` is owned by the InboundConn together with its MR; the MR is dropped
        // (deregistered) before or with the buffer, and the QPs using it are dropped with it.
        let mr = unsafe { self.dev.pd.reg_mr(bufs.as_mut_ptr() as usize, bufs.len(), AccessFlags::LocalWrite) }
            .map_err(|e| IoError::transport(format!("register receive buffers: {e}")))?;
        connect_qps(&self.dev, &mut qps, &psns, &ep, &self.params)?;
        let token = self.next_token.fetch_add(1, Ordering::Relaxed) & 0x3fff_ffff;
        let ic = Arc::new(InboundConn {
            from: from.key.clone(),
            conn: Conn {
                peer: from.key.clone(),
                outstanding: (0..n).map(|_| AtomicUsize::new(0)).collect(),
                qps: qps.into_iter().map(Mutex::new).collect(),
                broken: AtomicBool::new(false),
                max_msg_sz: self.dev.max_msg_sz.min(ep.max_msg_sz),
            },
            bufs,
            mr,
        });
        for q in 0..n {
            for b in 0..RECV_DEPTH {
                post_recv(&ic, token, q, b)?;
            }
        }
        self.inbound.lock().insert(token, ic);
        // A reconnecting initiator replaces its previous connection.
        if let Some(old) = self.inbound_by_peer.lock().insert(from.key.clone(), token) {
            self.inbound.lock().remove(&old);
        }
        tracing::info!(peer = %from.key, conn_id, qps = n, "rdma connection accepted");
        postcard::to_allocvec(&RdmaCtrl::Accepted(mine)).map_err(|e| IoError::invalid(e.to_string()))
    }

    fn post(self: &Arc<Self>, req: TransferRequest, status: &TransferStatus) -> IoResult<()> {
        let region = req.local_region.clone();
        let lkey = self
            .mrs
            .lock()
            .get(&req.local.id)
            .map(|m| m.1)
            .ok_or_else(|| IoError::not_found(format!("local memory {} has no rdma registration", req.local.id)))?;
        let rh = remote_handle(&req.remote)?;
        let conn = self.conn_for(&req.peer)?;
        let limits = EndpointLimits {
            max_msg_sz: conn.max_msg_sz,
            max_sge: self.params.max_sge as usize,
            max_send_wr: self.params.max_send_wr as usize,
        };
        let pc = WrPlanConfig {
            chunking: self.cfg.chunking,
            chunk_bytes: self.cfg.chunk_bytes,
            max_chunks: self.cfg.max_chunks,
            num_qps: conn.qps.len(),
            num_nics: 1,
            workers: self.cfg.workers,
        };
        let plan = plan_wrs(&req.segs, &limits, &pc, req.id)?;
        if plan.signaled == 0 {
            status.complete_piece(Ok(()));
            return Ok(());
        }
        let chunks =
            u32::try_from(plan.signaled).map_err(|_| IoError::invalid(format!("{} signaled WRs in one transfer", plan.signaled)))?;
        status.add_pieces(chunks - 1);
        let xfer = Arc::new(Xfer {
            status: status.clone(),
            remaining: AtomicUsize::new(plan.signaled),
            failed: AtomicBool::new(false),
            id: req.id,
            conn: conn.clone(),
            _region: region.clone(),
            segs: req.segs,
            entries: req.entries,
            queues: plan.queues,
        });
        // Worker 0's queues are posted here; the others' on the posting threads (the seed's
        // --num-worker-threads), in parallel.
        let laddr = region.addr as u64;
        let mut mine = Vec::new();
        let mut others: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, q) in xfer.queues.iter().enumerate() {
            if q.worker == 0 || self.posters.is_empty() {
                mine.push(i);
            } else {
                others.entry(q.worker).or_default().push(i);
            }
        }
        for (w, queues) in others {
            let (me, conn, x) = (self.clone(), conn.clone(), xfer.clone());
            let op = req.op;
            let job: PostJob = Box::new(move || me.post_queues(&conn, &queues, &x, op, lkey, laddr, rh));
            let tx = &self.posters[(w - 1) % self.posters.len()];
            if let Err(e) = tx.lock().send(job) {
                (e.0)();
            }
        }
        self.post_queues(&conn, &mine, &xfer, req.op, lkey, laddr, rh);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn post_queues(&self, conn: &Arc<Conn>, queues: &[usize], xfer: &Arc<Xfer>, op: Op, lkey: u32, laddr: u64, rh: RdmaMemHandle) {
        for (k, &qi) in queues.iter().enumerate() {
            let q = &xfer.queues[qi];
            let mut start = 0;
            for (i, wr) in q.wrs.iter().enumerate() {
                if wr.signaled || i + 1 == q.wrs.len() {
                    if let Err(e) = self.post_chunk(conn, (qi, start..i + 1), xfer, op, lkey, laddr, rh) {
                        // The chunks not posted will never complete: end them now, with the
                        // reason (the status still waits for the posted ones).
                        let later = queues[k + 1..].iter().map(|&j| &xfer.queues[j]);
                        let n = chunks_in(&q.wrs[start..]) + later.clone().map(|q| chunks_in(&q.wrs)).sum::<usize>();
                        xfer.fail(n, q.wrs[start..].iter().chain(later.flat_map(|q| q.wrs.iter())), e);
                        return;
                    }
                    start = i + 1;
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn post_chunk(
        &self,
        conn: &Arc<Conn>,
        at: (usize, std::ops::Range<usize>),
        xfer: &Arc<Xfer>,
        op: Op,
        lkey: u32,
        laddr: u64,
        rh: RdmaMemHandle,
    ) -> IoResult<()> {
        let q = &xfer.queues[at.0];
        let (qp, wrs) = (q.qp, &q.wrs[at.1.clone()]);
        let cap = self.params.max_send_wr as usize;
        let deadline = Instant::now() + self.cfg.sq_timeout;
        let mut spins = 0u32;
        while conn.outstanding[qp].load(Ordering::Acquire) + wrs.len() > cap {
            if conn.broken.load(Ordering::Acquire) {
                return Err(IoError::transport(format!("rdma connection to engine {:?} failed earlier", conn.peer)));
            }
            if Instant::now() >= deadline {
                return Err(IoError::timeout(format!(
                    "send queue of QP {qp} to engine {:?} stayed full ({} of {cap} WRs outstanding) for {:?} (MORI_IO_SQ_BACKOFF_TIMEOUT_US)",
                    conn.peer,
                    conn.outstanding[qp].load(Ordering::Acquire),
                    self.cfg.sq_timeout
                )));
            }
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            }
        }
        let key = self.next_piece.fetch_add(1, Ordering::Relaxed) & (KIND_RECV - 1);
        self.pieces.lock().insert(key, Piece { xfer: Some(xfer.clone()), conn: conn.clone(), qp, covered: wrs.len(), wrs: at });
        conn.outstanding[qp].fetch_add(wrs.len(), Ordering::AcqRel);
        let r = {
            let mut q = conn.qps[qp].lock();
            let mut g = q.start_post_send();
            let mut sges: Vec<ibv_sge> = Vec::with_capacity(self.params.max_sge as usize);
            for wr in wrs {
                let flags = if wr.signaled || std::ptr::eq(wr, &wrs[wrs.len() - 1]) {
                    WorkRequestFlags::Signaled
                } else {
                    WorkRequestFlags::none()
                };
                let h = g.construct_wr(key, flags);
                let h = match op {
                    Op::Write => h.setup_write(rh.rkey, rh.addr + wr.remote_off),
                    Op::Read => h.setup_read(rh.rkey, rh.addr + wr.remote_off),
                };
                sges.clear();
                sges.extend(wr.sges.iter().map(|s| ibv_sge { addr: laddr + s.local_off, length: s.len as u32, lkey }));
                // SAFETY: every SGE lies inside the local registration (the engine checked the
                // batch against the region; `xfer` holds the region until completion).
                unsafe { h.setup_sge_list(&sges) };
            }
            g.post()
        };
        if let Err(e) = r {
            self.pieces.lock().remove(&key);
            conn.outstanding[qp].fetch_sub(wrs.len(), Ordering::AcqRel);
            return Err(IoError::transport(format!("ibv_post_send on QP {qp} to engine {:?}: {e}", conn.peer)));
        }
        Ok(())
    }

    /// The completion thread: reaps while completions come; once the CQ stayed empty for the
    /// spin budget (none in event mode), sleeps on the completion channel. While a waiter
    /// polls the CQ itself (`driven` moves) it only looks again every [`STAND_BACK`].
    fn reap_loop(&self) {
        let spin = match self.cfg.poll_mode {
            PollMode::Event => Duration::ZERO,
            PollMode::Polling => self.cfg.poll_spin,
        };
        let mut idle_since: Option<Instant> = None;
        let mut empty = 0u32;
        let mut seen = self.driven.load(Ordering::Acquire);
        while !self.shutdown.load(Ordering::Acquire) {
            let d = self.driven.load(Ordering::Acquire);
            if d != seen {
                seen = d;
                idle_since = None;
                std::thread::sleep(STAND_BACK);
                continue;
            }
            let n = self.poll_locked();
            self.flush_notes();
            if n > 0 {
                idle_since = None;
                empty = 0;
                continue;
            }
            empty = empty.wrapping_add(1);
            // The clock is read every 64 empty polls only.
            if spin.is_zero() || empty.is_multiple_of(64) {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= spin {
                    self.wait_event(&self.channel);
                    idle_since = None;
                    continue;
                }
            }
            // No sched_yield here: in the SoftRoCE A/B (docs/PERFORMANCE.md) a reaper that
            // yielded while spinning lost 64 KiB write bandwidth against one that does not.
            std::hint::spin_loop();
        }
    }

    /// [`Self::poll_once`] under the poll lock.
    fn poll_locked(&self) -> usize {
        let _g = self.poll_lock.lock();
        self.poll_once()
    }

    /// Reaps what the CQ holds (the caller holds `poll_lock`).
    fn poll_once(&self) -> usize {
        let mut n = 0;
        if let Ok(p) = self.cq.start_poll() {
            for wc in p {
                n += 1;
                self.on_completion(wc.wr_id(), wc.status());
            }
        }
        n
    }

    /// Arms the CQ, re-polls (a completion may have raced the arming), then sleeps on the
    /// completion channel's fd for up to 100 ms (to notice shutdown) and consumes the event.
    fn wait_event(&self, ch: &CompletionChannel) {
        // SAFETY: the CQ and channel outlive this call (owned by `self`); the calls take their
        // raw handles and out-pointers to locals.
        unsafe {
            let cq = self.cq.cq().as_ptr();
            if rdma_mummy_sys::ibv_req_notify_cq(cq, 0) != 0 {
                std::thread::sleep(Duration::from_micros(200));
                return;
            }
            if self.poll_locked() > 0 {
                return;
            }
            let mut p = libc::pollfd { fd: ch.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            if libc::poll(&mut p, 1, 100) > 0 {
                let mut ev_cq: *mut rdma_mummy_sys::ibv_cq = std::ptr::null_mut();
                let mut ctx: *mut libc::c_void = std::ptr::null_mut();
                if rdma_mummy_sys::ibv_get_cq_event(ch.comp_channel().as_ptr(), &mut ev_cq, &mut ctx) == 0 {
                    rdma_mummy_sys::ibv_ack_cq_events(ev_cq, 1);
                }
            }
        }
    }

    fn on_completion(&self, wr_id: u64, status: u32) {
        if wr_id & KIND_RECV != 0 {
            let token = ((wr_id >> 32) & 0x3fff_ffff) as u32;
            let (qp, buf) = (((wr_id >> 16) & 0xffff) as usize, (wr_id & 0xffff) as usize);
            let Some(ic) = self.inbound.lock().get(&token).cloned() else { return };
            if status != 0 {
                return; // flushed at teardown
            }
            let off = (qp * RECV_DEPTH + buf) * NOTE;
            let mut id = [0u8; 8];
            id.copy_from_slice(&ic.bufs[off..off + 8]);
            self.ctx.inbound.piece_done(&ic.from, u64::from_le_bytes(id), 1, Ok(()));
            if let Err(e) = post_recv(&ic, token, qp, buf) {
                tracing::warn!(peer = %ic.from, error = %e, "cannot repost an rdma receive buffer");
            }
            return;
        }
        let Some(p) = self.pieces.lock().remove(&wr_id) else { return };
        let _ = p.conn.outstanding[p.qp].fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| Some(o.saturating_sub(p.covered)));
        if status != 0 {
            p.conn.broken.store(true, Ordering::Release);
            let (code, hint) = wc_hint(status);
            let err = IoError::new(code, format!("rdma work request to engine {:?} failed on QP {}: {hint}", p.conn.peer, p.qp));
            match p.xfer {
                Some(x) => {
                    let (qi, r) = p.wrs;
                    x.fail(1, x.queues[qi].wrs[r].iter(), err);
                }
                None => tracing::warn!(error = %err, "rdma notification failed"),
            }
            return;
        }
        if let Some(x) = p.xfer {
            if x.chunk_ok() {
                let mut note = [0u8; NOTE];
                note[..8].copy_from_slice(&x.id.to_le_bytes());
                self.notes.lock().push_back((x.conn.clone(), note));
                self.flush_notes();
                x.status.complete_piece(Ok(()));
            }
        }
    }

    /// Posts pending notifications where QP 0 of their connection has room.
    fn flush_notes(&self) {
        let mut q = self.notes.lock();
        let cap = self.params.max_send_wr as usize;
        let mut keep = VecDeque::new();
        while let Some((conn, note)) = q.pop_front() {
            if conn.broken.load(Ordering::Acquire) {
                continue;
            }
            if conn.outstanding[0].load(Ordering::Acquire) + 1 > cap {
                keep.push_back((conn, note));
                continue;
            }
            let key = self.next_piece.fetch_add(1, Ordering::Relaxed) & (KIND_RECV - 1);
            self.pieces.lock().insert(key, Piece { xfer: None, conn: conn.clone(), qp: 0, covered: 1, wrs: (0, 0..0) });
            conn.outstanding[0].fetch_add(1, Ordering::AcqRel);
            let r = {
                let mut qp = conn.qps[0].lock();
                let mut g = qp.start_post_send();
                g.construct_wr(key, WorkRequestFlags::Signaled).setup_send().setup_inline_data(&note);
                g.post()
            };
            if let Err(e) = r {
                self.pieces.lock().remove(&key);
                conn.outstanding[0].fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(peer = %conn.peer, error = %e, "cannot post an rdma notification");
            }
        }
        *q = keep;
    }
}

impl mori_io_core::Progress for Inner {
    /// A waiter's poll of the CQ (skipped while another thread polls it).
    fn progress(&self) -> bool {
        self.driven.fetch_add(1, Ordering::AcqRel);
        let n = match self.poll_lock.try_lock() {
            Some(_g) => self.poll_once(),
            None => return false,
        };
        if n > 0 {
            self.flush_notes();
        }
        n > 0
    }
}

fn post_recv(ic: &InboundConn, token: u32, qp: usize, buf: usize) -> IoResult<()> {
    let wr_id = KIND_RECV | (u64::from(token) << 32) | ((qp as u64) << 16) | buf as u64;
    let addr = ic.bufs.as_ptr() as u64 + ((qp * RECV_DEPTH + buf) * NOTE) as u64;
    let mut q = ic.conn.qps[qp].lock();
    let mut g = q.start_post_recv();
    // SAFETY: the buffer slot lies inside `ic.bufs`, registered as `ic.mr`, both owned by `ic`.
    unsafe { g.construct_wr(wr_id).setup_sge(ic.mr.lkey(), addr, NOTE as u32) };
    g.post().map_err(|e| IoError::transport(format!("ibv_post_recv: {e}")))
}

/// The registration-cache domain of an engine memory location.
fn domain_of(loc: MemLoc) -> MemDomain {
    match loc {
        MemLoc::Host { .. } => MemDomain::Host,
        MemLoc::Gpu { device } => MemDomain::Gpu(device),
    }
}

/// A registration-cache error as an engine error: the registrar's own error keeps its code
/// (e.g. `NotSupported` for a device without dmabuf MRs), budget errors are `InvalidArgs`.
fn mr_error(dev: &str, e: MrError) -> IoError {
    match e {
        MrError::Register { source, .. } => match source.downcast::<IoError>() {
            Ok(io) => *io,
            Err(other) => IoError::transport(format!("{dev}: rdma registration: {other}")),
        },
        e @ (MrError::TooLarge { .. } | MrError::OverBudget { .. } | MrError::InvalidRange { .. }) => {
            IoError::invalid(format!("{dev}: rdma registration: {e} (MORI_IO_MR_BUDGET_BYTES)"))
        }
        e => IoError::bad_state(format!("{dev}: rdma registration: {e}")),
    }
}

fn remote_handle(remote: &MemoryDesc) -> IoResult<RdmaMemHandle> {
    let b = remote
        .handle(BackendKind::Rdma)
        .ok_or_else(|| IoError::invalid(format!("remote memory {} of engine {:?} carries no rdma key", remote.id, remote.engine_key)))?;
    postcard::from_bytes(b).map_err(|e| IoError::invalid(format!("remote memory {}: bad rdma handle: {e}", remote.id)))
}

impl Backend for RdmaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Rdma
    }

    fn handles_gpu_memory(&self) -> bool {
        true // through dmabuf MRs
    }

    fn on_register(&self, desc: &mut MemoryDesc) -> IoResult<()> {
        // A range already registered (e.g. the same buffer registered twice) reuses its MR.
        let mut cache = self.inner.mr_cache.lock();
        let id = cache.acquire(domain_of(desc.loc), desc.addr, desc.len).map_err(|e| mr_error(&self.inner.dev.name, e))?;
        let Some(mr) = cache.handle(id) else {
            return Err(IoError::bad_state(format!("MR cache lost registration {id}")));
        };
        let (lkey, rkey) = (mr.lkey(), mr.rkey());
        drop(cache);
        let h = RdmaMemHandle { rkey, addr: desc.addr };
        desc.handles.retain(|x| x.backend != BackendKind::Rdma);
        desc.handles.push(BackendHandle {
            backend: BackendKind::Rdma,
            bytes: postcard::to_allocvec(&h).map_err(|e| IoError::invalid(e.to_string()))?,
        });
        self.inner.mrs.lock().insert(desc.id, (id, lkey));
        Ok(())
    }

    fn on_deregister(&self, desc: &MemoryDesc) -> IoResult<()> {
        let Some((id, _)) = self.inner.mrs.lock().remove(&desc.id) else { return Ok(()) };
        let mut cache = self.inner.mr_cache.lock();
        cache.release(id).map_err(|e| IoError::bad_state(format!("rdma deregistration: {e}")))?;
        // The memory may be freed and its addresses reused: never keep an MR of it cached.
        cache.invalidate(domain_of(desc.loc), desc.addr, desc.len);
        Ok(())
    }

    fn can_serve(&self, local: &MemoryDesc, remote: &MemoryDesc, _peer: &EngineDesc) -> Result<(), Refusal> {
        let refuse = |reason: String| Err(Refusal { backend: BackendKind::Rdma, reason });
        if remote.handle(BackendKind::Rdma).is_none() {
            return refuse(format!(
                "remote memory {} of engine {:?} carries no rdma key (its engine has no rdma backend, or registered it first)",
                remote.id, remote.engine_key
            ));
        }
        if !self.inner.mrs.lock().contains_key(&local.id) {
            return refuse(format!("local memory {} was registered before the rdma backend existed", local.id));
        }
        Ok(())
    }

    fn connect(&self, peer: &EngineDesc) -> IoResult<()> {
        self.inner.conn_for(peer).map(|_| ())
    }

    fn ready(&self, peer: &EngineDesc, _remote: &MemoryDesc) -> bool {
        self.inner.out.lock().get(&peer.key).is_some_and(|c| !c.broken.load(Ordering::Acquire))
    }

    fn post(&self, req: TransferRequest, status: TransferStatus) {
        let me: std::sync::Weak<dyn mori_io_core::Progress> = Arc::downgrade(&self.inner) as _;
        status.set_progress(me);
        if let Err(e) = self.inner.post(req, &status) {
            status.complete_piece(Err(e));
        }
    }

    fn disconnect(&self, peer_key: &str) {
        self.inner.out.lock().remove(peer_key);
    }

    fn control(&self, from: &EngineDesc, payload: &[u8]) -> IoResult<Vec<u8>> {
        match postcard::from_bytes::<RdmaCtrl>(payload) {
            Ok(RdmaCtrl::Connect { conn_id, ep }) => self.inner.accept(from, conn_id, ep),
            Ok(other) => Err(IoError::invalid(format!("unexpected rdma control message {other:?}"))),
            Err(e) => Err(IoError::invalid(format!("malformed rdma control message from {:?}: {e}", from.key))),
        }
    }
}
