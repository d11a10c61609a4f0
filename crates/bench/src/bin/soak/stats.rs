//! Resource samples of processes (`/proc/PID/status` VmRSS and Threads, `/proc/PID/fd`) and
//! the flatness verdict over them.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// One process's resources at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Resident set size, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Open file descriptors (entries of `/proc/PID/fd`; reading our own counts the
    /// directory's descriptor too, the same in every sample).
    pub fds: u64,
    /// Threads (`Threads`).
    pub threads: u64,
}

/// Reads `pid`'s [`Usage`]. Errors name the file and the pid (a process that exited).
pub fn read_usage(pid: u32) -> Result<Usage, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e} (did process {pid} exit?)"))?;
    let field = |name: &str| -> Result<u64, String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{path}: no {name} line with a number"))
    };
    let (rss_kib, threads) = (field("VmRSS:")?, field("Threads:")?);
    let dir = format!("/proc/{pid}/fd");
    let fds = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?.count() as u64;
    Ok(Usage { rss_kib, fds, threads })
}

/// The three metrics of a [`Usage`], by name.
pub const METRICS: [&str; 3] = ["rss_kib", "fds", "threads"];

fn metric(u: &Usage, m: usize) -> u64 {
    match m {
        0 => u.rss_kib,
        1 => u.fds,
        _ => u.threads,
    }
}

/// Samples of several processes taken together.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Work done when taken (transfers, cycles).
    pub at: u64,
    /// Seconds since the phase started.
    pub secs: f64,
    /// One per process, in the order of [`Series::procs`].
    pub usage: Vec<Usage>,
}

/// The samples of one phase.
#[derive(Debug, Clone)]
pub struct Series {
    /// What `Sample::at` counts ("transfers", "cycles").
    pub unit: &'static str,
    /// Process labels, and whether each one's flatness decides the verdict.
    pub procs: Vec<(String, bool)>,
    /// In order of `at`.
    pub samples: Vec<Sample>,
}

/// How one metric of one process moved after the warm-up.
#[derive(Debug, Clone, PartialEq)]
pub struct Drift {
    /// Process label.
    pub proc: String,
    /// Metric name ([`METRICS`]).
    pub metric: &'static str,
    /// First sample's value.
    pub first: u64,
    /// The value at the end of the warm-up, the reference.
    pub base: u64,
    /// Last sample's value.
    pub last: u64,
    /// Smallest and largest value after the warm-up.
    pub min: u64,
    /// See `min`.
    pub max: u64,
    /// Largest |value − base| / base after the warm-up, percent.
    pub max_dev_pct: f64,
    /// The sample (its `at`) where `max_dev_pct` was reached.
    pub worst_at: u64,
    /// Every value after the warm-up equals `base`.
    pub exact: bool,
    /// `max_dev_pct` within the tolerance.
    pub within: bool,
    /// Whether this process decides the verdict.
    pub decides: bool,
}

impl Series {
    /// Empty series of processes `procs` (label, decides the verdict).
    pub fn new(unit: &'static str, procs: Vec<(String, bool)>) -> Series {
        Series { unit, procs, samples: Vec::new() }
    }

    /// Samples processes `pids` (in the order of `procs`) now; returns the new row's index.
    pub fn take(&mut self, at: u64, secs: f64, pids: &[u32]) -> Result<usize, String> {
        let usage = pids.iter().map(|&p| read_usage(p)).collect::<Result<Vec<_>, _>>()?;
        self.samples.push(Sample { at, secs, usage });
        Ok(self.samples.len() - 1)
    }

    /// Samples processes `pids` once their FD and thread counts stopped moving: unchanged for
    /// `quiet` (read every 10 ms), or `max` passed. Returns the row's index and how long it
    /// waited. (Threads and sockets of a peer that just disconnected end on their own, a
    /// little later: an instant sample would catch some of them.)
    pub fn take_settled(&mut self, at: u64, secs: f64, pids: &[u32], quiet: Duration, max: Duration) -> Result<(usize, Duration), String> {
        let t = Instant::now();
        let read = || pids.iter().map(|&p| read_usage(p)).collect::<Result<Vec<_>, _>>();
        let counts = |u: &[Usage]| u.iter().map(|x| (x.fds, x.threads)).collect::<Vec<_>>();
        let mut usage = read()?;
        let mut since = Instant::now();
        while since.elapsed() < quiet && t.elapsed() < max {
            std::thread::sleep(Duration::from_millis(10));
            let u = read()?;
            if counts(&u) != counts(&usage) {
                since = Instant::now();
            }
            usage = u;
        }
        self.samples.push(Sample { at, secs, usage });
        Ok((self.samples.len() - 1, t.elapsed()))
    }

    /// Index of the warm-up's last sample: the first taken at or after `warmup` units of work
    /// (the last sample when none is).
    pub fn base_index(&self, warmup: u64) -> usize {
        self.samples.iter().position(|s| s.at >= warmup).unwrap_or(self.samples.len().saturating_sub(1))
    }

