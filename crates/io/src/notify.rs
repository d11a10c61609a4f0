//! Notifications (as NIXL's `notif_msg`): a transfer may carry a short message that the target
//! receives, with the initiator's key, once the transfer's data is in place; a message may
//! also be sent alone. The target reads them with [`IoEngine::get_new_notifs`] or waits for
//! the next with [`IoEngine::wait_notif`], without knowing transfer ids.
//!
//! How: the caller's status of a transfer with a message ends only after both the data landed
//! (the backend's status succeeded: for a write the bytes are at the target, for a read they
//! are here and the target's memory is no longer needed) and the target queued the message
//! (a `Notify` control request, answered once queued). The engine's notification thread sends
//! them, packing a burst per peer into one request. A transfer that fails sends nothing; a
//! message the target does not take (queue full, peer gone) fails the status with that error,
//! saying the data landed.
//!
//! The same thread delivers the counter operations of signalled writes (`crate::signal`): a
//! [`Job`] carries either payload, and a burst is packed per peer and kind ([`pack`]), each
//! kind in the order it was queued.

use crate::control::CtrlPool;
use crate::engine::{EngineInner, IoEngine};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use mori_io_core::notif::check_msg;
use mori_io_core::status::Completion;
use mori_io_core::wire::{CtrlReply, CtrlRequest, WireSignal};
use mori_io_core::{EngineDesc, IoError, IoResult, MemoryDesc, Op, TransferId, TransferStatus};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most message bytes packed into one `Notify` request (far below the control frame limit).
const MAX_BYTES_PER_REQUEST: usize = 1 << 20;

/// What a [`Job`] carries to its peer.
pub(crate) enum Payload {
    /// A notification for the target's queue (a `Notify` request).
    Msg(Vec<u8>),
    /// Counter operations on the target's memory (a `Signal` request, see `crate::signal`).
    Signals(Vec<WireSignal>),
}

impl Payload {
    /// What one request of this kind holds at most: message bytes, or counter operations.
    fn weight(&self) -> usize {
        match self {
            Payload::Msg(m) => m.len(),
            Payload::Signals(s) => s.len(),
        }
    }
}

/// One delivery: after `after` succeeded (when given), send `payload` to `peer`, then end
/// `outer` (the status the caller holds).
pub(crate) struct Job {
    pub(crate) peer: Arc<EngineDesc>,
    pub(crate) payload: Payload,
    pub(crate) after: Option<TransferStatus>,
    pub(crate) outer: TransferStatus,
}

/// Starts the engine's notification thread; it ends once the engine shut down (pending
/// messages then fail with `BadState`) or every sender is gone.
pub(crate) fn spawn(ctrl: Arc<CtrlPool>, shutdown: Arc<AtomicBool>) -> IoResult<Sender<Job>> {
    let (tx, rx) = crossbeam_channel::unbounded::<Job>();
    std::thread::Builder::new()
        .name("mori-io-notif".into())
        .spawn(move || run(&rx, &ctrl, &shutdown))
        .map_err(|e| IoError::transport(format!("spawn notification thread: {e}")))?;
    Ok(tx)
}

