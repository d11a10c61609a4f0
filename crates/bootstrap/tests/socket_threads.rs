//! SocketBootstrap with ranks as threads of the test process (loopback): rendezvous
//! timing, duplicates, mismatches, deadlines.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::{cfg, check_collectives, free_master};
use mori_bootstrap::{Bootstrap, BootstrapError, SocketBootstrap, SocketBootstrapConfig};

const S10: Duration = Duration::from_secs(10);

type Joined = thread::JoinHandle<(Result<SocketBootstrap, BootstrapError>, Duration)>;

/// Starts `SocketBootstrap::new(c)` on a thread after `delay`; returns its result and how
/// long `new` took.
fn start(c: SocketBootstrapConfig, delay: Duration) -> Joined {
    thread::spawn(move || {
        thread::sleep(delay);
        let t = Instant::now();
        (SocketBootstrap::new(c), t.elapsed())
    })
}

fn join(h: Joined) -> (Result<SocketBootstrap, BootstrapError>, Duration) {
    h.join().expect("rank thread panicked")
}

#[test]
fn world_of_one_is_trivial() {
    let bs = SocketBootstrap::new(cfg(0, 1, free_master(), S10, S10)).unwrap();
    assert_eq!((bs.rank(), bs.world_size(), bs.timeout()), (0, 1, S10));
    assert_eq!(bs.allgather(b"solo").unwrap(), vec![b"solo".to_vec()]);
    assert_eq!(bs.all_to_all(vec![b"me".to_vec()]).unwrap(), vec![b"me".to_vec()]);
    assert_eq!(bs.broadcast(0, Some(b"x")).unwrap(), b"x".to_vec());
    bs.barrier().unwrap();
    check_collectives(&bs).unwrap();
}

#[test]
fn four_threads_collectives_and_bad_arguments() {
    let m = free_master();
    let hs: Vec<Joined> = (0..4).map(|r| start(cfg(r, 4, m, S10, S10), Duration::ZERO)).collect();
    let bss: Vec<SocketBootstrap> = hs.into_iter().map(|h| join(h).0.unwrap()).collect();
    assert_eq!(bss[0].local_addr(), m);
    assert!(bss[1].local_addr().ip().is_loopback());
    // Bad arguments are refused locally and do not poison the group.
    assert!(matches!(bss[2].all_to_all(vec![vec![]; 3]), Err(BootstrapError::InvalidArgument { .. })));
    assert!(matches!(bss[2].broadcast(4, None), Err(BootstrapError::InvalidArgument { .. })));
    assert!(matches!(bss[2].broadcast(2, None), Err(BootstrapError::InvalidArgument { .. })));
    thread::scope(|s| {
        for bs in &bss {
            s.spawn(move || check_collectives(bs).unwrap());
        }
    });
}

#[test]
fn late_rank_still_joins() {
    let m = free_master();
    let hs: Vec<Joined> =
        (0..3).map(|r| start(cfg(r, 3, m, S10, S10), if r == 2 { Duration::from_secs(3) } else { Duration::ZERO })).collect();
    let res: Vec<_> = hs.into_iter().map(join).collect();
    let root_wait = res[0].1;
    assert!(root_wait >= Duration::from_millis(2900), "root returned after {root_wait:?}");
    let bss: Vec<SocketBootstrap> = res.into_iter().map(|(r, _)| r.unwrap()).collect();
    thread::scope(|s| {
        for bs in &bss {
            s.spawn(move || {
                let all = bs.allgather(&[bs.rank() as u8; 2]).unwrap();
                assert_eq!(all, vec![vec![0, 0], vec![1, 1], vec![2, 2]]);
            });
        }
    });
}

