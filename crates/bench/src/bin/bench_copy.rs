//! bench_copy: the bare-copy baseline that bench_engine's GPU backends are judged against, in
//! the same run and with the same timing rules (one whole-loop timer, warm-up excluded,
//! GB = 1e9, spin-polling).
//!
//! For every message size it times, on one stream of `--gpu`, copying to `--dst-gpu`:
//! - stop-and-wait: one `cuMemcpyDtoDAsync` (or HIP's) + event record, then spin on the
//!   event until it fired, `--iters` times: latency per copy and bandwidth — the floor of a
//!   batch-1 transfer;
//! - back-to-back: `--iters` copies queued, then one event waited for: bandwidth — the
//!   roofline of a pipelined copy.
//!
//! The destination is checked against the source once after each size (exit 1 on a mismatch).

use clap::Parser;
use mori_gpu::{Device, Runtime};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bare device-to-device copy latency and bandwidth (the baseline of bench_engine --backend xgmi).
#[derive(Debug, Parser)]
#[command(name = "bench_copy", version, about, long_about = None)]
struct Args {
    /// Source GPU (the copies run on a stream of it).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Destination GPU [default: --gpu]; another GPU gets peer access enabled first.
    #[arg(long)]
    dst_gpu: Option<u32>,
    /// First message size, bytes.
    #[arg(long, default_value_t = 8)]
    sweep_start: u64,
    /// Last message size, bytes (sizes double from --sweep-start).
    #[arg(long, default_value_t = 64 << 20)]
    sweep_max: u64,
    /// Timed copies per size and mode.
    #[arg(long, default_value_t = 200)]
    iters: u32,
    /// Untimed copies before each timed loop.
    #[arg(long, default_value_t = 20)]
    warmup_iters: u32,
}

/// Longest a single event wait may spin before the run stops with an error.
const EVENT_DEADLINE: Duration = Duration::from_secs(30);

fn spin(ev: &mori_gpu::Event, what: &str) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        match ev.query() {
            Ok(true) => return Ok(()),
            Ok(false) if t0.elapsed() < EVENT_DEADLINE => std::hint::spin_loop(),
            Ok(false) => return Err(format!("{what}: the event did not fire within {EVENT_DEADLINE:?}")),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

struct Point {
    msg: u64,
    saw_total: Duration,
    b2b_total: Duration,
}

fn measure(rt: &Arc<dyn Runtime>, a: &Args, src: Device, dst: Device, msg: u64) -> Result<Point, String> {
    let len = usize::try_from(msg).map_err(|_| format!("size {msg} exceeds the address space"))?;
    let at = |what: &str| format!("{msg} B, GPU {} -> GPU {}: {what}", src.0, dst.0);
    let s = rt.alloc(src, len).map_err(|e| format!("{}: {e}", at("allocate the source")))?;
    let d = rt.alloc(dst, len).map_err(|e| format!("{}: {e}", at("allocate the destination")))?;
    let pattern: Vec<u8> = (0..len).map(|i| (i as u64).wrapping_mul(0x9e37_79b9).wrapping_add(msg) as u8).collect();
    rt.copy_htod(&s.slice(), &pattern).map_err(|e| format!("{}: {e}", at("fill the source")))?;
    rt.memset(&d.slice(), !pattern[0]).map_err(|e| format!("{}: {e}", at("clear the destination")))?;
    let stream = rt.stream(src).map_err(|e| format!("{}: {e}", at("stream")))?;
    let ev = rt.event(src, false).map_err(|e| format!("{}: {e}", at("event")))?;
    let copy = || rt.copy_dtod_async(&d.slice(), &s.slice(), &stream).map_err(|e| format!("{}: {e}", at("copy")));
    let once = || -> Result<(), String> {
        copy()?;
        ev.record(&stream).map_err(|e| format!("{}: {e}", at("record")))?;
        spin(&ev, &at("stop-and-wait copy"))
    };
    for _ in 0..a.warmup_iters {
        once()?;
    }
    let t0 = Instant::now();
    for _ in 0..a.iters {
        once()?;
    }
    let saw_total = t0.elapsed();
    for _ in 0..a.warmup_iters {
        copy()?;
    }
    ev.record(&stream).map_err(|e| format!("{}: {e}", at("record")))?;
    spin(&ev, &at("warm-up"))?;
    let t0 = Instant::now();
    for _ in 0..a.iters {
        copy()?;
    }
    ev.record(&stream).map_err(|e| format!("{}: {e}", at("record")))?;
    spin(&ev, &at("back-to-back copies"))?;
    let b2b_total = t0.elapsed();
    let mut got = vec![0u8; len];
    rt.copy_dtoh(&mut got, &d.slice()).map_err(|e| format!("{}: {e}", at("read back")))?;
    if let Some(i) = got.iter().zip(&pattern).position(|(x, y)| x != y) {
        return Err(format!("{}: byte {i} differs after the copies", at("check")));
    }
    Ok(Point { msg, saw_total, b2b_total })
}

fn run(a: &Args) -> Result<(), String> {
    if a.sweep_start == 0 || a.sweep_start > a.sweep_max {
        return Err(format!("--sweep-start {} / --sweep-max {}: need 1 <= start <= max", a.sweep_start, a.sweep_max));
    }
    if a.iters == 0 {
        return Err("--iters 0: at least one timed copy is needed".into());
    }
    let rt = mori_gpu::detect().map_err(|e| e.to_string())?;
    let n = rt.device_count().map_err(|e| e.to_string())?;
    let (src, dst) = (a.gpu, a.dst_gpu.unwrap_or(a.gpu));
    for (flag, g) in [("--gpu", src), ("--dst-gpu", dst)] {
        if g >= n {
            return Err(format!("{flag} {g}: this machine has {n} GPU(s) (0..={})", n.saturating_sub(1)));
        }
    }
    let (src, dst) = (Device(src), Device(dst));
    if src != dst {
        if !rt.can_access_peer(src, dst).map_err(|e| e.to_string())? {
            return Err(format!("GPU {} cannot reach GPU {} peer-to-peer", src.0, dst.0));
        }
        rt.enable_peer_access(src, dst).map_err(|e| e.to_string())?;
    }
    let props = rt.device_properties(src).map_err(|e| e.to_string())?;
    eprintln!("bench_copy: {} ({}), GPU {} -> GPU {}, iters {} + warmup {}", props.name, rt.library(), src.0, dst.0, a.iters, a.warmup_iters);
    println!("{:>12} {:>7} {:>14} {:>14} {:>14}", "MsgSize(B)", "Iters", "SawLat(us)", "SawBW(GB/s)", "B2bBW(GB/s)");
    let mut msg = a.sweep_start;
    while msg <= a.sweep_max {
        let p = measure(&rt, a, src, dst, msg)?;
        let it = f64::from(a.iters);
        let gbps = |t: Duration| (p.msg as f64 * it) / 1e9 / t.as_secs_f64();
        println!(
            "{:>12} {:>7} {:>14.2} {:>14.3} {:>14.3}",
            p.msg,
            a.iters,
            p.saw_total.as_secs_f64() * 1e6 / it,
            gbps(p.saw_total),
            gbps(p.b2b_total)
        );
        match msg.checked_mul(2) {
            Some(m) => msg = m,
            None => break,
        }
    }
    println!("validation: OK");
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
