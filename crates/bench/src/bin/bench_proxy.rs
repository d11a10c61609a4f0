//! bench_proxy: GPU warps driving MORI-IO through the proxy's command ring, against the same
//! transport driven by a host thread, in the same run.
//!
//! Two engines in this process stand in for two nodes (`src` and `dst`); the inter-node leg is
//! `--transport xgmi` (both windows in GPU memory, copies through the xgmi backend) or `tcp`
//! (both windows in pinned host memory mapped into the GPU: the kernel stages into host memory,
//! MORI-IO's tcp lanes move it: "tcp with host staging"). The destination's counters are
//! pinned host memory mapped into the GPU (a signal is applied by the destination engine on
//! the CPU). A [`RingProxy`] thread consumes the ring.
//!
//! - **Round trip**, per message size: `mori_ep_ring_roundtrip` pushes one command (the bytes,
//!   then Add 1 on the counter) and spins on the counter through its device mapping, `--iters`
//!   times, timed on the GPU clock; the baseline is a host thread posting the same signalled
//!   write on the same engines (`IoEngine::post_signalled`) and spinning on the same counter:
//!   the transport's own put-with-signal round trip. Medians, and their ratio.
//! - **Flood**: `--blocks` x `--warps` warps each stage `--per-warp` chunks of `--flood-bytes`
//!   into the source window and push one command per chunk; bytes per second from the launch to
//!   the last counter; the baseline posts the same chunks as one signalled batch from the host.
//!   Every destination byte is checked (`check: OK`, exit 1 otherwise).

use clap::{Parser, ValueEnum};
use mori_ep::gpu_ring::{flood_word, DeviceRing, FloodSpec, RingKernelFault, RingKernels, RoundtripSpec, Window};
use mori_ep::proxy::{PeerWindow, RingProxy, RingProxyOptions};
use mori_gpu::{Device, PinnedBuffer, Runtime};
use mori_io::{BackendConfig, EngineConfig, IoEngine, MemLoc, MemoryDesc, RegionBatch, Signal, TcpConfig, XgmiConfig};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Transport {
    Xgmi,
    Tcp,
}

/// GPU warps -> command ring -> proxy -> MORI-IO signalled writes, against the host posting the same writes.
#[derive(Debug, Parser)]
#[command(name = "bench_proxy", version, about, long_about = None)]
struct Args {
    /// Inter-node leg: xgmi (GPU windows) or tcp (pinned host windows, staged by the kernel).
    #[arg(long, value_enum, default_value = "xgmi")]
    transport: Transport,
    /// GPU.
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// tcp lanes per peer.
    #[arg(long, default_value_t = 4)]
    lanes: usize,
    /// Message sizes of the round trips, bytes (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "8,4096,65536,1048576,16777216")]
    sizes: Vec<u64>,
    /// Timed round trips per size and path.
    #[arg(long, default_value_t = 200)]
    iters: u32,
    /// Untimed round trips before each timed run.
    #[arg(long, default_value_t = 20)]
    warmup_iters: u32,
    /// Ring slots (a power of two).
    #[arg(long, default_value_t = 1024)]
    slots: usize,
    /// Flood: blocks.
    #[arg(long, default_value_t = 8)]
    blocks: u32,
    /// Flood: warps per block.
    #[arg(long, default_value_t = 4)]
    warps: u32,
    /// Flood: chunks per warp.
    #[arg(long, default_value_t = 64)]
    per_warp: u32,
    /// Flood: bytes per chunk (a multiple of 4; 0 skips the flood).
    #[arg(long, default_value_t = 65536)]
    flood_bytes: u64,
    /// Deadline of every wait, ms.
    #[arg(long, default_value_t = 20_000)]
    timeout_ms: u64,
}

type R<T> = Result<T, String>;

fn e<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |x| format!("{what}: {x}")
}

fn engine(key: &str, a: &Args) -> R<Arc<IoEngine>> {
    let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).map_err(e("engine config"))?).map_err(e("engine"))?;
    let cfg = match a.transport {
        Transport::Xgmi => BackendConfig::Xgmi(XgmiConfig::default()),
        Transport::Tcp => {
            let mut t = TcpConfig::from_env().map_err(e("tcp settings"))?;
            t.lanes = a.lanes;
            BackendConfig::Tcp(t)
        }
    };
    eng.create_backend(cfg).map_err(e("backend"))?;
    Ok(Arc::new(eng))
}

