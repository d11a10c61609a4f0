//! `cargo xtask soak [--phase tcp-transfers|reconnect|rdma-burst|all] [--count N]
//! [--time-limit-s S] [--quick] [-- SOAK_ARGS...]`: builds the `soak` driver
//! (crates/bench/src/bin/soak) in release and runs its phases, each bounded in count and time,
//! on loopback only (issue 19, "Soak").
//!
//! - `tcp-transfers` (default count 10^6 transfers) and `reconnect` (1000 cycles) run here;
//!   `rdma-burst` (one round of 64 QPs × batch 32768 × 8 B, then the failing batches) runs
//!   inside the SoftRoCE guest (`softroce::run`; needs root, as `cargo xtask softroce` does).
//! - `--phase all` (the default) runs the three in that order, each even when an earlier one
//!   failed, and fails when any did. `--count` needs one `--phase` (it counts different things).
//! - `--time-limit-s` bounds each phase (defaults: [`DEFAULT_LIMITS`]); the driver stops itself
//!   there, failing, and this task kills it [`GRACE`] later should it not; the guest's own
//!   deadline (`RXE_VM_TIMEOUT`, unless set) is the limit plus [`GUEST_GRACE`].
//! - `--quick`: small counts ([`QUICK`]) with few samples and a wide tolerance, to exercise
//!   the driver end to end in seconds (not a flatness verdict).
//! - Words after `--` go to the driver as they are (e.g. `-- --seed 7 --samples 100`).

use crate::util::{self, workspace_root};
use std::process::Command;
use std::time::{Duration, Instant};

/// The phases, in the order `all` runs them.
const PHASES: [&str; 3] = ["tcp-transfers", "reconnect", "rdma-burst"];
/// Time limit of each phase, seconds, when `--time-limit-s` is not given.
const DEFAULT_LIMITS: [u64; 3] = [3600, 1200, 2400];
/// Driver arguments of `--quick`, per phase.
const QUICK: [&[&str]; 3] = [
    &["--count", "2000", "--samples", "4", "--tolerance-pct", "50"],
    &["--count", "20", "--samples", "4", "--tolerance-pct", "50"],
    &["--count", "1", "--qps", "4", "--batch", "1024"],
];
/// How long after its time limit a driver that did not stop is killed.
const GRACE: Duration = Duration::from_secs(120);
/// The guest's deadline beyond the phase's limit (boot and set-up under TCG).
const GUEST_GRACE: u64 = 600;

const USAGE: &str =
    "usage: cargo xtask soak [--phase tcp-transfers|reconnect|rdma-burst|all] [--count N] [--time-limit-s S] [--quick] [-- SOAK_ARGS...]";

#[derive(Debug, PartialEq)]
struct Opts {
    phases: Vec<usize>,
    count: Option<u64>,
    limit: Option<u64>,
    quick: bool,
    extra: Vec<String>,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts { phases: (0..PHASES.len()).collect(), count: None, limit: None, quick: false, extra: Vec::new() };
    let mut all = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().cloned().ok_or(format!("soak: {a} needs {what}\n{USAGE}"));
        match a.as_str() {
            "--phase" => {
                let p = val("a phase")?;
                if p == "all" {
                    o.phases = (0..PHASES.len()).collect();
                    all = true;
                } else {
                    let i = PHASES.iter().position(|&x| x == p).ok_or(format!("soak: --phase {p}: one of {}, all", PHASES.join(", ")))?;
                    o.phases = vec![i];
                    all = false;
                }
            }
            "--count" => {
                let v = val("N")?;
                o.count = Some(v.parse().ok().filter(|&n| n > 0).ok_or(format!("soak: --count {v}: a positive number"))?);
            }
            "--time-limit-s" => {
                let v = val("S")?;
                o.limit = Some(
                    v.parse()
                        .ok()
                        .filter(|&n| (1..=7 * 86400).contains(&n))
                        .ok_or(format!("soak: --time-limit-s {v}: 1..=604800 seconds"))?,
                );
            }
            "--quick" => o.quick = true,
            "--" => {
                o.extra = it.by_ref().cloned().collect();
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("soak: unknown argument {other}\n{USAGE}")),
        }
    }
    if all && o.count.is_some() {
        return Err("soak: --count counts transfers, cycles or rounds depending on the phase: give one --phase with it".into());
    }
    Ok(o)
}

