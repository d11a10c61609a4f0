//! [`EpConfig`]: the dispatch/combine configuration (upstream `EpDispatchCombineConfig`'s
//! fields), validated up front so that no later step can overflow a buffer.

use crate::accounting::dispatch_xfer_bytes_per_token;
use crate::error::{EpError, EpResult};
use crate::layout::Topology;

/// Largest top-k this crate accepts: one token's slots must fit one 32-lane warp in the
/// planned kernels.
pub const MAX_TOP_K: usize = 32;

/// Largest `warps_per_block`: 32 warps x 32 lanes = 1024 threads, the CUDA block limit.
pub const MAX_WARPS_PER_BLOCK: usize = 32;

/// Which dispatch/combine kernel family runs (upstream `EpDispatchCombineKernelType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum KernelType {
    /// All ranks on one node; every transfer over NVLink/XGMI (P2P).
    IntraNode,
    /// Several nodes; RDMA blocks and XGMI blocks run concurrently (throughput).
    InterNodeV1,
    /// Low-latency variant of `InterNodeV1` (work split per (expert, token, node)).
    InterNodeV1LL,
    /// Asynchronous low-latency kernels with pipelined send/receive.
    AsyncLL,
}

/// Quantization applied on the wire (upstream `EpDispatchCombineQuantType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Quantization {
    /// Tokens travel in their own dtype.
    None,
    /// Combine contributions are cast directly to FP8 E4M3 (no scale, saturating at ±448)
    /// before they travel; the receiver accumulates the decoded values in f32.
    Fp8DirectCast,
}

/// Dispatch/combine configuration. All counts are in elements or tokens unless the name
/// says bytes. Build with [`EpConfig::new`] or [`EpConfig::with_gpus_per_node`] (validated
/// defaults), adjust fields (the `set_*` methods re-derive dependent defaults), then call
/// [`EpConfig::validate`]; the host reference validates again before it runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EpConfig {
    /// This process's rank, `< world_size` (unused by the all-ranks host reference).
    pub rank: usize,
    /// Number of EP ranks.
    pub world_size: usize,
    /// Hidden size H: elements per token row.
    pub hidden: usize,
    /// Scale columns per token (`ceil(H/128)` for fp8 blocks; 0 = no scales).
    pub scale_dim: usize,
    /// Bytes per scale element (4 for f32 scales).
    pub scale_type_size: usize,
    /// Largest token element size in bytes that buffers are sized for (1, 2 or 4).
    pub max_token_type_size: usize,
    /// Most tokens a rank may pass to one dispatch.
    pub max_tokens_per_rank: usize,
    /// Experts per rank; experts `[r*n, (r+1)*n)` live on rank `r`.
    pub experts_per_rank: usize,
    /// Top-k K: expert slots per token, `1..=MAX_TOP_K`.
    pub top_k: usize,
    /// Receive buffer capacity in tokens; at least `world_size * max_tokens_per_rank`.
    pub max_recv_tokens: usize,
    /// GPU thread blocks per launch.
    pub block_num: usize,
    /// Of `block_num`, blocks dedicated to RDMA (inter-node V1 kernels).
    pub rdma_block_num: usize,
    /// Warps per block, `1..=MAX_WARPS_PER_BLOCK`.
    pub warps_per_block: usize,
    /// GPUs per node; ranks `[n*g, (n+1)*g)` form node `n`.
    /// Assigning it keeps `kernel_type` and the launch fields; [`EpConfig::set_gpus_per_node`]
    /// re-derives them.
    pub gpus_per_node: usize,
    /// RDMA queue pairs per peer.
    pub num_qp_per_pe: usize,
    /// Kernel family.
    pub kernel_type: KernelType,
    /// Wire quantization.
    pub quant: Quantization,
}

impl KernelType {
    /// Whether the kernel has dedicated RDMA blocks (`rdma_block_num` must be in `1..block_num`).
    pub fn uses_rdma_blocks(self) -> bool {
        matches!(self, KernelType::InterNodeV1 | KernelType::InterNodeV1LL)
    }

