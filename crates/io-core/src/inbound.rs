//! Target-side record of completed inbound transfers, read by `pop_inbound_status`.

use crate::error::IoError;
use crate::status::TransferId;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};

/// Most finished entries kept for popping; older ones are dropped (with a warning) so a
/// target that never pops cannot grow without bound.
pub const MAX_FINISHED: usize = 1 << 16;

#[derive(Default)]
struct Table {
    warned: bool,
    partial: HashMap<(String, TransferId), (u32, Option<IoError>)>,
    finished: HashMap<(String, TransferId), Result<(), IoError>>,
    order: VecDeque<(String, TransferId)>,
}

/// Counts the pieces of each inbound transfer `(initiator key, transfer id)`; once all
/// `total` pieces were applied the transfer is finished and can be popped once.
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
        for id in ids {
            self.piece_done(from, id, 1, Ok(()));
        }
    }

    /// Records that one of `total` pieces of transfer `id` from engine `from` was applied
    /// (`Ok`) or refused (`Err`; the first error sticks). Call only after the data is in place.
    pub fn piece_done(&self, from: &str, id: TransferId, total: u32, r: Result<(), IoError>) {
        let mut t = self.t.lock();
        let key = (from.to_string(), id);
        let entry = t.partial.entry(key.clone()).or_insert((0, None));
        entry.0 += 1;
        if let Err(e) = r {
            entry.1.get_or_insert(e);
        }
        if entry.0 >= total.max(1) {
            let (_, err) = t.partial.remove(&key).unwrap_or((0, None));
            t.finished.insert(key.clone(), err.map_or(Ok(()), Err));
            t.order.push_back(key);
            while t.order.len() > MAX_FINISHED {
                if let Some(old) = t.order.pop_front() {
                    if t.finished.remove(&old).is_some() && !t.warned {
                        t.warned = true;
                        tracing::warn!(
                            engine = %old.0, id = old.1, kept = MAX_FINISHED,
                            "inbound statuses are not being popped; dropping the oldest (warned once)"
                        );
                    }
                }
            }
        }
    }

    /// Takes the final status of a finished inbound transfer; `None` while unknown or partial.
    pub fn pop(&self, from: &str, id: TransferId) -> Option<Result<(), IoError>> {
        let mut t = self.t.lock();
        // `order` keeps the key; trimming skips keys already popped.
        t.finished.remove(&(from.to_string(), id))
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
}
