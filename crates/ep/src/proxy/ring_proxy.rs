//! [`RingProxy`]: the proxy thread consuming a [`crate::ring`] in shared memory (GPU warps or
//! host threads produce into it), with its options and counters.

use super::{PeerWindow, State};
use crate::ring::{RingConsumer, RingMem};
use mori_io::{IoEngine, MemoryDesc};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Commands taken from a ring per poll (one burst).
const RING_BURST: usize = 4 * super::MAX_BATCH;

/// Settings of a [`RingProxy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingProxyOptions {
    /// How long the thread keeps spinning on an empty ring after the last command before it
    /// starts sleeping (default 200 ms): a producer's next command is then picked up within
    /// a poll, not a sleep. The default spans the gap between one dispatch and the next
    /// combine, and between the layers of a forward pass, also when the host reads the
    /// outputs back in between (`InterNodeGpu`'s host API: 20-80 ms at the decode shape on
    /// 8 ranks); a proxy asleep when a command comes takes it up to a nap (`max_sleep`) plus
    /// the timer's slack late. Measured on an H100 (docs/PERFORMANCE.md): V1 decode at 2 x 4
    /// ranks took 350-355 µs to dispatch and 521-538 µs to combine with the proxies polling
    /// through the run, against 434-558 / 674-786 µs with 200 µs of polling; AsyncLL decode
    /// 190-201 / 218-230 µs with 200 ms against 199-212 / 277-298 µs with 20 ms.
    pub spin: Duration,
    /// Longest sleep between two polls of an idle ring (default 50 µs).
    pub max_sleep: Duration,
    /// Whether a burst whose batches are all ordered ones (one per destination) goes to the
    /// engine in one call (`IoEngine::post_ordered_multi`: over xgmi, shared kernel
    /// launches) instead of one call per destination. `None` (the default): on, unless
    /// [`GROUPED_ENV`] says `0`.
    pub grouped: Option<bool>,
    /// Whether ordered batches go through a MORI-IO session per destination
    /// (`mori_io::Session::post_ordered_many`: the regions resolved once, no per-post lookups)
    /// where its backend posts them (xgmi), instead of the engine's one-shot
    /// `post_ordered_multi`. `None` (the default): on, unless [`SESSIONS_ENV`] says `0`.
    pub sessions: Option<bool>,
    /// Which bursts send their counter pairs as tail words (`mori_io::TailWord`: the transport
    /// stores the two words after the segment, from the values the command carries) instead
    /// of copying them from the window, where the destination's session stores them (xgmi:
    /// copy-engine copies then one stream batch, against one ordered-copy kernel launch).
    /// `None` (the default): [`TailWords::Off`], unless [`TAIL_WORDS_ENV`] says otherwise.
    /// Off because on an H100 the two driver calls cost more than the shorter wait saved:
    /// the leg alone's write took 29.2 µs on average with tail words against 27.9 µs without,
    /// and V1 decode at 2 x 4 dispatched in 150.7 µs against 122.5 µs (docs/PERFORMANCE.md,
    /// "Counter pairs as tail words").
    pub tail_words: Option<TailWords>,
}

/// Which bursts' counter pairs go as tail words ([`RingProxyOptions::tail_words`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailWords {
    /// None: every pair is copied from the window in the segment's ordered batch.
    Off,
    /// Bursts to one destination (a copy and a stream batch); a burst to several keeps one
    /// ordered-copy launch for all of them (over xgmi each destination's copy is a driver
    /// call of its own).
    Single,
    /// Every burst.
    All,
}

impl TailWords {
    /// [`TAIL_WORDS_ENV`]'s spelling: `0`, `single` or `all`.
    pub fn parse(v: &str) -> Option<Self> {
        match v {
            "0" => Some(TailWords::Off),
            "single" => Some(TailWords::Single),
            "all" => Some(TailWords::All),
            _ => None,
        }
    }

