//! A prefill engine pushes one request's paged KV cache to a decode engine, shaped as
//! Llama-3.1-8B: 32 layers, 8 KV heads, head dim 128, bf16, 16-token blocks, K and V apart.
//!
//! ```text
//! cargo run --release --example kv_cache_transfer [-- --tokens 4096 --pool-blocks N --lanes 4 --reps 5 --seed 1]
//! cargo run --release --example kv_cache_transfer --features xgmi [-- --backend auto|tcp|xgmi --gpu 0]
//! cargo run --release --example kv_cache_transfer --features fabric -- --backend fabric
//! ```
//!
//! - Both engines live in this one process (two `IoEngine`s on 127.0.0.1). `--backend tcp`:
//!   host memory, the tcp backend with `--lanes` lanes (the bytes still cross real loopback
//!   sockets). `--backend xgmi` / `fabric` (built with that feature): both pools in the memory
//!   of GPU `--gpu` (plain allocations for xgmi, POSIX-FD exportable VMM memory for fabric).
//!   `--backend auto`, the default: xgmi when built with the `xgmi` feature and that GPU
//!   exists, else tcp (the line `backend: ...` says which and why).
//! - Each side owns one buffer: the pool laid out `[layer][k/v][pool block][16 tok][8 heads]
//!   [128]` bf16 (one block is 32 KiB; `--pool-blocks` blocks per (layer, k/v), by default
//!   1.5x the request's `ceil(tokens / 16)` blocks), then an area the size of the request.
//! - The request's blocks sit at a random (seeded) subset of the prefill pool and go to a
//!   different random subset of the decode pool, as a block table shared by all layers.
//! - One paged batch (`Session::batch_write_paged`: the two block tables and the pool layout)
//!   carries every (layer, k/v, block); after it, every byte of the decode pool is checked
//!   (request blocks equal their source, the rest untouched) and the decode engine must report
//!   the inbound transfer. Then `--reps` more paged transfers are timed (warm-up excluded),
//!   each followed by one contiguous write of the same bytes (the request's blocks in order,
//!   from the prefill buffer's area after the pool to the decode buffer's), and the paged
//!   bandwidth is printed as a ratio of the contiguous one. Every byte is checked again at the
//!   end (the contiguous area too). Any mismatch or error exits non-zero.

use mori::io::{BackendConfig, EngineConfig, IoEngine, MemLoc, MemoryDesc, PagedBatch, PagedLayout, TcpConfig};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const LAYERS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const BLOCK_TOKENS: usize = 16;
/// bf16 elements (stored as `u16`) in one block of one layer's K or V.
const BLOCK_ELEMS: usize = BLOCK_TOKENS * KV_HEADS * HEAD_DIM;
const BLOCK_BYTES: u64 = (BLOCK_ELEMS * 2) as u64;
const WAIT: Duration = Duration::from_secs(120);

/// Where the pools live and which backend moves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tcp,
    Xgmi,
    Fabric,
}

/// Command-line settings.
struct Args {
    tokens: usize,
    pool_blocks: Option<usize>,
    lanes: usize,
    reps: usize,
    seed: u64,
    backend: String,
    gpu: u32,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { tokens: 4096, pool_blocks: None, lanes: 4, reps: 5, seed: 1, backend: "auto".into(), gpu: 0 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut text = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        if flag == "--backend" {
            a.backend = text()?;
            continue;
        }
        let v = text()?;
        let val = v.parse::<u64>().map_err(|_| format!("{flag}: {v:?} is not a non-negative integer"));
        match flag.as_str() {
            "--tokens" => a.tokens = val? as usize,
            "--pool-blocks" => a.pool_blocks = Some(val? as usize),
            "--lanes" => a.lanes = val? as usize,
            "--reps" => a.reps = val? as usize,
            "--seed" => a.seed = val?,
            "--gpu" => a.gpu = u32::try_from(val?).map_err(|_| format!("--gpu {v}: too large"))?,
            _ => return Err(format!("unknown argument {flag:?} (flags: --tokens --pool-blocks --lanes --reps --seed --backend --gpu)")),
        }
    }
    Ok(a)
}

/// GPUs the runtime sees (built with a GPU backend feature).
#[cfg(feature = "gpu")]
fn gpu_count() -> Result<u32, String> {
    mori::gpu::detect().and_then(|rt| rt.device_count()).map_err(|e| e.to_string())
}

#[cfg(not(feature = "gpu"))]
fn gpu_count() -> Result<u32, String> {
    Err("built without a GPU backend feature".into())
}

