//! Running a phase: issue each local rank's puts (shared memory inside the node, the proxy
//! across nodes), poll until every local rank is complete or the deadline passes, flush the
//! proxies, decode, and zero the counters the phase consumed.

use super::HostEp;
use crate::accounting::{rdma_algo_token_count, rdma_cross_node_token_count};
use crate::combine::{CombineOptions, Combined, Weighting};
use crate::dispatch::{RankInput, RankRecv};
use crate::dtype::{CombineOut, Element, TopkIndex};
use crate::error::{EpError, EpResult};
use crate::internode::{CombineRank, DispatchRank, Outbox, Proto, Seg, Window};
use crate::layout::OutOfRange;
use crate::proxy::Cmd;
use crate::tensor::Tensor2;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// One rank's side of a phase, as the driver sees it.
trait Phase {
    fn poll(&mut self, proto: &Proto, win: &dyn Window) -> EpResult<Outbox>;
    fn is_complete(&self, proto: &Proto, win: &dyn Window) -> EpResult<bool>;
    fn pending(&self, proto: &Proto, win: &dyn Window) -> Vec<(Seg, usize)>;
}

impl Phase for DispatchRank {
    fn poll(&mut self, proto: &Proto, win: &dyn Window) -> EpResult<Outbox> {
        DispatchRank::poll(self, proto, win)
    }
    fn is_complete(&self, proto: &Proto, win: &dyn Window) -> EpResult<bool> {
        DispatchRank::is_complete(self, proto, win)
    }
    fn pending(&self, proto: &Proto, win: &dyn Window) -> Vec<(Seg, usize)> {
        DispatchRank::pending(self, proto, win)
    }
}

struct CombinePhase<X>(CombineRank, PhantomData<X>);

impl<X: Element> Phase for CombinePhase<X> {
    fn poll(&mut self, proto: &Proto, win: &dyn Window) -> EpResult<Outbox> {
        self.0.poll::<X>(proto, win)
    }
    fn is_complete(&self, proto: &Proto, win: &dyn Window) -> EpResult<bool> {
        self.0.is_complete(proto, win)
    }
    fn pending(&self, proto: &Proto, win: &dyn Window) -> Vec<(Seg, usize)> {
        self.0.pending(proto, win)
    }
}

/// Idle waiting: spin, then yield, then sleep 10 µs doubling to 160 µs (the proxy and the
/// transport's threads need the cores more than a poller does).
fn backoff(idle: u32) {
    match idle {
        0..64 => std::hint::spin_loop(),
        64..256 => std::thread::yield_now(),
        n => std::thread::sleep(Duration::from_micros(10 << ((n - 256) / 16).min(4))),
    }
}

/// A timeout's suspects and segments for rank `me`: the other ranks whose writes are missing
/// (sorted, never `me`: a segment `me` writes itself waits for its own inputs) and the first
/// six segments, each with its writer.
fn missing(me: usize, pend: &[(Seg, usize)]) -> (Vec<usize>, String) {
    let mut writers: Vec<usize> = pend.iter().map(|(_, w)| *w).filter(|&w| w != me).collect();
    writers.sort_unstable();
    writers.dedup();
    let seg = |(s, w): &(Seg, usize)| {
        if *w == me {
            format!("{s} (this rank's own, once its inputs are in)")
        } else {
            format!("{s} (written by rank {w})")
        }
    };
    let waiting = pend.iter().take(6).map(seg).collect::<Vec<_>>().join(", ") + if pend.len() > 6 { ", ..." } else { "" };
    (writers, waiting)
}

/// How often a waiting phase asks the engines whether a writer on another node closed its
/// connections (a mutex and a lookup per peer engine).
const LOST_CHECK: Duration = Duration::from_millis(5);

/// What a phase measured per local rank: µs until complete, proxy bytes and busy µs.
struct PhaseTimes {
    done_us: Vec<f64>,
    inter_bytes: Vec<u64>,
    inter_us: Vec<f64>,
}

