//! The host executor (`mori_ep::host`) with processes as threads of the test (each with its own
//! bootstrap member, windows in /dev/shm, MORI-IO tcp engines on loopback): every rank's
//! dispatch and combine equal the host reference bit for bit, over several rounds; proxy delays
//! and reordering change nothing; a configuration mismatch, a vanished rank and a rank whose
//! connections closed are reported naming the values and the rank.

mod common;

use common::{bits, config, expert_out, fractional, inputs, Mode};
use mori_bootstrap::{SocketBootstrap, SocketBootstrapConfig};
use mori_ep::host::{HostEp, HostOptions, InterTransport, ProxyInjection};
use mori_ep::internode::Scheme;
use mori_ep::routing::SplitMix64;
use mori_ep::*;
use std::net::TcpListener;
use std::ops::Range;
use std::time::{Duration, Instant};

type Inputs = Vec<RankInput<bf16, i64>>;
type Outcome = EpResult<Vec<(Vec<RankRecv<bf16, i64>>, Vec<Combined<f32>>)>>;

fn master() -> std::net::SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn boot(p: usize, procs: usize, m: std::net::SocketAddr) -> SocketBootstrap {
    SocketBootstrap::new(SocketBootstrapConfig::new(p, procs, m).with_timeouts(Duration::from_secs(20), Duration::from_secs(20))).unwrap()
}

fn case(geo: (usize, usize), k: usize, scales: bool, mode: Mode, seed: u64, max_tokens: usize) -> (EpConfig, Inputs) {
    let mut cfg = config(geo.0, geo.1, 2, k, 16, max_tokens);
    cfg.max_token_type_size = 2;
    if scales {
        cfg.scale_dim = 2;
    }
    let mut rng = SplitMix64::new(seed);
    let tokens: Vec<usize> = (0..geo.0).map(|r| if r == 1 { 0 } else { 1 + rng.below(max_tokens as u64) as usize }).collect();
    let mut inp = inputs(&cfg, &tokens, mode, &mut rng);
    for i in &mut inp {
        i.x = fractional(i.x.rows(), 16, &mut rng);
        if scales {
            i.scales = Some(Tensor2::from_fn(i.x.rows(), 2, |_, _| rng.below(100) as f32 * 0.37).unwrap());
        }
    }
    (cfg, inp)
}

