//! Host reference combine over all ranks (plain loops; the oracle for GPU kernels).
//!
//! Token `t` of rank `s` comes back as the f32 sum, over the unique ranks `r` that received
//! it in dispatch (ascending `r`), of rank `r`'s row for it, optionally weighted; the sum is
//! then rounded once to the output type (bf16 or f32). [`SumOrder::PerNode`] sums per node
//! first; [`SumOrder::PerNodeRounded`] also rounds other nodes' partials to the input dtype,
//! as the inter-node V1 and V1-LL executors do.

use crate::config::{EpConfig, Quantization};
use crate::dispatch::{DispatchHandle, SrcPos};
use crate::dtype::{CombineOut, Element, TopkIndex};
use crate::error::{EpError, EpResult};
use crate::fp8::Fp8E4m3;
use crate::layout::OutOfRange;
use crate::tensor::{expect_shape, Tensor2};

/// How each rank's contribution is scaled before summation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Weighting {
    /// Plain sum: `out[t] = Σ_r x_r[t]` (upstream's combine of expert outputs).
    #[default]
    Unweighted,
    /// `out[t] = Σ_r (Σ_{k: expert idx[t,k] lives on r} w_r[t,k]) x_r[t]`, where `w_r` is the
    /// weights tensor rank `r` passes to combine (normally dispatch's received weights), i.e.
    /// the MoE gate sum when each rank returns its experts' unweighted output sum.
    RankSlotSum,
}

impl Weighting {
    fn name(self) -> &'static str {
        match self {
            Weighting::Unweighted => "Unweighted",
            Weighting::RankSlotSum => "RankSlotSum",
        }
    }
}

/// The order in which a token's contributions are summed (f32 addition is not associative,
/// so each executor's order is part of its contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum SumOrder {
    /// One f32 accumulator over the receiving ranks, ascending (intranode and AsyncLL).
    #[default]
    Ascending,
    /// Per node first: an f32 partial over that node's receiving ranks (ascending), then the
    /// partials summed over nodes ascending (the order of inter-node V1 and V1-LL, whose relay
    /// rank sums its node's contributions before one partial crosses back, with f32 partials).
    /// Equal to `Ascending` on one node or with one rank per node.
    PerNode,
    /// [`SumOrder::PerNode`], with every other node's partial rounded to the combine input's
    /// dtype before it is added (the source's own node's is not): inter-node V1 and V1-LL
    /// (host executor and GPU kernels), whose relay sends its partial in that dtype, as MORI's internode combine
    /// moves `hidden x dtype bytes` (+ f32 weights) per token (the MORI-EP RDMA bandwidth
    /// document, `tokCombXferBytes`). The weight partials stay f32. Equal to `PerNode` for
    /// f32 inputs.
    PerNodeRounded,
}

impl SumOrder {
    /// Whether contributions are summed per node first.
    pub fn per_node(self) -> bool {
        self != SumOrder::Ascending
    }
}

/// Options of [`combine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CombineOptions {
    /// Contribution scaling.
    pub weighting: Weighting,
    /// Must match the policy used in dispatch.
    pub out_of_range: OutOfRange,
    /// Summation order of the contributions.
    pub order: SumOrder,
}

/// One rank's combine output. `T` = the rank's original token count.
#[derive(Debug, Clone, PartialEq)]
pub struct Combined<O> {
    /// `[T, H]` combined tokens at their original positions (0 for tokens routed nowhere).
    pub x: Tensor2<O>,
    /// `[T, K]` f32 sum over receiving ranks of their weights rows (upstream's
    /// `combine_weights`); present iff weights were passed.
    pub weights: Option<Tensor2<f32>>,
}

