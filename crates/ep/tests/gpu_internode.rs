//! AsyncLL, V1-LL and V1 across nodes on a real GPU (`mori_ep::gpu_internode::InterNodeGpu`): 2 nodes
//! x 4 ranks on GPU 0, the inter-node leg through each rank's proxy over MORI-IO xgmi and over
//! tcp with host staging; every received row, weight, id, scale and source and every combined
//! row equal the host reference bit for bit (combine in the scheme's summation order), over
//! several rounds. Needs a CUDA device: `--ignored`.

use mori_ep::gpu_internode::{ElemSizes, InterNodeGpu, InterNodeOptions, InterPath, RankBytes};
use mori_ep::internode::Scheme;
use mori_ep::proxy::{RingProxyOptions, RingProxyStats, TailWords};
use mori_ep::routing::SplitMix64;
use mori_ep::{bf16, combine, dispatch, CombineOptions, DispatchOptions, EpConfig, KernelType, RankInput, Tensor2, Weighting};
use mori_gpu::Device;
use std::time::Duration;

fn scheme_kernel_type(s: Scheme) -> KernelType {
    match s {
        Scheme::AsyncLL => KernelType::AsyncLL,
        Scheme::V1LL => KernelType::InterNodeV1LL,
        Scheme::V1 => KernelType::InterNodeV1,
    }
}

fn bytes<T: Copy>(v: &[T], f: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

struct Shape {
    w: usize,
    g: usize,
    t: usize,
    h: usize,
    e: usize,
    k: usize,
    scales: usize,
}

fn inputs(s: &Shape, rng: &mut SplitMix64, round: usize) -> Vec<RankInput<bf16, i64>> {
    (0..s.w)
        .map(|r| {
            let t = if r == 2 && round == 0 { 0 } else { s.t - rng.below(s.t as u64 / 2 + 1) as usize };
            let ids: Vec<i64> = (0..t * s.k).map(|_| rng.below(s.e as u64 + 1) as i64 - 1).collect();
            RankInput {
                // Full mantissas: a different summation order, or a product fused into its add,
                // shows in the low bits.
                x: Tensor2::from_fn(t, s.h, |_, _| bf16::from_f32((rng.below(1 << 16) as f32 / 4096.0 - 8.0) * 1.37)).unwrap(),
                weights: Tensor2::from_fn(t, s.k, |_, _| rng.below(1 << 20) as f32 / 3.3e5).unwrap(),
                scales: (s.scales > 0).then(|| Tensor2::from_fn(t, s.scales, |_, _| rng.below(100) as f32 * 0.5).unwrap()),
                indices: Tensor2::new(t, s.k, ids).unwrap(),
            }
        })
        .collect()
}

fn run(s: &Shape, scheme: Scheme, path: InterPath, rounds: usize, timed: usize) {
    run_with(s, scheme, path, rounds, timed, true, true);
}

/// Each rank's inputs as little-endian bytes: x, weights, ids, scales (empty without).
fn owned_bytes(inp: &[RankInput<bf16, i64>]) -> Vec<[Vec<u8>; 4]> {
    inp.iter()
        .map(|i| {
            [
                bytes(i.x.as_slice(), |v: bf16| v.to_bits().to_le_bytes().to_vec()),
                bytes(i.weights.as_slice(), |v: f32| v.to_le_bytes().to_vec()),
                bytes(i.indices.as_slice(), |v: i64| v.to_le_bytes().to_vec()),
                i.scales.as_ref().map(|t| bytes(t.as_slice(), |v: f32| v.to_le_bytes().to_vec())).unwrap_or_default(),
            ]
        })
        .collect()
}

/// `owned`'s bytes as `InterNodeGpu::dispatch` takes them.
fn rank_bytes<'a>(inp: &[RankInput<bf16, i64>], owned: &'a [[Vec<u8>; 4]]) -> Vec<RankBytes<'a>> {
    inp.iter().zip(owned).map(|(i, o)| RankBytes { tokens: i.x.rows(), x: &o[0], weights: &o[1], idx: &o[2], scales: &o[3] }).collect()
}

