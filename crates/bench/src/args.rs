//! Command-line flags of `bench_engine`, after the MORI-IO benchmark guide (the seed's
//! "Benchmark Arguments" and "Differences from the Python flags" tables). Python spellings are
//! accepted as aliases.

use crate::paged::Shape;
use clap::{Parser, ValueEnum};

/// Most GPU pairs (`--num-initiator-dev`) of one run.
pub const MAX_PAIRS: u32 = 64;

/// Transfer direction, seen from rank 0 (the initiator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum OpArg {
    /// Rank 0 reads rank 1's memory.
    Read,
    /// Rank 0 writes rank 1's memory.
    Write,
}

/// Transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum BackendArg {
    /// TCP streams (any host, host memory).
    Tcp,
    /// RDMA RC queue pairs over ibverbs.
    Rdma,
    /// Same-node GPU P2P over CUDA/HIP IPC (GPU memory).
    Xgmi,
    /// GPU memory through VMM shareable handles (POSIX FD within a node; FABRIC with
    /// MORI_IO_FABRIC_HANDLE=fabric).
    Fabric,
}

/// Memory kind of the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum MemArg {
    /// Host memory.
    Cpu,
    /// GPU memory (with --backend xgmi).
    Gpu,
}

/// How completion is awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum PollArg {
    /// Spin-poll the status (nixlbench's way; the timing rule of the seed).
    Polling,
    /// Block on the status (wakeup latency included).
    Event,
}

/// bench_engine: a nixlbench-comparable MORI-IO benchmark between two ranks.
///
/// Rank 0 is the initiator and prints the table; rank 1 is the target. Both ranks must get
/// the same workload flags (they compare them at rendezvous).
#[derive(Debug, Clone, Parser)]
#[command(name = "bench_engine", version, about, long_about = None)]
pub struct Args {
    // ---- rendezvous
    /// This process's rank: 0 = initiator (prints the table), 1 = target.
    #[arg(long, default_value_t = 0, help_heading = "Rendezvous")]
    pub rank: usize,
    /// Rank 0's IP, identical on both ranks (bootstrap root). Python spelling: --host.
    #[arg(long, alias = "host", default_value = "127.0.0.1", help_heading = "Rendezvous")]
    pub master_ip: String,
    /// Address this rank's engine advertises to its peer [default: 127.0.0.1 when the master
    /// is loopback, else the local address that routes to the master]. 0.0.0.0 is refused.
    #[arg(long, help_heading = "Rendezvous")]
    pub self_ip: Option<String>,
    /// Bootstrap port on the master; engines listen on port+1+rank [default: 18515]. With
    /// --local: the parent listens on it (a free one unless --port is given) before starting
    /// the child, and the engines use ports the kernel picks.
    #[arg(long, help_heading = "Rendezvous")]
    pub port: Option<u16>,
    /// Run both ranks on this machine: rank 0 starts rank 1 as a child process on loopback.
    #[arg(long, help_heading = "Rendezvous")]
    pub local: bool,

    // ---- workload
    /// Operation. Python spelling: --op-type.
    #[arg(long, alias = "op-type", value_enum, default_value_t = OpArg::Read, help_heading = "Workload")]
    pub op: OpArg,
    /// Transport: tcp (any host, host memory), rdma (needs an active RDMA port, e.g.
    /// SoftRoCE; host memory), xgmi (same node, GPU memory).
    #[arg(long, value_enum, default_value_t = BackendArg::Tcp, help_heading = "Workload")]
    pub backend: BackendArg,
    /// Message size per transfer, bytes (single point and --all-batch).
    #[arg(long, default_value_t = 32768, help_heading = "Workload")]
    pub buffer_size: u64,
    /// Transfers per iteration (the batch).
    #[arg(long, default_value_t = 256, help_heading = "Workload")]
    pub transfer_batch_size: u64,
    /// Submit each iteration as one batch request (nixl-equivalent). On by default; accepted
    /// for parity with the Python flag.
    #[arg(long, conflicts_with = "disable_batch_transfer", help_heading = "Workload")]
    pub enable_batch_transfer: bool,
    /// Submit transfer-batch-size single transfers per iteration instead (Python's default path).
    #[arg(long, help_heading = "Workload")]
    pub disable_batch_transfer: bool,
    /// Use a session (pre-resolved backend and remote region).
    #[arg(long, help_heading = "Workload")]
    pub enable_sess: bool,
    /// Place the batch's slots back to back (they merge into fewer, larger requests).
    #[arg(long, help_heading = "Workload")]
    pub batch_contiguous: bool,
    /// Timed iterations per point.
    #[arg(long, default_value_t = 500, help_heading = "Workload")]
    pub iters: u64,
    /// Untimed iterations before each point's timed loop (nixl --warmup_iter).
    #[arg(long, default_value_t = 100, help_heading = "Workload")]
    pub warmup_iters: u64,

