//! The command line: flags, their checks (every refusal names the user's flags, before any
//! GPU or network is touched) and the [`EpConfig`] they build.

use clap::Parser;
use mori_bootstrap::BootstrapEnv;
use mori_ep::EpConfig;
use std::net::{IpAddr, SocketAddr};

pub use crate::arg_types::*;

/// Most TCP lanes per peer MORI-IO's tcp backend takes.
pub const MAX_LANES: usize = 64;

pub type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

pub fn err(msg: impl Into<String>) -> Box<dyn std::error::Error> {
    msg.into().into()
}

/// The environment variables the inter-node GPU path reads (`--help`).
const ENV_HELP: &str = "Environment (inter-node on GPUs, --num-nodes above 1):
  CUDA_DEVICE_MAX_CONNECTIONS   hardware queues for the job's streams; set to 32 when unset over xgmi
                                (the run refuses fewer than 2 x ranks + nodes)
  MORI_EP_PROXY_SESSIONS=0      the proxies post ordered batches through the engine's one-shot calls
                                instead of a MORI-IO session per destination (the default, where the
                                backend takes them: xgmi); the proxies' line counts those over sessions
  MORI_EP_PROXY_TAIL_WORDS      0 | single | all: which bursts send each counter pair as two tail words
                                stored after the segment (xgmi: a copy-engine copy, then one stream
                                batch) instead of copying it from the window in the ordered-copy
                                launch (default 0; single: bursts to one destination; the proxies'
                                line counts them)
  MORI_EP_PROXY_GROUPED=0       one engine call per destination instead of a burst's batches in one
  MORI_GPU_POOL_ORDERED_KERNEL=0
                                an ordered batch as one copy per segment instead of one launch of the
                                ordered-copy kernel
  MORI_GPU_POOL_ARMED           refused above 0 over xgmi (armed launches stall under the EP load)
  MORI_GPU_POOL_RESIDENT        blocks of a resident copier per proxy engine (default 0: each ordered
                                batch is a launch): a grid that stays on the GPU and runs the batches
                                the proxies write into host memory; the copy pools' line counts them,
                                the resident copier's line times them (GPU clock stamps)
  MORI_GPU_POOL_RESIDENT_CARVEOUT
                                its grid's shared-memory split, percent of the largest (default 100;
                                -1: the driver's choice)";

