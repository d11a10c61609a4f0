//! [`InterNodeGpu`]: every rank of an inter-node job (AsyncLL, V1-LL or V1) in this process on one GPU, nodes as groups
//! of ranks (the single-GPU stand-in for several nodes): windows, counter blocks, command rings,
//! one MORI-IO engine and [`RingProxy`] per rank, and the kernels of
//! `kernels/ep_internode.cu` launched per node on a stream of its own (both nodes' blocks
//! resident at once). Two ways to call it: host bytes in and out (`host_api.rs`:
//! [`InterNodeGpu::dispatch`], [`InterNodeGpu::combine`]) or device-resident (`device_api.rs`:
//! [`InterNodeGpu::dispatch_device`], [`InterNodeGpu::combine_device`]: GPU inputs, outputs
//! left where the kernels wrote them).

use super::abi::{IeParams, IeRank};
use super::trace::{trace_bytes, RankStamps};
use super::types::{ElemSizes, InterNodeOptions, InterPath, PhaseTimes};
use super::InterLayout;
use crate::config::EpConfig;
use crate::error::EpError;
use crate::gpu::{EpGpuError, GpuResult};
use crate::gpu_ring::{DeviceRing, Window};
use crate::internode::Scheme;
use crate::proxy::{PeerWindow, RingProxy};
use mori_gpu::{Device, DeviceBuffer, Event, Function, KernelArgs, KernelImages, LaunchConfig, Module, PinnedBuffer, Runtime, Stream};
use mori_io::{BackendConfig, EngineConfig, IoEngine, MemoryDesc, TcpConfig, XgmiConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "device_api.rs"]
mod device_api;
#[path = "host_api.rs"]
mod host_api;
#[path = "run_abi.rs"]
mod run_abi;
pub use device_api::{CombineInputBuf, DeviceCombined, DeviceRankInputs, DeviceRecv, DeviceTicket};

static CUBIN: &[u8] = include_bytes!("../../../../kernels/prebuilt/ep_internode.sm_90.cubin");
static PTX: &str = include_str!("../../../../kernels/prebuilt/ep_internode.sm_90.ptx");
static GFX942: &[u8] = include_bytes!("../../../../kernels/prebuilt/ep_internode.gfx942.hsaco");

struct GpuRank {
    win: Window,
    dev_ctr: DeviceBuffer,
    ring: DeviceRing,
    /// mask, pre, cnt, recv_cnt, recv_base, done, trace, npre (the status words are in the
    /// node's `abi` buffer).
    scratch: Vec<DeviceBuffer>,
    /// x, weights, idx, scales.
    inp: Vec<DeviceBuffer>,
    /// The caller's inputs of a device dispatch (x, weights, idx, scales device addresses; 0:
    /// none), which the kernels read instead of `inp` until the next dispatch.
    ext_inp: Option<[u64; 4]>,
    /// x, weights, idx, scales, src (empty with the records in the window).
    out: Vec<DeviceBuffer>,
    /// With the records in a GPU window: pinned host memory where the host gathers them (a
    /// copy into pinned memory runs at the link's rate; the dispatch call's host time fell
    /// from 78-83 ms with pageable memory to 43-50 ms at the decode shape, 8 ranks), grown to
    /// the largest dispatch so far (a power of two of bytes).
    recv_host: Option<PinnedBuffer>,
    /// Buffers `recv_host` outgrew, freed with the object (freeing pinned memory waits for
    /// the whole device: not while a call's kernels run).
    recv_host_old: Vec<PinnedBuffer>,
    /// comb_x, comb_w, comb_out, comb_out_w.
    comb: Vec<DeviceBuffer>,
    tokens: usize,
    comb_rows: usize,
    /// Rows this rank received in the last dispatch (what its combine input must hold).
    recv: usize,
}

