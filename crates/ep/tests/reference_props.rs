//! Property tests of the host reference (layout, dispatch, combine) against brute-force
//! formulations, over DeepEP-style random routing and the edge cases of the issue.

mod common;

use common::{config, inputs, ranks_of, Mode};
use mori_ep::accounting::{nvl_recv_bytes, rdma_algo_token_count};
use mori_ep::routing::SplitMix64;
use mori_ep::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

/// (world, gpus_per_node): one node and several.
const GEOMETRIES: [(usize, usize); 8] = [(1, 1), (2, 2), (4, 4), (4, 2), (8, 8), (8, 4), (16, 8), (16, 4)];
const HIDDENS: [usize; 4] = [2048, 4096, 7168, 8192];

#[derive(Debug, Clone)]
struct Case {
    geo: (usize, usize),
    epr: usize,
    k: usize,
    hidden: usize,
    tokens: Vec<usize>,
    mode: Mode,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (0..GEOMETRIES.len(), 1usize..=4, 1usize..=8, 0..HIDDENS.len(), 0u8..4, any::<u64>())
        .prop_flat_map(|(g, epr, k, h, mode, seed)| {
            let geo = GEOMETRIES[g];
            let k = k.min(epr * geo.0);
            // Per-rank token counts: 0 (a rank with no tokens) up to 5 (odd included).
            let tokens = proptest::collection::vec(prop_oneof![1 => Just(0usize), 3 => 1usize..=5], geo.0);
            let mode = match mode {
                0 => Just(Mode::DeepEp).boxed(),
                1 => Just(Mode::DeepEpMasked).boxed(),
                2 => Just(Mode::AllNone).boxed(),
                _ => (0..geo.0).prop_map(Mode::OneRank).boxed(),
            };
            (Just(geo), Just(epr), Just(k), Just(HIDDENS[h]), tokens, mode, Just(seed))
        })
        .prop_map(|(geo, epr, k, hidden, tokens, mode, seed)| Case { geo, epr, k, hidden, tokens, mode, seed })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    /// Layout, dispatch, accounting and unweighted combine on one random case.
    #[test]
    fn dispatch_combine_roundtrip(c in case()) {
        let cfg = config(c.geo.0, c.geo.1, c.epr, c.k, c.hidden, 5);
        let topo = cfg.topology().unwrap();
        let mut rng = SplitMix64::new(c.seed);
        let inp = inputs(&cfg, &c.tokens, c.mode, &mut rng);

        // Layout vs brute force (sets of ranks / nodes / experts per token).
        let mut expect_recv = vec![0usize; cfg.world_size];
        for (s, i) in inp.iter().enumerate() {
            let lay = dispatch_layout_with(&i.indices, &topo, LayoutOptions { src_rank: s, ..Default::default() }).unwrap();
            let mut per_rank = vec![0usize; cfg.world_size];
            let mut per_node = vec![0usize; topo.num_nodes()];
            let mut per_expert = vec![0usize; cfg.num_experts()];
            for (t, row) in i.indices.iter_rows().enumerate() {
                let ranks = ranks_of(row, cfg.experts_per_rank);
                for r in 0..cfg.world_size {
                    prop_assert_eq!(lay.is_token_in_rank.row(t).unwrap()[r], ranks.contains(&r));
                }
                ranks.iter().for_each(|&r| per_rank[r] += 1);
                let nodes: BTreeSet<usize> = ranks.iter().map(|r| r / topo.ranks_per_node()).collect();
                nodes.iter().for_each(|&n| per_node[n] += 1);
                let experts: BTreeSet<i64> = row.iter().copied().filter(|&v| v >= 0).collect();
                experts.iter().for_each(|&e| per_expert[e as usize] += 1);
            }
            prop_assert_eq!(&lay.tokens_per_rank, &per_rank);
            prop_assert_eq!(&lay.tokens_per_node, &per_node);
            prop_assert_eq!(&lay.tokens_per_expert, &per_expert);
            // RDMA algo count = unique (token, node) pairs = Σ tokens_per_node (seed 002).
            let algo = rdma_algo_token_count(&i.indices, cfg.num_experts(), topo.num_nodes(), OutOfRange::Error).unwrap();
            prop_assert_eq!(algo as usize, per_node.iter().sum::<usize>());
            for r in 0..cfg.world_size { expect_recv[r] += per_rank[r]; }
            if c.mode == Mode::AllNone { prop_assert!(per_rank.iter().all(|&n| n == 0)); }
            if let Mode::OneRank(only) = c.mode {
                prop_assert_eq!(per_rank[only], i.indices.rows());
                prop_assert_eq!(per_rank.iter().sum::<usize>(), i.indices.rows());
            }
        }

        let d = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
        for (r, recv) in d.ranks.iter().enumerate() {
            prop_assert_eq!(recv.num_recv(), expect_recv[r]);
            prop_assert!(recv.is_canonical(), "rank {} not in (src rank, src token) order", r);
            prop_assert_eq!(recv.x.shape(), [recv.num_recv(), cfg.hidden]);
            for (row, &SrcPos { rank: s, token: t }) in recv.src.iter().enumerate() {
                prop_assert!(ranks_of(inp[s].indices.row(t).unwrap(), cfg.experts_per_rank).contains(&r));
                let same_bits = recv.x.row(row).unwrap().iter().zip(inp[s].x.row(t).unwrap()).all(|(a, b)| a.to_bits() == b.to_bits());
                prop_assert!(same_bits);
                prop_assert_eq!(recv.weights.row(row), inp[s].weights.row(t));
                prop_assert_eq!(recv.indices.row(row), inp[s].indices.row(t));
            }
            // Seed 002: NVL bytes = received tokens x hidden x element size.
            prop_assert_eq!(nvl_recv_bytes(recv.num_recv() as u64, cfg.hidden as u64, 2).unwrap(),
                (recv.x.as_slice().len() * 2) as u64);
            // Canonicalization undoes any order (here: reversed).
            let mut rev = recv.clone();
            let p: Vec<usize> = (0..rev.num_recv()).rev().collect();
            rev.src.reverse();
            rev.x = Tensor2::from_fn(recv.num_recv(), cfg.hidden, |i, j| recv.x.row(p[i]).unwrap()[j]).unwrap();
            rev.weights = Tensor2::from_fn(recv.num_recv(), cfg.top_k, |i, j| recv.weights.row(p[i]).unwrap()[j]).unwrap();
            rev.indices = Tensor2::from_fn(recv.num_recv(), cfg.top_k, |i, j| recv.indices.row(p[i]).unwrap()[j]).unwrap();
            prop_assert_eq!(&rev.canonicalize(r).unwrap(), recv);
        }

        // combine(dispatch(x)) == x * (unique destination ranks), exactly, in bf16.
        let xs: Vec<Tensor2<bf16>> = d.ranks.iter().map(|r| r.x.clone()).collect();
        let idx: Vec<Tensor2<i64>> = inp.iter().map(|i| i.indices.clone()).collect();
        let out = combine::<bf16, bf16, i64>(&cfg, &d.handle, &xs, None, &idx, CombineOptions::default()).unwrap();
        for (s, o) in out.iter().enumerate() {
            prop_assert_eq!(o.x.shape(), inp[s].x.shape());
            prop_assert!(o.weights.is_none());
            for t in 0..inp[s].x.rows() {
                let n = ranks_of(inp[s].indices.row(t).unwrap(), cfg.experts_per_rank).len() as f32;
                for (a, b) in o.x.row(t).unwrap().iter().zip(inp[s].x.row(t).unwrap()) {
                    prop_assert_eq!(a.to_f32(), b.to_f32() * n); // -0 == +0 for tokens routed nowhere
                }
            }
        }
    }