/// Combines every rank's processed tokens back to their sources.
///
/// Inputs, one entry per rank `r`: `x[r]` `[N_r, H]` in rank `r`'s received order (N_r =
/// `handle.src[r].len()`), `weights[r]` `[N_r, K]` f32 (optional unless
/// [`Weighting::RankSlotSum`]), `original_indices[r]` `[T_r, K]`: the top-k ids rank `r`
/// passed to dispatch. With [`Quantization::Fp8DirectCast`] every contribution element is
/// cast to fp8-e4m3 and back (saturating) before weighting and accumulation.
///
/// Errors: [`EpConfig::validate`]'s; [`EpError::RankCount`]; [`EpError::Shape`];
/// [`EpError::IndicesLookLikeDispatchOutput`] (indices with N_r instead of T_r rows);
/// [`EpError::RoutingMismatch`] (indices that do not route a token to exactly the ranks that
/// received it — e.g. dispatch's output indices); [`EpError::BadSource`] (a malformed
/// handle); [`EpError::TooManyTokens`] (a handle claiming more than `max_tokens_per_rank`);
/// [`EpError::WeightsRequired`]; [`EpError::ExpertOutOfRange`].
pub fn combine<X: Element, O: CombineOut, I: TopkIndex>(
    cfg: &EpConfig,
    handle: &DispatchHandle,
    x: &[Tensor2<X>],
    weights: Option<&[Tensor2<f32>]>,
    original_indices: &[Tensor2<I>],
    opts: CombineOptions,
) -> EpResult<Vec<Combined<O>>> {
    cfg.validate()?;
    let topo = cfg.topology()?;
    let (world, h, k) = (cfg.world_size, cfg.hidden, cfg.top_k);
    let count = |input: &'static str, got: usize| {
        if got == world {
            Ok(())
        } else {
            Err(EpError::RankCount { input, expected: world, got })
        }
    };
    count("handle.num_tokens", handle.num_tokens.len())?;
    count("handle.src", handle.src.len())?;
    count("combine x", x.len())?;
    count("original indices", original_indices.len())?;
    if let Some(w) = weights {
        count("combine weights", w.len())?;
    }
    if opts.weighting == Weighting::RankSlotSum && weights.is_none() {
        return Err(EpError::WeightsRequired { weighting: opts.weighting.name() });
    }
    for s in 0..world {
        let (t, idx) = (handle.num_tokens[s], &original_indices[s]);
        if t > cfg.max_tokens_per_rank {
            return Err(EpError::TooManyTokens { rank: s, tokens: t, limit: cfg.max_tokens_per_rank });
        }
        if idx.rows() != t && idx.rows() == handle.src[s].len() {
            return Err(EpError::IndicesLookLikeDispatchOutput { rank: s, rows: idx.rows(), tokens: t });
        }
        expect_shape(idx, "original indices", s, t, k)?;
        expect_shape(&x[s], "combine x", s, handle.src[s].len(), h)?;
        if let Some(w) = weights {
            expect_shape(&w[s], "combine weights", s, handle.src[s].len(), k)?;
        }
    }
    let delivered = delivered_by_source(handle)?;
    let mut out = Vec::with_capacity(world);
    for s in 0..world {
        let t_s = handle.num_tokens[s];
        let mut acc = vec![0f32; t_s * h];
        let mut wacc = weights.map(|_| vec![0f32; t_s * k]);
        // PerNode: contributions go to a node partial, added to the total when the node ends.
        let per_node = opts.order.per_node();
        let own = topo.node_of_rank(s);
        // A node's partial as it reaches the sum: rounded to the input dtype when it crossed.
        let round = |node: usize, part: &mut [f32]| {
            if opts.order == SumOrder::PerNodeRounded && node != own {
                part.iter_mut().for_each(|v| *v = X::from_f32(*v).to_f32());
            }
        };
        let mut part = vec![0f32; if per_node { h } else { 0 }];
        let mut wpart = vec![0f32; if per_node && weights.is_some() { k } else { 0 }];
        for t in 0..t_s {
            let row_idx = original_indices[s].row(t).unwrap_or(&[]);
            let routed = topo.dest_ranks(row_idx, opts.out_of_range, s, t)?;
            let got: Vec<usize> = delivered[s][t].iter().map(|&(r, _)| r).collect();
            if routed != got {
                return Err(EpError::RoutingMismatch { rank: s, token: t, routed, delivered: got });
            }
            let mut node = None;
            for &(r, row) in &delivered[s][t] {
                if per_node && node != Some(topo.node_of_rank(r)) {
                    if let Some(n) = node {
                        round(n, &mut part);
                        flush(&mut part, &mut acc[t * h..(t + 1) * h]);
                        if let Some(wacc) = wacc.as_mut() {
                            flush(&mut wpart, &mut wacc[t * k..(t + 1) * k]);
                        }
                    }
                    node = Some(topo.node_of_rank(r));
                }
                let w_row = weights.and_then(|w| w[r].row(row));
                let factor = slot_factor(&topo, opts, row_idx, w_row, r, (s, t))?;
                let dst = if per_node { &mut part[..] } else { &mut acc[t * h..(t + 1) * h] };
                for (d, v) in dst.iter_mut().zip(x[r].row(row).unwrap_or(&[])) {
                    *d += factor * contribution(cfg.quant, *v);
                }
                if let (Some(wacc), Some(w_row)) = (wacc.as_mut(), w_row) {
                    let dst = if per_node { &mut wpart[..] } else { &mut wacc[t * k..(t + 1) * k] };
                    for (d, &w) in dst.iter_mut().zip(w_row) {
                        *d += w;
                    }
                }
            }
            if let (true, Some(n)) = (per_node, node) {
                round(n, &mut part);
                flush(&mut part, &mut acc[t * h..(t + 1) * h]);
                if let Some(wacc) = wacc.as_mut() {
                    flush(&mut wpart, &mut wacc[t * k..(t + 1) * k]);
                }
            }
        }
        let x = Tensor2::new(t_s, h, acc.into_iter().map(O::from_f32).collect())?;
        let weights = wacc.map(|w| Tensor2::new(t_s, k, w)).transpose()?;
        out.push(Combined { x, weights });
    }
    Ok(out)
}