    // ---- sweep
    /// Sweep the message size from --sweep-start to --sweep-max (×2, or +step).
    #[arg(long, conflicts_with = "all_batch", help_heading = "Sweep")]
    pub all: bool,
    /// Sweep the batch 1, 2, 4, ..., 32768 at --buffer-size.
    #[arg(long, help_heading = "Sweep")]
    pub all_batch: bool,
    /// First message size of --all, bytes. Python spelling: --sweep-start-size.
    #[arg(long, alias = "sweep-start-size", default_value_t = 8, help_heading = "Sweep")]
    pub sweep_start: u64,
    /// Last message size of --all, bytes. Python spelling: --sweep-max-size.
    #[arg(long, alias = "sweep-max-size", default_value_t = 1 << 20, help_heading = "Sweep")]
    pub sweep_max: u64,
    /// 0 = geometric ×2; > 0 = linear step, bytes.
    #[arg(long, default_value_t = 0, help_heading = "Sweep")]
    pub sweep_step: u64,

    // ---- memory
    /// Memory of the buffers.
    #[arg(long, value_enum, default_value_t = MemArg::Cpu, help_heading = "Memory")]
    pub mem_type: MemArg,
    /// Initiator GPU (GPU memory only). Python spelling: --src-gpu.
    #[arg(long, alias = "src-gpu", help_heading = "Memory")]
    pub gpu: Option<u32>,
    /// Target GPU = --gpu + offset (GPU memory only).
    #[arg(long, help_heading = "Memory")]
    pub target_dev_offset: Option<i64>,
    /// Python's target GPU; sets --target-dev-offset to N - gpu (a conflicting pair is refused).
    #[arg(long, help_heading = "Memory")]
    pub dst_gpu: Option<u32>,
    /// Initiator processes, one per GPU: initiator i drives GPU --gpu + i and pairs with target
    /// i on GPU --gpu + offset + i (with host memory: pairs of processes). Each pair prints
    /// `[gpu N]` rows and rank 0 an `[AGGREGATE]` line. Allowed 1..=64.
    #[arg(long, default_value_t = 1, help_heading = "Memory")]
    pub num_initiator_dev: u32,
    /// Target processes, one per GPU; must equal --num-initiator-dev.
    #[arg(long, default_value_t = 1, help_heading = "Memory")]
    pub num_target_dev: u32,
    /// This process's index among its side's processes (0 for the one started by hand; the
    /// others are started by it with the index in the environment).
    #[arg(skip)]
    pub local_index: u32,
    /// With --local: the run's token, shared by the parent and the processes it starts and
    /// compared at rendezvous (see [`crate::local`]); `None` for ranks started by hand.
    #[arg(skip)]
    pub run_token: Option<crate::local::RunToken>,

    // ---- backend tuning
    /// Connections (tcp) / queue pairs (rdma) per transfer.
    #[arg(long, default_value_t = 4, help_heading = "Backend tuning")]
    pub num_qp_per_transfer: usize,
    /// Worker threads (rdma; no effect on tcp, which runs one thread per connection).
    #[arg(long, default_value_t = 1, help_heading = "Backend tuning")]
    pub num_worker_threads: usize,
    /// Completion: polling = spin (the timing rule), event = blocking wait.
    #[arg(long = "poll_cq_mode", alias = "poll-cq-mode", value_enum, default_value_t = PollArg::Polling, help_heading = "Backend tuning")]
    pub poll_cq_mode: PollArg,
    /// Disable single-transfer chunking (rdma; no effect on tcp).
    #[arg(long, help_heading = "Backend tuning")]
    pub disable_chunking: bool,
    /// Chunk size when chunking is on, bytes (rdma).
    #[arg(long, default_value_t = 65536, help_heading = "Backend tuning")]
    pub chunk_bytes: u64,
    /// Most chunks per transfer (rdma).
    #[arg(long, default_value_t = 64, help_heading = "Backend tuning")]
    pub max_chunks: u64,
    /// Send-queue depth (rdma).
    #[arg(long, help_heading = "Backend tuning")]
    pub max_send_wr: Option<u32>,
    /// SGEs per WR (rdma).
    #[arg(long, help_heading = "Backend tuning")]
    pub max_msg_sge: Option<u32>,
    /// Stream pool size (xgmi/fabric).
    #[arg(long, default_value_t = 64, help_heading = "Backend tuning")]
    pub num_streams: u32,
    /// Event pool size (xgmi/fabric).
    #[arg(long, default_value_t = 64, help_heading = "Backend tuning")]
    pub num_events: u32,
    /// One process owning both sides, no rendezvous and no IPC (the Python benchmark's
    /// default for xgmi): rank 0 on --gpu/--src-gpu, rank 1 on --dst-gpu. With other backends
    /// both ranks run as threads of this process.
    #[arg(long, help_heading = "Backend tuning")]
    pub xgmi_single_process: bool,
    /// Accepted to document intent; the two-rank path already is multiprocess.
    #[arg(long, help_heading = "Backend tuning")]
    pub xgmi_multiprocess: bool,