/// MORI-EP dispatch/combine benchmark, checked against the host reference: the GPU kernels
/// (`--device gpu`: intranode, or V1 / V1-LL / AsyncLL across nodes with every rank on one
/// GPU) or the host implementation (`--device cpu`, intra- and inter-node).
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_dispatch_combine", after_long_help = ENV_HELP)]
pub struct Args {
    /// Where the ranks run: the GPU kernels or the host implementation.
    #[arg(long, value_enum, default_value = "gpu")]
    pub device: DeviceArg,
    /// Tokens per rank T.
    #[arg(long = "num-tokens", alias = "max-tokens", default_value_t = 4096)]
    pub num_tokens: usize,
    /// Hidden size H (elements).
    #[arg(long, default_value_t = 7168)]
    pub hidden: usize,
    /// Experts in total E (split evenly over the ranks).
    #[arg(long = "num-experts", default_value_t = 256)]
    pub num_experts: usize,
    /// Top-k K.
    #[arg(long = "top-k", alias = "topk", default_value_t = 8)]
    pub top_k: usize,
    /// Dispatch dtype (fp8: E4M3 rows + f32 scales per 128 columns).
    #[arg(long, value_enum, default_value = "fp8")]
    pub dtype: DType,
    /// Combine dtype (input and output).
    #[arg(long = "combine-dtype", value_enum, default_value = "bf16")]
    pub combine_dtype: CombDType,
    /// Expert id type.
    #[arg(long = "idx-type", value_enum, default_value = "i64")]
    pub idx_type: IdxType,
    /// EP ranks W. Default 8; with --device cpu under a launcher (no --local): the launcher's
    /// processes x --ranks-per-proc.
    #[arg(long = "world-size")]
    world_size_flag: Option<usize>,
    /// EP ranks W, resolved.
    #[arg(skip)]
    pub world_size: usize,
    /// GPUs used (rank r on GPU r / (W / G)).
    #[arg(long = "num-gpus", default_value_t = 1, conflicts_with = "ranks_per_gpu")]
    pub num_gpus: usize,
    /// Ranks sharing each GPU (the other way to say --num-gpus: G = W / this).
    #[arg(long = "ranks-per-gpu")]
    pub ranks_per_gpu: Option<usize>,
    /// GPU: processes (this one and P-1 spawned); each hosts W/P consecutive ranks.
    #[arg(long, default_value_t = 1)]
    pub procs: usize,
    /// GPUs (ranks) per node; ranks [n*g, (n+1)*g) form node n. Default: W (one node); with
    /// --device cpu under a launcher, its processes per node (LOCAL_WORLD_SIZE,
    /// OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE) x --ranks-per-proc.
    #[arg(long = "gpus-per-node")]
    pub gpus_per_node: Option<usize>,
    /// Nodes N (sets --gpus-per-node to W / N).
    #[arg(long = "num-nodes")]
    pub num_nodes: Option<usize>,
    /// GPUs (ranks) per node, resolved.
    #[arg(skip)]
    pub gpn: usize,
    /// Where `gpn` came from when neither --num-nodes nor --gpus-per-node gave it (the
    /// launcher's processes per node, or one node without a launcher), for messages.
    #[arg(skip)]
    pub gpn_from: String,
    /// Kernel family. Default: intranode on one node, v1 on several. On GPUs across nodes v1,
    /// v1_ll and async_ll run every rank on GPU 0 (the nodes as groups of ranks).
    #[arg(long = "kernel-type", value_enum)]
    pub kernel_type: Option<KernelTypeArg>,
    /// Thread blocks per rank (all ranks' blocks on a GPU must fit its multiprocessors).
    /// Default: GPU 128 / ranks per GPU, at most 64; CPU the kernel family's. V1 kernels give
    /// two thirds of them to RDMA.
    #[arg(long = "block-num")]
    pub block_num: Option<usize>,
    /// Warps per block. Default: the kernel family's (16 intranode, 8 otherwise).
    #[arg(long = "warps-per-block")]
    pub warps_per_block: Option<usize>,
    /// CPU: run every rank on this host, one spawned process per --ranks-per-proc ranks
    /// (without it, this process is one of those a launcher started: torchrun, srun, mpirun).
    #[arg(long)]
    pub local: bool,
    /// CPU: EP ranks per process; process p hosts ranks [p*R, (p+1)*R). Default 1.
    #[arg(long = "ranks-per-proc")]
    pub ranks_per_proc: Option<usize>,
    /// Transport of the inter-node leg. CPU: tcp (default) or rdma; GPU v1/v1_ll/async_ll: xgmi when
    /// not given, or tcp (the kernels stage into pinned host memory).
    #[arg(long, value_enum)]
    pub transport: Option<TransportArg>,
    /// TCP lanes of the inter-node leg (CPU, or GPU v1/v1_ll/async_ll with --transport tcp). Default 4.
    #[arg(long)]
    pub lanes: Option<usize>,
    /// GPU v1/v1_ll/async_ll: how long each rank's proxy thread keeps polling an idle command ring
    /// before it starts sleeping, µs. Default 200000.
    #[arg(long = "proxy-spin-us")]
    pub proxy_spin_us: Option<u64>,
    /// GPU v1/v1_ll/async_ll over xgmi: store every combine row where it goes with a staging
    /// kernel (this node's sources' by P2P store, the others' for the proxy or the relays),
    /// instead of putting the combine input into the window as rows that the kernels and the
    /// proxy read there in place (the default).
    #[arg(long = "combine-staging")]
    pub combine_staging: bool,
    /// GPU v1/v1_ll/async_ll: copy the received records out of the window into contiguous
    /// output buffers with a kernel (the copy-out), instead of reading them from the window
    /// where they landed (the default).
    #[arg(long = "recv-copy-out")]
    pub recv_copy_out: bool,
    /// GPU v1/v1_ll/async_ll: call the device-resident API (`dispatch_device`,
    /// `combine_device`: inputs in GPU buffers, the records and the combine input where the
    /// kernels use them) instead of the host-bytes one; the host time per call then shows what
    /// the device calls cost the host. Not with --recv-copy-out.
    #[arg(long = "device-api")]
    pub device_api: bool,
    /// GPU v1/v1_ll/async_ll: blocks per rank of the kernels that wait for nothing (dispatch's
    /// staging and copy-out, combine's staging and sum, the V1/V1-LL relay's partial sums), so
    /// they are not bound by the co-resident grid. Default 64.
    #[arg(long = "copy-blocks")]
    pub copy_blocks: Option<u32>,
    /// CPU: tokens per inter-node signalled write (the leg's message size is this many
    /// records). Default 32.
    #[arg(long = "chunk-tokens")]
    pub chunk_tokens: Option<usize>,
    /// CPU: IP address the MORI-IO engines bind. Default 127.0.0.1.
    #[arg(long)]
    pub host: Option<IpAddr>,
    /// (test) CPU: delay every inter-node put by up to this many µs (seeded by --seed).
    #[arg(long = "inject-delay-us", hide = true)]
    pub inject_delay_us: Option<u64>,
    /// (test) CPU: let injected delays reorder inter-node puts.
    #[arg(long = "inject-reorder", hide = true)]
    pub inject_reorder: bool,
    /// CPU, or GPU v1/v1_ll/async_ll: these ranks dispatch no tokens (comma-separated ranks; a
    /// routing shape for tests and for timing one direction of the inter-node leg).
    #[arg(long = "zero-token-ranks", value_delimiter = ',')]
    pub zero_token_ranks: Vec<usize>,
    /// CPU: every N-th token of every rank routes nowhere (all top-k ids -1).
    #[arg(long = "none-rows-every")]
    pub none_rows_every: Option<usize>,
    /// CPU, or GPU v1/v1_ll/async_ll: these ranks route every token to experts on other nodes
    /// only (comma-separated ranks; the inter-node leg with no intra-node copies beside it).
    /// Needs 2+ nodes.
    #[arg(long = "remote-only-ranks", value_delimiter = ',')]
    pub remote_only_ranks: Vec<usize>,
    /// (test) CPU: the process hosting this rank kills itself (SIGKILL) inside its second
    /// dispatch, before its first rank issues its puts, while the others are in theirs; they
    /// must fail naming it within --timeout-ms. --inject-kill-at picks another point.
    #[arg(long = "inject-kill-rank", hide = true)]
    pub inject_kill_rank: Option<usize>,
    /// (test) CPU: where --inject-kill-rank strikes. Default dispatch.
    #[arg(long = "inject-kill-at", value_enum, hide = true, requires = "inject_kill_rank")]
    pub inject_kill_at: Option<KillAt>,
    /// Timed iterations.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// GPU: overwrite a 256 MiB buffer before each timed operation (cold L2).
    #[arg(long = "l2-flush")]
    pub l2_flush: bool,
    /// Weighted combine (each rank's row scaled by the token's weights on that rank's experts).
    #[arg(long)]
    pub weighted: bool,
    /// Skip the oracle check.
    #[arg(long = "no-check")]
    pub no_check: bool,
    /// GPU: Perfetto JSON of per-block phase timestamps of the last iteration: intranode, one
    /// file (rank 0's process); v1/v1_ll/async_ll, one file per rank, PATH with `.rank<R>` before its
    /// extension (`mori trace analyze` reads either).
    #[arg(long)]
    pub trace: Option<String>,
    /// All figures as JSON.
    #[arg(long)]
    pub json: Option<String>,
    /// Routing seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Deadline of every in-kernel (GPU) or transfer (CPU) wait, ms.
    #[arg(long = "timeout-ms", default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// (internal) index of this process when spawned.
    #[arg(long = "proc-index", hide = true, default_value_t = 0)]
    pub proc_index: usize,
    /// (internal) bootstrap root address of spawned processes.
    #[arg(long = "proc-master", hide = true)]
    pub proc_master: Option<SocketAddr>,
    /// CPU: the launcher's environment (no --local), resolved.
    #[arg(skip)]
    pub launch: Option<BootstrapEnv>,
}

