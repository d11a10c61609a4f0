//! Hand-checked dispatch/combine cases and every input error of the host reference.

use mori_ep::*;

/// 2 ranks on 2 nodes (1 GPU each), 4 experts (2 per rank), top-2, hidden 16, <= 3 tokens.
fn cfg() -> EpConfig {
    let mut c = EpConfig::new(2, 16, 4, 2, 3).unwrap();
    c.gpus_per_node = 1;
    c.kernel_type = KernelType::InterNodeV1;
    c.block_num = 2;
    c.rdma_block_num = 1;
    c.validate().unwrap();
    c
}

/// Rank s, token t: row filled with 10 s + t + 1; weights [0.5, 0.25].
fn input<I: TopkIndex>(s: usize, ids: &[[I; 2]]) -> RankInput<f32, I> {
    let t = ids.len();
    RankInput {
        x: Tensor2::from_fn(t, 16, |r, _| (10 * s + r + 1) as f32).unwrap(),
        weights: Tensor2::from_fn(t, 2, |_, k| if k == 0 { 0.5 } else { 0.25 }).unwrap(),
        scales: None,
        indices: Tensor2::new(t, 2, ids.iter().flatten().copied().collect()).unwrap(),
    }
}

fn example() -> Vec<RankInput<f32, i32>> {
    vec![input(0, &[[0, 3], [2, 3], [-1, 1]]), input(1, &[[1, 0], [-1, -1]])]
}

fn src(v: &[(usize, usize)]) -> Vec<SrcPos> {
    v.iter().map(|&(rank, token)| SrcPos { rank, token }).collect()
}

fn indices_of<X, I: Clone, S>(inp: &[RankInput<X, I, S>]) -> Vec<Tensor2<I>> {
    inp.iter().map(|i| i.indices.clone()).collect()
}

#[test]
fn layout_by_hand() {
    let lay = dispatch_layout(&example()[0].indices, 4, 2, 1).unwrap();
    assert_eq!(lay.tokens_per_rank, vec![2, 2]);
    assert_eq!(lay.tokens_per_node, vec![2, 2]);
    assert_eq!(lay.tokens_per_expert, vec![1, 1, 1, 2]);
    assert_eq!(lay.is_token_in_rank.as_slice(), &[true, true, false, true, true, false]);
    // One node of two GPUs: every token counts once for the node.
    assert_eq!(dispatch_layout(&example()[0].indices, 4, 2, 2).unwrap().tokens_per_node, vec![3]);
}

#[test]
fn dispatch_and_combine_by_hand() {
    let (c, inp) = (cfg(), example());
    let d = dispatch(&c, &inp, DispatchOptions::default()).unwrap();
    assert_eq!(d.ranks[0].src, src(&[(0, 0), (0, 2), (1, 0)]));
    assert_eq!(d.ranks[1].src, src(&[(0, 0), (0, 1)]));
    assert_eq!(d.handle.num_tokens, vec![3, 2]);
    assert_eq!(d.ranks[0].x.row(2).unwrap()[0], 11.0);
    assert_eq!(d.ranks[0].indices.as_slice(), &[0, 3, -1, 1, 1, 0]); // global ids, as sent
    assert_eq!(localize_indices(&d.ranks[1].indices, 1, 2).as_slice(), &[-1, 1, 0, 1]);
    assert_eq!(d.ranks[1].src[1].flat(c.max_tokens_per_rank), 1);
    assert_eq!(SrcPos::from_flat(4, 3), Some(SrcPos { rank: 1, token: 1 }));

    let xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
    let ws: Vec<_> = d.ranks.iter().map(|r| r.weights.clone()).collect();
    let out = combine::<f32, f32, i32>(&c, &d.handle, &xs, Some(&ws), &indices_of(&inp), CombineOptions::default()).unwrap();
    let firsts = |o: &Combined<f32>| o.x.iter_rows().map(|r| r[0]).collect::<Vec<_>>();
    assert_eq!(firsts(&out[0]), vec![2.0, 2.0, 3.0]); // 1 x 2 ranks, 2 x 1, 3 x 1
    assert_eq!(firsts(&out[1]), vec![11.0, 0.0]); // second token went nowhere
    assert_eq!(out[0].weights.as_ref().unwrap().row(0).unwrap(), &[1.0, 0.5]);
    assert_eq!(out[1].weights.as_ref().unwrap().row(1).unwrap(), &[0.0, 0.0]);

    // Weighted: token (0,0) has expert 0 (w 0.5) on rank 0 and expert 3 (w 0.25) on rank 1.
    let opts = CombineOptions { weighting: Weighting::RankSlotSum, ..Default::default() };
    let out = combine::<f32, bf16, i32>(&c, &d.handle, &xs, Some(&ws), &indices_of(&inp), opts).unwrap();
    let firsts: Vec<f32> = out[0].x.iter_rows().map(|r| r[0].to_f32()).collect();
    assert_eq!(firsts, vec![0.75, 1.5, 0.75]);
    assert_eq!(
        combine::<f32, f32, i32>(&c, &d.handle, &xs, None, &indices_of(&inp), opts),
        Err(EpError::WeightsRequired { weighting: "RankSlotSum" })
    );
}