/// The configuration of shape `s` under `scheme` (f32 scales when the shape has them, bf16
/// tokens), and the element sizes every test uses: bf16 tokens and combine rows, i64 ids, f32
/// output.
fn shape_config(s: &Shape, scheme: Scheme) -> (EpConfig, ElemSizes) {
    let mut cfg = EpConfig::with_gpus_per_node(s.w, s.g, s.h, s.e, s.k, s.t).unwrap();
    cfg.scale_dim = s.scales;
    cfg.scale_type_size = 4;
    cfg.max_token_type_size = 2;
    cfg.set_kernel_type(scheme_kernel_type(scheme));
    (cfg, ElemSizes { elem: 2, idx_size: 8, comb_elem: 2, out_elem: 4 })
}

/// `run` with [`InterNodeOptions::combine_rows`] and [`InterNodeOptions::recv_in_window`] as
/// given.
fn run_with(s: &Shape, scheme: Scheme, path: InterPath, rounds: usize, timed: usize, combine_rows: bool, recv_in_window: bool) {
    run_words(s, scheme, path, (rounds, timed), (combine_rows, recv_in_window), None);
}

/// `run_with` with the proxies' [`RingProxyOptions::tail_words`] as given (`None`: the
/// default).
fn run_words(s: &Shape, scheme: Scheme, path: InterPath, rt_rounds: (usize, usize), win: (bool, bool), tail_words: Option<TailWords>) {
    let ((rounds, timed), (combine_rows, recv_in_window)) = (rt_rounds, win);
    // Before the CUDA context exists (every test sets it; the first one creates the context).
    std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    let rt = mori_gpu::detect().expect("a CUDA or HIP runtime");
    let (cfg, sz) = shape_config(s, scheme);
    let opts = InterNodeOptions {
        path,
        weighted: true,
        timeout: Duration::from_secs(20),
        combine_rows,
        recv_in_window,
        proxy: RingProxyOptions { tail_words, ..RingProxyOptions::default() },
        ..InterNodeOptions::default()
    };
    let mut ep = InterNodeGpu::new(rt, Device(0), &cfg, sz, opts).unwrap();
    println!("{}", ep.describe());
    // The combine input goes into the window over xgmi unless told otherwise.
    let in_window = combine_rows && path == InterPath::Xgmi;
    assert_eq!(ep.describe().contains("combine input as rows in the window"), in_window, "{}", ep.describe());
    assert_eq!(ep.describe().contains("the received records stay in the window"), recv_in_window, "{}", ep.describe());
    let mut rng = SplitMix64::new(0x5eed_0017);
    for round in 0..rounds + timed {
        let inp = inputs(s, &mut rng, round);
        let owned = owned_bytes(&inp);
        let rb = rank_bytes(&inp, &owned);
        let (got, ticket) = ep.dispatch(&rb).unwrap();
        let want = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
        for (r, (g, w)) in got.iter().zip(&want.ranks).enumerate() {
            assert_eq!(g.x, bytes(w.x.as_slice(), |v: bf16| v.to_bits().to_le_bytes().to_vec()), "round {round} rank {r}: rows");
            assert_eq!(g.weights, bytes(w.weights.as_slice(), |v: f32| v.to_le_bytes().to_vec()), "round {round} rank {r}: weights");
            assert_eq!(g.idx, bytes(w.indices.as_slice(), |v: i64| v.to_le_bytes().to_vec()), "round {round} rank {r}: ids");
            if let Some(sc) = &w.scales {
                assert_eq!(g.scales, bytes(sc.as_slice(), |v: f32| v.to_le_bytes().to_vec()), "round {round} rank {r}: scales");
            }
            let src: Vec<u8> = w.src.iter().flat_map(|p| (p.flat(s.t) as i32).to_le_bytes()).collect();
            assert_eq!(g.src, src, "round {round} rank {r}: sources");
        }
        let xs: Vec<&[u8]> = got.iter().map(|g| &g.x[..]).collect();
        let ws: Vec<&[u8]> = got.iter().map(|g| &g.weights[..]).collect();
        let comb = ep.combine(ticket, &xs, Some(&ws)).unwrap();
        let rx: Vec<Tensor2<bf16>> = want.ranks.iter().map(|r| r.x.clone()).collect();
        let rw: Vec<Tensor2<f32>> = want.ranks.iter().map(|r| r.weights.clone()).collect();
        let idx: Vec<Tensor2<i64>> = inp.iter().map(|i| i.indices.clone()).collect();
        let o = CombineOptions { weighting: Weighting::RankSlotSum, order: scheme.sum_order(), ..CombineOptions::default() };
        let out = combine::<bf16, f32, i64>(&cfg, &want.handle, &rx, Some(&rw), &idx, o).unwrap();
        for (r, ((gx, gw), w)) in comb.iter().zip(&out).enumerate() {
            assert_eq!(*gx, bytes(w.x.as_slice(), |v: f32| v.to_le_bytes().to_vec()), "round {round} rank {r}: combined rows");
            assert_eq!(
                *gw,
                bytes(w.weights.as_ref().unwrap().as_slice(), |v: f32| v.to_le_bytes().to_vec()),
                "round {round} rank {r}: weight sums"
            );
        }
        let recv: usize = got.iter().map(|g| g.src.len() / 4).sum();
        let t = ep.times();
        assert_eq!(ep.combine_in_window(), in_window);
        assert_eq!(t.kernel_us[3] == 0.0, in_window, "combine's staging kernel runs unless the input is in the window: {:?}", t.kernel_us);
        assert_eq!(ep.recv_in_window(), recv_in_window);
        assert_eq!(t.kernel_us[2] == 0.0, recv_in_window, "the copy-out runs unless the records stay in the window: {:?}", t.kernel_us);
        assert_eq!(t.kernel_us[6] > 0.0, scheme != Scheme::AsyncLL, "the relay's sums run under V1 and V1-LL only: {:?}", t.kernel_us);
        println!(
            "round {round}: check OK; {recv} rows received in all; kernels: dispatch {:.1} us, combine {:.1} us; per kernel {:.1?} us{}",
            t.dispatch_us,
            t.combine_us,
            t.kernel_us,
            if round >= rounds { " (timed)" } else { "" }
        );
    }
    let ps = ep.proxy_stats();
    println!("proxies: {ps:?}");
    // Over xgmi every pair rides in its segment's ordered batch, over a session. Tail words
    // (off by default) go with every batch that has data under `all`, and under `single` with
    // every one of V1's and V1-LL's on 2 nodes (one destination a proxy: the relay).
    let default_env = [mori_ep::proxy::SESSIONS_ENV, mori_ep::proxy::TAIL_WORDS_ENV].iter().all(|v| std::env::var_os(v).is_none());
    if path == InterPath::Xgmi && default_env {
        let sum = |f: fn(&RingProxyStats) -> u64| ps.iter().map(f).sum::<u64>();
        let (batches, ordered, sessions, words, with_data) =
            (sum(|p| p.batches), sum(|p| p.ordered_batches), sum(|p| p.session_batches), sum(|p| p.word_batches), sum(|p| p.write_batches));
        assert!(batches > 0 && ordered == batches && sessions == batches, "ordered batches over sessions: {ps:?}");
        let want = match tail_words {
            None | Some(TailWords::Off) => Some(0),
            Some(TailWords::All) => Some(with_data),
            Some(TailWords::Single) => (scheme != Scheme::AsyncLL && s.w / s.g == 2).then_some(with_data),
        };
        if let Some(want) = want {
            assert!(tail_words.is_none() || want > 0, "tail words asked for, but no batch with data: {ps:?}");
            assert_eq!(words, want, "batches whose pairs went as tail words ({tail_words:?}): {ps:?}");
        }
    }
}