impl HostEp {
    /// Dispatches one input per local rank (`inputs[i]` is rank `local_ranks().start + i`'s:
    /// `[T, H]` x, `[T, K]` f32 weights, optional `[T, scale_dim]` f32 scales, `[T, K]` ids) and
    /// returns what each local rank received, in the reference's order (origin rank, then token,
    /// ascending). Every process calls it in the same round.
    ///
    /// Errors: `RankCount` for a wrong number of inputs; [`DispatchRank::start`]'s input errors
    /// (`TooManyTokens`, `Shape`, `ExpertOutOfRange`, ...); `SegmentOverflow` / `Protocol` from a
    /// peer's writes; `Timeout` naming the segments and ranks still missing at the deadline;
    /// `Transport` naming the peer a write to failed; `PeerLost` naming a writer on another
    /// node whose connections to this rank closed while its writes were missing; `PeerFailed`
    /// when another rank gave up first and said which rank failed (its abort word).
    pub fn dispatch<X: Element, I: TopkIndex>(&mut self, inputs: &[RankInput<X, I>]) -> EpResult<Vec<RankRecv<X, I>>> {
        if inputs.len() != self.local.len() {
            return Err(EpError::RankCount { input: "host dispatch inputs", expected: self.local.len(), got: inputs.len() });
        }
        self.usable()?;
        let t0 = Instant::now();
        self.staged.fill(0);
        let cfg = self.proto.config().clone();
        let nodes = self.proto.topology().num_nodes();
        // Every local rank's input is checked (and its puts built) before any rank issues one:
        // bad input on one rank leaves nothing half sent, and the HostEp usable.
        let mut ranks = Vec::with_capacity(inputs.len());
        // Per local rank: its puts, and its RDMA algo and physical token counts.
        let mut outs = Vec::with_capacity(inputs.len());
        for (li, input) in inputs.iter().enumerate() {
            let r = self.local.start + li;
            let (st, out) = DispatchRank::start(&self.proto, r, input)?;
            let ex = cfg.experts_per_rank * cfg.world_size;
            let node = self.proto.topology().node_of_rank(r);
            let algo = rdma_algo_token_count(&input.indices, ex, nodes, OutOfRange::default())?;
            let phys = rdma_cross_node_token_count(&input.indices, ex, nodes, node, OutOfRange::default())?;
            ranks.push(st);
            outs.push((out, algo, phys));
        }
        for (li, (out, algo, phys)) in outs.iter().enumerate() {
            (self.stats[li].rdma_algo_tokens, self.stats[li].rdma_physical_tokens) = (*algo, *phys);
            if li == 0 {
                match self.opts.inject_exit {
                    Some(i @ (super::ProcessInjection::KillInDispatch { nth } | super::ProcessInjection::StopInDispatch { nth }))
                        if nth == self.dispatches =>
                    {
                        i.raise()
                    }
                    _ => {}
                }
            }
            self.issue(li, out).map_err(|e| self.poison(e))?;
        }
        self.dispatches += 1;
        let times = self.drive("dispatch", t0, &mut ranks).map_err(|e| self.fail(e))?;
        let mut recv = Vec::with_capacity(ranks.len());
        for (li, st) in ranks.into_iter().enumerate() {
            let r = self.local.start + li;
            let win = self.win(r)?;
            let (rr, cs) = st.finish::<X, I>(&self.proto, win)?;
            win.zero(self.proto.layout().dispatch_counters());
            self.states[li] = Some(cs);
            let s = &mut self.stats[li];
            s.recv_tokens = rr.num_recv() as u64;
            s.dispatch_us = times.done_us[li];
            s.inter_bytes = times.inter_bytes[li];
            s.inter_dispatch_us = times.inter_us[li];
            recv.push(rr);
        }
        Ok(recv)
    }

