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
//! With `--batch N` every "copy" above is N copies of the message size, laid out as
//! bench_engine lays out a batch of N (slots `stride` apart: a 64-byte gap after each
//! message rounded up to 64 B, or back to back with `--batch-contiguous`), queued on the one
//! stream: the like-for-like baseline of `bench_engine --transfer-batch-size N`. Bandwidth
//! counts N x message bytes per copy.
//!
//! With `--ipc` the destination belongs to a child process (this binary again), which
//! allocates it with `cuMemAlloc` and exports a CUDA/HIP IPC handle; the copies go through the
//! mapping opened from that handle, as the xgmi backend's do between two processes: the
//! like-for-like baseline of `bench_engine --local --backend xgmi --op write`; `--ipc-src`
//! puts the source there instead (the baseline of `--op read`).
//!
//! The destination slots are checked against the source once after each size (exit 1 on a
//! mismatch).

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
    /// Copies per timed unit (bench_engine's --transfer-batch-size), 1..=65536.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    batch: u32,
    /// Slots of a batch back to back, as bench_engine --batch-contiguous.
    #[arg(long)]
    batch_contiguous: bool,
    /// The destination is another process's memory, reached through an IPC handle.
    #[arg(long)]
    ipc: bool,
    /// The source is another process's memory, reached through an IPC handle.
    #[arg(long, conflicts_with = "ipc")]
    ipc_src: bool,
    /// Internal: run as the --ipc/--ipc-src child owning this many bytes on --dst-gpu.
    #[arg(long, hide = true)]
    ipc_child_bytes: Option<u64>,
}

/// One side of the copies: this process's memory, or a child's through IPC (the child keeps
/// it allocated until its stdin closes, when this is dropped).
enum Mem {
    Local(mori_gpu::DeviceBuffer),
    Ipc(mori_gpu::IpcMapping, std::process::Child),
}

