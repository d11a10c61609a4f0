//! A rank's set of established connections and the deadline-bound exchange loop that
//! every socket collective is built from.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::conn::{poll_until, Conn, Frame, Pumped};
use crate::error::BootstrapError;
use crate::report::Report;
use crate::wire::Tag;

/// Collective kinds, carried in frame headers so that ranks calling collectives in
/// different orders get a protocol error instead of garbage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Setup = 1,
    Allgather = 2,
    AllToAll = 3,
    Broadcast = 4,
    Barrier = 5,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Setup => "ring setup",
            Op::Allgather => "allgather",
            Op::AllToAll => "all_to_all",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
        }
    }
    fn from_u8(v: u8) -> &'static str {
        match v {
            1 => "ring setup",
            2 => "allgather",
            3 => "all_to_all",
            4 => "broadcast",
            5 => "barrier",
            _ => "unknown op",
        }
    }
}

/// The current collective: which op, its sequence number and deadline.
#[derive(Clone, Copy)]
pub(crate) struct Ctx {
    pub op: Op,
    pub seq: u64,
    pub deadline: Instant,
    pub budget: Duration,
}

/// Connections of one rank, indexed by connection id.
pub(crate) struct Mesh {
    pub conns: Vec<Conn>,
    /// The master address, for errors built from rendezvous reports.
    pub root: SocketAddr,
    /// A report received from a peer that aborted, relayed unchanged on our own abort.
    pub received: Option<Report>,
}

impl Mesh {
    /// Queues a data frame to connection `c`.
    pub fn send(&mut self, c: usize, ctx: &Ctx, payload: Vec<u8>) {
        if let Some(conn) = self.conns.get_mut(c) {
            conn.queue(Tag::Data, ctx.op as u8, ctx.seq, payload);
        }
    }

    /// Flushes all queued output and receives one data frame of `ctx` from each connection
    /// in `from` (results in that order), all before `ctx.deadline`.
    pub fn exchange(&mut self, ctx: &Ctx, from: &[usize]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let mut got: Vec<Option<Vec<u8>>> = vec![None; from.len()];
        loop {
            self.pump_all(ctx.op)?;
            let mut pending = Vec::new();
            for (i, &c) in from.iter().enumerate() {
                if got[i].is_some() {
                    continue;
                }
                let conn = &mut self.conns[c];
                match conn.inbox.pop_front() {
                    Some(f) => got[i] = Some(check(f, ctx, &conn.name)?),
                    None => match &conn.closed {
                        Some(cause) => {
                            return Err(lost(conn.peer, ctx, cause.clone()));
                        }
                        None => pending.push(conn.peer),
                    },
                }
            }
            let sending: Vec<usize> = self.conns.iter().filter(|c| c.has_output()).map(|c| c.peer).collect();
            if pending.is_empty() && sending.is_empty() {
                return Ok(got.into_iter().map(Option::unwrap_or_default).collect());
            }
            let mut fds: Vec<libc::pollfd> = self.conns.iter().filter_map(Conn::interest).collect();
            if !poll_until(&mut fds, ctx.deadline)? {
                let mut waiting_for = pending;
                waiting_for.extend(sending);
                waiting_for.sort_unstable();
                waiting_for.dedup();
                return Err(BootstrapError::Timeout { op: ctx.op.name(), waiting_for, after: ctx.budget });
            }
        }
    }

    /// Writes and reads every connection without blocking. A write failure is
    /// [`BootstrapError::PeerLost`]; an abort frame from a peer becomes its error.
    pub fn pump_all(&mut self, op: Op) -> Result<(), BootstrapError> {
        for i in 0..self.conns.len() {
            let conn = &mut self.conns[i];
            if let Pumped::WriteFailed(cause) = conn.pump()? {
                return Err(BootstrapError::PeerLost { rank: conn.peer, during: op.name(), cause });
            }
            if let Some(abort) = take_abort(conn)? {
                let err = abort.to_error(op.name(), self.root);
                self.received = Some(abort);
                return Err(err);
            }
        }
        Ok(())
    }

    /// Tells every peer about `err` (best effort, never blocks) and closes all connections.
    pub fn abort(&mut self, err: &BootstrapError, me: usize) {
        let report = self.received.clone().unwrap_or_else(|| Report::from_error(err, me));
        let payload = report.encode();
        let mut frame = crate::wire::Header { tag: Tag::Abort, op: 0, seq: 0, len: payload.len() as u64 }.encode().to_vec();
        frame.extend_from_slice(&payload);
        for conn in &mut self.conns {
            conn.abort_and_close(Some(frame.clone()));
        }
    }
}

fn lost(rank: usize, ctx: &Ctx, cause: String) -> BootstrapError {
    BootstrapError::PeerLost { rank, during: ctx.op.name(), cause }
}

/// Removes and decodes an abort frame if one is queued anywhere in the inbox.
fn take_abort(conn: &mut Conn) -> Result<Option<Report>, BootstrapError> {
    let Some(i) = conn.inbox.iter().position(|f| f.hdr.tag == Tag::Abort) else {
        return Ok(None);
    };
    let Some(f) = conn.inbox.remove(i) else {
        return Ok(None);
    };
    Report::decode(&f.payload, &conn.name).map(Some)
}

fn check(f: Frame, ctx: &Ctx, from: &str) -> Result<Vec<u8>, BootstrapError> {
    if f.hdr.tag != Tag::Data {
        return Err(crate::wire::proto(from, format!("unexpected {:?} frame during {}", f.hdr.tag, ctx.op.name())));
    }
    if f.hdr.op != ctx.op as u8 || f.hdr.seq != ctx.seq {
        return Err(crate::wire::proto(
            from,
            format!(
                "sent {} #{} while this rank is in {} #{} (ranks must call collectives in the same order)",
                Op::from_u8(f.hdr.op),
                f.hdr.seq,
                ctx.op.name(),
                ctx.seq
            ),
        ));
    }
    Ok(f.payload)
}