    // ---- paged batches (mori-rs addition)
    /// Post paged batches (a mori-rs addition): each rank's buffer is one KV pool laid out
    /// [layer][half][--pool-blocks blocks][--block-size bytes], and every iteration posts one
    /// paged batch (session with --enable-sess, else one-shot) moving, for every layer and
    /// half, the blocks of rank 0's block table to (--op write) or from (--op read) the
    /// blocks of rank 1's. The tables hold --num-blocks distinct blocks each, drawn from
    /// --seed: one pair of tables per point, the same on both ranks, reused by every
    /// iteration. The same run also times, alternating with the paged loop, one contiguous
    /// transfer of the same total bytes (a batch of one entry through the same engine or
    /// session path, to an area after the pool) and, with --copy-baseline (xgmi), a bare
    /// device copy of those bytes. The table row has MsgSize = --block-size and Batch =
    /// blocks per transfer (layers x halves x --num-blocks); then the lines `paged: ...`,
    /// `contiguous: ...` and `paged/contiguous: R` (bandwidth ratio; GB = 1e9), and with
    /// --copy-baseline `bare copy: ...` and `paged/copy: R`. Validation checks every moved
    /// block, that every pool block in no table entry stayed untouched, and the contiguous
    /// area. --buffer-size and --transfer-batch-size are not used.
    #[arg(long, help_heading = "Paged")]
    pub paged: bool,
    /// Bytes per block (--paged).
    #[arg(long, help_heading = "Paged")]
    pub block_size: Option<u64>,
    /// Block table entries per side (--paged): blocks moved per layer and half.
    #[arg(long, help_heading = "Paged")]
    pub num_blocks: Option<u64>,
    /// Layers (--paged).
    #[arg(long, help_heading = "Paged")]
    pub layers: Option<u64>,
    /// Halves per layer (--paged): 2 for K and V, 1 for a cache of one (MLA's) [default: 2].
    #[arg(long, help_heading = "Paged")]
    pub halves: Option<u64>,
    /// Pool blocks per layer and half on each rank (--paged), at least --num-blocks
    /// [default: 2 x --num-blocks].
    #[arg(long, help_heading = "Paged")]
    pub pool_blocks: Option<u64>,
    /// Seed of the block tables (--paged) [default: 1].
    #[arg(long, help_heading = "Paged")]
    pub seed: Option<u64>,

    // ---- mori-rs extension
    /// Also time the bare-copy floor in this run (xgmi only; a mori-rs extension): one
    /// cuMemcpyDtoDAsync/hipMemcpyDtoDAsync per segment plus one event, spun on, between the
    /// same two buffers, in blocks alternating with the engine's timed iterations; adds the
    /// columns CopyLat(us) and Lat/Copy.
    #[arg(long, help_heading = "Output")]
    pub copy_baseline: bool,

    // ---- output
    /// Skip validation on this rank (the run then reports `validation: skipped`).
    #[arg(long, help_heading = "Output")]
    pub skip_validate: bool,
    /// Log level: trace, debug, info, warning, error, critical.
    #[arg(long, default_value = "info", help_heading = "Output")]
    pub log_level: String,
    /// Write every row (and the configuration) as JSON to this file (rank 0).
    #[arg(long, help_heading = "Output")]
    pub json: Option<std::path::PathBuf>,
    /// Draw bandwidth and latency against message size (or batch) into this PNG (rank 0).
    #[arg(long, help_heading = "Output")]
    pub plot: Option<std::path::PathBuf>,
}

impl Args {
    /// GPU of the buffer of process `index` of side `rank`: initiators (rank 0) use `--gpu`
    /// (default 0) plus `index`, targets (rank 1) that plus the target offset
    /// (`--target-dev-offset`, or `--dst-gpu` minus `--gpu`; default 0). `None` when negative
    /// or past `u32`.
    pub fn device_for(&self, rank: usize, index: u32) -> Option<u32> {
        let g = i64::from(self.gpu.unwrap_or(0)) + i64::from(index);
        if rank == 0 {
            u32::try_from(g).ok()
        } else {
            u32::try_from(g + self.target_offset()).ok()
        }
    }

