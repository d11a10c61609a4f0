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

static CUBIN: &[u8] = include_bytes!("../../../kernels/prebuilt/ep_intranode.sm_90.cubin");
static PTX: &str = include_str!("../../../kernels/prebuilt/ep_intranode.sm_90.ptx");
static GFX942: &[u8] = include_bytes!("../../../kernels/prebuilt/ep_intranode.gfx942.hsaco");

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

/// Byte offsets of the regions inside every rank's heap (256-byte aligned), for
/// `max_recv_tokens` slots. Sizes: `recv_x` and `comb_x` hold `hidden x max_token_type_size`
/// bytes per slot, weights `top_k x 4`, indices `top_k x 8`, scales `scale_dim x
/// scale_type_size`, sources 4; then two u32 slot counters and two `u64[world x block_num]`
/// flag arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct HeapLayout {
    /// Received rows.
    pub recv_x: u64,
    /// Received weights (f32).
    pub recv_w: u64,
    /// Received expert ids.
    pub recv_idx: u64,
    /// Received scales.
    pub recv_scales: u64,
    /// Received flat source positions (i32, `src_rank * max_tokens_per_rank + token`).
    pub recv_src: u64,
    /// Combine input rows.
    pub comb_x: u64,
    /// Combine input weights (f32).
    pub comb_w: u64,
    /// Slot counters.
    pub counters: u64,
    /// Dispatch signals.
    pub signals: u64,
    /// Combine arrival flags.
    pub comb_flags: u64,
    /// Total bytes.
    pub total: u64,
}

impl HeapLayout {
    /// The layout for `cfg`. Errors: [`EpError::SizeOverflow`] when a region overflows.
    pub fn new(cfg: &EpConfig) -> GpuResult<Self> {
        let n = cfg.max_recv_tokens as u64;
        let row = (cfg.hidden * cfg.max_token_type_size) as u64;
        let flags = (cfg.world_size as u64).checked_mul(cfg.block_num as u64).and_then(|v| v.checked_mul(8));
        let sizes = [
            n.checked_mul(row),
            n.checked_mul(cfg.top_k as u64 * 4),
            n.checked_mul(cfg.top_k as u64 * 8),
            n.checked_mul((cfg.scale_dim * cfg.scale_type_size) as u64),
            n.checked_mul(4),
            n.checked_mul(row),
            n.checked_mul(cfg.top_k as u64 * 4),
            Some(16),
            flags,
            flags,
        ];
        let mut offs = [0u64; 11];
        let mut at = 0u64;
        for (i, s) in sizes.iter().enumerate() {
            offs[i] = at;
            let s = s.ok_or(EpError::SizeOverflow { what: "heap region bytes", limit: "u64" })?;
            at = at.checked_add(s.div_ceil(256) * 256).ok_or(EpError::SizeOverflow { what: "heap bytes", limit: "u64" })?;
        }
        offs[10] = at;
        let [recv_x, recv_w, recv_idx, recv_scales, recv_src, comb_x, comb_w, counters, signals, comb_flags, total] = offs;
        Ok(HeapLayout { recv_x, recv_w, recv_idx, recv_scales, recv_src, comb_x, comb_w, counters, signals, comb_flags, total })
    }
}

/// `EpRankArgs` of the kernel ABI (kernels/ep_intranode.cu).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C)]
struct RankArgs {
    rank: u32,
    num_tokens: u32,
    comb_in_rows: u32,
    comb_w_rows: u32,
    x: u64,
    weights: u64,
    idx: u64,
    scales: u64,
    send_map: u64,
    comb_in: u64,
    comb_w_in: u64,
    out: u64,
    out_w: u64,
    status: u64,
    trace: u64,
    /// `u32 [2]` (dispatch, combine) sequence words on the device, or 0 (use `Params::seq`).
    seq_word: u64,
}

