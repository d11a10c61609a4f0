//! `cargo xtask fuzz [--target NAME | --all] [--seconds N] [--jobs J]`, and
//! `cargo xtask fuzz --build-only --out DIR [--target NAME | --all]`: builds the libFuzzer
//! targets of `fuzz/` (docs/FUZZING.md) with coverage instrumentation on the stable toolchain
//! and runs each for N seconds, or puts the binaries (stripped) and scripts/fuzz-long.sh in
//! DIR for a machine without Rust.
//!
//! The instrumentation is LLVM's SanitizerCoverage, asked for through stable codegen flags
//! ([`RUSTFLAGS`]): no cargo-fuzz (which needs a nightly toolchain, or RUSTC_BOOTSTRAP) and no
//! AddressSanitizer (`-Zsanitizer` is nightly-only): the targets are safe Rust, so what a run
//! catches is a panic (a failed assertion, an out-of-bounds index, an arithmetic overflow:
//! the build keeps debug assertions and overflow checks), an abort, a hang past libFuzzer's
//! timeout, or memory past its RSS limit.
//!
//! Corpora live in `fuzz/corpus/<target>/` (seeded by each binary's `--write-seeds`, then
//! grown by the runs), crash reproducers and logs in `fuzz/artifacts/<target>/`; both are
//! git-ignored. Per target it prints executions, coverage (libFuzzer's `cov:` edges and `ft:`
//! features), corpus size and crashes, and fails when any target crashed, naming the
//! reproducer and the command that replays it.

use crate::util::workspace_root;
use std::path::{Path, PathBuf};
use std::process::Command;

/// SanitizerCoverage as libFuzzer wants it (inline 8-bit edge counters, the PC table, comparison
/// tracing for its value profile), and `--cfg fuzzing` as cargo-fuzz sets it. All stable flags.
pub const RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg",
    "fuzzing",
];

/// libFuzzer's per-input timeout, seconds: an input slower than this is reported as a hang.
const TIMEOUT_S: u32 = 30;
/// libFuzzer's memory limit, MB.
const RSS_LIMIT_MB: u32 = 2048;

struct Opts {
    targets: Option<Vec<String>>,
    seconds: u64,
    jobs: usize,
    build_only: bool,
    out: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts { targets: None, seconds: 60, jobs: 1, build_only: false, out: None };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().cloned().ok_or(format!("{what} needs a value"));
        match a.as_str() {
            "--target" => o.targets.get_or_insert_with(Vec::new).push(val("--target")?),
            "--all" => o.targets = None,
            "--seconds" => o.seconds = val("--seconds")?.parse().map_err(|_| "--seconds takes a whole number".to_string())?,
            "--jobs" => o.jobs = val("--jobs")?.parse().ok().filter(|&j| j >= 1).ok_or("--jobs takes a number >= 1")?,
            "--build-only" => o.build_only = true,
            "--out" => o.out = Some(PathBuf::from(val("--out")?)),
            other => {
                return Err(format!(
                    "fuzz: unknown argument {other:?}; usage: cargo xtask fuzz [--target NAME | --all] [--seconds N] [--jobs J] | --build-only --out DIR"
                ))
            }
        }
    }
    if o.build_only && o.out.is_none() {
        return Err("fuzz: --build-only needs --out DIR".into());
    }
    Ok(o)
}

/// Every target: one file per target in fuzz/fuzz_targets/.
pub fn all_targets() -> Result<Vec<String>, String> {
    let dir = workspace_root().join("fuzz/fuzz_targets");
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.path().file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    v.sort();
    Ok(v)
}

fn host_triple() -> Result<String, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let o = Command::new(&rustc).arg("-vV").output().map_err(|e| format!("{rustc} -vV: {e}"))?;
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or_else(|| format!("{rustc} -vV names no host"))
}