/// Inter-node dispatch/combine (AsyncLL, V1-LL or V1: the configuration's `kernel_type`) for every rank
/// of the job, in this process, on one GPU.
pub struct InterNodeGpu {
    rt: Arc<dyn Runtime>,
    layout: InterLayout,
    opts: InterNodeOptions,
    out_elem: usize,
    ranks: Vec<GpuRank>,
    proxies: Vec<RingProxy>,
    regs: Vec<(Arc<IoEngine>, MemoryDesc)>,
    abi: Vec<DeviceBuffer>,
    streams: Vec<Stream>,
    /// Per node, timing events recorded before and after each kernel of a call (created once).
    marks: Vec<Vec<Event>>,
    funcs: Vec<Function>,
    _module: Module,
    experts_per_rank: usize,
    times: PhaseTimes,
    describe: String,
    /// Set by a failed call: counters and staging counts may be half-updated, so the object
    /// refuses further calls.
    poisoned: Option<String>,
    /// The sequence number of the dispatch no combine consumed yet (its ticket's).
    dispatched: Option<u64>,
    /// This object's number (its tickets carry it).
    id: u64,
    /// Kernel runs so far (dispatch tickets carry the number).
    calls: u64,
    /// The combine input goes into the window as rows (`IE_FLAG_COMB_ROWS`: over xgmi with
    /// [`InterNodeOptions::combine_rows`]).
    in_window: bool,
}

fn bad(field: &'static str, value: impl ToString, reason: impl Into<String>) -> EpGpuError {
    EpGpuError::Ep(EpError::InvalidConfig { field, value: value.to_string(), reason: reason.into() })
}

fn host_err(what: &str, e: impl std::fmt::Display) -> EpGpuError {
    EpGpuError::Ep(EpError::Host { what: what.to_string(), detail: e.to_string() })
}

/// Copy streams each rank's xgmi engine keeps (few, so that every stream of the process can
/// have a hardware queue of its own: see [`needed_connections`]).
pub const XGMI_COPY_STREAMS: usize = 2;

/// `CUDA_DEVICE_MAX_CONNECTIONS` an xgmi job of `world` ranks and `nodes` kernel streams needs
/// so that no copy stream shares a hardware work queue with a spinning kernel's stream: CUDA
/// maps streams onto that many queues (default 8), and work on a shared queue runs in order,
/// so a copy queued behind a kernel that waits for it never starts.
pub fn needed_connections(world: usize, nodes: usize) -> usize {
    world * XGMI_COPY_STREAMS + nodes
}

/// The most ranks an xgmi job over `nodes` nodes can have with [`needed_connections`] within
/// CUDA's 32 hardware queues, rounded down to a multiple of `nodes` (every node has as many).
pub fn max_xgmi_ranks(nodes: usize) -> usize {
    let n = nodes.max(1);
    32usize.saturating_sub(n) / XGMI_COPY_STREAMS / n * n
}

/// Refuses armed ordered-copy launches (`MORI_GPU_POOL_ARMED` above 0) for the inter-node EP
/// over xgmi: on an H100 (docs/PERFORMANCE.md, "Armed launches") an inter-node write took
/// 0.9-1.2 ms with them against 19-23 µs launched when posted with one rank a node, 2.5-2.8 ms
/// against 44-55 µs at 2 x 4, and the EP's GPU tests missed their deadlines with them.
/// Errors: `InvalidConfig` naming the variable; `Gpu` for a value that is not a depth.
pub fn refuse_armed_launches() -> GpuResult<()> {
    let depth = mori_gpu::armed_depth(0)?;
    if depth > 0 {
        return Err(bad(
            "MORI_GPU_POOL_ARMED",
            depth,
            "the inter-node EP over xgmi launches each ordered copy when posted: with armed launches an inter-node write took 1-3 ms instead of 19-55 µs on an H100 and the kernels missed their deadlines; unset it or set 0",
        ));
    }
    Ok(())
}

/// The kernels of dispatch, as indices into [`KERNELS`], in launch order.
const DISPATCH_KERNELS: [usize; 3] = [0, 1, 2];

/// The kernels of combine, as indices into [`KERNELS`], in launch order: the staging (unless
/// the input rows lie in the window, `in_window`), the relay's partial sums (V1, V1-LL:
/// `relay`), the send and the sum.
pub(super) fn combine_kernels(in_window: bool, relay: bool) -> Vec<usize> {
    let mut ks = Vec::with_capacity(4);
    if !in_window {
        ks.push(3);
    }
    if relay {
        ks.push(6);
    }
    ks.extend([4, 5]);
    ks
}

/// Events per node's stream: one before a phase's first kernel and one after each of its
/// kernels, for the longer phase.
const MARKS: usize = 1 + MOST_KERNELS;

