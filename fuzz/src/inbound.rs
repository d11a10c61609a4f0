//! `inbound`: [`InboundTable`], where every backend records what a peer's notifications and
//! requests say about transfers into this engine: the tcp target side per request
//! (`piece_done` with the request's piece count), the xgmi and fabric backends per decoded
//! `Done`/`DoneMany` notification (`transfers_done`); `pop_inbound_status` reads it. The
//! transfer ids, piece counts and initiator keys in those calls are the peer's bytes.
//!
//! Input: a sequence of operations on up to 80 initiators (more than the 64 idle ones the
//! table keeps). Target `inbound_bulk` runs the same operations after completing more
//! transfers at once than the table keeps (tens of milliseconds an input, hence a target of
//! its own). Each operation is checked against a model: a transfer is finished once
//! `max(total, 1)` pieces were recorded, with the first error of its pieces (a transfer id
//! completed again replaces its status); popping takes a status once. Asserted: every `pop`
//! gives the model's status while that status is among the last [`MAX_FINISHED`] completions,
//! that status or nothing once older (the table may drop it), nothing for a transfer not
//! finished or popped already; and the table keeps no more initiators than have records plus
//! [`MAX_IDLE_PEERS`].

use mori_io_core::inbound::{MAX_FINISHED, MAX_IDLE_PEERS};
use mori_io_core::{ErrorCode, InboundTable, IoError};
use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hasher (as rustc's Fx): the bulk completions insert tens of thousands of
/// keys per input, and SipHash would make them the whole cost of the target.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, b: &[u8]) {
        for &x in b {
            self.write_u64(u64::from(x));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<Fx>>;

/// Initiators the input can name.
const PEERS: usize = 80;

fn key(p: usize) -> String {
    format!("e{p}")
}

/// Records keyed by (initiator index, transfer id), with per-initiator record counts. It
/// drops nothing: a finished status is the table's to keep while it is among the last
/// [`MAX_FINISHED`] completions, and the table's to drop (or still keep) once it is older.
struct Model {
    partial: HashMap<(usize, u64), (u32, Option<IoError>)>,
    /// Finished statuses with the number of their completion (0, 1, ...).
    finished: HashMap<(usize, u64), (u64, Result<(), IoError>)>,
    /// Completions so far.
    done: u64,
    records: [usize; PEERS],
}

impl Model {
    fn new() -> Self {
        Model { partial: HashMap::default(), finished: HashMap::default(), done: 0, records: [0; PEERS] }
    }

    fn piece_done(&mut self, from: usize, id: u64, total: u32, r: Result<(), IoError>) {
        let k = (from, id);
        let e = self.partial.entry(k).or_insert_with(|| {
            self.records[from] += 1;
            (0, None)
        });
        e.0 += 1;
        if let Err(err) = r {
            e.1.get_or_insert(err);
        }
        if e.0 < total.max(1) {
            return;
        }
        let (_, err) = self.partial.remove(&k).unwrap_or((0, None));
        self.records[from] -= 1;
        if self.finished.insert(k, (self.done, err.map_or(Ok(()), Err))).is_none() {
            self.records[from] += 1;
        }
        self.done += 1;
    }

    /// Checks the table's answer to a pop: the status, while it is among the last
    /// `MAX_FINISHED` completions; the status or nothing, once older; nothing for a transfer
    /// not finished, or popped already.
    fn pop(&mut self, from: usize, id: u64, got: Option<Result<(), IoError>>) {
        match self.finished.remove(&(from, id)) {
            None => assert_eq!(got, None, "pop({from}, {id}): a status the table should not have"),
            Some((n, want)) => {
                self.records[from] -= 1;
                if n + MAX_FINISHED as u64 >= self.done {
                    assert_eq!(got, Some(want), "pop({from}, {id}) of completion {n} of {}: kept, must be there", self.done);
                } else {
                    assert!(got.is_none() || got == Some(want), "pop({from}, {id}) of completion {n}: another status");
                }
            }
        }
    }

    /// Initiators with a partial or finished record (the table may have fewer).
    fn busy(&self) -> usize {
        self.records.iter().filter(|&&n| n > 0).count()
    }
}

const CODES: [ErrorCode; 4] = [ErrorCode::InvalidArgs, ErrorCode::NotFound, ErrorCode::RemoteDisconnect, ErrorCode::Transport];

/// One input.
pub fn run(data: &[u8]) {
    run_ops(data, false)
}

/// One input; with `bulk`, its first two bytes pick an initiator and how many more than
/// [`MAX_FINISHED`] transfers it completes before the operations.
pub fn run_ops(data: &[u8], bulk: bool) {
    let t = InboundTable::new();
    let mut m = Model::new();
    let mut c = crate::Cursor::new(data);
    if bulk {
        let p = usize::from(c.u8()) % PEERS;
        let n = MAX_FINISHED as u64 + u64::from(c.u8()) * 16;
        t.transfers_done(&key(p), 0..n);
        for i in 0..n {
            m.piece_done(p, i, 1, Ok(()));
        }
    }
    while !c.is_empty() {
        let op = c.u8();
        let p = usize::from(c.u8()) % PEERS;
        let from = key(p);
        let id = u64::from(c.u8() % 32);
        match op % 4 {
            0 | 1 => {
                let b = c.u8();
                let total = u32::from(b % 4);
                let r =
                    if b & 0x80 == 0 { Ok(()) } else { Err(IoError::new(CODES[usize::from(b >> 5 & 3)], format!("piece {id} refused"))) };
                t.piece_done(&from, id, total, r.clone());
                m.piece_done(p, id, total, r);
            }
            2 => {
                let n = c.u8() % 8;
                let ids: Vec<u64> = (0..n).map(|k| (id + u64::from(k) * 7) % 32).collect();
                t.transfers_done(&from, ids.iter().copied());
                for i in ids {
                    m.piece_done(p, i, 1, Ok(()));
                }
            }
            _ => {
                m.pop(p, id, t.pop(&from, id));
            }
        }
        assert!(t.peers() <= m.busy() + MAX_IDLE_PEERS + 1, "{} initiators kept, {} have records", t.peers(), m.busy());
    }
    // Everything the model still holds is there to pop, once.
    let mut left: Vec<(usize, u64)> = m.finished.keys().filter(|(_, id)| *id < 32).copied().collect();
    left.sort();
    for (p, id) in left {
        let from = key(p);
        m.pop(p, id, t.pop(&from, id));
        assert_eq!(t.pop(&from, id), None, "popped twice ({from}, {id})");
    }
}

/// Pieces of multi-piece transfers with errors, single-piece notifications, pops.
pub fn seeds() -> Vec<Vec<u8>> {
    vec![
        // piece 1/3, 2/3 (refused), pop (nothing yet), 3/3, pop.
        vec![0, 1, 5, 3, 0, 1, 5, 0x83, 3, 1, 5, 0, 1, 5, 3, 3, 1, 5],
        // A notification of 5 ids, pops of two of them.
        vec![2, 7, 2, 5, 3, 7, 2, 3, 7, 9],
        // Many initiators each finishing and popping one transfer.
        (0..70u8).flat_map(|k| [0, k, 1, 1, 3, k, 1]).collect(),
    ]
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
