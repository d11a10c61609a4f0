//! [`Session`]: a pre-resolved (local region, remote region, backend) triple.

use crate::engine::EngineInner;
use crate::paged::{Batch, Checked};
use mori_io_core::plan::check_entry;
use mori_io_core::status::Completion;
use mori_io_core::{
    Backend, BackendKind, EngineDesc, IoError, IoResult, MemoryDesc, Op, Route, Seg, TransferId, TransferRequest, TransferStatus,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Transfers between one local and one remote region over a backend chosen once, with the
/// remote region verified and connections open (see `IoEngine::create_session`). Cheaper per
/// call than the engine's one-shot methods: no backend choice, and with a backend that
/// prepares a [`Route`] (xgmi) no per-transfer lookups either.
///
/// A session lives no longer than its engine: once the `IoEngine` that created it is dropped,
/// every call fails with `BadState`. Nor longer than its peer's registration: once the remote
/// engine is deregistered, or registered again with another descriptor (it restarted), every
/// call fails with `RemoteDisconnect`.
pub struct Session {
    pub(crate) engine: Arc<EngineInner>,
    pub(crate) local: Arc<MemoryDesc>,
    pub(crate) remote: Arc<MemoryDesc>,
    pub(crate) peer: Arc<EngineDesc>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) route: Option<Arc<dyn Route>>,
    /// The engine's `remote_gen` when the peer was last seen registered.
    gen: AtomicU64,
}

impl Session {
    pub(crate) fn new(
        engine: Arc<EngineInner>,
        local: Arc<MemoryDesc>,
        remote: Arc<MemoryDesc>,
        peer: Arc<EngineDesc>,
        backend: Arc<dyn Backend>,
        gen: u64,
    ) -> IoResult<Self> {
        let route = backend.route(&local, &remote, &peer)?;
        Ok(Session { engine, local, remote, peer, backend, route, gen: AtomicU64::new(gen) })
    }

    /// `BadState` once the engine that made this session was dropped; `RemoteDisconnect` once
    /// the peer is no longer registered there as the engine this session was made against.
    pub(crate) fn engine_gone(&self) -> Option<TransferStatus> {
        if self.engine.shutdown.load(Ordering::Acquire) {
            return Some(TransferStatus::failed(IoError::bad_state(format!(
                "session of engine {:?} (to {:?}): the engine was dropped",
                self.engine.desc.key, self.peer.key
            ))));
        }
        let now = self.engine.remote_gen.load(Ordering::Acquire);
        if now == self.gen.load(Ordering::Relaxed) {
            return None;
        }
        match self.engine.registered_remote(&self.peer.key) {
            Some(p) if Arc::ptr_eq(&p, &self.peer) => {
                self.gen.store(now, Ordering::Relaxed);
                None
            }
            other => Some(TransferStatus::failed(IoError::disconnected(format!(
                "session to engine {:?} (epoch {:#x}, pid {}): that engine was {} here since the session was made; \
                 make a new session with fresh descriptors",
                self.peer.key,
                self.peer.epoch,
                self.peer.pid,
                match other {
                    Some(p) => format!("replaced (now epoch {:#x}, pid {})", p.epoch, p.pid),
                    None => "deregistered".to_string(),
                }
            )))),
        }
    }

    /// Takes `id` for this session's peer, posts with `post`, records the status.
    fn admit(&self, id: TransferId, post: impl FnOnce() -> TransferStatus) -> TransferStatus {
        match self.engine.inflight.reserve(self.peer.epoch, &self.peer.key, id) {
            Err(e) => TransferStatus::failed(e),
            Ok(slot) => {
                let st = post();
                self.engine.inflight.fill(slot, &st);
                st
            }
        }
    }

    /// Whether calls can still succeed: false once the engine was dropped or the peer was
    /// deregistered or replaced (calls then fail with `BadState` / `RemoteDisconnect`).
    pub fn alive(&self) -> bool {
        self.engine_gone().is_none()
    }

    /// The backend serving this session.
    pub fn backend(&self) -> BackendKind {
        self.backend.kind()
    }

