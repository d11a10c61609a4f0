//! The proxy: one thread per rank that carries out the rank's inter-node puts as MORI-IO
//! writes (the bytes from the rank's window to the peer's window), each followed, once the
//! bytes are visible there, by a counter operation (a MORI-IO signal, applied by the peer's
//! engine) or a tail write (16 bytes into the peer's window, posted by this thread).
//!
//! Producers hand it fixed-size commands ([`crate::ring::RingCmd`]) through a bounded ring: a channel for
//! the host executor's threads (`Proxy`), or a [`crate::ring`] in shared memory for GPU warps
//! ([`RingProxy`]). It posts each burst without waiting, keeps the statuses, and reports the
//! first failure naming the destination rank. The commands of one burst to one peer become one
//! batch (its entries stripe over the transport's lanes or QPs; its signals follow all of its
//! bytes). A flush waits, with a deadline, for every posted write.
//! For tests the channel proxy can delay every command by a random time and shuffle each burst
//! ([`crate::host::ProxyInjection`]); the protocol must give the same results.

use crate::host::ProxyInjection;
use crate::ring::{CmdOp, TAIL_WRITE_BYTES};
use crate::routing::SplitMix64;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use mori_io::{IoEngine, IoError, MemoryDesc, RegionBatch, Signal, TransferStatus};
use mori_io_core::status::Completion;
use parking_lot::Mutex;
mod burst;
mod ring_proxy;
use ring_proxy::SharedStats;
pub use ring_proxy::{RingProxy, RingProxyOptions, RingProxyStats, TailWords, GROUPED_ENV, SESSIONS_ENV, TAIL_WORDS_ENV};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most commands in one batched signalled write (well below MORI-IO's signals per request).
const MAX_BATCH: usize = 1024;

/// Commands the ring holds (a full ring blocks the producer until the proxy took one).
pub(crate) const RING_SLOTS: usize = 4096;

pub use crate::ring::RingCmd as Cmd;

/// Where a proxy writes for one peer rank: its data window and the region its counters are in
/// (the same region for the host executor; pinned host memory beside a GPU window, since a
/// signal is applied by the peer's engine on the CPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerWindow {
    /// The peer's window (destination of the bytes).
    pub data: MemoryDesc,
    /// The peer's counter region (destination of the counter operations).
    pub counters: MemoryDesc,
}

impl PeerWindow {
    /// Data and counters in one region.
    pub fn single(m: MemoryDesc) -> Self {
        Self { data: m.clone(), counters: m }
    }
}

/// What a flush reports: the bytes written since the previous flush, the time from the first
/// post to the last completion, or the first failure (destination rank, message).
#[derive(Debug, Clone, Default)]
pub(crate) struct FlushReport {
    pub bytes: u64,
    pub busy: Duration,
    pub error: Option<(usize, String)>,
}

enum Msg {
    Put(Cmd),
    Flush(Duration, Sender<FlushReport>),
}

/// The handle the rank's driver holds.
pub(crate) struct Proxy {
    tx: Option<Sender<Msg>>,
    failed: Arc<Mutex<Option<(usize, String)>>>,
    thread: Option<JoinHandle<()>>,
}

struct State {
    engine: Arc<IoEngine>,
    local: MemoryDesc,
    peers: Vec<Option<PeerWindow>>,
    inject: Option<(ProxyInjection, SplitMix64)>,
    inflight: Vec<(usize, u64, TransferStatus)>,
    /// Per destination: its backend refused an ordered batch (tail writes then follow the
    /// data's completion).
    unordered: Vec<bool>,
    /// A burst of ordered batches goes to the engine in one call (`burst.rs`).
    grouped: bool,
    /// Ordered batches go through a session per destination where its backend posts them
    /// (`burst.rs`).
    sessions: bool,
    /// Which bursts send their counter pairs as tail words (`burst.rs`).
    tail_words: TailWords,
    /// Per destination: its session (`None` inside: none could be made, or its backend posts
    /// no ordered batch over one); not tried yet when `None`.
    session: Vec<Option<Option<mori_io::Session>>>,
    failed: Arc<Mutex<Option<(usize, String)>>>,
    bytes: u64,
    /// When the proxy started: the origin of `last_done`.
    base: Instant,
    first: Option<Instant>,
    /// Nanoseconds after `base` at which the latest write completed (set by the statuses'
    /// completion callbacks, so the reaping interval does not count).
    last_done: Arc<AtomicU64>,
    /// When the commands being posted were taken from the ring or channel.
    taken: Instant,
    /// Per-write timing ([`RingProxyStats`]).
    timing: Arc<SharedStats>,
    /// Tail writes whose command's bytes landed, for this thread to post.
    follow_tx: Sender<Followup>,
    follow_rx: Receiver<Followup>,
}