    /// Whether a burst of `parts` destinations sends its pairs as tail words.
    pub fn takes(self, parts: usize) -> bool {
        match self {
            TailWords::Off => false,
            TailWords::Single => parts == 1,
            TailWords::All => true,
        }
    }
}

/// The environment variable that overrides [`RingProxyOptions::tail_words`]: `0` (off),
/// `single` (bursts to one destination) or `all`.
pub const TAIL_WORDS_ENV: &str = "MORI_EP_PROXY_TAIL_WORDS";

/// `configured` with [`TAIL_WORDS_ENV`]'s value (`env`) applied. Errors: any other value,
/// naming the variable and the values it takes.
fn tail_words(configured: Option<TailWords>, env: Option<&str>) -> std::io::Result<TailWords> {
    match env {
        None => Ok(configured.unwrap_or(TailWords::Off)),
        Some(v) => TailWords::parse(v).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{TAIL_WORDS_ENV}={v:?}: must be 0, single or all"))
        }),
    }
}

/// The environment variable that overrides [`RingProxyOptions::grouped`] (`0` or `1`).
pub const GROUPED_ENV: &str = "MORI_EP_PROXY_GROUPED";

/// The environment variable that overrides [`RingProxyOptions::sessions`] (`0` or `1`).
pub const SESSIONS_ENV: &str = "MORI_EP_PROXY_SESSIONS";

/// A switch of [`RingProxyOptions`] (on unless configured off) with variable `var`'s value
/// (`env`) applied ([`mori_gpu::env_switch`]). Errors: a value other than `0` or `1`, naming
/// the variable.
fn switch(var: &str, configured: Option<bool>, env: Option<&str>) -> std::io::Result<bool> {
    mori_gpu::env_switch(var, configured.unwrap_or(true), env)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
}

/// Variable `var`'s value, if set. Errors: not UTF-8, naming the variable.
fn env_value(var: &str) -> std::io::Result<Option<String>> {
    mori_gpu::env_text(var).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
}

impl RingProxyOptions {
    /// 200 µs of polling, then naps: for hosts with fewer cores than busy threads (tests whose
    /// producers are host threads standing in for GPU warps), where a polling proxy takes the
    /// CPU its producers need.
    pub const SHORT_SPIN: Self =
        Self { spin: Duration::from_micros(200), max_sleep: Duration::from_micros(50), grouped: None, sessions: None, tail_words: None };
}

impl Default for RingProxyOptions {
    fn default() -> Self {
        Self { spin: Duration::from_millis(200), max_sleep: Duration::from_micros(50), grouped: None, sessions: None, tail_words: None }
    }
}

/// What a [`RingProxy`] did so far. Times are host clock (`Instant`), summed over the
/// batches: from taking the burst off the ring to the batch's post returning (`post_ns`), to
/// its bytes landing (`data_ns`: batches with data and tail writes), and to its status
/// completing (`done_ns`: its tail writes landed, or the peer applied its signals and
/// answered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingProxyStats {
    /// Commands taken from the ring.
    pub commands: u64,
    /// Batched signalled writes posted (one per destination per burst, at most 1024 commands).
    pub batches: u64,
    /// Bytes of the writes that completed.
    pub bytes: u64,
    /// Sum over batches of taken-to-posted, ns.
    pub post_ns: u64,
    /// Sum over batches with data and tail writes of taken-to-bytes-landed, ns.
    pub data_ns: u64,
    /// Batches with data and tail writes.
    pub data_batches: u64,
    /// Sum over completed batches of taken-to-completed, ns.
    pub done_ns: u64,
    /// Longest taken-to-completed, ns.
    pub done_ns_max: u64,
    /// Calls into the engine that post (writes, signalled writes, tail writes, signals).
    pub post_calls: u64,
    /// Batches whose tail writes rode in the data's ordered batch (the rest with tail writes
    /// waited for the data's completion).
    pub ordered_batches: u64,
    /// Of those, the batches posted over a MORI-IO session ([`RingProxyOptions::sessions`]).
    pub session_batches: u64,
    /// Of those, the batches whose counter pairs went as tail words
    /// ([`RingProxyOptions::tail_words`]).
    pub word_batches: u64,
    /// Sum of those calls' own durations, ns (the CPU cost of posting).
    pub post_call_ns: u64,
    /// Batches that carried data bytes and succeeded (signals alone and failed batches left
    /// out).
    pub write_batches: u64,
    /// Data bytes of those batches.
    pub write_bytes: u64,
    /// Sum over those batches of taken-to-completed, ns.
    pub write_done_ns: u64,
}