    /// Reads `size` bytes at `remote_off` into `local_off`.
    pub fn read(&self, local_off: u64, remote_off: u64, size: u64, id: TransferId) -> TransferStatus {
        self.one(Op::Read, local_off, remote_off, size, id)
    }

    /// Writes `size` bytes at `local_off` to `remote_off`.
    pub fn write(&self, local_off: u64, remote_off: u64, size: u64, id: TransferId) -> TransferStatus {
        self.one(Op::Write, local_off, remote_off, size, id)
    }

    /// Batch read (parallel arrays; rules of `mori_io_core::plan::check_batch`).
    pub fn batch_read(&self, local_offs: &[u64], remote_offs: &[u64], sizes: &[u64], id: TransferId) -> TransferStatus {
        self.post_batch(Op::Read, Batch::Ranges(local_offs, remote_offs, sizes), id)
    }

    /// Batch write (parallel arrays; rules of `mori_io_core::plan::check_batch`).
    pub fn batch_write(&self, local_offs: &[u64], remote_offs: &[u64], sizes: &[u64], id: TransferId) -> TransferStatus {
        self.post_batch(Op::Write, Batch::Ranges(local_offs, remote_offs, sizes), id)
    }

    /// Posts a batch in direction `op` with an optional notification: with `notif`, the target
    /// receives that message once the data is in place and the status ends only after it was
    /// queued there (see `IoEngine::post`). Errors as `batch_read`, plus `InvalidArgs` for a
    /// message over `MAX_NOTIF_LEN` bytes.
    pub fn post(
        &self,
        op: Op,
        local_offs: &[u64],
        remote_offs: &[u64],
        sizes: &[u64],
        id: TransferId,
        notif: Option<&[u8]>,
    ) -> TransferStatus {
        if let Some(m) = notif {
            if let Err(e) = mori_io_core::notif::check_msg(m) {
                return TransferStatus::failed(e);
            }
        }
        let st = self.post_batch(op, Batch::Ranges(local_offs, remote_offs, sizes), id);
        match notif {
            None => st,
            Some(m) => self.engine.with_notif(st, self.peer.clone(), m),
        }
    }

    /// One entry: as a batch of one, without building a vector when the backend has a route.
    fn one(&self, op: Op, lo: u64, ro: u64, size: u64, id: TransferId) -> TransferStatus {
        let Some(r) = &self.route else { return self.post_batch(op, Batch::Ranges(&[lo], &[ro], &[size]), id) };
        if let Some(gone) = self.engine_gone() {
            return gone;
        }
        if let Err(e) = check_entry(0, (self.local.id, self.local.len), (self.remote.id, self.remote.len), lo, ro, size) {
            return TransferStatus::failed(e);
        }
        let seg = [Seg { local_off: lo, remote_off: ro, len: size }];
        self.admit(id, || r.post(op, id, if size == 0 { &[] } else { &seg }))
    }

    /// Checks and posts a batch of either form.
    pub(crate) fn post_batch(&self, op: Op, batch: Batch<'_>, id: TransferId) -> TransferStatus {
        if let Some(gone) = self.engine_gone() {
            return gone;
        }
        let checked = match batch.check((self.local.id, self.local.len), (self.remote.id, self.remote.len)) {
            Err(e) => return TransferStatus::failed(e),
            Ok(c) => c,
        };
        self.admit(id, || match (&self.route, checked) {
            (Some(r), Checked::Paged(p)) => r.post_paged(op, id, &p),
            (Some(r), Checked::Ranges(segs, _)) => r.post(op, id, &segs),
            (None, checked) => {
                let local_region = match self.engine.local_region(self.local.id) {
                    Ok(r) => r,
                    Err(e) => return TransferStatus::failed(e),
                };
                let (segs, entries, paged) = checked.for_backend(self.backend.takes_paged());
                let st = TransferStatus::new(1);
                let req = TransferRequest {
                    op,
                    id,
                    peer: self.peer.clone(),
                    local: self.local.clone(),
                    local_region,
                    remote: self.remote.clone(),
                    segs,
                    entries: Arc::new(entries),
                    paged,
                    ordered: false,
                };
                self.backend.post(req, st.clone());
                st
            }
        })
    }
}
