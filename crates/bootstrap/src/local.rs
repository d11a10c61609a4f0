//! [`LocalBootstrap`]: a group of ranks as threads of one process, over channels.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Select, Sender};
use parking_lot::Mutex;

use crate::error::BootstrapError;
use crate::mesh::Op;
use crate::report::Report;
use crate::{check_all_to_all, check_broadcast, check_len, Bootstrap};

enum Msg {
    Data { op: Op, seq: u64, payload: Vec<u8> },
    Abort(Report),
}

struct LocalState {
    seq: u64,
    poisoned: Option<String>,
}

/// In-process bootstrap: `n` ranks, typically one per thread, with the same collective
/// semantics and deadlines as [`crate::SocketBootstrap`]. Dropping a rank's
/// `LocalBootstrap` while others wait on it makes them fail with
/// [`BootstrapError::PeerLost`]; a rank that never calls makes them fail with
/// [`BootstrapError::Timeout`] after the deadline. A failing rank aborts the group, so the
/// others fail promptly too; after a failure every call returns
/// [`BootstrapError::Poisoned`].
pub struct LocalBootstrap {
    rank: usize,
    n: usize,
    timeout: Duration,
    /// Index `j`: channel to rank `j`.
    tx: Vec<Sender<Msg>>,
    /// Index `i`: channel from rank `i`.
    rx: Vec<Receiver<Msg>>,
    state: Mutex<LocalState>,
}

impl std::fmt::Debug for LocalBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBootstrap").field("rank", &self.rank).field("world_size", &self.n).finish()
    }
}

struct Ctx {
    op: Op,
    seq: u64,
    deadline: Instant,
    /// Set when the failure is a peer's abort (already sent to everyone by its origin).
    aborted: std::cell::Cell<bool>,
}

impl LocalBootstrap {
    /// Creates the `n` ranks of a group (element `r` is rank `r`); `timeout` is the
    /// deadline of each collective. `n == 0` gives an empty vector.
    pub fn new_group(n: usize, timeout: Duration) -> Vec<LocalBootstrap> {
        let mut tx: Vec<Vec<Sender<Msg>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
        let mut rx: Vec<Vec<Receiver<Msg>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
        for from in tx.iter_mut() {
            for to in rx.iter_mut() {
                let (t, r) = unbounded();
                from.push(t);
                to.push(r);
            }
        }
        tx.into_iter()
            .zip(rx)
            .enumerate()
            .map(|(rank, (tx, rx))| LocalBootstrap { rank, n, timeout, tx, rx, state: Mutex::new(LocalState { seq: 0, poisoned: None }) })
            .collect()
    }

    fn run<T>(&self, op: Op, f: impl FnOnce(&Ctx) -> Result<T, BootstrapError>) -> Result<T, BootstrapError> {
        let mut st = self.state.lock();
        if let Some(first) = &st.poisoned {
            return Err(BootstrapError::Poisoned { first: first.clone() });
        }
        st.seq += 1;
        let ctx = Ctx { op, seq: st.seq, deadline: Instant::now() + self.timeout, aborted: false.into() };
        let res = f(&ctx);
        if let Err(e) = &res {
            st.poisoned = Some(e.to_string());
            if !ctx.aborted.get() {
                let r = Report::from_error(e, self.rank);
                for (j, t) in self.tx.iter().enumerate() {
                    if j != self.rank {
                        let _ = t.send(Msg::Abort(r.clone()));
                    }
                }
            }
        }
        res
    }

    /// Sends `sends` (destination, payload), then receives one message from each rank in
    /// `from`, before the deadline.
    fn exchange(&self, ctx: &Ctx, sends: Vec<(usize, Vec<u8>)>, from: &[usize]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let during = ctx.op.name();
        let gone = |rank| BootstrapError::PeerLost { rank, during, cause: "its LocalBootstrap was dropped".into() };
        for (j, payload) in sends {
            self.tx[j].send(Msg::Data { op: ctx.op, seq: ctx.seq, payload }).map_err(|_| gone(j))?;
        }
        let mut got: Vec<Option<Vec<u8>>> = vec![None; from.len()];
        loop {
            let pending: Vec<usize> = (0..from.len()).filter(|&i| got[i].is_none()).collect();
            if pending.is_empty() {
                return Ok(got.into_iter().map(Option::unwrap_or_default).collect());
            }
            let mut sel = Select::new();
            for &i in &pending {
                sel.recv(&self.rx[from[i]]);
            }
            let Ok(oper) = sel.select_deadline(ctx.deadline) else {
                let waiting_for = pending.iter().map(|&i| from[i]).collect();
                return Err(BootstrapError::Timeout { op: during, waiting_for, after: self.timeout });
            };
            let i = pending[oper.index()];
            let src = from[i];
            match oper.recv(&self.rx[src]) {
                Ok(Msg::Data { op, seq, payload }) if op == ctx.op && seq == ctx.seq => got[i] = Some(payload),
                Ok(Msg::Data { op, seq, .. }) => {
                    return Err(crate::wire::proto(
                        &format!("rank {src}"),
                        format!("sent {} #{seq} while this rank is in {during} #{}", op.name(), ctx.seq),
                    ))
                }
                Ok(Msg::Abort(r)) => {
                    ctx.aborted.set(true);
                    return Err(r.to_error(during, SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))));
                }
                Err(_) => return Err(gone(src)),
            }
        }
    }

    fn others(&self) -> Vec<usize> {
        (0..self.n).filter(|&j| j != self.rank).collect()
    }
}

impl Bootstrap for LocalBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.n
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        check_len("allgather", data.len() as u64)?;
        self.run(Op::Allgather, |ctx| {
            let others = self.others();
            let sends = others.iter().map(|&j| (j, data.to_vec())).collect();
            let mut got = self.exchange(ctx, sends, &others)?.into_iter();
            Ok((0..self.n).map(|r| if r == self.rank { data.to_vec() } else { got.next().unwrap_or_default() }).collect())
        })
    }
    fn all_to_all(&self, mut data: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, BootstrapError> {
        check_all_to_all(&data, self.rank, self.n)?;
        self.run(Op::AllToAll, |ctx| {
            let mine = std::mem::take(&mut data[self.rank]);
            let others = self.others();
            let sends = others.iter().map(|&j| (j, std::mem::take(&mut data[j]))).collect();
            let mut got = self.exchange(ctx, sends, &others)?.into_iter();
            let mut mine = Some(mine);
            Ok((0..self.n).map(|r| if r == self.rank { mine.take().unwrap_or_default() } else { got.next().unwrap_or_default() }).collect())
        })
    }
    fn broadcast(&self, root: usize, data: Option<&[u8]>) -> Result<Vec<u8>, BootstrapError> {
        check_broadcast(root, data, self.rank, self.n)?;
        self.run(Op::Broadcast, |ctx| {
            if self.rank == root {
                let bytes = data.unwrap_or_default().to_vec();
                let sends = self.others().into_iter().map(|j| (j, bytes.clone())).collect();
                self.exchange(ctx, sends, &[])?;
                Ok(bytes)
            } else {
                Ok(self.exchange(ctx, Vec::new(), &[root])?.pop().unwrap_or_default())
            }
        })
    }
    fn barrier(&self) -> Result<(), BootstrapError> {
        self.run(Op::Barrier, |ctx| {
            let others = self.others();
            let sends = others.iter().map(|&j| (j, Vec::new())).collect();
            self.exchange(ctx, sends, &others).map(drop)
        })
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
}
