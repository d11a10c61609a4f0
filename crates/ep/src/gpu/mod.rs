//! Intranode dispatch/combine on GPUs: the host side of `kernels/ep_intranode.cu`.
//!
//! [`IntranodeEp`] owns a [`SymmetricHeap`] (one heap per rank, laid out by [`HeapLayout`]),
//! each local rank's `send_map` (`[max_tokens_per_rank, world]` i32: the slot every token
//! got on every destination, -1 = not sent) and status words, and launches one kernel per
//! device covering every local rank on it. Ranks may be spread one per process (IPC) or
//! share a GPU inside one process (the single-H200 setup: 8 ranks, one launch).
//!
//! Received tokens stay in the heap; read them with [`IntranodeEp::recv_slices`] and the
//! count from [`IntranodeEp::sync_status`]. The kernels check expert ids, receive-buffer
//! capacity and every wait's deadline and report through the status words; the host turns
//! a non-zero status into [`EpGpuError::Kernel`] naming the rank and the fault.
//!
//! Performance note: the grid holds `block_num` blocks per local rank and must be resident
//! at once (blocks of different ranks wait for each other); [`IntranodeEp::new`] refuses a
//! grid larger than the device's multiprocessor count.

use crate::config::{EpConfig, Quantization};
use crate::error::EpError;
use mori_gpu::{Device, DeviceBuffer, DeviceSlice, Function, GpuError, KernelArgs, KernelImages, LaunchConfig, Module, Runtime, Stream};
use mori_shmem::{ShmemError, SymmetricHeap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod abi;
mod ops;
mod trace;

pub use abi::HeapLayout;
use abi::{next_seq, Params, RankArgs, FLAG_DROP_OUT_OF_RANGE, FLAG_ONE_DEVICE, FLAG_WEIGHTED};
pub use trace::{perfetto_trace, PerfettoTrace, RankTrace, TraceEvent};

static CUBIN: &[u8] = include_bytes!("../../../../kernels/prebuilt/ep_intranode.sm_90.cubin");
static PTX: &str = include_str!("../../../../kernels/prebuilt/ep_intranode.sm_90.ptx");
static GFX942: &[u8] = include_bytes!("../../../../kernels/prebuilt/ep_intranode.gfx942.hsaco");

/// Most ranks the kernels address (one bit per rank in a token's destination mask).
pub const MAX_GPU_WORLD: usize = 64;

/// Most warps per block of the kernels (built with a 512-thread launch bound, which lets
/// combine keep its 8 in-flight rows in registers).
pub const MAX_GPU_WARPS_PER_BLOCK: usize = 16;

/// Errors of the GPU dispatch/combine path.
#[derive(Debug, thiserror::Error)]
pub enum EpGpuError {
    /// Configuration or argument error (names the input and the limit).
    #[error(transparent)]
    Ep(#[from] EpError),
    /// GPU runtime failure.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// Symmetric heap failure.
    #[error(transparent)]
    Shmem(#[from] ShmemError),
    /// A kernel reported a fault in a rank's status word.
    #[error("rank {rank}: {what}")]
    Kernel {
        /// The rank whose status reported it.
        rank: usize,
        /// The fault, with its details.
        what: String,
    },
}

/// Result of this module.
pub type GpuResult<T> = std::result::Result<T, EpGpuError>;

fn bad(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> EpGpuError {
    EpGpuError::Ep(crate::config::invalid_arg(field, value, &reason.into()))
}

/// One rank's dispatch inputs, in device memory of the rank's GPU.
#[derive(Debug, Clone, Copy)]
pub struct DispatchInput<'a> {
    /// `[T, hidden]` rows of `elem_size` bytes each element.
    pub x: DeviceSlice<'a>,
    /// `[T, top_k]` f32 weights, or `None` (received weights are then left unwritten).
    pub weights: Option<DeviceSlice<'a>>,
    /// `[T, top_k]` expert ids of `idx_size` bytes (-1 = none).
    pub indices: DeviceSlice<'a>,
    /// `[T, scale_dim]` scales of `scale_type_size` bytes, when the config has scales.
    pub scales: Option<DeviceSlice<'a>>,
    /// T, at most `max_tokens_per_rank`.
    pub num_tokens: usize,
}

/// Element sizes and options of one dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchSpec {
    /// Bytes per element of `x`: 1 (fp8), 2 (bf16) or 4 (f32), at most `max_token_type_size`.
    pub elem_size: usize,
    /// Bytes per expert id: 4 (i32) or 8 (i64).
    pub idx_size: usize,
    /// Drop out-of-range expert ids instead of failing.
    pub drop_out_of_range: bool,
}

/// One rank's combine inputs and outputs.
#[derive(Debug, Clone, Copy)]
pub struct CombineInput<'a> {
    /// `[N_recv, hidden]` processed rows in the order dispatch received them; `None` when the
    /// caller wrote them into the heap already ([`IntranodeEp::combine_buffer`]).
    pub x: Option<DeviceSlice<'a>>,
    /// `[N_recv, top_k]` f32 weights (needed for weighted combine and the weights output).
    pub weights: Option<DeviceSlice<'a>>,
    /// The weights are already in the heap ([`IntranodeEp::combine_weights_buffer`]); `weights`
    /// must then be `None`.
    pub weights_in_heap: bool,
    /// `[T, hidden]` output.
    pub out: DeviceSlice<'a>,
    /// `[T, top_k]` f32 output: per slot, the sum of the weights over the receiving ranks.
    pub out_weights: Option<DeviceSlice<'a>>,
}

/// Element sizes and options of one combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CombineSpec {
    /// Input element bytes: 2 (bf16) or 4 (f32).
    pub in_elem: usize,
    /// Output element bytes: 2 (bf16) or 4 (f32).
    pub out_elem: usize,
    /// Scale each rank's row by the sum of that rank's weights over the token's top-k slots it
    /// owns ([`crate::Weighting::RankSlotSum`]).
    pub weighted: bool,
    /// Bytes per expert id of the original indices (as in dispatch).
    pub idx_size: usize,
}