    fn target_offset(&self) -> i64 {
        let g = i64::from(self.gpu.unwrap_or(0));
        self.target_dev_offset.or(self.dst_gpu.map(|d| i64::from(d) - g)).unwrap_or(0)
    }

    /// Processes per side (`--num-initiator-dev`, equal to `--num-target-dev` once validated).
    pub fn pairs(&self) -> u32 {
        self.num_initiator_dev
    }

    /// Rank of this process in the bootstrap world of `2 × pairs` ranks, initiators first
    /// (the seed's layout): `rank × pairs + local_index`.
    pub fn global_rank(&self) -> usize {
        self.rank * self.pairs() as usize + self.local_index as usize
    }

    /// Checks that every GPU the pairs use exists on a machine with `count` devices. The error
    /// names the flags, the GPUs needed and the count.
    pub fn check_devices(&self, count: u32) -> Result<(), String> {
        let n = self.pairs();
        for (rank, side) in [(0, "initiator"), (1, "target")] {
            let hi = self.device_for(rank, n - 1);
            if hi.is_none_or(|d| d >= count) {
                return Err(format!(
                    "--num-initiator-dev {n} with --gpu {} and --target-dev-offset {}: the {side} side needs GPUs {}..={}, this machine has {count} (0..={})",
                    self.gpu.unwrap_or(0),
                    self.target_offset(),
                    self.device_for(rank, 0).map_or("?".into(), |d| d.to_string()),
                    hi.map_or("?".into(), |d| d.to_string()),
                    count.saturating_sub(1)
                ));
            }
        }
        Ok(())
    }

    /// Batch-transfer mode after `--enable-batch-transfer`/`--disable-batch-transfer`.
    pub fn batch_transfer(&self) -> bool {
        !self.disable_batch_transfer
    }

    /// The flags both ranks must agree on, as (flag, value) pairs in a fixed order.
    pub fn workload(&self) -> Vec<(&'static str, String)> {
        vec![
            ("--op", format!("{:?}", self.op).to_lowercase()),
            ("--backend", format!("{:?}", self.backend).to_lowercase()),
            ("--mem-type", format!("{:?}", self.mem_type).to_lowercase()),
            ("--buffer-size", self.buffer_size.to_string()),
            ("--transfer-batch-size", self.transfer_batch_size.to_string()),
            ("--enable-batch-transfer", self.batch_transfer().to_string()),
            ("--enable-sess", self.enable_sess.to_string()),
            ("--batch-contiguous", self.batch_contiguous.to_string()),
            ("--iters", self.iters.to_string()),
            ("--warmup-iters", self.warmup_iters.to_string()),
            ("--all", self.all.to_string()),
            ("--all-batch", self.all_batch.to_string()),
            ("--sweep-start", self.sweep_start.to_string()),
            ("--sweep-max", self.sweep_max.to_string()),
            ("--sweep-step", self.sweep_step.to_string()),
            ("--num-qp-per-transfer", self.num_qp_per_transfer.to_string()),
            ("--gpu", self.gpu.unwrap_or(0).to_string()),
            ("--target-dev-offset", self.target_offset().to_string()),
            ("--num-initiator-dev", self.num_initiator_dev.to_string()),
            ("--num-target-dev", self.num_target_dev.to_string()),
            ("--paged", self.paged.to_string()),
            ("--block-size", opt(self.block_size)),
            ("--num-blocks", opt(self.num_blocks)),
            ("--layers", opt(self.layers)),
            ("--halves", opt(self.halves)),
            ("--pool-blocks", opt(self.pool_blocks)),
            ("--seed", opt(self.seed)),
        ]
    }

    /// The `--paged` shape (defaults applied), `None` without `--paged`. Meaningful once
    /// [`Args::validate`] passed.
    pub fn paged_shape(&self) -> Option<Shape> {
        if !self.paged {
            return None;
        }
        let blocks = self.num_blocks.unwrap_or(0);
        Some(Shape {
            block_size: self.block_size.unwrap_or(0),
            blocks: u32::try_from(blocks).unwrap_or(u32::MAX),
            layers: u32::try_from(self.layers.unwrap_or(0)).unwrap_or(u32::MAX),
            halves: u32::try_from(self.halves.unwrap_or(2)).unwrap_or(u32::MAX),
            pool_blocks: u32::try_from(self.pool_blocks.unwrap_or(2 * blocks)).unwrap_or(u32::MAX),
            seed: self.seed.unwrap_or(1),
        })
    }

