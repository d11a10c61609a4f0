//! LocalBootstrap: collectives with threads, oracle property tests, deadlines.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::check_collectives;
use mori_bootstrap::{Bootstrap, BootstrapError, LocalBootstrap};
use proptest::prelude::*;

fn on_threads<T: Send>(group: &[LocalBootstrap], f: impl Fn(&LocalBootstrap) -> T + Sync) -> Vec<T> {
    thread::scope(|s| {
        let hs: Vec<_> = group.iter().map(|bs| s.spawn(|| f(bs))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

#[test]
fn four_threads_run_every_collective() {
    let g = LocalBootstrap::new_group(4, Duration::from_secs(10));
    assert_eq!(g.iter().map(|b| (b.rank(), b.world_size())).collect::<Vec<_>>(), vec![(0, 4), (1, 4), (2, 4), (3, 4)]);
    for r in on_threads(&g, |bs| check_collectives(bs)) {
        r.unwrap();
    }
    // Several rounds in a row stay in step.
    let sums = on_threads(&g, |bs| (0..20u8).map(|i| bs.allgather(&[i, bs.rank() as u8]).unwrap().concat().len()).sum::<usize>());
    assert_eq!(sums, vec![20 * 8; 4]);
}

#[test]
fn group_of_one_and_zero() {
    assert!(LocalBootstrap::new_group(0, Duration::from_secs(1)).is_empty());
    let g = LocalBootstrap::new_group(1, Duration::from_secs(1));
    assert_eq!(g[0].allgather(b"a").unwrap(), vec![b"a".to_vec()]);
    assert_eq!(g[0].all_to_all(vec![b"b".to_vec()]).unwrap(), vec![b"b".to_vec()]);
    assert_eq!(g[0].broadcast(0, Some(b"c")).unwrap(), b"c".to_vec());
    g[0].barrier().unwrap();
}

#[test]
fn dropped_rank_is_peer_lost_promptly() {
    let mut g = LocalBootstrap::new_group(3, Duration::from_secs(10));
    let victim = g.pop().unwrap();
    let t = Instant::now();
    let errs = thread::scope(|s| {
        let hs: Vec<_> = g.iter().map(|bs| s.spawn(move || bs.allgather(b"x").unwrap_err())).collect();
        thread::sleep(Duration::from_millis(200));
        drop(victim);
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    for e in errs {
        assert!(matches!(e, BootstrapError::PeerLost { rank: 2, during: "allgather", .. }), "{e:?}");
    }
    assert!(matches!(g[0].barrier(), Err(BootstrapError::Poisoned { .. })));
}

#[test]
fn absent_rank_times_out_and_is_named() {
    let g = LocalBootstrap::new_group(3, Duration::from_millis(500));
    let t = Instant::now();
    let errs = on_threads(&g[..2], |bs| bs.barrier().unwrap_err());
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(450) && took < Duration::from_secs(3), "{took:?}");
    for e in errs {
        // Whoever times out first aborts the other, which then names the same culprit.
        let ok = match &e {
            BootstrapError::Timeout { op: "barrier", waiting_for, .. } => waiting_for == &[2],
            BootstrapError::Aborted { reason, .. } => reason.contains("[2]"),
            _ => false,
        };
        assert!(ok, "{e:?}");
    }
    // The absent rank's barrier may still complete (both others had entered it), but its
    // next collective finds the group aborted instead of hanging.
    let t = Instant::now();
    let late = g[2].barrier().and_then(|()| g[2].allgather(b"late").map(drop));
    assert!(matches!(late, Err(BootstrapError::Aborted { .. })), "{late:?}");
    assert!(t.elapsed() < Duration::from_millis(200));
}

#[test]
fn bad_arguments_do_not_poison() {
    let g = LocalBootstrap::new_group(2, Duration::from_secs(5));
    assert!(matches!(g[0].all_to_all(vec![]), Err(BootstrapError::InvalidArgument { op: "all_to_all", .. })));
    assert!(matches!(g[0].broadcast(2, Some(b"x")), Err(BootstrapError::InvalidArgument { op: "broadcast", .. })));
    let r = on_threads(&g, |bs| bs.broadcast(1, (bs.rank() == 1).then_some(b"ok".as_slice())).unwrap());
    assert_eq!(r, vec![b"ok".to_vec(), b"ok".to_vec()]);
}

fn payloads(n: usize) -> impl Strategy<Value = Vec<Vec<Vec<u8>>>> {
    // payloads[i][j]: what rank i contributes (j = 0 for allgather) or sends to j.
    prop::collection::vec(prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), n), n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn collectives_match_the_oracle(n in 1usize..6, seed in payloads(5)) {
        let data: Vec<Vec<Vec<u8>>> = seed.into_iter().take(n).map(|row| row.into_iter().take(n).collect()).collect();
        let g = LocalBootstrap::new_group(n, Duration::from_secs(10));
        let gathered = on_threads(&g, |bs| bs.allgather(&data[bs.rank()][0]).unwrap());
        let want: Vec<Vec<u8>> = data.iter().map(|row| row[0].clone()).collect();
        for got in gathered {
            prop_assert_eq!(got, want.clone());
        }
        let swapped = on_threads(&g, |bs| bs.all_to_all(data[bs.rank()].clone()).unwrap());
        for (me, got) in swapped.into_iter().enumerate() {
            let want: Vec<Vec<u8>> = (0..n).map(|src| data[src][me].clone()).collect();
            prop_assert_eq!(got, want);
        }
    }
}