    /// The drift of every (process, metric) after the warm-up, against `tol_pct`.
    pub fn drifts(&self, warmup: u64, tol_pct: f64) -> Vec<Drift> {
        let mut out = Vec::new();
        if self.samples.is_empty() {
            return out;
        }
        let b = self.base_index(warmup);
        for (p, (label, decides)) in self.procs.iter().enumerate() {
            for (m, name) in METRICS.iter().enumerate() {
                let v = |s: &Sample| metric(&s.usage[p], m);
                let base = v(&self.samples[b]);
                let after = &self.samples[b..];
                let (mut min, mut max, mut worst, mut worst_at) = (base, base, 0.0f64, self.samples[b].at);
                for s in after {
                    let x = v(s);
                    min = min.min(x);
                    max = max.max(x);
                    let dev = if base == 0 {
                        if x == 0 {
                            0.0
                        } else {
                            f64::INFINITY
                        }
                    } else {
                        (x as f64 - base as f64).abs() / base as f64 * 100.0
                    };
                    if dev > worst {
                        worst = dev;
                        worst_at = s.at;
                    }
                }
                out.push(Drift {
                    proc: label.clone(),
                    metric: name,
                    first: v(&self.samples[0]),
                    base,
                    last: v(&self.samples[self.samples.len() - 1]),
                    min,
                    max,
                    max_dev_pct: worst,
                    worst_at,
                    exact: min == base && max == base,
                    within: worst <= tol_pct,
                    decides: *decides,
                });
            }
        }
        out
    }

    /// The table's header line.
    pub fn header(&self) -> String {
        let mut s = format!("{:>12} {:>9} {:>5}", self.unit, "secs", "");
        for (label, _) in &self.procs {
            let _ = write!(s, " | {:>22} {:>5} {:>7}", format!("{label} rss_KiB"), "fds", "threads");
        }
        s
    }

    /// Row `i` of the table: `warm` while in the warm-up, `base` for the warm-up's last sample.
    pub fn row(&self, i: usize, warmup: u64) -> String {
        let smp = &self.samples[i];
        let b = self.base_index(warmup);
        let mark = if i == b && smp.at >= warmup {
            "base"
        } else if smp.at < warmup {
            "warm"
        } else {
            ""
        };
        let mut s = format!("{:>12} {:>9.1} {:>5}", smp.at, smp.secs, mark);
        for u in &smp.usage {
            let _ = write!(s, " | {:>22} {:>5} {:>7}", u.rss_kib, u.fds, u.threads);
        }
        s
    }

    /// Header and every row.
    pub fn table(&self, warmup: u64) -> String {
        let mut s = self.header();
        s.push('\n');
        for i in 0..self.samples.len() {
            s.push_str(&self.row(i, warmup));
            s.push('\n');
        }
        s
    }
}

/// One line per drift, and whether every deciding one is within the tolerance.
pub fn report(drifts: &[Drift], tol_pct: f64) -> (String, bool) {
    let mut s = String::new();
    let mut ok = true;
    for d in drifts {
        let verdict = match (d.exact, d.within) {
            (true, _) => "flat (exact)".to_string(),
            (false, true) => format!("flat (within ±{tol_pct} %)"),
            (false, false) => format!("NOT FLAT (beyond ±{tol_pct} %, worst at {})", d.worst_at),
        };
        let role = if d.decides { "" } else { " [informational]" };
        let _ = writeln!(
            s,
            "  {:<18} {:<8} first {:>9}  base {:>9}  last {:>9}  min {:>9}  max {:>9}  max dev {:>7.2} %  {verdict}{role}",
            d.proc, d.metric, d.first, d.base, d.last, d.min, d.max, d.max_dev_pct
        );
        if d.decides && !d.within {
            ok = false;
        }
    }
    (s, ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(vals: &[(u64, u64, u64, u64)]) -> Series {
        let mut s = Series::new("transfers", vec![("a".into(), true)]);
        for &(at, rss, fds, threads) in vals {
            s.samples.push(Sample { at, secs: 0.0, usage: vec![Usage { rss_kib: rss, fds, threads }] });
        }
        s
    }

    #[test]
    fn own_usage_reads() {
        let u = read_usage(std::process::id()).unwrap();
        assert!(u.rss_kib > 0 && u.fds >= 3 && u.threads >= 1, "{u:?}");
        assert!(read_usage(u32::MAX).unwrap_err().contains("did process"));
    }

    #[test]
    fn warm_up_growth_is_ignored_and_later_growth_is_not() {
        // Grows during the warm-up (at < 10), then stays within 5 % of the value at 10.
        let s = series(&[(0, 100, 10, 4), (5, 900, 12, 6), (10, 1000, 12, 6), (20, 1040, 12, 6), (30, 960, 12, 6)]);
        let d = s.drifts(10, 5.0);
        let (text, ok) = report(&d, 5.0);
        assert!(ok, "{text}");
        assert_eq!((d[0].first, d[0].base, d[0].last, d[0].min, d[0].max), (100, 1000, 960, 960, 1040));
        assert!((d[0].max_dev_pct - 4.0).abs() < 1e-9 && !d[0].exact);
        assert!(d[1].exact && d[2].exact);
        // A thread more after the warm-up: 1/6 = 16.7 % > 5 %.
        let s = series(&[(0, 100, 10, 4), (10, 1000, 12, 6), (20, 1000, 12, 7)]);
        let d = s.drifts(10, 5.0);
        let (text, ok) = report(&d, 5.0);
        assert!(!ok && text.contains("NOT FLAT") && text.contains("worst at 20"), "{text}");
    }

    #[test]
    fn informational_processes_do_not_decide() {
        let mut s = series(&[(0, 10, 10, 4), (10, 10, 10, 4), (20, 10, 10, 40)]);
        s.procs[0].1 = false;
        let (text, ok) = report(&s.drifts(10, 5.0), 5.0);
        assert!(ok && text.contains("[informational]"), "{text}");
    }

    #[test]
    fn base_is_the_first_sample_at_or_after_the_warm_up() {
        let s = series(&[(0, 1, 1, 1), (7, 1, 1, 1), (14, 1, 1, 1)]);
        assert_eq!(s.base_index(10), 2);
        assert_eq!(s.base_index(100), 2, "none reached: the last");
        assert_eq!(s.base_index(0), 0);
        assert!(s.table(10).lines().nth(3).unwrap().contains("base"));
    }
}
