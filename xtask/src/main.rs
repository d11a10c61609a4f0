//! Project tasks, run as `cargo xtask <task>`.
//!
//! - `bench [ARGS]`: installs the build dependencies (cmake, libclang, as root), then runs
//!   `bench_engine ARGS` built in release.
//! - `test`: installs what the tests need (as root, with apt), runs every workspace test and
//!   the facade's doc-tests with every feature, then the root-only tests: network namespaces, and the RDMA suite plus a short
//!   `bench_engine --backend rdma` read and write sweep inside one SoftRoCE guest
//!   (`MORI_SKIP_SOFTROCE=1` skips the guest, saying so).
//! - `compare-tcp`: bench_engine against iperf3 and ucx_perftest on loopback, in one run,
//!   printing the ratios recorded in docs/PERFORMANCE.md.
//! - `softroce [--] CMD [ARGS...]`: runs CMD in a QEMU guest with SoftRoCE (rxe0); see softroce.rs.
//! - `soak [--phase P] [--count N] [--time-limit-s S] [--quick]`: the soak phases (issue 19),
//!   bounded in count and time, loopback only; rdma-burst in the SoftRoCE guest; see soak.rs.
//! - `kernels [--check]`: builds kernels/*.cu into kernels/prebuilt/ (nvcc sm_90, clang HIP
//!   gfx942/gfx950), or checks that the committed artifacts are fresh; see kernels.rs.
//! - `bare-machine --yes`: purges what the xtask installs (Debian packages the image lacks, the
//!   nvcc and SoftRoCE caches), so the next task runs as on a bare machine; see bare.rs.
//! - `embedder-check`: a fresh cargo project depending on `mori` with default features builds
//!   (without cmake or libclang), runs one tcp write, and compiles no GPU or ibverbs binding.
//! - `gpu-bundle`: builds what scripts/gpu-machine.sh runs on the GPU machine into
//!   `.gpu-bundle/` (release, stripped); see gpu_bundle.rs.
//! - `py <test | install | wheel> [--release]`: the Python package `mori_rs` (crates/py) built
//!   by a pinned maturin in its own venv; `test` runs its pytest suite (part of `test`); see
//!   python.rs.
//! - `fuzz`: builds the libFuzzer targets of fuzz/ on stable and runs them (or `--build-only
//!   --out DIR` for scripts/fuzz-long.sh); see fuzz.rs and docs/FUZZING.md.

mod bare;
mod compare;
mod compare_ep;
mod compare_rdma;
mod embedder;
mod fuzz;
mod gpu_bundle;
mod kernels;
mod prereq;
mod python;
mod soak;
mod softroce;
mod util;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("compare-tcp") => compare::run(&args[1..]),
        Some("compare-rdma") => compare_rdma::run(&args[1..]),
        Some("compare-ep-tcp") => compare_ep::run(&args[1..]),
        Some("softroce") => return softroce::main(&args[1..]),
        Some("soak") => soak::run(&args[1..]),
        Some("kernels") => kernels::run(&args[1..]),
        Some("gpu-bundle") => gpu_bundle::run(&args[1..]),
        Some("bare-machine") => bare::run(&args[1..]),
        Some("embedder-check") => embedder::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("py") => python::main(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <bench [ARGS] | test | compare-tcp [--secs N] | compare-rdma [--secs N] | compare-ep-tcp [--rounds N] [--lanes N] [--chunk-tokens N] | softroce [--] CMD [ARGS...] | soak [--phase P] [--count N] [--time-limit-s S] [--quick] | kernels [--check] | gpu-bundle | bare-machine --yes | embedder-check | py <test | install | wheel> [--release] | fuzz [--target NAME | --all] [--seconds N] [--jobs J] [--build-only --out DIR]>");
            return ExitCode::from(2);
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// bench_engine in release, after making sure it can be built.
fn bench(args: &[String]) -> Result<(), String> {
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    util::ensure_build_deps()?;
    let mut a = vec!["run", "--release", "--quiet", "-p", "mori-bench", "--bin", "bench_engine", "--"];
    a.extend(args.iter().map(String::as_str));
    util::cargo(&a)
}

/// Every test of the workspace, then the root-only ones (network namespaces, SoftRoCE guest).
fn test(extra: &[String]) -> Result<(), String> {
    let root = util::is_root();
    util::ensure_build_deps()?;
    if root {
        prereq::ensure_group(prereq::Group::Netns)?;
    }
    kernels::run(&["--check".to_string()])?;
    let mut a = vec!["test", "--workspace"];
    a.extend(extra.iter().map(String::as_str));
    let mut counts = util::TestCounts::default();
    util::cargo_counted(&a, &mut counts)?;
    // The facade's doc-tests of every feature's module (the workspace run above builds `mori`
    // with its default features only).
    util::cargo_counted(&["test", "-p", "mori", "--features", "full", "--doc"], &mut counts)?;
    python::main(&["test".to_string()])?;
    fuzz::ci_run()?;
    prune_fuzz_builds()?;
    let total = |c: util::TestCounts| {
        println!(
            "xtask: cargo tests: {} passed, {} failed, {} ignored (the pytest, fuzz and SoftRoCE results are printed above)",
            c.passed, c.failed, c.ignored
        )
    };
    if !root {
        println!("xtask: NOT run (need root): the network-namespace tests (crates/bench/tests/netns.rs) and the RDMA suite in the SoftRoCE guest");
        total(counts);
        return Ok(());
    }
    util::cargo_counted(&["test", "-p", "mori-bench", "--test", "netns", "--", "--ignored", "--test-threads=1"], &mut counts)?;
    if std::env::var_os("MORI_SKIP_SOFTROCE").is_some() {
        println!("xtask: MORI_SKIP_SOFTROCE is set: the RDMA suite in the SoftRoCE guest was NOT run");
        total(counts);
        return Ok(());
    }
    let r = softroce_suite();
    total(counts);
    r
}

/// With `MORI_PRUNE_BUILDS=1` (`.ci/run` sets it), removes the fuzz workspace's build tree
/// (about 1.8 GB) once the targets have run, so that the root-only builds after it find the
/// disk a cold CI run started with; the corpora and artifacts stay.
fn prune_fuzz_builds() -> Result<(), String> {
    if std::env::var("MORI_PRUNE_BUILDS").as_deref() != Ok("1") {
        return Ok(());
    }
    let dir = util::workspace_root().join("fuzz/target");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
        println!("xtask: MORI_PRUNE_BUILDS: removed fuzz/target");
    }
    Ok(())
}

