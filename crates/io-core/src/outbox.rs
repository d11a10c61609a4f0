//! `Outbox`: messages queued on a hot path with no system call, handed to a sender
//! thread's channel later by a thread that can afford the wake-up; [`Notifier`]: a backend's
//! notification thread built on it (completion notes packed per peer and burst).
//!
//! A completion path that sends on a channel directly wakes the blocked receiver (a futex
//! system call, about a microsecond) before the waiter it completes can go on. The xgmi and
//! fabric backends instead push their target notifications here and let their copy pool's
//! completion thread flush them (`mori_gpu::CopyPool::set_idle_hook`).

use crate::backend::{BackendKind, ControlClient};
use crate::desc::EngineDesc;
use crate::error::{ErrorCode, IoError, IoResult};
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

/// A queue in front of a channel (see the module docs). Order is kept: flushes and
/// [`Outbox::send`] deliver in push order.
pub(crate) struct Outbox<T> {
    queued: Mutex<Vec<T>>,
    /// Set by every push: a flush with nothing queued returns without taking a lock (the
    /// completion thread flushes after every round).
    any: AtomicBool,
    /// The flushers' side: the channel (`None` once closed) and a spare vector swapped with
    /// `queued` (both keep their capacity, so a push does not allocate once the queue has
    /// grown to its usual burst).
    tx: Mutex<(Option<Sender<T>>, Vec<T>)>,
}

impl<T> Outbox<T> {
    /// An outbox in front of `tx`.
    pub(crate) fn new(tx: Sender<T>) -> Self {
        Outbox { queued: Mutex::new(Vec::new()), any: AtomicBool::new(false), tx: Mutex::new((Some(tx), Vec::new())) }
    }

    /// Queues `m` (a mutex push, no system call).
    pub(crate) fn push(&self, m: T) {
        self.queued.lock().push(m);
        self.any.store(true, Ordering::Release);
    }

    /// Hands everything queued to the channel, in order; returns how many. Messages to a
    /// receiver that is gone (or after [`Outbox::close`]) are dropped.
    pub(crate) fn flush(&self) -> usize {
        if !self.any.swap(false, Ordering::AcqRel) {
            return 0;
        }
        self.send_queued(&mut self.tx.lock())
    }

    /// Sends `m` now, after whatever is queued.
    pub(crate) fn send(&self, m: T) {
        let mut g = self.tx.lock();
        self.any.store(false, Ordering::Release);
        self.send_queued(&mut g);
        if let Some(tx) = &g.0 {
            let _ = tx.send(m);
        }
    }

    /// Flushes, then disconnects from the channel (its receiver sees the end once it took
    /// what was sent); later pushes and sends are dropped. Returns how many were flushed.
    pub(crate) fn close(&self) -> usize {
        let mut g = self.tx.lock();
        let n = self.send_queued(&mut g);
        g.0 = None;
        n
    }

    /// Moves what is queued into the channel (the flushers' lock held).
    fn send_queued(&self, g: &mut (Option<Sender<T>>, Vec<T>)) -> usize {
        let (tx, spare) = g;
        std::mem::swap(&mut *self.queued.lock(), spare);
        let n = spare.len();
        for m in spare.drain(..) {
            if let Some(tx) = tx {
                let _ = tx.send(m);
            }
        }
        n
    }
}

/// Groups a burst of completion notes (peer, transfer id) per peer, in arrival order, at
/// most `max_ids` ids per group (at least 1), so a notifier sends one control message per
/// group instead of one per transfer.
fn group_by_peer(notes: impl IntoIterator<Item = (Arc<EngineDesc>, u64)>, max_ids: usize) -> Vec<(Arc<EngineDesc>, Vec<u64>)> {
    let max_ids = max_ids.max(1);
    let mut out: Vec<(Arc<EngineDesc>, Vec<u64>)> = Vec::new();
    for (peer, id) in notes {
        match out.iter_mut().find(|(p, ids)| p.key == peer.key && ids.len() < max_ids) {
            Some((_, ids)) => ids.push(id),
            None => out.push((peer, vec![id])),
        }
    }
    out
}

/// Most transfer ids in one packed completion message (keeps the frame far below the
/// control-plane limit).
pub const MAX_IDS_PER_NOTE: usize = 4096;

