//! `soak`: long runs of the MORI-IO engine through its public API (`mori_io::IoEngine`,
//! `Session`), bounded in count and time, on loopback only (127.0.0.1), checking that every
//! transfer succeeds and that resources stay flat. Issue 19, "Soak"; `cargo xtask soak` builds
//! it in release and runs it. It lives in crates/bench with the other tools that drive the
//! engine: built with every backend, so one binary serves all three phases (the rdma one
//! inside the SoftRoCE guest, which runs host-built binaries).
//!
//! Phases (`--phase`):
//! - `tcp-transfers`: the target engine in a child process, the initiator here, tcp backend;
//!   `--count` transfers (default 10^6) as write/read pairs of mixed sizes (8 B to 1 MiB in all,
//!   single transfers and batches of up to 64 entries, through a session or the engine's
//!   one-shot calls), each read checked against what was written (spot bytes of every
//!   entry, stamped anew for every pair); the child pops every transfer's inbound status.
//!   RSS, open FDs and threads of both processes are sampled `--samples` times; after the
//!   warm-up (`--warmup-pct` of the count) every sample must lie within `--tolerance-pct` of
//!   the warm-up's last one.
//! - `reconnect`: `--count` cycles (default 1000) against one long-lived target process:
//!   connect (register the target, open a session), write, the target pops the write's
//!   status and checks its bytes, disconnect (deregister the target; every other cycle the
//!   initiator's engine is dropped and a fresh one made under the same key), and again with
//!   no delay. The resources of both processes, sampled once settled, must stay flat as above.
//! - `rdma-burst`: two engines in this process with the rdma backend (run it inside the
//!   SoftRoCE guest: `cargo xtask soak --phase rdma-burst`), `--qps` QPs per transfer (default
//!   64): `--count` rounds (default 1), each one write and one read batch of `--batch`
//!   entries (default 32768) of `--entry-bytes` (default 8), every byte checked, then a
//!   failing batch behind a valid one and a batch whose source goes mid-way (see rdma.rs for
//!   the constructions and what is checked); with 3 rounds or more, this process's resources
//!   must also stay flat after the first round.
//!
//! Exit status: 0 when the phase passed, 1 when it failed (a transfer failed, a byte
//! differed, a resource was not flat, the time limit was reached), 2 on bad arguments.

mod rdma;
mod reconnect;
mod stats;
mod target;
mod tcp;

use clap::{Parser, ValueEnum};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Which soak to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Phase {
    /// 10^6 tcp transfers of mixed sizes between two processes, resources flat.
    TcpTransfers,
    /// 1000 cycles of connect, write + notification, disconnect; target resources flat.
    Reconnect,
    /// 64 QPs × batch 32768 × 8 B over rdma, and a batch that fails (SoftRoCE guest).
    RdmaBurst,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::TcpTransfers => "tcp-transfers",
            Phase::Reconnect => "reconnect",
            Phase::RdmaBurst => "rdma-burst",
        }
    }
    /// (default count, most allowed, default time limit in seconds).
    fn limits(self) -> (u64, u64, u64) {
        match self {
            Phase::TcpTransfers => (1_000_000, 1_000_000_000, 3600),
            Phase::Reconnect => (1000, 10_000_000, 1200),
            Phase::RdmaBurst => (1, 10_000, 2400),
        }
    }
}