/// `EpParams` of the kernel ABI: 672 bytes.
#[derive(Clone, Copy)]
#[repr(C)]
struct Params {
    heap: [u64; MAX_GPU_WORLD],
    lay: [u64; 10],
    rank_args: u64,
    timeout_ns: u64,
    num_local: u32,
    world: u32,
    blocks_per_rank: u32,
    row_bytes: u32,
    hidden: u32,
    top_k: u32,
    idx_size: u32,
    scale_bytes: u32,
    experts_per_rank: u32,
    max_tokens: u32,
    max_recv: u32,
    seq: u32,
    flags: u32,
    comb_in_elem: u32,
    comb_out_elem: u32,
    pad: u32,
}

/// The sequence number of the operation after `seq`: dispatches and combines each count
/// their own, wrapping at 2^32 with 0 an ordinary value. Skipping 0 would break the kernels'
/// slot-counter parity ([`counter_parity`]) at the wrap: `u32::MAX` and 1 are both odd.
const fn next_seq(seq: u32) -> u32 {
    seq.wrapping_add(1)
}

/// Whether a flag holding sequence `flag` has reached operation `want`: the kernels'
/// `ep_seq_reached` (kernels/ep_intranode.cu), serial-number arithmetic over 2^32. `flag` may
/// be `want` or up to 2^31 - 1 past it; every block signals every rank on every operation, so
/// a flag is at most one operation behind (not reached) or one ahead (a peer already past this
/// barrier). A plain `flag >= want` took a flag left at `u32::MAX` for operation 0's.
/// (The kernels decide; the host keeps this mirror for its tests.)
#[cfg(test)]
const fn seq_reached(flag: u32, want: u32) -> bool {
    flag.wrapping_sub(want) as i32 >= 0
}

/// Which of a rank's two slot counters a dispatch reserves on (the kernels' `seq & 1`): it
/// alternates between consecutive dispatches, so a dispatch never adds to the counter the
/// previous one's receiver is still resetting.
#[cfg(test)]
const fn counter_parity(seq: u32) -> u32 {
    seq & 1
}

