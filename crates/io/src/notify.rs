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

use crate::control::CtrlPool;
use crate::engine::{EngineInner, IoEngine};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use mori_io_core::notif::check_msg;
use mori_io_core::status::Completion;
use mori_io_core::wire::{CtrlReply, CtrlRequest};
use mori_io_core::{EngineDesc, IoError, IoResult, MemoryDesc, Op, TransferId, TransferStatus};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most message bytes packed into one `Notify` request (far below the control frame limit).
const MAX_BYTES_PER_REQUEST: usize = 1 << 20;

/// One message to deliver: after `after` succeeded (when given), send `msg` to `peer`, then end
/// `outer` (the status the caller holds).
pub(crate) struct Job {
    peer: Arc<EngineDesc>,
    msg: Vec<u8>,
    after: Option<TransferStatus>,
    outer: TransferStatus,
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
                    j.outer.complete_piece(Err(IoError::bad_state(format!(
                        "notification to engine {:?} not sent: this engine was dropped",
                        j.peer.key
                    ))));
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

/// Sends a burst: failed transfers end their status at once; the rest go per peer, in order,
/// one request per peer and at most [`MAX_BYTES_PER_REQUEST`].
fn deliver(ctrl: &CtrlPool, burst: Vec<Job>) {
    let mut groups: Vec<(Arc<EngineDesc>, Vec<Job>, usize)> = Vec::new();
    for j in burst {
        if let Some(a) = &j.after {
            if !a.succeeded() {
                fail_like(&j.outer, a);
                continue;
            }
        }
        let n = j.msg.len();
        match groups.iter_mut().find(|(p, _, bytes)| p.key == j.peer.key && *bytes + n <= MAX_BYTES_PER_REQUEST) {
            Some((_, jobs, bytes)) => {
                *bytes += n;
                jobs.push(j);
            }
            None => groups.push((j.peer.clone(), vec![j], n)),
        }
    }
    for (peer, jobs, _) in groups {
        let msgs: Vec<Vec<u8>> = jobs.iter().map(|j| j.msg.clone()).collect();
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
}

impl EngineInner {
    /// The status the caller gets for transfer `after` carrying `msg` to `peer`.
    pub(crate) fn with_notif(&self, after: TransferStatus, peer: Arc<EngineDesc>, msg: &[u8]) -> TransferStatus {
        if after.is_done() && !after.succeeded() {
            return after;
        }
        let outer = TransferStatus::new(1);
        outer.drive_like(&after);
        let job = Job { peer, msg: msg.to_vec(), after: Some(after.clone()), outer: outer.clone() };
        let tx = self.notif_tx.clone();
        after.on_done(move || {
            if let Err(e) = tx.send(job) {
                let j = e.into_inner();
                j.outer.complete_piece(Err(IoError::bad_state(format!(
                    "notification to engine {:?} not sent: the engine was dropped",
                    j.peer.key
                ))));
            }
        });
        outer
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
        let outer = TransferStatus::new(1);
        let job = Job { peer, msg: msg.to_vec(), after: None, outer: outer.clone() };
        if self.inner.notif_tx.send(job).is_err() {
            return TransferStatus::failed(IoError::bad_state("the engine's notification thread has ended"));
        }
        outer
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