fn median_us(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

struct Setup {
    rt: Arc<dyn Runtime>,
    dev: Device,
    src_eng: Arc<IoEngine>,
    src: Window,
    dst: Window,
    ctr: PinnedBuffer,
    src_m: MemoryDesc,
    dst_m: MemoryDesc,
    ctr_m: MemoryDesc,
    engines: Vec<(Arc<IoEngine>, MemoryDesc)>,
}

impl Setup {
    fn counter(&self, i: usize) -> &AtomicU64 {
        // SAFETY: the counter block is 8-aligned pinned memory of at least 4096 bytes owned by
        // self; the destination engine writes it only atomically.
        unsafe { AtomicU64::from_ptr((self.ctr.ptr() as usize as *mut u64).add(i)) }
    }
}

fn setup(a: &Args, window: usize) -> R<Setup> {
    let rt = mori_gpu::detect().map_err(e("GPU runtime"))?;
    let dev = Device(a.gpu);
    rt.bind(dev).map_err(e("binding the GPU"))?;
    let (src_eng, dst_eng) = (engine("proxy-src", a)?, engine("proxy-dst", a)?);
    src_eng.register_remote_engine(dst_eng.desc().clone()).map_err(e("peer engine"))?;
    dst_eng.register_remote_engine(src_eng.desc().clone()).map_err(e("peer engine"))?;
    let on_gpu = a.transport == Transport::Xgmi;
    let src = Window::new(rt.as_ref(), dev, on_gpu, window).map_err(e("source window"))?;
    let dst = Window::new(rt.as_ref(), dev, on_gpu, window).map_err(e("destination window"))?;
    let ctr = rt.alloc_mapped(dev, 4096).map_err(e("counter block"))?;
    // SAFETY: the three regions stay allocated (owned by Setup) until deregistered in `finish`.
    let (src_m, dst_m, ctr_m) = unsafe {
        (
            src_eng
                .register_memory(src.host_ptr() as usize as *mut u8, src.len(), src.loc(dev))
                .map_err(e("registering the source window"))?,
            dst_eng
                .register_memory(dst.host_ptr() as usize as *mut u8, dst.len(), dst.loc(dev))
                .map_err(e("registering the destination window"))?,
            dst_eng
                .register_memory(ctr.ptr() as usize as *mut u8, ctr.len(), MemLoc::Host { numa: None })
                .map_err(e("registering the counters"))?,
        )
    };
    let engines = vec![(src_eng.clone(), src_m.clone()), (dst_eng.clone(), dst_m.clone()), (dst_eng, ctr_m.clone())];
    Ok(Setup { rt, dev, src_eng, src, dst, ctr, src_m, dst_m, ctr_m, engines })
}

fn finish(s: Setup) {
    for (eng, m) in &s.engines {
        let _ = eng.deregister_memory(m);
    }
}

/// The GPU path's round trips for one size: ns per round trip.
#[allow(clippy::too_many_arguments)]
fn gpu_roundtrips(
    s: &Setup,
    k: &RingKernels,
    ring: &DeviceRing,
    a: &Args,
    size: u64,
    iters: u32,
    counter: usize,
    proxy: &RingProxy,
) -> R<Vec<f64>> {
    let stream = s.rt.stream(s.dev).map_err(e("stream"))?;
    let times = s.rt.alloc(s.dev, iters.max(1) as usize * 8).map_err(e("times buffer"))?;
    let status = s.rt.alloc(s.dev, 16).map_err(e("status buffer"))?;
    s.rt.memset(&status.slice(), 0).map_err(e("status"))?;
    let spec = RoundtripSpec {
        dst: 0,
        local_off: 0,
        remote_off: 0,
        len: size,
        counter_off: counter as u64 * 8,
        counter_ptr: s.ctr.device_ptr().ok_or("the counter block is not device-mapped")? + counter as u64 * 8,
        base: s.counter(counter).load(Ordering::Acquire),
        iters,
        timeout: Duration::from_millis(a.timeout_ms),
    };
    k.roundtrip(&stream, ring, &spec, &times.slice(), &status.slice()).map_err(e("launching mori_ep_ring_roundtrip"))?;
    stream.synchronize().map_err(e("round-trip kernel"))?;
    let mut st = [0u8; 16];
    s.rt.copy_dtoh(&mut st, &status.slice()).map_err(e("status"))?;
    let w = |i: usize| u32::from_le_bytes([st[4 * i], st[4 * i + 1], st[4 * i + 2], st[4 * i + 3]]);
    if let Some(f) = RingKernelFault::from_status([w(0), w(1), w(2), w(3)]) {
        return Err(format!("round trip of {size} B: kernel fault {f:?} (proxy: {:?}, failure {:?})", proxy.stats(), proxy.failure()));
    }
    let mut raw = vec![0u8; iters as usize * 8];
    s.rt.copy_dtoh(&mut raw, &times.slice()).map_err(e("times"))?;
    Ok(raw.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64).collect())
}