/// Runs `rounds` rounds of dispatch + combine (expert_out as the experts, weighted) with
/// `procs` thread-processes hosting equal consecutive rank ranges.
fn run_job(cfg: &EpConfig, scheme: Scheme, procs: usize, inp: &Inputs, opts: HostOptions, rounds: usize) -> Vec<Outcome> {
    let m = master();
    let per = cfg.world_size / procs;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..procs)
            .map(|p| {
                let (cfg, opts) = (cfg.clone(), opts.clone());
                s.spawn(move || -> Outcome {
                    let b = boot(p, procs, m);
                    let local: Range<usize> = p * per..(p + 1) * per;
                    let mut ep = HostEp::new(&cfg, scheme, local.clone(), &b, opts)?;
                    let mut res = Vec::new();
                    for _ in 0..rounds {
                        let recv = ep.dispatch(&inp[local.clone()])?;
                        let xs: Vec<_> = recv.iter().zip(local.clone()).map(|(rr, r)| expert_out(r, &rr.x)).collect();
                        let ws: Vec<_> = recv.iter().map(|rr| rr.weights.clone()).collect();
                        let out = ep.combine::<bf16, f32>(&xs, Some(&ws), Weighting::RankSlotSum)?;
                        let st = ep.last_stats();
                        for (s, rr) in st.iter().zip(&recv) {
                            assert_eq!(s.recv_tokens, rr.num_recv() as u64);
                        }
                        res.push((recv, out));
                    }
                    Ok(res)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn check_equal(cfg: &EpConfig, scheme: Scheme, procs: usize, inp: &Inputs, outcomes: Vec<Outcome>) {
    let d = dispatch(cfg, inp, DispatchOptions::default()).unwrap();
    let xs: Vec<_> = d.ranks.iter().enumerate().map(|(r, rr)| expert_out(r, &rr.x)).collect();
    let ws: Vec<_> = d.ranks.iter().map(|r| r.weights.clone()).collect();
    let idx: Vec<_> = inp.iter().map(|i| i.indices.clone()).collect();
    let opts = CombineOptions { weighting: Weighting::RankSlotSum, order: scheme.sum_order(), ..Default::default() };
    let want = combine::<bf16, f32, i64>(cfg, &d.handle, &xs, Some(&ws), &idx, opts).unwrap();
    let per = cfg.world_size / procs;
    for (p, o) in outcomes.into_iter().enumerate() {
        let rounds = o.unwrap_or_else(|e| panic!("process {p}: {e}"));
        for (round, (recv, out)) in rounds.into_iter().enumerate() {
            for (li, (rr, c)) in recv.iter().zip(&out).enumerate() {
                let r = p * per + li;
                let ctx = format!("{scheme:?} round {round} rank {r}");
                let w = &d.ranks[r];
                assert_eq!(rr.src, w.src, "{ctx}: sources");
                assert_eq!(rr.x, w.x, "{ctx}: x");
                assert_eq!(rr.weights, w.weights, "{ctx}: weights");
                assert_eq!(rr.scales, w.scales, "{ctx}: scales");
                assert_eq!(rr.indices, w.indices, "{ctx}: indices");
                assert_eq!(bits(&c.x), bits(&want[r].x), "{ctx}: combine x");
                assert_eq!(bits(c.weights.as_ref().unwrap()), bits(want[r].weights.as_ref().unwrap()), "{ctx}: combine weights");
            }
        }
    }
}

fn tcp(lanes: usize) -> HostOptions {
    HostOptions { transport: InterTransport::Tcp { lanes }, deadline: Duration::from_secs(20), chunk_tokens: 2, ..HostOptions::default() }
}

#[test]
fn two_nodes_two_processes_all_schemes_equal_the_reference() {
    for (i, scheme) in [Scheme::V1, Scheme::V1LL, Scheme::AsyncLL].into_iter().enumerate() {
        let (cfg, inp) = case((4, 2), 3, i == 1, Mode::DeepEp, 11 + i as u64, 5);
        let out = run_job(&cfg, scheme, 2, &inp, tcp(2), 3);
        check_equal(&cfg, scheme, 2, &inp, out);
    }
}

#[test]
fn four_nodes_one_rank_per_process_and_masked_routing() {
    let (cfg, inp) = case((8, 2), 4, false, Mode::DeepEpMasked, 5, 6);
    let out = run_job(&cfg, Scheme::V1, 8, &inp, tcp(3), 2);
    check_equal(&cfg, Scheme::V1, 8, &inp, out);
    let (cfg, inp) = case((4, 2), 2, false, Mode::AllNone, 6, 3);
    let out = run_job(&cfg, Scheme::AsyncLL, 4, &inp, tcp(1), 2);
    check_equal(&cfg, Scheme::AsyncLL, 4, &inp, out);
}

#[test]
fn proxy_delays_and_reordering_give_the_same_results() {
    for scheme in [Scheme::V1, Scheme::AsyncLL] {
        let (cfg, inp) = case((4, 2), 3, true, Mode::DeepEp, 21, 6);
        let mut o = tcp(4);
        o.chunk_tokens = 1;
        o.inject = Some(ProxyInjection { seed: 7, max_delay: Duration::from_micros(800), reorder: true });
        let out = run_job(&cfg, scheme, 2, &inp, o, 2);
        check_equal(&cfg, scheme, 2, &inp, out);
    }
}

#[test]
fn one_node_needs_no_engine() {
    let (cfg, inp) = case((4, 4), 3, false, Mode::DeepEp, 3, 4);
    let out = run_job(&cfg, Scheme::V1, 2, &inp, tcp(1), 2);
    check_equal(&cfg, Scheme::V1, 2, &inp, out);
}

#[test]
fn mismatched_max_tokens_is_refused_naming_both_values() {
    let m = master();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|p| {
                s.spawn(move || {
                    let cfg = config(4, 2, 2, 2, 16, if p == 0 { 4 } else { 6 });
                    let b = boot(p, 2, m);
                    match HostEp::new(&cfg, Scheme::V1, p * 2..p * 2 + 2, &b, tcp(1)) {
                        Ok(_) => "no error".to_string(),
                        Err(e) => e.to_string(),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(errs[0].contains("rank 0 has max_tokens_per_rank = 4 but rank 2 has max_tokens_per_rank = 6"), "{}", errs[0]);
    assert!(errs[1].contains("rank 2 has max_tokens_per_rank = 6 but rank 0 has max_tokens_per_rank = 4"), "{}", errs[1]);
}

/// Process 1 (ranks 2, 3) sets up and then vanishes before dispatch: the other ranks' dispatch
/// fails within its deadline naming rank 2 or 3.
#[test]
fn a_vanished_rank_is_named_within_the_deadline() {
    let (cfg, inp) = case((4, 2), 3, false, Mode::DeepEp, 9, 4);
    let m = master();
    let deadline = Duration::from_secs(2);
    let (err, took) = std::thread::scope(|s| {
        let gone = s.spawn(|| {
            let b = boot(1, 2, m);
            let ep = HostEp::new(&cfg, Scheme::V1, 2..4, &b, HostOptions { deadline, ..tcp(1) }).unwrap();
            drop(ep);
        });
        let b = boot(0, 2, m);
        let mut ep = HostEp::new(&cfg, Scheme::V1, 0..2, &b, HostOptions { deadline, ..tcp(1) }).unwrap();
        gone.join().unwrap();
        let t = Instant::now();
        let e = ep.dispatch(&inp[0..2]).unwrap_err();
        (e.to_string(), t.elapsed())
    });
    assert!(took < deadline + Duration::from_secs(3), "took {took:?}");
    assert!(err.contains("rank 2") || err.contains("rank 3"), "{err}");
    assert!(err.contains("dispatch not complete after 2000 ms") || err.contains("inter-node write to rank"), "{err}");
}

/// Process 1 (ranks 2, 3) runs a round, then closes its engines while process 0 waits in the
/// next dispatch with its own writes landed: process 0 names the writer whose connections
/// closed at once, not at its deadline (20 s), and not as a timeout.
#[test]
fn a_writer_that_closes_its_connections_is_named_long_before_the_deadline() {
    let (cfg, inp) = case((4, 2), 3, false, Mode::DeepEp, 11, 4);
    let m = master();
    let opts = HostOptions { deadline: Duration::from_secs(20), ..tcp(1) };
    let round = |ep: &mut HostEp, local: Range<usize>| {
        let recv = ep.dispatch(&inp[local.clone()]).unwrap();
        let xs: Vec<_> = recv.iter().zip(local).map(|(rr, r)| expert_out(r, &rr.x)).collect();
        ep.combine::<bf16, f32>(&xs, None, Weighting::Unweighted).unwrap();
    };
    let (err, took) = std::thread::scope(|s| {
        let gone = s.spawn(|| {
            let b = boot(1, 2, m);
            let mut ep = HostEp::new(&cfg, Scheme::V1, 2..4, &b, opts.clone()).unwrap();
            round(&mut ep, 2..4);
            // Process 0's next dispatch lands its writes here meanwhile; this one never writes.
            std::thread::sleep(Duration::from_millis(1500));
            drop(ep);
        });
        let b = boot(0, 2, m);
        let mut ep = HostEp::new(&cfg, Scheme::V1, 0..2, &b, opts.clone()).unwrap();
        round(&mut ep, 0..2);
        let t = Instant::now();
        let e = ep.dispatch(&inp[0..2]).unwrap_err();
        let took = t.elapsed();
        gone.join().unwrap();
        (e.to_string(), took)
    });
    // Ranks 0 and 1 wait for ranks 2 and 3 (their V1 peers): whichever engine's close is seen
    // first is named.
    let named = [2, 3]
        .into_iter()
        .find(|q| err.contains(&format!(": dispatch: rank {q} closed its connections while its writes were still missing")));
    let q = named.unwrap_or_else(|| panic!("names neither rank 2 nor 3 as closed: {err}"));
    assert!(err.contains(&format!("(written by rank {q})")), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
}

/// Bad input on a process's second rank is refused before its first rank sends anything, in
/// dispatch and in combine: the process then runs the round with good inputs and every rank's
/// results equal the reference (the other process never saw the refused calls).
#[test]
fn bad_input_on_a_later_local_rank_is_refused_and_loses_nothing() {
    let (cfg, inp) = case((4, 2), 3, false, Mode::DeepEp, 21, 4);
    let m = master();
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|p| {
                let (cfg, inp) = (&cfg, &inp);
                s.spawn(move || -> Outcome {
                    let b = boot(p, 2, m);
                    let local = p * 2..p * 2 + 2;
                    let mut ep = HostEp::new(cfg, Scheme::V1, local.clone(), &b, tcp(1))?;
                    if p == 0 {
                        let mut bad = inp[local.clone()].to_vec();
                        bad[1].x = Tensor2::from_fn(bad[1].x.rows(), cfg.hidden + 8, |_, _| bf16::from_f32(1.0)).unwrap();
                        let e = ep.dispatch(&bad).unwrap_err().to_string();
                        assert!(e.contains("rank 1") && e.contains(&(cfg.hidden + 8).to_string()), "{e}");
                    }
                    let recv = ep.dispatch(&inp[local.clone()])?;
                    let xs: Vec<_> = recv.iter().zip(local.clone()).map(|(rr, r)| expert_out(r, &rr.x)).collect();
                    let ws: Vec<_> = recv.iter().map(|rr| rr.weights.clone()).collect();
                    if p == 0 {
                        let mut bad_w = ws.clone();
                        bad_w[1] = Tensor2::from_fn(ws[1].rows(), cfg.top_k + 1, |_, _| 0.5f32).unwrap();
                        let e = ep.combine::<bf16, f32>(&xs, Some(&bad_w), Weighting::RankSlotSum).unwrap_err().to_string();
                        assert!(e.contains("rank 1") && e.contains("combine weights"), "{e}");
                    }
                    let out = ep.combine::<bf16, f32>(&xs, Some(&ws), Weighting::RankSlotSum)?;
                    Ok(vec![(recv, out)])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    check_equal(&cfg, Scheme::V1, 2, &inp, outcomes);
}

#[test]
fn wrong_input_count_and_combine_without_dispatch_are_refused() {
    let (cfg, inp) = case((2, 2), 2, false, Mode::DeepEp, 1, 3);
    let m = master();
    let b = boot(0, 1, m);
    let mut ep = HostEp::new(&cfg, Scheme::V1, 0..2, &b, tcp(1)).unwrap();
    let e = ep.dispatch(&inp[0..1]).unwrap_err().to_string();
    assert!(e.contains("host dispatch inputs: expected one entry per rank (2), got 1"), "{e}");
    let xs = vec![Tensor2::<bf16>::filled(0, 16, bf16::ZERO).unwrap(); 2];
    let e = ep.combine::<bf16, f32>(&xs, None, Weighting::Unweighted).unwrap_err().to_string();
    assert!(e.contains("no dispatch preceded it"), "{e}");
    let mut big = inp[0].clone();
    big.indices = Tensor2::filled(4, 2, 0).unwrap();
    big.x = Tensor2::filled(4, 16, bf16::ZERO).unwrap();
    big.weights = Tensor2::filled(4, 2, 0.0).unwrap();
    let e = ep.dispatch(&[big, inp[1].clone()]).unwrap_err().to_string();
    assert!(e.contains("rank 0 holds 4 tokens, more than max_tokens_per_rank = 3"), "{e}");
}