#[derive(Parser, Debug)]
#[command(name = "soak", about = "Soak runs of the MORI-IO engine on loopback (issue 19); see the crate docs of crates/bench/src/bin/soak")]
struct Args {
    /// The phase to run.
    #[arg(long, value_enum)]
    phase: Option<Phase>,
    /// Transfers (tcp-transfers, rounded up to an even number: write/read pairs), cycles
    /// (reconnect) or rounds of bursts and failing batches (rdma-burst). Default: 10^6, 1000, 1.
    #[arg(long)]
    count: Option<u64>,
    /// Wall-clock bound of the phase, seconds; reaching it fails the phase. Default: 3600,
    /// 1200, 2400.
    #[arg(long)]
    time_limit_s: Option<u64>,
    /// Resource samples over the run (2..=100000).
    #[arg(long, default_value_t = 50)]
    samples: u64,
    /// Warm-up, percent of the count; the sample ending it is the reference (0..=90).
    #[arg(long, default_value_t = 10.0)]
    warmup_pct: f64,
    /// Largest deviation from the reference allowed after the warm-up, percent (0..=1000).
    #[arg(long, default_value_t = 5.0)]
    tolerance_pct: f64,
    /// Seed of the transfer mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// tcp: connections per peer (1..=64).
    #[arg(long, default_value_t = 4)]
    lanes: usize,
    /// rdma-burst: QPs per transfer, RdmaConfig::qps_per_transfer (1..=64).
    #[arg(long, default_value_t = 64)]
    qps: usize,
    /// rdma-burst: entries per batch (1..=1048576).
    #[arg(long, default_value_t = 32768)]
    batch: usize,
    /// rdma-burst: bytes per entry (1..=1048576; batch × entry bytes at most 256 MiB).
    #[arg(long, default_value_t = 8)]
    entry_bytes: usize,
    /// Engine log level (error, warn, info, debug); `MORI_LOG` overrides.
    #[arg(long, default_value = "warn")]
    log_level: String,
    #[arg(long, hide = true)]
    role: Option<String>,
    #[arg(long, hide = true)]
    target_len: Option<usize>,
    #[arg(long, hide = true)]
    parent_pid: Option<u32>,
    #[arg(long, hide = true)]
    lifetime_s: Option<u64>,
}

/// Checked settings of one phase.
#[derive(Debug, Clone)]
pub struct Opts {
    /// See `--count`.
    pub count: u64,
    /// See `--time-limit-s`.
    pub time_limit: Duration,
    /// See `--samples`.
    pub samples: u64,
    /// See `--warmup-pct`.
    pub warmup_pct: f64,
    /// See `--tolerance-pct`.
    pub tolerance_pct: f64,
    /// See `--seed`.
    pub seed: u64,
    /// See `--lanes`.
    pub lanes: usize,
    /// See `--qps`.
    pub qps: usize,
    /// See `--batch`.
    pub batch: usize,
    /// See `--entry-bytes`.
    pub entry_bytes: usize,
}

impl Opts {
    /// Units of work in the warm-up.
    pub fn warmup(&self) -> u64 {
        (self.count as f64 * self.warmup_pct / 100.0).ceil() as u64
    }
    /// Work units between two samples (at least 1).
    pub fn sample_every(&self) -> u64 {
        (self.count / self.samples).max(1)
    }
}

fn range<T: PartialOrd + std::fmt::Display>(flag: &str, v: T, lo: T, hi: T) -> Result<T, String> {
    if v < lo || v > hi {
        return Err(format!("{flag} {v}: allowed {lo}..={hi}"));
    }
    Ok(v)
}

fn check(a: &Args, phase: Phase) -> Result<Opts, String> {
    let (def_count, max_count, def_limit) = phase.limits();
    let count = range(&format!("--count (phase {})", phase.name()), a.count.unwrap_or(def_count), 1, max_count)?;
    let limit = range("--time-limit-s", a.time_limit_s.unwrap_or(def_limit), 1, 7 * 86400)?;
    let batch = range("--batch", a.batch, 1, 1 << 20)?;
    let entry_bytes = range("--entry-bytes", a.entry_bytes, 1, 1 << 20)?;
    if batch * entry_bytes > 256 << 20 {
        return Err(format!("--batch {batch} × --entry-bytes {entry_bytes} = {} bytes: at most 256 MiB", batch * entry_bytes));
    }
    if !a.warmup_pct.is_finite() || !a.tolerance_pct.is_finite() {
        return Err("--warmup-pct and --tolerance-pct must be numbers".into());
    }
    Ok(Opts {
        count: if phase == Phase::TcpTransfers { count + count % 2 } else { count },
        time_limit: Duration::from_secs(limit),
        samples: range("--samples", a.samples, 2, 100_000)?,
        warmup_pct: range("--warmup-pct", a.warmup_pct, 0.0, 90.0)?,
        tolerance_pct: range("--tolerance-pct", a.tolerance_pct, 0.0, 1000.0)?,
        seed: a.seed,
        lanes: range("--lanes", a.lanes, 1, 64)?,
        qps: range("--qps", a.qps, 1, 64)?,
        batch,
        entry_bytes,
    })
}

