//! The reference combine's summation orders: `SumOrder::PerNode` (node
//! partials, then summed over nodes) against `Ascending`, and `PerNodeRounded` (the inter-node
//! executors': other nodes' partials in the input dtype), by hand and by property.

mod common;

use common::{config, inputs, Mode};
use mori_ep::routing::SplitMix64;
use mori_ep::*;
use proptest::prelude::*;

/// 2 nodes x 2 ranks, 4 experts (1 per rank), top-3, hidden 16, one token on rank 0 routed to
/// ranks 0, 2 and 3 whose rows are 1, 1e8 and -1e8: ascending gives (1 + 1e8) - 1e8 = 0 in
/// f32, per node gives 1 + (1e8 - 1e8) = 1.
#[test]
fn per_node_order_by_hand() {
    let cfg = config(4, 2, 1, 3, 16, 1);
    let one = |ids: Vec<i32>| RankInput::<f32, i32> {
        x: Tensor2::filled(ids.len() / 3, 16, 0.0).unwrap(),
        weights: Tensor2::filled(ids.len() / 3, 3, 1.0).unwrap(),
        scales: None,
        indices: Tensor2::new(ids.len() / 3, 3, ids).unwrap(),
    };
    let inp = vec![one(vec![0, 2, 3]), one(vec![]), one(vec![]), one(vec![])];
    let d = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
    let rows = [1.0f32, 0.0, 1e8, -1e8];
    let xs: Vec<Tensor2<f32>> = d.ranks.iter().enumerate().map(|(r, rr)| Tensor2::filled(rr.num_recv(), 16, rows[r]).unwrap()).collect();
    let idx: Vec<_> = inp.iter().map(|i| i.indices.clone()).collect();
    let run = |order| {
        let opts = CombineOptions { order, ..Default::default() };
        combine::<f32, f32, i32>(&cfg, &d.handle, &xs, None, &idx, opts).unwrap()[0].x.row(0).unwrap()[0]
    };
    assert_eq!(run(SumOrder::Ascending), 0.0);
    assert_eq!(run(SumOrder::PerNode), 1.0);
}

/// 2 nodes x 2 ranks, bf16 rows: rank 0's token routed to ranks 2 and 3 (node 1) whose rows are
/// 1 and 2^-9. Node 1's f32 partial 1 + 2^-9 is not a bf16 (spacing 2^-7 at 1): PerNode
/// returns it, PerNodeRounded (the partial crossing in bf16) rounds it to 1 first; the
/// source's own node's partial is never rounded (rank 0's row 2^-9 routed to itself).
#[test]
fn per_node_rounded_by_hand() {
    let cfg = config(4, 2, 1, 3, 16, 1);
    let one = |ids: Vec<i32>| RankInput::<bf16, i32> {
        x: Tensor2::filled(ids.len() / 3, 16, bf16::from_f32(0.0)).unwrap(),
        weights: Tensor2::filled(ids.len() / 3, 3, 1.0).unwrap(),
        scales: None,
        indices: Tensor2::new(ids.len() / 3, 3, ids).unwrap(),
    };
    let run = |ids: Vec<i32>, rows: [f32; 4], order| {
        let inp = vec![one(ids), one(vec![]), one(vec![]), one(vec![])];
        let d = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
        let xs: Vec<Tensor2<bf16>> =
            d.ranks.iter().enumerate().map(|(r, rr)| Tensor2::filled(rr.num_recv(), 16, bf16::from_f32(rows[r])).unwrap()).collect();
        let idx: Vec<_> = inp.iter().map(|i| i.indices.clone()).collect();
        let opts = CombineOptions { order, ..Default::default() };
        combine::<bf16, f32, i32>(&cfg, &d.handle, &xs, None, &idx, opts).unwrap()[0].x.row(0).unwrap()[0]
    };
    let tiny = 2f32.powi(-9);
    let far = [0.0, 0.0, 1.0, tiny];
    assert_eq!(run(vec![2, 3, -1], far, SumOrder::PerNode), 1.0 + tiny);
    assert_eq!(run(vec![2, 3, -1], far, SumOrder::PerNodeRounded), 1.0);
    let near = [tiny, 0.0, 1.0, 0.0];
    assert_eq!(run(vec![0, 2, -1], near, SumOrder::PerNodeRounded), tiny + 1.0, "own node's partial rounded");
}

/// Per-node oracle written out directly: for each source token, a partial per node over the
/// receiving ranks (ascending), the partials added over nodes ascending, weighted by the
/// rank's slot-weight sum; with `round`, each other node's partial passed through it first.
fn per_node_oracle(
    cfg: &EpConfig,
    d: &Dispatched<bf16, i64>,
    xs: &[Tensor2<f32>],
    inp: &[RankInput<bf16, i64>],
    round: Option<fn(f32) -> f32>,
) -> Vec<Vec<f32>> {
    let (h, g, epr) = (cfg.hidden, cfg.gpus_per_node, cfg.experts_per_rank);
    let mut out = Vec::new();
    for (s, i) in inp.iter().enumerate() {
        let mut acc = vec![0f32; i.indices.rows() * h];
        for t in 0..i.indices.rows() {
            let ids = i.indices.row(t).unwrap();
            for node in 0..cfg.world_size / g {
                let mut part = vec![0f32; h];
                let mut any = false;
                for (r, (rr, xr)) in d.ranks.iter().zip(xs).enumerate().take((node + 1) * g).skip(node * g) {
                    let Some(row) = rr.src.iter().position(|p| p.rank == s && p.token == t) else { continue };
                    any = true;
                    let w = rr.weights.row(row).unwrap();
                    let f: f32 =
                        ids.iter().zip(w).filter(|(&e, _)| e >= 0 && e as usize / epr == r).map(|(_, &w)| w).fold(0.0, |a, b| a + b);
                    for (p, v) in part.iter_mut().zip(xr.row(row).unwrap()) {
                        *p += f * v;
                    }
                }
                if any {
                    let r = round.filter(|_| node != s / g).unwrap_or(|v| v);
                    for (a, p) in acc[t * h..(t + 1) * h].iter_mut().zip(&part) {
                        *a += r(*p);
                    }
                }
            }
        }
        out.push(acc);
    }
    out
}