#[test]
fn i64_indices_and_empty_ranks() {
    let c = cfg();
    let inp = vec![input::<i64>(0, &[]), input::<i64>(1, &[])];
    let d = dispatch(&c, &inp, DispatchOptions::default()).unwrap();
    assert!(d.ranks.iter().all(|r| r.num_recv() == 0 && r.x.shape() == [0, 16]));
    let xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
    let out = combine::<f32, f32, i64>(&c, &d.handle, &xs, None, &indices_of(&inp), CombineOptions::default()).unwrap();
    assert!(out.iter().all(|o| o.x.shape() == [0, 16]));
}

#[test]
fn out_of_range_ids() {
    let c = cfg();
    for bad in [4, -2, i32::MAX] {
        let inp = vec![input(0, &[[0, 1]]), input(1, &[[1, bad]])];
        let e = dispatch(&c, &inp, DispatchOptions::default()).unwrap_err();
        assert_eq!(e, EpError::ExpertOutOfRange { rank: 1, token: 0, slot: 1, expert: bad as i64, num_experts: 4 });
        assert!(e.to_string().contains("out of range [0, 4)"), "{e}");
        // Dropped: routes by the valid slot only; the row travels verbatim.
        let drop = DispatchOptions { out_of_range: OutOfRange::Drop };
        let d = dispatch(&c, &inp, drop).unwrap();
        assert_eq!(d.ranks[0].src, src(&[(0, 0), (1, 0)]));
        assert_eq!(d.ranks[0].indices.row(1).unwrap(), &[1, bad]);
        let xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
        let strict = CombineOptions::default();
        assert!(combine::<f32, f32, i32>(&c, &d.handle, &xs, None, &indices_of(&inp), strict).is_err());
        let lax = CombineOptions { out_of_range: OutOfRange::Drop, ..Default::default() };
        let out = combine::<f32, f32, i32>(&c, &d.handle, &xs, None, &indices_of(&inp), lax).unwrap();
        assert_eq!(out[1].x.row(0).unwrap()[0], 11.0);
    }
}

#[test]
fn combine_refuses_dispatch_output_indices() {
    let c = cfg();
    // Same token counts as received counts: caught by the routing check.
    let inp = example();
    let d = dispatch(&c, &inp, DispatchOptions::default()).unwrap();
    let xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
    let wrong: Vec<_> = d.ranks.iter().map(|r| r.indices.clone()).collect();
    let e = combine::<f32, f32, i32>(&c, &d.handle, &xs, None, &wrong, CombineOptions::default()).unwrap_err();
    assert_eq!(e, EpError::RoutingMismatch { rank: 0, token: 1, routed: vec![0], delivered: vec![1] });
    assert!(e.to_string().contains("original top-k indices"));
    // Different counts: caught by shape, with a message saying what happened.
    let inp = vec![input(0, &[[0, 3], [2, 3], [-1, 1]]), input(1, &[[1, 0]])];
    let d = dispatch(&c, &inp, DispatchOptions::default()).unwrap();
    let xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
    let wrong: Vec<_> = d.ranks.iter().map(|r| r.indices.clone()).collect();
    let e = combine::<f32, f32, i32>(&c, &d.handle, &xs, None, &wrong, CombineOptions::default()).unwrap_err();
    assert_eq!(e, EpError::IndicesLookLikeDispatchOutput { rank: 1, rows: 2, tokens: 1 });
}

