//! The plain types of [`super::InterNodeGpu`]'s interface: the inter-node path, options,
//! element sizes, per-rank inputs and outputs as bytes, and the kernels' timings.

use crate::proxy::RingProxyOptions;
use std::time::Duration;

/// How the inter-node leg moves bytes (printed by [`super::InterNodeGpu::describe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterPath {
    /// MORI-IO's xgmi backend: windows in GPU memory, copies by the GPU.
    Xgmi,
    /// MORI-IO's tcp backend with `lanes` connections: windows in pinned host memory mapped
    /// into the GPU, so the kernels stage into host memory (explicit host staging).
    Tcp {
        /// Connections per peer (1..=64).
        lanes: usize,
    },
}

/// Settings of an [`super::InterNodeGpu`].
#[derive(Debug, Clone, Copy)]
pub struct InterNodeOptions {
    /// The inter-node leg.
    pub path: InterPath,
    /// Blocks per rank (each also one proxy command per destination and phase).
    pub blocks_per_rank: u32,
    /// Warps per block (1..=16).
    pub warps_per_block: u32,
    /// Deadline of every wait inside the kernels and of each call.
    pub timeout: Duration,
    /// Weighted combine ([`crate::Weighting::RankSlotSum`]).
    pub weighted: bool,
    /// Proxy ring slots per rank.
    pub ring_slots: usize,
    /// Blocks per rank of the kernels that wait for nothing (dispatch's staging and copy-out,
    /// combine's staging, sum and, V1/V1-LL, the relay's partial sums, which wait only for
    /// counters an earlier launch set), so they are not bound by the co-resident grid of the others. Default 64: on
    /// the H200, 2 x 4 ranks, decode shape, V1, the copy-out took 113 µs at 16 blocks, 71 at
    /// 32 and 57 at 64, and dispatch 409-431 µs at 16 against 348 at 64 in the same run
    /// (docs/PERFORMANCE.md). The stagings (with the layout) and the sum run at this count as
    /// kernels of their own; AsyncLL decode at 32, 64 and 128: `docs/gpu-run/grid2.txt`.
    pub copy_blocks: u32,
    /// Record trace stamps ([`super::InterNodeGpu::trace`]).
    pub trace: bool,
    /// How each rank's proxy thread polls its ring.
    pub proxy: RingProxyOptions,
    /// Over xgmi: the combine input goes into the window as rows of `comb_bytes`
    /// (`InterLayout::combine_rows`), where the kernels read them in place, so combine stores
    /// no row (default true): a same-node source sums its rows there; AsyncLL's proxy moves
    /// another node's source's rows from there as they are, V1's and V1-LL's relays read them
    /// there for their partial sums. Ignored over tcp (the window is host memory there: the
    /// kernels would read this node's rows through the host).
    pub combine_rows: bool,
    /// The received records stay in the window, where the host reads them
    /// ([`super::InterLayout::gather_records`]), as DeepEP's low-latency mode leaves its output
    /// in the receive buffer: dispatch's copy-out kernel is not launched (default true; every
    /// scheme and path). False: the copy-out kernel writes them into contiguous output buffers
    /// first (the layout `IntranodeEp` hands out).
    pub recv_in_window: bool,
}

impl InterNodeOptions {
    /// Per-block trace rows per rank: the largest grid per rank of any kernel.
    pub(super) fn trace_blocks(&self) -> u32 {
        self.blocks_per_rank.max(self.copy_blocks)
    }
}

impl Default for InterNodeOptions {
    fn default() -> Self {
        Self {
            path: InterPath::Xgmi,
            blocks_per_rank: 4,
            warps_per_block: 8,
            timeout: Duration::from_secs(20),
            weighted: false,
            ring_slots: 1024,
            copy_blocks: 64,
            trace: false,
            proxy: RingProxyOptions::default(),
            combine_rows: true,
            recv_in_window: true,
        }
    }
}

/// Element sizes in bytes: dispatch rows (`elem`: 1 fp8, 2 bf16, 4 f32), expert ids
/// (`idx_size`: 4 or 8), combine inputs and outputs (2 bf16 or 4 f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElemSizes {
    /// Dispatch row element.
    pub elem: usize,
    /// Expert id.
    pub idx_size: usize,
    /// Combine input element.
    pub comb_elem: usize,
    /// Combine output element.
    pub out_elem: usize,
}

/// One rank's dispatch inputs as bytes: `[T, H]` rows, `[T, K]` f32 weights, `[T, K]` ids,
/// `[T, scale_bytes]` scales (empty when the configuration has none).
#[derive(Debug, Clone, Copy)]
pub struct RankBytes<'a> {
    /// Tokens.
    pub tokens: usize,
    /// Rows.
    pub x: &'a [u8],
    /// Weights.
    pub weights: &'a [u8],
    /// Ids.
    pub idx: &'a [u8],
    /// Scales.
    pub scales: &'a [u8],
}

/// What one rank received, as bytes in the received order (source rank, then token).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecvBytes {
    /// `[N, row_bytes]`.
    pub x: Vec<u8>,
    /// `[N, K]` f32.
    pub weights: Vec<u8>,
    /// `[N, K]` ids.
    pub idx: Vec<u8>,
    /// `[N, scale_bytes]`.
    pub scales: Vec<u8>,
    /// `[N]` i32 flat sources (`rank * max_tokens + token`).
    pub src: Vec<u8>,
}

/// The kernels' timings of the last call, µs (GPU events around each node's launches).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    /// Slowest node's dispatch (layout, staging, dispatch, copy-out unless the records stay in
    /// the window ([`InterNodeOptions::recv_in_window`])), µs.
    pub dispatch_us: f64,
    /// Slowest node's combine (staging, unless the input is in the window
    /// ([`InterNodeOptions::combine_rows`]); send; sum), µs.
    pub combine_us: f64,
    /// Per kernel, the slowest node's time, µs: dispatch staging (each block's share of the
    /// layout, then its records for other nodes), dispatch (with block 0's wait for every source), dispatch receive (copy-out),
    /// combine staging (every received row where it goes), combine send (with block 0's wait
    /// for every rank's rows), combine sum, the relay's partial sums (V1, V1-LL) (events
    /// between the launches of a node's stream); 0 for combine staging when it is not
    /// launched (the input in the window), for the copy-out when the records stay in the
    /// window and for the relay's sums under AsyncLL.
    pub kernel_us: [f64; 7],
}

/// What [`super::InterNodeGpu::dispatch`] hands back for its combine: consumed by
/// [`super::InterNodeGpu::combine`], which refuses one of another object or of a dispatch since
/// superseded.
#[derive(Debug)]
pub struct InterTicket {
    pub(super) seq: u64,
    pub(super) owner: u64,
}

/// A new object number for tickets (unique in the process).
pub(super) fn next_ticket_owner() -> u64 {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
