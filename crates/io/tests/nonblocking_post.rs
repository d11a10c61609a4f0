//! Posting never blocks on the network: one thread alternating posts to a peer whose address
//! black-holes connection attempts and to a healthy peer (tcp, loopback).

use mori_io::{BackendConfig, EngineConfig, EngineDesc, ErrorCode, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(2);

/// A loopback port that takes no more connections: a listener with a backlog of 0 that never
/// accepts, its one queue slot filled. Further SYNs are dropped, so a connect waits out its
/// deadline as toward a black-holed address.
fn black_hole() -> (socket2::Socket, TcpStream, u16) {
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    l.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
    l.listen(0).unwrap();
    let port = l.local_addr().unwrap().as_socket().unwrap().port();
    let filler = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // Check it really swallows connects.
    let probe = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(300));
    assert!(probe.is_err(), "the black hole accepted a connection");
    (l, filler, port)
}

fn engine(key: &str) -> IoEngine {
    let cfg = EngineConfig { control_timeout: DEADLINE, ..EngineConfig::new("127.0.0.1", 0).unwrap() };
    let e = IoEngine::new(key, cfg).unwrap();
    e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 2, connect_timeout: DEADLINE, ..TcpConfig::default() })).unwrap();
    e
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn posts_to_a_black_holed_peer_do_not_delay_a_healthy_one() {
    let (_hole, _filler, port) = black_hole();
    let (a, b) = (engine("A-nb"), engine("B-nb"));
    let mut src = vec![0x42u8; 1 << 16];
    let mut dst = vec![0u8; 1 << 16];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), dst.len(), MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    // A peer whose descriptor points at the black hole, with a region "registered" there.
    let mut ghost: EngineDesc = b.desc().clone();
    ghost.key = "ghost".into();
    ghost.port = port;
    ghost.epoch ^= 0x55;
    a.register_remote_engine(ghost.clone()).unwrap();
    let ghost_mem = MemoryDesc { engine_key: ghost.key.clone(), engine_epoch: ghost.epoch, ..md.clone() };

    // Healthy alone, connection made first.
    a.write(&ms, 0, &md, 0, 4096, 1).wait_for(DEADLINE).unwrap();
    let alone: Vec<Duration> = (0..20)
        .map(|i| {
            let t = Instant::now();
            a.write(&ms, 0, &md, 0, 4096, 10 + i).wait_for(DEADLINE).unwrap();
            t.elapsed()
        })
        .collect();

    // Alternating: every post to the ghost would block for the whole deadline if it connected
    // on this thread.
    let started = Instant::now();
    let mut ghost_posts = Vec::new();
    let mut healthy = Vec::new();
    let mut post_times = Vec::new();
    for i in 0..20u64 {
        let t = Instant::now();
        ghost_posts.push(a.write(&ms, 0, &ghost_mem, 0, 4096, 100 + i));
        post_times.push(t.elapsed());
        let t = Instant::now();
        a.write(&ms, 0, &md, 0, 4096, 200 + i).wait_for(DEADLINE).unwrap();
        healthy.push(t.elapsed());
    }
    let loop_time = started.elapsed();
    let (m_alone, m_mixed) = (median(alone), median(healthy.clone()));
    let worst_post = *post_times.iter().max().unwrap();
    let worst_healthy = *healthy.iter().max().unwrap();
    println!(
        "healthy 4 KiB write: median {m_alone:?} alone, {m_mixed:?} interleaved (worst {worst_healthy:?}); \
         worst post to the black-holed peer {worst_post:?}; loop {loop_time:?}"
    );
    assert!(loop_time < DEADLINE / 2, "20 alternating rounds took {loop_time:?}: a post waited on the connect");
    assert!(worst_post < Duration::from_millis(200), "a post to the black-holed peer took {worst_post:?}");
    assert!(worst_healthy < Duration::from_millis(500), "a healthy write took {worst_healthy:?}");

    // The ghost's statuses carry the connect deadline, and all end soon after it (queued posts
    // fail with the first connect, not one deadline each).
    for (i, st) in ghost_posts.iter().enumerate() {
        let e = st.wait_for(DEADLINE * 3).unwrap_err();
        assert_eq!(e.code, ErrorCode::Timeout, "post {i}: {e}");
        assert!(e.msg.contains(&format!("127.0.0.1:{port}")) && e.msg.contains("connect deadline of 2.000 s"), "post {i}: {e}");
    }
    let all_ended = started.elapsed();
    assert!(all_ended < DEADLINE * 2, "the black-holed posts ended after {all_ended:?}");
    assert!(dst[..4096].iter().all(|&x| x == 0x42) && dst[4096..].iter().all(|&x| x == 0));
    a.deregister_memory(&ms).unwrap();
    b.deregister_memory(&md).unwrap();
    drop(src);
}
