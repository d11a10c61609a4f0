//! The conformance suite on the tcp backend, plus tcp-specific checks.

mod conformance;

use conformance::*;
use mori_io::{BackendConfig, BackendKind, EngineConfig, ErrorCode, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use std::time::Duration;

fn tcp(lanes: usize) -> impl Fn() -> BackendConfig {
    move || BackendConfig::Tcp(TcpConfig { lanes, min_lane_bytes: 4096, ..TcpConfig::default() })
}

#[test]
fn batch_write_then_read_tcp() {
    batch_write_then_read(&tcp(4), BackendKind::Tcp);
}

#[test]
fn paged_write_then_read_tcp() {
    paged_write_then_read(&tcp(4), BackendKind::Tcp);
}

#[test]
fn notifications_tcp() {
    notifications(&tcp(4), BackendKind::Tcp);
}

#[test]
fn multi_pair_tcp() {
    multi_pair(&tcp(2));
}

#[test]
fn many_small_descriptors_tcp() {
    many_small_descriptors(&tcp(2), 100_000);
}

#[test]
fn bad_arguments_tcp() {
    bad_arguments(&tcp(1), &["target engine refused", "exceeds region"]);
}

#[test]
fn deregistration_tcp() {
    deregistration(&tcp(2), ErrorCode::NotFound);
}

#[test]
fn unavailable_paths_say_so() {
    let eng = IoEngine::new("solo", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    // No GPU runtime on this host (or CI): xgmi and fabric say so, naming the libraries.
    if mori_gpu_absent() {
        let e = eng.create_backend(BackendConfig::Fabric(mori_io::FabricConfig::default())).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported, "{e}");
        assert!(e.msg.contains("fabric backend") && e.msg.contains("no GPU runtime") && e.msg.contains("libcuda"), "{e}");
        let e = eng.create_backend(BackendConfig::Xgmi(mori_io::XgmiConfig::default())).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported, "{e}");
        assert!(e.msg.contains("no GPU runtime") && e.msg.contains("libcuda"), "{e}");
    }
    // This host (and CI) has no RDMA device: the rdma backend says so instead of failing later.
    let no_rdma = std::fs::read_dir("/sys/class/infiniband").map(|d| d.count() == 0).unwrap_or(true);
    if no_rdma {
        let e = eng.create_backend(BackendConfig::Rdma(mori_io::RdmaConfig::default())).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported, "{e}");
        assert!(e.msg.contains("no RDMA") || e.msg.contains("no active RDMA port"), "{e}");
    }
    let mut x = [0u8; 8];
    let e = unsafe { eng.register_memory(x.as_mut_ptr(), 8, MemLoc::Gpu { device: 0 }) }.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotSupported);
    assert!(e.msg.contains("needs a GPU backend"), "{e}");
    for wild in ["0.0.0.0", "0", "::", "[::]", "::0", "0:0:0:0:0:0:0:0", "::ffff:0.0.0.0"] {
        let e = IoEngine::new("wild", EngineConfig::new(wild, 0).unwrap()).err().unwrap();
        assert!(e.msg.contains("wildcard"), "{wild}: {e}");
    }
    // A bracketed IPv6 literal is an address like any other; the descriptor carries it bare.
    let v6 = IoEngine::new("v6", EngineConfig::new("[::1]", 0).unwrap()).unwrap();
    assert_eq!(v6.desc().host, "::1");
    drop(v6);
    let port = eng.desc().port;
    let e = IoEngine::new("clash", EngineConfig::new("127.0.0.1", port).unwrap()).err().unwrap();
    assert!(e.msg.contains(&format!("port {port}")) && e.msg.contains("in use"), "{e}");
    eng.create_backend(BackendConfig::Tcp(TcpConfig::default())).unwrap();
    assert!(eng.create_backend(BackendConfig::Tcp(TcpConfig::default())).is_err());
    let other = IoEngine::new("other", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.register_remote_engine(other.desc().clone()).unwrap();
    let local = unsafe { eng.register_memory(x.as_mut_ptr(), 8, MemLoc::Host { numa: None }) }.unwrap();
    let gpu = MemoryDesc {
        engine_key: "other".into(),
        engine_epoch: other.desc().epoch,
        id: 1,
        addr: 0,
        len: 8,
        loc: MemLoc::Gpu { device: 0 },
        bus_id: None,
        handles: vec![],
    };
    let e = eng.write(&local, 0, &gpu, 0, 8, 1).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotSupported);
    assert!(e.msg.contains("tcp: remote memory 1 of engine \"other\" is GPU memory"), "{e}");
}

