//! `cargo xtask compare-ep-tcp [--rounds N] [--lanes N] [--chunk-tokens N]`: the inter-node leg
//! of MORI-EP's host implementation against bench_engine on the same transport, message size
//! and lanes, measured in the same run (issue 16's performance point).
//!
//! - EP: `bench_dispatch_combine --device cpu --local`, 2 nodes x 1 rank, V1, fp8, T=1024,
//!   H=7168, rank 1 sends no tokens (`--zero-token-ranks 1`), so rank 0's dispatch leg is one
//!   direction, as bench_engine's is. Its rate = the bytes rank 0's proxy wrote to node 1 over
//!   the time from its first post to its last completion (signals included). Twice: the leg
//!   alone (`--remote-only-ranks 0`: every token to node 1's experts, the target's figure) and
//!   with DeepEP routing, where rank 0's copies to itself run beside the leg and, on a host
//!   with few cores, take CPU the tcp lanes need.
//! - bench_engine: `--local --backend tcp --op write`, message size = one chunk
//!   (`--chunk-tokens` records of the leg), batch = the leg's chunk count, same lanes.
//!
//! Both alternate `--rounds` times; the medians and their ratio are printed (target >= 0.9).

use crate::util::{cargo, workspace_root};
use std::process::Command;

fn flag(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or(format!("{name} needs a number")),
    }
}

fn json_run(cmd: &mut Command, what: &str, path: &std::path::Path) -> Result<serde_json::Value, String> {
    let o = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !o.status.success() {
        return Err(format!("{what} failed ({}): {}{}", o.status, String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{what}: {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{what}: json: {e}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &[String]) -> Result<(), String> {
    let rounds = flag(args, "--rounds", 5)?.max(1);
    let lanes = flag(args, "--lanes", 4)?;
    let chunk = flag(args, "--chunk-tokens", 32)?;
    cargo(&["build", "--release", "-p", "mori-bench", "--bin", "bench_engine", "--bin", "bench_dispatch_combine"])?;
    let bin = |n: &str| workspace_root().join("target/release").join(n);
    let dir = std::env::temp_dir().join(format!("mori-compare-ep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (ep_json, be_json) = (dir.join("ep.json"), dir.join("be.json"));
    let (lanes_s, chunk_s) = (lanes.to_string(), chunk.to_string());
    let ep_args = [
        "--device",
        "cpu",
        "--local",
        "--world-size",
        "2",
        "--num-nodes",
        "2",
        "--kernel-type",
        "v1",
        "--dtype",
        "fp8",
        "--num-tokens",
        "1024",
        "--hidden",
        "7168",
        "--iters",
        "20",
        "--warmup",
        "3",
        "--zero-token-ranks",
        "1",
        "--lanes",
        &lanes_s,
        "--chunk-tokens",
        &chunk_s,
    ];
    // Per round: the leg alone (rank 0 routes every token to node 1), the leg beside rank 0's
    // intra-node copies (DeepEP routing), then bench_engine with the leg's shape.
    let (mut alone, mut mixed, mut be_rates) = (Vec::new(), Vec::new(), Vec::new());
    let mut shape = None;
    for round in 0..rounds {
        let leg = |extra: &[&str]| -> Result<(f64, u64, u64, u64), String> {
            let j = json_run(
                Command::new(bin("bench_dispatch_combine")).args(ep_args).args(extra).arg("--json").arg(&ep_json),
                "bench_dispatch_combine",
                &ep_json,
            )?;
            let r0 = j["processes"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|p| p["ranks"].as_array().into_iter().flatten())
                .find(|r| r["rank"] == 0)
                .ok_or("bench_dispatch_combine: no figures for rank 0")?
                .clone();
            let (bytes, phys, gbps) = (
                r0["inter_bytes"].as_u64().unwrap_or(0),
                r0["rdma_physical_tokens"].as_u64().unwrap_or(0),
                r0["inter_gbps"].as_f64().unwrap_or(0.0),
            );
            if bytes == 0 || phys == 0 {
                return Err(format!("rank 0 moved no inter-node bytes: {r0}"));
            }
            Ok((gbps, bytes, phys, bytes / phys))
        };
        let (a_gbps, bytes, phys, stride) = leg(&["--remote-only-ranks", "0"])?;
        let (m_gbps, m_bytes, m_phys, _) = leg(&[])?;
        let (msg, batch) = (stride * chunk as u64, phys.div_ceil(chunk as u64));
        shape = Some((stride, msg, batch, bytes, m_bytes, m_phys));
        let bj = json_run(
            Command::new(bin("bench_engine"))
                .args(["--local", "--backend", "tcp", "--op", "write", "--iters", "100", "--warmup-iters", "10", "--log-level", "warning"])
                .args(["--buffer-size", &msg.to_string(), "--transfer-batch-size", &batch.to_string(), "--num-qp-per-transfer", &lanes_s])
                .arg("--json")
                .arg(&be_json),
            "bench_engine",
            &be_json,
        )?;
        let be = bj["rows"][0]["avg_bw_gbps"].as_f64().ok_or("bench_engine: no avg_bw_gbps row")?;
        println!(
            "round {round}: EP leg alone {a_gbps:.2} GB/s, EP leg beside intra-node copies {m_gbps:.2} GB/s, bench_engine {be:.2} GB/s"
        );
        alone.push(a_gbps);
        mixed.push(m_gbps);
        be_rates.push(be);
    }
    let (stride, msg, batch, bytes, m_bytes, m_phys) = shape.unwrap_or_default();
    let (a, m, be) = (median(alone), median(mixed), median(be_rates));
    println!(
        "compare-ep-tcp: tcp, {lanes} lanes; EP V1 fp8 T=1024 H=7168, rank 0 -> node 1: {bytes} B per dispatch in {batch} writes of {chunk} records x {stride} B = {msg} B (DeepEP routing: {m_bytes} B, {m_phys} tokens); bench_engine {msg} B x batch {batch}"
    );
    println!(
        "medians over {rounds} rounds: EP leg alone {a:.2} GB/s = {:.2} x bench_engine {be:.2} GB/s (target >= 0.9); beside intra-node copies {m:.2} GB/s = {:.2} x",
        a / be,
        m / be
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
