//! The inter-node protocol's sans-IO core against the host reference: every rank's dispatch
//! output and combine output equal the reference bit for bit, for V1, V1-LL and AsyncLL,
//! while a simulated network applies puts in a random order (each put's signal only after its
//! bytes, nothing else ordered).

mod common;

use common::{bits, config, expert_out, fractional, inputs, Mode};
use mori_ep::internode::{CombineRank, CombineState, DispatchRank, Outbox, Proto, Scheme, Seg, SignalOp, Window};
use mori_ep::routing::SplitMix64;
use mori_ep::*;
use proptest::prelude::*;

struct Win<'a>(&'a [u8]);

impl Window for Win<'_> {
    fn load(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.0[off..off + 8].try_into().unwrap())
    }
    fn read(&self, off: usize, out: &mut [u8]) {
        out.copy_from_slice(&self.0[off..off + out.len()]);
    }
}

/// A put split into its data step and its signal step (enabled once the data step ran).
struct Step {
    dst: usize,
    offset: usize,
    bytes: Vec<u8>,
    counter: usize,
    signal: SignalOp,
    data_done: bool,
}

struct Net {
    wins: Vec<Vec<u8>>,
    steps: Vec<Step>,
    rng: SplitMix64,
}

impl Net {
    fn submit(&mut self, out: Outbox) {
        for p in out.puts {
            let bytes = out.bytes[p.src.clone()].to_vec();
            self.steps.push(Step { dst: p.dst, offset: p.offset, bytes, counter: p.counter, signal: p.signal, data_done: false });
        }
    }

    /// Runs up to `n` random steps.
    fn run(&mut self, n: usize) {
        for _ in 0..n {
            if self.steps.is_empty() {
                return;
            }
            let i = self.rng.below(self.steps.len() as u64) as usize;
            let s = &mut self.steps[i];
            let w = &mut self.wins[s.dst];
            if !s.data_done {
                w[s.offset..s.offset + s.bytes.len()].copy_from_slice(&s.bytes);
                s.data_done = true;
            } else {
                let c = u64::from_le_bytes(w[s.counter..s.counter + 8].try_into().unwrap());
                let v = match s.signal {
                    SignalOp::Add(a) => c + a,
                    SignalOp::Set(v) => v,
                };
                w[s.counter..s.counter + 8].copy_from_slice(&v.to_le_bytes());
                self.steps.swap_remove(i);
            }
        }
    }

    /// Runs random steps, polling every rank with `poll(rank, window)` (its outbox and whether
    /// it is complete) between them, until every rank is complete and no step is left.
    fn drive(&mut self, ranks: usize, what: &str, mut poll: impl FnMut(usize, &Win) -> (Outbox, bool)) {
        for _round in 0..100_000 {
            let step = 1 + self.rng.below(7) as usize;
            self.run(step);
            let mut all = true;
            for r in 0..ranks {
                let (out, done) = poll(r, &Win(&self.wins[r]));
                self.submit(out);
                all &= done;
            }
            if all && self.steps.is_empty() {
                return;
            }
        }
        panic!("{what} did not finish");
    }

    fn zero(&mut self, r: usize, range: std::ops::Range<usize>) {
        self.wins[r][range].fill(0);
    }
}

type Case = (EpConfig, Vec<RankInput<bf16, i64>>);

fn case(geo: (usize, usize), k: usize, scales: bool, mode: Mode, seed: u64) -> Case {
    let mut cfg = config(geo.0, geo.1, 2, k, 16, 5);
    cfg.max_token_type_size = 2;
    if scales {
        cfg.scale_dim = 2;
    }
    let mut rng = SplitMix64::new(seed);
    let tokens: Vec<usize> = (0..geo.0).map(|_| rng.below(6) as usize).collect();
    let mut inp = inputs(&cfg, &tokens, mode, &mut rng);
    // Fractional values: f32 sums depend on their order, so the order is checked too.
    for i in &mut inp {
        i.x = fractional(i.x.rows(), 16, &mut rng);
    }
    if scales {
        for i in &mut inp {
            i.scales = Some(Tensor2::from_fn(i.x.rows(), 2, |_, _| rng.below(100) as f32 * 0.37).unwrap());
        }
    }
    (cfg, inp)
}

