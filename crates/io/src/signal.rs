//! Signalled writes: a write batch whose completion, at the target, updates a 64-bit counter in
//! the target's registered host memory (adds to it, or stores a value) strictly after every
//! byte of the batch is visible there. A consumer on the target polls the counter
//! ([`IoEngine::load_counter`], [`IoEngine::wait_counter`]) and, once it moved, reads the data
//! the writes before it carried, without any message per write.
//!
//! # Guarantee
//!
//! A reader on the target that loads the counter with acquire ordering and sees the effect of
//! a signal sees every byte of the batch that signal followed. The engine applies the
//! signal as an `AtomicU64` operation with release ordering, on the target, only after
//! (1) the initiator saw the batch's status succeed and (2) the target's control thread
//! received the signal, which the initiator sends only after (1). Concurrent signalled writes
//! are not ordered among themselves: give each one its own counter, or count with
//! [`SignalOp::Add`] and wait for the total.
//!
//! # Why the target's engine applies it (and not the transport)
//!
//! A batch is striped: over several tcp lanes (one connection each), or over several RDMA RC
//! queue pairs. Nothing orders one lane or QP against another. A signal carried by the data
//! path itself (a trailing RDMA WRITE_WITH_IMM, an RDMA atomic, a last tcp request) travels on
//! one lane only, and can land at the target while another lane's bytes are still in flight:
//! the counter would move before the data it announces. Ordering holds within one QP, so such
//! a signal would be right only if the whole batch used that one QP, giving up the striping.
//!
//! Instead the initiator waits for the batch's status, which is terminal only once every lane
//! or QP reported its last piece, and succeeds only when all did. A backend never completes a
//! write before its data is at the target (the contract of `mori_io_core::Backend`; for RDMA
//! RC, a WRITE's completion at the initiator follows the responder's acknowledgement, sent
//! once the data is placed in the target's memory; for tcp, a lane's reply follows the copy
//! into the target's memory on that lane's thread). Only then does the initiator send the
//! signal on the control connection, and the target applies it with a release store: every
//! write it follows happened before, on every backend and whatever the lane count. The cost is
//! one control round trip after the data, shared: the engine's delivery thread (the one that
//! carries notifications, `crate::notify`) packs the signals queued meanwhile for one peer into
//! one `Signal` request.
//!
//! Counters live in host memory registered with the target's engine: its CPU applies them
//! (a GPU region is refused with `NotSupported`). A counter must not be a destination of data
//! transfers at the same time (a plain copy racing with an atomic gives unspecified contents,
//! as with DMA; see [`IoEngine::register_memory`]).
//!
//! The initiator checks each signal against the peer's descriptor before anything is sent;
//! the target checks it again against its own registration, holding the registration while it
//! applies it (so `deregister_memory` waits for it), and answers each operation on its own.