    /// Combines the local ranks' processed rows (`xs[i]` `[N_i, H]` in rank i's received order,
    /// optional `weights[i]` `[N_i, K]` f32) back to their sources; returns each local rank's
    /// `[T, H]` output (and `[T, K]` weight sums with weights), summed in the scheme's order.
    ///
    /// Errors: `BadState`-like `Host` when no dispatch preceded it; `RankCount`; `Shape`;
    /// `WeightsRequired`; and the peer errors of [`HostEp::dispatch`].
    pub fn combine<X: Element, O: CombineOut>(
        &mut self,
        xs: &[Tensor2<X>],
        weights: Option<&[Tensor2<f32>]>,
        weighting: Weighting,
    ) -> EpResult<Vec<Combined<O>>> {
        let n = self.local.len();
        self.usable()?;
        if xs.len() != n {
            return Err(EpError::RankCount { input: "host combine x", expected: n, got: xs.len() });
        }
        if let Some(w) = weights {
            if w.len() != n {
                return Err(EpError::RankCount { input: "host combine weights", expected: n, got: w.len() });
            }
        }
        let t0 = Instant::now();
        self.staged.fill(0);
        let opts = CombineOptions { weighting, out_of_range: OutOfRange::default(), order: self.proto.scheme().sum_order() };
        // Every local rank's state and input are checked before any rank's state is taken or
        // any put issued: bad input on one rank loses no dispatch and sends nothing.
        let first = self.local.start;
        let no_dispatch = move |li: usize| EpError::Host {
            what: format!("combine on rank {}", first + li),
            detail: "no dispatch preceded it (each combine follows one dispatch)".into(),
        };
        for (li, x) in xs.iter().enumerate() {
            let st = self.states[li].as_ref().ok_or_else(|| no_dispatch(li))?;
            CombineRank::check(&self.proto, st, x, weights.map(|w| &w[li]), opts)?;
        }
        let mut ranks = Vec::with_capacity(n);
        for (li, x) in xs.iter().enumerate() {
            let st = self.states[li].take().ok_or_else(|| no_dispatch(li))?;
            let (cr, out) = CombineRank::start(&self.proto, st, x, weights.map(|w| &w[li]), opts).map_err(|e| self.poison(e))?;
            ranks.push(CombinePhase::<X>(cr, PhantomData));
            self.issue(li, &out).map_err(|e| self.poison(e))?;
        }
        let times = self.drive("combine", t0, &mut ranks).map_err(|e| self.fail(e))?;
        let mut outs = Vec::with_capacity(n);
        for (li, st) in ranks.into_iter().enumerate() {
            let win = self.win(self.local.start + li)?;
            let c = st.0.finish::<X, O>(&self.proto, win)?;
            win.zero(self.proto.layout().combine_counters());
            self.stats[li].combine_us = times.done_us[li];
            outs.push(c);
        }
        Ok(outs)
    }

    /// Issues local rank `li`'s puts: stages the inter-node bytes and hands all their commands
    /// to the proxy at once (so that it can batch them per peer), then does the intra-node
    /// copies while the network works.
    fn issue(&mut self, li: usize, out: &Outbox) -> EpResult<()> {
        let me = self.local.start + li;
        let area = self.proto.layout().outbox();
        let mut cmds = Vec::new();
        for p in out.puts.iter().filter(|p| !self.proto.same_node(p.dst, me)) {
            let bytes = out.bytes.get(p.src.clone()).unwrap_or(&[]);
            let at = area.start + self.staged[li];
            if at + bytes.len() > area.end {
                return Err(EpError::Host {
                    what: format!("rank {me}'s outbox area"),
                    detail: format!("{} staged bytes exceed its {} bytes", self.staged[li] + bytes.len(), area.len()),
                });
            }
            self.win(me)?.write(at, bytes)?;
            self.staged[li] += bytes.len().next_multiple_of(8);
            let op = p.signal;
            cmds.push(Cmd {
                dst: p.dst as u32,
                local_off: at as u64,
                remote_off: p.offset as u64,
                len: bytes.len() as u64,
                counter: p.counter as u64,
                op: op.into(),
            });
        }
        if !cmds.is_empty() {
            let proxy = self
                .proxies
                .get(li)
                .ok_or_else(|| EpError::Host { what: format!("rank {me}'s proxy"), detail: "none (one-node job)".into() })?;
            for c in cmds {
                proxy.put(c, self.opts.deadline).map_err(|detail| EpError::Transport { rank: me, peer: c.dst as usize, detail })?;
            }
        }
        for p in out.puts.iter().filter(|p| self.proto.same_node(p.dst, me)) {
            let w = self.win(p.dst)?;
            w.write(p.offset, out.bytes.get(p.src.clone()).unwrap_or(&[]))?;
            w.signal(p.counter, p.signal)?;
        }
        Ok(())
    }