#[test]
fn input_errors_name_input_and_limit() {
    let c = cfg();
    let opts = DispatchOptions::default();
    assert_eq!(dispatch(&c, &example()[..1], opts).unwrap_err(), EpError::RankCount { input: "dispatch inputs", expected: 2, got: 1 });
    let mut inp = example();
    inp[1].weights = Tensor2::filled(2, 3, 0.0).unwrap();
    assert_eq!(
        dispatch(&c, &inp, opts).unwrap_err(),
        EpError::Shape { input: "weights", rank: 1, exp_rows: 2, exp_cols: 2, rows: 2, cols: 3 }
    );
    let inp = vec![input(0, &[[0, 1]; 4]), input(1, &[])];
    assert_eq!(dispatch(&c, &inp, opts).unwrap_err(), EpError::TooManyTokens { rank: 0, tokens: 4, limit: 3 });
    let mut inp = example();
    inp[0].scales = Some(Tensor2::filled(3, 1, 1.0).unwrap());
    assert_eq!(dispatch(&c, &inp, opts).unwrap_err(), EpError::ScalesPresence { rank: 0, scale_dim: 0, given: true });
    // f32 tokens into buffers sized for 2-byte elements.
    let mut small = c.clone();
    small.max_token_type_size = 2;
    assert!(matches!(dispatch(&small, &example(), opts), Err(EpError::ElementSize { input: "x", got: 4, .. })));
    // fp8 rows of 16 B are fine; of 8 B are not.
    let mut c8 = EpConfig::new(2, 8, 4, 2, 3).unwrap();
    c8.max_token_type_size = 2;
    c8.validate().unwrap();
    let fp8 = |t| RankInput::<Fp8E4m3, i32> {
        x: Tensor2::filled(t, 8, Fp8E4m3(0x38)).unwrap(),
        weights: Tensor2::filled(t, 2, 1.0).unwrap(),
        scales: None,
        indices: Tensor2::filled(t, 2, 0).unwrap(),
    };
    assert!(matches!(dispatch(&c8, &[fp8(1), fp8(0)], opts), Err(EpError::HiddenBytesNotAligned { what: "x", bytes: 8, .. })));
    // Combine shape and handle errors.
    let d = dispatch(&c, &example(), opts).unwrap();
    let mut xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
    xs[1] = Tensor2::filled(1, 16, 0.0).unwrap();
    assert!(matches!(
        combine::<f32, f32, i32>(&c, &d.handle, &xs, None, &indices_of(&example()), CombineOptions::default()),
        Err(EpError::Shape { input: "combine x", rank: 1, .. })
    ));
    let xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
    let mut h = d.handle.clone();
    h.src[1][1] = SrcPos { rank: 1, token: 7 };
    assert!(matches!(
        combine::<f32, f32, i32>(&c, &h, &xs, None, &indices_of(&example()), CombineOptions::default()),
        Err(EpError::BadSource { rank: 1, row: 1, problem: "does not exist", .. })
    ));
    h.src[1][1] = SrcPos { rank: 0, token: 0 };
    assert!(matches!(
        combine::<f32, f32, i32>(&c, &h, &xs, None, &indices_of(&example()), CombineOptions::default()),
        Err(EpError::BadSource { problem: "appears twice", .. })
    ));
    assert!(matches!(Tensor2::new(2, 3, vec![0u8; 5]), Err(EpError::TensorData { rows: 2, cols: 3, len: 5 })));
}

#[test]
fn canonicalize_rejects_duplicates_and_bad_rows() {
    let d = dispatch(&cfg(), &example(), DispatchOptions::default()).unwrap();
    let mut r = d.ranks[0].clone();
    r.src[2] = r.src[0];
    assert!(matches!(r.canonicalize(0), Err(EpError::BadSource { problem: "appears twice", .. })));
    let mut r = d.ranks[0].clone();
    r.src.pop();
    assert!(matches!(r.canonicalize(0), Err(EpError::Shape { input: "received x", .. })));
    assert_eq!(canonical_order(&src(&[(1, 0), (0, 2), (0, 1)])), vec![2, 1, 0]);
}

#[test]
fn fp8_direct_cast_combine() {
    let mut c = cfg();
    c.quant = Quantization::Fp8DirectCast;
    let mut inp = example();
    inp[0].x = Tensor2::from_fn(3, 16, |r, col| if r == 0 { 500.0 } else { col as f32 }).unwrap();
    let d = dispatch(&c, &inp, DispatchOptions::default()).unwrap();
    let xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
    let out = combine::<f32, f32, i32>(&c, &d.handle, &xs, None, &indices_of(&inp), CombineOptions::default()).unwrap();
    assert_eq!(out[0].x.row(0).unwrap()[0], 896.0); // each of 2 contributions saturates at 448
    assert_eq!(out[0].x.row(1).unwrap()[9], 9.0); // small integers are exact in fp8
    assert_eq!(out[0].x.row(2).unwrap()[15], 15.0);
}
