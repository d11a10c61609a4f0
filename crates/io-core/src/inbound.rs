//! Target-side record of completed inbound transfers, read by `pop_inbound_status`.

use crate::error::IoError;
use crate::status::TransferId;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::Arc;

/// Most finished entries kept for popping; older ones are dropped (with a warning) so a
/// target that never pops cannot grow without bound.
pub const MAX_FINISHED: usize = 1 << 16;

/// Most transfers of one initiator with some but not all pieces recorded; a piece of a new
/// transfer past it is not recorded (warned once), so a peer cannot grow this table without
/// bound by announcing pieces that never come.
pub const MAX_PARTIAL: usize = 1 << 16;

/// One initiator's records.
struct Peer {
    /// The initiator's key, shared with `Table::order`.
    key: Arc<str>,
    partial: FxHashMap<TransferId, (u32, Option<IoError>)>,
    /// Finished transfers: their status and the sequence number of their `order` entry.
    finished: FxHashMap<TransferId, (u64, Result<(), IoError>)>,
}

#[derive(Default)]
struct Table {
    warned: bool,
    warned_partial: bool,
    peers: FxHashMap<String, Peer>,
    /// Finished entries, oldest first, with their sequence numbers: an entry whose status was
    /// popped (or replaced by a newer one under the same id) no longer matches and is skipped.
    order: VecDeque<(Arc<str>, TransferId, u64)>,
    /// The next sequence number.
    seq: u64,
    /// Statuses finished and not popped (what [`MAX_FINISHED`] bounds).
    unpopped: usize,
}

/// Counts the pieces of each inbound transfer `(initiator key, transfer id)`; once all
/// `total` pieces were applied the transfer is finished and can be popped once. A
/// single-piece completion (the GPU backends' notifications) costs one hash insert and no
/// allocation.
#[derive(Default)]
pub struct InboundTable {
    t: Mutex<Table>,
}

impl InboundTable {
    /// Empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that transfers `ids` from engine `from`, each of one piece, completed (a
    /// backend's packed completion message).
    pub fn transfers_done(&self, from: &str, ids: impl IntoIterator<Item = TransferId>) {
        let mut t = self.t.lock();
        for id in ids {
            t.piece_done(from, id, 1, Ok(()));
        }
    }

    /// Records that one of `total` pieces of transfer `id` from engine `from` was applied
    /// (`Ok`) or refused (`Err`; the first error sticks). Call only after the data is in place.
    pub fn piece_done(&self, from: &str, id: TransferId, total: u32, r: Result<(), IoError>) {
        self.t.lock().piece_done(from, id, total, r);
    }

    /// Takes the final status of a finished inbound transfer; `None` while unknown or partial.
    pub fn pop(&self, from: &str, id: TransferId) -> Option<Result<(), IoError>> {
        // `order` keeps the key; trimming skips keys already popped.
        let mut t = self.t.lock();
        let r = t.peers.get_mut(from)?.finished.remove(&id).map(|(_, r)| r);
        if r.is_some() {
            t.unpopped -= 1;
        }
        t.tidy(from);
        t.skip_stale();
        r
    }

    /// How many initiators the table keeps records for (a diagnostic).
    pub fn peers(&self) -> usize {
        self.t.lock().peers.len()
    }
}

/// Initiators whose records are all taken are kept (their maps reused) up to this many; past
/// it they are dropped, so a long-lived target serving restarting initiators stays bounded.
pub const MAX_IDLE_PEERS: usize = 64;

/// An emptied map keeps its capacity up to this many entries (a burst's worth is released).
const KEEP_CAPACITY: usize = 4096;

impl Table {
    /// Whether `order`'s entry still names a status waiting to be popped.
    fn live(&self, (engine, id, seq): &(Arc<str>, TransferId, u64)) -> bool {
        self.peers.get(&**engine).and_then(|p| p.finished.get(id)).is_some_and(|(s, _)| s == seq)
    }