impl RingProxyStats {
    /// The counts and sums since `earlier` (a snapshot of the same proxy), for a window such
    /// as a bench's timed iterations; `done_ns_max` stays the longest since the proxy started
    /// (a maximum cannot be windowed from two snapshots).
    pub fn since(&self, earlier: &RingProxyStats) -> RingProxyStats {
        RingProxyStats {
            commands: self.commands.saturating_sub(earlier.commands),
            batches: self.batches.saturating_sub(earlier.batches),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            post_ns: self.post_ns.saturating_sub(earlier.post_ns),
            data_ns: self.data_ns.saturating_sub(earlier.data_ns),
            data_batches: self.data_batches.saturating_sub(earlier.data_batches),
            done_ns: self.done_ns.saturating_sub(earlier.done_ns),
            done_ns_max: self.done_ns_max,
            post_calls: self.post_calls.saturating_sub(earlier.post_calls),
            ordered_batches: self.ordered_batches.saturating_sub(earlier.ordered_batches),
            session_batches: self.session_batches.saturating_sub(earlier.session_batches),
            word_batches: self.word_batches.saturating_sub(earlier.word_batches),
            post_call_ns: self.post_call_ns.saturating_sub(earlier.post_call_ns),
            write_batches: self.write_batches.saturating_sub(earlier.write_batches),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
            write_done_ns: self.write_done_ns.saturating_sub(earlier.write_done_ns),
        }
    }

    /// The rate of the batches that carried data, each from taking its commands off the ring
    /// to its completion: `write_bytes / write_done_ns` (bytes per ns = GB/s, GB = 1e9 B).
    /// `None` without any. Batches of one burst overlap, so this is the rate of one write as
    /// its proxy saw it, not the proxy's aggregate.
    pub fn write_gbps(&self) -> Option<f64> {
        (self.write_done_ns > 0).then(|| self.write_bytes as f64 / self.write_done_ns as f64)
    }
}

#[derive(Default)]
pub(super) struct SharedStats {
    pub(super) commands: AtomicU64,
    pub(super) batches: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) post_ns: AtomicU64,
    pub(super) data_ns: AtomicU64,
    pub(super) data_batches: AtomicU64,
    pub(super) done_ns: AtomicU64,
    pub(super) done_ns_max: AtomicU64,
    pub(super) post_calls: AtomicU64,
    pub(super) ordered_batches: AtomicU64,
    pub(super) session_batches: AtomicU64,
    pub(super) word_batches: AtomicU64,
    pub(super) post_call_ns: AtomicU64,
    pub(super) write_batches: AtomicU64,
    pub(super) write_bytes: AtomicU64,
    pub(super) write_done_ns: AtomicU64,
}