/// Runs dispatch of every rank through a simulated network; returns the network (windows
/// with the dispatch counters zeroed), what each rank received and its combine state.
fn dispatch_all(proto: &Proto, inp: &[RankInput<bf16, i64>], seed: u64) -> (Net, Vec<RankRecv<bf16, i64>>, Vec<CombineState>) {
    let size = proto.layout().size();
    let mut net = Net { wins: vec![vec![0u8; size]; inp.len()], steps: Vec::new(), rng: SplitMix64::new(seed) };
    let mut ranks = Vec::new();
    for (r, i) in inp.iter().enumerate() {
        let (st, out) = DispatchRank::start(proto, r, i).unwrap();
        net.submit(out);
        ranks.push(st);
    }
    net.drive(inp.len(), "dispatch", |r, w| (ranks[r].poll(proto, w).unwrap(), ranks[r].is_complete(proto, w).unwrap()));
    let mut recvs = Vec::new();
    let mut states = Vec::new();
    for (r, st) in ranks.into_iter().enumerate() {
        let (recv, cs) = st.finish::<bf16, i64>(proto, &Win(&net.wins[r])).unwrap();
        net.zero(r, proto.layout().dispatch_counters());
        recvs.push(recv);
        states.push(cs);
    }
    (net, recvs, states)
}

/// Runs dispatch then combine of every rank through the simulated network.
fn run_protocol(
    cfg: &EpConfig,
    scheme: Scheme,
    chunk: usize,
    inp: &[RankInput<bf16, i64>],
    seed: u64,
    weighted: bool,
) -> (Vec<RankRecv<bf16, i64>>, Vec<Combined<f32>>) {
    let proto = Proto::new(cfg, scheme, chunk, OutOfRange::Error).unwrap();
    let (mut net, recvs, states) = dispatch_all(&proto, inp, seed);
    let opts = CombineOptions { weighting: if weighted { Weighting::RankSlotSum } else { Weighting::Unweighted }, ..Default::default() };
    let mut cranks = Vec::new();
    for (r, (st, rv)) in states.into_iter().zip(&recvs).enumerate() {
        let (c, out) = CombineRank::start(&proto, st, &expert_out(r, &rv.x), weighted.then_some(&rv.weights), opts).unwrap();
        net.submit(out);
        cranks.push(c);
    }
    net.drive(inp.len(), "combine", |r, w| (cranks[r].poll::<bf16>(&proto, w).unwrap(), cranks[r].is_complete(&proto, w).unwrap()));
    let outs = cranks.into_iter().enumerate().map(|(r, c)| c.finish::<bf16, f32>(&proto, &Win(&net.wins[r])).unwrap()).collect();
    (recvs, outs)
}

fn reference(cfg: &EpConfig, scheme: Scheme, inp: &[RankInput<bf16, i64>], weighted: bool) -> (Dispatched<bf16, i64>, Vec<Combined<f32>>) {
    let d = dispatch(cfg, inp, DispatchOptions::default()).unwrap();
    let xs: Vec<_> = d.ranks.iter().enumerate().map(|(r, rr)| expert_out(r, &rr.x)).collect();
    let ws: Vec<_> = d.ranks.iter().map(|r| r.weights.clone()).collect();
    let idx: Vec<_> = inp.iter().map(|i| i.indices.clone()).collect();
    let opts = CombineOptions {
        weighting: if weighted { Weighting::RankSlotSum } else { Weighting::Unweighted },
        order: scheme.sum_order(),
        ..Default::default()
    };
    let c = combine::<bf16, f32, i64>(cfg, &d.handle, &xs, weighted.then_some(&ws[..]), &idx, opts).unwrap();
    (d, c)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn protocol_equals_reference(
        geo in prop_oneof![Just((4usize, 2usize)), Just((8, 4)), Just((8, 2)), Just((4, 1)), Just((4, 4)), Just((6, 2))],
        scheme in prop_oneof![Just(Scheme::V1), Just(Scheme::V1LL), Just(Scheme::AsyncLL)],
        k in 1usize..9, chunk in 1usize..4, scales in any::<bool>(), weighted in any::<bool>(),
        mode in prop_oneof![Just(Mode::DeepEp), Just(Mode::DeepEpMasked), Just(Mode::AllNone)],
        seed in any::<u64>(),
    ) {
        let (cfg, inp) = case(geo, k, scales, mode, seed);
        let (recv, comb) = run_protocol(&cfg, scheme, chunk, &inp, seed ^ 0x5eed, weighted);
        let (d, want) = reference(&cfg, scheme, &inp, weighted);
        for r in 0..geo.0 {
            prop_assert_eq!(&recv[r], &d.ranks[r], "dispatch rank {}", r);
            prop_assert_eq!(bits(&comb[r].x), bits(&want[r].x), "combine rank {}", r);
            prop_assert_eq!(comb[r].weights.as_ref().map(bits), want[r].weights.as_ref().map(bits), "combine weights rank {}", r);
        }
    }
}