/// Builds the targets (release, instrumented) and returns the directory holding them. The
/// explicit `--target` keeps the flags off build scripts and proc macros, which run on the
/// host uninstrumented (as cargo-fuzz does).
fn build(targets: &[String]) -> Result<PathBuf, String> {
    crate::util::ensure_build_deps()?;
    let triple = host_triple()?;
    let root = workspace_root();
    let manifest = root.join("fuzz/Cargo.toml");
    let mut args = vec!["build".to_string(), "--release".into(), "--target".into(), triple.clone()];
    args.extend(["--manifest-path".to_string(), manifest.display().to_string()]);
    for t in targets {
        args.extend(["--bin".to_string(), t.clone()]);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!("xtask: CARGO_ENCODED_RUSTFLAGS=\"{}\" cargo {}", RUSTFLAGS.join(" "), args.join(" "));
    let st = Command::new(cargo)
        .args(&args)
        .current_dir(root.join("fuzz"))
        .env("CARGO_ENCODED_RUSTFLAGS", RUSTFLAGS.join("\x1f"))
        .env_remove("RUSTFLAGS")
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !st.success() {
        return Err(format!("building the fuzz targets failed ({st})"));
    }
    Ok(root.join("fuzz/target").join(triple).join("release"))
}

/// What one run reported.
#[derive(Default)]
struct Outcome {
    execs: u64,
    exec_per_s: u64,
    cov: u64,
    ft: u64,
    corpus: usize,
    crash: Option<String>,
    artifact: Option<String>,
    rc: i32,
}

/// Picks the numbers out of libFuzzer's output.
fn read_log(log: &str) -> Outcome {
    let mut o = Outcome::default();
    let num = |s: &str| s.split_whitespace().next().and_then(|t| t.trim_end_matches(|c: char| !c.is_ascii_digit()).parse().ok());
    for line in log.lines() {
        if let Some(v) = line.strip_prefix("stat::number_of_executed_units:") {
            o.execs = num(v).unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("stat::average_exec_per_sec:") {
            o.exec_per_s = num(v).unwrap_or(0);
        } else if let Some(p) = line.split("Test unit written to ").nth(1) {
            o.artifact = Some(p.trim().to_string());
        }
        if line.starts_with('#') {
            if let (Some(c), Some(f)) = (line.split(" cov: ").nth(1), line.split(" ft: ").nth(1)) {
                o.cov = num(c).unwrap_or(o.cov);
                o.ft = num(f).unwrap_or(o.ft);
            }
        }
    }
    // The first line saying what went wrong: a panic (with its message), a libFuzzer verdict.
    let lines: Vec<&str> = log.lines().collect();
    if let Some(i) = lines.iter().position(|l| l.contains("panicked at")) {
        o.crash = Some(lines[i..lines.len().min(i + 4)].join(" | "));
    } else if let Some(l) = lines.iter().find(|l| l.contains("ERROR: libFuzzer")) {
        o.crash = Some(l.to_string());
    }
    o
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok()).filter(|e| e.path().is_file()).count()).unwrap_or(0)
}

