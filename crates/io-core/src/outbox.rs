//! [`Outbox`]: messages queued on a hot path with no system call, handed to a sender
//! thread's channel later by a thread that can afford the wake-up.
//!
//! A completion path that sends on a channel directly wakes the blocked receiver (a futex
//! system call, about a microsecond) before the waiter it completes can go on. The xgmi and
//! fabric backends instead push their target notifications here and let their copy pool's
//! completion thread flush them (`mori_gpu::CopyPool::set_idle_hook`).

use crate::desc::EngineDesc;
use parking_lot::Mutex;
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// A queue in front of a channel (see the module docs). Order is kept: flushes and
/// [`Outbox::send`] deliver in push order.
pub struct Outbox<T> {
    queued: Mutex<Vec<T>>,
    tx: Mutex<Sender<T>>,
}

impl<T> Outbox<T> {
    /// An outbox in front of `tx`.
    pub fn new(tx: Sender<T>) -> Self {
        Outbox { queued: Mutex::new(Vec::new()), tx: Mutex::new(tx) }
    }

    /// Queues `m` (a mutex push, no system call).
    pub fn push(&self, m: T) {
        self.queued.lock().push(m);
    }

    /// Hands everything queued to the channel, in order; returns how many. Messages to a
    /// receiver that is gone are dropped.
    pub fn flush(&self) -> usize {
        let q = std::mem::take(&mut *self.queued.lock());
        let n = q.len();
        if n > 0 {
            let tx = self.tx.lock();
            for m in q {
                let _ = tx.send(m);
            }
        }
        n
    }

    /// Sends `m` now, after whatever is queued.
    pub fn send(&self, m: T) {
        let tx = self.tx.lock();
        for q in std::mem::take(&mut *self.queued.lock()) {
            let _ = tx.send(q);
        }
        let _ = tx.send(m);
    }
}

/// Groups a burst of completion notes (peer, transfer id) per peer, in arrival order, at
/// most `max_ids` ids per group (at least 1), so a notifier sends one control message per
/// group instead of one per transfer.
pub fn group_by_peer(notes: impl IntoIterator<Item = (Arc<EngineDesc>, u64)>, max_ids: usize) -> Vec<(Arc<EngineDesc>, Vec<u64>)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(key: &str) -> Arc<EngineDesc> {
        Arc::new(EngineDesc {
            key: key.to_string(),
            node_id: "n".into(),
            hostname: "h".into(),
            host: "127.0.0.1".into(),
            port: 1,
            pid: 1,
        })
    }

    #[test]
    fn groups_per_peer_in_order_with_a_cap() {
        let (a, b) = (peer("a"), peer("b"));
        let notes = vec![(a.clone(), 1), (b.clone(), 2), (a.clone(), 3), (a.clone(), 4), (b.clone(), 5), (a.clone(), 6)];
        let g = group_by_peer(notes, 2);
        let flat: Vec<(String, Vec<u64>)> = g.into_iter().map(|(p, ids)| (p.key.clone(), ids)).collect();
        assert_eq!(
            flat,
            vec![("a".into(), vec![1, 3]), ("b".into(), vec![2, 5]), ("a".into(), vec![4, 6])]
        );
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
}