    /// The `--paged` checks: the shape flags only with `--paged`, all there, in range, and
    /// no flag of another mode. Errors name the flags.
    fn validate_paged(&self) -> Result<(), String> {
        let shape_flags = [
            ("--block-size", self.block_size),
            ("--num-blocks", self.num_blocks),
            ("--layers", self.layers),
            ("--halves", self.halves),
            ("--pool-blocks", self.pool_blocks),
            ("--seed", self.seed),
        ];
        if !self.paged {
            let given: Vec<&str> = shape_flags.iter().filter(|f| f.1.is_some()).map(|f| f.0).collect();
            if !given.is_empty() {
                return Err(format!("{} set the shape of a --paged run: add --paged (or drop them)", given.join(", ")));
            }
            return Ok(());
        }
        let missing: Vec<&str> = shape_flags[..3].iter().filter(|f| f.1.is_none()).map(|f| f.0).collect();
        if !missing.is_empty() {
            return Err(format!("--paged needs --block-size, --num-blocks and --layers (missing: {})", missing.join(", ")));
        }
        for (flag, v) in &shape_flags[..3] {
            if *v == Some(0) {
                return Err(format!("{flag} 0: --paged needs at least 1"));
            }
        }
        for (flag, v) in [("--num-blocks", self.num_blocks), ("--layers", self.layers)] {
            if let Some(v) = v.filter(|&v| v > u64::from(u32::MAX)) {
                return Err(format!("{flag} {v}: allowed 1..={}", u32::MAX));
            }
        }
        if let Some(h) = self.halves.filter(|h| !(1..=2).contains(h)) {
            return Err(format!("--halves {h}: allowed 1 (one half, as MLA's cache) or 2 (K and V)"));
        }
        let n = self.num_blocks.unwrap_or(0);
        match self.pool_blocks {
            None if 2 * n > u64::from(u32::MAX) => {
                return Err(format!("--num-blocks {n}: the default --pool-blocks (2 x {n}) exceeds {}; give --pool-blocks", u32::MAX))
            }
            Some(p) if p > u64::from(u32::MAX) => {
                return Err(format!("--pool-blocks {p}: allowed up to {} (block indices are u32)", u32::MAX))
            }
            Some(p) if p < n => {
                return Err(format!(
                    "--pool-blocks {p} is smaller than --num-blocks {n}: a block table holds {n} distinct blocks of the pool"
                ))
            }
            _ => {}
        }
        let s = self.paged_shape().unwrap_or(Shape { block_size: 0, blocks: 0, layers: 0, halves: 0, pool_blocks: 0, seed: 0 });
        if s.entries() > u64::from(u32::MAX) {
            return Err(format!(
                "--layers {} x --halves {} x --num-blocks {} = {} blocks per transfer exceeds {} (a paged batch's limit)",
                s.layers,
                s.halves,
                s.blocks,
                s.entries(),
                u32::MAX
            ));
        }
        s.buffer_bytes()?;
        let other = [
            (self.all, "--paged measures one shape per run: drop --all"),
            (self.all_batch, "--paged measures one shape per run: drop --all-batch"),
            (self.disable_batch_transfer, "--paged posts every iteration as one paged batch: drop --disable-batch-transfer"),
            (self.batch_contiguous, "--paged places blocks by its block tables: drop --batch-contiguous"),
            (self.num_initiator_dev > 1, "--paged measures one pair: drop --num-initiator-dev/--num-target-dev"),
        ];
        match other.iter().find(|o| o.0) {
            Some((_, e)) => Err(e.to_string()),
            None => Ok(()),
        }
    }