/// The host path: post the same signalled write, spin on the same counter: ns per round trip.
fn host_roundtrips(s: &Setup, a: &Args, size: u64, iters: u32, counter: usize) -> R<Vec<f64>> {
    let sig = [Signal { remote: s.ctr_m.clone(), offset: counter as u64 * 8, op: mori_io::SignalOp::Add(1) }];
    let mut out = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let base = s.counter(counter).load(Ordering::Acquire);
        let t0 = Instant::now();
        let b = RegionBatch {
            local: &s.src_m,
            local_offs: &[0],
            remote: &s.dst_m,
            remote_offs: &[0],
            sizes: &[size],
            id: s.src_eng.allocate_transfer_uid(),
        };
        let st = s.src_eng.post_signalled(&b, &sig);
        let deadline = t0 + Duration::from_millis(a.timeout_ms);
        while s.counter(counter).load(Ordering::Acquire) < base + 1 {
            if Instant::now() > deadline {
                return Err(format!("host round trip of {size} B: the counter did not move within {} ms ({:?})", a.timeout_ms, st.poll()));
            }
            std::hint::spin_loop();
        }
        out.push(t0.elapsed().as_nanos() as f64);
        st.wait_for(Duration::from_millis(a.timeout_ms)).map_err(e("host signalled write"))?;
    }
    Ok(out)
}

fn check_flood(s: &Setup, spec: &FloodSpec) -> R<()> {
    let words = (spec.len / 4) as usize;
    let mut buf = vec![0u8; spec.len as usize];
    for c in 0..spec.chunks() {
        s.dst.read(s.rt.as_ref(), (c * spec.chunk) as usize, &mut buf).map_err(e("reading the destination window"))?;
        for (w, b) in buf.chunks(4).enumerate().take(words) {
            let got = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if got != flood_word(c as u32, w as u32) {
                return Err(format!("flood: chunk {c} word {w} is {got:#x}, the kernel wrote {:#x}", flood_word(c as u32, w as u32)));
            }
        }
    }
    Ok(())
}

fn wait_counters(s: &Setup, first: usize, n: usize, want: &[u64], deadline: Instant, proxy: Option<&RingProxy>) -> R<()> {
    loop {
        let got: Vec<u64> = (0..n).map(|i| s.counter(first + i).load(Ordering::Acquire)).collect();
        if got.iter().zip(want).all(|(g, w)| g >= w) {
            return Ok(());
        }
        if let Some(f) = proxy.and_then(|p| p.failure()) {
            return Err(format!("proxy: {f}"));
        }
        if Instant::now() > deadline {
            return Err(format!("flood: counters {got:?}, expected {want:?} (proxy {:?})", proxy.map(|p| p.stats())));
        }
        std::hint::spin_loop();
    }
}

