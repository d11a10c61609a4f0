//! Deterministic routing generator in the style of DeepEP's tests (seed 002,
//! `print_bw_values.py`): `scores = |randn| + 1` over `[T, E]`; experts are split into
//! `num_groups` equal groups (one per node), each token keeps its `topk_groups` groups with
//! the largest max score (others' scores masked to 0), then takes its top-k experts.
//!
//! Uses its own SplitMix64 + Box-Muller generator, so the ids are *not* torch's; they follow
//! the same distribution and rules. Ties break towards the lower expert id.

use crate::config::invalid_arg;
use crate::error::EpResult;
use crate::tensor::Tensor2;

/// SplitMix64: a small, fast, deterministic 64-bit generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Uniform integer in `[0, n)` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// Shape of a generated routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingSpec {
    /// Tokens T.
    pub num_tokens: usize,
    /// Experts E.
    pub num_experts: usize,
    /// Top-k K (`<= num_experts`).
    pub top_k: usize,
    /// Expert groups (nodes), dividing E.
    pub num_groups: usize,
    /// Groups each token may use, `1..=num_groups`.
    pub topk_groups: usize,
}

impl RoutingSpec {
    /// DeepEP's internode setting: one group per node, `topk_groups = min(nodes, 4)`.
    pub fn deepep(num_tokens: usize, num_experts: usize, top_k: usize, num_nodes: usize) -> Self {
        Self { num_tokens, num_experts, top_k, num_groups: num_nodes, topk_groups: num_nodes.min(4) }
    }
}

/// Generates `(topk_idx [T, K] i64, topk_weights [T, K] f32)`; the weights are the chosen
/// scores. Errors: [`crate::EpError::InvalidConfig`] when `top_k` is 0 or above E, groups do
/// not divide E, or `topk_groups` is not in `1..=num_groups`.
pub fn generate_routing(spec: RoutingSpec, rng: &mut SplitMix64) -> EpResult<(Tensor2<i64>, Tensor2<f32>)> {
    let RoutingSpec { num_tokens, num_experts: e, top_k: k, num_groups: g, topk_groups } = spec;
    if k == 0 || k > e {
        return Err(invalid_arg("top_k", k, &format!("must be in 1..={e} (num_experts)")));
    }
    if g == 0 || e % g != 0 {
        return Err(invalid_arg("num_groups", g, &format!("must divide num_experts = {e}")));
    }
    if topk_groups == 0 || topk_groups > g {
        return Err(invalid_arg("topk_groups", topk_groups, &format!("must be in 1..={g}")));
    }
    let per_group = e / g;
    let mut idx = Vec::new();
    let mut wts = Vec::new();
    let mut scores = vec![0f32; e];
    let mut order: Vec<usize> = Vec::with_capacity(e.max(g));
    for _ in 0..num_tokens {
        for s in scores.iter_mut() {
            *s = rng.normal().abs() as f32 + 1.0;
        }
        let group_max: Vec<f32> = scores.chunks(per_group).map(|c| c.iter().copied().fold(f32::MIN, f32::max)).collect();
        order.clear();
        order.extend(0..g);
        order.sort_by(|&a, &b| group_max[b].total_cmp(&group_max[a]).then(a.cmp(&b)));
        let keep = &order[..topk_groups];
        let masked: Vec<f32> = scores.iter().enumerate().map(|(i, &s)| if keep.contains(&(i / per_group)) { s } else { 0.0 }).collect();
        order.clear();
        order.extend(0..e);
        order.sort_by(|&a, &b| masked[b].total_cmp(&masked[a]).then(a.cmp(&b)));
        for &ex in &order[..k] {
            idx.push(ex as i64);
            wts.push(masked[ex]);
        }
    }
    Ok((Tensor2::new(num_tokens, k, idx)?, Tensor2::new(num_tokens, k, wts)?))
}

/// Sets each entry of `idx` to -1 with probability `prob` (as DeepEP's tests do to exercise
/// "no expert" slots).
pub fn mask_random(idx: &mut Tensor2<i64>, prob: f64, rng: &mut SplitMix64) {
    for r in 0..idx.rows() {
        if let Some(row) = idx.row_mut(r) {
            for v in row.iter_mut() {
                if rng.next_f64() < prob {
                    *v = -1;
                }
            }
        }
    }
}