struct LocalRank {
    rank: usize,
    device: Device,
    send_map: DeviceBuffer,
    /// Address of this rank's 8 status words inside its group's status buffer.
    status: u64,
    trace: Option<DeviceBuffer>,
    num_tokens: usize,
}

struct DeviceGroup {
    device: Device,
    ranks: Vec<usize>, // indices into `local`
    /// `u32[ranks.len()][8]` status words, cleared in stream order before each dispatch.
    status: DeviceBuffer,
    /// Device snapshots of the rank arguments, one per distinct set (`crate::gpu_args`).
    snapshots: crate::gpu_args::ArgSnapshots,
    _module: Module,
    dispatch: Function,
    combine: Function,
    /// `mori_ep_seq_advance` and the `u32 [ranks][2]` sequence words it advances (device-
    /// sequence mode, [`IntranodeEp::use_device_sequence`]).
    advance: Function,
    seq_words: DeviceBuffer,
}

/// Returned by [`IntranodeEp::dispatch`] and passed to [`IntranodeEp::combine`]: names the
/// dispatch and borrows its inputs (lifetime `'a`), whose expert ids the combine kernel reads
/// for weighted combine.
#[derive(Debug)]
pub struct DispatchTicket<'a> {
    seq: u32,
    indices: Vec<u64>,
    _borrow: std::marker::PhantomData<&'a ()>,
}

/// What one rank's status word says after an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankStatus {
    /// The rank.
    pub rank: usize,
    /// Tokens received by the last dispatch.
    pub recv_count: usize,
}

/// Intranode dispatch/combine over a symmetric heap.
pub struct IntranodeEp {
    cfg: EpConfig,
    heap: SymmetricHeap,
    layout: HeapLayout,
    local: Vec<LocalRank>,
    groups: Vec<DeviceGroup>,
    dispatch_seq: u32,
    combine_seq: u32,
    timeout: Duration,
    last_idx_size: usize,
    /// Set when [`IntranodeEp::sync_status`] saw a fault: the next dispatch clears the status
    /// words first (otherwise the kernels overwrite the count and the fault word stays 0).
    status_dirty: AtomicBool,
    /// All ranks in this process on one GPU (no IPC peers): device-scope fences suffice.
    one_device: bool,
    /// Sequence numbers live on the device ([`IntranodeEp::use_device_sequence`]).
    device_seq: bool,
}

