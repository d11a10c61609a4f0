//! Expert -> rank -> node geometry ([`Topology`]) and the dispatch layout
//! ([`dispatch_layout`]): DeepEP V1's `get_dispatch_layout` outputs, computed with plain loops.

use crate::config::invalid_arg;
use crate::dtype::TopkIndex;
use crate::error::{EpError, EpResult};
use crate::tensor::Tensor2;

/// What to do with an expert id that is neither -1 nor in `[0, num_experts)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum OutOfRange {
    /// Reject the input with [`EpError::ExpertOutOfRange`] (default).
    #[default]
    Error,
    /// Treat the slot as -1: it routes nowhere, but the id is still carried verbatim in the
    /// dispatched indices row.
    Drop,
}

/// How experts map to ranks and ranks to nodes: expert `e` lives on rank
/// `e / experts_per_rank`; rank `r` is on node `r / ranks_per_node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    num_experts: usize,
    world: usize,
    ranks_per_node: usize,
}

impl Topology {
    /// Geometry for `num_experts` experts over `world` ranks with `gpus_per_node` GPUs per
    /// node. Ranks per node = `min(gpus_per_node, world)` (a world smaller than a node is one
    /// node). Errors: [`EpError::InvalidConfig`] for zero `world`/`num_experts`/`gpus_per_node`
    /// or `world` not a multiple of the ranks per node; [`EpError::ExpertsNotDivisible`].
    pub fn new(num_experts: usize, world: usize, gpus_per_node: usize) -> EpResult<Self> {
        if world == 0 {
            return Err(invalid_arg("world_size", world, "must be at least 1"));
        }
        if gpus_per_node == 0 {
            return Err(invalid_arg("gpus_per_node", gpus_per_node, "must be at least 1"));
        }
        if num_experts == 0 {
            return Err(invalid_arg("num_experts", num_experts, "must be at least 1"));
        }
        if !num_experts.is_multiple_of(world) {
            return Err(EpError::ExpertsNotDivisible { num_experts, world });
        }
        let ranks_per_node = gpus_per_node.min(world);
        if !world.is_multiple_of(ranks_per_node) {
            return Err(invalid_arg("world_size", world, &format!("must be a multiple of gpus_per_node = {gpus_per_node}")));
        }
        Ok(Self { num_experts, world, ranks_per_node })
    }

    /// Total experts E.
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// World size.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Ranks per node, `min(gpus_per_node, world)`.
    pub fn ranks_per_node(&self) -> usize {
        self.ranks_per_node
    }

    /// Number of nodes, `world / ranks_per_node`.
    pub fn num_nodes(&self) -> usize {
        self.world / self.ranks_per_node
    }

    /// Experts per rank, `E / world`.
    pub fn experts_per_rank(&self) -> usize {
        self.num_experts / self.world
    }

    /// Experts per node, `E / nodes` (= experts_per_rank x ranks_per_node; seed 002 step 1).
    pub fn experts_per_node(&self) -> usize {
        self.experts_per_rank() * self.ranks_per_node
    }

    /// Rank owning expert `e` (`e < E`).
    pub fn rank_of_expert(&self, e: usize) -> usize {
        e / self.experts_per_rank()
    }

    /// Node of rank `r`.
    pub fn node_of_rank(&self, r: usize) -> usize {
        r / self.ranks_per_node
    }

    /// Validates slot `slot` of token `token` on rank `rank`: `Ok(None)` for -1 (and for an
    /// out-of-range id under [`OutOfRange::Drop`]), `Ok(Some(e))` for a valid expert.
    pub fn expert_of<I: TopkIndex>(&self, id: I, policy: OutOfRange, rank: usize, token: usize, slot: usize) -> EpResult<Option<usize>> {
        let v = id.as_i64();
        if v == -1 {
            return Ok(None);
        }
        match usize::try_from(v) {
            Ok(e) if e < self.num_experts => Ok(Some(e)),
            _ => match policy {
                OutOfRange::Drop => Ok(None),
                OutOfRange::Error => Err(EpError::ExpertOutOfRange { rank, token, slot, expert: v, num_experts: self.num_experts }),
            },
        }
    }