/// A command's tail writes (`(src in the local window, offset in the peer's window)`, 16 bytes
/// each), posted after its bytes landed; they end one piece of `outer`.
struct Followup {
    tails: Vec<(u64, u64)>,
    remote: MemoryDesc,
    outer: TransferStatus,
}

impl Proxy {
    /// Starts the proxy of a rank whose window is `local` in `engine`; `peers[r]` is rank `r`'s
    /// window (for ranks on other nodes).
    pub(crate) fn start(
        rank: usize,
        engine: Arc<IoEngine>,
        local: MemoryDesc,
        peers: Vec<Option<PeerWindow>>,
        inject: Option<ProxyInjection>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded(RING_SLOTS);
        let failed = Arc::new(Mutex::new(None));
        let inject = inject.map(|i| (i, SplitMix64::new(i.seed ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))));
        let mut st = State::new(engine, local, peers, failed.clone());
        st.inject = inject;
        // The host executor's windows are host memory, which no backend takes over a session.
        st.sessions = false;
        let thread = std::thread::Builder::new().name(format!("mori-ep-proxy-{rank}")).spawn(move || st.run(&rx))?;
        Ok(Self { tx: Some(tx), failed, thread: Some(thread) })
    }

    /// Queues a put, waiting up to `timeout` for a free slot. Errors with a message when the
    /// ring stayed full or the proxy ended.
    pub(crate) fn put(&self, cmd: Cmd, timeout: Duration) -> Result<(), String> {
        let tx = self.tx.as_ref().ok_or("the proxy was stopped")?;
        tx.send_timeout(Msg::Put(cmd), timeout).map_err(|e| match e {
            crossbeam_channel::SendTimeoutError::Timeout(_) => {
                format!("the proxy's command ring stayed full ({RING_SLOTS} slots) for {timeout:?}")
            }
            crossbeam_channel::SendTimeoutError::Disconnected(_) => "the proxy thread ended".to_string(),
        })
    }

    /// The first failure seen so far (destination rank, message), without waiting.
    pub(crate) fn failure(&self) -> Option<(usize, String)> {
        self.failed.lock().clone()
    }

    /// Waits until every put queued before it completed, up to `timeout`.
    pub(crate) fn flush(&self, timeout: Duration) -> FlushReport {
        let fail = |m: &str| FlushReport { error: Some((usize::MAX, m.to_string())), ..FlushReport::default() };
        let Some(tx) = self.tx.as_ref() else { return fail("the proxy was stopped") };
        let (rtx, rrx) = crossbeam_channel::bounded(1);
        if tx.send_timeout(Msg::Flush(timeout, rtx), timeout).is_err() {
            return fail("the proxy did not take the flush (ring full or thread ended)");
        }
        rrx.recv_timeout(timeout + Duration::from_secs(1)).unwrap_or_else(|_| fail("the proxy did not answer the flush in time"))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl State {
    fn new(engine: Arc<IoEngine>, local: MemoryDesc, peers: Vec<Option<PeerWindow>>, failed: Arc<Mutex<Option<(usize, String)>>>) -> Self {
        let (follow_tx, follow_rx) = crossbeam_channel::unbounded();
        let unordered = vec![false; peers.len()];
        let n = peers.len();
        State {
            follow_tx,
            follow_rx,
            engine,
            local,
            peers,
            inject: None,
            inflight: Vec::new(),
            unordered,
            grouped: true,
            sessions: true,
            tail_words: TailWords::Off,
            session: (0..n).map(|_| None).collect(),
            failed,
            bytes: 0,
            base: Instant::now(),
            first: None,
            last_done: Arc::new(AtomicU64::new(0)),
            taken: Instant::now(),
            timing: Arc::new(SharedStats::default()),
        }
    }

    /// Posts a burst and empties it: one batch per destination (ascending; each destination's
    /// commands keep their order), at most `MAX_BATCH` commands each. A batch of data and
    /// tail writes goes as an ordered batch where the backend keeps a batch's order
    /// (`burst.rs`); when every batch of the burst is one, they go to the engine in one call
    /// (unless `grouped` is off).
    fn post_burst(&mut self, cmds: &mut Vec<Cmd>) {
        cmds.sort_by_key(|c| c.dst);
        let parts: Vec<&[Cmd]> = cmds.chunk_by(|a, b| a.dst == b.dst).flat_map(|g| g.chunks(MAX_BATCH)).collect();
        if self.grouped && parts.iter().all(|p| self.takes_ordered(p)) {
            self.post_ordered_parts(&parts);
        } else {
            for part in parts {
                if self.takes_ordered(part) {
                    self.post_ordered_parts(&[part]);
                } else {
                    self.post(part);
                }
            }
        }
        cmds.clear();
    }

    fn run(&mut self, rx: &Receiver<Msg>) {
        loop {
            let first = match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    self.reap();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            // A burst: everything queued now, up to a flush (which stays last).
            let mut burst = vec![first];
            while !matches!(burst.last(), Some(Msg::Flush(..))) && burst.len() < RING_SLOTS {
                match rx.try_recv() {
                    Ok(m) => burst.push(m),
                    Err(_) => break,
                }
            }
            self.taken = Instant::now();
            let flush = match burst.last() {
                Some(Msg::Flush(..)) => burst.pop(),
                _ => None,
            };
            let mut cmds: Vec<Cmd> = burst.into_iter().filter_map(|m| if let Msg::Put(c) = m { Some(c) } else { None }).collect();
            if let Some((inj, rng)) = &mut self.inject {
                if inj.reorder {
                    for i in (1..cmds.len()).rev() {
                        cmds.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                }
            }
            if let Some(us) = self.inject.as_ref().map(|(i, _)| i.max_delay.as_micros() as u64) {
                for c in cmds {
                    let d = self.inject.as_mut().map_or(0, |(_, rng)| rng.below(us + 1));
                    std::thread::sleep(Duration::from_micros(d));
                    self.post(&[c]);
                }
            } else {
                // One batch per peer: its entries stripe over the lanes / QPs together, and
                // its signals are applied once all of its bytes landed.
                self.post_burst(&mut cmds);
            }
            self.reap();
            if let Some(Msg::Flush(timeout, reply)) = flush {
                let _ = reply.send(self.flush(timeout));
            }
        }
    }

    /// Posts `cmds` (all to one destination) as one signalled write: every data entry in one
    /// batch; once all of them landed, every counter operation (one MORI-IO signal request)
    /// and every tail write ([`CmdOp::Tail`], one write batch posted by this thread). (Tail
    /// writes that can ride in the data's ordered batch go through `burst.rs` instead.)
    fn post(&mut self, cmds: &[Cmd]) {
        let Some(dst) = cmds.first().map(|c| c.dst as usize) else { return };
        let Some(peer) = self.peers.get(dst).cloned().flatten() else {
            self.fail(dst, format!("rank {dst} has no window registered with this rank's engine (it is on this node, or out of range)"));
            return;
        };
        let mut sigs = Vec::new();
        let mut tails = Vec::new();
        for c in cmds {
            let op = match c.op {
                CmdOp::Add(v) => mori_io::SignalOp::Add(v),
                CmdOp::Set(v) => mori_io::SignalOp::Set(v),
                CmdOp::Tail { src, .. } => {
                    tails.push((src, c.counter));
                    continue;
                }
            };
            sigs.push(Signal { remote: peer.counters.clone(), offset: c.counter, op });
        }
        // The leg's clock starts before the first post (a backend may move bytes inside it).
        self.first.get_or_insert_with(Instant::now);
        let data: Vec<&Cmd> = cmds.iter().filter(|c| c.len > 0).collect();
        let len: u64 = data.iter().map(|c| c.len).sum();
        // Signals alone go through MORI-IO's signalled write (which checks every counter
        // before anything is posted); tail writes here are this proxy's own second step.
        let call = Instant::now();
        let (lo, ro, sz) = burst::data_entries(&data);
        let b = RegionBatch {
            local: &self.local,
            local_offs: &lo,
            remote: &peer.data,
            remote_offs: &ro,
            sizes: &sz,
            id: self.engine.allocate_transfer_uid(),
        };
        let st = match (tails.is_empty(), data.is_empty()) {
            (true, true) => self.engine.signal(&sigs),
            (true, false) => self.engine.post_signalled(&b, &sigs),
            (false, _) => self.post_with_tails((!data.is_empty()).then_some(&b), sigs, tails, peer.data.clone()),
        };
        self.timing.count_call(call);
        self.track(dst, len, st);
    }

    /// Keeps a posted batch's status (`len` data bytes to `dst`) and times it.
    fn track(&mut self, dst: usize, len: u64, st: TransferStatus) {
        let (base, last, taken, timing, done) = (self.base, self.last_done.clone(), self.taken, self.timing.clone(), st.clone());
        timing.post_ns.fetch_add(taken.elapsed().as_nanos() as u64, Ordering::Relaxed);
        st.on_done(move || {
            last.fetch_max(base.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let ns = taken.elapsed().as_nanos() as u64;
            timing.done_ns.fetch_add(ns, Ordering::Relaxed);
            timing.done_ns_max.fetch_max(ns, Ordering::Relaxed);
            if len > 0 && matches!(done.poll(), Some(Ok(()))) {
                timing.write_batches.fetch_add(1, Ordering::Relaxed);
                timing.write_bytes.fetch_add(len, Ordering::Relaxed);
                timing.write_done_ns.fetch_add(ns, Ordering::Relaxed);
            }
        });
        self.inflight.push((dst, len, st));
    }

    /// The batch `data` (if any), then, once its bytes landed, `sigs` (one MORI-IO signal
    /// request, from the completing thread) and `tails` (handed back to this thread: posting a
    /// copy from inside a copy's completion could wait on the pool that completion holds).
    /// The returned status ends when both did, or as the data write when that failed (then
    /// nothing follows).
    fn post_with_tails(
        &self,
        data: Option<&RegionBatch<'_>>,
        sigs: Vec<Signal>,
        tails: Vec<(u64, u64)>,
        remote: MemoryDesc,
    ) -> TransferStatus {
        let outer = <TransferStatus as Completion>::new(1);
        let pieces = 1 + u32::from(!sigs.is_empty());
        if pieces == 2 {
            outer.add_pieces(1);
        }
        let follow = Followup { tails, remote, outer: outer.clone() };
        let (engine, tx, o) = (self.engine.clone(), self.follow_tx.clone(), outer.clone());
        let after = move |landed: Result<(), IoError>| match landed {
            Err(e) => o.cancel_pieces(pieces, None, e),
            Ok(()) => {
                if !sigs.is_empty() {
                    let s = engine.signal(&sigs);
                    let (s2, o2) = (s.clone(), o.clone());
                    s.on_done(move || o2.complete_piece(s2.poll().unwrap_or_else(|| Err(IoError::bad_state("signal ended undone")))));
                }
                if let Err(e) = tx.send(follow) {
                    e.into_inner().outer.complete_piece(Err(IoError::bad_state("the proxy stopped before its tail write")));
                }
            }
        };
        match data {
            None => after(Ok(())),
            Some(b) => {
                let st = self.engine.post(mori_io::Op::Write, b, None);
                outer.drive_like(&st);
                let (timing, taken, d) = (self.timing.clone(), self.taken, st.clone());
                st.on_done(move || {
                    timing.data_ns.fetch_add(taken.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    timing.data_batches.fetch_add(1, Ordering::Relaxed);
                    after(d.poll().unwrap_or_else(|| Err(IoError::bad_state("write ended undone"))));
                });
            }
        }
        outer
    }

    /// Posts the tail writes whose bytes landed (handed over by completion hooks); each ends
    /// one piece of its command's status.
    fn post_followups(&mut self) {
        while let Ok(f) = self.follow_rx.try_recv() {
            let (lo, ro): (Vec<u64>, Vec<u64>) = f.tails.iter().copied().unzip();
            let sz = vec![TAIL_WRITE_BYTES; lo.len()];
            let b = RegionBatch {
                local: &self.local,
                local_offs: &lo,
                remote: &f.remote,
                remote_offs: &ro,
                sizes: &sz,
                id: self.engine.allocate_transfer_uid(),
            };
            let call = Instant::now();
            let t = self.engine.post(mori_io::Op::Write, &b, None);
            self.timing.count_call(call);
            let (t2, o) = (t.clone(), f.outer);
            t.on_done(move || o.complete_piece(t2.poll().unwrap_or_else(|| Err(IoError::bad_state("tail write ended undone")))));
        }
    }

    fn fail(&mut self, dst: usize, msg: String) {
        let mut f = self.failed.lock();
        if f.is_none() {
            *f = Some((dst, msg));
        }
    }

    /// Drops the completed statuses, recording the first failure.
    /// Completes what finished. Each status is driven (the backend's completion step runs on
    /// this thread, so the backend's own completion thread stands back instead of spinning
    /// beside the proxy: with a proxy per rank, those threads outnumbered the cores).
    fn reap(&mut self) {
        self.post_followups();
        // One completion step covers every write of this engine's backend.
        if let Some(f) = self.inflight.first() {
            f.2.drive();
        }
        let mut i = 0;
        while i < self.inflight.len() {
            match self.inflight[i].2.poll() {
                None => i += 1,
                Some(r) => {
                    let (dst, len, _) = self.inflight.swap_remove(i);
                    self.done(dst, len, r);
                }
            }
        }
    }

    fn done(&mut self, dst: usize, len: u64, r: Result<(), mori_io::IoError>) {
        match r {
            Ok(()) => self.bytes += len,
            Err(e) => self.fail(dst, format!("signalled write to rank {dst} failed: {e}")),
        }
    }

    fn flush(&mut self, timeout: Duration) -> FlushReport {
        let deadline = Instant::now() + timeout;
        for (dst, len, st) in std::mem::take(&mut self.inflight) {
            // Waits in short steps: a command's tail write is posted by this thread once its
            // bytes landed.
            let r = loop {
                self.post_followups();
                if let Some(r) = st.poll() {
                    break r;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Err(IoError::timeout(format!("not complete within the flush deadline of {:.3} s", timeout.as_secs_f64())));
                }
                // Ends early when the status does (its own result is taken above next turn).
                let _ = st.wait_for(left.min(Duration::from_micros(200)));
            };
            self.done(dst, len, r);
        }
        let last = self.base + Duration::from_nanos(self.last_done.swap(0, Ordering::Relaxed));
        let busy = self.first.take().map_or(Duration::ZERO, |a| last.saturating_duration_since(a));
        let rep = FlushReport { bytes: std::mem::take(&mut self.bytes), busy, error: self.failed.lock().clone() };
        rep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mori_io::{BackendConfig, EngineConfig, MemLoc, TcpConfig};

    /// A write that already failed with a timeout-coded error (a tcp lane's read deadline) is
    /// reported by a flush at once, with its own message, not after the flush deadline.
    #[test]
    fn flush_reports_a_failed_write_at_once_with_its_message() {
        let e = IoEngine::new("proxy-flush", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        e.create_backend(BackendConfig::Tcp(TcpConfig::default())).unwrap();
        let mut buf = vec![0u8; 64];
        // SAFETY: buf outlives the registration (deregistered below).
        let m = unsafe { e.register_memory(buf.as_mut_ptr(), 64, MemLoc::Host { numa: None }).unwrap() };
        let e = Arc::new(e);
        let mut st = State::new(e.clone(), m.clone(), vec![], Arc::new(Mutex::new(None)));
        st.inflight.push((3, 8, <TransferStatus as Completion>::failed(IoError::timeout("tcp lane 3: read timed out"))));
        let t0 = Instant::now();
        let rep = st.flush(Duration::from_secs(2));
        assert!(t0.elapsed() < Duration::from_millis(500), "flush took {:?}", t0.elapsed());
        let (dst, msg) = rep.error.unwrap();
        assert_eq!(dst, 3);
        assert!(msg.contains("tcp lane 3: read timed out"), "{msg}");
        e.deregister_memory(&m).unwrap();
    }
}