/// The factor rank `r`'s row for token `at = (source rank, token)` is scaled by: 1 unweighted;
/// with [`Weighting::RankSlotSum`] (and weights given) the sum of `w_row` over the slots of
/// `ids` whose expert lives on `r` (f32, slot order). Shared by every executor so that all sum
/// the same values in the same order.
pub(crate) fn slot_factor<I: TopkIndex>(
    topo: &crate::layout::Topology,
    opts: CombineOptions,
    ids: &[I],
    w_row: Option<&[f32]>,
    r: usize,
    at: (usize, usize),
) -> EpResult<f32> {
    match (opts.weighting, w_row) {
        (Weighting::RankSlotSum, Some(w_row)) => {
            let mut f = 0f32;
            for (slot, (&id, &w)) in ids.iter().zip(w_row).enumerate() {
                let e = topo.expert_of(id, opts.out_of_range, at.0, at.1, slot)?;
                if e.map(|e| topo.rank_of_expert(e)) == Some(r) {
                    f += w;
                }
            }
            Ok(f)
        }
        _ => Ok(1.0),
    }
}

/// One element of a contribution as it is accumulated: widened to f32, after the fp8 round
/// trip under [`Quantization::Fp8DirectCast`].
pub(crate) fn contribution<X: Element>(quant: Quantization, v: X) -> f32 {
    match quant {
        Quantization::None => v.to_f32(),
        Quantization::Fp8DirectCast => Fp8E4m3::from_f32(v.to_f32()).to_f32(),
    }
}

/// Adds a node partial into the total and clears it.
pub(crate) fn flush(part: &mut [f32], total: &mut [f32]) {
    for (t, p) in total.iter_mut().zip(part.iter_mut()) {
        *t += *p;
        *p = 0.0;
    }
}

/// `[world][T_s]`: for each source token, the (receiving rank, row) pairs, ascending rank.
type Delivered = Vec<Vec<Vec<(usize, usize)>>>;

/// Builds [`Delivered`] from the handle, rejecting unknown or repeated sources.
fn delivered_by_source(handle: &DispatchHandle) -> EpResult<Delivered> {
    let mut delivered: Delivered = handle.num_tokens.iter().map(|&t| vec![Vec::new(); t]).collect();
    for (r, srcs) in handle.src.iter().enumerate() {
        for (row, &SrcPos { rank, token }) in srcs.iter().enumerate() {
            let bad = |problem| EpError::BadSource { rank: r, row, src_rank: rank, src_token: token, problem };
            let slot = delivered.get_mut(rank).and_then(|v| v.get_mut(token)).ok_or(bad("does not exist"))?;
            if slot.last().is_some_and(|&(last, _)| last == r) {
                return Err(bad("appears twice"));
            }
            slot.push((r, row));
        }
    }
    Ok(delivered)
}