/// Most kernels of one phase (combine: staging, relay, send, sum).
const MOST_KERNELS: usize = 4;

/// How a kernel's grid is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Grid {
    /// `blocks_per_rank`: kernels that wait, their whole grid resident at once.
    CoResident,
    /// `copy_blocks`: kernels that wait for nothing (the stagings, the copy-out, the sum).
    Own,
}

/// The kernels (dispatch 0..=2; combine 3..=6, launched as [`combine_kernels`] orders them)
/// and their grids. (The layout is part of the dispatch staging kernel: each of its blocks
/// lays out its share of the tokens.) The relay's partial sums (6) wait only for gather
/// counters that the node's staging launch before it set, so they run on their own grid
/// without residency: this needs every rank of a node in one launch on one stream, as
/// [`InterNodeGpu::run`] launches them (a node's ranks in separate launches would leave those
/// blocks spinning on counters of a launch that may not have run).
pub(super) const KERNELS: [(&str, Grid); 7] = [
    ("mori_ie_dispatch_stage", Grid::Own),
    ("mori_ie_dispatch", Grid::CoResident),
    ("mori_ie_dispatch_recv", Grid::Own),
    ("mori_ie_combine_stage", Grid::Own),
    ("mori_ie_combine_send", Grid::CoResident),
    ("mori_ie_combine_recv", Grid::Own),
    ("mori_ie_combine_relay", Grid::Own),
];