impl std::fmt::Debug for IntranodeEp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntranodeEp").field("cfg", &self.cfg).field("layout", &self.layout).finish()
    }
}

impl IntranodeEp {
    /// Builds the heap (see [`SymmetricHeap`]) for `cfg` and loads the kernels. `local` lists
    /// this process's ranks and their devices; `boot` exchanges heap handles with the other
    /// processes (`None`: every rank is local). `timeout` bounds every in-kernel wait;
    /// `trace` allocates per-block phase timestamp buffers.
    ///
    /// Errors: configuration errors ([`EpConfig::validate`]; world above [`MAX_GPU_WORLD`];
    /// `top_k` above 32; hidden not a multiple of 8; more blocks than multiprocessors on a
    /// device; scale bytes per token not a multiple of 4), heap and GPU errors.
    pub fn new(
        rt: Arc<dyn Runtime>,
        cfg: &EpConfig,
        local: &[(usize, Device)],
        boot: Option<&dyn mori_bootstrap::Bootstrap>,
        timeout: Duration,
        trace: bool,
    ) -> GpuResult<Self> {
        cfg.validate()?;
        if cfg.world_size > MAX_GPU_WORLD {
            return Err(bad("world_size", cfg.world_size, format!("GPU kernels address at most {MAX_GPU_WORLD} ranks")));
        }
        if !cfg.hidden.is_multiple_of(8) {
            return Err(bad("hidden", cfg.hidden, "GPU combine works on 8 elements at a time: must be a multiple of 8"));
        }
        if !(cfg.scale_dim * cfg.scale_type_size).is_multiple_of(4) {
            return Err(bad("scale_dim x scale_type_size", cfg.scale_dim * cfg.scale_type_size, "must be a multiple of 4 bytes"));
        }
        if cfg.warps_per_block > MAX_GPU_WARPS_PER_BLOCK {
            return Err(bad(
                "warps_per_block",
                cfg.warps_per_block,
                format!("the GPU kernels are built for at most {MAX_GPU_WARPS_PER_BLOCK} warps (512 threads) per block"),
            ));
        }
        if cfg.quant != Quantization::None {
            return Err(bad("quant", format!("{:?}", cfg.quant), "the GPU kernels move tokens in their own dtype only"));
        }
        if local.is_empty() {
            return Err(bad("local ranks", 0, "at least one rank must live in this process"));
        }
        let layout = HeapLayout::new(cfg)?;
        let bytes = usize::try_from(layout.total).map_err(|_| EpError::SizeOverflow { what: "heap bytes", limit: "usize" })?;
        let heap = match boot {
            Some(b) => SymmetricHeap::with_bootstrap(rt.clone(), b, local, cfg.world_size, bytes)?,
            None => {
                if local.len() != cfg.world_size || local.iter().enumerate().any(|(i, &(r, _))| i != r) {
                    return Err(bad(
                        "local ranks",
                        local.len(),
                        format!("without a bootstrap, ranks 0..{} must all be local, in order", cfg.world_size),
                    ));
                }
                let devs: Vec<Device> = local.iter().map(|&(_, d)| d).collect();
                SymmetricHeap::in_process(rt.clone(), &devs, bytes)?
            }
        };
        let mut ranks = Vec::with_capacity(local.len());
        for &(rank, device) in local {
            let send_map = rt.alloc(device, (cfg.max_tokens_per_rank * cfg.world_size * 4).max(4))?;
            rt.memset(&send_map.slice(), 0xff)?;
            let trace = if trace {
                let t =
                    rt.alloc(device, cfg.block_num.checked_mul(64).ok_or(EpError::SizeOverflow { what: "trace bytes", limit: "usize" })?)?;
                rt.memset(&t.slice(), 0)?;
                Some(t)
            } else {
                None
            };
            ranks.push(LocalRank { rank, device, send_map, status: 0, trace, num_tokens: 0 });
        }
        let mut devs: Vec<Device> = local.iter().map(|&(_, d)| d).collect();
        devs.sort_by_key(|d| d.0);
        devs.dedup();
        let mut groups = Vec::new();
        for device in devs {
            let members: Vec<usize> = (0..ranks.len()).filter(|&i| ranks[i].device == device).collect();
            let sms = rt.device_properties(device)?.multiprocessors as usize;
            let blocks = members.len().saturating_mul(cfg.block_num);
            if sms > 0 && blocks > sms {
                return Err(bad(
                    "block_num",
                    cfg.block_num,
                    format!(
                        "{} ranks x {} blocks = {blocks} blocks on {device}, which has {sms} multiprocessors: every block must be resident at once (lower block_num)",
                        members.len(),
                        cfg.block_num
                    ),
                ));
            }
            let snapshots = crate::gpu_args::ArgSnapshots::new(rt.clone(), device)?;
            let status = rt.alloc(device, members.len() * 32)?;
            rt.memset(&status.slice(), 0)?;
            for (k, &i) in members.iter().enumerate() {
                ranks[i].status = status.ptr() + 32 * k as u64;
            }
            let module = load_module(rt.as_ref(), device)?;
            let dispatch = module.function("mori_ep_dispatch")?;
            let combine = module.function("mori_ep_combine")?;
            let advance = module.function("mori_ep_seq_advance")?;
            let seq_words = rt.alloc(device, members.len() * 8)?;
            rt.memset(&seq_words.slice(), 0)?;
            groups.push(DeviceGroup { device, ranks: members, status, snapshots, _module: module, dispatch, combine, advance, seq_words });
        }
        let one_device = boot.is_none() && groups.len() == 1;
        Ok(IntranodeEp {
            cfg: cfg.clone(),
            heap,
            layout,
            local: ranks,
            groups,
            dispatch_seq: 0,
            combine_seq: 0,
            timeout,
            last_idx_size: 8,
            status_dirty: AtomicBool::new(false),
            one_device,
            device_seq: false,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EpConfig {
        &self.cfg
    }

    /// The heap layout.
    pub fn layout(&self) -> &HeapLayout {
        &self.layout
    }

    /// The symmetric heap.
    pub fn heap(&self) -> &SymmetricHeap {
        &self.heap
    }

    /// This process's ranks, in the order given to [`IntranodeEp::new`].
    pub fn local_ranks(&self) -> Vec<usize> {
        self.local.iter().map(|l| l.rank).collect()
    }

    /// The devices with local ranks (one launch and one stream each).
    pub fn devices(&self) -> Vec<Device> {
        self.groups.iter().map(|g| g.device).collect()
    }

    fn local_index(&self, rank: usize) -> GpuResult<usize> {
        self.local.iter().position(|l| l.rank == rank).ok_or_else(|| bad("rank", rank, "is not hosted by this process"))
    }

    /// Rank `rank`'s combine input region `[max_recv_tokens, hidden]` of `elem` bytes per element
    /// (write expert outputs here and pass `x: None` to skip the staging copy).
    pub fn combine_buffer(&self, rank: usize, elem: usize) -> GpuResult<DeviceSlice<'_>> {
        self.local_index(rank)?;
        let len = self.cfg.max_recv_tokens * self.cfg.hidden * elem;
        if elem > self.cfg.max_token_type_size {
            return Err(bad("combine element size", elem, format!("exceeds max_token_type_size = {}", self.cfg.max_token_type_size)));
        }
        Ok(self.heap.slice(rank, self.layout.comb_x as usize, len)?)
    }

    /// Rank `rank`'s combine weights region `[max_recv_tokens, top_k]` f32 (write weights here
    /// and set [`CombineInput::weights_in_heap`] to skip the staging copy).
    pub fn combine_weights_buffer(&self, rank: usize) -> GpuResult<DeviceSlice<'_>> {
        self.local_index(rank)?;
        let len = self.cfg.max_recv_tokens * self.cfg.top_k * 4;
        Ok(self.heap.slice(rank, self.layout.comb_w as usize, len)?)
    }

    /// Slices of rank `rank`'s received data for `n` tokens: `(x [n, hidden * elem], weights
    /// [n, K] f32, indices [n, K * idx_size], scales [n, scale bytes], src [n] i32)`.
    pub fn recv_slices(&self, rank: usize, n: usize, elem: usize, idx_size: usize) -> GpuResult<[DeviceSlice<'_>; 5]> {
        self.local_index(rank)?;
        if n > self.cfg.max_recv_tokens {
            return Err(bad("received tokens", n, format!("above max_recv_tokens = {}", self.cfg.max_recv_tokens)));
        }
        let (c, l) = (&self.cfg, &self.layout);
        let h = &self.heap;
        Ok([
            h.slice(rank, l.recv_x as usize, n * c.hidden * elem)?,
            h.slice(rank, l.recv_w as usize, n * c.top_k * 4)?,
            h.slice(rank, l.recv_idx as usize, n * c.top_k * idx_size)?,
            h.slice(rank, l.recv_scales as usize, n * c.scale_dim * c.scale_type_size)?,
            h.slice(rank, l.recv_src as usize, n * 4)?,
        ])
    }

    /// Rank `rank`'s send map `[T, world]` i32 of the last dispatch (slot per destination, -1).
    pub fn send_map(&self, rank: usize) -> GpuResult<DeviceSlice<'_>> {
        let i = self.local_index(rank)?;
        let l = &self.local[i];
        Ok(l.send_map.sub(0, l.num_tokens * self.cfg.world_size * 4)?)
    }