    /// Drops entries of already-popped statuses from the front of `order`, so a target that
    /// pops what it receives keeps `order` as short as its unpopped statuses.
    fn skip_stale(&mut self) {
        while self.order.front().is_some_and(|f| !self.live(f)) {
            self.order.pop_front();
        }
        if self.order.is_empty() && self.order.capacity() > KEEP_CAPACITY {
            self.order.shrink_to(KEEP_CAPACITY);
        }
    }

    /// Drops `engine`'s records when it has none left and there are many initiators; else
    /// releases the memory of a burst once its maps are empty.
    fn tidy(&mut self, engine: &str) {
        let many = self.peers.len() > MAX_IDLE_PEERS;
        let Some(p) = self.peers.get_mut(engine) else { return };
        if !p.partial.is_empty() || !p.finished.is_empty() {
            return;
        }
        if many {
            self.peers.remove(engine);
        } else if p.finished.capacity() > KEEP_CAPACITY || p.partial.capacity() > KEEP_CAPACITY {
            p.finished.shrink_to(KEEP_CAPACITY);
            p.partial.shrink_to(KEEP_CAPACITY);
        }
    }

    fn piece_done(&mut self, from: &str, id: TransferId, total: u32, r: Result<(), IoError>) {
        if !self.peers.contains_key(from) {
            let key: Arc<str> = Arc::from(from);
            self.peers.insert(from.to_string(), Peer { key, partial: FxHashMap::default(), finished: FxHashMap::default() });
        }
        let Some(p) = self.peers.get_mut(from) else { return };
        let r = if total <= 1 && p.partial.is_empty() {
            r
        } else {
            if p.partial.len() >= MAX_PARTIAL && !p.partial.contains_key(&id) {
                if !self.warned_partial {
                    self.warned_partial = true;
                    tracing::warn!(engine = %from, id, kept = MAX_PARTIAL, "too many partly received inbound transfers; this one is not recorded (warned once)");
                }
                return;
            }
            let entry = p.partial.entry(id).or_insert((0, None));
            entry.0 += 1;
            if let Err(e) = r {
                entry.1.get_or_insert(e);
            }
            if entry.0 < total.max(1) {
                return;
            }
            let (_, err) = p.partial.remove(&id).unwrap_or((0, None));
            err.map_or(Ok(()), Err)
        };
        let seq = self.seq;
        self.seq += 1;
        if p.finished.insert(id, (seq, r)).is_none() {
            self.unpopped += 1;
        }
        let key = p.key.clone();
        self.order.push_back((key, id, seq));
        self.skip_stale();
        // Entries of popped statuses behind an unpopped one: compacted once they outnumber
        // the live ones (amortized O(1) per insert).
        if self.order.len() > 2 * self.unpopped + KEEP_CAPACITY {
            let order = std::mem::take(&mut self.order);
            self.order = order.into_iter().filter(|e| self.live(e)).collect();
        }
        while self.unpopped > MAX_FINISHED {
            let Some((engine, old, seq)) = self.order.pop_front() else { break };
            let p = self.peers.get_mut(&*engine);
            let dropped = p.is_some_and(|p| match p.finished.get(&old) {
                Some((s, _)) if *s == seq => p.finished.remove(&old).is_some(),
                _ => false,
            });
            if dropped {
                self.unpopped -= 1;
            }
            self.tidy(&engine);
            if dropped && !self.warned {
                self.warned = true;
                tracing::warn!(
                    engine = %engine, id = old, kept = MAX_FINISHED,
                    "inbound statuses are not being popped; dropping the oldest (warned once)"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_after_all_pieces_once() {
        let t = InboundTable::new();
        t.piece_done("a", 7, 3, Ok(()));
        t.piece_done("a", 7, 3, Ok(()));
        assert_eq!(t.pop("a", 7), None);
        t.piece_done("a", 7, 3, Ok(()));
        assert_eq!(t.pop("b", 7), None);
        assert_eq!(t.pop("a", 7), Some(Ok(())));
        assert_eq!(t.pop("a", 7), None);
        t.piece_done("a", 8, 2, Err(IoError::invalid("x")));
        t.piece_done("a", 8, 2, Ok(()));
        assert_eq!(t.pop("a", 8).unwrap().unwrap_err().msg, "x");
    }

    #[test]
    fn keeps_the_newest_finished_entries_across_peers() {
        let t = InboundTable::new();
        t.transfers_done("a", 0..(MAX_FINISHED as u64));
        assert_eq!(t.pop("a", 1), Some(Ok(())), "popped before trimming");
        t.transfers_done("b", [7, 8, 9]);
        // Three more than the cap, one of which was popped: ids 0 and 2 of "a" are dropped.
        assert_eq!(t.pop("a", 0), None);
        assert_eq!(t.pop("a", 2), None);
        assert_eq!(t.pop("a", 3), Some(Ok(())));
        assert_eq!(t.pop("a", MAX_FINISHED as u64 - 1), Some(Ok(())));
        assert_eq!([t.pop("b", 7), t.pop("b", 8), t.pop("b", 9)], [Some(Ok(())), Some(Ok(())), Some(Ok(()))]);
        assert_eq!(t.pop("c", 7), None);
    }

    #[test]
    fn a_reused_id_is_kept_and_popped_statuses_cost_nothing() {
        // An initiator that restarted reuses ids: the new status must not be trimmed as the
        // old entry of the same id.
        let t = InboundTable::new();
        for id in 1..=(MAX_FINISHED as u64) {
            t.piece_done("a", id, 1, Ok(()));
            assert_eq!(t.pop("a", id), Some(Ok(())));
        }
        assert!(t.t.lock().order.is_empty(), "popped statuses leave nothing in the order ring");
        t.piece_done("a", 1, 1, Err(IoError::invalid("again")));
        for id in 2..=(MAX_FINISHED as u64 + 5) {
            t.piece_done("b", id, 1, Ok(()));
            assert_eq!(t.pop("b", id), Some(Ok(())));
        }
        assert!(t.t.lock().order.len() <= 2 + KEEP_CAPACITY, "{} order entries for 1 unpopped status", t.t.lock().order.len());
        assert_eq!(t.pop("a", 1).unwrap().unwrap_err().msg, "again");
        assert!(!t.t.lock().warned, "nothing unpopped was dropped");
        assert_eq!(t.t.lock().unpopped, 0);
    }

    #[test]
    fn partly_received_transfers_are_bounded() {
        let t = InboundTable::new();
        for id in 0..(MAX_PARTIAL as u64 + 100) {
            t.piece_done("a", id, 2, Ok(()));
        }
        assert_eq!(t.t.lock().peers["a"].partial.len(), MAX_PARTIAL);
        // A transfer already being counted still completes.
        t.piece_done("a", 5, 2, Ok(()));
        assert_eq!(t.pop("a", 5), Some(Ok(())));
    }

    #[test]
    fn initiators_with_nothing_left_are_dropped_past_the_idle_bound() {
        let t = InboundTable::new();
        for k in 0..(MAX_IDLE_PEERS + 10) {
            let e = format!("initiator-{k}");
            t.transfers_done(&e, [1, 2]);
            assert_eq!(t.pop(&e, 1), Some(Ok(())));
            assert_eq!(t.pop(&e, 2), Some(Ok(())));
        }
        // Each initiator emptied its records: past the bound they are not kept.
        assert!(t.peers() <= MAX_IDLE_PEERS + 1, "{} initiators kept", t.peers());
        // One with a record left stays, and can still pop it.
        t.piece_done("busy", 9, 2, Ok(()));
        t.transfers_done("busy", [3]);
        assert_eq!(t.pop("busy", 3), Some(Ok(())));
        t.piece_done("busy", 9, 2, Ok(()));
        assert_eq!(t.pop("busy", 9), Some(Ok(())));
    }
}