/// The driver's arguments for phase `i`, and its time limit.
fn driver_args(o: &Opts, i: usize) -> (Vec<String>, u64) {
    let limit = o.limit.unwrap_or(DEFAULT_LIMITS[i]);
    let mut a: Vec<String> = vec!["--phase".into(), PHASES[i].into(), "--time-limit-s".into(), limit.to_string()];
    if o.quick {
        a.extend(QUICK[i].iter().map(|s| s.to_string()));
    }
    if let Some(n) = o.count {
        a.extend(["--count".to_string(), n.to_string()]); // the last --count wins
    }
    a.extend(o.extra.iter().cloned());
    (a, limit)
}

/// Runs `exe args` here, killed `GRACE` after `limit` seconds; its exit code.
fn run_here(exe: &std::path::Path, args: &[String], limit: u64) -> Result<i32, String> {
    let mut child = Command::new(exe).args(args).spawn().map_err(|e| format!("{}: {e}", exe.display()))?;
    let deadline = Instant::now() + Duration::from_secs(limit) + GRACE;
    loop {
        if let Some(st) = child.try_wait().map_err(|e| format!("waiting for the soak driver: {e}"))? {
            return Ok(st.code().unwrap_or(-1));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the soak driver did not stop within {limit} s (--time-limit-s) + {} s: killed", GRACE.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The task.
pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    util::ensure_build_deps()?;
    util::cargo(&["build", "--release", "-p", "mori-bench", "--bin", "soak"])?;
    let exe = workspace_root().join("target/release/soak");
    let mut results = Vec::new();
    for &i in &o.phases {
        let (a, limit) = driver_args(&o, i);
        let t = Instant::now();
        let r = if PHASES[i] == "rdma-burst" {
            if std::env::var_os("RXE_VM_TIMEOUT").is_none() {
                // Read by softroce::run below, in this process (single-threaded here).
                std::env::set_var("RXE_VM_TIMEOUT", (limit + GUEST_GRACE).to_string());
            }
            let cmd: Vec<String> = std::iter::once(exe.display().to_string()).chain(a.iter().cloned()).collect();
            println!("xtask: soak {} in the SoftRoCE guest: {}", PHASES[i], cmd.join(" "));
            crate::softroce::run(&cmd).map(i32::from)
        } else {
            println!("xtask: soak {}: {} {}", PHASES[i], exe.display(), a.join(" "));
            run_here(&exe, &a, limit)
        };
        let line = match r {
            Ok(0) => format!("soak {}: PASS ({:.1} s)", PHASES[i], t.elapsed().as_secs_f64()),
            Ok(rc) => format!("soak {}: FAIL (exit status {rc}, {:.1} s)", PHASES[i], t.elapsed().as_secs_f64()),
            Err(e) => format!("soak {}: FAIL ({e})", PHASES[i]),
        };
        results.push(line);
    }
    for l in &results {
        println!("xtask: {l}");
    }
    let failed = results.iter().filter(|l| l.contains(": FAIL")).count();
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} of {} soak phase(s) failed", results.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<Opts, String> {
        parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn phases_counts_and_limits() {
        let o = p(&[]).unwrap();
        assert_eq!(o.phases, vec![0, 1, 2]);
        assert_eq!(driver_args(&o, 0), (vec!["--phase".into(), "tcp-transfers".into(), "--time-limit-s".into(), "3600".into()], 3600));
        let o = p(&["--phase", "reconnect", "--count", "5", "--time-limit-s", "9", "--quick", "--", "--seed", "3"]).unwrap();
        assert_eq!(o.phases, vec![1]);
        let (a, l) = driver_args(&o, 1);
        assert_eq!(l, 9);
        assert_eq!(a.join(" "), "--phase reconnect --time-limit-s 9 --count 20 --samples 4 --tolerance-pct 50 --count 5 --seed 3");
    }

    #[test]
    fn refusals_name_the_flag() {
        assert!(p(&["--count", "5"]).unwrap_err().contains("give one --phase"));
        assert!(p(&["--phase", "x"]).unwrap_err().contains("--phase x: one of tcp-transfers, reconnect, rdma-burst, all"));
        assert!(p(&["--time-limit-s", "0"]).unwrap_err().contains("1..=604800"));
        assert!(p(&["--count"]).unwrap_err().contains("--count needs N"));
        assert!(p(&["--bogus"]).unwrap_err().contains("unknown argument --bogus"));
    }
}