/// Builds the RDMA test binaries and bench_engine on the host, then runs them in one guest:
/// the conformance suite, the bench_engine sweeps, MORI-EP's host implementation (2 nodes x 2
/// ranks over rdma, checked against the reference), then the fault tests (peer killed, send
/// queue full, remote region deregistered), last so that a failure there hides nothing else.
fn softroce_suite() -> Result<(), String> {
    let json = util::cargo_stdout(&[
        "test",
        "-p",
        "mori-io",
        "--features",
        "all-backends",
        "--test",
        "rdma_softroce",
        "--test",
        "rdma_faults",
        "--no-run",
        "--message-format=json",
    ])?;
    let exe = |name: &str| {
        json.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == name)
            .find_map(|v| v["executable"].as_str().map(str::to_string))
            .ok_or(format!("cargo did not report the {name} test executable"))
    };
    let (bin, faults) = (exe("rdma_softroce")?, exe("rdma_faults")?);
    util::cargo(&["build", "-p", "mori-bench", "--bin", "bench_engine", "--bin", "bench_dispatch_combine"])?;
    let bench = util::workspace_root().join("target/debug/bench_engine");
    let ep = util::workspace_root().join("target/debug/bench_dispatch_combine");
    let ep_run = "--device cpu --local --world-size 4 --num-nodes 2 --transport rdma --num-tokens 32 --hidden 512 --num-experts 32 --top-k 4 --iters 2 --warmup 1";
    let sweep = "--local --backend rdma --all --sweep-start 64 --sweep-max 262144 --transfer-batch-size 8 --iters 10 --warmup-iters 2 --log-level warning";
    let script = format!(
        "set -e; '{bin}' --ignored --test-threads=1; \
         echo 'bench_engine --backend rdma --op write'; '{b}' --op write {sweep}; \
         echo 'bench_engine --backend rdma --op read'; '{b}' --op read --enable-sess {sweep}; \
         echo 'bench_dispatch_combine --device cpu, 2 nodes x 2 ranks over rdma (v1 fp8, async_ll bf16)'; \
         '{e}' {ep_run} --kernel-type v1 --dtype fp8; '{e}' {ep_run} --kernel-type async_ll --dtype bf16 --zero-token-ranks 1 --none-rows-every 4; \
         echo 'rdma fault tests (child engine killed, send queue full, remote region deregistered)'; \
         '{faults}' --ignored --test-threads=1",
        b = bench.display(),
        e = ep.display()
    );
    println!("xtask: RDMA suite, bench_engine --backend rdma sweeps, MORI-EP's host implementation over rdma and RDMA fault tests in the SoftRoCE guest");
    let rc = softroce::run(&["bash".to_string(), "-c".to_string(), script])?;
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("the SoftRoCE guest run failed (exit status {rc})"))
    }
}