use crate::control::CtrlPool;
use crate::engine::{check_incarnation, EngineInner, IoEngine};
use crate::notify::{Job, Payload, RegionBatch};
use mori_io_core::counter::check_counter;
use mori_io_core::status::Completion;
use mori_io_core::wire::{CtrlReply, CtrlRequest, WireSignal};
use mori_io_core::{EngineDesc, IoError, IoResult, MemoryDesc, Op, Region, TransferStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use mori_io_core::SignalOp;

/// Most counter operations packed into one `Signal` request, and taken by one call.
pub(crate) const MAX_SIGNALS_PER_REQUEST: usize = 4096;

/// One counter operation on a peer's registered host memory.
#[derive(Debug, Clone)]
pub struct Signal {
    /// The peer's region holding the counter (host memory).
    pub remote: MemoryDesc,
    /// Byte offset of the counter in `remote`: `offset + 8 <= remote.len`, and the counter's
    /// address 8-byte aligned.
    pub offset: u64,
    /// What to do to the counter.
    pub op: SignalOp,
}

impl IoEngine {
    /// Posts write batch `b` (as [`IoEngine::post`]`(Op::Write, b, None)`); once the batch's
    /// status succeeded (every lane / QP finished: all bytes at the target) sends `signals`
    /// (all to `b.remote`'s engine) in one `Signal` control request; the returned status ends
    /// once the target applied them (release atomics). A failed batch sends no signal: the
    /// status fails with the batch's error. Non-blocking (returns a [`TransferStatus`] at once).
    ///
    /// With no signals it is the plain post. Errors (through the status), before anything is
    /// posted: `InvalidArgs` for more than 4096 signals, a signal naming another engine than
    /// `b.remote`, or a counter outside its region or not 8-byte aligned (naming the signal,
    /// the offset and the limit); `NotSupported` for a counter in GPU memory; `NotFound` for an
    /// unregistered engine; `RemoteDisconnect` for a stale descriptor. Then the batch's errors
    /// (as [`IoEngine::batch_write`]); then the target's refusal of a signal (its region was
    /// deregistered: `NotFound`), naming the signal's region and offset and saying the data
    /// landed, or a control-plane error (`Timeout`, `RemoteDisconnect`: the signals may or may
    /// not have been applied). Each signal is applied or refused on its own.
    pub fn post_signalled(&self, b: &RegionBatch<'_>, signals: &[Signal]) -> TransferStatus {
        if signals.is_empty() {
            return self.post(Op::Write, b, None);
        }
        let (peer, ops) = match check_signals(&self.inner, signals, Some(b.remote)) {
            Ok(x) => x,
            Err(e) => return TransferStatus::failed(e),
        };
        let st = self.post(Op::Write, b, None);
        self.inner.then_deliver(st, peer, Payload::Signals(ops))
    }

    /// Sends `signals` alone (no data) to their engine; the status ends once the target
    /// applied them. All signals must name the same engine. Errors (through the status) as
    /// [`IoEngine::post_signalled`], plus `InvalidArgs` for an empty list or signals naming
    /// two engines.
    pub fn signal(&self, signals: &[Signal]) -> TransferStatus {
        if signals.is_empty() {
            return TransferStatus::failed(IoError::invalid("signal: no signals given (an empty list names no engine)"));
        }
        match check_signals(&self.inner, signals, None) {
            Ok((peer, ops)) => self.inner.deliver_alone(peer, Payload::Signals(ops)),
            Err(e) => TransferStatus::failed(e),
        }
    }

    /// Acquire-load of the u64 counter at `offset` bytes into this engine's registered region
    /// `local`. Errors: `InvalidArgs` for a region of another engine, a counter outside the
    /// region or not 8-byte aligned (naming the offset and the region's length);
    /// `NotSupported` for GPU memory; `NotFound` for a region not (or no longer) registered.
    pub fn load_counter(&self, local: &MemoryDesc, offset: u64) -> IoResult<u64> {
        self.own(local)?;
        let region = self.inner.local_region(local.id)?;
        Ok(counter_at(&region, offset)?.load(Ordering::Acquire))
    }

    /// Waits until the counter at `offset` of `local` is at least `at_least` (spinning
    /// briefly, then sleeping in steps of at most 50 µs); returns the value seen. Errors:
    /// those of [`IoEngine::load_counter`] (a region deregistered meanwhile: `NotFound`);
    /// `Timeout` after `timeout`, naming the offset, the value seen and the deadline.
    pub fn wait_counter(&self, local: &MemoryDesc, offset: u64, at_least: u64, timeout: Duration) -> IoResult<u64> {
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            let v = self.load_counter(local, offset)?;
            if v >= at_least {
                return Ok(v);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(IoError::timeout(format!(
                    "counter at offset {offset} of memory {} is {v}, still below {at_least} after the deadline of {:.3} s",
                    local.id,
                    timeout.as_secs_f64()
                )));
            }
            idle += 1;
            if idle < 256 {
                std::hint::spin_loop();
            } else if idle < 512 {
                std::thread::yield_now();
            } else {
                std::thread::sleep((timeout - waited).min(Duration::from_micros(50)));
            }
        }
    }
}

/// The initiator's checks of `signals` (all to one engine: `batch`'s when given, else the
/// first signal's): the peer they go to and their wire form.
fn check_signals(eng: &EngineInner, signals: &[Signal], batch: Option<&MemoryDesc>) -> IoResult<(Arc<EngineDesc>, Vec<WireSignal>)> {
    if signals.len() > MAX_SIGNALS_PER_REQUEST {
        return Err(IoError::invalid(format!("{} signals in one call, at most {MAX_SIGNALS_PER_REQUEST} are allowed", signals.len())));
    }
    let (key, whose) = match batch {
        Some(b) => (&b.engine_key, "the batch's remote memory"),
        None => (&signals[0].remote.engine_key, "signal 0"),
    };
    let peer = eng.remote(key)?;
    let mut ops = Vec::with_capacity(signals.len());
    for (i, s) in signals.iter().enumerate() {
        let r = &s.remote;
        if r.engine_key != *key {
            return Err(IoError::invalid(format!(
                "signal {i} names memory {} of engine {:?}, but {whose} is at engine {key:?}; one call signals one engine",
                r.id, r.engine_key
            )));
        }
        check_incarnation(r, &peer).map_err(|e| IoError::new(e.code, format!("signal {i}: {}", e.msg)))?;
        check_counter(r.id, r.addr, r.len, r.loc, s.offset).map_err(|e| IoError::new(e.code, format!("signal {i}: {}", e.msg)))?;
        ops.push(WireSignal { mem: r.id, offset: s.offset, op: s.op });
    }
    Ok((peer, ops))
}

