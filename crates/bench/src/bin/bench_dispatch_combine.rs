//! `bench_dispatch_combine`: MORI-EP intranode dispatch/combine on GPUs, checked against the
//! host reference (mori-ep's oracle) and timed next to a plain device-to-device copy of the
//! same byte count (the roofline) measured in the same run.
//!
//! Ranks: `--world-size W` ranks, `--num-gpus G` GPUs (rank r on GPU `r / (W/G)`),
//! `--procs P` processes (this one plus P-1 it spawns; each hosts W/P consecutive ranks and
//! their heaps are joined through IPC). Default: all ranks in one process on GPU 0 (the single
//! H200 setup: 8 ranks share one GPU, one launch serves them all).
//!
//! Accounting (MORI-EP seed, "Bandwidth Computation"): XGMI/NVL bytes of a rank = received
//! tokens x (hidden x element size + scale bytes); combine moves the same token count in the
//! combine dtype; RDMA algo tokens = unique (token, node) pairs incl. the local node, physical
//! = algo x (nodes-1)/nodes; GB = 1e9. Times are CUDA-event times of one launch per device
//! averaged over `--iters` after `--warmup`.
//!
//! The first iteration is checked unless `--no-check`: every rank's received rows, weights,
//! indices, scales and sources (sorted by source) against the oracle's bytes, and the combine
//! output against the oracle's combine of the same inputs (bit-exact unweighted; weighted within
//! 1e-2 relative, f32 FMA contraction may differ). Later iterations reuse the first
//! iteration's combine input rows; their slot order may differ, so only their timing counts.

use clap::{Parser, ValueEnum};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use mori_bootstrap::{Bootstrap, SocketBootstrap, SocketBootstrapConfig};
use mori_ep::gpu::{perfetto_trace, CombineInput, CombineSpec, DispatchInput, DispatchSpec, IntranodeEp};
use mori_ep::routing::{generate_routing, RoutingSpec, SplitMix64};
use mori_ep::{
    accounting, bf16, combine, dispatch, quantize_fp8_blocks, CombineOptions, DispatchHandle, DispatchOptions, EpConfig, Fp8E4m3,
    KernelType, OutOfRange, RankInput, SrcPos, Tensor2, Weighting,
};
use mori_gpu::{Device, DeviceBuffer, Runtime, Stream};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
enum DType {
    Bf16,
    F32,
    /// FP8 E4M3 rows with f32 scales per 128 columns.
    Fp8,
}