impl InterNodeGpu {
    /// Sets up every rank of `cfg` on `dev` for element sizes `sz`. Warms each inter-node path
    /// with one host-posted write per peer before any kernel runs (a transport's first transfer
    /// may allocate, and a CUDA allocation can wait for a spinning kernel forever). Its own
    /// engines never arm ordered-copy launches; another copy pool of the process that does
    /// (`XgmiConfig::armed_depth`) would make this object's allocations and frees wait for that
    /// pool's armed launches.
    ///
    /// Errors: [`InterLayout::new`]'s; `InvalidConfig` for a single node, more than
    /// [`super::MAX_WORLD`] ranks, a grid that cannot be resident, warps outside 1..=16,
    /// `MORI_GPU_POOL_ARMED` above 0 over xgmi ([`refuse_armed_launches`]); GPU, engine and
    /// registration failures.
    pub fn new(rt: Arc<dyn Runtime>, dev: Device, cfg: &EpConfig, sz: ElemSizes, opts: InterNodeOptions) -> GpuResult<Self> {
        let ElemSizes { elem, idx_size, comb_elem, out_elem } = sz;
        if cfg.kernel_type == crate::KernelType::IntraNode {
            return Err(bad(
                "kernel_type",
                "IntraNode",
                "the inter-node kernels run InterNodeV1, InterNodeV1LL or AsyncLL (one node: gpu::IntranodeEp)",
            ));
        }
        let scheme = Scheme::from_kernel_type(cfg.kernel_type);
        let layout = InterLayout::new(cfg, scheme, elem, idx_size, comb_elem)?;
        let (w, g) = (cfg.world_size, cfg.gpus_per_node);
        if g == 0 || w / g < 2 || w % g != 0 {
            return Err(bad(
                "gpus_per_node",
                g,
                format!("the inter-node kernels need world_size ({w}) = nodes x gpus_per_node with at least 2 nodes"),
            ));
        }
        if !(1..=16).contains(&opts.warps_per_block) || opts.blocks_per_rank == 0 || !(1..=1024).contains(&opts.copy_blocks) {
            return Err(bad(
                "launch shape",
                format!("{} blocks x {} warps, {} copy-out blocks", opts.blocks_per_rank, opts.warps_per_block, opts.copy_blocks),
                "1..=16 warps, at least 1 block and 1..=1024 copy-out blocks per rank",
            ));
        }
        if out_elem != 2 && out_elem != 4 {
            return Err(bad("combine output element size", out_elem, "must be 2 (bf16) or 4 (f32)"));
        }
        let sms = rt.device_properties(dev)?.multiprocessors as u64;
        let grid = w as u64 * opts.blocks_per_rank as u64;
        if grid > sms {
            return Err(bad(
                "blocks per rank",
                opts.blocks_per_rank,
                format!(
                    "{w} ranks x {} blocks = {grid} blocks, but all must be resident at once on {sms} multiprocessors",
                    opts.blocks_per_rank
                ),
            ));
        }
        if opts.timeout.is_zero() || opts.timeout > Duration::from_secs(3600) {
            return Err(bad(
                "timeout",
                format!("{:?}", opts.timeout),
                "must be between 1 ns and 1 hour (every in-kernel wait adds it to the GPU clock)",
            ));
        }
        if opts.path == InterPath::Xgmi {
            refuse_armed_launches()?;
            let need = needed_connections(w, w / g);
            let have = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(8);
            if have < need {
                return Err(bad(
                    "CUDA_DEVICE_MAX_CONNECTIONS",
                    have,
                    format!(
                        "the xgmi leg of {w} ranks uses {need} streams ({XGMI_COPY_STREAMS} copy streams per rank and one kernel stream per node) and each needs a hardware queue of its own, or a copy can wait behind a kernel that waits for it; set it to {need}..=32 before the process creates its CUDA context (at most {} ranks then)",
                        max_xgmi_ranks(w / g)
                    ),
                ));
            }
        }
        rt.bind(dev)?;
        let module = KernelImages { cubin: CUBIN, ptx: PTX, hsaco: GFX942 }.load(rt.as_ref(), dev)?;
        let funcs = KERNELS.iter().map(|(k, _)| module.function(k)).collect::<Result<Vec<_>, _>>()?;
        let (t, k, r_max) = (layout.max_tokens, layout.top_k, layout.max_recv);
        let in_window = opts.combine_rows && opts.path == InterPath::Xgmi;
        let zeroed = |len: usize| -> GpuResult<DeviceBuffer> {
            let b = rt.alloc(dev, len.max(16))?;
            rt.memset(&b.slice(), 0)?;
            Ok(b)
        };
        let mut ranks = Vec::with_capacity(w);
        for _ in 0..w {
            let win = Window::new(rt.as_ref(), dev, opts.path == InterPath::Xgmi, layout.window_bytes)?;
            ranks.push(GpuRank {
                win,
                dev_ctr: zeroed(layout.counter_bytes())?,
                ring: DeviceRing::new(rt.as_ref(), dev, opts.ring_slots)?,
                scratch: [
                    t * 8,
                    (t + 1) * w * 4,
                    w * 4,
                    w * 4,
                    w * 4,
                    layout.done_bytes(),
                    if opts.trace { trace_bytes(w, opts.trace_blocks()) } else { 0 },
                    (t + 1) * layout.nodes() * 4,
                ]
                .iter()
                .map(|&n| zeroed(n))
                .collect::<Result<_, _>>()?,
                inp: [t * layout.row_bytes, t * k * 4, t * k * idx_size, t * layout.scale_bytes]
                    .iter()
                    .map(|&n| zeroed(n))
                    .collect::<Result<_, _>>()?,
                // With the records in the window, the copy-out's buffers stay empty.
                out: [r_max * layout.row_bytes, r_max * k * 4, r_max * k * idx_size, r_max * layout.scale_bytes, r_max * 4]
                    .iter()
                    .map(|&n| zeroed(if opts.recv_in_window { 0 } else { n }))
                    .collect::<Result<_, _>>()?,
                // With the combine input in the window, its own buffers stay empty.
                comb: [
                    if in_window { 0 } else { r_max * layout.hidden * comb_elem },
                    if in_window { 0 } else { r_max * k * 4 },
                    t * layout.hidden * out_elem,
                    t * k * 4,
                ]
                .iter()
                .map(|&n| zeroed(n))
                .collect::<Result<_, _>>()?,
                recv_host: None,
                recv_host_old: Vec::new(),
                ext_inp: None,
                tokens: 0,
                comb_rows: 0,
                recv: 0,
            });
        }
        // Engines, registrations, descriptors, proxies.
        let mut engines = Vec::with_capacity(w);
        let mut descs = Vec::with_capacity(w);
        let mut regs = Vec::new();
        for (r, gr) in ranks.iter().enumerate() {
            let eng = IoEngine::new(
                &format!("ie-r{r}-{}", std::process::id()),
                EngineConfig::new("127.0.0.1", 0).map_err(|e| host_err("engine config", e))?,
            )
            .map_err(|e| host_err("MORI-IO engine", e))?;
            let bc = match opts.path {
                InterPath::Xgmi => BackendConfig::Xgmi(XgmiConfig { num_streams: XGMI_COPY_STREAMS, ..XgmiConfig::default() }),
                InterPath::Tcp { lanes } => {
                    let mut t = TcpConfig::from_env().map_err(|e| host_err("tcp settings", e))?;
                    t.lanes = lanes;
                    BackendConfig::Tcp(t)
                }
            };
            eng.create_backend(bc).map_err(|e| host_err("MORI-IO backend", e))?;
            // SAFETY: the window lives in `ranks`, which outlives the registration
            // (deregistered in Drop before the buffers are freed).
            let wm = unsafe {
                eng.register_memory(gr.win.host_ptr() as usize as *mut u8, layout.window_bytes, gr.win.loc(dev))
                    .map_err(|e| host_err("registering a window", e))?
            };
            let eng = Arc::new(eng);
            regs.push((eng.clone(), wm.clone()));
            descs.push(wm);
            engines.push(eng);
        }
        let mut proxies = Vec::with_capacity(w);
        for r in 0..w {
            let mut peers = vec![None; w];
            for (d, peer) in peers.iter_mut().enumerate() {
                if d / g != r / g {
                    engines[r].register_remote_engine(engines[d].desc().clone()).map_err(|e| host_err("peer engine", e))?;
                    // Counter pairs travel as tail writes into the window.
                    *peer = Some(PeerWindow::single(descs[d].clone()));
                }
            }
            // Warm the path to every peer: one signalled write of a record's size, host-posted.
            for d in (0..w).filter(|&d| d / g != r / g) {
                let b = mori_io::RegionBatch {
                    local: &descs[r],
                    local_offs: &[layout.lay.out_disp],
                    remote: &descs[d],
                    remote_offs: &[layout.lay.out_disp],
                    sizes: &[layout.rec_bytes as u64],
                    id: engines[r].allocate_transfer_uid(),
                };
                engines[r]
                    .post(mori_io::Op::Write, &b, None)
                    .wait_for(opts.timeout)
                    .map_err(|e| host_err("warming the inter-node path", e))?;
            }
            proxies.push(
                RingProxy::start(&format!("ie{r}"), engines[r].clone(), descs[r].clone(), peers, ranks[r].ring.mem(), opts.proxy)
                    .map_err(|e| host_err("proxy thread", e))?,
            );
        }
        let nodes = w / g;
        // Per node: its ranks' structs, then their status words.
        let abi = (0..nodes).map(|_| zeroed(g * (std::mem::size_of::<IeRank>() + run_abi::STATUS_BYTES))).collect::<Result<Vec<_>, _>>()?;
        let streams = (0..nodes).map(|_| rt.stream(dev)).collect::<Result<Vec<_>, _>>()?;
        let marks =
            (0..nodes).map(|_| (0..MARKS).map(|_| rt.event(dev, true)).collect::<Result<Vec<_>, _>>()).collect::<Result<Vec<_>, _>>()?;
        let describe = format!(
            "mori_ep::gpu_internode: {}, {nodes} node(s) x {g} ranks on {dev} ({}), each node's launches on a stream of its own, {} blocks x {} warps per rank ({} for the kernels that wait for nothing: the stagings, the copy-out when it runs, the relay's sums, the sum); intra-node: P2P stores; inter-node: {}, one proxy thread per rank (ring of {} commands in mapped pinned memory), writes with tail-written counters; {}; window {:.1} MB per rank",
            match scheme {
                Scheme::V1LL => "V1-LL (one record per token and destination to the same-local-index relay of each other node, forwarded there by P2P stores; partial sums per node back)",
                Scheme::V1 => "V1 (one record per token and node to the same-local-index relay there, stored by it to each destination; partial sums per node back)",
                Scheme::AsyncLL => "AsyncLL (direct puts to every destination rank)",
            },
            rt.kind(),
            opts.blocks_per_rank,
            opts.warps_per_block,
            opts.copy_blocks,
            match opts.path {
                InterPath::Xgmi => "MORI-IO xgmi (windows in GPU memory)".to_string(),
                InterPath::Tcp { lanes } => format!("MORI-IO tcp, {lanes} lanes (windows in pinned host memory: the kernels stage into it)"),
            },
            opts.ring_slots,
            if in_window && scheme == Scheme::AsyncLL {
                "combine input as rows in the window, moved as they are (combine stages nothing)"
            } else if in_window {
                "combine input as rows in the window, read there by the relays and this node's sources (combine stores no row), the relay's partial sums a kernel of their own"
            } else if scheme == Scheme::AsyncLL {
                "combine's staging kernel stores every row (this node's by P2P store, the others' for the proxy)"
            } else {
                "combine's staging kernel stores every row (this node's by P2P store, the others' into the relays' gather areas), the relay's partial sums a kernel of their own"
            },
            layout.window_bytes as f64 / 1e6
        ) + if opts.recv_in_window { "; the received records stay in the window (no copy-out kernel)" } else { "; a copy-out kernel writes the received records into output buffers" };
        Ok(Self {
            rt,
            layout,
            opts,
            out_elem,
            ranks,
            proxies,
            regs,
            abi,
            streams,
            marks,
            funcs,
            _module: module,
            experts_per_rank: cfg.experts_per_rank,
            times: PhaseTimes::default(),
            poisoned: None,
            dispatched: None,
            id: super::types::next_ticket_owner(),
            calls: 0,
            in_window,
            describe,
        })
    }