    /// Checks what can be checked before any rendezvous. Errors name the flag and the limit.
    pub fn validate(&self) -> Result<(), String> {
        if self.rank > 1 {
            return Err(format!("--rank {}: bench_engine has two ranks, 0 (initiator) and 1 (target)", self.rank));
        }
        if let Some(p) = self.port {
            if p == 0 || p > 65533 {
                return Err(format!("--port {p}: the bootstrap uses port P and the engines P+1 and P+2; allowed 1..=65533"));
            }
        }
        if let Some(ip) = &self.self_ip {
            // Any spelling of a wildcard (0.0.0.0, 0, ::, ::0, ::ffff:0.0.0.0, ...): it becomes the
            // EngineDesc host the peer dials for the handshake and remote-memory lookup.
            mori_bootstrap::addr::advertised("--self-ip", ip, 1).map_err(|e| e.to_string())?;
        }
        match (self.backend, self.mem_type) {
            (BackendArg::Fabric, MemArg::Cpu) => {
                return Err("--backend fabric moves GPU memory only (fabric-exportable VMM allocations, as the MORI-IO guide says): add --mem-type gpu".into())
            }
            (BackendArg::Xgmi, MemArg::Cpu) => {
                return Err("--backend xgmi moves GPU memory: add --mem-type gpu".into())
            }
            (BackendArg::Tcp, MemArg::Gpu) => {
                return Err("--mem-type gpu with --backend tcp: GPU memory over tcp needs host staging, which bench_engine does not do; use --backend xgmi (same node)".into())
            }
            _ => {}
        }
        if let (Some(d), Some(o)) = (self.dst_gpu, self.target_dev_offset) {
            // --gpu defaults to 0: the conflict is the same whether or not it was given.
            let g = self.gpu.unwrap_or(0);
            if d as i64 - g as i64 != o {
                return Err(format!(
                    "--dst-gpu {d} conflicts with --target-dev-offset {o} (with --gpu {g}{} it means offset {})",
                    if self.gpu.is_none() { ", the default," } else { "" },
                    d as i64 - g as i64
                ));
            }
        }
        if self.mem_type == MemArg::Cpu && (self.gpu.is_some() || self.dst_gpu.is_some() || self.target_dev_offset.is_some()) {
            return Err("--gpu/--src-gpu/--dst-gpu/--target-dev-offset select GPUs: add --mem-type gpu".into());
        }
        if self.xgmi_single_process && (self.local || self.rank != 0) {
            return Err("--xgmi-single-process runs both ranks in this one process: drop --local and --rank".into());
        }
        if self.device_for(1, 0).is_none() {
            return Err(format!(
                "--gpu {} with --target-dev-offset {}: the target GPU would be negative",
                self.gpu.unwrap_or(0),
                self.target_offset()
            ));
        }
        if self.num_initiator_dev != self.num_target_dev {
            return Err(format!(
                "--num-initiator-dev {} and --num-target-dev {} must be equal (initiator i pairs with target i)",
                self.num_initiator_dev, self.num_target_dev
            ));
        }
        if !(1..=MAX_PAIRS).contains(&self.num_initiator_dev) {
            return Err(format!("--num-initiator-dev {}: allowed 1..={MAX_PAIRS}", self.num_initiator_dev));
        }
        if self.copy_baseline && self.backend != BackendArg::Xgmi {
            return Err(
                "--copy-baseline times bare GPU copies between the xgmi backend's buffers: add --backend xgmi --mem-type gpu".into()
            );
        }
        if self.copy_baseline && self.disable_batch_transfer {
            return Err("--copy-baseline times one batch of copies per iteration (one event), as the engine's batch request: drop --disable-batch-transfer".into());
        }
        if self.copy_baseline && self.num_initiator_dev > 1 {
            return Err("--copy-baseline measures one pair: drop --num-initiator-dev/--num-target-dev".into());
        }
        if self.num_initiator_dev > 1 && self.xgmi_single_process {
            return Err("--xgmi-single-process runs one pair in one process: drop --num-initiator-dev/--num-target-dev".into());
        }
        if let Some(p) = self.port {
            let last = u32::from(p) + 2 * self.num_initiator_dev;
            if last > 65535 {
                return Err(format!(
                    "--port {p} with --num-initiator-dev {}: the engines use ports {}..={last}, past 65535",
                    self.num_initiator_dev,
                    u32::from(p) + 1
                ));
            }
        }
        if self.buffer_size == 0 {
            return Err("--buffer-size 0: message size must be at least 1 byte".into());
        }
        if self.all && (self.sweep_start == 0 || self.sweep_max == 0) {
            return Err(format!(
                "--sweep-start {} / --sweep-max {}: message size must be at least 1 byte",
                self.sweep_start, self.sweep_max
            ));
        }
        if self.all && self.sweep_start > self.sweep_max {
            return Err(format!("--sweep-start {} is above --sweep-max {}", self.sweep_start, self.sweep_max));
        }
        if self.transfer_batch_size == 0 || self.transfer_batch_size > 1 << 20 {
            return Err(format!("--transfer-batch-size {}: allowed 1..=1048576", self.transfer_batch_size));
        }
        if self.iters == 0 {
            return Err("--iters 0: at least one timed iteration is needed".into());
        }
        if !(1..=64).contains(&self.num_qp_per_transfer) {
            return Err(format!("--num-qp-per-transfer {}: allowed 1..=64", self.num_qp_per_transfer));
        }
        self.validate_paged()
    }