/// The backend `--backend` names, and why (for `auto`). Errors: an unknown name, or a GPU
/// backend this build lacks (named with the feature to add).
fn pick(a: &Args) -> Result<(Kind, String), String> {
    let need = |on: bool, f: &str| {
        if on {
            Ok(())
        } else {
            Err(format!("--backend {f}: this build lacks the {f} feature (cargo run --release --example kv_cache_transfer --features {f})"))
        }
    };
    match a.backend.as_str() {
        "tcp" => Ok((Kind::Tcp, "asked for".into())),
        "xgmi" => need(cfg!(feature = "xgmi"), "xgmi").map(|()| (Kind::Xgmi, "asked for".into())),
        "fabric" => need(cfg!(feature = "fabric"), "fabric").map(|()| (Kind::Fabric, "asked for".into())),
        "auto" if !cfg!(feature = "xgmi") => Ok((Kind::Tcp, "auto: built without the xgmi feature".into())),
        "auto" => match gpu_count() {
            Ok(n) if a.gpu < n => Ok((Kind::Xgmi, format!("auto: GPU {} of {n} found", a.gpu))),
            Ok(n) => Ok((Kind::Tcp, format!("auto: no GPU {} (this machine has {n})", a.gpu))),
            Err(_) => Ok((Kind::Tcp, "auto: no GPU runtime found; --backend xgmi says why".into())),
        },
        other => Err(format!("--backend {other:?}: use auto, tcp, xgmi or fabric")),
    }
}

/// splitmix64: a tiny deterministic generator, enough for shuffling block tables.
fn next_rand(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The first `n` entries of a seeded random permutation of `0..pool`: a block table.
fn block_table(n: usize, pool: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..pool).collect();
    let mut s = seed;
    for i in (1..pool).rev() {
        p.swap(i, (next_rand(&mut s) % (i as u64 + 1)) as usize);
    }
    p.truncate(n);
    p
}

/// Mixes a global element index into a 16-bit value (the bf16 bit pattern we store).
fn mix(x: u64) -> u16 {
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as u16
}

/// Value of (layer, k/v, token, head, dim) in the request's KV cache; `lkv = layer * 2 + kv`.
fn kv_value(lkv: usize, padded_tokens: usize, token: usize, head: usize, dim: usize) -> u16 {
    mix((((lkv * padded_tokens + token) * KV_HEADS + head) * HEAD_DIM + dim) as u64)
}

/// What a decode buffer element holds before the transfer (and must keep if not in the request).
fn sentinel(elem: usize) -> u16 {
    mix(elem as u64 ^ 0x5EED_0000_0000) ^ 0xA5A5
}

/// One side's buffer: host memory, or GPU memory filled from and read back into host copies.
enum Mem {
    Host(Vec<u16>),
    #[cfg(feature = "gpu")]
    Gpu {
        rt: std::sync::Arc<dyn mori::gpu::Runtime>,
        dev: DevMem,
        elems: usize,
        device: u32,
    },
}

/// A GPU allocation: plain (xgmi) or fabric-exportable VMM memory (fabric).
#[cfg(feature = "gpu")]
enum DevMem {
    Plain(mori::gpu::DeviceBuffer),
    #[cfg(feature = "fabric")]
    Fabric(mori::io::FabricMemory),
}

#[cfg(feature = "gpu")]
impl DevMem {
    fn slice(&self) -> mori::gpu::DeviceSlice<'_> {
        match self {
            DevMem::Plain(b) => b.slice(),
            #[cfg(feature = "fabric")]
            DevMem::Fabric(m) => m.slice(),
        }
    }
}

/// `v` as bytes (what the GPU copies move).
#[cfg(feature = "gpu")]
fn as_bytes(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and every byte pattern is a valid u8; the view covers exactly
    // the 2 * len bytes of `v` and borrows it.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 2) }
}

#[cfg(feature = "gpu")]
fn as_bytes_mut(v: &mut [u16]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; any byte pattern written is a valid u16, and `v` is borrowed
    // mutably for the view's life.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 2) }
}

impl Mem {
    /// `host` in memory of `kind`: the vector itself for tcp, a GPU copy of it otherwise.
    fn new(kind: Kind, host: Vec<u16>, device: u32) -> Result<Mem, String> {
        if kind == Kind::Tcp {
            return Ok(Mem::Host(host));
        }
        Self::gpu(kind, host, device)
    }