const FLAG_DROP_OUT_OF_RANGE: u32 = 1;
const FLAG_WEIGHTED: u32 = 2;
/// Every rank's heap is on the one GPU of the launch: the kernels synchronize at device scope.
const FLAG_ONE_DEVICE: u32 = 4;

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

    /// Queues a dispatch of every local rank's tokens (`inputs[i]` for `local_ranks()[i]`) on
    /// `streams` (one per entry of [`IntranodeEp::devices`]). Every process must call it.
    /// Read the outcome with [`IntranodeEp::sync_status`] after the streams ran it.
    ///
    /// Returns the [`DispatchTicket`] that [`IntranodeEp::combine`] takes: it borrows the
    /// inputs' expert ids (weighted combine reads them on the GPU), so they cannot be freed
    /// before the combine is queued.
    ///
    /// Errors: [`EpError::InvalidConfig`] / [`EpError::TooManyTokens`] for a wrong number of
    /// inputs, element sizes, token counts above `max_tokens_per_rank`, or buffers shorter than
    /// their shape (each names the input); GPU errors.
    pub fn dispatch<'a>(&mut self, inputs: &[DispatchInput<'a>], spec: DispatchSpec, streams: &[&Stream]) -> GpuResult<DispatchTicket<'a>> {
        self.check_stream(streams)?;
        let c = self.cfg.clone();
        if inputs.len() != self.local.len() {
            return Err(bad("dispatch inputs", inputs.len(), format!("one per local rank ({})", self.local.len())));
        }
        if ![1, 2, 4].contains(&spec.elem_size) || spec.elem_size > c.max_token_type_size {
            return Err(bad(
                "elem_size",
                spec.elem_size,
                format!("must be 1, 2 or 4 and at most max_token_type_size = {}", c.max_token_type_size),
            ));
        }
        if ![4, 8].contains(&spec.idx_size) {
            return Err(bad("idx_size", spec.idx_size, "must be 4 (i32) or 8 (i64)"));
        }
        let row_bytes = c.hidden * spec.elem_size;
        if !row_bytes.is_multiple_of(16) {
            return Err(EpError::HiddenBytesNotAligned { what: "x", hidden: c.hidden, elem_size: spec.elem_size, bytes: row_bytes }.into());
        }
        for (i, inp) in inputs.iter().enumerate() {
            let rank = self.local[i].rank;
            let t = inp.num_tokens;
            if t > c.max_tokens_per_rank {
                return Err(EpError::TooManyTokens { rank, tokens: t, limit: c.max_tokens_per_rank }.into());
            }
            need("x", rank, inp.x.len(), t * row_bytes)?;
            need("indices", rank, inp.indices.len(), t * c.top_k * spec.idx_size)?;
            if let Some(w) = &inp.weights {
                need("weights", rank, w.len(), t * c.top_k * 4)?;
            }
            match (&inp.scales, c.scale_dim) {
                (Some(s), d) if d > 0 => need("scales", rank, s.len(), t * d * c.scale_type_size)?,
                (None, 0) => {}
                (given, d) => return Err(EpError::ScalesPresence { rank, scale_dim: d, given: given.is_some() }.into()),
            }
            for (what, s) in
                [("x", Some(&inp.x)), ("indices", Some(&inp.indices)), ("weights", inp.weights.as_ref()), ("scales", inp.scales.as_ref())]
            {
                if let Some(s) = s {
                    if s.device() != self.local[i].device {
                        return Err(bad(what, s.device(), format!("rank {rank}'s input must live on its {}", self.local[i].device)));
                    }
                }
            }
        }
        self.dispatch_seq = next_seq(self.dispatch_seq);
        self.last_idx_size = spec.idx_size;
        let rt = self.heap.runtime().clone();
        for (i, inp) in inputs.iter().enumerate() {
            let l = &mut self.local[i];
            l.num_tokens = inp.num_tokens;
        }
        if self.status_dirty.swap(false, Ordering::AcqRel) {
            for (g, stream) in self.groups.iter().zip(streams) {
                // Clear the status words in stream order (one async memset per device).
                // SAFETY: the status buffer is live device memory of g.device; the stream is live.
                unsafe { rt.raw().memset(g.device, g.status.ptr(), 0, g.status.len(), Some(stream.raw()))? };
            }
        }
        let mut groups = std::mem::take(&mut self.groups);
        let result: GpuResult<()> = (|| {
            for (g, stream) in groups.iter_mut().zip(streams) {
                let seq_base = self.advance_seq(g, 0, stream)?;
                let args: Vec<RankArgs> = g
                    .ranks
                    .iter()
                    .enumerate()
                    .map(|(k, &i)| {
                        let (l, inp) = (&self.local[i], &inputs[i]);
                        RankArgs {
                            rank: l.rank as u32,
                            num_tokens: inp.num_tokens as u32,
                            x: inp.x.ptr(),
                            weights: inp.weights.map_or(0, |w| w.ptr()),
                            idx: inp.indices.ptr(),
                            scales: inp.scales.map_or(0, |s| s.ptr()),
                            send_map: l.send_map.ptr(),
                            status: l.status,
                            trace: l.trace.as_ref().map_or(0, |t| t.ptr()),
                            seq_word: if seq_base == 0 { 0 } else { seq_base + 8 * k as u64 },
                            ..RankArgs::default()
                        }
                    })
                    .collect();
                let rank_args = Self::upload_args(g, &args, stream)?;
                let mut p = self.params(g, rank_args, self.dispatch_seq, if spec.drop_out_of_range { FLAG_DROP_OUT_OF_RANGE } else { 0 });
                p.row_bytes = row_bytes as u32;
                p.idx_size = spec.idx_size as u32;
                self.launch(g, false, stream, p)?;
            }
            Ok(())
        })();
        self.groups = groups;
        result?;
        Ok(DispatchTicket {
            seq: self.dispatch_seq,
            indices: inputs.iter().map(|inp| inp.indices.ptr()).collect(),
            _borrow: std::marker::PhantomData,
        })
    }

    /// Queues a combine of every local rank (`inputs[i]` for `local_ranks()[i]`), after the
    /// dispatch whose `ticket` it gets (the last one: its send maps are the ones kept). Every
    /// process must call it.
    ///
    /// Errors: [`EpError::InvalidConfig`] for a ticket of an earlier dispatch, element sizes,
    /// missing weights for a weighted combine, or buffers shorter than their shape; GPU errors.
    pub fn combine(
        &mut self,
        ticket: &DispatchTicket<'_>,
        inputs: &[CombineInput<'_>],
        spec: CombineSpec,
        streams: &[&Stream],
    ) -> GpuResult<()> {
        self.check_stream(streams)?;
        if ticket.seq != self.dispatch_seq || ticket.indices.len() != self.local.len() {
            return Err(bad(
                "combine ticket",
                ticket.seq,
                format!("is not from the last dispatch ({}): combine must follow its own dispatch", self.dispatch_seq),
            ));
        }
        let c = self.cfg.clone();
        if inputs.len() != self.local.len() {
            return Err(bad("combine inputs", inputs.len(), format!("one per local rank ({})", self.local.len())));
        }
        for (what, v) in [("in_elem", spec.in_elem), ("out_elem", spec.out_elem)] {
            if ![2, 4].contains(&v) {
                return Err(bad(what, v, "must be 2 (bf16) or 4 (f32)"));
            }
        }
        if spec.in_elem > c.max_token_type_size {
            return Err(bad("in_elem", spec.in_elem, format!("exceeds max_token_type_size = {}", c.max_token_type_size)));
        }
        if spec.idx_size != self.last_idx_size {
            return Err(bad("idx_size", spec.idx_size, format!("differs from the dispatch's {}", self.last_idx_size)));
        }
        for (i, inp) in inputs.iter().enumerate() {
            let (rank, t) = (self.local[i].rank, self.local[i].num_tokens);
            // The received count is only known on the GPU: the kernel checks it against the
            // rows these buffers hold (EP_ERR_COMBINE_ROWS) before staging anything.
            if inp.weights_in_heap && inp.weights.is_some() {
                return Err(bad("combine weights", rank, "given both as a buffer and as already in the heap"));
            }
            if inp.weights.is_none() && spec.weighted && !inp.weights_in_heap {
                return Err(EpError::WeightsRequired { weighting: "RankSlotSum" }.into());
            }
            need("combine out", rank, inp.out.len(), t * c.hidden * spec.out_elem)?;
            if inp.out_weights.is_some() && inp.weights.is_none() && !inp.weights_in_heap {
                return Err(bad("combine out weights", rank, "need combine weights (a buffer or weights_in_heap) to sum"));
            }
            if let Some(w) = &inp.out_weights {
                need("combine out weights", rank, w.len(), t * c.top_k * 4)?;
            }
        }
        self.combine_seq = next_seq(self.combine_seq);
        let comb_x = self.layout.comb_x;
        let mut groups = std::mem::take(&mut self.groups);
        let result = (|| {
            for (g, stream) in groups.iter_mut().zip(streams) {
                let seq_base = self.advance_seq(g, 1, stream)?;
                let mut args = Vec::with_capacity(g.ranks.len());
                for (k, &i) in g.ranks.iter().enumerate() {
                    let (l, inp) = (&self.local[i], &inputs[i]);
                    let rows = |s: Option<DeviceSlice<'_>>, row: usize| s.map_or(0, |s| (s.len() / row).min(u32::MAX as usize) as u32);
                    args.push(RankArgs {
                        rank: l.rank as u32,
                        num_tokens: l.num_tokens as u32,
                        comb_in_rows: rows(inp.x, c.hidden * spec.in_elem),
                        comb_w_rows: rows(inp.weights, c.top_k * 4),
                        idx: ticket.indices[i],
                        send_map: l.send_map.ptr(),
                        comb_in: inp.x.map_or(self.heap.addr(l.rank)? + comb_x, |x| x.ptr()),
                        comb_w_in: match (inp.weights, inp.weights_in_heap) {
                            (Some(w), _) => w.ptr(),
                            (None, true) => self.heap.addr(l.rank)? + self.layout.comb_w,
                            (None, false) => 0,
                        },
                        out: inp.out.ptr(),
                        out_w: inp.out_weights.map_or(0, |w| w.ptr()),
                        status: l.status,
                        trace: l.trace.as_ref().map_or(0, |t| t.ptr()),
                        seq_word: if seq_base == 0 { 0 } else { seq_base + 8 * k as u64 },
                        ..RankArgs::default()
                    });
                }
                let rank_args = Self::upload_args(g, &args, stream)?;
                let mut p = self.params(g, rank_args, self.combine_seq, if spec.weighted { FLAG_WEIGHTED } else { 0 });
                p.idx_size = spec.idx_size as u32;
                p.comb_in_elem = spec.in_elem as u32;
                p.comb_out_elem = spec.out_elem as u32;
                self.launch(g, true, stream, p)?;
            }
            Ok(())
        })();
        self.groups = groups;
        result
    }

    /// Reads every local rank's status word (synchronous: waits for queued work touching it).
    /// Returns the received counts of the last dispatch.
    ///
    /// Errors: [`EpGpuError::Kernel`] for the first rank whose kernel reported a fault.
    pub fn sync_status(&self) -> GpuResult<Vec<RankStatus>> {
        let rt = self.heap.runtime();
        let mut words = vec![[0u8; 32]; self.local.len()];
        for g in &self.groups {
            let mut b = vec![0u8; g.status.len()];
            rt.copy_dtoh(&mut b, &g.status.slice())?;
            for (k, &i) in g.ranks.iter().enumerate() {
                words[i].copy_from_slice(&b[32 * k..32 * k + 32]);
            }
        }
        let mut out = Vec::with_capacity(self.local.len());
        for (l, b) in self.local.iter().zip(&words) {
            let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
            let what = match w(1) {
                0 => None,
                1 => Some(format!(
                    "expert id {} of token {} slot {} is outside 0..{} (or -1)",
                    w(4) as i32,
                    w(2),
                    w(3),
                    self.cfg.num_experts()
                )),
                2 => Some(format!(
                    "receive buffer of rank {} overflows: {} slots wanted, max_recv_tokens = {}",
                    w(2),
                    w(3),
                    w(4)
                )),
                3 => Some(format!(
                    "{} wait timed out after {:?}: block {} of rank {} never signalled (a rank that did not call, or blocks not co-resident)",
                    if w(2) == 1 { "dispatch" } else { "combine" },
                    self.timeout,
                    w(4),
                    w(3)
                )),
                4 => Some(format!("announced {} received tokens, above max_recv_tokens = {}", w(2), w(3))),
                5 => Some(format!(
                    "combine {} buffer holds {} rows but {} tokens were received",
                    if w(2) == 0 { "input" } else { "weights" },
                    w(3),
                    w(4)
                )),
                code => Some(format!("unknown kernel status {code}")),
            };
            if let Some(what) = what {
                self.status_dirty.store(true, Ordering::Release);
                return Err(EpGpuError::Kernel { rank: l.rank, what });
            }
            out.push(RankStatus { rank: l.rank, recv_count: w(0) as usize });
        }
        Ok(out)
    }

    /// Per local rank and block, the phase timestamps (ns) of the last dispatch and combine:
    /// `[dispatch start, send done, receive done (block 0), combine start, barrier done, end]`;
    /// `None` when built without tracing.
    pub fn trace(&self) -> GpuResult<Option<Vec<RankTrace>>> {
        let rt = self.heap.runtime();
        let mut out = Vec::new();
        for l in &self.local {
            let Some(t) = &l.trace else { return Ok(None) };
            let mut b = vec![0u8; t.len()];
            rt.copy_dtoh(&mut b, &t.slice())?;
            let blocks = b
                .chunks(64)
                .map(|c| {
                    let mut ts = [0u64; 6];
                    for (i, v) in ts.iter_mut().enumerate() {
                        *v = u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap_or_default());
                    }
                    ts
                })
                .collect();
            out.push((l.rank, blocks));
        }
        Ok(Some(out))
    }
}

