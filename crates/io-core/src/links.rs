//! Target-side record of inbound connections (control and data) per initiator engine: how
//! many are open, and whether the last one to end was ended by the initiator (end of stream,
//! reset) rather than by this engine (its idle timeout, its shutdown, a refused request). A process that
//! exits or is killed closes its sockets, so every connection it had open to this engine
//! ends from its side within moments; a process that is stopped or slow keeps them open.
//! The layers above use this to tell "the writer is gone" from "the writer is late".

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::Arc;

/// Most initiators remembered as closed by their side; past it the oldest is forgotten (an
/// engine that keeps being dialled by short-lived peers cannot grow this without bound).
pub const MAX_CLOSED: usize = 4096;

#[derive(Default)]
struct Links {
    /// Open inbound connections per initiator key.
    open: FxHashMap<Arc<str>, u32>,
    /// Initiators with none open whose last connection they ended, with the sequence number
    /// of that end.
    closed: FxHashMap<Arc<str>, u64>,
    /// The same ends in order; an entry whose number no longer matches `closed` (the key
    /// reconnected, or ended again later) is stale and skipped.
    order: VecDeque<(Arc<str>, u64)>,
    /// The next sequence number.
    seq: u64,
}

/// Per-initiator inbound connection state of one engine (shared with its backends through
/// [`crate::BackendContext`]).
#[derive(Default)]
pub struct PeerLinks {
    t: Mutex<Links>,
}

/// One inbound connection from an initiator, open until dropped. Dropping it counts as
/// ended by this engine unless [`LinkGuard::closed_by_peer`] was called.
pub struct LinkGuard {
    links: Arc<PeerLinks>,
    from: Arc<str>,
    by_peer: bool,
}

impl PeerLinks {
    /// Empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts a new inbound connection from engine `from` until the guard drops.
    pub fn opened(self: &Arc<Self>, from: &str) -> LinkGuard {
        let mut t = self.t.lock();
        let key: Arc<str> = match t.open.get_key_value(from) {
            Some((k, _)) => k.clone(),
            None => Arc::from(from),
        };
        *t.open.entry(key.clone()).or_insert(0) += 1;
        t.closed.remove(from);
        LinkGuard { links: self.clone(), from: key, by_peer: false }
    }

    /// Whether engine `from` has no inbound connection open here and ended the last one
    /// itself (its process exited, was killed, or closed its engine). False for an engine that
    /// never connected, one with a connection open, and one whose last connection this engine
    /// ended.
    pub fn closed_by_peer(&self, from: &str) -> bool {
        self.t.lock().closed.contains_key(from)
    }

    fn ended(&self, from: &Arc<str>, by_peer: bool) {
        let mut t = self.t.lock();
        let left = match t.open.get_mut(from) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => 0,
        };
        if left > 0 {
            return;
        }
        t.open.remove(from);
        t.closed.remove(from);
        if by_peer {
            let Links { closed, order, seq, .. } = &mut *t;
            while closed.len() >= MAX_CLOSED {
                let Some((old, n)) = order.pop_front() else { break };
                if closed.get(&old) == Some(&n) {
                    closed.remove(&old);
                }
            }
            *seq += 1;
            closed.insert(from.clone(), *seq);
            order.push_back((from.clone(), *seq));
            // Stale entries (keys that reconnected or ended again) stay within a bound.
            if order.len() > 2 * MAX_CLOSED {
                order.retain(|(k, n)| closed.get(k) == Some(n));
            }
        }
    }
}

impl LinkGuard {
    /// Marks this connection as ended by the initiator (end of stream or reset while waiting
    /// for its next request).
    pub fn closed_by_peer(&mut self) {
        self.by_peer = true;
    }
}

impl Drop for LinkGuard {
    fn drop(&mut self) {
        self.links.ended(&self.from, self.by_peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_last_connection_decides_and_a_new_one_clears_it() {
        let l = Arc::new(PeerLinks::new());
        assert!(!l.closed_by_peer("a"), "never connected");
        let mut g1 = l.opened("a");
        let g2 = l.opened("a");
        g1.closed_by_peer();
        drop(g1);
        assert!(!l.closed_by_peer("a"), "one connection is still open");
        drop(g2);
        assert!(!l.closed_by_peer("a"), "the last one was ended here");
        let mut g3 = l.opened("a");
        g3.closed_by_peer();
        drop(g3);
        assert!(l.closed_by_peer("a"));
        assert!(!l.closed_by_peer("b"));
        let g4 = l.opened("a");
        assert!(!l.closed_by_peer("a"), "reconnected");
        drop(g4);
        assert!(!l.closed_by_peer("a"));
    }

    #[test]
    fn closed_peers_are_bounded() {
        let l = Arc::new(PeerLinks::new());
        for i in 0..MAX_CLOSED + 10 {
            l.opened(&format!("p{i}")).closed_by_peer();
        }
        assert!(!l.closed_by_peer("p0"), "the oldest is forgotten");
        assert!(l.closed_by_peer("p10") && l.closed_by_peer(&format!("p{}", MAX_CLOSED + 9)));
        assert_eq!(l.t.lock().closed.len(), MAX_CLOSED);
        assert!(l.t.lock().open.is_empty());
        // The oldest end is evicted, not the oldest key: "a" ended before "b", then
        // reconnected and ended again after it.
        let l = Arc::new(PeerLinks::new());
        l.opened("a").closed_by_peer();
        l.opened("b").closed_by_peer();
        l.opened("a").closed_by_peer();
        for i in 0..MAX_CLOSED - 1 {
            l.opened(&format!("q{i}")).closed_by_peer();
        }
        assert!(!l.closed_by_peer("b") && l.closed_by_peer("a"), "b's end was the oldest");
        assert!(l.t.lock().order.len() <= 2 * MAX_CLOSED);
    }

    proptest! {
        /// Against an oracle that keeps, per peer, the open count and how the last one ended.
        #[test]
        fn matches_an_oracle(ops in proptest::collection::vec((0u8..3, 0usize..3, any::<bool>()), 0..60)) {
            let l = Arc::new(PeerLinks::new());
            let mut guards: Vec<Vec<LinkGuard>> = (0..3).map(|_| Vec::new()).collect();
            let mut last_by_peer = [false; 3];
            for (op, p, by_peer) in ops {
                let key = format!("e{p}");
                if op == 0 || guards[p].is_empty() {
                    guards[p].push(l.opened(&key));
                    last_by_peer[p] = false;
                } else {
                    let mut g = guards[p].pop().unwrap();
                    if by_peer {
                        g.closed_by_peer();
                    }
                    drop(g);
                    if guards[p].is_empty() {
                        last_by_peer[p] = by_peer;
                    }
                }
                for q in 0..3 {
                    prop_assert_eq!(l.closed_by_peer(&format!("e{q}")), guards[q].is_empty() && last_by_peer[q]);
                }
            }
        }
    }
}