impl SharedStats {
    /// Counts one posting call into the engine that started at `since`.
    pub(super) fn count_call(&self, since: Instant) {
        self.post_calls.fetch_add(1, Ordering::Relaxed);
        self.post_call_ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn get(&self) -> RingProxyStats {
        RingProxyStats {
            commands: self.commands.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            post_ns: self.post_ns.load(Ordering::Relaxed),
            data_ns: self.data_ns.load(Ordering::Relaxed),
            data_batches: self.data_batches.load(Ordering::Relaxed),
            done_ns: self.done_ns.load(Ordering::Relaxed),
            done_ns_max: self.done_ns_max.load(Ordering::Relaxed),
            post_calls: self.post_calls.load(Ordering::Relaxed),
            ordered_batches: self.ordered_batches.load(Ordering::Relaxed),
            session_batches: self.session_batches.load(Ordering::Relaxed),
            word_batches: self.word_batches.load(Ordering::Relaxed),
            post_call_ns: self.post_call_ns.load(Ordering::Relaxed),
            write_batches: self.write_batches.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            write_done_ns: self.write_done_ns.load(Ordering::Relaxed),
        }
    }
}

/// A proxy thread that consumes a [`crate::ring`] in shared memory (GPU warps or host threads
/// produce into it) and carries out each command as a MORI-IO signalled write from `engine`:
/// the bytes from `local` (the producer's window) to the destination's window, then the counter
/// operation in the destination's counter region, which the peer's engine applies only after
/// the bytes are visible there. Commands of one burst to one destination go as one batch.
pub struct RingProxy {
    stop: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<(usize, String)>>>,
    stats: Arc<SharedStats>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RingProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingProxy({:?})", self.stats.get())
    }
}

impl RingProxy {
    /// Starts the thread (named `mori-ep-ring-{name}`) consuming `ring` from ticket 0.
    /// `peers[r]` is rank `r`'s windows (`None` for ranks this proxy never writes to: a command
    /// naming one fails the proxy). Errors: the thread could not be spawned; [`GROUPED_ENV`]
    /// or [`SESSIONS_ENV`] set to something other than `0` or `1`, [`TAIL_WORDS_ENV`] to
    /// something other than `0`, `single` or `all`, or any of them not UTF-8.
    pub fn start(
        name: &str,
        engine: Arc<IoEngine>,
        local: MemoryDesc,
        peers: Vec<Option<PeerWindow>>,
        ring: RingMem,
        opts: RingProxyOptions,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let mut st = State::new(engine, local, peers, failed.clone());
        st.grouped = switch(GROUPED_ENV, opts.grouped, env_value(GROUPED_ENV)?.as_deref())?;
        st.sessions = switch(SESSIONS_ENV, opts.sessions, env_value(SESSIONS_ENV)?.as_deref())?;
        st.tail_words = tail_words(opts.tail_words, env_value(TAIL_WORDS_ENV)?.as_deref())?;
        let stats = st.timing.clone();
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name(format!("mori-ep-ring-{name}"))
            .spawn(move || st.run_ring(RingConsumer::new(ring), &stop2, &stats2, opts))?;
        Ok(Self { stop, failed, stats, thread: Some(thread) })
    }

    /// The first failure so far (a write that failed, naming its destination rank; a
    /// malformed command), without waiting.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().as_ref().map(|(_, m)| m.clone())
    }

    /// Counts so far.
    pub fn stats(&self) -> RingProxyStats {
        self.stats.get()
    }

    /// Stops the thread after it posted every command already in the ring and waited (up to
    /// 10 s) for their completions; returns the final counts, or the first failure.
    pub fn stop(mut self) -> Result<RingProxyStats, String> {
        self.stop_thread();
        match self.failure() {
            Some(m) => Err(m),
            None => Ok(self.stats.get()),
        }
    }

    fn stop_thread(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Release);
            let _ = t.join();
        }
    }
}