#[test]
fn auto_backends_fall_back_to_tcp_without_rdma() {
    let no_rdma = std::fs::read_dir("/sys/class/infiniband").map(|d| d.count() == 0).unwrap_or(true);
    let eng = IoEngine::new("auto", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    let made = eng.create_backends_auto(TcpConfig::default(), mori_io::RdmaConfig::default()).unwrap();
    if no_rdma {
        assert_eq!(made, vec![BackendKind::Tcp]);
    } else {
        assert_eq!(made.last(), Some(&BackendKind::Tcp));
    }
}

/// True when neither NVIDIA's nor AMD's driver device node exists (this host, CI).
fn mori_gpu_absent() -> bool {
    !std::path::Path::new("/dev/nvidiactl").exists() && !std::path::Path::new("/dev/kfd").exists()
}

#[test]
fn engines_on_ipv6_loopback_move_bytes() {
    // Peers dialled "HOST:PORT", which is not an address for an IPv6 host ("::1:4000").
    let mk = |key: &str| {
        let e = IoEngine::new(key, EngineConfig::new("[::1]", 0).unwrap()).unwrap();
        e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 2, ..TcpConfig::default() })).unwrap();
        e
    };
    let (a, b) = (mk("A6"), mk("B6"));
    let mut src: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; 4096];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), dst.len(), MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    a.write(&ms, 0, &md, 0, 4096, 1).wait_for(T).unwrap();
    b.deregister_memory(&md).unwrap();
    a.deregister_memory(&ms).unwrap();
    assert_eq!(src, dst);
}

#[test]
fn re_registering_a_key_with_a_new_engine_drops_the_old_connections() {
    // C talks to "B", then "B" is another engine (restarted): traffic must reach the new one.
    let mk = |key: &str| {
        let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 1, ..TcpConfig::default() })).unwrap();
        e
    };
    let (c, b1, b2) = (mk("C"), mk("B"), mk("B"));
    let mut src = vec![0x77u8; 64];
    let (mut d1, mut d2) = (vec![0u8; 64], vec![0u8; 64]);
    let ms = unsafe { c.register_memory(src.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    let m1 = unsafe { b1.register_memory(d1.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    let m2 = unsafe { b2.register_memory(d2.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    c.register_remote_engine(b1.desc().clone()).unwrap();
    c.write(&ms, 0, &m1, 0, 64, 1).wait_for(T).unwrap();
    assert!(d1.iter().all(|&x| x == 0x77));
    d1.fill(0);
    c.register_remote_engine(b2.desc().clone()).unwrap();
    c.write(&ms, 0, &m2, 0, 64, 2).wait_for(T).unwrap();
    assert!(d2.iter().all(|&x| x == 0x77), "the new engine got the data");
    assert!(d1.iter().all(|&x| x == 0), "the old engine got nothing");
    for (e, m) in [(&c, &ms), (&b1, &m1), (&b2, &m2)] {
        e.deregister_memory(m).unwrap();
    }
}

#[test]
fn a_dropped_target_engine_takes_no_more_writes() {
    // Dropping an engine must stop its tcp backend from taking new requests (so from writing
    // into memory the owner may free next), even while an initiator keeps sending over
    // already-open connections. A request already being served when the engine drops finishes.
    let mk = |key: &str| {
        let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 2, min_lane_bytes: 1024, ..TcpConfig::default() })).unwrap();
        e
    };
    let (c, b) = (mk("C-drop"), mk("B-drop"));
    let mut src = vec![0x5au8; 4096];
    let mut dst = vec![0u8; 4096];
    let ms = unsafe { c.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None }) }.unwrap();
    let mb = unsafe { b.register_memory(dst.as_mut_ptr(), dst.len(), MemLoc::Host { numa: None }) }.unwrap();
    c.register_remote_engine(b.desc().clone()).unwrap();
    c.write(&ms, 0, &mb, 0, 4096, 1).wait_for(T).unwrap();
    assert!(dst.iter().all(|&x| x == 0x5a), "the write before the drop landed");
    dst.fill(0);
    drop(b);
    let mut first_err = None;
    for i in 0..50u64 {
        let r = c.write(&ms, 0, &mb, 0, 4096, 100 + i).wait_for(T);
        let e = r.expect_err("a write to a dropped engine must fail");
        first_err.get_or_insert(e);
    }
    assert!(dst.iter().all(|&x| x == 0), "nothing was written after the drop");
    let e = first_err.unwrap();
    assert!(e.code == ErrorCode::RemoteDisconnect || e.code == ErrorCode::NotSupported || e.code == ErrorCode::Transport, "{e}");
    c.deregister_memory(&ms).unwrap();
}

