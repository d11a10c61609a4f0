//! Host reference dispatch over all ranks' inputs (plain loops; the oracle for GPU kernels).
//!
//! Semantics (DESIGN.md "MORI-EP", DeepEP V1 conventions): each token goes once to every
//! rank that owns at least one of its top-k experts (`-1` slots route nowhere), carrying its
//! row of `x`, its weights, scales and full indices row (global expert ids, as sent).
//!
//! **Received order** (the contract a GPU kernel is checked against): rank `r` receives its
//! tokens sorted by (source rank ascending, source token index ascending). Kernels that land
//! tokens in another order are compared after [`RankRecv::canonicalize`].

use crate::config::EpConfig;
use crate::dtype::{Element, TopkIndex};
use crate::error::{EpError, EpResult};
use crate::layout::{OutOfRange, Topology};
use crate::tensor::{expect_shape, Tensor2};

/// One rank's dispatch inputs. `T` = tokens on this rank (may be 0), `H` = `cfg.hidden`,
/// `K` = `cfg.top_k`, `S` = `cfg.scale_dim`.
#[derive(Debug, Clone, PartialEq)]
pub struct RankInput<X, I, S = f32> {
    /// `[T, H]` token rows (f32, bf16 or fp8-e4m3).
    pub x: Tensor2<X>,
    /// `[T, K]` f32 routing weights.
    pub weights: Tensor2<f32>,
    /// `[T, S]` scales (f32 for fp8 blocks: S = ceil(H/128)); `None` iff `cfg.scale_dim == 0`.
    pub scales: Option<Tensor2<S>>,
    /// `[T, K]` global expert ids (i32 or i64), -1 = none.
    pub indices: Tensor2<I>,
}

/// Where a received token came from: row `token` of rank `rank`'s inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SrcPos {
    /// Source rank.
    pub rank: usize,
    /// Token row on the source rank.
    pub token: usize,
}

impl SrcPos {
    /// Upstream's flat encoding `rank * max_tokens_per_rank + token` (fits i32 for a
    /// validated config). Saturates instead of overflowing.
    pub fn flat(self, max_tokens_per_rank: usize) -> usize {
        self.rank.saturating_mul(max_tokens_per_rank).saturating_add(self.token)
    }

    /// Decodes [`SrcPos::flat`]; `None` when `max_tokens_per_rank == 0`.
    pub fn from_flat(flat: usize, max_tokens_per_rank: usize) -> Option<Self> {
        Some(Self { rank: flat.checked_div(max_tokens_per_rank)?, token: flat % max_tokens_per_rank })
    }
}

/// What one rank receives. `N` = received count (`src.len()`).
#[derive(Debug, Clone, PartialEq)]
pub struct RankRecv<X, I, S = f32> {
    /// `[N, H]` token rows, bit-identical to the sources.
    pub x: Tensor2<X>,
    /// `[N, K]` routing weights of each received token.
    pub weights: Tensor2<f32>,
    /// `[N, S]` scales, present iff the inputs had scales.
    pub scales: Option<Tensor2<S>>,
    /// `[N, K]` the token's full top-k row of global expert ids, as sent (not localized).
    pub indices: Tensor2<I>,
    /// `[N]` source of each row, in received order.
    pub src: Vec<SrcPos>,
}

impl<X: Clone, I: Clone, S: Clone> RankRecv<X, I, S> {
    /// Empty tensors shaped for `cfg` with room for `n` rows.
    pub(crate) fn with_capacity(cfg: &EpConfig, n: usize) -> Self {
        RankRecv {
            x: Tensor2::with_row_capacity(cfg.hidden, n),
            weights: Tensor2::with_row_capacity(cfg.top_k, n),
            scales: (cfg.scale_dim > 0).then(|| Tensor2::with_row_capacity(cfg.scale_dim, n)),
            indices: Tensor2::with_row_capacity(cfg.top_k, n),
            src: Vec::with_capacity(n),
        }
    }
}

impl<X, I, S> RankRecv<X, I, S> {
    /// Number of tokens received (upstream `recv_num_token`).
    pub fn num_recv(&self) -> usize {
        self.src.len()
    }
}

/// What combine needs from dispatch: each rank's original token count and each rank's
/// received sources in received order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchHandle {
    /// `[world]`: tokens each rank passed to dispatch.
    pub num_tokens: Vec<usize>,
    /// `[world][N_r]`: sources of rank `r`'s received rows.
    pub src: Vec<Vec<SrcPos>>,
}

/// Dispatch result for all ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatched<X, I, S = f32> {
    /// `[world]`: what each rank received.
    pub ranks: Vec<RankRecv<X, I, S>>,
    /// Bookkeeping for [`crate::combine`].
    pub handle: DispatchHandle,
}

/// Options of [`dispatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispatchOptions {
    /// Out-of-range expert ids: error (default) or drop.
    pub out_of_range: OutOfRange,
}