    #[cfg(feature = "gpu")]
    fn gpu(kind: Kind, host: Vec<u16>, device: u32) -> Result<Mem, String> {
        let rt = mori::gpu::detect().map_err(|e| format!("GPU memory: {e}"))?;
        let bytes = host.len() * 2;
        let dev = match kind {
            #[cfg(feature = "fabric")]
            Kind::Fabric => DevMem::Fabric(
                mori::io::FabricMemory::alloc(&rt, device, bytes, mori::io::HandleType::PosixFd)
                    .map_err(|e| format!("fabric memory: {e}"))?,
            ),
            _ => DevMem::Plain(rt.alloc(mori::gpu::Device(device), bytes).map_err(|e| format!("GPU {device}: {e}"))?),
        };
        let s = dev.slice().sub(0, bytes).map_err(|e| e.to_string())?;
        rt.copy_htod(&s, as_bytes(&host)).map_err(|e| format!("upload to GPU {device}: {e}"))?;
        Ok(Mem::Gpu { rt, dev, elems: host.len(), device })
    }

    #[cfg(not(feature = "gpu"))]
    fn gpu(kind: Kind, _host: Vec<u16>, _device: u32) -> Result<Mem, String> {
        Err(format!("{kind:?} needs GPU memory: this build has no GPU backend feature"))
    }

    /// Address, length and location to register.
    fn region(&mut self) -> (*mut u8, usize, MemLoc) {
        match self {
            Mem::Host(v) => (v.as_mut_ptr().cast(), v.len() * 2, MemLoc::Host { numa: None }),
            #[cfg(feature = "gpu")]
            Mem::Gpu { dev, elems, device, .. } => (dev.slice().ptr() as *mut u8, *elems * 2, MemLoc::Gpu { device: *device }),
        }
    }

    /// Runs `f` on the buffer's contents (read back from the GPU first for GPU memory). Only
    /// called while no transfer is in flight.
    fn with_host<R>(&self, f: impl FnOnce(&[u16]) -> R) -> Result<R, String> {
        match self {
            Mem::Host(v) => Ok(f(v)),
            #[cfg(feature = "gpu")]
            Mem::Gpu { rt, dev, elems, device } => {
                let mut v = vec![0u16; *elems];
                let s = dev.slice().sub(0, *elems * 2).map_err(|e| e.to_string())?;
                rt.copy_dtoh(as_bytes_mut(&mut v), &s).map_err(|e| format!("read back GPU {device}: {e}"))?;
                Ok(f(&v))
            }
        }
    }
}

/// One side: its engine and its registered buffer (the engine drops first).
struct Side {
    eng: IoEngine,
    mem: Mem,
    desc: MemoryDesc,
}

fn backend_config(kind: Kind, lanes: usize) -> Result<BackendConfig, String> {
    match kind {
        Kind::Tcp => Ok(BackendConfig::Tcp(TcpConfig { lanes, ..TcpConfig::from_env().map_err(|e| e.to_string())? })),
        #[cfg(feature = "xgmi")]
        Kind::Xgmi => Ok(BackendConfig::Xgmi(mori::io::XgmiConfig::default())),
        #[cfg(feature = "fabric")]
        Kind::Fabric => Ok(BackendConfig::Fabric(mori::io::FabricConfig::from_env().map_err(|e| e.to_string())?)),
        #[allow(unreachable_patterns)]
        other => Err(format!("{other:?}: not in this build")),
    }
}

fn side(key: &str, kind: Kind, host: Vec<u16>, a: &Args) -> Result<Side, String> {
    let err = |e: mori::io::IoError| format!("{key}: {e}");
    let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).map_err(err)?).map_err(err)?;
    eng.create_backend(backend_config(kind, a.lanes)?).map_err(err)?;
    let mut mem = Mem::new(kind, host, a.gpu)?;
    let (ptr, len, loc) = mem.region();
    // SAFETY: the buffer (a Vec's heap allocation, or device memory) is never resized or freed
    // while registered: it lives in `Side` next to the engine, which drops first (field
    // order); this program touches it only when no transfer is in flight (every transfer is
    // waited for).
    let desc = unsafe { eng.register_memory(ptr, len, loc) }.map_err(err)?;
    Ok(Side { eng, mem, desc })
}