#[test]
fn a_deregistration_that_times_out_can_be_waited_for() {
    // deregister_memory returned Timeout while a transfer still used the region, the region was
    // already gone, and a retry said NotFound: the caller could not learn when to free it.
    let mk = |key: &str, drain: Duration| {
        let cfg = EngineConfig { drain_timeout: drain, ..EngineConfig::new("127.0.0.1", 0).unwrap() };
        let e = IoEngine::new(key, cfg).unwrap();
        e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 1, ..TcpConfig::default() })).unwrap();
        e
    };
    let (a, b) = (mk("A-drain", Duration::from_millis(1)), mk("B-drain", Duration::from_secs(10)));
    let len = 256usize << 20;
    let mut src = vec![0x3cu8; len];
    let mut dst = vec![0u8; len];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    let st = a.write(&ms, 0, &md, 0, len as u64, 1);
    // 256 MiB over one loopback connection takes ~100 ms: the 1 ms drain times out.
    let e = a.deregister_memory(&ms).unwrap_err();
    assert_eq!(e.code, ErrorCode::Timeout, "{e}");
    assert!(e.msg.contains("draining") && e.msg.contains("deregister it again"), "{e}");
    // New operations on the draining region are refused; retries wait until the drain ends.
    let e = a.write(&ms, 0, &md, 0, 8, 2).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    let mut tries = 1;
    while let Err(e) = a.deregister_memory(&ms) {
        assert_eq!(e.code, ErrorCode::Timeout, "a retry waits again: {e}");
        tries += 1;
        assert!(tries < 100_000, "the drain never ended");
    }
    st.wait_for(T).unwrap();
    assert_eq!(a.deregister_memory(&ms).unwrap_err().code, ErrorCode::NotFound, "once drained it is gone");
    b.deregister_memory(&md).unwrap();
    assert!(dst.iter().all(|&x| x == 0x3c));
    drop(src);
}

#[test]
fn a_session_of_a_dropped_engine_fails() {
    // A Session kept writing after its own engine was dropped.
    let mk = |key: &str| {
        let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 1, ..TcpConfig::default() })).unwrap();
        e
    };
    let (a, b) = (mk("A-sess"), mk("B-sess"));
    let mut src = vec![0x11u8; 64];
    let mut dst = vec![0u8; 64];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    let sess = a.create_session(&ms, &md).unwrap();
    sess.write(0, 0, 64, 1).wait_for(T).unwrap();
    assert!(dst.iter().all(|&x| x == 0x11));
    dst.fill(0);
    drop(a); // without deregistering: the session alone must now refuse
    for (i, st) in [sess.write(0, 0, 64, 2), sess.batch_write(&[0], &[0], &[64], 3)].into_iter().enumerate() {
        let e = st.wait_for(T).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadState, "call {i}: {e}");
        assert!(e.msg.contains("the engine was dropped"), "{e}");
    }
    assert!(dst.iter().all(|&x| x == 0), "nothing was written after the drop");
    b.deregister_memory(&md).unwrap();
    drop(src);
}

#[test]
fn restarted_peer_refuses_stale_descriptors_tcp() {
    restarted_peer_refuses_stale_descriptors(&tcp(2));
}

#[test]
fn two_live_engines_under_one_key_never_mix_tcp() {
    two_live_engines_under_one_key_never_mix(&tcp(2));
}

#[test]
fn duplicate_in_flight_id_is_refused_tcp() {
    duplicate_in_flight_id_is_refused(&tcp(4));
}