impl Drop for RingProxy {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

impl State {
    fn run_ring(&mut self, mut ring: RingConsumer, stop: &AtomicBool, stats: &SharedStats, opts: RingProxyOptions) {
        self.open_sessions();
        let mut cmds = Vec::with_capacity(RING_BURST);
        let mut last = Instant::now();
        let mut sleep = Duration::from_micros(1);
        loop {
            let stopping = stop.load(Ordering::Acquire);
            cmds.clear();
            if let Err(e) = ring.poll(&mut cmds, RING_BURST) {
                self.fail(usize::MAX, e.to_string());
            }
            let got = !cmds.is_empty();
            if got {
                self.taken = Instant::now();
                stats.commands.fetch_add(cmds.len() as u64, Ordering::Relaxed);
                let before = self.inflight.len();
                self.post_burst(&mut cmds);
                stats.batches.fetch_add(self.inflight.len().saturating_sub(before) as u64, Ordering::Relaxed);
                last = Instant::now();
                sleep = Duration::from_micros(1);
            }
            self.reap();
            stats.bytes.store(self.bytes, Ordering::Relaxed);
            if stopping {
                // Everything the producers wrote before the stop was taken by the poll above.
                let rep = self.flush(Duration::from_secs(10));
                stats.bytes.store(rep.bytes, Ordering::Relaxed);
                return;
            }
            if !got && self.inflight.is_empty() && last.elapsed() > opts.spin {
                std::thread::sleep(sleep);
                sleep = (sleep * 2).min(opts.max_sleep);
            } else if !got {
                // Nothing new: let the threads a completion needs (the engine's notification
                // and control threads, the peer's) run before the next poll.
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{switch, tail_words, RingProxyStats, TailWords, GROUPED_ENV, SESSIONS_ENV, TAIL_WORDS_ENV};

    #[test]
    fn tail_words_are_off_unless_told() {
        assert_eq!(tail_words(None, None).unwrap(), TailWords::Off);
        assert_eq!(tail_words(Some(TailWords::All), None).unwrap(), TailWords::All);
        assert_eq!(tail_words(Some(TailWords::All), Some("0")).unwrap(), TailWords::Off);
        assert_eq!(tail_words(None, Some("all")).unwrap(), TailWords::All);
        assert_eq!(tail_words(Some(TailWords::Off), Some("single")).unwrap(), TailWords::Single);
        let e = tail_words(None, Some("2")).unwrap_err().to_string();
        assert_eq!(e, format!("{TAIL_WORDS_ENV}=\"2\": must be 0, single or all"));
        assert!(TailWords::Single.takes(1) && !TailWords::Single.takes(2));
        assert!(TailWords::All.takes(4) && !TailWords::Off.takes(1));
    }

    #[test]
    fn switches_are_on_unless_told() {
        for var in [GROUPED_ENV, SESSIONS_ENV] {
            assert!(switch(var, None, None).unwrap());
            assert!(!switch(var, Some(false), None).unwrap());
            assert!(!switch(var, None, Some("0")).unwrap());
            assert!(switch(var, Some(false), Some("1")).unwrap());
            assert!(switch(var, None, Some("yes")).unwrap_err().to_string().contains(var));
        }
    }

    #[test]
    fn since_windows_the_counts_and_keeps_the_maximum() {
        let then = RingProxyStats {
            commands: 10,
            batches: 4,
            bytes: 100,
            post_ns: 40,
            done_ns: 80,
            done_ns_max: 30,
            post_calls: 8,
            session_batches: 1,
            ..Default::default()
        };
        let now = RingProxyStats {
            commands: 25,
            batches: 9,
            bytes: 350,
            post_ns: 90,
            data_ns: 7,
            data_batches: 1,
            done_ns: 200,
            done_ns_max: 31,
            post_calls: 18,
            ordered_batches: 5,
            session_batches: 4,
            word_batches: 2,
            post_call_ns: 60,
            write_batches: 3,
            write_bytes: 3000,
            write_done_ns: 1500,
        };
        let d = now.since(&then);
        assert_eq!(
            d,
            RingProxyStats {
                commands: 15,
                batches: 5,
                bytes: 250,
                post_ns: 50,
                data_ns: 7,
                data_batches: 1,
                done_ns: 120,
                done_ns_max: 31,
                post_calls: 10,
                ordered_batches: 5,
                session_batches: 3,
                word_batches: 2,
                post_call_ns: 60,
                write_batches: 3,
                write_bytes: 3000,
                write_done_ns: 1500,
            }
        );
        assert_eq!(d.write_gbps(), Some(2.0), "3000 B in 1500 ns");
        assert_eq!(then.write_gbps(), None, "no data batch, no rate");
        assert_eq!(then.since(&now).commands, 0, "an older snapshot never goes below zero");
    }
}