impl Args {
    /// CPU ranks per process, resolved.
    pub fn rpp(&self) -> usize {
        self.ranks_per_proc.unwrap_or(1)
    }

    /// CPU processes in all.
    pub fn cpu_procs(&self) -> usize {
        self.world_size / self.rpp().max(1)
    }

    /// Nodes, resolved.
    pub fn nodes(&self) -> usize {
        self.world_size / self.gpn.max(1)
    }
}

/// Fills in the resolved fields (world size, GPUs, ranks per node; under a launcher its
/// environment, read through `vars`) and checks the flags of the other device. `vars` is the
/// process environment outside tests.
pub fn resolve(mut a: Args, vars: &dyn Fn(&str) -> Option<String>) -> AnyResult<Args> {
    let cpu = a.device == DeviceArg::Cpu;
    if cpu {
        for (given, flag) in [
            (a.procs != 1, "--procs"),
            (a.num_gpus != 1, "--num-gpus"),
            (a.ranks_per_gpu.is_some(), "--ranks-per-gpu"),
            (a.l2_flush, "--l2-flush"),
            (a.trace.is_some(), "--trace"),
        ] {
            if given {
                return Err(err(format!(
                    "{flag} is a --device gpu flag; with --device cpu use --local and --ranks-per-proc to place the ranks"
                )));
            }
        }
    } else {
        for (given, flag) in [
            (a.local, "--local"),
            (a.ranks_per_proc.is_some(), "--ranks-per-proc"),
            (a.host.is_some(), "--host"),
            (a.chunk_tokens.is_some(), "--chunk-tokens"),
            (a.none_rows_every.is_some(), "--none-rows-every"),
            (
                a.inject_delay_us.is_some() || a.inject_reorder || a.inject_kill_rank.is_some(),
                "--inject-delay-us/--inject-reorder/--inject-kill-rank",
            ),
        ] {
            if given {
                return Err(err(format!("{flag} is a --device cpu flag (the GPU path places ranks with --procs and --num-gpus)")));
            }
        }
    }
    let rpp = a.rpp();
    if rpp == 0 {
        return Err(err("--ranks-per-proc 0: every process hosts at least one rank"));
    }
    if a.none_rows_every == Some(0) {
        return Err(err("--none-rows-every 0: give N >= 1 (every N-th token routes nowhere)"));
    }
    if a.chunk_tokens == Some(0) {
        return Err(err("--chunk-tokens 0: each inter-node write carries at least one token"));
    }
    if let Some(l) = a.lanes.filter(|l| !(1..=MAX_LANES).contains(l)) {
        return Err(err(format!("--lanes {l}: the inter-node leg takes 1..={MAX_LANES} TCP lanes per peer")));
    }
    if a.transport == Some(TransportArg::Rdma) && a.lanes.is_some() {
        return Err(err("--lanes with --transport rdma: lanes are TCP connections (--transport tcp); RDMA uses the NIC's queue pairs"));
    }
    if a.inject_reorder && a.inject_delay_us.is_none() {
        return Err(err("--inject-reorder needs --inject-delay-us (the delays are what reorders the puts)"));
    }
    // World size: the flag, else under a launcher its processes x ranks per process.
    let mut local_procs = None;
    if cpu && !a.local {
        let env = BootstrapEnv::parse(&|k: &str| vars(k)).map_err(|e| {
            err(format!(
                "--device cpu without --local runs as one process of a launcher (torchrun, srun, mpirun, or MORI_RANK/MORI_WORLD_SIZE/MASTER_ADDR): {e}; pass --local to spawn every rank's process on this host"
            ))
        })?;
        let w = env.world_size * rpp;
        match a.world_size_flag {
            Some(f) if f != w => {
                return Err(err(format!(
                    "--world-size {f} disagrees with the launcher's {} processes ({:?}) x --ranks-per-proc {rpp} = {w} ranks",
                    env.world_size, env.launcher
                )))
            }
            _ => a.world_size = w,
        }
        local_procs = ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"]
            .iter()
            .find_map(|k| vars(k).and_then(|v| v.trim().parse::<usize>().ok().map(|n| (*k, n))));
        a.launch = Some(env);
    } else {
        a.world_size = a.world_size_flag.unwrap_or(8);
    }
    let w = a.world_size;
    if w == 0 {
        return Err(err("--world-size 0: at least one rank"));
    }
    if let Some(&r) = a.zero_token_ranks.iter().find(|&&r| r >= w) {
        return Err(err(format!("--zero-token-ranks {r}: not a rank of --world-size {w} (0..={})", w - 1)));
    }
    if let Some(r) = a.inject_kill_rank.filter(|&r| r >= w) {
        return Err(err(format!("--inject-kill-rank {r}: not a rank of --world-size {w} (0..={})", w - 1)));
    }
    if let (Some(r), Some(at @ (KillAt::Bootstrap | KillAt::Setup))) = (a.inject_kill_rank, a.inject_kill_at) {
        if a.local && r < rpp {
            return Err(err(format!(
                "--inject-kill-rank {r} with --inject-kill-at {at:?}: rank {r} is hosted by process 0, the --local parent that supervises the others (pick a rank of another process)"
            )));
        }
    }
    if let Some(&r) = a.remote_only_ranks.iter().find(|&&r| r >= w) {
        return Err(err(format!("--remote-only-ranks {r}: not a rank of --world-size {w} (0..={})", w - 1)));
    }
    for (flag, v) in [("--zero-token-ranks", &a.zero_token_ranks), ("--remote-only-ranks", &a.remote_only_ranks)] {
        if let Some(r) = v.iter().enumerate().find(|&(i, r)| v[..i].contains(r)).map(|(_, r)| r) {
            return Err(err(format!("{flag}: rank {r} given twice")));
        }
    }
    if let Some(r) = a.remote_only_ranks.iter().find(|r| a.zero_token_ranks.contains(r)) {
        return Err(err(format!(
            "rank {r} is in both --zero-token-ranks and --remote-only-ranks: a rank without tokens routes none (give it one of the two)"
        )));
    }
    if cpu && !w.is_multiple_of(rpp) {
        return Err(err(format!("--ranks-per-proc {rpp} must divide --world-size {w}")));
    }
    if let Some(r) = a.ranks_per_gpu {
        if r == 0 || !w.is_multiple_of(r) {
            return Err(err(format!("--ranks-per-gpu {r} must divide --world-size {w}")));
        }
        a.num_gpus = w / r;
    }
    // Ranks per node: --num-nodes, --gpus-per-node (consistent when both), the launcher's
    // processes per node, else one node.
    a.gpn = match (a.num_nodes, a.gpus_per_node) {
        (Some(n), g) => {
            if n == 0 || !w.is_multiple_of(n) {
                return Err(err(format!("--num-nodes {n} must divide --world-size {w}")));
            }
            if let Some(g) = g.filter(|&g| g != w / n) {
                return Err(err(format!(
                    "--num-nodes {n} and --gpus-per-node {g} disagree: --world-size {w} over {n} nodes is {} per node",
                    w / n
                )));
            }
            w / n
        }
        (None, Some(g)) => g,
        (None, None) => match local_procs {
            Some((var, n)) => {
                let g = n * rpp;
                if g == 0 || !w.is_multiple_of(g) {
                    return Err(err(format!(
                        "{var}={n} processes per node x --ranks-per-proc {rpp} = {g} ranks per node must divide the {w} ranks (give --num-nodes)"
                    )));
                }
                a.gpn_from = format!("{var}={n} processes per node x --ranks-per-proc {rpp}");
                g
            }
            None => {
                a.gpn_from = "none of --num-nodes, --gpus-per-node or a launcher gave a count".to_string();
                w
            }
        },
    };
    if a.gpn == 0 || !w.is_multiple_of(a.gpn) {
        return Err(err(format!("--gpus-per-node {} must divide --world-size {w}", a.gpn)));
    }
    if !a.remote_only_ranks.is_empty() && a.gpn == w {
        return Err(err("--remote-only-ranks with one node: there are no experts on other nodes (give --num-nodes 2 or more)"));
    }
    let others = a.num_experts - a.num_experts / a.nodes().max(1);
    if !a.remote_only_ranks.is_empty() && others < a.top_k {
        return Err(err(format!(
            "--remote-only-ranks with --top-k {}: the other nodes hold {others} of the {} experts, fewer than top-k (each token picks distinct experts there)",
            a.top_k, a.num_experts
        )));
    }
    Ok(a)
}