#[test]
fn missing_rank_is_named_after_the_budget() {
    let m = free_master();
    let two = Duration::from_secs(2);
    let root = start(cfg(0, 3, m, two, two), Duration::ZERO);
    let one = start(cfg(1, 3, m, two, two), Duration::ZERO);
    let (r0, t0) = join(root);
    assert!(t0 >= Duration::from_millis(1800) && t0 <= Duration::from_secs(4), "root failed after {t0:?}");
    match r0 {
        Err(BootstrapError::RendezvousTimeout { missing, root, .. }) => {
            assert_eq!((missing, root), (vec![2], m))
        }
        other => panic!("root: {other:?}"),
    }
    // The root tells the ranks that did arrive, so they fail at once with the same culprit.
    let (r1, t1) = join(one);
    assert!(t1 <= Duration::from_secs(4), "rank 1 failed after {t1:?}");
    let e = r1.unwrap_err();
    assert!(matches!(&e, BootstrapError::RendezvousTimeout { missing, .. } if missing == &[2]), "{e:?}");
    assert!(e.to_string().contains("ranks [2] never arrived at root"), "{e}");
}

#[test]
fn unreachable_root_is_a_rendezvous_timeout() {
    let m = free_master();
    let t = Instant::now();
    let e = SocketBootstrap::new(cfg(1, 2, m, Duration::from_secs(1), S10)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(e.to_string().contains(&format!("root (rank 0) at {m} did not answer within 1.0 s")), "{e}");
}

#[test]
fn duplicate_rank_fails_both_claimants() {
    let m = free_master();
    let hs = [(0, 0), (1, 0), (1, 200)].map(|(r, d)| start(cfg(r, 3, m, S10, S10), Duration::from_millis(d)));
    for (i, h) in hs.into_iter().enumerate() {
        let (r, t) = join(h);
        assert!(t < Duration::from_secs(5), "claimant {i} took {t:?}");
        match r {
            Err(BootstrapError::DuplicateRank { rank, first, second }) => {
                assert_eq!(rank, 1);
                assert_ne!(first, second);
                assert!(first.ip().is_loopback() && second.ip().is_loopback());
            }
            other => panic!("thread {i}: {other:?}"),
        }
    }
}

#[test]
fn world_size_mismatch_tells_the_offender() {
    let m = free_master();
    let root = start(cfg(0, 3, m, S10, S10), Duration::ZERO);
    let good = start(cfg(1, 3, m, Duration::from_secs(3), S10), Duration::ZERO);
    let bad = start(cfg(2, 4, m, S10, S10), Duration::from_millis(300));
    let want = |r: Result<SocketBootstrap, BootstrapError>, who: &str| match r {
        Err(BootstrapError::WorldSizeMismatch { rank: 2, expected: 3, got: 4 }) => {}
        other => panic!("{who}: {other:?}"),
    };
    let (r0, t0) = join(root);
    assert!(t0 < Duration::from_secs(5));
    want(r0, "root");
    want(join(bad).0, "offender");
    // Rank 1 is told too if it had checked in (it almost always has after 300 ms).
    match join(good).0 {
        Err(BootstrapError::WorldSizeMismatch { .. } | BootstrapError::RendezvousTimeout { .. }) => {}
        other => panic!("rank 1: {other:?}"),
    }
}

#[test]
fn port_in_use_is_named() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let m = l.local_addr().unwrap();
    let e = SocketBootstrap::new(cfg(0, 2, m, S10, S10)).unwrap_err();
    assert!(matches!(e, BootstrapError::AddressInUse { addr } if addr == m), "{e:?}");
    assert!(e.to_string().starts_with(&format!("port {} on 127.0.0.1 is in use", m.port())), "{e}");
}