type Routed = (EpConfig, SplitMix64, Vec<RankInput<bf16, i64>>, Dispatched<bf16, i64>);

/// `geo` = (world, ranks per node), top-`k`, hidden 16: random token counts and routing from
/// `seed`, dispatched; the generator goes on to make the rows.
fn routed(geo: (usize, usize), k: usize, seed: u64) -> Routed {
    let cfg = config(geo.0, geo.1, 2, k, 16, 5);
    let mut rng = SplitMix64::new(seed);
    let tokens: Vec<usize> = (0..geo.0).map(|_| rng.below(6) as usize).collect();
    let inp = inputs(&cfg, &tokens, Mode::DeepEpMasked, &mut rng);
    let d = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
    (cfg, rng, inp, d)
}

/// Every rank's received weights and every source's ids (combine's weight and index inputs).
fn weights_and_ids(d: &Dispatched<bf16, i64>, inp: &[RankInput<bf16, i64>]) -> (Vec<Tensor2<f32>>, Vec<Tensor2<i64>>) {
    (d.ranks.iter().map(|r| r.weights.clone()).collect(), inp.iter().map(|i| i.indices.clone()).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// PerNode equals the direct oracle bit for bit (f32 out, non-integer rows so order
    /// matters), and equals Ascending whenever there is one node or one rank per node.
    #[test]
    fn per_node_matches_oracle(geo in prop_oneof![Just((4usize, 2usize)), Just((8, 4)), Just((8, 2)), Just((4, 4)), Just((4, 1))],
                               k in 1usize..4, seed in any::<u64>()) {
        let (cfg, mut rng, inp, d) = routed(geo, k, seed);
        let xs: Vec<Tensor2<f32>> = d.ranks.iter()
            .map(|r| Tensor2::from_fn(r.num_recv(), 16, |_, _| (rng.below(1 << 20) as f32 - 5e5) * 1.37e-3).unwrap())
            .collect();
        let (ws, idx) = weights_and_ids(&d, &inp);
        let run = |order| {
            let opts = CombineOptions { order, weighting: Weighting::RankSlotSum, ..Default::default() };
            combine::<f32, f32, i64>(&cfg, &d.handle, &xs, Some(&ws), &idx, opts).unwrap()
        };
        let (asc, per) = (run(SumOrder::Ascending), run(SumOrder::PerNode));
        let oracle = per_node_oracle(&cfg, &d, &xs, &inp, None);
        for s in 0..geo.0 {
            let got: Vec<u32> = per[s].x.as_slice().iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = oracle[s].iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(got, want, "rank {}", s);
            if geo.1 == 1 || geo.0 == geo.1 {
                prop_assert_eq!(&per[s].x, &asc[s].x);
                prop_assert_eq!(&per[s].weights, &asc[s].weights);
            }
        }
    }

    /// PerNodeRounded equals the oracle with other nodes' partials rounded to bf16 (bf16
    /// rows, f32 out), and PerNode whenever the rows are f32 (rounding to f32 changes nothing).
    #[test]
    fn per_node_rounded_matches_oracle(geo in prop_oneof![Just((4usize, 2usize)), Just((8, 4)), Just((8, 2)), Just((4, 1))],
                                       k in 1usize..4, seed in any::<u64>()) {
        let (cfg, mut rng, inp, d) = routed(geo, k, seed);
        let xb: Vec<Tensor2<bf16>> = d.ranks.iter()
            .map(|r| Tensor2::from_fn(r.num_recv(), 16, |_, _| bf16::from_f32((rng.below(1 << 16) as f32 - 3e4) * 1.37e-2)).unwrap())
            .collect();
        let xf: Vec<Tensor2<f32>> = xb.iter().map(|x| Tensor2::from_fn(x.rows(), 16, |i, j| x.row(i).unwrap()[j].to_f32()).unwrap()).collect();
        let (ws, idx) = weights_and_ids(&d, &inp);
        let opts = |order| CombineOptions { order, weighting: Weighting::RankSlotSum, ..Default::default() };
        let rounded = combine::<bf16, f32, i64>(&cfg, &d.handle, &xb, Some(&ws), &idx, opts(SumOrder::PerNodeRounded)).unwrap();
        let oracle = per_node_oracle(&cfg, &d, &xf, &inp, Some(|v| bf16::from_f32(v).to_f32()));
        let f_rounded = combine::<f32, f32, i64>(&cfg, &d.handle, &xf, Some(&ws), &idx, opts(SumOrder::PerNodeRounded)).unwrap();
        let f_per = combine::<f32, f32, i64>(&cfg, &d.handle, &xf, Some(&ws), &idx, opts(SumOrder::PerNode)).unwrap();
        for s in 0..geo.0 {
            let got: Vec<u32> = rounded[s].x.as_slice().iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = oracle[s].iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(got, want, "rank {}", s);
            prop_assert_eq!(&f_rounded[s], &f_per[s]);
        }
    }
}