    /// Flags given that the chosen backend does not use (printed as a note, not an error).
    pub fn ignored_by_backend(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.backend == BackendArg::Xgmi {
            if self.num_qp_per_transfer != 4 {
                v.push("--num-qp-per-transfer");
            }
            if self.num_worker_threads != 1 || self.disable_chunking || self.max_send_wr.is_some() || self.max_msg_sge.is_some() {
                v.push("the rdma tuning flags");
            }
            return v;
        }
        if self.backend == BackendArg::Rdma {
            if self.num_streams != 64 || self.num_events != 64 {
                v.push("--num-streams/--num-events");
            }
            return v;
        }
        if self.num_worker_threads != 1 {
            v.push("--num-worker-threads");
        }
        if self.disable_chunking {
            v.push("--disable-chunking");
        }
        if self.chunk_bytes != 65536 {
            v.push("--chunk-bytes");
        }
        if self.max_chunks != 64 {
            v.push("--max-chunks");
        }
        if self.max_send_wr.is_some() {
            v.push("--max-send-wr");
        }
        if self.max_msg_sge.is_some() {
            v.push("--max-msg-sge");
        }
        if self.num_streams != 64 || self.num_events != 64 {
            v.push("--num-streams/--num-events");
        }
        v
    }
}

/// An optional flag's value for the workload list (`-` when not given).
fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Names of the workload flags whose values differ between rank 0 (`a`) and rank `other`
/// (`b`), with both values, for the mismatch error.
pub fn workload_diff(a: &[(String, String)], b: &[(String, String)], other: usize) -> Vec<String> {
    let mut out = Vec::new();
    for (x, y) in a.iter().zip(b) {
        if x != y {
            out.push(format!("{}: rank 0 = {}, rank {other} = {}", x.0, x.1, y.1));
        }
    }
    if a.len() != b.len() {
        out.push(format!("flag lists differ in length ({} vs {}): different bench_engine versions?", a.len(), b.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Args {
        let mut v = vec!["bench_engine"];
        v.extend_from_slice(a);
        let args = Args::parse_from(v);
        args.validate().unwrap();
        args
    }

    #[test]
    fn pairs_map_to_gpus_and_global_ranks() {
        let mut a = parse(&[
            "--backend",
            "xgmi",
            "--mem-type",
            "gpu",
            "--num-initiator-dev",
            "4",
            "--num-target-dev",
            "4",
            "--target-dev-offset",
            "4",
        ]);
        assert_eq!((0..4).map(|i| a.device_for(0, i).unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!((0..4).map(|i| a.device_for(1, i).unwrap()).collect::<Vec<_>>(), [4, 5, 6, 7]);
        a.rank = 1;
        a.local_index = 2;
        assert_eq!(a.global_rank(), 6, "initiators first: target 2 of 4 is rank 4 + 2");
        assert_eq!(a.check_devices(8), Ok(()));
        let e = a.check_devices(7).unwrap_err();
        assert!(e.contains("target side needs GPUs 4..=7, this machine has 7 (0..=6)"), "{e}");
        let b = parse(&["--backend", "xgmi", "--mem-type", "gpu", "--num-initiator-dev", "2", "--num-target-dev", "2", "--gpu", "1"]);
        let e = b.check_devices(2).unwrap_err();
        assert!(e.contains("--gpu 1") && e.contains("initiator side needs GPUs 1..=2, this machine has 2"), "{e}");
        // --dst-gpu sets the offset for every pair.
        let c = parse(&[
            "--backend",
            "xgmi",
            "--mem-type",
            "gpu",
            "--num-initiator-dev",
            "2",
            "--num-target-dev",
            "2",
            "--src-gpu",
            "0",
            "--dst-gpu",
            "2",
        ]);
        assert_eq!((c.device_for(1, 0), c.device_for(1, 1)), (Some(2), Some(3)));
    }

    fn refused(a: &[&str]) -> String {
        let mut v = vec!["bench_engine"];
        v.extend_from_slice(a);
        Args::parse_from(v).validate().unwrap_err()
    }

    #[test]
    fn paged_shape_defaults_and_workload() {
        let a = parse(&["--paged", "--block-size", "32768", "--num-blocks", "256", "--layers", "8"]);
        assert_eq!(a.paged_shape(), Some(Shape { block_size: 32768, blocks: 256, layers: 8, halves: 2, pool_blocks: 512, seed: 1 }));
        let a = parse(&[
            "--paged",
            "--block-size",
            "16",
            "--num-blocks",
            "3",
            "--layers",
            "2",
            "--halves",
            "1",
            "--pool-blocks",
            "3",
            "--seed",
            "9",
        ]);
        let s = a.paged_shape().unwrap();
        assert_eq!((s.halves, s.pool_blocks, s.seed, s.entries(), s.buffer_bytes()), (1, 3, 9, 6, Ok(2 * 3 * 16 + 6 * 16)));
        // The paged flags are workload flags: a rank with another shape is named at rendezvous.
        let b = parse(&[
            "--paged",
            "--block-size",
            "16",
            "--num-blocks",
            "4",
            "--layers",
            "2",
            "--halves",
            "1",
            "--pool-blocks",
            "4",
            "--seed",
            "9",
        ]);
        let w = |a: &Args| a.workload().into_iter().map(|(k, v)| (k.to_string(), v)).collect::<Vec<_>>();
        assert_eq!(workload_diff(&w(&a), &w(&b), 1), vec!["--num-blocks: rank 0 = 3, rank 1 = 4", "--pool-blocks: rank 0 = 3, rank 1 = 4"]);
        let plain = parse(&[]);
        assert_eq!(plain.paged_shape(), None);
        let d = workload_diff(&w(&plain), &w(&a), 1);
        assert_eq!(d[0], "--paged: rank 0 = false, rank 1 = true");
        assert!(d.contains(&"--seed: rank 0 = -, rank 1 = 9".to_string()), "{d:?}");
    }

    #[test]
    fn paged_refusals_name_the_flags() {
        let base = ["--paged", "--block-size", "4096", "--num-blocks", "16", "--layers", "2"];
        let with = |extra: &[&str]| refused(&[&base[..], extra].concat());
        let cases: Vec<(String, &str)> = vec![
            (refused(&["--paged"]), "--paged needs --block-size, --num-blocks and --layers (missing: --block-size, --num-blocks, --layers)"),
            (refused(&["--paged", "--block-size", "8", "--layers", "1"]), "(missing: --num-blocks)"),
            (refused(&["--num-blocks", "4", "--seed", "3"]), "--num-blocks, --seed set the shape of a --paged run: add --paged"),
            (refused(&["--paged", "--block-size", "0", "--num-blocks", "1", "--layers", "1"]), "--block-size 0: --paged needs at least 1"),
            (refused(&["--paged", "--block-size", "1", "--num-blocks", "0", "--layers", "1"]), "--num-blocks 0: --paged needs at least 1"),
            (refused(&["--paged", "--block-size", "1", "--num-blocks", "1", "--layers", "0"]), "--layers 0: --paged needs at least 1"),
            (with(&["--halves", "3"]), "--halves 3: allowed 1 (one half, as MLA's cache) or 2 (K and V)"),
            (with(&["--pool-blocks", "15"]), "--pool-blocks 15 is smaller than --num-blocks 16"),
            (with(&["--all"]), "--paged measures one shape per run: drop --all"),
            (with(&["--all-batch"]), "drop --all-batch"),
            (with(&["--disable-batch-transfer"]), "one paged batch: drop --disable-batch-transfer"),
            (with(&["--batch-contiguous"]), "drop --batch-contiguous"),
            (with(&["--num-initiator-dev", "2", "--num-target-dev", "2"]), "--paged measures one pair"),
            (
                refused(&["--paged", "--block-size", "1", "--num-blocks", "3000000000", "--layers", "1"]),
                "--num-blocks 3000000000: the default --pool-blocks (2 x 3000000000) exceeds 4294967295; give --pool-blocks",
            ),
            (
                refused(&["--paged", "--block-size", "1", "--num-blocks", "65536", "--layers", "65536", "--pool-blocks", "65536"]),
                "--layers 65536 x --halves 2 x --num-blocks 65536 = 8589934592 blocks per transfer exceeds 4294967295",
            ),
            (
                refused(&["--paged", "--block-size", "1099511627776", "--num-blocks", "4096", "--layers", "1024"]),
                "--layers 1024 x --halves 2 x --pool-blocks 8192 x --block-size 1099511627776 (plus the contiguous baseline's area) does not fit in memory",
            ),
        ];
        for (got, want) in cases {
            assert!(got.contains(want), "{got:?} lacks {want:?}");
        }
    }

    #[test]
    fn rdma_takes_gpu_memory_and_tcp_still_refuses_it() {
        // GPU memory over rdma goes through dmabuf MRs (the backend refuses at registration
        // when the NIC cannot); over tcp it would need host staging.
        let a = parse(&["--backend", "rdma", "--mem-type", "gpu", "--gpu", "1"]);
        assert_eq!((a.backend, a.mem_type, a.device_for(0, 0)), (BackendArg::Rdma, MemArg::Gpu, Some(1)));
        let mut v = vec!["bench_engine"];
        v.extend_from_slice(&["--backend", "tcp", "--mem-type", "gpu"]);
        let e = Args::parse_from(v).validate().unwrap_err();
        assert!(e.contains("GPU memory over tcp needs host staging"), "{e}");
    }
}