const SMALL: Shape = Shape { w: 8, g: 4, t: 48, h: 256, e: 64, k: 8, scales: 2 };
const DECODE: Shape = Shape { w: 8, g: 4, t: 128, h: 7168, e: 256, k: 8, scales: 0 };

#[test]
#[ignore = "needs a CUDA device"]
fn async_ll_2x4_on_one_gpu_over_xgmi_equals_the_reference() {
    run(&SMALL, Scheme::AsyncLL, InterPath::Xgmi, 3, 0);
}

/// The counter pairs as tail words (copy-engine copies, then the words in one stream batch):
/// V1 and V1-LL's single-destination bursts, and AsyncLL's bursts to 4 ranks, all worded.
#[test]
#[ignore = "needs a CUDA device"]
fn tail_words_over_xgmi_equal_the_reference() {
    run_words(&SMALL, Scheme::V1, InterPath::Xgmi, (3, 0), (true, true), Some(TailWords::Single));
    run_words(&SMALL, Scheme::V1LL, InterPath::Xgmi, (3, 0), (true, true), Some(TailWords::Single));
    run_words(&SMALL, Scheme::AsyncLL, InterPath::Xgmi, (3, 0), (true, true), Some(TailWords::All));
}

#[test]
#[ignore = "needs a CUDA device"]
fn async_ll_2x4_over_xgmi_with_combine_staging_equals_the_reference() {
    run_with(&SMALL, Scheme::AsyncLL, InterPath::Xgmi, 3, 0, false, true);
}

