//! Who may touch registered memory: only connections presenting the engine's secret (from its
//! descriptor); a cap on inbound connections; idle connections closed (tcp, loopback).

use mori_io::{BackendConfig, EngineConfig, EngineDesc, ErrorCode, IoEngine, MemLoc, Secret, TcpConfig};
use mori_io_core::wire::{handshake, read_frame, write_frame, Hello, HelloAuth, HelloReply, Role, DEFAULT_MAX_FRAME, PROTOCOL_VERSION};
use mori_io_core::BackendKind;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// The tests count this process's threads: they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn engine(key: &str, f: impl FnOnce(&mut EngineConfig)) -> IoEngine {
    let mut cfg = EngineConfig::new("127.0.0.1", 0).unwrap();
    f(&mut cfg);
    let e = IoEngine::new(key, cfg).unwrap();
    e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 1, ..TcpConfig::default() })).unwrap();
    e
}

fn connect(d: &EngineDesc) -> TcpStream {
    let s = TcpStream::connect((d.host.as_str(), d.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Says hello to `to` as a stranger who believes `to`'s secret is `secret`; returns the
/// stream and the outcome (the listener's descriptor, or its refusal).
fn hello(to: &EngineDesc, role: Role, secret: Secret) -> (TcpStream, Result<EngineDesc, mori_io::IoError>) {
    let mut s = connect(to);
    let from = EngineDesc { key: "stranger".into(), secret: Secret(99), ..to.clone() };
    let believed = EngineDesc { secret, ..to.clone() };
    let r = handshake(&mut s, &from, &believed, role, Duration::from_secs(5));
    (s, r)
}

fn threads() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
}

#[test]
fn connections_without_the_secret_are_refused_before_any_memory_is_touched() {
    let _g = serial();
    let (a, b) = (engine("A-auth", |_| {}), engine("B-auth", |_| {}));
    assert_ne!(b.desc().secret, Secret::NONE, "engines check secrets by default");
    let mut src = vec![0x77u8; 4096];
    let mut dst = vec![0u8; 4096];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), dst.len(), MemLoc::Host { numa: None }) }.unwrap();

    // A stranger on the control plane: refused, nothing looked up.
    for (role, what) in [(Role::Control, "control"), (Role::Data { backend: BackendKind::Tcp, lane: 0 }, "tcp data")] {
        let (mut s, r) = hello(b.desc(), role, Secret(b.desc().secret.0 ^ 1));
        let Err(e) = r else { panic!("{what} hello with a wrong secret was accepted") };
        assert_eq!(e.code, ErrorCode::Refused, "{e}");
        // The listener proved itself with its real secret, which the stranger's belief does
        // not verify: the stranger stops (nothing of its own sent).
        assert!(e.msg.contains("does not prove it holds the secret"), "{e}");
        // Whatever follows is never read: the connection is closed.
        let _ = s.write_all(&[0u8; 64]);
        let mut one = [0u8; 1];
        assert!(matches!(s.read(&mut one), Ok(0) | Err(_)), "{what}: the connection stays open");
        // A dialer that goes on with a proof made without the secret: the listener refuses.
        let mut s = connect(b.desc());
        let from = EngineDesc { key: "stranger".into(), secret: Secret::NONE, ..b.desc().clone() };
        write_frame(&mut s, &Hello { version: PROTOCOL_VERSION, from, role, nonce: 7 }).unwrap();
        let r: HelloReply = read_frame(&mut s, DEFAULT_MAX_FRAME).unwrap();
        assert!(matches!(r, HelloReply::Challenge { .. }), "{r:?}");
        write_frame(&mut s, &HelloAuth { proof: [0; 32], secret: Secret::NONE }).unwrap();
        let HelloReply::Refused(e) = read_frame(&mut s, DEFAULT_MAX_FRAME).unwrap() else { panic!("{what}: a bogus proof was accepted") };
        assert_eq!(e.code, ErrorCode::Refused, "{e}");
        assert!(e.msg.contains("does not prove it holds the secret of engine \"B-auth\"") && e.msg.contains("MORI_IO_AUTH=off"), "{e}");
        assert!(matches!(s.read(&mut one), Ok(0) | Err(_)), "{what}: the refused connection stays open");
    }
    // An engine holding a descriptor of B without its secret: its write is refused.
    let blind = EngineDesc { secret: Secret::NONE, ..b.desc().clone() };
    a.register_remote_engine(blind).unwrap();
    let e = a.write(&ms, 0, &md, 0, 4096, 1).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::Refused, "{e}");
    assert!(dst.iter().all(|&x| x == 0), "a refused connection wrote into registered memory");
    // With the real descriptor it works.
    a.register_remote_engine(b.desc().clone()).unwrap();
    a.write(&ms, 0, &md, 0, 4096, 2).wait_for(T).unwrap();
    assert!(dst.iter().all(|&x| x == 0x77));
    // The right secret from a raw client is accepted (the check is the secret, not the key).
    let (_s, r) = hello(b.desc(), Role::Control, b.desc().secret);
    assert!(matches!(r, Ok(d) if d.key == "B-auth"));
    a.deregister_memory(&ms).unwrap();
    b.deregister_memory(&md).unwrap();
    drop(src);
}