    /// The kernel family a geometry runs by default: `IntraNode` when all `world_size` ranks
    /// fit one node of `gpus_per_node`, `InterNodeV1` otherwise.
    pub fn default_for(world_size: usize, gpus_per_node: usize) -> Self {
        if world_size > gpus_per_node {
            KernelType::InterNodeV1
        } else {
            KernelType::IntraNode
        }
    }

    /// Launch defaults `(block_num, rdma_block_num, warps_per_block)` of the kernel family:
    /// `IntraNode` 128 blocks x 16 warps (no RDMA blocks); `InterNodeV1` and `InterNodeV1LL`
    /// 96 blocks (64 RDMA) x 8 warps (upstream's automatic launch table); `AsyncLL` 96 blocks
    /// x 8 warps without dedicated RDMA blocks (this crate's choice).
    pub fn launch_defaults(self) -> (usize, usize, usize) {
        match self {
            KernelType::IntraNode => (128, 0, 16),
            KernelType::InterNodeV1 | KernelType::InterNodeV1LL => (96, 64, 8),
            KernelType::AsyncLL => (96, 0, 8),
        }
    }

    /// The RDMA blocks a launch of `block_num` blocks dedicates by default: for the V1
    /// kernels two thirds of the blocks (64 of 96), at least one and leaving at least one
    /// XGMI block; 0 for the others. With `block_num < 2` a V1 kernel has no valid split and
    /// this returns `block_num`, which [`EpConfig::validate`] rejects.
    pub fn default_rdma_blocks(self, block_num: usize) -> usize {
        if !self.uses_rdma_blocks() {
            0
        } else if block_num < 2 {
            block_num
        } else {
            (block_num * 2 / 3).clamp(1, block_num - 1)
        }
    }
}

impl EpConfig {
    /// A validated configuration for `world_size` ranks, `num_experts` experts in total
    /// (split evenly), hidden size `hidden`, top-k `top_k` and up to `max_tokens_per_rank`
    /// tokens per rank, with `gpus_per_node = min(8, world_size)`: the same as
    /// [`EpConfig::with_gpus_per_node`] with that node size. Callers whose ranks per node
    /// differ use `with_gpus_per_node` (or [`EpConfig::set_gpus_per_node`]): assigning the
    /// `gpus_per_node` field afterwards keeps the kernel type and launch defaults chosen for
    /// nodes of 8.
    ///
    /// Errors: [`EpError::ExpertsNotDivisible`] and everything [`EpConfig::validate`] reports.
    pub fn new(world_size: usize, hidden: usize, num_experts: usize, top_k: usize, max_tokens_per_rank: usize) -> EpResult<Self> {
        Self::with_gpus_per_node(world_size, world_size.min(8), hidden, num_experts, top_k, max_tokens_per_rank)
    }

