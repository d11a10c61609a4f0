//! Command-line arguments of `mori` (clap).

use clap::{Args, Parser, Subcommand, ValueEnum};
use mori_cli::topo::Vendor;
use std::path::PathBuf;

const EXIT_HELP: &str = "Exit status: 0 yes / done; 1 no (backend cannot work, pairs flagged, group worse than allowed) \
or not possible here (no GPU runtime on this machine, a GPU call failed); 2 bad input or usage.";

#[derive(Parser)]
#[command(name = "mori", version, about = "MORI node checks, topology, models and EP trace analysis", after_help = EXIT_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Runtimes, devices, engine backend verdicts and environment; exit 1 when --backend cannot work.
    Check(CheckArgs),
    /// GPU/GPU and GPU/NIC link classes from sysfs or a captured nvidia-smi / rocm-smi matrix.
    Topo(TopoArgs),
    /// Peer-copy bandwidth per ordered GPU pair, cross-checked against the topology.
    PeerBw(PeerBwArgs),
    /// Analytic models (labelled as such): staged vs direct copies, injection ceiling.
    #[command(subcommand)]
    Model(ModelCmd),
    /// EP kernel traces (Perfetto JSON).
    #[command(subcommand)]
    Trace(TraceCmd),
    /// RDMA bytes and observed bandwidth of internode dispatch/combine, interpreted.
    RdmaUtil(RdmaArgs),
}

#[derive(Args)]
pub struct Common {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct CheckArgs {
    /// Backend whose usability sets the exit status.
    #[arg(long, value_parser = ["xgmi", "fabric", "rdma", "tcp"])]
    pub backend: Option<String>,
    /// Memory the requested backend must move.
    #[arg(long, value_parser = ["host", "gpu"], default_value = "host")]
    pub memory: String,
    /// Root under which sys/, proc/ and dev/ are read.
    #[arg(long, default_value = "/")]
    pub sysfs_root: PathBuf,
    #[command(flatten)]
    pub c: Common,
}

#[derive(Args)]
pub struct TopoArgs {
    /// A captured `nvidia-smi topo -m` or `rocm-smi --showtopo` (default: read sysfs).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Which vendor's format --input is in.
    #[arg(long, value_enum, default_value = "auto")]
    pub vendor: Vendor,
    /// Root under which sys/ is read when there is no --input.
    #[arg(long, default_value = "/")]
    pub sysfs_root: PathBuf,
    /// A proposed parallel group of GPU indices, e.g. 0,1,2,3: prints its worst class.
    #[arg(long)]
    pub group: Option<String>,
    /// With --group: exit 1 when the worst class is worse than this (e.g. direct-link).
    #[arg(long, requires = "group")]
    pub max_class: Option<String>,
    #[command(flatten)]
    pub c: Common,
}

#[derive(Args)]
pub struct PeerBwArgs {
    /// Measurements taken elsewhere: {"measurements":[{"src","dst","bytes","gbps","peer_access","wrong_bytes"}]}
    /// (the --json output of a measuring run is such a file). Without it, every ordered pair of
    /// this machine's GPUs is measured (needs a GPU runtime).
    #[arg(long)]
    pub measurements: Option<PathBuf>,
    /// Bytes per copy, comma-separated (B, KiB, MiB, GiB; KB, MB, GB): each measured for every pair.
    #[arg(long, default_value = "1MiB,16MiB,256MiB", conflicts_with = "measurements")]
    pub sizes: String,
    /// Timed copies per pair and size.
    #[arg(long, default_value_t = 20, conflicts_with = "measurements")]
    pub iters: u32,
    /// Untimed copies before the timed ones.
    #[arg(long, default_value_t = 3, conflicts_with = "measurements")]
    pub warmup: u32,
    /// Topology to check them against (captured matrix; default: sysfs).
    #[arg(long)]
    pub topo: Option<PathBuf>,
    /// Format of --topo.
    #[arg(long, value_enum, default_value = "auto")]
    pub vendor: Vendor,
    /// Root under which sys/ is read when there is no --topo.
    #[arg(long, default_value = "/")]
    pub sysfs_root: PathBuf,
    /// Most a PCIe or host-staged copy reaches, GB/s per direction (default: PCIe Gen5 x16).
    #[arg(long, default_value_t = 64.0)]
    pub pcie_ceiling_gbs: f64,
    /// Pairs below this fraction of their class median are outliers.
    #[arg(long, default_value_t = 0.5)]
    pub outlier_fraction: f64,
    #[command(flatten)]
    pub c: Common,
}

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Staged-through-host vs direct copy: serial sum, pipelined bound, crossover PCIe bandwidth.
    Staging {
        /// Message size, bytes (1..=1e18).
        #[arg(long)]
        bytes: f64,
        /// PCIe bandwidth per side, GB/s (1e-6..=1e6).
        #[arg(long)]
        pcie_gbs: f64,
        /// Network bandwidth, GB/s (1e-6..=1e6).
        #[arg(long)]
        net_gbs: f64,
        #[command(flatten)]
        c: Common,
    },
    /// Injection ceiling: per-GPU share, ratio to scale-up, adapters for a target ratio.
    Injection {
        /// GPUs per node.
        #[arg(long)]
        gpus_per_node: u32,
        /// Network adapters per node.
        #[arg(long)]
        nics_per_node: u32,
        /// Bandwidth per adapter, GB/s (1e-6..=1e6).
        #[arg(long)]
        nic_gbs: f64,
        /// Scale-up bandwidth per GPU, GB/s (1e-6..=1e6).
        #[arg(long)]
        scaleup_gbs: f64,
        /// Target per-GPU share / scale-up ratio (1e-6..=1e6): prints the fewest adapters reaching it.
        #[arg(long)]
        target_ratio: Option<f64>,
        #[command(flatten)]
        c: Common,
    },
}