/// What a [`Notifier`] carries: the completion of transfer `id` for `peer`, or another control
/// message of the backend.
pub(crate) enum Notice<M> {
    /// Transfer `id` (an id of `peer`'s inbound table) completed: all its data is in place.
    Done(Arc<EngineDesc>, u64),
    /// Any other message, sent as it is.
    Other(Arc<EngineDesc>, M),
    /// A message that only matters while `peer` is alive (e.g. "drop your mapping of my
    /// memory"): if the peer closed its connection, the failure is logged at DEBUG, not WARN.
    IfAlive(Arc<EngineDesc>, M),
}

/// A backend's notification thread: completions are queued with no system call
/// ([`Notifier::push_done`]) and sent when the backend flushes (its copy pool's idle hook) or
/// sends another message. The thread takes everything queued, sends the completions per peer as
/// one message per burst (`encode_done(ids)`, at most [`MAX_IDS_PER_NOTE`] ids each), then the
/// other messages in their order; a failed request is logged (WARN) and dropped. It ends when
/// the notifier is dropped.
///
/// Dropping it delivers what is still queued: it waits until the thread sent everything, at
/// most [`NOTIFIER_DRAIN`] (then warns and leaves the thread to finish alone), so a target
/// hears of every transfer completed before its initiator's engine went away.
pub struct Notifier<M> {
    outbox: Outbox<Notice<M>>,
    /// Signalled by the thread when it ended (in a mutex: a receiver is not `Sync`).
    ended: Mutex<Receiver<()>>,
}

/// Longest a dropped [`Notifier`] waits for its queued notifications to be sent.
pub const NOTIFIER_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

impl<M: Serialize + Send + 'static> Notifier<M> {
    /// Starts the thread (`thread` names it) sending to the peers' `kind` backend through
    /// `ctrl`. Errors: `Transport` if the thread cannot be spawned.
    pub fn spawn(thread: &str, ctrl: Arc<dyn ControlClient>, kind: BackendKind, encode_done: fn(Vec<u64>) -> M) -> IoResult<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Notice<M>>();
        let (ended_tx, ended) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(thread.to_string())
            .spawn(move || {
                notify_loop(&*ctrl, kind, encode_done, &rx);
                let _ = ended_tx.send(());
            })
            .map_err(|e| IoError::transport(format!("spawn {thread} thread: {e}")))?;
        Ok(Notifier { outbox: Outbox::new(tx), ended: Mutex::new(ended) })
    }

    /// Queues the completion of transfer `id` for `peer` (a mutex push, no system call).
    pub fn push_done(&self, peer: Arc<EngineDesc>, id: u64) {
        self.outbox.push(Notice::Done(peer, id));
    }

    /// Hands everything queued to the thread.
    pub fn flush(&self) {
        self.outbox.flush();
    }

    /// Sends `msg` to `peer` now, after whatever is queued.
    pub fn send(&self, peer: Arc<EngineDesc>, msg: M) {
        self.outbox.send(Notice::Other(peer, msg));
    }

    /// [`Notifier::send`] for a message that only matters to a live peer: a peer that closed
    /// its connection (`RemoteDisconnect`) is not warned about (DEBUG); any other failure is.
    pub fn send_if_alive(&self, peer: Arc<EngineDesc>, msg: M) {
        self.outbox.send(Notice::IfAlive(peer, msg));
    }
}

impl<M> Drop for Notifier<M> {
    fn drop(&mut self) {
        self.outbox.close();
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = self.ended.get_mut().recv_timeout(NOTIFIER_DRAIN) {
            tracing::warn!(waited = ?NOTIFIER_DRAIN, "notifications still being sent after the backend was dropped; not waiting longer");
        }
    }
}