    /// A validated configuration for `world_size` ranks in nodes of `gpus_per_node`.
    /// Defaults: rank 0, no scales (`scale_type_size` 4), `max_token_type_size` 4 (f32),
    /// `max_recv_tokens = world_size * max_tokens_per_rank`, one QP per peer, no
    /// quantization; the kernel type follows the node count ([`KernelType::default_for`]:
    /// one node -> `IntraNode`, several -> `InterNodeV1`) and the launch fields follow the
    /// kernel type ([`KernelType::launch_defaults`]).
    ///
    /// Errors: [`EpError::ExpertsNotDivisible`] and everything [`EpConfig::validate`] reports
    /// (e.g. `world_size` not a multiple of `gpus_per_node`).
    pub fn with_gpus_per_node(
        world_size: usize,
        gpus_per_node: usize,
        hidden: usize,
        num_experts: usize,
        top_k: usize,
        max_tokens_per_rank: usize,
    ) -> EpResult<Self> {
        if world_size == 0 {
            return Err(invalid("world_size", 0, "must be at least 1"));
        }
        if !num_experts.is_multiple_of(world_size) {
            return Err(EpError::ExpertsNotDivisible { num_experts, world: world_size });
        }
        let kernel_type = KernelType::default_for(world_size, gpus_per_node);
        let (block_num, rdma_block_num, warps_per_block) = kernel_type.launch_defaults();
        let cfg = Self {
            rank: 0,
            world_size,
            hidden,
            scale_dim: 0,
            scale_type_size: 4,
            max_token_type_size: 4,
            max_tokens_per_rank,
            experts_per_rank: num_experts / world_size,
            top_k,
            max_recv_tokens: world_size.saturating_mul(max_tokens_per_rank),
            block_num,
            rdma_block_num,
            warps_per_block,
            gpus_per_node,
            num_qp_per_pe: 1,
            kernel_type,
            quant: Quantization::None,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Sets the ranks per node and re-derives what depends on the node count: the kernel
    /// type ([`KernelType::default_for`]) and its launch fields (`block_num`,
    /// `rdma_block_num`, `warps_per_block`, [`KernelType::launch_defaults`]). Does not
    /// validate; call [`EpConfig::validate`] after the last adjustment.
    pub fn set_gpus_per_node(&mut self, gpus_per_node: usize) {
        self.gpus_per_node = gpus_per_node;
        self.set_kernel_type(KernelType::default_for(self.world_size, gpus_per_node));
    }

    /// Sets the kernel type and its launch fields ([`KernelType::launch_defaults`]). Does not
    /// validate.
    pub fn set_kernel_type(&mut self, kernel_type: KernelType) {
        let (b, r, w) = kernel_type.launch_defaults();
        self.kernel_type = kernel_type;
        self.block_num = b;
        self.rdma_block_num = r;
        self.warps_per_block = w;
    }

    /// Sets `block_num` and the RDMA blocks the kernel type dedicates out of it
    /// ([`KernelType::default_rdma_blocks`]). Does not validate.
    pub fn set_block_num(&mut self, block_num: usize) {
        self.block_num = block_num;
        self.rdma_block_num = self.kernel_type.default_rdma_blocks(block_num);
    }

    /// Checks every field and their combinations; the first violation is returned.
    ///
    /// Errors: [`EpError::InvalidConfig`] (zero counts, rank >= world, element or scale sizes
    /// outside {1,2,4}/{1,2,4,8}, warps above [`MAX_WARPS_PER_BLOCK`], `world_size` not a
    /// multiple of the ranks per node, `IntraNode` spanning nodes, RDMA blocks not in
    /// `1..block_num` for V1 kernels), [`EpError::TopKTooLarge`], [`EpError::HiddenBytesNotAligned`]
    /// (`hidden * max_token_type_size % 16 != 0`), [`EpError::RecvBufferTooSmall`],
    /// [`EpError::SizeOverflow`] (flat source index `world_size * max_tokens_per_rank` above
    /// `i32::MAX`, or receive-buffer bytes above `usize`).
    pub fn validate(&self) -> EpResult<()> {
        let positive = [
            ("world_size", self.world_size),
            ("hidden", self.hidden),
            ("max_tokens_per_rank", self.max_tokens_per_rank),
            ("experts_per_rank", self.experts_per_rank),
            ("top_k", self.top_k),
            ("block_num", self.block_num),
            ("warps_per_block", self.warps_per_block),
            ("gpus_per_node", self.gpus_per_node),
            ("num_qp_per_pe", self.num_qp_per_pe),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(invalid(field, v, "must be at least 1"));
            }
        }
        if self.rank >= self.world_size {
            return Err(invalid("rank", self.rank, &format!("must be below world_size = {}", self.world_size)));
        }
        if self.top_k > MAX_TOP_K {
            return Err(EpError::TopKTooLarge { top_k: self.top_k, limit: MAX_TOP_K });
        }
        if self.warps_per_block > MAX_WARPS_PER_BLOCK {
            return Err(invalid("warps_per_block", self.warps_per_block, "must be at most 32 (1024 threads)"));
        }
        if ![1, 2, 4].contains(&self.max_token_type_size) {
            return Err(invalid("max_token_type_size", self.max_token_type_size, "must be 1, 2 or 4 bytes"));
        }
        if self.scale_dim > 0 && ![1, 2, 4, 8].contains(&self.scale_type_size) {
            return Err(invalid("scale_type_size", self.scale_type_size, "must be 1, 2, 4 or 8 bytes"));
        }
        let bytes = self.hidden.checked_mul(self.max_token_type_size).ok_or(overflow("hidden bytes"))?;
        if bytes % 16 != 0 {
            return Err(EpError::HiddenBytesNotAligned {
                what: "config hidden x max_token_type_size",
                hidden: self.hidden,
                elem_size: self.max_token_type_size,
                bytes,
            });
        }
        self.topology()?;
        if self.kernel_type == KernelType::IntraNode && self.world_size > self.gpus_per_node {
            return Err(invalid(
                "kernel_type",
                "IntraNode",
                &format!("world_size = {} spans more than one node of {} GPUs", self.world_size, self.gpus_per_node),
            ));
        }
        if self.kernel_type.uses_rdma_blocks() && !(1..self.block_num).contains(&self.rdma_block_num) {
            return Err(invalid(
                "rdma_block_num",
                self.rdma_block_num,
                &format!("{:?} needs 1..block_num (= {}) RDMA blocks", self.kernel_type, self.block_num),
            ));
        }
        if self.rdma_block_num > self.block_num {
            return Err(invalid("rdma_block_num", self.rdma_block_num, "must not exceed block_num"));
        }
        let required = self.world_size.checked_mul(self.max_tokens_per_rank).ok_or(overflow("world_size x max_tokens_per_rank"))?;
        if required > i32::MAX as usize {
            return Err(EpError::SizeOverflow { what: "flat source index world_size x max_tokens_per_rank", limit: "i32::MAX" });
        }
        if self.max_recv_tokens < required {
            return Err(EpError::RecvBufferTooSmall { max_recv_tokens: self.max_recv_tokens, required });
        }
        self.recv_buffer_bytes()?;
        Ok(())
    }

    /// Total experts E = `experts_per_rank * world_size` (saturating).
    pub fn num_experts(&self) -> usize {
        self.experts_per_rank.saturating_mul(self.world_size)
    }

    /// The rank/node/expert geometry. Errors as [`Topology::new`].
    pub fn topology(&self) -> EpResult<Topology> {
        Topology::new(self.num_experts(), self.world_size, self.gpus_per_node)
    }

    /// Bytes one token occupies in a receive buffer: the seed-003 wire size
    /// ([`dispatch_xfer_bytes_per_token`]) with elements of `max_token_type_size` bytes.
    pub fn token_slot_bytes(&self) -> EpResult<usize> {
        let b = dispatch_xfer_bytes_per_token(
            self.hidden as u64,
            self.max_token_type_size as u64,
            self.top_k as u64,
            self.scale_dim as u64,
            self.scale_type_size as u64,
        )?;
        usize::try_from(b).map_err(|_| overflow("token slot bytes"))
    }

    /// Receive buffer size in bytes: `max_recv_tokens * token_slot_bytes()`.
    /// Errors: [`EpError::SizeOverflow`].
    pub fn recv_buffer_bytes(&self) -> EpResult<usize> {
        self.token_slot_bytes()?.checked_mul(self.max_recv_tokens).ok_or(overflow("receive buffer bytes"))
    }
}

fn invalid(field: &'static str, value: impl std::fmt::Display, reason: &str) -> EpError {
    EpError::InvalidConfig { field, value: value.to_string(), reason: reason.to_string() }
}

fn overflow(what: &'static str) -> EpError {
    EpError::SizeOverflow { what, limit: "usize" }
}

pub(crate) fn invalid_arg(field: &'static str, value: impl std::fmt::Display, reason: &str) -> EpError {
    invalid(field, value, reason)
}