    /// Test hook (hidden from the docs): continues both sequences from `seq`, as if `seq`
    /// dispatches and combines had run, by storing `seq` in every local rank's dispatch signals
    /// (`seq << 32 | 1`: an empty send) and combine flags. Lets a test cross the 2^32 wrap
    /// without 2^32 launches. Call it with nothing queued, in every process, before any rank's
    /// next operation. Errors: heap and GPU errors.
    #[doc(hidden)]
    pub fn set_sequence_for_tests(&mut self, seq: u32) -> GpuResult<()> {
        let n = self.cfg.world_size * self.cfg.block_num;
        let words = |v: u64| -> Vec<u8> { (0..n).flat_map(|_| v.to_le_bytes()).collect() };
        let (signals, flags) = (words(u64::from(seq) << 32 | 1), words(u64::from(seq)));
        let rt = self.heap.runtime().clone();
        for l in &self.local {
            rt.copy_htod(&self.heap.slice(l.rank, self.layout.signals as usize, n * 8)?, &signals)?;
            rt.copy_htod(&self.heap.slice(l.rank, self.layout.comb_flags as usize, n * 8)?, &flags)?;
        }
        self.dispatch_seq = seq;
        self.combine_seq = seq;
        Ok(())
    }

    fn params(&self, group: &DeviceGroup, rank_args: u64, seq: u32, flags: u32) -> Params {
        let mut heap = [0u64; MAX_GPU_WORLD];
        heap[..self.heap.world()].copy_from_slice(self.heap.addrs());
        let l = &self.layout;
        let c = &self.cfg;
        Params {
            heap,
            lay: [l.recv_x, l.recv_w, l.recv_idx, l.recv_scales, l.recv_src, l.comb_x, l.comb_w, l.counters, l.signals, l.comb_flags],
            rank_args,
            // The kernels compute `clock + timeout_ns`: capped at 2^62 ns (~146 years) so that a
            // huge timeout means "no deadline" instead of wrapping into an immediate timeout.
            timeout_ns: self.timeout.as_nanos().min(1u128 << 62) as u64,
            num_local: group.ranks.len() as u32,
            world: c.world_size as u32,
            blocks_per_rank: c.block_num as u32,
            row_bytes: 0,
            hidden: c.hidden as u32,
            top_k: c.top_k as u32,
            idx_size: 8,
            scale_bytes: (c.scale_dim * c.scale_type_size) as u32,
            experts_per_rank: c.experts_per_rank as u32,
            max_tokens: c.max_tokens_per_rank as u32,
            max_recv: c.max_recv_tokens as u32,
            seq,
            flags: flags | if self.one_device { FLAG_ONE_DEVICE } else { 0 },
            comb_in_elem: 2,
            comb_out_elem: 2,
            pad: 0,
        }
    }