/// Seeds, then runs one target for `seconds` (its output in `artifacts/<t>/fuzz.log`).
fn run_one(bin: &Path, t: &str, seconds: u64) -> Result<Outcome, String> {
    let root = workspace_root().join("fuzz");
    let (corpus, art) = (root.join("corpus").join(t), root.join("artifacts").join(t));
    std::fs::create_dir_all(&art).map_err(|e| format!("{}: {e}", art.display()))?;
    let exe = bin.join(t);
    let st = Command::new(&exe).arg("--write-seeds").arg(&corpus).output().map_err(|e| format!("{}: {e}", exe.display()))?;
    if !st.status.success() {
        return Err(format!("{t} --write-seeds failed: {}", String::from_utf8_lossy(&st.stderr)));
    }
    let dict = root.join("corpus").join(format!("{t}.dict"));
    let st = Command::new(&exe).arg("--write-dict").arg(&dict).status().map_err(|e| format!("{}: {e}", exe.display()))?;
    if !st.success() {
        return Err(format!("{t} --write-dict failed"));
    }
    let mut cmd = Command::new(&exe);
    cmd.arg(&corpus)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={TIMEOUT_S}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", art.display()));
    if std::fs::metadata(&dict).map(|m| m.len() > 0).unwrap_or(false) {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    let log_path = art.join("fuzz.log");
    let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err = log.try_clone().map_err(|e| format!("{}: {e}", log_path.display()))?;
    let st = cmd.stdout(log).stderr(err).stdin(std::process::Stdio::null()).status().map_err(|e| format!("{}: {e}", exe.display()))?;
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut o = read_log(&text);
    o.rc = st.code().unwrap_or(-1);
    o.corpus = count_files(&corpus);
    if o.rc != 0 && o.crash.is_none() {
        o.crash = Some(format!("libFuzzer exited with {st}; see {}", log_path.display()));
    }
    Ok(o)
}

/// Entry point of `cargo xtask fuzz`.
pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let all = all_targets()?;
    let targets = match &o.targets {
        None => all.clone(),
        Some(v) => {
            if let Some(bad) = v.iter().find(|t| !all.contains(t)) {
                return Err(format!("fuzz: no target {bad:?} (targets: {})", all.join(", ")));
            }
            v.clone()
        }
    };
    let t0 = std::time::Instant::now();
    let bin = build(&targets)?;
    println!("xtask: fuzz targets built in {:.0} s", t0.elapsed().as_secs_f64());
    if o.build_only {
        return bundle(&bin, &targets, o.out.as_deref().unwrap_or(Path::new(".")));
    }
    let t1 = std::time::Instant::now();
    println!(
        "xtask: fuzzing {} targets for {} s each, {} at a time (no AddressSanitizer: see docs/FUZZING.md)",
        targets.len(),
        o.seconds,
        o.jobs
    );
    let queue = std::sync::Mutex::new(targets.iter().collect::<Vec<_>>());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..o.jobs.min(targets.len()) {
            s.spawn(|| loop {
                let Some(t) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop() else { break };
                let r = run_one(&bin, t, o.seconds);
                if let Ok(x) = &r {
                    println!(
                        "xtask: fuzz {t}: {} executions, cov {} ft {}, {}",
                        x.execs,
                        x.cov,
                        x.ft,
                        if x.crash.is_some() { "CRASHED" } else { "no crash" }
                    );
                }
                results.lock().unwrap_or_else(|p| p.into_inner()).push((t.clone(), r));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by(|a, b| a.0.cmp(&b.0));
    println!("\n{:<16} {:>12} {:>9} {:>7} {:>8} {:>8} {:>8}", "target", "executions", "exec/s", "cov", "ft", "corpus", "crashes");
    let mut failed = Vec::new();
    for (t, r) in &results {
        match r {
            Ok(x) => {
                println!(
                    "{t:<16} {:>12} {:>9} {:>7} {:>8} {:>8} {:>8}",
                    x.execs,
                    x.exec_per_s,
                    x.cov,
                    x.ft,
                    x.corpus,
                    u32::from(x.crash.is_some())
                );
                if let Some(c) = &x.crash {
                    let repro = x.artifact.clone().unwrap_or_else(|| "(no reproducer written)".into());
                    failed.push(format!("{t}: {c}\n  reproducer: {repro}\n  replay: {} {repro}", bin.join(t).display()));
                }
            }
            Err(e) => {
                println!("{t:<16} could not run: {e}");
                failed.push(format!("{t}: {e}"));
            }
        }
    }
    println!("xtask: fuzzing took {:.0} s (after {:.0} s of building)", t1.elapsed().as_secs_f64(), t1.duration_since(t0).as_secs_f64());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("fuzzing found {} crash(es):\n{}", failed.len(), failed.join("\n")))
    }
}

/// `--build-only`: the binaries, stripped, and scripts/fuzz-long.sh in `out`.
fn bundle(bin: &Path, targets: &[String], out: &Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut total = 0;
    for t in targets {
        let dst = out.join(t);
        std::fs::copy(bin.join(t), &dst).map_err(|e| format!("copy {t}: {e}"))?;
        // Without debug info and symbols a binary is a tenth of the size; a panic's message
        // (what a finding is) is kept.
        let _ = Command::new("strip").arg(&dst).status();
        total += std::fs::metadata(&dst).map(|m| m.len()).unwrap_or(0);
    }
    let script = workspace_root().join("scripts/fuzz-long.sh");
    std::fs::copy(&script, out.join("fuzz-long.sh")).map_err(|e| format!("copy {}: {e}", script.display()))?;
    println!(
        "xtask: {} fuzz targets ({:.1} MB) and fuzz-long.sh in {}; there: bash fuzz-long.sh . SECONDS CORPUS_DIR",
        targets.len(),
        total as f64 / 1e6,
        out.display()
    );
    Ok(())
}

/// Seconds per target of the short run in `cargo xtask test` (env `MORI_FUZZ_SECONDS`).
pub const CI_SECONDS: u64 = 10;

/// The short run of every target that `cargo xtask test` makes: [`CI_SECONDS`] each (or
/// `MORI_FUZZ_SECONDS`; 0 skips the run, saying so), two at a time.
pub fn ci_run() -> Result<(), String> {
    let secs = match std::env::var("MORI_FUZZ_SECONDS") {
        Ok(v) => v.trim().parse::<u64>().map_err(|_| format!("MORI_FUZZ_SECONDS={v:?} is not a whole number of seconds"))?,
        Err(_) => CI_SECONDS,
    };
    if secs == 0 {
        println!("xtask: MORI_FUZZ_SECONDS=0: the fuzz targets were NOT run");
        return Ok(());
    }
    run(&["--all".into(), "--seconds".into(), secs.to_string(), "--jobs".into(), "2".into()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_gives_numbers_panic_and_reproducer() {
        let log = "INFO: Seed: 3751195775\n\
            #8\tINITED cov: 687 ft: 855 corp: 7/608b exec/s: 0 rss: 31Mb\n\
            #512\tNEW    cov: 700 ft: 901 corp: 9/700b lim: 4096 exec/s: 0 rss: 32Mb L: 66/66 MS: 1 CopyPart-\n\
            \n\
            thread '<unnamed>' (15092) panicked at src/tcp_data.rs:270:9:\n\
            assertion `left == right` failed: the engine's replies differ from the protocol model\n\
            ==15092== ERROR: libFuzzer: deadly signal\n\
            artifact_prefix='a/tcp_data/'; Test unit written to a/tcp_data/crash-58fc3151\n\
            stat::number_of_executed_units: 1001\n\
            stat::average_exec_per_sec:     1001\n";
        let o = read_log(log);
        assert_eq!((o.execs, o.exec_per_s, o.cov, o.ft), (1001, 1001, 700, 901));
        assert_eq!(o.artifact.as_deref(), Some("a/tcp_data/crash-58fc3151"));
        let c = o.crash.unwrap();
        assert!(c.starts_with("thread '<unnamed>' (15092) panicked at src/tcp_data.rs:270:9: | assertion"), "{c}");
        let clean = read_log(
            "#3000\tDONE   cov: 488 ft: 1064 corp: 296/22Kb lim: 1891 exec/s: 300 rss: 28Mb\nstat::number_of_executed_units: 3000\n",
        );
        assert!(clean.crash.is_none() && clean.artifact.is_none());
        assert_eq!((clean.execs, clean.cov, clean.ft), (3000, 488, 1064));
    }

    #[test]
    fn arguments() {
        let a = |v: &[&str]| parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let o = a(&["--target", "desc", "--target", "tcp_data", "--seconds", "5", "--jobs", "3"]).unwrap();
        assert_eq!((o.targets.unwrap(), o.seconds, o.jobs), (vec!["desc".to_string(), "tcp_data".to_string()], 5, 3));
        assert!(a(&["--build-only"]).is_err());
        assert!(a(&["--jobs", "0"]).is_err());
        assert!(a(&["--frobnicate"]).is_err());
        assert!(a(&["--build-only", "--out", "d"]).unwrap().build_only);
    }
}