/// Dispatches every rank's tokens (`inputs[r]` is rank `r`'s) and returns what each rank
/// receives, in the documented order.
///
/// Errors: [`EpConfig::validate`]'s; [`EpError::RankCount`]; [`EpError::ElementSize`]
/// (`size_of::<X>() > max_token_type_size`, or scale size != `scale_type_size`);
/// [`EpError::HiddenBytesNotAligned`] (`H * size_of::<X>() % 16 != 0`); [`EpError::TooManyTokens`];
/// [`EpError::Shape`]; [`EpError::ScalesPresence`]; [`EpError::ExpertOutOfRange`];
/// [`EpError::RecvOverflow`].
pub fn dispatch<X: Element, I: TopkIndex, S: Copy>(
    cfg: &EpConfig,
    inputs: &[RankInput<X, I, S>],
    opts: DispatchOptions,
) -> EpResult<Dispatched<X, I, S>> {
    let topo = check_inputs(cfg, inputs)?;
    let world = cfg.world_size;
    // dests[s][t]: ascending destination ranks of token t of rank s.
    let mut dests = Vec::with_capacity(world);
    for (s, inp) in inputs.iter().enumerate() {
        let mut d = Vec::with_capacity(inp.indices.rows());
        for (t, row) in inp.indices.iter_rows().enumerate() {
            d.push(topo.dest_ranks(row, opts.out_of_range, s, t)?);
        }
        dests.push(d);
    }
    let mut counts = vec![0usize; world];
    for d in dests.iter().flatten() {
        for &r in d {
            counts[r] += 1;
        }
    }
    if let Some((rank, &received)) = counts.iter().enumerate().find(|(_, &c)| c > cfg.max_recv_tokens) {
        return Err(EpError::RecvOverflow { rank, received, limit: cfg.max_recv_tokens });
    }
    let mut ranks = Vec::with_capacity(world);
    for (r, &n) in counts.iter().enumerate() {
        let mut out = RankRecv::with_capacity(cfg, n);
        for (s, inp) in inputs.iter().enumerate() {
            for (t, d) in dests[s].iter().enumerate() {
                if !d.contains(&r) {
                    continue;
                }
                // Rows exist: shapes were checked against T = indices.rows().
                let (Some(x), Some(w), Some(i)) = (inp.x.row(t), inp.weights.row(t), inp.indices.row(t)) else {
                    continue;
                };
                out.x.push_row(x);
                out.weights.push_row(w);
                out.indices.push_row(i);
                if let (Some(dst), Some(Some(sc))) = (out.scales.as_mut(), inp.scales.as_ref().map(|s| s.row(t))) {
                    dst.push_row(sc);
                }
                out.src.push(SrcPos { rank: s, token: t });
            }
        }
        ranks.push(out);
    }
    let handle = DispatchHandle {
        num_tokens: inputs.iter().map(|i| i.indices.rows()).collect(),
        src: ranks.iter().map(|r| r.src.clone()).collect(),
    };
    Ok(Dispatched { ranks, handle })
}

fn check_inputs<X: Element, I: TopkIndex, S>(cfg: &EpConfig, inputs: &[RankInput<X, I, S>]) -> EpResult<Topology> {
    cfg.validate()?;
    let topo = cfg.topology()?;
    if inputs.len() != cfg.world_size {
        return Err(EpError::RankCount { input: "dispatch inputs", expected: cfg.world_size, got: inputs.len() });
    }
    let xs = X::DTYPE.size();
    if xs > cfg.max_token_type_size {
        return Err(EpError::ElementSize {
            input: "x",
            got: xs,
            relation: "exceeds",
            limit: cfg.max_token_type_size,
            field: "max_token_type_size",
        });
    }
    if !(cfg.hidden * xs).is_multiple_of(16) {
        return Err(EpError::HiddenBytesNotAligned { what: "x", hidden: cfg.hidden, elem_size: xs, bytes: cfg.hidden * xs });
    }
    if cfg.scale_dim > 0 && std::mem::size_of::<S>() != cfg.scale_type_size {
        return Err(EpError::ElementSize {
            input: "scales",
            got: std::mem::size_of::<S>(),
            relation: "differs from",
            limit: cfg.scale_type_size,
            field: "scale_type_size",
        });
    }
    for (r, inp) in inputs.iter().enumerate() {
        let t = inp.indices.rows();
        if t > cfg.max_tokens_per_rank {
            return Err(EpError::TooManyTokens { rank: r, tokens: t, limit: cfg.max_tokens_per_rank });
        }
        expect_shape(&inp.indices, "indices", r, t, cfg.top_k)?;
        expect_shape(&inp.x, "x", r, t, cfg.hidden)?;
        expect_shape(&inp.weights, "weights", r, t, cfg.top_k)?;
        match (&inp.scales, cfg.scale_dim) {
            (None, 0) => {}
            (Some(s), d) if d > 0 => expect_shape(s, "scales", r, t, d)?,
            (given, d) => return Err(EpError::ScalesPresence { rank: r, scale_dim: d, given: given.is_some() }),
        }
    }
    Ok(topo)
}

/// DeepEP-style localized view of received indices `[N, K]`: ids owned by `rank` become
/// `id - rank * experts_per_rank`; every other id (including -1) becomes -1.
pub fn localize_indices<I: TopkIndex>(indices: &Tensor2<I>, rank: usize, experts_per_rank: usize) -> Tensor2<i64> {
    let lo = rank.saturating_mul(experts_per_rank) as i64;
    let hi = lo.saturating_add(experts_per_rank as i64);
    indices.map(|&i| {
        let v = i.as_i64();
        if (lo..hi).contains(&v) {
            v - lo
        } else {
            -1
        }
    })
}
