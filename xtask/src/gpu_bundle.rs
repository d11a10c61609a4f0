//! `cargo xtask gpu-bundle`: builds, in release, what scripts/gpu-machine.sh runs on the GPU
//! machine (which has no Rust) and copies it, stripped, into `.gpu-bundle/` (git-ignored),
//! to be carried there: the mori-gpu, xgmi, fabric and mori-cli GPU test binaries, bench_engine,
//! bench_copy (the bare-copy baseline), bench_dispatch_combine and mori.

use crate::util::{cargo, cargo_stdout, workspace_root};
use std::process::Command;

fn test_exe(pkg: &str, test: &str) -> Result<String, String> {
    // mori-io's GPU tests create every backend (required-features = all-backends).
    let features: &[&str] = if pkg == "mori-io" { &["--features", "all-backends"] } else { &[] };
    let json = cargo_stdout(&[&["test", "--release", "-p", pkg, "--test", test, "--no-run", "--message-format=json"], features].concat())?;
    json.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == test)
        .find_map(|v| v["executable"].as_str().map(str::to_string))
        .ok_or_else(|| format!("cargo did not report the {test} test executable"))
}

pub fn run(_args: &[String]) -> Result<(), String> {
    crate::util::ensure_build_deps()?;
    let root = workspace_root();
    let dir = root.join(".gpu-bundle");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    cargo(&[
        "build",
        "--release",
        "-p",
        "mori-bench",
        "--bin",
        "bench_engine",
        "--bin",
        "bench_copy",
        "--bin",
        "bench_dispatch_combine",
        "--bin",
        "bench_proxy",
    ])?;
    cargo(&["build", "--release", "-p", "mori-cli", "--bin", "mori"])?;
    let items = [
        (test_exe("mori-gpu", "gpu")?, "gpu"),
        (test_exe("mori-io", "xgmi_gpu")?, "xgmi_gpu"),
        (test_exe("mori-io", "fabric_gpu")?, "fabric_gpu"),
        (test_exe("mori-cli", "gpu")?, "cli_gpu"),
        (test_exe("mori-shmem", "gpu")?, "shmem_gpu"),
        (test_exe("mori-ep", "gpu")?, "ep_gpu"),
        (test_exe("mori-ep", "gpu_internode")?, "ep_internode_gpu"),
        (root.join("target/release/bench_engine").display().to_string(), "bench_engine"),
        (root.join("target/release/bench_copy").display().to_string(), "bench_copy"),
        (root.join("target/release/bench_dispatch_combine").display().to_string(), "bench_dispatch_combine"),
        (root.join("target/release/bench_proxy").display().to_string(), "bench_proxy"),
        (root.join("target/release/mori").display().to_string(), "mori"),
    ];
    for (src, name) in items {
        let dst = dir.join(name);
        std::fs::copy(&src, &dst).map_err(|e| format!("copy {src}: {e}"))?;
        let _ = Command::new("strip").arg(&dst).status();
        let size = std::fs::metadata(&dst).map(|m| m.len()).unwrap_or(0);
        println!("xtask: .gpu-bundle/{name} ({:.1} MB)", size as f64 / 1e6);
    }
    println!("xtask: carry .gpu-bundle and run: bash scripts/gpu-machine.sh");
    Ok(())
}