/// A writer announcing more entries than a segment holds is refused, naming both counts,
/// before anything is read.
#[test]
fn overflowing_end_marker_is_refused() {
    let (cfg, inp) = case((4, 2), 2, false, Mode::DeepEp, 7);
    let proto = Proto::new(&cfg, Scheme::V1, 2, OutOfRange::Error).unwrap();
    let mut win = vec![0u8; proto.layout().size()];
    let (st, _) = DispatchRank::start(&proto, 0, &inp[0]).unwrap();
    let seg = Seg::In(1);
    let cap = cfg.max_tokens_per_rank as u64;
    win[proto.layout().total(seg)..][..8].copy_from_slice(&(cap + 2).to_le_bytes());
    win[proto.layout().arrived(seg)..][..8].copy_from_slice(&(cap + 1).to_le_bytes());
    let e = st.is_complete(&proto, &Win(&win)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("rank 0: dispatch segment of origin rank 1 written by rank 1 announces {} entries, its capacity is {cap}", cap + 1)
    );
}

/// A combine's `poll` or `finish` given another element type than its `start` is refused,
/// naming the rank, the step and both types (a partial or row of the wrong width would be
/// decoded or cut otherwise); the same type goes on.
#[test]
fn combine_steps_refuse_another_element_type_than_start() {
    let (cfg, inp) = case((4, 2), 2, false, Mode::DeepEp, 7);
    let proto = Proto::new(&cfg, Scheme::V1, 2, OutOfRange::Error).unwrap();
    let (net, recvs, mut states) = dispatch_all(&proto, &inp, 7);
    let st = states.swap_remove(1);
    let (mut c, _) = CombineRank::start(&proto, st, &expert_out(1, &recvs[1].x), None, CombineOptions::default()).unwrap();
    let win = Win(&net.wins[1]);
    let want = |step| EpError::CombineElementType { rank: 1, step, got: DType::F32, started: DType::Bf16 };
    assert_eq!(c.poll::<f32>(&proto, &win).unwrap_err(), want("poll"));
    assert!(c.poll::<bf16>(&proto, &win).is_ok());
    assert_eq!(c.finish::<f32, f32>(&proto, &win).unwrap_err(), want("finish"));
}

/// How a rank's combine ended in [`mixed_combine`].
#[derive(Debug)]
enum End {
    /// `poll` or `finish` returned this error.
    Refused(EpError),
    /// `finish` returned its output.
    Finished,
    /// Not complete once nothing moved.
    Waiting,
}

/// Dispatch, then combine with the ranks in `wide` combining in f32 and the others in bf16, run
/// until nothing moves; how each rank's combine ended.
fn mixed_combine(scheme: Scheme, wide: &[usize]) -> Vec<End> {
    let (mut cfg, inp) = case((4, 2), 2, false, Mode::DeepEp, 11);
    assert!(inp.iter().all(|i| i.x.rows() > 0), "every rank sends tokens");
    cfg.max_token_type_size = 4;
    let proto = Proto::new(&cfg, scheme, 2, OutOfRange::Error).unwrap();
    let (mut net, recvs, states) = dispatch_all(&proto, &inp, 11);
    let mut cranks = Vec::new();
    for (r, (st, rv)) in states.into_iter().zip(&recvs).enumerate() {
        let x = expert_out(r, &rv.x);
        let (c, out) = if wide.contains(&r) {
            CombineRank::start(&proto, st, &x.map(|v| v.to_f32()), None, CombineOptions::default())
        } else {
            CombineRank::start(&proto, st, &x, None, CombineOptions::default())
        }
        .unwrap();
        net.submit(out);
        cranks.push(c);
    }
    let mut errs: Vec<Option<EpError>> = vec![None; 4];
    for _round in 0..100_000 {
        let step = 1 + net.rng.below(7) as usize;
        net.run(step);
        let mut moved = false;
        for (r, c) in cranks.iter_mut().enumerate() {
            if errs[r].is_some() {
                continue;
            }
            let w = Win(&net.wins[r]);
            match if wide.contains(&r) { c.poll::<f32>(&proto, &w) } else { c.poll::<bf16>(&proto, &w) } {
                Ok(out) => {
                    moved |= !out.puts.is_empty();
                    net.submit(out);
                }
                Err(e) => errs[r] = Some(e),
            }
        }
        if !moved && net.steps.is_empty() {
            break;
        }
    }
    assert!(net.steps.is_empty(), "{scheme:?}: the network did not drain");
    let mut ends = Vec::new();
    for ((r, c), err) in cranks.into_iter().enumerate().zip(errs) {
        let w = Win(&net.wins[r]);
        ends.push(match err {
            Some(e) => End::Refused(e),
            None if !c.is_complete(&proto, &w).unwrap() => End::Waiting,
            None => {
                let done = if wide.contains(&r) {
                    c.finish::<f32, f32>(&proto, &w).map(|_| ())
                } else {
                    c.finish::<bf16, f32>(&proto, &w).map(|_| ())
                };
                done.map_or_else(End::Refused, |()| End::Finished)
            }
        });
    }
    ends
}