fn run(rx: &Receiver<Job>, ctrl: &CtrlPool, shutdown: &AtomicBool) {
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(first) => {
                let mut burst = vec![first];
                while burst.len() < 4096 {
                    match rx.try_recv() {
                        Ok(j) => burst.push(j),
                        Err(_) => break,
                    }
                }
                deliver(ctrl, burst);
            }
            Err(RecvTimeoutError::Timeout) if shutdown.load(Ordering::Acquire) => {
                for j in rx.try_iter() {
                    j.fail_unsent("this engine was dropped");
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Fails `outer` as `after` failed (same first error, same entries).
fn fail_like(outer: &TransferStatus, after: &TransferStatus) {
    let err = match after.poll() {
        Some(Err(e)) => e,
        _ => IoError::transport("transfer failed without a recorded error"),
    };
    let fails = after.failed_entries().unwrap_or_default();
    let ranges = if fails.iter().any(|f| f.entries.is_none()) {
        Vec::new()
    } else {
        fails.into_iter().flat_map(|f| f.entries.unwrap_or_default()).collect()
    };
    outer.cancel_pieces_in(1, ranges, err);
}

/// Groups a burst into requests: item `i` (of kind `keys[i]`: its peer and what it carries,
/// weighing `weights[i]`) joins the newest group of its kind while that group stays within
/// `limit(kind)`, else opens a new one; an item heavier than the limit goes alone. Returns
/// the groups as item indices, in the order they are to be sent: every kind's items keep
/// their order across its groups, so a peer applies them in the order they were queued.
pub(crate) fn pack<K: PartialEq>(keys: &[K], weights: &[usize], limit: impl Fn(&K) -> usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<(usize, Vec<usize>, usize)> = Vec::new();
    for (i, (k, &w)) in keys.iter().zip(weights).enumerate() {
        match groups.iter_mut().rev().find(|(first, _, _)| keys[*first] == *k) {
            Some((_, items, total)) if total.saturating_add(w) <= limit(k) => {
                *total += w;
                items.push(i);
            }
            _ => groups.push((i, vec![i], w)),
        }
    }
    groups.into_iter().map(|(_, items, _)| items).collect()
}

/// Sends a burst: failed transfers end their status at once; the rest go per peer and kind,
/// in order, packed by [`pack`] into requests of at most [`MAX_BYTES_PER_REQUEST`] message
/// bytes or [`crate::signal::MAX_SIGNALS_PER_REQUEST`] counter operations.
fn deliver(ctrl: &CtrlPool, burst: Vec<Job>) {
    let mut live = Vec::with_capacity(burst.len());
    for j in burst {
        match &j.after {
            Some(a) if !a.succeeded() => fail_like(&j.outer, a),
            _ => live.push(j),
        }
    }
    let keys: Vec<(&str, bool)> = live.iter().map(|j| (j.peer.key.as_str(), matches!(j.payload, Payload::Signals(_)))).collect();
    let weights: Vec<usize> = live.iter().map(|j| j.payload.weight()).collect();
    let groups = pack(&keys, &weights, |k| if k.1 { crate::signal::MAX_SIGNALS_PER_REQUEST } else { MAX_BYTES_PER_REQUEST });
    let mut slots: Vec<Option<Job>> = live.into_iter().map(Some).collect();
    for g in groups {
        let jobs: Vec<Job> = g.iter().filter_map(|&i| slots[i].take()).collect();
        match jobs.first().map(|j| matches!(j.payload, Payload::Signals(_))) {
            Some(true) => crate::signal::deliver(ctrl, jobs),
            Some(false) => deliver_msgs(ctrl, jobs),
            None => {}
        }
    }
}

/// One `Notify` request carrying the messages of `jobs` (all to one peer).
fn deliver_msgs(ctrl: &CtrlPool, mut jobs: Vec<Job>) {
    let peer = jobs[0].peer.clone();
    let mut msgs = Vec::with_capacity(jobs.len());
    for j in &mut jobs {
        if let Payload::Msg(m) = &mut j.payload {
            msgs.push(std::mem::take(m));
        }
    }
    let r = match ctrl.call(&peer, &CtrlRequest::Notify(msgs), "delivering notifications") {
        Ok(CtrlReply::Delivered) => Ok(()),
        Ok(other) => Err(IoError::transport(format!("engine {:?} answered a notification with {other:?}", peer.key))),
        Err(e) => Err(e),
    };
    for j in jobs {
        j.outer.complete_piece(r.clone().map_err(|e| {
            let landed = if j.after.is_some() { "the transfer's data landed, but its" } else { "the" };
            IoError::new(e.code, format!("{landed} notification to engine {:?} was not delivered: {}", peer.key, e.msg))
        }));
    }
}

impl EngineInner {
    /// The status the caller gets for transfer `after` followed by `payload` to `peer`: it ends
    /// as `after` when that fails (nothing is sent), else once the peer answered the payload.
    pub(crate) fn then_deliver(&self, after: TransferStatus, peer: Arc<EngineDesc>, payload: Payload) -> TransferStatus {
        if after.is_done() && !after.succeeded() {
            return after;
        }
        let outer = TransferStatus::new(1);
        outer.drive_like(&after);
        let job = Job { peer, payload, after: Some(after.clone()), outer: outer.clone() };
        let tx = self.notif_tx.clone();
        after.on_done(move || {
            if let Err(e) = tx.send(job) {
                e.into_inner().fail_unsent("the engine was dropped");
            }
        });
        outer
    }

    /// The status the caller gets for transfer `after` carrying `msg` to `peer`.
    pub(crate) fn with_notif(&self, after: TransferStatus, peer: Arc<EngineDesc>, msg: &[u8]) -> TransferStatus {
        self.then_deliver(after, peer, Payload::Msg(msg.to_vec()))
    }

    /// Queues `payload` for `peer` alone (no transfer before it); the status ends once the peer
    /// answered it.
    pub(crate) fn deliver_alone(&self, peer: Arc<EngineDesc>, payload: Payload) -> TransferStatus {
        let outer = TransferStatus::new(1);
        let job = Job { peer, payload, after: None, outer: outer.clone() };
        if self.notif_tx.send(job).is_err() {
            return TransferStatus::failed(IoError::bad_state("the engine's notification thread has ended"));
        }
        outer
    }
}

impl Job {
    /// Ends the caller's status: this job was never sent, because of `why`.
    fn fail_unsent(self, why: &str) {
        let what = match self.payload {
            Payload::Msg(_) => "notification",
            Payload::Signals(_) => "signal",
        };
        self.outer.complete_piece(Err(IoError::bad_state(format!("{what} to engine {:?} not sent: {why}", self.peer.key))));
    }
}

/// One batch between two registered regions, as [`IoEngine::post`] and
/// [`IoEngine::post_multi`] take it: entry `i` moves `sizes[i]` bytes between `local_offs[i]`
/// of `local` and `remote_offs[i]` of `remote` (offsets and sizes in bytes).
#[derive(Debug, Clone, Copy)]
pub struct RegionBatch<'a> {
    /// This engine's region.
    pub local: &'a MemoryDesc,
    /// Byte offsets into `local`.
    pub local_offs: &'a [u64],
    /// The peer's region.
    pub remote: &'a MemoryDesc,
    /// Byte offsets into `remote`.
    pub remote_offs: &'a [u64],
    /// Bytes per entry.
    pub sizes: &'a [u64],
    /// The transfer's id ([`IoEngine::allocate_transfer_uid`]).
    pub id: TransferId,
}

impl IoEngine {
    /// Posts one batch in direction `op`; with `notif`, the target receives that message
    /// (see [`IoEngine::get_new_notifs`]) once the data is in place, and the returned status
    /// ends only after it was queued there. Errors as [`IoEngine::batch_read`], plus
    /// `InvalidArgs` for a message over [`mori_io_core::MAX_NOTIF_LEN`] bytes, and the target's
    /// refusal of the message (`Refused`: its queue is full) saying the data landed.
    pub fn post(&self, op: Op, b: &RegionBatch<'_>, notif: Option<&[u8]>) -> TransferStatus {
        if let Some(m) = notif {
            if let Err(e) = check_msg(m) {
                return TransferStatus::failed(e);
            }
        }
        let st = match op {
            Op::Read => self.batch_read(b.local, b.local_offs, b.remote, b.remote_offs, b.sizes, b.id),
            Op::Write => self.batch_write(b.local, b.local_offs, b.remote, b.remote_offs, b.sizes, b.id),
        };
        match notif {
            None => st,
            Some(m) => match self.inner.registered_remote(&b.remote.engine_key) {
                Some(peer) => self.inner.with_notif(st, peer, m),
                None => st,
            },
        }
    }

    /// [`IoEngine::post`] (no message) whose segments land in order: every byte of an entry is
    /// visible at the target before any byte of a later entry is written, so a reader that
    /// sees a later entry's bytes (a completion word) may read the earlier ones. Entries are
    /// not merged (each is its own copy; bytes inside one entry land in no particular order).
    /// Errors (through the status): those
    /// of [`IoEngine::post`]; `NotSupported` before anything is posted when the backend chosen
    /// for the pair of regions cannot keep the order (today only xgmi can: one stream, copies
    /// in order).
    pub fn post_ordered(&self, op: Op, b: &RegionBatch<'_>) -> TransferStatus {
        let batch = crate::paged::Batch::Ranges(b.local_offs, b.remote_offs, b.sizes);
        self.post_batch_in(op, b.local, b.remote, batch, b.id, true)
    }

    /// Posts several batches, each between its own pair of regions and with its own id, in
    /// one call (MORI's multi-pair `batch_read`/`batch_write`); one status per batch, in
    /// order. Each batch is checked and fails on its own (errors as [`IoEngine::batch_read`]).
    pub fn post_multi(&self, op: Op, batches: &[RegionBatch<'_>]) -> Vec<TransferStatus> {
        batches.iter().map(|b| self.post(op, b, None)).collect()
    }

    /// Sends `msg` to engine `remote_key` alone (no data); the status ends once the target
    /// queued it. Errors: `NotFound` for an unregistered engine; `InvalidArgs` for a message
    /// over [`mori_io_core::MAX_NOTIF_LEN`] bytes; the target's refusal; control-plane errors.
    pub fn send_notif(&self, remote_key: &str, msg: &[u8]) -> TransferStatus {
        if let Err(e) = check_msg(msg) {
            return TransferStatus::failed(e);
        }
        let Some(peer) = self.inner.registered_remote(remote_key) else {
            return TransferStatus::failed(IoError::not_found(format!(
                "engine {remote_key:?} is not registered here; call register_remote_engine with its descriptor"
            )));
        };
        self.inner.deliver_alone(peer, Payload::Msg(msg.to_vec()))
    }

    /// Takes every notification received since the last call: per sending engine's key, its
    /// messages in the order they arrived. Never blocks.
    pub fn get_new_notifs(&self) -> HashMap<String, Vec<Vec<u8>>> {
        self.inner.notifs.take_all()
    }

    /// Takes the oldest unread notification (sender's key, message), waiting up to `timeout`
    /// for one. Errors: `Timeout` naming the deadline when none came.
    pub fn wait_notif(&self, timeout: Duration) -> IoResult<(String, Vec<u8>)> {
        self.inner
            .notifs
            .wait_next(timeout)
            .ok_or_else(|| IoError::timeout(format!("no notification arrived within {:.3} s", timeout.as_secs_f64())))
    }
}

#[cfg(test)]
mod tests {
    use super::pack;

    #[test]
    fn a_kind_keeps_its_order_and_a_full_group_is_not_reopened() {
        // Peer "a" with a limit of 10: 9 fills the first group, 5 opens a second, and 1 (which
        // would still fit the first) goes to the second, behind 5, not ahead of it.
        let keys = ["a", "a", "b", "a", "a", "b"];
        let weights = [9, 5, 3, 1, 20, 8];
        let g = pack(&keys, &weights, |k| if *k == "a" { 10 } else { 100 });
        assert_eq!(g, vec![vec![0], vec![1, 3], vec![2, 5], vec![4]], "20 is over the limit: alone");
        assert!(pack::<&str>(&[], &[], |_| 1).is_empty());
    }

    #[test]
    fn packs_bursts_within_limits_in_order() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..500 {
            let n = next(200) as usize;
            let keys: Vec<(u64, bool)> = (0..n).map(|_| (next(3), next(2) == 0)).collect();
            let weights: Vec<usize> = (0..n).map(|_| next(40) as usize).collect();
            let limit = |k: &(u64, bool)| if k.1 { 50 } else { 64 };
            let groups = pack(&keys, &weights, limit);
            let mut seen = vec![false; n];
            let mut last_of: std::collections::HashMap<(u64, bool), (usize, usize)> = Default::default();
            for g in &groups {
                let k = keys[g[0]];
                let w: usize = g.iter().map(|&i| weights[i]).sum();
                assert!(g.len() == 1 || w <= limit(&k), "group {g:?} weighs {w}");
                assert!(g.windows(2).all(|p| p[0] < p[1]), "in order within a group");
                if let Some(&(last, last_w)) = last_of.get(&k) {
                    assert!(last < g[0], "a later group of a kind holds only later items");
                    assert!(last_w + weights[g[0]] > limit(&k), "a group opened only when the last one was full");
                }
                for &i in g {
                    assert_eq!(keys[i], k, "one kind per group");
                    assert!(!std::mem::replace(&mut seen[i], true), "item {i} packed twice");
                }
                last_of.insert(k, (*g.last().unwrap(), w));
            }
            assert!(seen.iter().all(|&s| s), "every item packed");
        }
    }
}
