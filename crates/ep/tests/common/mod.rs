//! Shared helpers for the mori-ep integration tests.
#![allow(dead_code)]

use mori_ep::routing::{generate_routing, mask_random, RoutingSpec, SplitMix64};
use mori_ep::{bf16, EpConfig, RankInput, Tensor2};
use std::collections::BTreeSet;

/// How a case's top-k ids are produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// DeepEP grouped top-k (one group per node), no -1.
    DeepEp,
    /// DeepEP grouped top-k with ~30% of slots set to -1.
    DeepEpMasked,
    /// Every slot -1.
    AllNone,
    /// Every token's experts all on one rank.
    OneRank(usize),
}

/// `[rows, cols]` bf16 filled with small integers in [-4, 4] (exact in bf16 and f32 sums).
pub fn small_ints(rows: usize, cols: usize, rng: &mut SplitMix64) -> Tensor2<bf16> {
    Tensor2::from_fn(rows, cols, |_, _| bf16::from_f32(rng.below(9) as f32 - 4.0)).unwrap()
}

/// Routing `[t, K]` for one rank.
pub fn routing(cfg: &EpConfig, t: usize, mode: Mode, rng: &mut SplitMix64) -> Tensor2<i64> {
    let e = cfg.num_experts();
    let nodes = cfg.topology().unwrap().num_nodes();
    match mode {
        Mode::DeepEp | Mode::DeepEpMasked => {
            let spec = RoutingSpec::deepep(t, e, cfg.top_k, nodes);
            let (mut idx, _) = generate_routing(spec, rng).unwrap();
            if mode == Mode::DeepEpMasked {
                mask_random(&mut idx, 0.3, rng);
            }
            idx
        }
        Mode::AllNone => Tensor2::filled(t, cfg.top_k, -1).unwrap(),
        Mode::OneRank(r) => {
            let epr = cfg.experts_per_rank as u64;
            Tensor2::from_fn(t, cfg.top_k, |_, _| (r as u64 * epr + rng.below(epr)) as i64).unwrap()
        }
    }
}

/// Weights in multiples of 1/4 in [0, 2] (exact in f32 sums).
pub fn dyadic_weights(rows: usize, k: usize, rng: &mut SplitMix64) -> Tensor2<f32> {
    Tensor2::from_fn(rows, k, |_, _| rng.below(9) as f32 / 4.0).unwrap()
}

/// bf16 inputs for every rank with `tokens[r]` tokens each.
pub fn inputs(cfg: &EpConfig, tokens: &[usize], mode: Mode, rng: &mut SplitMix64) -> Vec<RankInput<bf16, i64>> {
    tokens
        .iter()
        .map(|&t| RankInput {
            x: small_ints(t, cfg.hidden, rng),
            weights: dyadic_weights(t, cfg.top_k, rng),
            scales: None,
            indices: routing(cfg, t, mode, rng),
        })
        .collect()
}

/// Brute force: the set of destination ranks of a top-k row (ids in range, -1 skipped).
pub fn ranks_of(row: &[i64], experts_per_rank: usize) -> BTreeSet<usize> {
    row.iter().filter(|&&v| v >= 0).map(|&v| v as usize / experts_per_rank).collect()
}

/// A config for the given geometry (validated).
pub fn config(world: usize, gpn: usize, epr: usize, k: usize, hidden: usize, max_tokens: usize) -> EpConfig {
    let mut cfg = EpConfig::new(world, hidden, epr * world, k, max_tokens).unwrap();
    cfg.gpus_per_node = gpn;
    if world > gpn {
        cfg.kernel_type = mori_ep::KernelType::InterNodeV1;
        cfg.block_num = 96;
        cfg.rdma_block_num = 64;
    }
    cfg.validate().unwrap();
    cfg
}

/// `[rows, cols]` bf16 with fractional values of magnitudes 2^-30..2^30 (their f32 sums
/// depend on the summation order).
pub fn fractional(rows: usize, cols: usize, rng: &mut SplitMix64) -> Tensor2<bf16> {
    Tensor2::from_fn(rows, cols, |_, _| {
        let m = rng.below(1 << 16) as f32 / 65536.0 - 0.5;
        bf16::from_f32(m * (2f32).powi(rng.below(61) as i32 - 30))
    })
    .unwrap()
}

/// Rank `r`'s expert output for its received rows: each value times
/// `(1 + 0.37 r) 2^(20 - 9 r mod 40)` (bf16), so a token's contributions differ in magnitude
/// between ranks and their f32 sum rounds differently in different orders.
pub fn expert_out(r: usize, x: &Tensor2<bf16>) -> Tensor2<bf16> {
    let c = (1.0 + 0.37 * r as f32) * 2f32.powi(20 - (9 * r % 40) as i32);
    x.map(|v| bf16::from_f32(v.to_f32() * c))
}

/// f32 values as bits (bit-exact comparison, NaN and -0 included).
pub fn bits(t: &Tensor2<f32>) -> Vec<u32> {
    t.as_slice().iter().map(|v| v.to_bits()).collect()
}