#[derive(Subcommand)]
pub enum TraceCmd {
    /// Per-iteration kernel start/end/duration, per-kernel aggregates, timeline PNG.
    Analyze {
        /// trace_rank_*.json from the EP profiler.
        trace: PathBuf,
        /// PNG path (default: <trace>.timeline.png next to the trace).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Do not draw the PNG.
        #[arg(long, conflicts_with = "out")]
        no_png: bool,
        #[command(flatten)]
        c: Common,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DType {
    Bf16,
    Fp8,
    F32,
}

#[derive(Args)]
pub struct RdmaArgs {
    /// Take the spans from this trace (mean over iterations).
    #[arg(long, conflicts_with_all = ["send_us", "combine_us", "recv_us", "sync_us", "iteration_us"])]
    pub trace: Option<PathBuf>,
    /// dispatch_inter_node_send span, us (1e-3..=1e12).
    #[arg(long, required_unless_present = "trace")]
    pub send_us: Option<f64>,
    /// combine_inter_node span, us (1e-3..=1e12).
    #[arg(long, required_unless_present = "trace")]
    pub combine_us: Option<f64>,
    /// dispatch_inter_node_recv span, us (1e-3..=1e12).
    #[arg(long)]
    pub recv_us: Option<f64>,
    /// dispatch_sync + combine_sync + ep_combine_sync_barrier, us (1e-3..=1e12).
    #[arg(long)]
    pub sync_us: Option<f64>,
    /// Whole iteration, us (1e-3..=1e12).
    #[arg(long)]
    pub iteration_us: Option<f64>,
    /// Tokens of this rank (cur_rank_num_token; 1..=2^30).
    #[arg(long)]
    pub tokens: u64,
    /// Hidden size (1..=2^20).
    #[arg(long)]
    pub hidden: u64,
    /// Element type of the hidden states.
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: DType,
    /// Top-k (0..=1024).
    #[arg(long)]
    pub topk: u64,
    /// Scale entries per token (0..=2^20; default: 0, or hidden/128 for fp8).
    #[arg(long)]
    pub scale_dim: Option<u64>,
    /// Bytes per scale entry (0..=8).
    #[arg(long, default_value_t = 4)]
    pub scale_bytes: u64,
    /// Nodes (2..=1024).
    #[arg(long)]
    pub nodes: u64,
    /// Link rate per port, Gb/s (bits; 400 Gb/s = 50 GB/s; 1e-3..=1e6).
    #[arg(long, default_value_t = 400.0)]
    pub link_gbit: f64,
    /// Combine carries the routing weights back.
    #[arg(long)]
    pub combine_weights: bool,
    #[command(flatten)]
    pub c: Common,
}
