//! Posting never waits on the network: a post whose backend is not ready for its peer (no
//! connection yet, or a remote region not looked up) runs on a connector thread, one per peer
//! while it has work, so the caller's thread returns at once and the transfer's status carries
//! the connect's outcome (its `Timeout` names the deadline).
//!
//! Posts to a peer that has a connector queue join the queue behind it (order per peer kept);
//! when a post fails to connect, the posts queued behind it that cannot post without the
//! network fail with the same error instead of each waiting out its own deadline.

use mori_io_core::status::Completion;
use mori_io_core::{Backend, ErrorCode, IoError, TransferRequest, TransferStatus};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A request and the status its backend completes.
type Posted = (TransferRequest, TransferStatus);

struct Job {
    backend: Arc<dyn Backend>,
    req: TransferRequest,
    status: TransferStatus,
}

/// The connector queues of one engine, keyed by peer engine key.
#[derive(Default)]
pub(crate) struct Connector {
    queues: Mutex<HashMap<String, VecDeque<Job>>>,
    /// Peers with a queue: zero on the fast path, which then takes no lock.
    busy: AtomicUsize,
}

impl Connector {
    /// Posts `req` through `b` on this thread when `b` is ready for it and nothing is queued
    /// for its peer; otherwise queues it for the peer's connector thread (started if needed).
    pub(crate) fn post(self: &Arc<Self>, b: Arc<dyn Backend>, req: TransferRequest, status: TransferStatus, shutdown: Arc<AtomicBool>) {
        // A queued request holds its local registration (`TransferRequest::local_region`), so
        // a deregistration waits for it as for a running one.
        if self.busy.load(Ordering::Acquire) == 0 && b.ready(&req.peer, &req.remote) {
            return b.post(req, status);
        }
        let key = req.peer.key.clone();
        let mut q = self.queues.lock();
        if let Some(v) = q.get_mut(&key) {
            v.push_back(Job { backend: b, req, status });
            return;
        }
        if b.ready(&req.peer, &req.remote) {
            drop(q);
            return b.post(req, status);
        }
        q.insert(key.clone(), VecDeque::from([Job { backend: b, req, status }]));
        self.busy.fetch_add(1, Ordering::AcqRel);
        drop(q);
        let me = self.clone();
        let k = key.clone();
        let spawned = std::thread::Builder::new().name("mori-io-connect".into()).spawn(move || me.drain(&k, &shutdown));
        if let Err(e) = spawned {
            let err = IoError::transport(format!("cannot start a connector thread for engine {key:?}: {e}; nothing was sent"));
            for j in self.take_all(&key) {
                j.status.complete_piece(Err(err.clone()));
            }
        }
    }

    /// [`Connector::post`] for jobs made together: when all can go at once (no connector work
    /// pending, every backend ready for its peer) they are handed to their backends in one
    /// [`Backend::post_many`] per backend (in order within each); otherwise each goes as
    /// [`Connector::post`], in order.
    pub(crate) fn post_many(self: &Arc<Self>, jobs: Vec<(Arc<dyn Backend>, TransferRequest, TransferStatus)>, shutdown: &Arc<AtomicBool>) {
        if self.busy.load(Ordering::Acquire) != 0 || !jobs.iter().all(|(b, req, _)| b.ready(&req.peer, &req.remote)) {
            for (b, req, st) in jobs {
                self.post(b, req, st, shutdown.clone());
            }
            return;
        }
        let mut now: Vec<(Arc<dyn Backend>, Vec<Posted>)> = Vec::new();
        for (b, req, st) in jobs {
            let same = |o: &Arc<dyn Backend>| std::ptr::addr_eq(Arc::as_ptr(o), Arc::as_ptr(&b));
            match now.iter_mut().find(|(o, _)| same(o)) {
                Some((_, v)) => v.push((req, st)),
                None => now.push((b, vec![(req, st)])),
            }
        }
        for (b, v) in now {
            b.post_many(v);
        }
    }

    /// Removes and returns the queue of `key`.
    fn take_all(&self, key: &str) -> Vec<Job> {
        let mut q = self.queues.lock();
        match q.remove(key) {
            Some(v) => {
                self.busy.fetch_sub(1, Ordering::AcqRel);
                v.into()
            }
            None => Vec::new(),
        }
    }

    /// The connector thread of peer `key`: posts its queue in order until it is empty.
    fn drain(&self, key: &str, shutdown: &AtomicBool) {
        loop {
            let job = {
                let mut q = self.queues.lock();
                match q.get_mut(key).and_then(VecDeque::pop_front) {
                    Some(j) => j,
                    None => {
                        q.remove(key);
                        self.busy.fetch_sub(1, Ordering::AcqRel);
                        return;
                    }
                }
            };
            if shutdown.load(Ordering::Acquire) {
                let e = IoError::bad_state(format!("the engine was dropped before the transfer to engine {key:?} was sent"));
                job.status.complete_piece(Err(e.clone()));
                for j in self.take_all(key) {
                    j.status.complete_piece(Err(e.clone()));
                }
                return;
            }
            let Job { backend, req, status } = job;
            let (peer, remote) = (req.peer.clone(), req.remote.clone());
            backend.post(req, status.clone());
            let Some(Err(e)) = status.poll() else { continue };
            let connect_failed = matches!(e.code, ErrorCode::Timeout | ErrorCode::RemoteDisconnect | ErrorCode::Transport);
            if !connect_failed || backend.ready(&peer, &remote) {
                continue;
            }
            // Still not connected: the jobs behind it that need the network fail the same way.
            let waiting: Vec<Job> = {
                let mut q = self.queues.lock();
                let Some(v) = q.get_mut(key) else { continue };
                let (blocked, rest): (VecDeque<Job>, VecDeque<Job>) =
                    v.drain(..).partition(|j| !j.backend.ready(&j.req.peer, &j.req.remote));
                *v = rest;
                blocked.into()
            };
            for j in waiting {
                let err = IoError::new(e.code, format!("not sent: connecting to engine {key:?} for an earlier transfer failed: {}", e.msg));
                j.status.complete_piece(Err(err));
            }
        }
    }
}