    /// Destination ranks of one token's top-k row, deduplicated and ascending.
    pub fn dest_ranks<I: TopkIndex>(&self, row: &[I], policy: OutOfRange, rank: usize, token: usize) -> EpResult<Vec<usize>> {
        let mut out = Vec::with_capacity(row.len());
        for (slot, &id) in row.iter().enumerate() {
            if let Some(e) = self.expert_of(id, policy, rank, token, slot)? {
                out.push(self.rank_of_expert(e));
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// Options of [`dispatch_layout_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayoutOptions {
    /// Rank that owns the tokens (only used to name it in errors).
    pub src_rank: usize,
    /// Out-of-range policy.
    pub out_of_range: OutOfRange,
}

/// DeepEP V1 dispatch layout of one rank's tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// `[world]`: tokens sent to each rank, each token counted once per rank however many of
    /// its experts live there.
    pub tokens_per_rank: Vec<usize>,
    /// `[nodes]`: tokens sent to each node (unique (token, node) pairs; seed 002 "RDMA
    /// bandwidth", the local node included).
    pub tokens_per_node: Vec<usize>,
    /// `[E]`: tokens routed to each expert (a token naming an expert twice counts once).
    pub tokens_per_expert: Vec<usize>,
    /// `[T, world]`: whether token `t` goes to rank `r`.
    pub is_token_in_rank: Tensor2<bool>,
}

/// Layout of `topk_idx` (`[T, K]`, i32 or i64, -1 = none) for `num_experts` experts over
/// `world` ranks, `gpus_per_node` per node. Out-of-range ids are an error (reported as rank 0;
/// use [`dispatch_layout_with`] to name the rank or drop them).
///
/// Errors: as [`Topology::new`]; [`EpError::ExpertOutOfRange`].
pub fn dispatch_layout<I: TopkIndex>(topk_idx: &Tensor2<I>, num_experts: usize, world: usize, gpus_per_node: usize) -> EpResult<Layout> {
    let topo = Topology::new(num_experts, world, gpus_per_node)?;
    dispatch_layout_with(topk_idx, &topo, LayoutOptions::default())
}

/// [`dispatch_layout`] with an explicit [`Topology`] and [`LayoutOptions`].
pub fn dispatch_layout_with<I: TopkIndex>(topk_idx: &Tensor2<I>, topo: &Topology, opts: LayoutOptions) -> EpResult<Layout> {
    let world = topo.world();
    let mut tokens_per_rank = vec![0usize; world];
    let mut tokens_per_node = vec![0usize; topo.num_nodes()];
    let mut tokens_per_expert = vec![0usize; topo.num_experts()];
    let mut in_rank = Tensor2::filled(topk_idx.rows(), world, false)?;
    let mut experts = Vec::with_capacity(topk_idx.cols());
    for (t, row) in topk_idx.iter_rows().enumerate() {
        experts.clear();
        for (slot, &id) in row.iter().enumerate() {
            if let Some(e) = topo.expert_of(id, opts.out_of_range, opts.src_rank, t, slot)? {
                if !experts.contains(&e) {
                    experts.push(e);
                }
            }
        }
        let mut last_node = None;
        let ranks = topo.dest_ranks(row, opts.out_of_range, opts.src_rank, t)?;
        for &r in &ranks {
            tokens_per_rank[r] += 1;
            if let Some(cell) = in_rank.row_mut(t).and_then(|x| x.get_mut(r)) {
                *cell = true;
            }
            // ranks are ascending, so equal nodes are adjacent.
            let n = topo.node_of_rank(r);
            if last_node != Some(n) {
                tokens_per_node[n] += 1;
                last_node = Some(n);
            }
        }
        for &e in &experts {
            tokens_per_expert[e] += 1;
        }
    }
    Ok(Layout { tokens_per_rank, tokens_per_node, tokens_per_expert, is_token_in_rank: in_rank })
}