#[test]
fn with_auth_off_the_engine_says_so_and_serves_anyone() {
    let _g = serial();
    let b = engine("B-noauth", |c| c.auth = false);
    assert_eq!(b.desc().secret, Secret::NONE);
    // The listener proves itself with the zero key; any dialer proof is taken.
    let (_s, r) = hello(b.desc(), Role::Control, Secret::NONE);
    assert!(r.is_ok(), "{r:?}");
    let mut s = connect(b.desc());
    let from = EngineDesc { key: "stranger".into(), ..b.desc().clone() };
    let r = mori_io_core::wire::handshake(&mut s, &from, &EngineDesc { secret: Secret(12345), ..b.desc().clone() }, Role::Control, T);
    assert!(r.is_err(), "a dialer that expects a secret does not accept an engine proving none");
}

#[test]
fn inbound_connections_are_capped_with_a_refusal_naming_the_limit() {
    let _g = serial();
    let b = engine("B-cap", |c| {
        c.max_inbound = 4;
        c.control_timeout = Duration::from_secs(3);
    });
    let before = threads();
    // Four silent connections take every slot (each waits for its hello until the deadline).
    let held: Vec<TcpStream> = (0..4).map(|_| connect(b.desc())).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut refusals = 0;
    for i in 0..50 {
        let mut s = connect(b.desc());
        match read_frame::<HelloReply, _>(&mut s, DEFAULT_MAX_FRAME) {
            Ok(HelloReply::Refused(e)) => {
                assert_eq!(e.code, ErrorCode::Refused, "{e}");
                assert!(e.msg.contains("serves at most 4 inbound connections") && e.msg.contains("MORI_IO_MAX_INBOUND"), "{e}");
                refusals += 1;
            }
            other => panic!("connection {i} past the cap: {other:?}"),
        }
    }
    assert_eq!(refusals, 50);
    let grown = threads().saturating_sub(before);
    assert!(grown <= 6, "54 connections made {grown} threads (cap 4)");
    // Once the silent ones are gone, a real peer connects again.
    drop(held);
    let a = engine("A-cap", |_| {});
    let mut src = vec![1u8; 64];
    let mut dst = vec![0u8; 64];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    let t0 = Instant::now();
    loop {
        match a.write(&ms, 0, &md, 0, 64, a.allocate_transfer_uid()).wait_for(T) {
            Ok(()) => break,
            Err(e) if t0.elapsed() < Duration::from_secs(5) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("no slot came free: {e}"),
        }
    }
    assert!(dst.iter().all(|&x| x == 1));
    a.deregister_memory(&ms).unwrap();
    b.deregister_memory(&md).unwrap();
    drop(src);
}

#[test]
fn idle_connections_are_closed_and_peers_reconnect() {
    let _g = serial();
    let b = engine("B-idle", |c| c.idle_timeout = Duration::from_millis(300));
    let a = engine("A-idle", |_| {});
    let mut src = vec![3u8; 64];
    let mut dst = vec![0u8; 64];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    a.write(&ms, 0, &md, 0, 64, 1).wait_for(T).unwrap();
    let serving = threads();
    std::thread::sleep(Duration::from_millis(900));
    let after_idle = threads();
    assert!(after_idle < serving, "the idle data connection's thread is still there ({serving} -> {after_idle} threads)");
    // The lane notices its connection was closed and dials again.
    dst.fill(0);
    a.write(&ms, 0, &md, 0, 64, 2).wait_for(T).unwrap();
    assert!(dst.iter().all(|&x| x == 3));
    a.deregister_memory(&ms).unwrap();
    b.deregister_memory(&md).unwrap();
    drop(src);
}