/// Checks every decode pool element; returns the number of wrong elements (printing the first).
fn verify(pre: &[u16], dec: &[u16], ptable: &[usize], dtable: &[usize], pool_blocks: usize) -> usize {
    let mut inverse = vec![None; pool_blocks];
    for (j, &d) in dtable.iter().enumerate() {
        inverse[d] = Some(ptable[j]);
    }
    let mut bad = 0;
    for lkv in 0..LAYERS * 2 {
        for (db, src) in inverse.iter().enumerate() {
            let at = (lkv * pool_blocks + db) * BLOCK_ELEMS;
            let got = &dec[at..at + BLOCK_ELEMS];
            let want: Vec<u16> = match src {
                // Fast path: a request block equal to its source block.
                Some(pb) if got == &pre[(lkv * pool_blocks + pb) * BLOCK_ELEMS..][..BLOCK_ELEMS] => continue,
                Some(pb) => pre[(lkv * pool_blocks + pb) * BLOCK_ELEMS..][..BLOCK_ELEMS].to_vec(),
                None => (at..at + BLOCK_ELEMS).map(sentinel).collect(),
            };
            for (e, (&v, &w)) in got.iter().zip(&want).enumerate().filter(|(_, (v, w))| v != w) {
                if bad == 0 {
                    let (t, h, d) = (e / (KV_HEADS * HEAD_DIM), e / HEAD_DIM % KV_HEADS, e % HEAD_DIM);
                    let what = if src.is_some() { "request" } else { "untouched" };
                    let kv = ["K", "V"][lkv % 2];
                    eprintln!("first mismatch: layer {} {kv} {what} decode pool block {db}, token {t} head {h} dim {d}: got {v:#06x}, want {w:#06x}", lkv / 2);
                }
                bad += 1;
            }
        }
    }
    bad
}