/// One rank's phase timestamps: (rank, per block `[dispatch start, send done, receive done,
/// combine start, barrier done, end]` in ns of the GPU clock; 0 = not stamped).
pub type RankTrace = (usize, Vec<[u64; 6]>);

/// One event of a Perfetto / Chrome trace (the JSON object format's fields).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TraceEvent {
    /// Phase name, as upstream's intranode profiler names it.
    pub name: String,
    /// `B` (begin) or `E` (end).
    pub ph: &'static str,
    /// Microseconds from the earliest stamp of the trace.
    pub ts: f64,
    /// The rank.
    pub pid: usize,
    /// The block.
    pub tid: usize,
}

/// A Perfetto / Chrome trace: `{"traceEvents": [...], "displayTimeUnit": "ns"}` once
/// serialized (serde; `serde_json::to_string` writes what `mori trace analyze` reads).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PerfettoTrace {
    /// The events, rank by rank, block by block, phase by phase; each begin before its end.
    pub trace_events: Vec<TraceEvent>,
    /// Always `ns`: how viewers show the times.
    pub display_time_unit: &'static str,
}

/// Phases of [`perfetto_trace`]: (name, start stamp, end stamp) indices into a block's
/// [`RankTrace`] stamps.
const TRACE_PHASES: [(&str, usize, usize); 4] =
    [("dispatch_intra", 0, 1), ("dispatch_sync", 1, 2), ("combine_sync", 3, 4), ("combine_intra_node", 4, 5)];