fn init_logging(level: &str) -> Result<(), String> {
    let lvl = match level {
        "error" | "warn" | "info" | "debug" | "trace" => level,
        "warning" => "warn",
        other => return Err(format!("--log-level {other:?}: use error, warn, info, debug or trace")),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MORI_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(lvl));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).with_target(false).init();
    Ok(())
}

/// The wall-clock bound of a phase.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    start: Instant,
    limit: Duration,
}

impl Budget {
    /// Starts now.
    pub fn new(limit: Duration) -> Budget {
        Budget { start: Instant::now(), limit }
    }
    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
    /// The limit it was started with (what messages name: elapsed plus left exceeds it
    /// once the limit has passed).
    pub fn limit(&self) -> Duration {
        self.limit
    }
    /// Time left (zero once over).
    pub fn left(&self) -> Duration {
        self.limit.saturating_sub(self.start.elapsed())
    }
    /// Waits for `st` up to `bound` or the time left, whichever is shorter. The wait may end
    /// just before the transfer does: then the transfer's own result counts. A transfer still
    /// in progress when the limit has passed is reported as cut off by the limit (naming the
    /// flag), one still in progress within it as not done within `bound`.
    pub fn wait(&self, st: &mori_io::TransferStatus, bound: Duration) -> Result<(), String> {
        match st.wait_for(self.left().min(bound)) {
            Ok(()) => Ok(()),
            Err(e) => match st.poll() {
                Some(Ok(())) => Ok(()),
                Some(Err(own)) => Err(own.to_string()),
                None if self.left().is_zero() => {
                    Err(format!("time limit of {} s (--time-limit-s) reached while it was in progress: {e}", self.limit.as_secs()))
                }
                None => Err(e.to_string()),
            },
        }
    }

    /// The error once the limit is reached, naming the flag and the progress.
    pub fn check(&self, done: u64, of: u64, unit: &str) -> Result<(), String> {
        if self.start.elapsed() >= self.limit {
            return Err(format!("time limit of {} s (--time-limit-s) reached after {done} of {of} {unit}", self.limit.as_secs()));
        }
        Ok(())
    }
}