    /// One line: scheme, nodes x ranks, launch shape, both legs' paths.
    pub fn describe(&self) -> String {
        self.describe.clone()
    }

    /// The layout.
    pub fn layout(&self) -> &InterLayout {
        &self.layout
    }

    /// Whether the combine input goes into the window as rows (over xgmi with
    /// [`InterNodeOptions::combine_rows`]), where the kernels and the proxy read them: combine
    /// stores no row and its staging kernel is not launched.
    pub fn combine_in_window(&self) -> bool {
        self.in_window
    }

    /// The kernels' times of the last dispatch and combine.
    pub fn times(&self) -> PhaseTimes {
        self.times
    }

    /// Runs kernels `ks` for every node, each node on its stream, and waits; returns the
    /// slowest node's GPU time in µs, and records each kernel's slowest time.
    fn run(&mut self, ks: &[usize]) -> GpuResult<f64> {
        let (g, b) = (self.layout.gpn as u32, self.opts.blocks_per_rank);
        let threads = self.opts.warps_per_block * 32;
        if self.marks.iter().any(|m| m.len() <= ks.len()) {
            return Err(host_err("inter-node kernels", format!("{} kernels in one phase, events for {} (MARKS)", ks.len(), MARKS - 1)));
        }
        self.calls += 1;
        let params: Vec<IeParams> = (0..self.streams.len()).map(|n| self.params(n)).collect();
        // Each node's kernels in turn (launching each kernel on every node's stream before the
        // next slowed V1 and V1-LL by 11-54 µs at 2 x 4 on one GPU: docs/gpu-run/breadth.txt and
        // depth-*.txt).
        for ((s, marks), p) in self.streams.iter().zip(&self.marks).zip(&params) {
            marks[0].record(s)?;
            for (i, &k) in ks.iter().enumerate() {
                let per_rank = match KERNELS[k].1 {
                    Grid::CoResident => b,
                    Grid::Own => self.opts.copy_blocks,
                };
                let cfg = LaunchConfig { grid: (g * per_rank, 1, 1), block: (threads, 1, 1), shared_mem_bytes: 0 };
                let mut args = KernelArgs::new();
                args.push(IeParams { blocks_per_rank: per_rank, ..*p });
                // SAFETY: one by-value IeParams laid out as the kernel's (abi tests); every
                // address in it belongs to buffers of self, which outlive the synchronization
                // below, or (a device dispatch's inputs) to the caller's buffers, which the
                // ticket keeps borrowed until the combine and which a failed device call waits
                // for the kernels to stop reading (`settle`).
                unsafe { self.funcs[k].launch(s, &cfg, &args.params())? };
                marks[i + 1].record(s)?;
            }
        }
        // Each kernel may run until its own in-kernel deadline.
        let deadline = Instant::now() + self.opts.timeout * ks.len() as u32 + Duration::from_secs(5);
        let n = ks.len();
        for marks in &self.marks {
            while !marks[n].query()? {
                if Instant::now() > deadline {
                    return Err(host_err("inter-node kernels", format!("still running {:?} after their deadline", self.opts.timeout)));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        let mut worst = 0.0f64;
        for &k in ks {
            self.times.kernel_us[k] = 0.0;
        }
        for marks in &self.marks {
            worst = worst.max(marks[0].elapsed_ms(&marks[n])? as f64 * 1e3);
            for (i, &k) in ks.iter().enumerate() {
                let us = marks[i].elapsed_ms(&marks[i + 1])? as f64 * 1e3;
                self.times.kernel_us[k] = self.times.kernel_us[k].max(us);
            }
        }
        Ok(worst)
    }

    /// The dispatch kernels on the inputs the ranks point at: uploads the per-rank structs,
    /// runs, and returns each rank's received count.
    fn run_dispatch(&mut self) -> GpuResult<Vec<u32>> {
        self.upload_abi(true)?;
        if self.opts.trace {
            for gr in &self.ranks {
                self.rt.memset(&gr.scratch[6].slice(), 0)?;
            }
        }
        // With the records in the window, the copy-out kernel is not launched (its time reads 0).
        let ks = if self.opts.recv_in_window { &DISPATCH_KERNELS[..2] } else { &DISPATCH_KERNELS[..] };
        self.times.dispatch_us = self.run(ks)?;
        self.check_status("dispatch")
    }

    /// The combine kernels on the rows the ranks' combine inputs hold (`comb_rows` each).
    fn run_combine(&mut self) -> GpuResult<()> {
        self.upload_abi(false)?;
        // With the input rows in the window, combine stores no row: its staging kernel is not
        // launched (its time reads 0); AsyncLL has no relay (nor its kernel's time).
        let ks = combine_kernels(self.in_window, self.layout.scheme != Scheme::AsyncLL);
        self.times.combine_us = self.run(&ks)?;
        self.check_status("combine").map(|_| ())
    }

    /// Whether the received records stay in the window ([`InterNodeOptions::recv_in_window`]):
    /// dispatch's copy-out kernel is then not launched.
    pub fn recv_in_window(&self) -> bool {
        self.opts.recv_in_window
    }

    fn usable(&self) -> GpuResult<()> {
        match &self.poisoned {
            Some(m) => Err(host_err(
                "InterNodeGpu",
                format!("unusable after an earlier failure ({m}); its counters may be half-updated: create a new one"),
            )),
            None => Ok(()),
        }
    }

    fn poison_on<T>(&mut self, r: GpuResult<T>) -> GpuResult<T> {
        if let Err(e) = &r {
            self.poisoned = Some(e.to_string());
        }
        r
    }

    /// Every rank's trace stamps of the last dispatch and combine ([`super::trace`]), or
    /// `None` when the options did not ask for tracing.
    pub fn trace(&self) -> GpuResult<Option<Vec<RankStamps>>> {
        if !self.opts.trace {
            return Ok(None);
        }
        let (w, tb) = (self.layout.world, self.opts.trace_blocks());
        let mut out = Vec::with_capacity(w);
        for (r, gr) in self.ranks.iter().enumerate() {
            let n = trace_bytes(w, tb);
            let mut b = vec![0u8; n];
            self.rt.copy_dtoh(&mut b, &gr.scratch[6].sub(0, n)?)?;
            out.push(RankStamps::parse(r, w, tb, &b).ok_or_else(|| host_err("trace", "buffer of the wrong length"))?);
        }
        Ok(Some(out))
    }

    /// Per rank: commands and bytes its proxy carried so far.
    pub fn proxy_stats(&self) -> Vec<crate::proxy::RingProxyStats> {
        self.proxies.iter().map(|p| p.stats()).collect()
    }
}

impl Drop for InterNodeGpu {
    fn drop(&mut self) {
        // Kernels still running (a call that gave up) end by their in-kernel deadlines; the
        // buffers they use are freed only after.
        for s in &self.streams {
            let _ = s.synchronize();
        }
        // The proxies stop (nothing posts any more) before the windows go.
        self.proxies.clear();
        for (e, m) in &self.regs {
            let _ = e.deregister_memory(m);
        }
    }
}