fn run(a: &Args) -> R<()> {
    if !a.flood_bytes.is_multiple_of(4) {
        return Err(format!("--flood-bytes {} must be a multiple of 4", a.flood_bytes));
    }
    let max_size = a.sizes.iter().copied().max().unwrap_or(8).max(8);
    let flood = FloodSpec {
        dst: 0,
        src_ptr: 0,
        chunk: a.flood_bytes.next_multiple_of(64).max(64),
        len: a.flood_bytes,
        per_warp: a.per_warp,
        counters: 64,
        counter_base: 64 * 8,
        blocks: a.blocks,
        warps: a.warps,
        timeout: Duration::from_millis(a.timeout_ms),
    };
    let window = (max_size as usize).max(if a.flood_bytes > 0 { (flood.chunks() * flood.chunk) as usize } else { 0 });
    let s = setup(a, window)?;
    let k = RingKernels::load(s.rt.as_ref(), s.dev).map_err(e("loading kernels/ep_proxy"))?;
    let ring = DeviceRing::new(s.rt.as_ref(), s.dev, a.slots).map_err(e("command ring"))?;
    let peers = vec![Some(PeerWindow { data: s.dst_m.clone(), counters: s.ctr_m.clone() })];
    let proxy = RingProxy::start("bench", s.src_eng.clone(), s.src_m.clone(), peers, ring.mem(), RingProxyOptions::default())
        .map_err(e("proxy thread"))?;
    let path = match a.transport {
        Transport::Xgmi => "xgmi (GPU windows, copies by the xgmi backend)".to_string(),
        Transport::Tcp => format!("tcp, {} lanes (pinned host windows mapped into the GPU: the kernel stages into host memory)", a.lanes),
    };
    println!(
        "bench_proxy: GPU {} via {}; inter-node leg {path}; counters in mapped pinned host memory; ring {} slots; {} + {} iterations per size",
        a.gpu,
        s.rt.kind(),
        a.slots,
        a.warmup_iters,
        a.iters
    );
    println!("{:>10} {:>16} {:>16} {:>9}", "MsgSize(B)", "GPU ring RTT(us)", "host RTT(us)", "GPU/host");
    for (i, &size) in a.sizes.iter().enumerate() {
        let ctr = 1 + i;
        // The host path first: the transport's first transfer of a size may allocate (pinned
        // staging, events), and a CUDA allocation can wait for the device to go idle, which a
        // kernel spinning on that very transfer never does.
        host_roundtrips(&s, a, size, a.warmup_iters, ctr)?;
        let mut h = host_roundtrips(&s, a, size, a.iters, ctr)?;
        gpu_roundtrips(&s, &k, &ring, a, size, a.warmup_iters, ctr, &proxy)?;
        let mut g = gpu_roundtrips(&s, &k, &ring, a, size, a.iters, ctr, &proxy)?;
        let (gm, hm) = (median_us(&mut g) / 1e3, median_us(&mut h) / 1e3);
        println!("{size:>10} {gm:>16.2} {hm:>16.2} {:>9.2}", gm / hm);
    }
    if a.flood_bytes > 0 {
        // Counters 64..128 of the counter block.
        let first = 64;
        let spec = FloodSpec { src_ptr: s.src.dev_ptr(), ..flood };
        let (chunks, nc) = (spec.chunks(), spec.counters as u64);
        let inc: Vec<u64> = (0..nc).map(|c| chunks / nc + u64::from(c < chunks % nc)).collect();
        let target = |s: &Setup| -> Vec<u64> { (0..nc as usize).map(|c| s.counter(first + c).load(Ordering::Acquire) + inc[c]).collect() };
        let bytes = chunks * spec.len;
        // Host baseline first (it also warms the transport's path for batches this large:
        // see the round trips): the same chunks and signals as one signalled batch.
        let offs: Vec<u64> = (0..chunks).map(|c| c * spec.chunk).collect();
        let sizes = vec![spec.len; chunks as usize];
        let sigs: Vec<Signal> = (0..chunks)
            .map(|c| Signal { remote: s.ctr_m.clone(), offset: (first as u64 + c % nc) * 8, op: mori_io::SignalOp::Add(1) })
            .collect();
        let want = target(&s);
        let t1 = Instant::now();
        let b = RegionBatch {
            local: &s.src_m,
            local_offs: &offs,
            remote: &s.dst_m,
            remote_offs: &offs,
            sizes: &sizes,
            id: s.src_eng.allocate_transfer_uid(),
        };
        let st = s.src_eng.post_signalled(&b, &sigs);
        wait_counters(&s, first, nc as usize, &want, t1 + Duration::from_millis(a.timeout_ms), None)?;
        let host_s = t1.elapsed().as_secs_f64();
        st.wait_for(Duration::from_millis(a.timeout_ms)).map_err(e("host batch"))?;
        let stream = s.rt.stream(s.dev).map_err(e("stream"))?;
        let status = s.rt.alloc(s.dev, 16).map_err(e("status"))?;
        s.rt.memset(&status.slice(), 0).map_err(e("status"))?;
        let want = target(&s);
        let t0 = Instant::now();
        k.flood(&stream, &ring, &spec, &status.slice()).map_err(e("launching mori_ep_ring_flood"))?;
        wait_counters(&s, first, nc as usize, &want, t0 + Duration::from_millis(a.timeout_ms), Some(&proxy))?;
        let gpu_s = t0.elapsed().as_secs_f64();
        stream.synchronize().map_err(e("flood kernel"))?;
        let mut st = [0u8; 16];
        s.rt.copy_dtoh(&mut st, &status.slice()).map_err(e("status"))?;
        if st.iter().any(|&b| b != 0) {
            return Err(format!("flood: kernel status words {st:?}"));
        }
        check_flood(&s, &spec)?;
        println!(
            "flood: {} warps x {} chunks of {} B = {} commands, {:.3} GB: GPU ring {:.2} GB/s ({:.1} us), host batch {:.2} GB/s ({:.1} us), rate GPU/host {:.2}",
            spec.blocks * spec.warps,
            spec.per_warp,
            spec.len,
            chunks,
            bytes as f64 / 1e9,
            bytes as f64 / gpu_s / 1e9,
            gpu_s * 1e6,
            bytes as f64 / host_s / 1e9,
            host_s * 1e6,
            host_s / gpu_s
        );
    }
    let stats = proxy.stop().map_err(e("proxy"))?;
    println!("proxy: {} commands in {} batched signalled writes, {} bytes", stats.commands, stats.batches, stats.bytes);
    let pool = mori_gpu::submit_stats();
    println!(
        "copy pools (whole run): {} submissions, {} ordered batches in one launch of the ordered-copy kernel, {} fired armed launches (MORI_GPU_POOL_ARMED)",
        pool.submissions, pool.ordered_launches, pool.armed_fires
    );
    println!("check: OK");
    finish(s);
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(m) => {
            eprintln!("error: {m}");
            ExitCode::from(1)
        }
    }
}