/// Waits (bounded) until the decode engine reports inbound transfer `id` from "prefill".
fn inbound_ok(dec: &IoEngine, id: u64) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if let Some(r) = dec.pop_inbound_status("prefill", id) {
            return r.map_err(|e| format!("decode side reports transfer {id} failed: {e}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(format!("decode side never reported inbound transfer {id} within 10 s"))
}

/// `secs` for printing: milliseconds below a second (GPU transfers take a fraction of one).
fn dur(secs: f64) -> String {
    if secs >= 1.0 {
        format!("{secs:.3} s")
    } else {
        format!("{:.3} ms", secs * 1e3)
    }
}

/// Mean and best of `times`, seconds.
fn mean_best(times: &[f64]) -> (f64, f64) {
    (times.iter().sum::<f64>() / times.len().max(1) as f64, times.iter().cloned().fold(f64::INFINITY, f64::min))
}

fn run() -> Result<(), String> {
    let a = parse_args()?;
    let (kind, why) = pick(&a)?;
    let blocks = a.tokens.div_ceil(BLOCK_TOKENS);
    let pool_blocks = a.pool_blocks.unwrap_or(blocks + blocks / 2);
    if blocks == 0 || pool_blocks < blocks || pool_blocks > u32::MAX as usize {
        return Err(format!("need 1 <= blocks ({blocks}) <= --pool-blocks ({pool_blocks}) <= {}", u32::MAX));
    }
    let padded = blocks * BLOCK_TOKENS;
    let pool_elems = LAYERS * 2 * pool_blocks * BLOCK_ELEMS;
    let request_elems = LAYERS * 2 * blocks * BLOCK_ELEMS;
    let request_bytes = request_elems as u64 * 2;
    println!(
        "shape: {LAYERS} layers x K/V x {KV_HEADS} kv heads x head dim {HEAD_DIM}, bf16, {BLOCK_TOKENS}-token blocks of {} KiB",
        BLOCK_BYTES >> 10
    );
    println!(
        "request: {} tokens = {blocks} blocks per layer per K/V; pool: {pool_blocks} blocks per layer per K/V ({} MiB per side)",
        a.tokens,
        (pool_elems * 2) >> 20
    );
    match kind {
        Kind::Tcp => println!("backend: tcp, {} lanes, host memory ({why})", a.lanes),
        _ => println!("backend: {}, memory of GPU {} ({why})", format!("{kind:?}").to_lowercase(), a.gpu),
    }

    // Block tables: logical block j lives at prefill pool block ptable[j], goes to dtable[j].
    let ptable = block_table(blocks, pool_blocks, a.seed);
    let dtable = block_table(blocks, pool_blocks, a.seed ^ 0xDEC0DE);
    // Each buffer: the pool, then the contiguous area (prefill: the request's blocks in order).
    let mut pre = vec![0xFFFFu16; pool_elems + request_elems];
    for lkv in 0..LAYERS * 2 {
        for (j, &pb) in ptable.iter().enumerate() {
            let at = (lkv * pool_blocks + pb) * BLOCK_ELEMS;
            for (e, v) in pre[at..at + BLOCK_ELEMS].iter_mut().enumerate() {
                let (t, h, d) = (e / (KV_HEADS * HEAD_DIM), e / HEAD_DIM % KV_HEADS, e % HEAD_DIM);
                *v = kv_value(lkv, padded, j * BLOCK_TOKENS + t, h, d);
            }
            pre.copy_within(at..at + BLOCK_ELEMS, pool_elems + (lkv * blocks + j) * BLOCK_ELEMS);
        }
    }
    let dec_init: Vec<u16> = (0..pool_elems + request_elems).map(sentinel).collect();

    let err = |e: mori::io::IoError| e.to_string();
    let prefill = side("prefill", kind, pre, &a)?;
    let decode = side("decode", kind, dec_init, &a)?;
    prefill.eng.register_remote_engine(decode.eng.desc().clone()).map_err(err)?;
    decode.eng.register_remote_engine(prefill.eng.desc().clone()).map_err(err)?;
    let sess = prefill.eng.create_session(&prefill.desc, &decode.desc).map_err(err)?;

    // The request as one paged batch: both tables, both pools laid out [layer][k/v][block].
    let (pt, dt): (Vec<u32>, Vec<u32>) = ptable.iter().zip(&dtable).map(|(&p, &d)| (p as u32, d as u32)).unzip();
    let layout = PagedLayout::pool(0, BLOCK_BYTES, pool_blocks as u64, 2);
    let batch = PagedBatch {
        local_blocks: &pt,
        remote_blocks: &dt,
        block_size: BLOCK_BYTES,
        layers: LAYERS as u32,
        halves: 2,
        local: layout,
        remote: layout,
    };
    let len = (pool_elems + request_elems) as u64 * 2;
    let plan = mori::io_core::paged::check_paged((prefill.desc.id, len), (decode.desc.id, len), &batch).map_err(err)?;
    let contiguous_off = pool_elems as u64 * 2;

    let timed = |paged: bool| -> Result<f64, String> {
        let id = prefill.eng.allocate_transfer_uid();
        let t0 = Instant::now();
        let st = if paged { sess.batch_write_paged(&batch, id) } else { sess.write(contiguous_off, contiguous_off, request_bytes, id) };
        st.wait_for(WAIT).map_err(err)?;
        let secs = t0.elapsed().as_secs_f64();
        inbound_ok(&decode.eng, id)?;
        Ok(secs)
    };
    let gbps = |secs: f64| request_bytes as f64 / secs / 1e9;
    let check = |what: &str| -> Result<(), String> {
        let bad = prefill.mem.with_host(|p| decode.mem.with_host(|d| verify(p, d, &ptable, &dtable, pool_blocks)))??;
        if bad != 0 {
            return Err(format!("{what}{bad} of {pool_elems} decode pool elements are wrong"));
        }
        Ok(())
    };

    let secs = timed(true)?;
    println!(
        "descriptors: {} as one paged batch ({LAYERS} layers x K/V x {blocks} blocks; {} runs per layer and K/V after merging)",
        plan.entries(),
        plan.runs.len()
    );
    println!("bytes: {request_bytes} ({} MiB)", request_bytes >> 20);
    println!("first transfer: {}, {:.2} GB/s", dur(secs), gbps(secs));
    println!("decode engine reported the inbound transfer: ok");
    check("")?;
    println!("verified: every byte OK ({} MiB of decode pool checked)", (pool_elems * 2) >> 20);

    if a.reps > 0 {
        // One untimed contiguous write first (the paged side's warm-up was the first transfer).
        timed(false)?;
        let (mut paged, mut contiguous) = (Vec::new(), Vec::new());
        for _ in 0..a.reps {
            paged.push(timed(true)?);
            contiguous.push(timed(false)?);
        }
        let ((pm, pb), (cm, cb)) = (mean_best(&paged), mean_best(&contiguous));
        println!(
            "warm ({} reps, first excluded): mean {} = {:.2} GB/s, best {} = {:.2} GB/s",
            a.reps,
            dur(pm),
            gbps(pm),
            dur(pb),
            gbps(pb)
        );
        println!(
            "contiguous (same run, one write of the same {} MiB after each paged rep): mean {} = {:.2} GB/s, best {} = {:.2} GB/s",
            request_bytes >> 20,
            dur(cm),
            gbps(cm),
            dur(cb),
            gbps(cb)
        );
        println!("paged/contiguous: {:.3}x (mean), {:.3}x (best)", cm / pm, cb / pb);
        check("after the repetitions, ")?;
        let area = |v: &[u16]| v[pool_elems..].to_vec();
        let (p, d) = (prefill.mem.with_host(area)?, decode.mem.with_host(area)?);
        if let Some(i) = p.iter().zip(&d).position(|(x, y)| x != y) {
            return Err(format!("the contiguous copy differs first at element {i} of {request_elems}"));
        }
        println!("verified again after the repetitions: every byte OK (and the contiguous copy's {} MiB)", request_bytes >> 20);
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv_cache_transfer: {e}");
            ExitCode::FAILURE
        }
    }
}