    /// The device address of `args`' snapshot on `group`'s device (uploaded on `stream` the
    /// first time this set is seen).
    fn upload_args(group: &mut DeviceGroup, args: &[RankArgs], stream: &Stream) -> GpuResult<u64> {
        // SAFETY: RankArgs is repr(C) plain data (u32 fields in pairs, then u64s: no
        // padding); the bytes are copied as-is.
        let bytes = unsafe { std::slice::from_raw_parts(args.as_ptr().cast::<u8>(), std::mem::size_of_val(args)) };
        group.snapshots.get(bytes, stream)
    }

    /// Distinct rank-argument sets uploaded so far, over all devices (each kept on the device,
    /// see `crate::gpu_args`): grows only when calls use new tensors.
    pub fn argument_snapshots(&self) -> usize {
        self.groups.iter().map(|g| g.snapshots.len()).sum()
    }

    /// Device address of local rank `i`'s received-token count (a `u32` the last dispatch's
    /// kernel wrote; `local_ranks()[i]`), for reading it on the device without a host
    /// synchronisation.
    pub fn recv_count_ptr(&self, i: usize) -> GpuResult<u64> {
        self.local.get(i).map(|l| l.status).ok_or_else(|| bad("local rank index", i, format!("{} ranks are local", self.local.len())))
    }