    /// Weighted combine (RankSlotSum) into f32, exact with dyadic weights; combined weights
    /// = weights x unique ranks.
    #[test]
    fn weighted_combine(c in case()) {
        let cfg = config(c.geo.0, c.geo.1, c.epr, c.k, 2048, 5);
        let mut rng = SplitMix64::new(c.seed ^ 0x5eed);
        let inp = inputs(&cfg, &c.tokens, Mode::DeepEpMasked, &mut rng);
        let d = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
        let xs: Vec<Tensor2<bf16>> = d.ranks.iter().map(|r| r.x.clone()).collect();
        let ws: Vec<Tensor2<f32>> = d.ranks.iter().map(|r| r.weights.clone()).collect();
        let idx: Vec<Tensor2<i64>> = inp.iter().map(|i| i.indices.clone()).collect();
        let opts = CombineOptions { weighting: Weighting::RankSlotSum, ..Default::default() };
        let out = combine::<bf16, f32, i64>(&cfg, &d.handle, &xs, Some(&ws), &idx, opts).unwrap();
        for (s, o) in out.iter().enumerate() {
            for t in 0..inp[s].x.rows() {
                let row = inp[s].indices.row(t).unwrap();
                let w = inp[s].weights.row(t).unwrap();
                // Σ over unique ranks of (Σ slots on that rank) = Σ over valid slots.
                let gate: f32 = row.iter().zip(w).filter(|(&e, _)| e >= 0).map(|(_, &w)| w).sum();
                for (a, b) in o.x.row(t).unwrap().iter().zip(inp[s].x.row(t).unwrap()) {
                    prop_assert_eq!(*a, b.to_f32() * gate);
                }
                let n = ranks_of(row, cfg.experts_per_rank).len() as f32;
                for (a, b) in o.weights.as_ref().unwrap().row(t).unwrap().iter().zip(w) {
                    prop_assert_eq!(*a, b * n);
                }
            }
        }
    }

    /// fp8-e4m3 tokens with [T, H/128] f32 scales travel bit-exactly, with their scales.
    #[test]
    fn fp8_dispatch_carries_scales(c in case()) {
        let mut cfg = config(c.geo.0, c.geo.1, c.epr, c.k, c.hidden, 5);
        cfg.scale_dim = fp8_scale_cols(cfg.hidden);
        cfg.scale_type_size = 4;
        let mut rng = SplitMix64::new(c.seed);
        let base = inputs(&cfg, &c.tokens, c.mode, &mut rng);
        let inp: Vec<RankInput<Fp8E4m3, i64>> = base.into_iter().map(|i| {
            let f = Tensor2::from_fn(i.x.rows(), cfg.hidden, |r, k| rng.normal() as f32 * (1 + r + k % 7) as f32).unwrap();
            let (q, s) = quantize_fp8_blocks(&f);
            RankInput { x: q, weights: i.weights, scales: Some(s), indices: i.indices }
        }).collect();
        let d = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
        for recv in &d.ranks {
            let sc = recv.scales.as_ref().unwrap();
            prop_assert_eq!(sc.shape(), [recv.num_recv(), cfg.scale_dim]);
            for (row, p) in recv.src.iter().enumerate() {
                prop_assert_eq!(recv.x.row(row), inp[p.rank].x.row(p.token));
                prop_assert_eq!(sc.row(row), inp[p.rank].scales.as_ref().unwrap().row(p.token));
            }
        }
    }
}