#[test]
fn stray_connections_do_not_break_rendezvous() {
    let m = free_master();
    let root = start(cfg(0, 2, m, S10, S10), Duration::ZERO);
    thread::sleep(Duration::from_millis(200));
    // A port scanner, a client speaking another protocol and one announcing a huge frame.
    let _idle = TcpStream::connect(m).unwrap();
    TcpStream::connect(m).unwrap().write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut huge = vec![0x4d, 0x42, 3, 0];
    huge.extend_from_slice(&0u64.to_le_bytes());
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    TcpStream::connect(m).unwrap().write_all(&huge).unwrap();
    let one = start(cfg(1, 2, m, S10, S10), Duration::from_millis(100));
    let a = join(root).0.unwrap();
    let b = join(one).0.unwrap();
    let h = thread::spawn(move || b.allgather(b"b").map(|v| (v, b)));
    assert_eq!(a.allgather(b"a").unwrap(), vec![b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(h.join().unwrap().unwrap().0, vec![b"a".to_vec(), b"b".to_vec()]);
}

#[test]
fn bad_interface_is_named() {
    let mut c = cfg(1, 2, "127.0.0.1:1".parse::<SocketAddr>().unwrap(), S10, S10);
    c.ifname = Some("nosuchif0".into());
    let e = SocketBootstrap::new(c).unwrap_err().to_string();
    assert!(e.contains("\"nosuchif0\""), "{e}");
}

#[test]
fn op_deadline_names_the_absent_rank_and_poisons() {
    let m = free_master();
    let one = Duration::from_secs(1);
    let hs: Vec<Joined> = (0..3).map(|r| start(cfg(r, 3, m, S10, one), Duration::ZERO)).collect();
    let mut bss: Vec<SocketBootstrap> = hs.into_iter().map(|h| join(h).0.unwrap()).collect();
    let late = bss.pop().unwrap();
    let t = Instant::now();
    let (e0, e1) = thread::scope(|s| {
        // Rank 1 enters later, so the root's deadline expires first and its verdict wins.
        let h = s.spawn(|| {
            thread::sleep(Duration::from_millis(300));
            bss[1].barrier().unwrap_err()
        });
        (bss[0].barrier().unwrap_err(), h.join().unwrap())
    });
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(3), "{took:?}");
    assert!(matches!(&e0, BootstrapError::Timeout { op: "barrier", waiting_for, .. } if waiting_for == &[2]), "{e0:?}");
    assert!(matches!(&e1, BootstrapError::Aborted { by: 0, reason, .. } if reason.contains("ranks [2]")), "{e1:?}");
    assert!(matches!(bss[0].barrier(), Err(BootstrapError::Poisoned { .. })));
    // The latecomer learns promptly that the group is gone.
    let t = Instant::now();
    let e2 = late.barrier().unwrap_err();
    assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    assert!(matches!(e2, BootstrapError::Aborted { by: 0, .. } | BootstrapError::PeerLost { rank: 0, .. }), "{e2:?}");
}

#[test]
fn dropped_rank_mid_collective_is_peer_lost() {
    let m = free_master();
    let hs: Vec<Joined> = (0..4).map(|r| start(cfg(r, 4, m, S10, S10), Duration::ZERO)).collect();
    let mut bss: Vec<SocketBootstrap> = hs.into_iter().map(|h| join(h).0.unwrap()).collect();
    let victim = bss.remove(2);
    let t = Instant::now();
    let errs = thread::scope(|s| {
        let hs: Vec<_> = bss.iter().map(|bs| s.spawn(move || bs.allgather(b"data").unwrap_err())).collect();
        thread::sleep(Duration::from_millis(300));
        drop(victim);
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    for e in errs {
        assert!(matches!(e, BootstrapError::PeerLost { rank: 2, during: "allgather", .. }), "{e:?}");
    }
}

#[test]
fn large_payloads_flow_both_ways_without_deadlock() {
    let m = free_master();
    let hs: Vec<Joined> = (0..3).map(|r| start(cfg(r, 3, m, S10, S10), Duration::ZERO)).collect();
    let bss: Vec<SocketBootstrap> = hs.into_iter().map(|h| join(h).0.unwrap()).collect();
    let big = |r: usize, len: usize| -> Vec<u8> { (0..len).map(|i| (i * 7 + r) as u8).collect() };
    thread::scope(|s| {
        for bs in &bss {
            s.spawn(move || {
                let me = bs.rank();
                let all = bs.allgather(&big(me, 6 << 20)).unwrap();
                assert!(all.iter().enumerate().all(|(r, v)| *v == big(r, 6 << 20)));
                let got = bs.all_to_all((0..3).map(|j| big(me * 3 + j, 3 << 20)).collect()).unwrap();
                assert!(got.iter().enumerate().all(|(src, v)| *v == big(src * 3 + me, 3 << 20)));
                let b = bs.broadcast(1, (me == 1).then(|| big(9, 5 << 20)).as_deref()).unwrap();
                assert_eq!(b, big(9, 5 << 20));
            });
        }
    });
}