    /// `PeerLost` for the first incomplete local rank still missing writes of a rank on another
    /// node that closed every connection to its engine (see [`mori_io::IoEngine::closed_by_peer`]).
    fn check_lost<P: Phase>(&self, phase: &'static str, ranks: &[P], done_us: &[f64]) -> EpResult<()> {
        for (li, st) in ranks.iter().enumerate().filter(|(li, _)| done_us[*li].is_nan()) {
            let (Some(eng), Some(peers)) = (self.engines.get(li), self.peer_mems.get(li)) else { continue };
            let gone = |w: usize| peers.get(w).and_then(Option::as_ref).is_some_and(|m| eng.closed_by_peer(&m.engine_key));
            if !(0..peers.len()).any(gone) {
                continue;
            }
            let r = self.local.start + li;
            let (writers, waiting) = missing(r, &st.pending(&self.proto, self.win(r)?));
            if let Some(&peer) = writers.iter().find(|&&w| gone(w)) {
                return Err(EpError::PeerLost { rank: r, phase, peer, waiting });
            }
        }
        Ok(())
    }

    /// Polls every local rank until all are complete; then flushes the proxies.
    fn drive<P: Phase>(&mut self, phase: &'static str, t0: Instant, ranks: &mut [P]) -> EpResult<PhaseTimes> {
        let n = ranks.len();
        let deadline = t0 + self.opts.deadline;
        let mut done_us = vec![f64::NAN; n];
        let mut idle = 0u32;
        let mut last_lost_check = t0;
        loop {
            let mut all = true;
            for (li, st) in ranks.iter_mut().enumerate() {
                if !done_us[li].is_nan() {
                    continue;
                }
                let win = self
                    .wins
                    .get(&(self.local.start + li))
                    .ok_or_else(|| EpError::Host { what: "window".into(), detail: "unmapped".into() })?;
                let out = st.poll(&self.proto, win)?;
                if !out.puts.is_empty() {
                    idle = 0;
                    self.issue(li, &out)?;
                }
                let win = self.win(self.local.start + li)?;
                if st.is_complete(&self.proto, win)? {
                    done_us[li] = t0.elapsed().as_secs_f64() * 1e6;
                } else {
                    all = false;
                }
            }
            if all {
                break;
            }
            self.check_abort(phase)?;
            for (li, p) in self.proxies.iter().enumerate() {
                if let Some((peer, detail)) = p.failure() {
                    return Err(self.earlier_cause(phase, EpError::Transport { rank: self.local.start + li, peer, detail }));
                }
            }
            if last_lost_check.elapsed() >= LOST_CHECK {
                last_lost_check = Instant::now();
                self.check_lost(phase, ranks, &done_us).map_err(|e| self.earlier_cause(phase, e))?;
            }
            if Instant::now() > deadline {
                let li = done_us.iter().position(|d| d.is_nan()).unwrap_or(0);
                let r = self.local.start + li;
                let pend = ranks[li].pending(&self.proto, self.win(r)?);
                let (writers, waiting) = missing(r, &pend);
                return Err(EpError::Timeout { rank: r, phase, waited_ms: self.opts.deadline.as_millis() as u64, waiting, writers });
            }
            idle = idle.saturating_add(1);
            backoff(idle);
        }
        let mut inter_bytes = vec![0; n];
        let mut inter_us = vec![0.0; n];
        for (li, p) in self.proxies.iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
            let rep = p.flush(left);
            if let Some((peer, detail)) = rep.error {
                return Err(self.earlier_cause(phase, EpError::Transport { rank: self.local.start + li, peer, detail }));
            }
            inter_bytes[li] = rep.bytes;
            inter_us[li] = rep.busy.as_secs_f64() * 1e6;
        }
        Ok(PhaseTimes { done_us, inter_bytes, inter_us })
    }
}

#[cfg(test)]
mod tests {
    use super::missing;
    use crate::error::EpError;
    use crate::internode::Seg;

    #[test]
    fn a_timeout_names_missing_writers_and_never_the_reporting_rank() {
        let pend = [(Seg::Relay(1), 4), (Seg::In(6), 6), (Seg::In(7), 6), (Seg::In(0), 0)];
        let (writers, waiting) = missing(4, &pend);
        assert_eq!(writers, vec![0, 6]);
        assert!(waiting.starts_with("relay segment of origin node 1 (this rank's own, once its inputs are in), dispatch segment of origin rank 6 (written by rank 6)"), "{waiting}");
        let e = EpError::Timeout { rank: 4, phase: "dispatch", waited_ms: 3000, waiting, writers }.to_string();
        assert!(e.starts_with("rank 4: dispatch not complete after 3000 ms: missing writes from ranks [0, 6]; still waiting for "), "{e}");
        assert!(!e.contains("written by rank 4") && !e.contains("alive") && !e.contains("failed"), "{e}");
    }
}