/// Polls `f` every 5 ms until it holds or `within` passes; returns whether it held.
fn becomes(within: Duration, f: impl Fn() -> bool) -> bool {
    let end = std::time::Instant::now() + within;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

#[test]
fn a_peer_that_closes_its_engine_is_seen_closed_and_an_idle_close_here_is_not() {
    let mk = |key: &str, idle_ms: u64| {
        let mut cfg = EngineConfig::new("127.0.0.1", 0).unwrap();
        cfg.idle_timeout = Duration::from_millis(idle_ms);
        let e = IoEngine::new(key, cfg).unwrap();
        e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 3, min_lane_bytes: 1024, ..TcpConfig::default() })).unwrap();
        e
    };
    let mut src = vec![0x11u8; 8192];
    let mut dst = vec![0u8; 8192];
    let write = |a: &IoEngine, b: &IoEngine, mb: &MemoryDesc, id: u64, src: &mut [u8]| {
        let ms = unsafe { a.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None }) }.unwrap();
        a.register_remote_engine(b.desc().clone()).unwrap();
        a.write(&ms, 0, mb, 0, src.len() as u64, id).wait_for(T).unwrap();
    };
    // A target with the default idle timeout: the initiator closing its engine is seen.
    let b = mk("B-links", 300_000);
    let mb = unsafe { b.register_memory(dst.as_mut_ptr(), dst.len(), MemLoc::Host { numa: None }) }.unwrap();
    let a = mk("A-links", 300_000);
    write(&a, &b, &mb, 1, &mut src);
    assert!(!b.closed_by_peer("A-links"), "its connections are open");
    assert!(!b.closed_by_peer("never-connected"));
    drop(a);
    assert!(becomes(Duration::from_secs(5), || b.closed_by_peer("A-links")), "the dropped initiator's connections ended from its side");
    // The same key connecting again (a restarted engine) clears it.
    let a2 = mk("A-links", 300_000);
    write(&a2, &b, &mb, 2, &mut src);
    assert!(!b.closed_by_peer("A-links"), "a new connection clears it");
    // A target that closes idle connections itself (after 200 ms) does not take that for the
    // initiator's doing.
    let d = mk("D-links", 200);
    let mut dst2 = vec![0u8; 8192];
    let md = unsafe { d.register_memory(dst2.as_mut_ptr(), dst2.len(), MemLoc::Host { numa: None }) }.unwrap();
    write(&a2, &d, &md, 3, &mut src);
    std::thread::sleep(Duration::from_millis(1200));
    assert!(!d.closed_by_peer("A-links"), "the target ended them (idle), not the initiator");
    assert!(dst2.iter().all(|&x| x == 0x11));
    drop(a2);
    // B still had A2's connections open (300 s idle timeout): their end is seen there. D had
    // closed every one of them itself, so there is nothing for A2's drop to end.
    assert!(becomes(Duration::from_secs(5), || b.closed_by_peer("A-links")));
    assert!(!d.closed_by_peer("A-links"), "nothing was open to close");
}

#[test]
fn a_peer_seen_only_through_its_signals_is_seen_closed() {
    // No data connection at all: the initiator's control connection (which carries its
    // signals, as it would over rdma) is what ends.
    let mk = |key: &str| {
        let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        e.create_backend(BackendConfig::Tcp(TcpConfig::default())).unwrap();
        e
    };
    let b = mk("B-ctl");
    let mut ctr = vec![0u64; 1];
    let mb = unsafe { b.register_memory(ctr.as_mut_ptr().cast(), 8, MemLoc::Host { numa: None }) }.unwrap();
    let a = mk("A-ctl");
    a.register_remote_engine(b.desc().clone()).unwrap();
    a.signal(&[mori_io::Signal { remote: mb.clone(), offset: 0, op: mori_io::SignalOp::Add(3) }]).wait_for(T).unwrap();
    assert_eq!(b.load_counter(&mb, 0).unwrap(), 3);
    assert!(!b.closed_by_peer("A-ctl"), "its control connection is open");
    drop(a);
    assert!(
        becomes(Duration::from_secs(5), || b.closed_by_peer("A-ctl")),
        "the dropped initiator's control connection ended from its side"
    );
    b.deregister_memory(&mb).unwrap();
}