/// V1 with a staging kernel storing every combine row (`combine_rows` false): this node's
/// sources' by P2P store, the others' into the relays' gather areas.
#[test]
#[ignore = "needs a CUDA device"]
fn v1_2x4_over_xgmi_with_combine_staging_equals_the_reference() {
    run_with(&SMALL, Scheme::V1, InterPath::Xgmi, 3, 0, false, true);
}

/// The received records copied out of the window by a kernel (`recv_in_window` false).
#[test]
#[ignore = "needs a CUDA device"]
fn async_ll_2x4_over_xgmi_with_the_copy_out_equals_the_reference() {
    run_with(&SMALL, Scheme::AsyncLL, InterPath::Xgmi, 3, 0, true, false);
}

#[test]
#[ignore = "needs a CUDA device"]
fn v1_ll_2x4_over_xgmi_with_the_copy_out_equals_the_reference() {
    run_with(&SMALL, Scheme::V1LL, InterPath::Xgmi, 3, 0, true, false);
}

#[test]
#[ignore = "needs a CUDA device"]
fn v1_ll_2x4_on_one_gpu_over_xgmi_equals_the_reference() {
    run(&SMALL, Scheme::V1LL, InterPath::Xgmi, 3, 0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn v1_ll_2x4_on_one_gpu_over_tcp_with_host_staging_equals_the_reference() {
    run(&SMALL, Scheme::V1LL, InterPath::Tcp { lanes: 4 }, 3, 0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn v1_ll_decode_shape_over_xgmi() {
    run(&DECODE, Scheme::V1LL, InterPath::Xgmi, 1, 5);
}

#[test]
#[ignore = "needs a CUDA device"]
fn v1_2x4_on_one_gpu_over_xgmi_equals_the_reference() {
    run(&SMALL, Scheme::V1, InterPath::Xgmi, 3, 0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn v1_2x4_on_one_gpu_over_tcp_with_host_staging_equals_the_reference() {
    run(&SMALL, Scheme::V1, InterPath::Tcp { lanes: 4 }, 3, 0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn v1_decode_shape_over_xgmi() {
    run(&DECODE, Scheme::V1, InterPath::Xgmi, 1, 5);
}

#[test]
#[ignore = "needs a CUDA device"]
fn async_ll_2x4_on_one_gpu_over_tcp_with_host_staging_equals_the_reference() {
    run(&SMALL, Scheme::AsyncLL, InterPath::Tcp { lanes: 4 }, 3, 0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn async_ll_decode_shape_over_xgmi() {
    run(&DECODE, Scheme::AsyncLL, InterPath::Xgmi, 1, 5);
}

#[test]
#[ignore = "needs a CUDA device"]
fn async_ll_decode_shape_over_tcp() {
    run(&DECODE, Scheme::AsyncLL, InterPath::Tcp { lanes: 4 }, 1, 3);
}

/// Dispatch and combine back to back, no host work between the calls, f32 combine rows: the
/// pattern that timed out over xgmi before each stream had a hardware queue of its own.
#[test]
#[ignore = "needs a CUDA device"]
fn async_ll_back_to_back_calls_over_xgmi() {
    std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    let rt = mori_gpu::detect().expect("a CUDA or HIP runtime");
    let s = DECODE;
    let mut cfg = EpConfig::with_gpus_per_node(s.w, s.g, s.h, s.e, s.k, s.t).unwrap();
    cfg.set_kernel_type(KernelType::AsyncLL);
    let sz = ElemSizes { elem: 2, idx_size: 8, comb_elem: 4, out_elem: 4 };
    let mut ep =
        InterNodeGpu::new(rt, Device(0), &cfg, sz, InterNodeOptions { blocks_per_rank: 16, ..InterNodeOptions::default() }).unwrap();
    let mut rng = SplitMix64::new(3);
    let inp = inputs(&s, &mut rng, 1);
    let owned: Vec<[Vec<u8>; 3]> = inp
        .iter()
        .map(|i| {
            [
                bytes(i.x.as_slice(), |v: bf16| v.to_bits().to_le_bytes().to_vec()),
                bytes(i.weights.as_slice(), |v: f32| v.to_le_bytes().to_vec()),
                bytes(i.indices.as_slice(), |v: i64| v.to_le_bytes().to_vec()),
            ]
        })
        .collect();
    let rb: Vec<RankBytes<'_>> =
        inp.iter().zip(&owned).map(|(i, o)| RankBytes { tokens: i.x.rows(), x: &o[0], weights: &o[1], idx: &o[2], scales: &[] }).collect();
    for it in 0..20 {
        let (got, ticket) = ep.dispatch(&rb).unwrap_or_else(|e| panic!("iteration {it}: {e}"));
        let rows: Vec<Vec<u8>> = got.iter().map(|g| vec![0u8; g.src.len() / 4 * s.h * 4]).collect();
        let xs: Vec<&[u8]> = rows.iter().map(|v| &v[..]).collect();
        ep.combine(ticket, &xs, None).unwrap_or_else(|e| panic!("iteration {it}: {e}"));
        let t = ep.times();
        println!(
            "iteration {it}: dispatch {:.1} us, combine {:.1} us; per kernel (dispatch layout and staging, dispatch, copy-out, combine staging, combine send, sum) {:.1?} us",
            t.dispatch_us, t.combine_us, t.kernel_us
        );
    }
}

/// A combine input one row short of what a rank received is refused naming the rank and both
/// counts before anything runs, whether the rows are staged by a kernel or moved from the
/// window as they are; the object stays usable. (The kernels' own check of the count runs in
/// the emulated tests.)
#[test]
#[ignore = "needs a CUDA device"]
fn async_ll_combine_rows_short_of_the_received_are_refused() {
    std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    for combine_rows in [true, false] {
        let rt = mori_gpu::detect().expect("a CUDA or HIP runtime");
        let s = SMALL;
        let (cfg, sz) = shape_config(&s, Scheme::AsyncLL);
        let opts = InterNodeOptions { combine_rows, timeout: Duration::from_secs(5), ..InterNodeOptions::default() };
        let mut ep = InterNodeGpu::new(rt, Device(0), &cfg, sz, opts).unwrap();
        let mut rng = SplitMix64::new(11);
        let inp = inputs(&s, &mut rng, 0);
        let owned = owned_bytes(&inp);
        let rb = rank_bytes(&inp, &owned);
        let (got, ticket) = ep.dispatch(&rb).unwrap();
        let n2 = got[2].src.len() / 4;
        assert!(n2 > 0, "rank 2 received rows");
        let row = s.h * 2;
        let xs: Vec<&[u8]> = got.iter().enumerate().map(|(r, g)| if r == 2 { &g.x[..(n2 - 1) * row] } else { &g.x[..] }).collect();
        let t0 = std::time::Instant::now();
        let e = ep.combine(ticket, &xs, None).unwrap_err().to_string();
        let want = format!("the combine input holds {} rows, {n2} were received", n2 - 1);
        assert!(e.contains("rank 2") && e.contains(&want), "combine_rows {combine_rows}: {e}");
        assert!(t0.elapsed() < Duration::from_secs(1), "refused before any kernel waited: {:?}", t0.elapsed());
        // The object stays usable: the next dispatch and a whole combine input go through.
        let (got, ticket) = ep.dispatch(&rb).unwrap_or_else(|e| panic!("combine_rows {combine_rows}: dispatch after the refusal: {e}"));
        let whole: Vec<&[u8]> = got.iter().map(|g| &g.x[..]).collect();
        ep.combine(ticket, &whole, None).unwrap_or_else(|e| panic!("combine_rows {combine_rows}: combine after the refusal: {e}"));
        println!("combine_rows {combine_rows}: refused: {e}; the next dispatch and combine went through");
    }
}

/// The device calls (`dispatch_device`, `combine_input`, `combine_device`) equal the host
/// reference bit for bit over two rounds: AsyncLL over xgmi (records and combine rows in the
/// window) and V1 over xgmi (combine input in two buffers). The inputs live in device buffers of
/// the test's; the records are read where `DeviceRecv` says (one record per source through its
/// address, all of them through `read_recv`); the combine rows are written by the test at the
/// addresses `combine_input` gives, row by row; the outputs read through `read_combined` and at
/// the `DeviceCombined` addresses. Also: inputs short of their shape and a combine short of the
/// received rows are refused before anything runs, the object staying usable.
#[test]
#[ignore = "needs a CUDA device"]
fn device_calls_equal_the_reference() {
    use mori_ep::gpu_internode::DeviceRankInputs;
    use mori_gpu::DeviceSlice;
    std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    for scheme in [Scheme::AsyncLL, Scheme::V1] {
        let rt = mori_gpu::detect().expect("a CUDA or HIP runtime");
        let s = SMALL;
        let (cfg, sz) = shape_config(&s, scheme);
        let opts = InterNodeOptions { weighted: true, timeout: Duration::from_secs(20), ..InterNodeOptions::default() };
        let mut ep = InterNodeGpu::new(rt.clone(), Device(0), &cfg, sz, opts).unwrap();
        assert!(ep.combine_in_window(), "{scheme:?}: the combine input goes into the window over xgmi by default");
        let mut rng = SplitMix64::new(0xde71ce);
        for round in 0..2 {
            let inp = inputs(&s, &mut rng, round);
            let owned = owned_bytes(&inp);
            // Each rank's inputs in device buffers (at least one byte each).
            let bufs: Vec<Vec<mori_gpu::DeviceBuffer>> = owned
                .iter()
                .map(|o| {
                    o.iter()
                        .map(|b| {
                            let d = rt.alloc(Device(0), b.len().max(1)).unwrap();
                            if !b.is_empty() {
                                rt.copy_htod(&d.sub(0, b.len()).unwrap(), b).unwrap();
                            }
                            d
                        })
                        .collect()
                })
                .collect();
            let dev_in: Vec<DeviceRankInputs<'_>> = inp
                .iter()
                .zip(&bufs)
                .zip(&owned)
                .map(|((i, b), o)| DeviceRankInputs {
                    tokens: i.x.rows(),
                    x: b[0].sub(0, o[0].len()).unwrap(),
                    weights: b[1].sub(0, o[1].len()).unwrap(),
                    idx: b[2].sub(0, o[2].len()).unwrap(),
                    scales: (s.scales > 0).then(|| b[3].sub(0, o[3].len()).unwrap()),
                })
                .collect();
            if round == 0 {
                // Rank 1's x one byte short: refused, nothing runs.
                let mut short = dev_in.clone();
                short[1].x = bufs[1][0].sub(0, owned[1][0].len() - 1).unwrap();
                let e = ep.dispatch_device(&short).unwrap_err().to_string();
                assert!(e.contains("rank 1: x of") && e.contains("bytes for"), "{e}");
            }
            let (recv, ticket) = ep.dispatch_device(&dev_in).unwrap();
            let want = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
            let mut rows_given = Vec::new();
            for (r, (d, w)) in recv.iter().zip(&want.ranks).enumerate() {
                assert_eq!(d.total(), w.src.len(), "{scheme:?} round {round} rank {r}: received");
                let g = ep.read_recv(r).unwrap();
                assert_eq!(g.x, bytes(w.x.as_slice(), |v: bf16| v.to_bits().to_le_bytes().to_vec()), "round {round} rank {r}: rows");
                assert_eq!(g.weights, bytes(w.weights.as_slice(), |v: f32| v.to_le_bytes().to_vec()), "round {round} rank {r}: weights");
                assert_eq!(g.idx, bytes(w.indices.as_slice(), |v: i64| v.to_le_bytes().to_vec()), "round {round} rank {r}: ids");
                let src: Vec<u8> = w.src.iter().flat_map(|p| (p.flat(s.t) as i32).to_le_bytes()).collect();
                assert_eq!(g.src, src, "round {round} rank {r}: sources");
                // Each source's first record through its address: its x row and its source.
                for src_rank in 0..s.w {
                    let Some(addr) = d.record(src_rank, 0) else { continue };
                    let i = d.row_of(src_rank, 0).unwrap();
                    let mut rec = vec![0u8; d.rec_bytes];
                    // SAFETY: the record lies in rank r's window, alive while `ep` is.
                    rt.copy_dtoh(&mut rec, &unsafe { DeviceSlice::from_raw(addr, d.rec_bytes, Device(0)) }).unwrap();
                    let row = s.h * 2;
                    assert_eq!(&rec[..row], &g.x[i * row..(i + 1) * row], "rank {r}: source {src_rank}'s first record at its address");
                    assert_eq!(&rec[d.offsets[4]..d.offsets[4] + 4], &g.src[i * 4..i * 4 + 4], "rank {r}: its source field");
                }
                // The experts' output: the received rows and weights, written row by row where
                // combine_input says.
                let buf = ep.combine_input(r).unwrap();
                let (row, kw) = (s.h * 2, s.k * 4);
                for i in 0..d.total() {
                    // SAFETY: row i < buf.rows of rank r's combine input, alive while `ep` is.
                    unsafe {
                        rt.copy_htod(
                            &DeviceSlice::from_raw(buf.x + (i * buf.x_stride) as u64, row, Device(0)),
                            &g.x[i * row..(i + 1) * row],
                        )
                        .unwrap();
                        rt.copy_htod(
                            &DeviceSlice::from_raw(buf.w + (i * buf.w_stride) as u64, kw, Device(0)),
                            &g.weights[i * kw..(i + 1) * kw],
                        )
                        .unwrap();
                    }
                }
                rows_given.push(d.total());
            }
            if round == 0 {
                // Rank 3 one row short: refused naming it, before anything runs; the ticket is
                // gone, so this round's combine is skipped and the next round dispatches again.
                let mut short = rows_given.clone();
                short[3] -= 1;
                let e = ep.combine_device(ticket, &short).unwrap_err().to_string();
                assert!(e.contains("rank 3") && e.contains("were received"), "{e}");
                continue;
            }
            let out = ep.combine_device(ticket, &rows_given).unwrap();
            let rx: Vec<Tensor2<bf16>> = want.ranks.iter().map(|r| r.x.clone()).collect();
            let rw: Vec<Tensor2<f32>> = want.ranks.iter().map(|r| r.weights.clone()).collect();
            let idx: Vec<Tensor2<i64>> = inp.iter().map(|i| i.indices.clone()).collect();
            let o = CombineOptions { weighting: Weighting::RankSlotSum, order: scheme.sum_order(), ..CombineOptions::default() };
            let reference = combine::<bf16, f32, i64>(&cfg, &want.handle, &rx, Some(&rw), &idx, o).unwrap();
            for (r, (d, w)) in out.iter().zip(&reference).enumerate() {
                let (gx, gw) = ep.read_combined(r).unwrap();
                assert_eq!(gx, bytes(w.x.as_slice(), |v: f32| v.to_le_bytes().to_vec()), "{scheme:?} rank {r}: combined rows");
                assert_eq!(gw, bytes(w.weights.as_ref().unwrap().as_slice(), |v: f32| v.to_le_bytes().to_vec()), "rank {r}: weight sums");
                assert_eq!(d.tokens, inp[r].x.rows());
                if d.tokens > 0 {
                    let mut first = vec![0u8; s.h * 4];
                    // SAFETY: the first output row of rank r, alive while `ep` is.
                    rt.copy_dtoh(&mut first, &unsafe { DeviceSlice::from_raw(d.x, s.h * 4, Device(0)) }).unwrap();
                    assert_eq!(first, gx[..s.h * 4], "rank {r}: the output at its address");
                }
            }
            println!("{scheme:?}: device calls, round {round}: check OK ({} rows received in all)", rows_given.iter().sum::<usize>());
        }
    }
}
