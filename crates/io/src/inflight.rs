//! Transfer ids in flight, per target engine incarnation: a second transfer with the id of one
//! not finished yet is refused at the initiator (the target counts pieces and keeps statuses by
//! `(initiator, id)`, so two live transfers under one id would be merged into one status).

use mori_io_core::{IoError, TransferId, TransferStatus, WeakTransferStatus};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

/// Entries kept before finished ones are swept out (the sweep then runs when the table has
/// doubled since, so its cost per post stays O(1) amortized).
const SWEEP_AT: usize = 4096;

/// `(target epoch, transfer id)` -> the status of the transfer posted under it, held weakly (a
/// status nobody holds any more is finished; its memory is not kept here); `None`: reserved,
/// being posted.
pub(crate) struct InFlight {
    t: Mutex<Table>,
}

struct Table {
    map: FxHashMap<(u64, TransferId), Option<WeakTransferStatus>>,
    sweep_at: usize,
}

/// A slot taken by [`InFlight::reserve`]; [`InFlight::fill`] puts the real status in.
pub(crate) struct Reserved {
    key: (u64, TransferId),
}

impl InFlight {
    pub(crate) fn new() -> Self {
        InFlight { t: Mutex::new(Table { map: FxHashMap::default(), sweep_at: SWEEP_AT }) }
    }

    /// Takes `(epoch, id)` for a transfer about to be posted to the engine of that epoch.
    /// Errors: `InvalidArgs` naming the id when a transfer posted under it has not finished.
    pub(crate) fn reserve(&self, epoch: u64, peer_key: &str, id: TransferId) -> Result<Reserved, IoError> {
        let mut t = self.t.lock();
        if t.map.len() >= t.sweep_at {
            t.map.retain(|_, st| busy(st));
            t.sweep_at = (t.map.len() * 2).max(SWEEP_AT);
        }
        let key = (epoch, id);
        if t.map.get(&key).is_some_and(busy) {
            return Err(IoError::invalid(format!(
                "transfer id {id} to engine {peer_key:?} is still in flight (an earlier transfer with this id has not finished); \
                 ids must be unique among unfinished transfers to one engine (allocate_transfer_uid gives fresh ones)"
            )));
        }
        // Busy until filled, so a concurrent post of the same id is refused meanwhile.
        t.map.insert(key, None);
        Ok(Reserved { key })
    }

    /// Records the status of the posted transfer in its reserved slot.
    pub(crate) fn fill(&self, r: Reserved, st: &TransferStatus) {
        self.t.lock().map.insert(r.key, Some(st.downgrade()));
    }

    /// Unfinished entries (a diagnostic for tests).
    #[cfg(test)]
    fn live(&self) -> usize {
        self.t.lock().map.values().filter(|s| busy(s)).count()
    }
}

/// Whether a slot still blocks its id: reserved, or a status someone holds that is not done.
fn busy(st: &Option<WeakTransferStatus>) -> bool {
    match st {
        None => true,
        Some(w) => w.upgrade().is_some_and(|s| !s.is_done()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mori_io_core::status::Completion;

    #[test]
    fn an_unfinished_id_is_refused_and_a_finished_one_reused() {
        let f = InFlight::new();
        let st = TransferStatus::new(1);
        let r = f.reserve(7, "b", 1).unwrap();
        let e = f.reserve(7, "b", 1).err().unwrap();
        assert!(e.msg.contains("transfer id 1 to engine \"b\" is still in flight"), "{e}");
        f.fill(r, &st);
        assert!(f.reserve(7, "b", 1).is_err(), "the posted transfer is still running");
        assert!(f.reserve(8, "b", 1).is_ok(), "another incarnation (or engine) is another scope");
        st.complete_piece(Ok(()));
        let r = f.reserve(7, "b", 1).unwrap();
        f.fill(r, &TransferStatus::failed(IoError::invalid("x")));
        assert!(f.reserve(7, "b", 1).is_ok(), "a failed transfer frees its id");
    }

    #[test]
    fn finished_entries_are_swept() {
        let f = InFlight::new();
        let running = TransferStatus::new(1);
        let r = f.reserve(1, "b", 0).unwrap();
        f.fill(r, &running);
        for id in 1..(3 * SWEEP_AT as u64) {
            let r = f.reserve(1, "b", id).unwrap();
            f.fill(r, &TransferStatus::new(0));
        }
        assert!(f.t.lock().map.len() <= 2 * SWEEP_AT, "{} entries kept", f.t.lock().map.len());
        assert_eq!(f.live(), 1);
        assert!(f.reserve(1, "b", 0).is_err(), "the running one survived the sweeps");
    }
}