/// Perfetto / Chrome trace (`traceEvents`, `ph` B/E, `ts` in µs from the earliest stamp) of
/// [`IntranodeEp::trace`]'s output: one process per rank, one thread per block, phases named
/// as upstream's intranode profiler names them (so `mori trace analyze` reads them):
/// `dispatch_intra` (send), `dispatch_sync` (block 0 waiting for every block's signal),
/// `combine_sync` (cross-rank barrier), `combine_intra_node` (gather and accumulate). A phase
/// whose start is unstamped (0) or whose end precedes its start is left out.
pub fn perfetto_trace(trace: &[RankTrace]) -> PerfettoTrace {
    let t0 = trace.iter().flat_map(|(_, b)| b.iter().flat_map(|t| t.iter())).filter(|&&v| v > 0).min().copied().unwrap_or(0);
    let us = |v: u64| (v.saturating_sub(t0)) as f64 / 1000.0;
    let mut ev = Vec::new();
    for &(rank, ref blocks) in trace {
        for (b, t) in blocks.iter().enumerate() {
            for (name, s, e) in TRACE_PHASES {
                if t[s] > 0 && t[e] >= t[s] {
                    for (ph, at) in [("B", t[s]), ("E", t[e])] {
                        ev.push(TraceEvent { name: name.to_string(), ph, ts: us(at), pid: rank, tid: b });
                    }
                }
            }
        }
    }
    PerfettoTrace { trace_events: ev, display_time_unit: "ns" }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_sizes_match_the_kernel() {
        assert_eq!(std::mem::size_of::<Params>(), 672);
        assert_eq!(std::mem::size_of::<RankArgs>(), 112);
    }

    #[test]
    fn layout_regions_are_disjoint_aligned_and_sized() {
        let mut cfg = EpConfig::new(8, 7168, 256, 8, 4096).unwrap();
        cfg.max_token_type_size = 2;
        cfg.scale_dim = 56;
        cfg.block_num = 16;
        let l = HeapLayout::new(&cfg).unwrap();
        let n = 8 * 4096u64;
        let starts =
            [l.recv_x, l.recv_w, l.recv_idx, l.recv_scales, l.recv_src, l.comb_x, l.comb_w, l.counters, l.signals, l.comb_flags, l.total];
        let sizes = [n * 7168 * 2, n * 32, n * 64, n * 56 * 4, n * 4, n * 7168 * 2, n * 32, 16, 8 * 16 * 8, 8 * 16 * 8];
        for i in 0..10 {
            assert_eq!(starts[i] % 256, 0, "region {i}");
            assert!(starts[i] + sizes[i] <= starts[i + 1], "region {i} overlaps the next");
        }
        assert_eq!(l.recv_x, 0);
        assert!(l.total < 1_200_000_000, "{}", l.total);
    }

    #[test]
    fn layout_refuses_overflowing_flag_arrays() {
        let mut cfg = EpConfig::new(8, 7168, 256, 8, 16).unwrap();
        cfg.block_num = usize::MAX / 4;
        assert!(matches!(HeapLayout::new(&cfg), Err(EpGpuError::Ep(EpError::SizeOverflow { .. }))));
    }

    /// Dispatches (or combines) near the 2^32 wrap, simulated as the receiver's kernel sees
    /// them: 3 ranks x 2 blocks of flags, each operation's signals arriving one by one.
    #[test]
    fn sequence_and_flags_across_the_wrap() {
        let mut seq = u32::MAX - 2;
        let mut flags = [seq; 6];
        let mut seqs = Vec::new();
        for _ in 0..6 {
            let prev = seq;
            seq = next_seq(seq);
            seqs.push(seq);
            assert_ne!(counter_parity(seq), counter_parity(prev), "parity must alternate: {prev} -> {seq}");
            // Before any sender signals, no flag (all at the previous operation) counts.
            assert!(flags.iter().all(|&f| !seq_reached(f, seq)), "{seq}: {flags:?}");
            for i in 0..flags.len() {
                flags[i] = seq;
                let reached: Vec<bool> = flags.iter().map(|&f| seq_reached(f, seq)).collect();
                assert_eq!(reached, (0..flags.len()).map(|j| j <= i).collect::<Vec<_>>(), "{seq}: {flags:?}");
            }
            // A peer already past this barrier (signalling the next operation) counts too.
            assert!(seq_reached(next_seq(seq), seq));
        }
        assert_eq!(seqs, [u32::MAX - 1, u32::MAX, 0, 1, 2, 3]);
        // A fresh heap (flags 0) does not satisfy the first operation (1).
        assert_eq!(next_seq(0), 1);
        assert!(!seq_reached(0, 1));
        // What the old rule (`flag >= want`, 0 skipped) did at the wrap: operation 1 followed
        // u32::MAX (same parity), and its stale flags already counted.
        let old_next = |s: u32| s.wrapping_add(1).max(1);
        assert_eq!((old_next(u32::MAX), old_next(u32::MAX) & 1), (1, counter_parity(u32::MAX)));
        let old_reached = |flag: u32, want: u32| flag >= want;
        assert!(old_reached(u32::MAX, old_next(u32::MAX)));
        assert!(!seq_reached(u32::MAX, next_seq(u32::MAX)));
    }

    /// The kernels compare with the rule the host mirrors (kernels/ep_intranode.cu).
    #[test]
    fn kernel_source_compares_sequences_wrap_safe() {
        let src = include_str!("../../../kernels/ep_intranode.cu");
        assert!(src.contains("MORI_DEVICE bool ep_seq_reached(uint32_t flag, uint32_t want) { return (int32_t)(flag - want) >= 0; }"));
        assert!(src.contains("if (ep_seq_reached((uint32_t)(high ? (v >> 32) : v), want)) break;"));
        assert!(!src.contains(">= want"), "a plain >= comparison of sequences is back");
        assert_eq!(src.matches("ep_wait_flags(p, a,").count(), 2);
    }

    #[test]
    fn perfetto_trace_has_begin_end_pairs_in_microseconds() {
        // Rank 3, two blocks; block 1 has no dispatch stamps and a combine_sync ending before it starts.
        let t = vec![(3usize, vec![[1_000u64, 3_000, 4_000, 10_000, 12_000, 15_000], [0, 0, 0, 11_000, 10_500, 16_500]])];
        let p = perfetto_trace(&t);
        assert_eq!(p.display_time_unit, "ns");
        let ev = |name: &str, ph: &str, ts: f64, tid: usize| TraceEvent {
            name: name.into(),
            ph: if ph == "B" { "B" } else { "E" },
            ts,
            pid: 3,
            tid,
        };
        assert_eq!(
            p.trace_events,
            vec![
                ev("dispatch_intra", "B", 0.0, 0),
                ev("dispatch_intra", "E", 2.0, 0),
                ev("dispatch_sync", "B", 2.0, 0),
                ev("dispatch_sync", "E", 3.0, 0),
                ev("combine_sync", "B", 9.0, 0),
                ev("combine_sync", "E", 11.0, 0),
                ev("combine_intra_node", "B", 11.0, 0),
                ev("combine_intra_node", "E", 14.0, 0),
                ev("combine_intra_node", "B", 9.5, 1),
                ev("combine_intra_node", "E", 15.5, 1),
            ]
        );
        assert!(perfetto_trace(&[]).trace_events.is_empty());
    }
}