impl Mem {
    fn slice(&self) -> mori_gpu::DeviceSlice<'_> {
        match self {
            Mem::Local(b) => b.slice(),
            Mem::Ipc(m, _) => m.slice(),
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        if let Mem::Ipc(_, child) = self {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

/// Starts the --ipc/--ipc-src child for `len` bytes on `dev` and maps its buffer into `via`'s context
/// (the GPU whose stream runs the copies).
fn ipc_memory(rt: &Arc<dyn Runtime>, via: Device, dev: Device, len: usize) -> Result<Mem, String> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().map_err(|e| format!("--ipc: this executable's path: {e}"))?;
    let mut child = Command::new(exe)
        .args(["--dst-gpu", &dev.0.to_string(), "--ipc-child-bytes", &len.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("--ipc: start the child process: {e}"))?;
    // One postcard message in a COBS frame (ends at the first zero byte).
    let mut frame = Vec::new();
    let read = child.stdout.take().map(|o| std::io::BufReader::new(o).read_until(0, &mut frame));
    let bytes = match read {
        Some(Ok(_)) => postcard::from_bytes_cobs::<Vec<u8>>(&mut frame).map_err(|e| format!("--ipc: the child's handle: {e}")),
        Some(Err(e)) => Err(format!("--ipc: read the child's handle: {e}")),
        None => Err("--ipc: the child has no stdout".to_string()),
    };
    let mapped = bytes.and_then(|b| {
        let h = mori_gpu::IpcHandle::from_bytes(&b).map_err(|e| format!("--ipc: the child's handle: {e}"))?;
        rt.ipc_import(via, &h).map_err(|e| format!("--ipc: open the child's IPC handle: {e}"))
    });
    match mapped {
        Ok(m) => Ok(Mem::Ipc(m, child)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// The --ipc/--ipc-src child: allocates, writes the IPC handle (postcard, COBS-framed) to stdout, holds the memory until stdin closes.
fn ipc_child(a: &Args, len: u64) -> Result<(), String> {
    use std::io::{Read, Write};
    let rt = mori_gpu::detect().map_err(|e| e.to_string())?;
    let len = usize::try_from(len).map_err(|_| format!("--ipc-child-bytes {len}: exceeds the address space"))?;
    let buf = rt.alloc(Device(a.dst_gpu.unwrap_or(a.gpu)), len).map_err(|e| format!("--ipc child: allocate {len} bytes: {e}"))?;
    let h = rt.ipc_export(&buf.slice()).map_err(|e| format!("--ipc child: export: {e}"))?;
    let frame = postcard::to_stdvec_cobs(&h.to_bytes()[..]).map_err(|e| format!("--ipc child: encode the handle: {e}"))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&frame).and_then(|()| out.flush()).map_err(|e| format!("--ipc child: write the handle: {e}"))?;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(buf);
    Ok(())
}

use mori_bench::baseline::spin_event as spin;

struct Point {
    msg: u64,
    saw_total: Duration,
    b2b_total: Duration,
}

fn measure(rt: &Arc<dyn Runtime>, a: &Args, src: Device, dst: Device, msg: u64) -> Result<Point, String> {
    let at = |what: &str| format!("{msg} B x {}, GPU {} -> GPU {}: {what}", a.batch, src.0, dst.0);
    let stride = mori_bench::sweep::stride(msg, a.batch_contiguous);
    let span = stride.checked_mul(u64::from(a.batch) - 1).and_then(|x| x.checked_add(msg));
    let len = span.and_then(|x| usize::try_from(x).ok()).ok_or_else(|| at("the batch's span exceeds the address space"))?;
    // The host keeps a source pattern and a read-back copy of the span: refuse before
    // allocating what would not fit (80 % of MemAvailable), rather than abort.
    if let Some(avail) = mori_bench::run::mem_available() {
        if (len as u64).saturating_mul(2) > avail / 10 * 8 {
            return Err(at(&format!(
                "the batch spans {len} bytes, and checking it needs twice that in host memory, but MemAvailable is {avail} bytes; lower --batch or --sweep-max"
            )));
        }
    }
    let s = if a.ipc_src {
        ipc_memory(rt, src, src, len).map_err(|e| format!("{}: {e}", at("source")))?
    } else {
        Mem::Local(rt.alloc(src, len).map_err(|e| format!("{}: {e}", at("allocate the source")))?)
    };
    let d = if a.ipc {
        ipc_memory(rt, src, dst, len).map_err(|e| format!("{}: {e}", at("destination")))?
    } else {
        Mem::Local(rt.alloc(dst, len).map_err(|e| format!("{}: {e}", at("allocate the destination")))?)
    };
    let pattern: Vec<u8> = (0..len).map(|i| (i as u64).wrapping_mul(0x9e37_79b9).wrapping_add(msg) as u8).collect();
    rt.copy_htod(&s.slice(), &pattern).map_err(|e| format!("{}: {e}", at("fill the source")))?;
    rt.memset(&d.slice(), !pattern[0]).map_err(|e| format!("{}: {e}", at("clear the destination")))?;
    let stream = rt.stream(src).map_err(|e| format!("{}: {e}", at("stream")))?;
    let ev = rt.event(src, false).map_err(|e| format!("{}: {e}", at("event")))?;
    let slots: Vec<usize> = (0..u64::from(a.batch)).map(|i| (i * stride) as usize).collect();
    let m = msg as usize;
    let mut views = Vec::with_capacity(slots.len());
    for &o in &slots {
        let dv = d.slice().sub(o, m).map_err(|e| format!("{}: {e}", at("destination slot")))?;
        let sv = s.slice().sub(o, m).map_err(|e| format!("{}: {e}", at("source slot")))?;
        views.push((dv, sv));
    }
    let copy = || -> Result<(), String> {
        for (dv, sv) in &views {
            rt.copy_dtod_async(dv, sv, &stream).map_err(|e| format!("{}: {e}", at("copy")))?;
        }
        Ok(())
    };
    let once = || -> Result<(), String> {
        copy()?;
        ev.record(&stream).map_err(|e| format!("{}: {e}", at("record")))?;
        spin(&ev, || at("stop-and-wait copy"))
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
    spin(&ev, || at("warm-up"))?;
    let t0 = Instant::now();
    for _ in 0..a.iters {
        copy()?;
    }
    ev.record(&stream).map_err(|e| format!("{}: {e}", at("record")))?;
    spin(&ev, || at("back-to-back copies"))?;
    let b2b_total = t0.elapsed();
    let mut got = vec![0u8; len];
    rt.copy_dtoh(&mut got, &d.slice()).map_err(|e| format!("{}: {e}", at("read back")))?;
    for &o in &slots {
        if let Some(i) = got[o..o + m].iter().zip(&pattern[o..o + m]).position(|(x, y)| x != y) {
            return Err(format!("{}: byte {} differs after the copies", at("check"), o + i));
        }
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
    eprintln!(
        "bench_copy: {} ({}), GPU {} -> GPU {}{}, iters {} + warmup {}, batch {}{}",
        props.name,
        rt.library(),
        src.0,
        dst.0,
        if a.ipc {
            " (another process's memory, through IPC)"
        } else if a.ipc_src {
            " (from another process's memory, through IPC)"
        } else {
            ""
        },
        a.iters,
        a.warmup_iters,
        a.batch,
        if a.batch_contiguous { " (contiguous)" } else { "" }
    );
    println!("{:>12} {:>7} {:>14} {:>14} {:>14}", "MsgSize(B)", "Iters", "SawLat(us)", "SawBW(GB/s)", "B2bBW(GB/s)");
    let mut msg = a.sweep_start;
    while msg <= a.sweep_max {
        let p = measure(&rt, a, src, dst, msg)?;
        let it = f64::from(a.iters);
        let gbps = |t: Duration| (p.msg as f64 * f64::from(a.batch) * it) / 1e9 / t.as_secs_f64();
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
    let r = match a.ipc_child_bytes {
        Some(len) => ipc_child(&a, len),
        None => run(&a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