/// The configuration the flags describe; every refusal names the user's flags.
pub fn config(a: &Args) -> AnyResult<EpConfig> {
    let w = a.world_size;
    let gpu = a.device == DeviceArg::Gpu;
    if gpu {
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
    } else if a.launch.is_none() && a.proc_index >= a.cpu_procs() {
        return Err(err(format!("--proc-index {} is not below the {} processes", a.proc_index, a.cpu_procs())));
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
    let row = a.hidden.saturating_mul(a.dtype.size());
    if !row.is_multiple_of(16) {
        return Err(err(format!(
            "--hidden {} with --dtype {}: a row is {} elements x {} B = {row} B, not a multiple of 16 B (rows move as 16-byte vectors); give --hidden a multiple of {}",
            a.hidden,
            a.dtype.name(),
            a.hidden,
            a.dtype.size(),
            16 / a.dtype.size()
        )));
    }
    let gpn = a.gpn;
    let nodes = a.nodes();
    // The kernel type and its launch defaults follow the node count of these flags.
    let mut cfg = EpConfig::with_gpus_per_node(w, gpn, a.hidden, a.num_experts, a.top_k, a.num_tokens)?;
    let kt = a.kernel_type.unwrap_or(KernelTypeArg::of(cfg.kernel_type));
    let nodes_flags = || match (a.num_nodes, a.gpus_per_node) {
        (Some(n), _) => format!("--world-size {w} and --num-nodes {n}"),
        (None, Some(g)) => format!("--world-size {w} and --gpus-per-node {g}"),
        (None, None) => format!("--world-size {w} ({gpn} ranks per node: {})", a.gpn_from),
    };
    if kt == KernelTypeArg::Intranode && nodes > 1 {
        return Err(err(format!(
            "--kernel-type intranode with {} ({nodes} nodes): intranode needs all ranks on one node (use --kernel-type v1, v1_ll or async_ll)",
            nodes_flags()
        )));
    }
    // The GPU inter-node kernels: v1, v1_ll and async_ll.
    let inter_gpu = gpu && kt != KernelTypeArg::Intranode;
    if inter_gpu && nodes < 2 {
        return Err(err(format!(
            "--kernel-type {} on GPUs runs across nodes, but {} is one node (give --num-nodes 2 or more; one node: --kernel-type intranode)",
            kt.name(),
            nodes_flags()
        )));
    }
    if gpu && !inter_gpu && (!a.zero_token_ranks.is_empty() || !a.remote_only_ranks.is_empty()) {
        return Err(err(format!(
            "--zero-token-ranks/--remote-only-ranks shape the routing of the host executor (--device cpu) and of the GPU inter-node kernels (--kernel-type v1, v1_ll or async_ll); not of --kernel-type {}",
            kt.name()
        )));
    }
    if !inter_gpu && (a.proxy_spin_us.is_some() || a.copy_blocks.is_some() || a.combine_staging || a.recv_copy_out || a.device_api) {
        return Err(err(format!(
            "--proxy-spin-us/--copy-blocks/--combine-staging/--recv-copy-out/--device-api apply to the GPU inter-node kernels (--kernel-type v1, v1_ll or async_ll on GPUs) and their proxies; this run is not one of them ({})",
            if gpu { format!("--kernel-type {}", kt.name()) } else { "--device cpu: the host executor".to_string() }
        )));
    }
    if a.device_api && a.recv_copy_out {
        return Err(err(
            "--device-api leaves the received records in the window; --recv-copy-out copies them out: give one of them".to_string()
        ));
    }
    if let Some(t) = a.transport.filter(|_| a.combine_staging) {
        return Err(err(format!(
            "--combine-staging chooses how combine over xgmi hands its rows on (a staging kernel stores them, instead of the kernels and the proxy reading the input in the window); --transport {} always stages them: drop one of the two",
            match t {
                TransportArg::Tcp => "tcp",
                TransportArg::Rdma => "rdma",
            }
        )));
    }
    if let Some(v) = a.proxy_spin_us.filter(|&v| v > 10_000_000) {
        return Err(err(format!("--proxy-spin-us {v}: at most 10000000 µs")));
    }
    if let Some(c) = a.copy_blocks.filter(|c| !(1..=1024).contains(c)) {
        return Err(err(format!("--copy-blocks {c}: give 1..=1024 blocks per rank")));
    }
    if gpu && !inter_gpu && (a.transport.is_some() || a.lanes.is_some()) {
        return Err(err(
            "--transport/--lanes on GPUs choose the inter-node leg of --kernel-type v1, v1_ll or async_ll across nodes; intranode has none",
        ));
    }
    if gpu && a.transport == Some(TransportArg::Rdma) {
        return Err(err("--transport rdma on GPUs: not built (no machine here has a GPU and an RDMA NIC); the GPU inter-node leg is xgmi (no --transport) or --transport tcp"));
    }
    if gpu && a.lanes.is_some() && a.transport != Some(TransportArg::Tcp) {
        return Err(err("--lanes on GPUs sets the TCP lanes of --transport tcp; without it the inter-node leg is xgmi, which has none"));
    }
    if inter_gpu && w > mori_ep::gpu_internode::MAX_WORLD {
        return Err(err(format!(
            "--world-size {w}: the inter-node GPU kernels address at most {} ranks",
            mori_ep::gpu_internode::MAX_WORLD
        )));
    }
    if inter_gpu && a.transport.is_none() {
        mori_ep::gpu_internode::refuse_armed_launches().map_err(|e| err(e.to_string()))?;
        let need = mori_ep::gpu_internode::needed_connections(w, nodes);
        if need > 32 {
            let per_rank = mori_ep::gpu_internode::XGMI_COPY_STREAMS;
            let most = mori_ep::gpu_internode::max_xgmi_ranks(nodes);
            return Err(err(format!(
                "--world-size {w} over xgmi: {need} streams ({per_rank} copy streams per rank and one kernel stream per node) but CUDA gives at most 32 hardware queues; at most {most} ranks in {nodes} nodes, or use --transport tcp"
            )));
        }
    }
    cfg.set_kernel_type(kt.kernel_type());
    cfg.max_token_type_size = a.dtype.size().max(a.combine_dtype.size());
    if a.dtype == DType::Fp8 {
        cfg.scale_dim = a.hidden.div_ceil(128);
        cfg.scale_type_size = 4;
    }
    let block_num = match a.block_num {
        Some(b) => b,
        None if gpu => (128 / (w / a.num_gpus)).clamp(1, 64),
        None => cfg.block_num,
    };
    if block_num == 0 {
        return Err(err("--block-num 0: at least one block"));
    }
    if cfg.kernel_type.uses_rdma_blocks() && block_num < 2 {
        let why = if gpu {
            " (the configuration keeps MORI's split, which EpConfig checks, though the GPU kernels here do not use it)"
        } else {
            ""
        };
        return Err(err(format!(
            "--block-num {block_num} with --kernel-type {0} leaves no XGMI block: {0} splits its blocks into RDMA and XGMI blocks{why} (give --block-num 2 or more)",
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