/// The counter at `offset` of `region`, once [`check_counter`] accepted it.
fn counter_at(region: &Region, offset: u64) -> IoResult<&AtomicU64> {
    check_counter(region.id, region.addr as u64, region.len, region.loc, offset)?;
    // SAFETY: `offset + 8 <= len` and the address is 8-byte aligned (checked above; the
    // registry refused a range wrapping the address space, so the sum does not overflow). The
    // registration contract (`register_memory`) makes `addr..addr + len` valid for reads and
    // writes by this engine's threads until deregistration returns, and the caller holds
    // `region`, which deregistration waits for; the reference does not outlive that borrow.
    Ok(unsafe { AtomicU64::from_ptr((region.addr + offset as usize) as *mut u64) })
}

/// Target side of a `Signal` request: applies each operation in order, each on its own
/// (looked up among this engine's registrations, held while applied, re-checked against the
/// registration), and says per operation whether it was applied.
pub(crate) fn apply(eng: &EngineInner, ops: &[WireSignal]) -> Vec<Result<(), IoError>> {
    let mut held: Option<Arc<Region>> = None;
    ops.iter()
        .map(|s| {
            let region = match held.take() {
                Some(r) if r.id == s.mem => r,
                _ => eng.local_region(s.mem)?,
            };
            let c = counter_at(&region, s.offset)?;
            match s.op {
                SignalOp::Add(v) => {
                    c.fetch_add(v, Ordering::Release);
                }
                SignalOp::Set(v) => c.store(v, Ordering::Release),
            }
            held = Some(region);
            Ok(())
        })
        .map(|r| r.map_err(|e: IoError| IoError::new(e.code, format!("engine {:?}: {}", eng.desc.key, e.msg))))
        .collect()
}

/// Initiator side: one `Signal` request carrying the operations of `jobs` (all to one peer, at
/// most [`MAX_SIGNALS_PER_REQUEST`] in all, or one job), then each job's status ended with its
/// operations' outcome.
pub(crate) fn deliver(ctrl: &CtrlPool, jobs: Vec<Job>) {
    let peer = jobs[0].peer.clone();
    let mut ops = Vec::new();
    for j in &jobs {
        if let Payload::Signals(s) = &j.payload {
            ops.extend_from_slice(s);
        }
    }
    let n = ops.len();
    let answer = match ctrl.call_at_most_once(&peer, &CtrlRequest::Signal(ops), "applying signals") {
        Ok(CtrlReply::Signalled(v)) if v.len() == n => Ok(v),
        Ok(CtrlReply::Signalled(v)) => {
            Err(IoError::transport(format!("engine {:?} answered {} results for {n} signals", peer.key, v.len())))
        }
        Ok(other) => Err(IoError::transport(format!("engine {:?} answered signals with {other:?}", peer.key))),
        Err(e) => Err(e),
    };
    let mut at = 0;
    for j in jobs {
        let mine: &[WireSignal] = match &j.payload {
            Payload::Signals(s) => s,
            Payload::Msg(_) => &[],
        };
        let k = mine.len();
        let landed = if j.after.is_some() { "the batch's data landed, but " } else { "" };
        let r = match &answer {
            Err(e) => {
                Err(IoError::new(e.code, format!("{landed}{k} signal(s) to engine {:?} were not confirmed applied: {}", peer.key, e.msg)))
            }
            Ok(v) => outcome(&v[at..at + k], mine, landed),
        };
        at += k;
        j.outer.complete_piece(r);
    }
}

/// One job's outcome from its operations' results: the first refusal, naming the signal, its
/// region and offset, and how many others were refused.
fn outcome(results: &[Result<(), IoError>], ops: &[WireSignal], landed: &str) -> Result<(), IoError> {
    let mut failed = results.iter().enumerate().filter_map(|(i, r)| r.as_ref().err().map(|e| (i, e)));
    let Some((i, e)) = failed.next() else { return Ok(()) };
    let more = failed.count();
    let more = if more == 0 { String::new() } else { format!(" ({more} more of its signals were refused)") };
    Err(IoError::new(
        e.code,
        format!("{landed}signal {i} (counter at offset {} of memory {}) was not applied: {}{more}", ops[i].offset, ops[i].mem, e.msg),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mori_io_core::ErrorCode;

    #[test]
    fn outcome_names_the_first_refusal_and_counts_the_rest() {
        let ops: Vec<WireSignal> = (0..4).map(|i| WireSignal { mem: 7, offset: 8 * i, op: SignalOp::Add(1) }).collect();
        assert_eq!(outcome(&[Ok(()), Ok(())], &ops[..2], ""), Ok(()));
        let gone = || Err(IoError::not_found("engine \"t\": memory 7 is not registered"));
        let e = outcome(&[Ok(()), gone(), Ok(()), gone()], &ops, "the batch's data landed, but ").unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(
            e.msg,
            "the batch's data landed, but signal 1 (counter at offset 8 of memory 7) was not applied: engine \"t\": memory 7 is not \
             registered (1 more of its signals were refused)"
        );
    }
}