fn notify_loop<M: Serialize>(ctrl: &dyn ControlClient, kind: BackendKind, encode_done: fn(Vec<u64>) -> M, rx: &Receiver<Notice<M>>) {
    let send = |peer: &EngineDesc, msg: &M, if_alive: bool| {
        let bytes = postcard::to_allocvec(msg).unwrap_or_default();
        match ctrl.request(peer, kind, bytes) {
            Ok(_) => {}
            Err(e) if if_alive && e.code == ErrorCode::RemoteDisconnect => {
                tracing::debug!(peer = %peer.key, backend = %kind, error = %e, "peer gone; its notification is moot");
            }
            Err(e) => tracing::warn!(peer = %peer.key, backend = %kind, error = %e, "notification failed"),
        }
    };
    while let Ok(first) = rx.recv() {
        let mut done = Vec::new();
        let mut other = Vec::new();
        for n in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match n {
                Notice::Done(peer, id) => done.push((peer, id)),
                Notice::Other(peer, m) => other.push((peer, m, false)),
                Notice::IfAlive(peer, m) => other.push((peer, m, true)),
            }
        }
        for (peer, ids) in group_by_peer(done, MAX_IDS_PER_NOTE) {
            send(&peer, &encode_done(ids), false);
        }
        for (peer, m, if_alive) in other {
            send(&peer, &m, if_alive);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn peer(key: &str) -> Arc<EngineDesc> {
        Arc::new(EngineDesc {
            key: key.to_string(),
            node_id: "n".into(),
            hostname: "h".into(),
            host: "127.0.0.1".into(),
            port: 1,
            pid: 1,
            epoch: 1,
            secret: crate::Secret::NONE,
        })
    }

    #[test]
    fn groups_per_peer_in_order_with_a_cap() {
        let (a, b) = (peer("a"), peer("b"));
        let notes = vec![(a.clone(), 1), (b.clone(), 2), (a.clone(), 3), (a.clone(), 4), (b.clone(), 5), (a.clone(), 6)];
        let g = group_by_peer(notes, 2);
        let flat: Vec<(String, Vec<u64>)> = g.into_iter().map(|(p, ids)| (p.key.clone(), ids)).collect();
        assert_eq!(flat, vec![("a".into(), vec![1, 3]), ("b".into(), vec![2, 5]), ("a".into(), vec![4, 6])]);
        assert!(group_by_peer(Vec::new(), 0).is_empty());
        assert_eq!(group_by_peer(vec![(a.clone(), 7), (a, 8)], 0).len(), 2, "a cap of 0 acts as 1");
    }

    #[test]
    fn queued_until_flushed_in_order() {
        let (tx, rx) = std::sync::mpsc::channel();
        let o = Outbox::new(tx);
        o.push(1);
        o.push(2);
        assert!(rx.try_recv().is_err(), "nothing reaches the channel before a flush");
        assert_eq!(o.flush(), 2);
        assert_eq!(o.flush(), 0);
        o.push(3);
        o.send(4);
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        drop(rx);
        o.push(5);
        assert_eq!(o.flush(), 1, "a gone receiver drops the message without panicking");
    }

    /// Records the requests a notifier makes (the engine's control plane cannot route to a
    /// GPU backend on a host without one, so the packing is checked here).
    struct Recorder(Mutex<Vec<(String, BackendKind, Vec<u8>)>>);

    impl ControlClient for Recorder {
        fn request(&self, peer: &EngineDesc, backend: BackendKind, payload: Vec<u8>) -> IoResult<Vec<u8>> {
            self.0.lock().push((peer.key.clone(), backend, payload));
            Ok(Vec::new())
        }
    }

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    enum Msg {
        Done(u64),
        Many(Vec<u64>),
        Forget(u32),
    }

    #[test]
    fn notifier_packs_a_burst_per_peer_then_sends_the_rest_in_order() {
        let rec = Arc::new(Recorder(Mutex::new(Vec::new())));
        let n =
            Notifier::spawn(
                "test-notify",
                rec.clone(),
                BackendKind::Xgmi,
                |ids| {
                    if ids.len() == 1 {
                        Msg::Done(ids[0])
                    } else {
                        Msg::Many(ids)
                    }
                },
            )
            .unwrap();
        let (a, b) = (peer("a"), peer("b"));
        for (p, id) in [(&a, 1), (&b, 2), (&a, 3)] {
            n.push_done(p.clone(), id);
        }
        assert!(rec.0.lock().is_empty(), "nothing leaves before a flush");
        n.send(b.clone(), Msg::Forget(9));
        let t = std::time::Instant::now();
        let ids_of = |key: &str, got: &[(String, BackendKind, Msg)]| -> Vec<u64> {
            got.iter()
                .filter(|(k, _, _)| k == key)
                .flat_map(|(_, _, m)| match m {
                    Msg::Done(i) => vec![*i],
                    Msg::Many(v) => v.clone(),
                    Msg::Forget(_) => vec![],
                })
                .collect()
        };
        let decode = || -> Vec<(String, BackendKind, Msg)> {
            rec.0.lock().iter().map(|(k, kind, b)| (k.clone(), *kind, postcard::from_bytes(b).unwrap())).collect()
        };
        loop {
            let got = decode();
            if got.iter().any(|(_, _, m)| *m == Msg::Forget(9)) {
                break;
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "notifier sent {got:?}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let got = decode();
        // The thread may wake before the whole burst is in its channel, so a burst can be
        // split; what must hold: every id reaches its peer once, in order, completions before
        // the message sent after them, all to the xgmi backend.
        assert_eq!(ids_of("a", &got), vec![1, 3], "{got:?}");
        assert_eq!(ids_of("b", &got), vec![2], "{got:?}");
        assert_eq!(got.last().map(|(k, _, m)| (k.as_str(), m)), Some(("b", &Msg::Forget(9))), "{got:?}");
        assert!(got.len() <= 4 && got.iter().all(|(_, kind, _)| *kind == BackendKind::Xgmi), "{got:?}");
        // Within one burst, a peer's completions travel in one message.
        n.push_done(a.clone(), 4);
        n.push_done(a.clone(), 5);
        n.send(a.clone(), Msg::Forget(10));
        while !decode().iter().any(|(_, _, m)| *m == Msg::Forget(10)) {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "notifier sent {:?}", decode());
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let tail: Vec<Msg> = decode().into_iter().skip(got.len()).map(|(_, _, m)| m).collect();
        assert!(
            tail == vec![Msg::Many(vec![4, 5]), Msg::Forget(10)] || tail == vec![Msg::Done(4), Msg::Done(5), Msg::Forget(10)],
            "{tail:?}"
        );
        // A message for a live peer only travels the same way, after what was queued.
        let before = decode().len();
        n.push_done(b.clone(), 6);
        n.send_if_alive(b.clone(), Msg::Forget(11));
        while !decode().iter().any(|(_, _, m)| *m == Msg::Forget(11)) {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "notifier sent {:?}", decode());
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let tail: Vec<(String, Msg)> = decode().into_iter().skip(before).map(|(k, _, m)| (k, m)).collect();
        assert_eq!(tail, vec![("b".to_string(), Msg::Done(6)), ("b".to_string(), Msg::Forget(11))]);
    }

    /// A peer that answers after `delay`.
    struct Slow(Duration, Mutex<Vec<u8>>);

    impl ControlClient for Slow {
        fn request(&self, _peer: &EngineDesc, _backend: BackendKind, payload: Vec<u8>) -> IoResult<Vec<u8>> {
            std::thread::sleep(self.0);
            self.1.lock().push(payload.len() as u8);
            Ok(Vec::new())
        }
    }

    #[test]
    fn a_dropped_notifier_delivers_what_is_queued_within_its_bound() {
        // Queued, never flushed: the drop sends it (the peer answers after 50 ms).
        let slow = Arc::new(Slow(Duration::from_millis(50), Mutex::new(Vec::new())));
        let n = Notifier::spawn("test-drain", slow.clone(), BackendKind::Xgmi, Msg::Many).unwrap();
        n.push_done(peer("a"), 1);
        n.push_done(peer("b"), 2);
        let t = Instant::now();
        drop(n);
        assert_eq!(slow.1.lock().len(), 2, "both peers' notes were sent before drop returned");
        assert!(t.elapsed() >= Duration::from_millis(100), "{:?}", t.elapsed());
        // A peer slower than the bound: drop gives up after NOTIFIER_DRAIN.
        let stuck = Arc::new(Slow(NOTIFIER_DRAIN * 3, Mutex::new(Vec::new())));
        let n = Notifier::spawn("test-drain-stuck", stuck.clone(), BackendKind::Xgmi, Msg::Many).unwrap();
        n.push_done(peer("a"), 1);
        let t = Instant::now();
        drop(n);
        let waited = t.elapsed();
        assert!(waited >= NOTIFIER_DRAIN && waited < NOTIFIER_DRAIN * 2, "{waited:?}");
        assert!(stuck.1.lock().is_empty());
    }
}
