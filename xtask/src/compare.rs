//! `cargo xtask compare-tcp [--secs N] [--lanes N]`: bench_engine's tcp backend against the
//! loopback peers of DESIGN.md ("Measuring"), measured in the same run, with the ratios.
//!
//! - iperf3, one stream over lo, `-t N`: the TCP limit of this machine.
//! - bench_engine --local --op write, 4 MiB × batch 16 (target: ≥ 0.9 × iperf3).
//! - ucx_perftest -t ucp_put_bw -s 1048576 with UCX_TLS=tcp UCX_NET_DEVICES=lo (Debian's
//!   ucx-utils; UCX prints MB/s with MB = 2^20, converted here to GB = 1e9).
//! - bench_engine --local --op write, 1 MiB × batch 16 (target: ≥ 5 × ucx_perftest).

use crate::util::workspace_root;
use std::process::{Command, Stdio};
use std::time::Duration;

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("free port: {e}"))
}

fn output(cmd: &mut Command, what: &str) -> Result<String, String> {
    let o = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !o.status.success() {
        return Err(format!("{what} failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr)));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// iperf3 one stream on loopback; GB/s received.
fn iperf3(secs: u32) -> Result<f64, String> {
    let port = free_port()?.to_string();
    let mut srv = Command::new("iperf3")
        .args(["-s", "-1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3 -s: {e}"))?;
    std::thread::sleep(Duration::from_millis(300));
    let out = output(Command::new("iperf3").args(["-c", "127.0.0.1", "-p", &port, "-t", &secs.to_string(), "-J"]), "iperf3 -c");
    let _ = srv.kill();
    let _ = srv.wait();
    let v: serde_json::Value = serde_json::from_str(&out?).map_err(|e| format!("iperf3 json: {e}"))?;
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64().ok_or("iperf3 json: no end.sum_received.bits_per_second")?;
    Ok(bps / 8.0 / 1e9)
}

/// ucx_perftest ucp_put_bw with 1 MiB messages over tcp on lo; GB/s (1e9).
fn ucx(iters: u32) -> Result<f64, String> {
    let port = free_port()?.to_string();
    let env = [("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")];
    let n = iters.to_string();
    let base = ["-t", "ucp_put_bw", "-s", "1048576", "-n", n.as_str(), "-p", port.as_str()];
    let mut srv = Command::new("ucx_perftest")
        .args(base)
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("ucx_perftest server: {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let out = output(Command::new("ucx_perftest").arg("127.0.0.1").args(base).envs(env), "ucx_perftest client");
    let _ = srv.kill();
    let _ = srv.wait();
    let out = out?;
    let line =
        out.lines().find(|l| l.trim_start().starts_with("Final:")).ok_or_else(|| format!("ucx_perftest printed no Final line:\n{out}"))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    // Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall
    let mbps: f64 = f.get(6).and_then(|s| s.parse().ok()).ok_or_else(|| format!("ucx_perftest Final line: {line}"))?;
    Ok(mbps * 1048576.0 / 1e9)
}

/// bench_engine --local, one point; GB/s.
fn bench(msg: u64, batch: u64, iters: u64, lanes: u32) -> Result<f64, String> {
    let exe = workspace_root().join("target/release/bench_engine");
    let json = std::env::temp_dir().join(format!("mori-compare-{}-{msg}.json", std::process::id()));
    let (m, b, i, l) = (msg.to_string(), batch.to_string(), iters.to_string(), lanes.to_string());
    output(
        Command::new(&exe)
            .args([
                "--local",
                "--op",
                "write",
                "--enable-sess",
                "--buffer-size",
                &m,
                "--transfer-batch-size",
                &b,
                "--iters",
                &i,
                "--warmup-iters",
                "5",
                "--num-qp-per-transfer",
                &l,
                "--log-level",
                "warning",
                "--json",
            ])
            .arg(&json),
        "bench_engine",
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&json);
    if v["validation"] != "OK" {
        return Err(format!("bench_engine validation: {}", v["validation"]));
    }
    v["rows"][0]["avg_bw_gbps"].as_f64().ok_or_else(|| "bench_engine json: no rows[0].avg_bw_gbps".into())
}

pub fn run(args: &[String]) -> Result<(), String> {
    let mut secs = 5u32;
    let mut lanes = 1u32;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--secs" => secs = it.next().and_then(|s| s.parse().ok()).ok_or("--secs N")?,
            "--lanes" => lanes = it.next().and_then(|s| s.parse().ok()).ok_or("--lanes N")?,
            other => return Err(format!("compare-tcp: unknown argument {other}")),
        }
    }
    crate::prereq::ensure_group(crate::prereq::Group::Compare)?;
    crate::util::cargo(&["build", "--release", "-p", "mori-bench", "--bin", "bench_engine"])?;
    // Iterations sized for about `secs` seconds at ~2 GB/s.
    let iters_4m = ((secs as u64) * 2_000_000_000 / (4 << 20) / 16).max(10);
    let iters_1m = ((secs as u64) * 2_000_000_000 / (1 << 20) / 16).max(10);
    let ip = iperf3(secs)?;
    let b4 = bench(4 << 20, 16, iters_4m, lanes)?;
    let ux = ucx(2000)?;
    let b1 = bench(1 << 20, 16, iters_1m, lanes)?;
    println!("{:<44} {:>10}", "what (loopback, same run)", "GB/s");
    println!("{:<44} {:>10.3}", format!("iperf3, 1 stream, {secs} s"), ip);
    println!(
        "{:<44} {:>10.3}   ratio to iperf3 {:.3} (target >= 0.9)",
        format!("bench_engine tcp write 4 MiB x 16, {lanes} conn"),
        b4,
        b4 / ip
    );
    println!("{:<44} {:>10.3}", "ucx_perftest ucp_put_bw 1 MiB, UCX_TLS=tcp", ux);
    println!(
        "{:<44} {:>10.3}   ratio to ucx_perftest {:.2} (target >= 5)",
        format!("bench_engine tcp write 1 MiB x 16, {lanes} conn"),
        b1,
        b1 / ux
    );
    Ok(())
}