/// The element types of a `PeerElementType` error for rank `r` reading a row of the other type.
fn types(r: usize, wide: &[usize]) -> (DType, DType) {
    if wide.contains(&r) {
        (DType::F32, DType::Bf16)
    } else {
        (DType::Bf16, DType::F32)
    }
}

/// Ranks that combine in different element types (processes of one job, each with its own `X`)
/// are refused where one reads another node's row or partial, naming the segment, its writer
/// and both types. Node 0 (ranks 0, 1) combines in bf16, node 1 (ranks 2, 3) in f32: every rank
/// is refused in `finish` (AsyncLL: the rows of a rank on the other node; V1, V1-LL: the other
/// node's relay's partial). Without the check V1 reads the f32 partial at bf16's stride and
/// reports a garbage token id.
#[test]
fn ranks_combining_in_different_element_types_are_refused() {
    let wide = [2, 3];
    for scheme in [Scheme::V1, Scheme::V1LL, Scheme::AsyncLL] {
        for (r, e) in mixed_combine(scheme, &wide).into_iter().enumerate() {
            let other = 1 - r / 2;
            match e {
                End::Refused(EpError::PeerElementType { rank, segment, writer, theirs, mine }) => {
                    assert_eq!((rank, mine, theirs), (r, types(r, &wide).0, types(r, &wide).1), "{scheme:?}");
                    assert_eq!(writer / 2, other, "{scheme:?} rank {r}: writer {writer} on the other node");
                    let want = if scheme == Scheme::AsyncLL { Seg::CombineIn(writer) } else { Seg::Partial(other) };
                    assert_eq!(segment, want.to_string(), "{scheme:?} rank {r}");
                }
                e => panic!("{scheme:?} rank {r}: {e:?}"),
            }
        }
    }
}

/// The same inside a node (V1, V1-LL): rank 1 combines in f32, the others in bf16. The relays
/// of node 0 (ranks 0 and 1) refuse each other's rows in `poll` (their gather segments).
/// Without the check rank 0 finishes with rank 1's f32 rows read as bf16.
#[test]
fn relays_refuse_rows_of_another_element_type_from_their_own_node() {
    let wide = [1];
    for scheme in [Scheme::V1, Scheme::V1LL] {
        for (r, e) in mixed_combine(scheme, &wide).into_iter().enumerate() {
            match e {
                End::Refused(EpError::PeerElementType { rank, segment, writer, theirs, mine }) => {
                    assert_eq!((rank, mine, theirs), (r, types(r, &wide).0, types(r, &wide).1), "{scheme:?}");
                    if r < 2 {
                        assert_eq!(writer, 1 - r, "{scheme:?} rank {r}");
                        assert!(
                            segment.starts_with(&format!("combine gather segment (local rank {writer},")),
                            "{scheme:?} rank {r}: {segment}"
                        );
                    }
                }
                // Node 1's ranks read node 0's relays' partials: refused, waiting for one that
                // never came, or finished when both relays' partials were of bf16 rows only.
                End::Waiting | End::Finished if r >= 2 => {}
                e => panic!("{scheme:?} rank {r}: {e:?}"),
            }
        }
    }
}

/// Inputs over the per-rank token limit are refused at start, naming rank, count and limit.
#[test]
fn too_many_tokens_refused_at_start() {
    let (cfg, _) = case((4, 2), 2, false, Mode::DeepEp, 3);
    let proto = Proto::new(&cfg, Scheme::AsyncLL, 2, OutOfRange::Error).unwrap();
    let mut rng = SplitMix64::new(1);
    let big = inputs(&cfg, &[6], Mode::DeepEp, &mut rng).remove(0);
    let e = DispatchRank::start(&proto, 2, &big).unwrap_err();
    assert_eq!(e, EpError::TooManyTokens { rank: 2, tokens: 6, limit: 5 });
}