    /// Makes every later dispatch and combine take its sequence number from a word on the
    /// device that a one-thread kernel advances right before it, instead of from the launch
    /// parameters: a CUDA graph that captured the calls then gets a fresh sequence on every
    /// replay (with sequences in the parameters, a replay would reuse the captured one and
    /// read the previous replay's signals as its own). Costs one extra tiny launch per call.
    /// Every process of the group must switch before its first dispatch.
    /// Errors: `InvalidConfig` after a dispatch was queued.
    pub fn use_device_sequence(&mut self) -> GpuResult<()> {
        if self.dispatch_seq != 0 || self.combine_seq != 0 {
            return Err(bad("device sequence", self.dispatch_seq, "must be chosen before the first dispatch"));
        }
        self.device_seq = true;
        Ok(())
    }

    /// The `seq_word` of local rank member `k` of `g`, and queues the advance of word `which`
    /// on `stream` (device-sequence mode; 0 otherwise).
    fn advance_seq(&self, g: &DeviceGroup, which: u32, stream: &Stream) -> GpuResult<u64> {
        if !self.device_seq {
            return Ok(0);
        }
        let cfg = LaunchConfig { grid: (1, 1, 1), block: (g.ranks.len().next_multiple_of(32) as u32, 1, 1), shared_mem_bytes: 0 };
        let mut args = KernelArgs::new();
        args.push(g.seq_words.ptr());
        args.push(g.ranks.len() as u32);
        args.push(which);
        // SAFETY: the kernel takes (u64 words, u32 n, u32 which) and writes words[2 * i + which]
        // for i < n: inside the group's `n * 8`-byte sequence buffer.
        unsafe { g.advance.launch(stream, &cfg, &args.params())? };
        Ok(g.seq_words.ptr())
    }

    fn launch(&self, group: &DeviceGroup, combine: bool, stream: &Stream, p: Params) -> GpuResult<()> {
        let cfg = LaunchConfig {
            grid: ((group.ranks.len() * self.cfg.block_num) as u32, 1, 1),
            block: ((self.cfg.warps_per_block * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = KernelArgs::new();
        args.push(p);
        let f = if combine { &group.combine } else { &group.dispatch };
        // SAFETY: the kernel takes one EpParams by value (Params mirrors it); every address in
        // it is a live heap, send map, status, trace or caller buffer checked for size.
        unsafe { f.launch(stream, &cfg, &args.params())? };
        Ok(())
    }

    fn check_stream(&self, streams: &[&Stream]) -> GpuResult<()> {
        if streams.len() != self.groups.len() {
            return Err(bad("streams", streams.len(), format!("one per device with local ranks ({})", self.groups.len())));
        }
        for (s, g) in streams.iter().zip(&self.groups) {
            if s.device() != g.device {
                return Err(bad("streams", s.device(), format!("stream order must follow devices() ({})", g.device)));
            }
        }
        Ok(())
    }
}

fn need(what: &'static str, rank: usize, got: usize, want: usize) -> GpuResult<()> {
    if got < want {
        return Err(bad(what, got, format!("rank {rank}'s buffer is {got} bytes; its shape needs {want}")));
    }
    Ok(())
}

fn load_module(rt: &dyn Runtime, dev: Device) -> GpuResult<Module> {
    Ok(KernelImages { cubin: CUBIN, ptx: PTX, hsaco: GFX942 }.load(rt, dev)?)
}