#[test]
fn a_stranger_cannot_hold_a_slot_past_the_hello_deadline_nor_make_the_engine_hold_a_big_frame() {
    let _g = serial();
    let b = engine("B-slow", |c| {
        c.max_inbound = 2;
        c.control_timeout = Duration::from_millis(600);
    });
    // Two tricklers: a length prefix, then one byte every 200 ms (each read within the old
    // per-read timeout). The whole hello has one deadline: both are cut off at ~0.6 s.
    let tricklers: Vec<std::thread::JoinHandle<Duration>> = (0..2)
        .map(|_| {
            let d = b.desc().clone();
            std::thread::spawn(move || {
                let mut s = connect(&d);
                let t = Instant::now();
                let _ = s.write_all(&200u32.to_le_bytes());
                for _ in 0..40 {
                    std::thread::sleep(Duration::from_millis(200));
                    if s.write_all(&[0]).is_err() {
                        break;
                    }
                    let mut one = [0u8; 1];
                    s.set_nonblocking(true).unwrap();
                    let closed = matches!(s.read(&mut one), Ok(0));
                    s.set_nonblocking(false).unwrap();
                    if closed {
                        break;
                    }
                }
                t.elapsed()
            })
        })
        .collect();
    for t in tricklers {
        let held = t.join().unwrap();
        assert!(held < Duration::from_secs(3), "a trickling hello held its slot for {held:?} (deadline 0.6 s)");
    }
    // A hello declaring 16 MiB is refused before any of it is read.
    let mut s = connect(b.desc());
    s.write_all(&(16u32 << 20).to_le_bytes()).unwrap();
    let mut one = [0u8; 1];
    assert!(matches!(s.read(&mut one), Ok(0) | Err(_)), "a 16 MiB hello was not refused");
    // A zero deadline is refused, naming the variable.
    let cfg = EngineConfig { control_timeout: Duration::ZERO, ..EngineConfig::new("127.0.0.1", 0).unwrap() };
    let e = IoEngine::new("B-zero", cfg).err().expect("a zero control deadline");
    assert!(e.msg.contains("MORI_IO_CONTROL_TIMEOUT_MS"), "{e}");
    let e = TcpConfig { data_timeout: Duration::ZERO, ..TcpConfig::default() };
    let err = b.create_backend(BackendConfig::Tcp(e)).unwrap_err();
    assert!(err.msg.contains("MORI_IO_TCP_TIMEOUT_MS") || err.msg.contains("already created"), "{err}");
}

#[test]
fn an_impostor_at_a_peers_address_learns_no_secret() {
    let _g = serial();
    // A process holding the port of the engine A believes it dials: it reads what A sends and
    // answers with a challenge it cannot prove.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let h: Hello = read_frame(&mut s, DEFAULT_MAX_FRAME).unwrap();
        write_frame(&mut s, &HelloReply::Challenge { nonce: 1, proof: [7; 32] }).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        (h, rest)
    });
    let (a, b) = (engine("A-imp", |_| {}), engine("B-imp", |_| {}));
    let mut src = vec![5u8; 64];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    let mut dst = vec![0u8; 64];
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(EngineDesc { port, ..b.desc().clone() }).unwrap();
    let e = a.write(&ms, 0, &md, 0, 64, 1).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::Refused, "{e}");
    assert!(e.msg.contains("does not prove it holds the secret"), "{e}");
    let (h, rest) = got.join().unwrap();
    assert_eq!(h.from.key, "A-imp");
    assert_eq!(h.from.secret, Secret::NONE, "the hello carried the dialer's secret");
    assert!(rest.is_empty(), "the dialer sent {} more bytes after a challenge it could not verify", rest.len());
    let a_secret = a.desc().secret.0.to_le_bytes();
    let hello_bytes = mori_io_core::wire::encode_frame(&h).unwrap();
    assert!(!hello_bytes.windows(16).any(|w| w == a_secret), "A's secret travelled to the impostor");
    a.deregister_memory(&ms).unwrap();
    b.deregister_memory(&md).unwrap();
    drop(src);
}