impl DType {
    fn size(self) -> usize {
        match self {
            DType::Bf16 => 2,
            DType::F32 => 4,
            DType::Fp8 => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
enum CombDType {
    Bf16,
    F32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum IdxType {
    I32,
    I64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum KernelTypeArg {
    /// All ranks on one node (P2P); the default for one node.
    Intranode,
    /// Inter-node V1 (RDMA and XGMI blocks); the default for several nodes.
    V1,
    /// Inter-node V1, low latency.
    #[value(name = "v1_ll")]
    V1Ll,
    /// Asynchronous low-latency kernels.
    #[value(name = "async_ll")]
    AsyncLl,
}

impl KernelTypeArg {
    fn of(k: KernelType) -> Self {
        match k {
            KernelType::IntraNode => KernelTypeArg::Intranode,
            KernelType::InterNodeV1 => KernelTypeArg::V1,
            KernelType::InterNodeV1LL => KernelTypeArg::V1Ll,
            KernelType::AsyncLL => KernelTypeArg::AsyncLl,
        }
    }

    fn kernel_type(self) -> KernelType {
        match self {
            KernelTypeArg::Intranode => KernelType::IntraNode,
            KernelTypeArg::V1 => KernelType::InterNodeV1,
            KernelTypeArg::V1Ll => KernelType::InterNodeV1LL,
            KernelTypeArg::AsyncLl => KernelType::AsyncLL,
        }
    }

    /// The flag value, as the user types it.
    fn name(self) -> &'static str {
        match self {
            KernelTypeArg::Intranode => "intranode",
            KernelTypeArg::V1 => "v1",
            KernelTypeArg::V1Ll => "v1_ll",
            KernelTypeArg::AsyncLl => "async_ll",
        }
    }
}

/// MORI-EP intranode dispatch/combine benchmark (GPU), checked against the host reference.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_dispatch_combine")]
struct Args {
    /// Tokens per rank T.
    #[arg(long = "num-tokens", alias = "max-tokens", default_value_t = 4096)]
    num_tokens: usize,
    /// Hidden size H (elements).
    #[arg(long, default_value_t = 7168)]
    hidden: usize,
    /// Experts in total E (split evenly over the ranks).
    #[arg(long = "num-experts", default_value_t = 256)]
    num_experts: usize,
    /// Top-k K.
    #[arg(long = "top-k", alias = "topk", default_value_t = 8)]
    top_k: usize,
    /// Dispatch dtype (fp8: E4M3 rows + f32 scales per 128 columns).
    #[arg(long, value_enum, default_value = "fp8")]
    dtype: DType,
    /// Combine dtype (input and output).
    #[arg(long = "combine-dtype", value_enum, default_value = "bf16")]
    combine_dtype: CombDType,
    /// Expert id type.
    #[arg(long = "idx-type", value_enum, default_value = "i64")]
    idx_type: IdxType,
    /// EP ranks W.
    #[arg(long = "world-size", default_value_t = 8)]
    world_size: usize,
    /// GPUs used (rank r on GPU r / (W / G)).
    #[arg(long = "num-gpus", default_value_t = 1, conflicts_with = "ranks_per_gpu")]
    num_gpus: usize,
    /// Ranks sharing each GPU (the other way to say --num-gpus: G = W / this).
    #[arg(long = "ranks-per-gpu")]
    ranks_per_gpu: Option<usize>,
    /// Processes (this one and P-1 spawned); each hosts W/P consecutive ranks.
    #[arg(long, default_value_t = 1)]
    procs: usize,
    /// GPUs (ranks) per node; ranks [n*g, (n+1)*g) form node n. Default: W (one node).
    #[arg(long = "gpus-per-node")]
    gpus_per_node: Option<usize>,
    /// Kernel family. Default: intranode on one node, v1 on several. Only intranode runs on
    /// GPUs here.
    #[arg(long = "kernel-type", value_enum)]
    kernel_type: Option<KernelTypeArg>,
    /// Thread blocks per rank (all ranks' blocks on a GPU must fit its multiprocessors).
    /// Default: 128 / ranks per GPU, at most 64. V1 kernels give two thirds of them to RDMA.
    #[arg(long = "block-num")]
    block_num: Option<usize>,
    /// Warps per block. Default: the kernel family's (16 intranode, 8 otherwise).
    #[arg(long = "warps-per-block")]
    warps_per_block: Option<usize>,
    /// Timed iterations.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Overwrite a 256 MiB buffer before each timed operation (cold L2).
    #[arg(long = "l2-flush")]
    l2_flush: bool,
    /// Weighted combine (each rank's row scaled by the token's weights on that rank's experts).
    #[arg(long)]
    weighted: bool,
    /// Skip the oracle check.
    #[arg(long = "no-check")]
    no_check: bool,
    /// Perfetto JSON of per-block phase timestamps of the last iteration (rank 0's process).
    #[arg(long)]
    trace: Option<String>,
    /// All figures as JSON.
    #[arg(long)]
    json: Option<String>,
    /// Routing seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Deadline of every in-kernel wait, ms.
    #[arg(long = "timeout-ms", default_value_t = 10_000)]
    timeout_ms: u64,
    /// (internal) index of this process when spawned.
    #[arg(long = "proc-index", hide = true, default_value_t = 0)]
    proc_index: usize,
    /// (internal) bootstrap root address of spawned processes.
    #[arg(long = "proc-master", hide = true)]
    proc_master: Option<SocketAddr>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RankFigures {
    rank: usize,
    gpu: u32,
    recv_tokens: usize,
    rdma_algo_tokens: u64,
    rdma_physical_tokens: f64,
    dispatch_us: f64,
    combine_us: f64,
    dispatch_bytes: u64,
    combine_bytes: u64,
    dispatch_gbps: f64,
    combine_gbps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeviceFigures {
    gpu: u32,
    ranks: Vec<usize>,
    dispatch_us: f64,
    combine_us: f64,
    dispatch_bytes: u64,
    combine_bytes: u64,
    dispatch_gbps: f64,
    combine_gbps: f64,
    copy_dispatch_gbps: f64,
    copy_combine_gbps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
struct ProcFigures {
    ranks: Vec<RankFigures>,
    devices: Vec<DeviceFigures>,
    check: String,
}

/// `--ranks-per-gpu R` as the GPU count it implies (`--world-size / R`); the other checks are
/// in [`config`].
fn resolve_gpus(mut a: Args) -> AnyResult<Args> {
    if let Some(r) = a.ranks_per_gpu {
        if r == 0 || !a.world_size.is_multiple_of(r) {
            return Err(err(format!("--ranks-per-gpu {r} must divide --world-size {}", a.world_size)));
        }
        a.num_gpus = a.world_size / r;
    }
    Ok(a)
}

fn main() -> ExitCode {
    match resolve_gpus(Args::parse()).and_then(|a| run(&a)) {
        Ok(ok) => {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("bench_dispatch_combine: error: {e}");
            ExitCode::FAILURE
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn err(msg: impl Into<String>) -> Box<dyn std::error::Error> {
    msg.into().into()
}

fn config(a: &Args) -> AnyResult<EpConfig> {
    let w = a.world_size;
    if a.num_gpus == 0 || !w.is_multiple_of(a.num_gpus) {
        return Err(err(format!("--num-gpus {} must divide --world-size {w}", a.num_gpus)));
    }
    if a.procs == 0 || !w.is_multiple_of(a.procs) {
        return Err(err(format!("--procs {} must divide --world-size {w}", a.procs)));
    }
    if a.procs > a.num_gpus && a.procs > 1 {
        return Err(err(format!(
            "--procs {} above --num-gpus {}: ranks of several processes sharing one GPU are not supported by this bench (use one process)",
            a.procs, a.num_gpus
        )));
    }
    if a.procs > 1 && a.procs != a.num_gpus {
        return Err(err(format!(
            "--procs {} with --num-gpus {}: with several processes each hosts exactly one GPU (--num-gpus must equal --procs)",
            a.procs, a.num_gpus
        )));
    }
    if a.proc_index >= a.procs {
        return Err(err(format!("--proc-index {} is not below --procs {}", a.proc_index, a.procs)));
    }
    if a.num_tokens == 0 || a.num_tokens > 1 << 20 {
        return Err(err(format!("--num-tokens {}: must be in 1..=1048576 tokens per rank", a.num_tokens)));
    }
    if a.iters == 0 {
        return Err(err("--iters 0: at least one timed iteration"));
    }
    if a.timeout_ms == 0 {
        return Err(err("--timeout-ms 0: every in-kernel wait would fail at once; give at least 1 ms"));
    }
    if a.top_k > a.num_experts {
        return Err(err(format!("--top-k {} exceeds --num-experts {}: a token picks top-k distinct experts", a.top_k, a.num_experts)));
    }
    let gpn = a.gpus_per_node.unwrap_or(w);
    if gpn == 0 || !w.is_multiple_of(gpn) {
        return Err(err(format!("--gpus-per-node {gpn} must divide --world-size {w}")));
    }
    let nodes = w / gpn;
    // The kernel type and its launch defaults follow the node count of these flags.
    let mut cfg = EpConfig::with_gpus_per_node(w, gpn, a.hidden, a.num_experts, a.top_k, a.num_tokens)?;
    let kt = a.kernel_type.unwrap_or(KernelTypeArg::of(cfg.kernel_type));
    let nodes_flags = || match a.gpus_per_node {
        Some(g) => format!("--world-size {w} and --gpus-per-node {g}"),
        None => format!("--world-size {w}"),
    };
    if kt == KernelTypeArg::Intranode && nodes > 1 {
        return Err(err(format!(
            "--kernel-type intranode with {} ({nodes} nodes): intranode needs all ranks on one node (use --kernel-type v1, v1_ll or async_ll)",
            nodes_flags()
        )));
    }
    if kt != KernelTypeArg::Intranode {
        let how = if a.kernel_type.is_some() {
            format!("--kernel-type {}", kt.name())
        } else {
            format!("{} ({nodes} nodes) selects --kernel-type {}", nodes_flags(), kt.name())
        };
        return Err(err(format!("{how}: the GPU internode kernels are not built yet; only --kernel-type intranode runs on GPUs")));
    }
    cfg.set_kernel_type(kt.kernel_type());
    cfg.max_token_type_size = a.dtype.size().max(match a.combine_dtype {
        CombDType::Bf16 => 2,
        CombDType::F32 => 4,
    });
    if a.dtype == DType::Fp8 {
        cfg.scale_dim = a.hidden.div_ceil(128);
        cfg.scale_type_size = 4;
    }
    let ranks_per_gpu = w / a.num_gpus;
    let block_num = a.block_num.unwrap_or((128 / ranks_per_gpu).clamp(1, 64));
    if cfg.kernel_type.uses_rdma_blocks() && block_num < 2 {
        let given = if a.block_num.is_some() { "--block-num" } else { "the default --block-num" };
        return Err(err(format!(
            "{given} {block_num} with --kernel-type {} leaves no XGMI block: {} splits its blocks into RDMA and XGMI blocks (give --block-num 2 or more)",
            kt.name(),
            kt.name()
        )));
    }
    cfg.set_block_num(block_num);
    if let Some(wp) = a.warps_per_block {
        cfg.warps_per_block = wp;
    }
    cfg.validate()?;
    Ok(cfg)
}

/// All ranks' inputs, generated identically in every process. Values are small integers
/// (exact in bf16 and fp8 E4M3 before scaling).
struct Inputs {
    idx: Vec<Tensor2<i64>>,
    weights: Vec<Tensor2<f32>>,
    x_f32: Vec<Tensor2<f32>>,
}

fn gen_inputs(a: &Args, cfg: &EpConfig) -> AnyResult<Inputs> {
    let mut idx = Vec::new();
    let mut weights = Vec::new();
    let mut x_f32 = Vec::new();
    for r in 0..cfg.world_size {
        let mut rng = SplitMix64::new(a.seed.wrapping_mul(1_000_003).wrapping_add(r as u64));
        let (i, w) = generate_routing(RoutingSpec::deepep(a.num_tokens, a.num_experts, a.top_k, 1), &mut rng)?;
        idx.push(i);
        weights.push(w);
        x_f32.push(Tensor2::from_fn(a.num_tokens, a.hidden, |t, h| ((r * 131 + t * 7 + h) % 17) as f32 - 8.0)?);
    }
    Ok(Inputs { idx, weights, x_f32 })
}

/// The combine input row of a received token: a function of its source only.
fn comb_value(src: SrcPos, h: usize) -> f32 {
    ((src.rank * 5 + src.token * 3 + h) % 11) as f32 - 5.0
}

/// Little-endian bytes of an element, as the GPU buffers hold it.
trait RowBytes {
    fn put(&self, out: &mut Vec<u8>);
}
macro_rules! le_bytes {
    ($($t:ty => |$v:ident| $bits:expr),* $(,)?) => {$(
        impl RowBytes for $t {
            fn put(&self, out: &mut Vec<u8>) {
                let $v = self;
                out.extend_from_slice(&$bits.to_le_bytes())
            }
        }
    )*};
}
le_bytes!(f32 => |v| v, i32 => |v| v, i64 => |v| v, bf16 => |v| v.to_bits(), Fp8E4m3 => |v| v.0);

fn bytes_of<T: RowBytes>(t: &Tensor2<T>) -> Vec<u8> {
    let mut v = Vec::new();
    for x in t.as_slice() {
        x.put(&mut v);
    }
    v
}

/// Host-side byte images of one rank's dispatch inputs.
struct HostRank {
    x: Vec<u8>,
    w: Vec<u8>,
    idx: Vec<u8>,
    scales: Vec<u8>,
}

/// The oracle's received bytes of one rank, in canonical (source) order.
struct OracleRecv {
    x: Vec<u8>,
    w: Vec<u8>,
    idx: Vec<u8>,
    scales: Vec<u8>,
    src: Vec<SrcPos>,
}

/// The oracle's dispatch of all ranks: received bytes per rank and the handle.
type Oracle = (Vec<OracleRecv>, DispatchHandle);

fn host_images_and_oracle(a: &Args, cfg: &EpConfig, inp: &Inputs, want_oracle: bool) -> AnyResult<(Vec<HostRank>, Option<Oracle>)> {
    let idx_bytes = |t: &Tensor2<i64>| match a.idx_type {
        IdxType::I64 => bytes_of(t),
        IdxType::I32 => bytes_of(&t.map(|&v| v as i32)),
    };
    macro_rules! go {
        ($xs:expr, $scales:expr) => {{
            let xs = $xs;
            let scales: Vec<Option<Tensor2<f32>>> = $scales;
            let host: Vec<HostRank> = (0..cfg.world_size)
                .map(|r| HostRank {
                    x: bytes_of(&xs[r]),
                    w: bytes_of(&inp.weights[r]),
                    idx: idx_bytes(&inp.idx[r]),
                    scales: scales[r].as_ref().map(bytes_of).unwrap_or_default(),
                })
                .collect();
            let oracle = if want_oracle {
                let inputs: Vec<RankInput<_, i64, f32>> = (0..cfg.world_size)
                    .map(|r| RankInput {
                        x: xs[r].clone(),
                        weights: inp.weights[r].clone(),
                        scales: scales[r].clone(),
                        indices: inp.idx[r].clone(),
                    })
                    .collect();
                let d = dispatch(cfg, &inputs, DispatchOptions::default())?;
                let recv = d
                    .ranks
                    .iter()
                    .map(|rr| OracleRecv {
                        x: bytes_of(&rr.x),
                        w: bytes_of(&rr.weights),
                        idx: idx_bytes(&rr.indices),
                        scales: rr.scales.as_ref().map(bytes_of).unwrap_or_default(),
                        src: rr.src.clone(),
                    })
                    .collect();
                Some((recv, d.handle))
            } else {
                None
            };
            (host, oracle)
        }};
    }
    Ok(match a.dtype {
        DType::F32 => go!(inp.x_f32.clone(), vec![None; cfg.world_size]),
        DType::Bf16 => go!(inp.x_f32.iter().map(|t| t.map(|&v| bf16::from_f32(v))).collect::<Vec<_>>(), vec![None; cfg.world_size]),
        DType::Fp8 => {
            let (q, s): (Vec<_>, Vec<_>) = inp.x_f32.iter().map(quantize_fp8_blocks).unzip();
            go!(q, s.into_iter().map(Some).collect())
        }
    })
}

fn run(a: &Args) -> AnyResult<bool> {
    let cfg = config(a)?;
    // Output files are created before the GPU work, so an unwritable path fails first.
    if a.proc_index == 0 {
        for (flag, path) in [("--json", &a.json), ("--trace", &a.trace)] {
            if let Some(path) = path {
                std::fs::File::create(path).map_err(|e| err(format!("{flag} {path}: cannot be written: {e}")))?;
            }
        }
    }
    let rt: Arc<dyn Runtime> = mori_gpu::detect()?;
    let ndev = rt.device_count()? as usize;
    if a.num_gpus > ndev {
        return Err(err(format!("--num-gpus {} but the runtime sees {ndev} device(s)", a.num_gpus)));
    }
    let w = cfg.world_size;
    let per_proc = w / a.procs;
    let per_gpu = w / a.num_gpus;
    let local: Vec<(usize, Device)> =
        (a.proc_index * per_proc..(a.proc_index + 1) * per_proc).map(|r| (r, Device((r / per_gpu) as u32))).collect();

    // Processes: this one spawns the others and roots the bootstrap.
    let mut children: Vec<Child> = Vec::new();
    let boot: Option<SocketBootstrap> = if a.procs > 1 {
        let master = match a.proc_master {
            Some(m) => m,
            None => {
                let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
                let m: SocketAddr = format!("127.0.0.1:{port}").parse()?;
                let exe = std::env::current_exe()?;
                let argv: Vec<String> = std::env::args().skip(1).collect();
                for i in 1..a.procs {
                    children.push(
                        Command::new(&exe).args(&argv).args(["--proc-index", &i.to_string(), "--proc-master", &m.to_string()]).spawn()?,
                    );
                }
                m
            }
        };
        let bc = SocketBootstrapConfig::new(a.proc_index, a.procs, master).with_timeouts(Duration::from_secs(60), Duration::from_secs(120));
        Some(SocketBootstrap::new(bc)?)
    } else {
        None
    };
    let result = run_ranks(a, &cfg, rt, &local, boot.as_ref().map(|b| b as &dyn Bootstrap));
    for mut c in children {
        let st = c.wait()?;
        if !st.success() {
            eprintln!("bench_dispatch_combine: process {:?} exited with {st}", c.id());
            return Ok(false);
        }
    }
    result
}

fn run_ranks(a: &Args, cfg: &EpConfig, rt: Arc<dyn Runtime>, local: &[(usize, Device)], boot: Option<&dyn Bootstrap>) -> AnyResult<bool> {
    let t_setup = Instant::now();
    let check = !a.no_check;
    let inp = gen_inputs(a, cfg)?;
    let (host, oracle) = host_images_and_oracle(a, cfg, &inp, check)?;
    let host_s = t_setup.elapsed().as_secs_f64();
    let mut ep = IntranodeEp::new(rt.clone(), cfg, local, boot, Duration::from_millis(a.timeout_ms), a.trace.is_some())?;
    let devices = ep.devices();
    let streams: Vec<Stream> = devices.iter().map(|&d| rt.stream(d)).collect::<Result<_, _>>()?;
    let sref: Vec<&Stream> = streams.iter().collect();
    let idx_size = match a.idx_type {
        IdxType::I32 => 4,
        IdxType::I64 => 8,
    };
    let (c_in, c_out) = match a.combine_dtype {
        CombDType::Bf16 => (2, 2),
        CombDType::F32 => (4, 4),
    };

    // Device inputs per local rank.
    let upload = |dev: Device, b: &[u8]| -> AnyResult<Option<DeviceBuffer>> {
        if b.is_empty() {
            return Ok(None);
        }
        let buf = rt.alloc(dev, b.len())?;
        rt.copy_htod(&buf.slice(), b)?;
        Ok(Some(buf))
    };
    struct Dev {
        x: Option<DeviceBuffer>,
        w: Option<DeviceBuffer>,
        idx: Option<DeviceBuffer>,
        scales: Option<DeviceBuffer>,
        out: DeviceBuffer,
        out_w: DeviceBuffer,
    }
    let mut dev_in = Vec::new();
    for &(r, d) in local {
        let h = &host[r];
        dev_in.push(Dev {
            x: upload(d, &h.x)?,
            w: upload(d, &h.w)?,
            idx: upload(d, &h.idx)?,
            scales: upload(d, &h.scales)?,
            out: rt.alloc(d, (a.num_tokens * a.hidden * c_out).max(16))?,
            out_w: rt.alloc(d, (a.num_tokens * a.top_k * 4).max(16))?,
        });
    }
    let empty = rt.alloc(devices[0], 16)?;
    let dispatch_inputs: Vec<DispatchInput<'_>> = dev_in
        .iter()
        .map(|d| DispatchInput {
            x: d.x.as_ref().map_or(empty.slice(), |b| b.slice()),
            weights: d.w.as_ref().map(|b| b.slice()),
            indices: d.idx.as_ref().map_or(empty.slice(), |b| b.slice()),
            scales: d.scales.as_ref().map(|b| b.slice()),
            num_tokens: a.num_tokens,
        })
        .collect();
    let dspec = DispatchSpec { elem_size: a.dtype.size(), idx_size, drop_out_of_range: false };
    let cspec = CombineSpec { in_elem: c_in, out_elem: c_out, weighted: a.weighted, idx_size };
    let flush = if a.l2_flush { Some(rt.alloc(devices[0], 256 << 20)?) } else { None };
    let ev: Vec<[mori_gpu::Event; 4]> = devices
        .iter()
        .map(|&d| Ok([rt.event(d, true)?, rt.event(d, true)?, rt.event(d, true)?, rt.event(d, true)?]))
        .collect::<AnyResult<_>>()?;

    let mut t_disp = vec![0f64; devices.len()];
    let mut t_comb = vec![0f64; devices.len()];
    let mut check_msg = if check { String::new() } else { "skipped".to_string() };
    let mut all_ok = true;
    let total_iters = a.warmup + a.iters;
    let mut recv_counts = Vec::new();
    for it in 0..total_iters.max(1) {
        if let Some(f) = &flush {
            rt.memset(&f.slice(), (it & 0xff) as u8)?;
        }
        for (i, s) in streams.iter().enumerate() {
            ev[i][0].record(s)?;
        }
        let ticket = ep.dispatch(&dispatch_inputs, dspec, &sref)?;
        for (i, s) in streams.iter().enumerate() {
            ev[i][1].record(s)?;
        }
        for s in &streams {
            s.synchronize()?;
        }
        let status = ep.sync_status()?;
        recv_counts = status.iter().map(|s| s.recv_count).collect();
        if it == 0 {
            // Combine inputs (in the heap): rows as a function of each slot's source.
            for (li, &(r, _)) in local.iter().enumerate() {
                let n = recv_counts[li];
                let [_, rw, _, _, rsrc] = ep.recv_slices(r, n, a.dtype.size(), idx_size)?;
                let mut src_b = vec![0u8; n * 4];
                if n > 0 {
                    rt.copy_dtoh(&mut src_b, &rsrc)?;
                }
                let mut rows = Vec::with_capacity(n * a.hidden * c_in);
                for c in src_b.chunks(4) {
                    let flat = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
                    let sp = SrcPos::from_flat(flat, cfg.max_tokens_per_rank).unwrap_or(SrcPos { rank: 0, token: 0 });
                    for h in 0..a.hidden {
                        let v = comb_value(sp, h);
                        if c_in == 2 {
                            rows.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
                        } else {
                            rows.extend_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                if n > 0 {
                    let cb = ep.combine_buffer(r, c_in)?;
                    rt.copy_htod(&cb.sub(0, rows.len())?, &rows)?;
                    // Combine weights = received weights, copied into the heap's weights region.
                    rt.copy_dtod(&ep.combine_weights_buffer(r)?.sub(0, n * a.top_k * 4)?, &rw)?;
                }
            }
            if let Some((orc, _)) = &oracle {
                match check_dispatch(&ep, rt.as_ref(), local, orc, a, idx_size, &recv_counts) {
                    Ok(()) => {}
                    Err(e) => {
                        all_ok = false;
                        check_msg = format!("dispatch MISMATCH: {e}");
                    }
                }
            }
        }
        if let Some(f) = &flush {
            rt.memset(&f.slice(), (it & 0xff) as u8)?;
        }
        let comb_inputs: Vec<CombineInput<'_>> = dev_in
            .iter()
            .map(|d| CombineInput { x: None, weights: None, weights_in_heap: true, out: d.out.slice(), out_weights: Some(d.out_w.slice()) })
            .collect();
        for (i, s) in streams.iter().enumerate() {
            ev[i][2].record(s)?;
        }
        ep.combine(&ticket, &comb_inputs, cspec, &sref)?;
        for (i, s) in streams.iter().enumerate() {
            ev[i][3].record(s)?;
        }
        for s in &streams {
            s.synchronize()?;
        }
        ep.sync_status()?;
        if it == 0 && check && all_ok {
            if let Some((orc, handle)) = &oracle {
                match check_combine(
                    a,
                    cfg,
                    &inp,
                    orc,
                    handle,
                    rt.as_ref(),
                    local,
                    &dev_in.iter().map(|d| (&d.out, &d.out_w)).collect::<Vec<_>>(),
                ) {
                    Ok(()) => check_msg = "OK (dispatch rows, weights, indices, scales, sources; combine output and weights)".into(),
                    Err(e) => {
                        all_ok = false;
                        check_msg = format!("combine MISMATCH: {e}");
                    }
                }
            }
        }
        if it >= a.warmup {
            for i in 0..devices.len() {
                t_disp[i] += ev[i][0].elapsed_ms(&ev[i][1])? as f64 * 1e3;
                t_comb[i] += ev[i][2].elapsed_ms(&ev[i][3])? as f64 * 1e3;
            }
        }
    }
    let iters = a.iters.max(1) as f64;
    if let Some(path) = &a.trace {
        if let Some(t) = ep.trace()? {
            if a.proc_index == 0 {
                let mut json = serde_json::to_string(&perfetto_trace(&t))?;
                json.push('\n');
                std::fs::write(path, json)?;
            }
        }
    }

    // Figures.
    let scale_bytes = cfg.scale_dim * cfg.scale_type_size;
    let d_tok = (a.hidden * a.dtype.size() + scale_bytes) as u64;
    let c_tok = (a.hidden * c_in) as u64;
    let mut pf = ProcFigures { check: check_msg.clone(), ..Default::default() };
    for (gi, &d) in devices.iter().enumerate() {
        let ranks: Vec<usize> = local.iter().filter(|l| l.1 == d).map(|l| l.0).collect();
        let n: usize = local.iter().enumerate().filter(|(_, l)| l.1 == d).map(|(i, _)| recv_counts[i]).sum();
        let (db, cb) = (n as u64 * d_tok, n as u64 * c_tok);
        let (du, cu) = (t_disp[gi] / iters, t_comb[gi] / iters);
        let copy_d = copy_gbps(rt.as_ref(), d, db as usize, &streams[gi])?;
        let copy_c = copy_gbps(rt.as_ref(), d, cb as usize, &streams[gi])?;
        pf.devices.push(DeviceFigures {
            gpu: d.0,
            ranks,
            dispatch_us: du,
            combine_us: cu,
            dispatch_bytes: db,
            combine_bytes: cb,
            dispatch_gbps: accounting::bandwidth_gbps_from_us(db, du),
            combine_gbps: accounting::bandwidth_gbps_from_us(cb, cu),
            copy_dispatch_gbps: copy_d,
            copy_combine_gbps: copy_c,
        });
    }
    for (li, &(r, d)) in local.iter().enumerate() {
        let gi = devices.iter().position(|&x| x == d).unwrap_or(0);
        let nodes = cfg.world_size / cfg.gpus_per_node.max(1);
        let algo = accounting::rdma_algo_token_count(&inp.idx[r], cfg.num_experts(), nodes.max(1), OutOfRange::Error)?;
        let (du, cu) = (t_disp[gi] / iters, t_comb[gi] / iters);
        let n = recv_counts[li] as u64;
        pf.ranks.push(RankFigures {
            rank: r,
            gpu: d.0,
            recv_tokens: recv_counts[li],
            rdma_algo_tokens: algo,
            rdma_physical_tokens: accounting::rdma_physical_tokens(algo, nodes as u64),
            dispatch_us: du,
            combine_us: cu,
            dispatch_bytes: n * d_tok,
            combine_bytes: n * c_tok,
            dispatch_gbps: accounting::bandwidth_gbps_from_us(n * d_tok, du),
            combine_gbps: accounting::bandwidth_gbps_from_us(n * c_tok, cu),
        });
    }
    // Gather to process 0.
    let all: Vec<ProcFigures> = match boot {
        Some(b) => b.allgather(&serde_json::to_vec(&pf)?)?.iter().map(|v| serde_json::from_slice(v)).collect::<Result<_, _>>()?,
        None => vec![pf],
    };
    let ok = all_ok && all.iter().all(|p| p.check.starts_with("OK") || p.check == "skipped");
    if a.proc_index == 0 {
        report(a, cfg, &all, host_s)?;
    }
    Ok(ok)
}

fn copy_gbps(rt: &dyn Runtime, d: Device, bytes: usize, s: &Stream) -> AnyResult<f64> {
    if bytes == 0 {
        return Ok(0.0);
    }
    let src = rt.alloc(d, bytes)?;
    let dst = rt.alloc(d, bytes)?;
    let (e0, e1) = (rt.event(d, true)?, rt.event(d, true)?);
    for _ in 0..3 {
        rt.copy_dtod_async(&dst.slice(), &src.slice(), s)?;
    }
    let n = 10;
    e0.record(s)?;
    for _ in 0..n {
        rt.copy_dtod_async(&dst.slice(), &src.slice(), s)?;
    }
    e1.record(s)?;
    s.synchronize()?;
    let us = e0.elapsed_ms(&e1)? as f64 * 1e3 / n as f64;
    Ok(accounting::bandwidth_gbps_from_us(bytes as u64, us))
}

#[allow(clippy::too_many_arguments)]
fn check_dispatch(
    ep: &IntranodeEp,
    rt: &dyn Runtime,
    local: &[(usize, Device)],
    orc: &[OracleRecv],
    a: &Args,
    idx_size: usize,
    counts: &[usize],
) -> AnyResult<()> {
    let cfg = ep.config();
    for (li, &(r, _)) in local.iter().enumerate() {
        let o = &orc[r];
        let n = counts[li];
        if n != o.src.len() {
            return Err(err(format!("rank {r} received {n} tokens, the oracle {}", o.src.len())));
        }
        let sl = ep.recv_slices(r, n, a.dtype.size(), idx_size)?;
        let mut got: Vec<Vec<u8>> = Vec::new();
        for s in &sl {
            let mut b = vec![0u8; s.len()];
            if !b.is_empty() {
                rt.copy_dtoh(&mut b, s)?;
            }
            got.push(b);
        }
        let src: Vec<usize> = got[4].chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| src[i]);
        let row = [a.hidden * a.dtype.size(), cfg.top_k * 4, cfg.top_k * idx_size, cfg.scale_dim * cfg.scale_type_size];
        let want = [&o.x, &o.w, &o.idx, &o.scales];
        let names = ["rows", "weights", "indices", "scales"];
        for (j, &gi) in order.iter().enumerate() {
            let sp = o.src[j];
            if src[gi] != sp.flat(cfg.max_tokens_per_rank) {
                return Err(err(format!("rank {r}: received source #{j} is {} , oracle {:?}", src[gi], sp)));
            }
            for k in 0..4 {
                let rb = row[k];
                if got[k][gi * rb..(gi + 1) * rb] != want[k][j * rb..(j + 1) * rb] {
                    return Err(err(format!("rank {r}: {} of token {:?} (slot {gi}) differ", names[k], sp)));
                }
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn check_combine(
    a: &Args,
    cfg: &EpConfig,
    inp: &Inputs,
    orc: &[OracleRecv],
    handle: &DispatchHandle,
    rt: &dyn Runtime,
    local: &[(usize, Device)],
    outs: &[(&DeviceBuffer, &DeviceBuffer)],
) -> AnyResult<()> {
    // Oracle combine over canonical order (the rows depend on the source only).
    let xs: Vec<Tensor2<f32>> =
        orc.iter().map(|o| Tensor2::from_fn(o.src.len(), a.hidden, |i, h| comb_value(o.src[i], h))).collect::<Result<_, _>>()?;
    let ws: Vec<Tensor2<f32>> = orc
        .iter()
        .map(|o| {
            let v: Vec<f32> = o.w.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            Tensor2::new(o.src.len(), cfg.top_k, v)
        })
        .collect::<Result<_, _>>()?;
    let opts = CombineOptions { weighting: if a.weighted { Weighting::RankSlotSum } else { Weighting::Unweighted }, ..Default::default() };
    let tol = if a.weighted { 1e-2f32 } else { 0.0 };
    let close = |g: f32, w: f32| if tol == 0.0 { g.to_bits() == w.to_bits() || g == w } else { (g - w).abs() <= tol * w.abs().max(1.0) };
    match a.combine_dtype {
        CombDType::Bf16 => {
            let xb: Vec<Tensor2<bf16>> = xs.iter().map(|t| t.map(|&v| bf16::from_f32(v))).collect();
            let want = combine::<bf16, bf16, i64>(cfg, handle, &xb, Some(&ws), &inp.idx, opts)?;
            compare_out(rt, local, outs, &want.iter().map(|c| (c.x.map(|v| v.to_f32()), c.weights.clone())).collect::<Vec<_>>(), 2, &close)
        }
        CombDType::F32 => {
            let want = combine::<f32, f32, i64>(cfg, handle, &xs, Some(&ws), &inp.idx, opts)?;
            compare_out(rt, local, outs, &want.iter().map(|c| (c.x.clone(), c.weights.clone())).collect::<Vec<_>>(), 4, &close)
        }
    }
}

type WantOut = (Tensor2<f32>, Option<Tensor2<f32>>);

fn compare_out(
    rt: &dyn Runtime,
    local: &[(usize, Device)],
    outs: &[(&DeviceBuffer, &DeviceBuffer)],
    want: &[WantOut],
    elem: usize,
    close: &dyn Fn(f32, f32) -> bool,
) -> AnyResult<()> {
    for (li, &(r, _)) in local.iter().enumerate() {
        let (wx, ww) = &want[r];
        let n = wx.as_slice().len();
        let mut b = vec![0u8; n * elem];
        if n > 0 {
            rt.copy_dtoh(&mut b, &outs[li].0.sub(0, n * elem)?)?;
        }
        for (i, &w) in wx.as_slice().iter().enumerate() {
            let g = if elem == 2 {
                bf16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f32()
            } else {
                f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            };
            if !close(g, w) {
                let h = wx.cols().max(1);
                return Err(err(format!("rank {r} token {} column {}: combine gave {g}, oracle {w}", i / h, i % h)));
            }
        }
        if let Some(ww) = ww {
            let m = ww.as_slice().len();
            let mut b = vec![0u8; m * 4];
            if m > 0 {
                rt.copy_dtoh(&mut b, &outs[li].1.sub(0, m * 4)?)?;
            }
            for (i, &w) in ww.as_slice().iter().enumerate() {
                let g = f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
                if (g - w).abs() > 1e-4 * w.abs().max(1.0) {
                    return Err(err(format!("rank {r} weight entry {i}: combine gave {g}, oracle {w}")));
                }
            }
        }
    }
    Ok(())
}

fn report(a: &Args, cfg: &EpConfig, all: &[ProcFigures], host_s: f64) -> AnyResult<()> {
    println!(
        "bench_dispatch_combine: world {} ({} per GPU, {} GPU(s), {} process(es)), T={} H={} E={} K={} dispatch {:?} combine {:?} idx {:?}, {} blocks x {} warps per rank, iters {} warm-up {}{}{}",
        cfg.world_size,
        cfg.world_size / a.num_gpus,
        a.num_gpus,
        a.procs,
        a.num_tokens,
        a.hidden,
        a.num_experts,
        a.top_k,
        a.dtype,
        a.combine_dtype,
        a.idx_type,
        cfg.block_num,
        cfg.warps_per_block,
        a.iters,
        a.warmup,
        if a.l2_flush { ", L2 flushed" } else { "" },
        if a.weighted { ", weighted combine" } else { "" },
    );
    let mut ranks: Vec<&RankFigures> = all.iter().flat_map(|p| p.ranks.iter()).collect();
    ranks.sort_by_key(|r| r.rank);
    for r in &ranks {
        println!("rank {} recv {} tokens {} rdma tokens", r.rank, r.recv_tokens, r.rdma_algo_tokens);
    }
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(vec![
        "rank",
        "gpu",
        "recv tokens",
        "rdma algo",
        "rdma phys",
        "dispatch µs",
        "combine µs",
        "dispatch XGMI GB/s",
        "combine XGMI GB/s",
    ]);
    for r in &ranks {
        t.add_row(vec![
            r.rank.to_string(),
            r.gpu.to_string(),
            r.recv_tokens.to_string(),
            r.rdma_algo_tokens.to_string(),
            format!("{:.0}", r.rdma_physical_tokens),
            format!("{:.1}", r.dispatch_us),
            format!("{:.1}", r.combine_us),
            format!("{:.1}", r.dispatch_gbps),
            format!("{:.1}", r.combine_gbps),
        ]);
    }
    println!("{t}");
    let mut d = Table::new();
    d.load_preset(UTF8_BORDERS_ONLY);
    d.set_header(vec![
        "gpu",
        "ranks",
        "dispatch µs",
        "dispatch GB/s",
        "copy GB/s",
        "dispatch/copy",
        "combine µs",
        "combine GB/s",
        "copy GB/s",
        "combine/copy",
    ]);
    for p in all {
        for g in &p.devices {
            d.add_row(vec![
                g.gpu.to_string(),
                format!("{:?}", g.ranks),
                format!("{:.1}", g.dispatch_us),
                format!("{:.1}", g.dispatch_gbps),
                format!("{:.1}", g.copy_dispatch_gbps),
                format!("{:.2}", g.dispatch_gbps / g.copy_dispatch_gbps.max(1e-9)),
                format!("{:.1}", g.combine_us),
                format!("{:.1}", g.combine_gbps),
                format!("{:.1}", g.copy_combine_gbps),
                format!("{:.2}", g.combine_gbps / g.copy_combine_gbps.max(1e-9)),
            ]);
        }
    }
    println!("per GPU (bytes of all received tokens on the GPU; copy = cuMemcpyDtoD of the same byte count, same run):");
    println!("{d}");
    for (i, p) in all.iter().enumerate() {
        println!("check (process {i}): {}", p.check);
    }
    println!("host inputs + oracle: {host_s:.1} s");
    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "world_size": cfg.world_size, "num_gpus": a.num_gpus, "procs": a.procs,
            "num_tokens": a.num_tokens, "hidden": a.hidden, "num_experts": a.num_experts, "top_k": a.top_k,
            "dtype": a.dtype, "combine_dtype": a.combine_dtype, "block_num": cfg.block_num,
            "warps_per_block": cfg.warps_per_block, "iters": a.iters, "l2_flush": a.l2_flush, "weighted": a.weighted,
            "processes": all,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_bytes_are_little_endian_as_on_the_gpu() {
        let t = |v: Vec<u8>| v;
        assert_eq!(bytes_of(&Tensor2::new(1, 2, vec![1.0f32, -2.0]).unwrap()), t(vec![0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]));
        assert_eq!(bytes_of(&Tensor2::new(1, 1, vec![bf16::from_f32(1.0)]).unwrap()), t(vec![0x80, 0x3f]));
        assert_eq!(bytes_of(&Tensor2::new(1, 2, vec![Fp8E4m3(0x38), Fp8E4m3(0xb8)]).unwrap()), t(vec![0x38, 0xb8]));
        assert_eq!(bytes_of(&Tensor2::new(1, 1, vec![-1i32]).unwrap()), t(vec![0xff; 4]));
        assert_eq!(bytes_of(&Tensor2::new(1, 1, vec![258i64]).unwrap()), t(vec![2, 1, 0, 0, 0, 0, 0, 0]));
    }
}