/// splitmix64: the deterministic mix of the runs.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi` (`lo <= hi`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    if a.role.as_deref() == Some("target") {
        let (Some(len), Some(parent), Some(life)) = (a.target_len, a.parent_pid, a.lifetime_s) else {
            eprintln!("soak: --role target needs --target-len, --parent-pid and --lifetime-s");
            return ExitCode::from(2);
        };
        if init_logging(&a.log_level).is_err() {
            return ExitCode::from(2);
        }
        target::child_main(len, a.lanes.clamp(1, 64), parent, Duration::from_secs(life));
    }
    if let Some(r) = &a.role {
        eprintln!("soak: --role {r:?}: unknown role");
        return ExitCode::from(2);
    }
    let Some(phase) = a.phase else {
        eprintln!("soak: --phase is required: tcp-transfers, reconnect or rdma-burst (cargo xtask soak runs them all)");
        return ExitCode::from(2);
    };
    let opts = match check(&a, phase).and_then(|o| init_logging(&a.log_level).map(|()| o)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "soak {}: count {}, time limit {} s, {} samples, warm-up {} %, tolerance ±{} %, seed {}",
        phase.name(),
        opts.count,
        opts.time_limit.as_secs(),
        opts.samples,
        opts.warmup_pct,
        opts.tolerance_pct,
        opts.seed
    );
    let t = Instant::now();
    let r = match phase {
        Phase::TcpTransfers => tcp::run(&opts),
        Phase::Reconnect => reconnect::run(&opts),
        Phase::RdmaBurst => rdma::run(&opts),
    };
    let secs = t.elapsed().as_secs_f64();
    match r {
        Ok(()) => {
            println!("soak {}: PASS ({secs:.1} s)", phase.name());
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("soak {}: FAIL ({secs:.1} s): {e}", phase.name());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        Args::try_parse_from([&["soak"], extra].concat()).unwrap()
    }

    #[test]
    fn defaults_are_the_issue_counts() {
        let o = check(&args(&["--phase", "tcp-transfers"]), Phase::TcpTransfers).unwrap();
        assert_eq!((o.count, o.time_limit.as_secs(), o.warmup(), o.sample_every()), (1_000_000, 3600, 100_000, 20_000));
        assert_eq!(check(&args(&[]), Phase::Reconnect).unwrap().count, 1000);
        let r = check(&args(&[]), Phase::RdmaBurst).unwrap();
        assert_eq!((r.count, r.qps, r.batch, r.entry_bytes), (1, 64, 32768, 8));
        assert_eq!(check(&args(&["--count", "7"]), Phase::TcpTransfers).unwrap().count, 8, "pairs");
    }

    #[test]
    fn out_of_range_flags_are_named_with_their_limits() {
        let e = |x: &[&str], p| check(&args(x), p).unwrap_err();
        assert_eq!(e(&["--count", "0"], Phase::Reconnect), "--count (phase reconnect) 0: allowed 1..=10000000");
        assert_eq!(e(&["--time-limit-s", "0"], Phase::Reconnect), "--time-limit-s 0: allowed 1..=604800");
        assert_eq!(e(&["--qps", "65"], Phase::RdmaBurst), "--qps 65: allowed 1..=64");
        assert!(e(&["--batch", "1048576", "--entry-bytes", "1024"], Phase::RdmaBurst).contains("at most 256 MiB"));
        assert!(e(&["--warmup-pct", "95"], Phase::TcpTransfers).starts_with("--warmup-pct 95"));
        assert!(e(&["--samples", "1"], Phase::TcpTransfers).starts_with("--samples 1"));
        assert!(Args::try_parse_from(["soak", "--count", "-1"]).is_err());
    }

    #[test]
    fn budget_names_the_flag() {
        let b = Budget { start: Instant::now() - Duration::from_secs(5), limit: Duration::from_secs(2) };
        assert_eq!(b.left(), Duration::ZERO);
        assert_eq!(b.check(3, 10, "cycles").unwrap_err(), "time limit of 2 s (--time-limit-s) reached after 3 of 10 cycles");
        // Long past its limit (a loaded machine), it still names the limit, not the time spent.
        let late = Budget { start: Instant::now() - Duration::from_millis(3500), limit: Duration::from_secs(1) };
        assert_eq!((late.limit(), late.left()), (Duration::from_secs(1), Duration::ZERO));
        assert!(Budget::new(Duration::from_secs(60)).check(0, 1, "x").is_ok());
    }

    #[test]
    fn a_wait_reports_the_transfer_or_the_bound_that_ran_out() {
        use mori_io::{IoError, TransferStatus};
        use mori_io_core::status::Completion;
        let over = Budget { start: Instant::now() - Duration::from_secs(5), limit: Duration::from_secs(1) };
        let fresh = Budget::new(Duration::from_secs(60));
        // Finished: its own result, whatever the budget (also past the limit).
        assert_eq!(over.wait(&<TransferStatus as Completion>::new(0), Duration::from_secs(1)), Ok(()));
        let failed = TransferStatus::failed(IoError::invalid("bad offset"));
        assert!(over.wait(&failed, Duration::from_secs(1)).unwrap_err().contains("bad offset"));
        // In progress: past the limit, the limit is named; within it, the bound.
        let pending = <TransferStatus as Completion>::new(1);
        let e = over.wait(&pending, Duration::from_secs(1)).unwrap_err();
        assert!(e.starts_with("time limit of 1 s (--time-limit-s) reached while it was in progress"), "{e}");
        let e = fresh.wait(&pending, Duration::from_millis(5)).unwrap_err();
        assert!(!e.contains("time limit") && e.contains("Timeout"), "{e}");
    }

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.range(3, 9);
            assert_eq!(x, b.range(3, 9));
            assert!((3..=9).contains(&x));
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
