//! Two real engines on loopback, tcp backend: data, errors, bounds, notifications.

use mori_io::{BackendConfig, EngineConfig, ErrorCode, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

struct Side {
    eng: IoEngine,
    buf: Vec<u8>,
    mem: MemoryDesc,
}

fn side(key: &str, len: usize, lanes: usize, fill: impl Fn(usize) -> u8) -> Side {
    let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.create_backend(BackendConfig::Tcp(TcpConfig { lanes, min_lane_bytes: 4096, ..TcpConfig::default() })).unwrap();
    let mut buf: Vec<u8> = (0..len).map(fill).collect();
    // SAFETY: `buf` is never reallocated and lives as long as the engine (fields drop in
    // declaration order: the engine first); every transfer is waited for before the end.
    let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
    Side { eng, buf, mem }
}

fn pair(len: usize, lanes: usize) -> (Side, Side) {
    let a = side("init", len, lanes, |i| (i * 7 + 1) as u8);
    let b = side("target", len, lanes, |i| (i * 13 + 5) as u8);
    a.eng.register_remote_engine(b.eng.desc().clone()).unwrap();
    b.eng.register_remote_engine(a.eng.desc().clone()).unwrap();
    (a, b)
}

#[test]
fn session_batch_write_and_read_move_the_right_bytes() {
    let (a, b) = pair(1 << 20, 4);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    assert_eq!(sess.backend(), mori_io::BackendKind::Tcp);
    // Scattered write: 3 entries, one large enough to be striped over lanes.
    let (lo, ro, sz) = ([0u64, 5000, 100_000], [700_000u64, 10, 300_000], [4096u64, 1, 400_000]);
    let id = a.eng.allocate_transfer_uid();
    sess.batch_write(&lo, &ro, &sz, id).wait_for(T).unwrap();
    for i in 0..3 {
        let (l, r, n) = (lo[i] as usize, ro[i] as usize, sz[i] as usize);
        assert_eq!(&b.buf[r..r + n], &a.buf[l..l + n], "entry {i}");
    }
    assert_eq!(b.buf[11], (11 * 13 + 5) as u8, "byte after entry 1 untouched");
    // The target learns of it, once.
    let mut got = None;
    for _ in 0..200 {
        got = b.eng.pop_inbound_status("init", id);
        if got.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(got, Some(Ok(())));
    assert_eq!(b.eng.pop_inbound_status("init", id), None);
    // Read back into another place.
    let id2 = a.eng.allocate_transfer_uid();
    sess.read(600_000, 300_000, 400_000, id2).wait_for(T).unwrap();
    assert_eq!(&a.buf[600_000..1_000_000], &a.buf[100_000..500_000]);
}

#[test]
fn one_shot_ops_match_sessions_and_tiny_batches_of_many_entries() {
    let (a, b) = pair(1 << 21, 2);
    // 100 000 descriptors of 8 bytes, non-contiguous on the remote side.
    let n = 100_000u64;
    let lo: Vec<u64> = (0..n).map(|i| i * 8).collect();
    let ro: Vec<u64> = (0..n).map(|i| i * 16 + 3).collect();
    let sz = vec![8u64; n as usize];
    a.eng.batch_write(&a.mem, &lo, &b.mem, &ro, &sz, a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
    for i in (0..n as usize).step_by(997) {
        assert_eq!(&b.buf[i * 16 + 3..i * 16 + 11], &a.buf[i * 8..i * 8 + 8], "descriptor {i}");
    }
    assert_eq!(b.buf[11], (11 * 13 + 5) as u8, "gap byte between descriptors untouched");
    // Zero-length entries are skipped; a batch of only zero-length entries succeeds.
    a.eng.batch_write(&a.mem, &[0, 0], &b.mem, &[0, 0], &[0, 0], 1).wait_for(T).unwrap();
}

#[test]
fn bad_arguments_get_named_errors_and_touch_nothing() {
    let (a, b) = pair(4096, 1);
    let before = b.buf.clone();
    let st = a.eng.write(&a.mem, 0, &b.mem, 4000, 200, 1);
    let e = st.wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs);
    assert!(e.msg.contains("entry 0: remote range offset 4000 + length 200 exceeds region"), "{e}");
    let e = a.eng.batch_write(&a.mem, &[0, 1], &b.mem, &[0], &[1, 1], 2).wait_for(T).unwrap_err();
    assert!(e.msg.contains("2 local offsets, 1 remote offsets, 2 sizes"), "{e}");
    let e = a.eng.batch_write(&a.mem, &[], &b.mem, &[], &[], 3).wait_for(T).unwrap_err();
    assert!(e.msg.contains("empty batch"), "{e}");
    // A forged descriptor claiming more memory than the target registered: the target refuses.
    let mut forged = b.mem.clone();
    forged.len = 1 << 30;
    let e = a.eng.write(&a.mem, 0, &forged, 8192, 64, 4).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs);
    assert!(e.msg.contains("target engine refused") && e.msg.contains("exceeds region"), "{e}");
    let e = a.eng.read(&a.mem, 0, &forged, 8192, 64, 5).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    assert_eq!(b.buf, before, "target memory unchanged by refused requests");
    // Unknown memory id: NotFound from the control plane, not a size mismatch.
    let mut unknown = b.mem.clone();
    unknown.id = 999;
    let e = a.eng.create_session(&a.mem, &unknown).err().unwrap();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    assert!(e.msg.contains("memory 999 is not registered"), "{e}");
    let e = a.eng.lookup_remote_memory("target", 999).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    // Unknown engine.
    let mut stranger = b.mem.clone();
    stranger.engine_key = "nobody".into();
    let e = a.eng.write(&a.mem, 0, &stranger, 0, 1, 6).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    // Memory of another engine used as local.
    let e = a.eng.write(&b.mem, 0, &b.mem, 0, 1, 7).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs);
}

#[test]
fn read_of_deregistered_memory_fails_cleanly_and_double_deregister_errors() {
    let (a, b) = pair(65536, 2);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    sess.read(0, 0, 1024, 1).wait_for(T).unwrap();
    b.eng.deregister_memory(&b.mem).unwrap();
    let e = sess.read(0, 0, 1024, 2).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    let e = b.eng.deregister_memory(&b.mem).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
}

#[test]
fn unavailable_paths_say_so() {
    let eng = IoEngine::new("solo", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    let e = eng.create_backend(BackendConfig::Xgmi).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotSupported);
    assert!(e.msg.contains("xgmi backend is not part of this build"), "{e}");
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
    let e = IoEngine::new("wild", EngineConfig::new("0.0.0.0", 0).unwrap()).err().unwrap();
    assert!(e.msg.contains("wildcard"), "{e}");
    let port = eng.desc().port;
    let e = IoEngine::new("clash", EngineConfig::new("127.0.0.1", port).unwrap()).err().unwrap();
    assert!(e.msg.contains(&format!("port {port}")) && e.msg.contains("in use"), "{e}");
    eng.create_backend(BackendConfig::Tcp(TcpConfig::default())).unwrap();
    assert!(eng.create_backend(BackendConfig::Tcp(TcpConfig::default())).is_err());
    // A remote GPU descriptor: tcp refuses with its reason, the engine reports it.
    let other = IoEngine::new("other", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.register_remote_engine(other.desc().clone()).unwrap();
    let local = unsafe { eng.register_memory(x.as_mut_ptr(), 8, MemLoc::Host { numa: None }) }.unwrap();
    let gpu = MemoryDesc { engine_key: "other".into(), id: 1, addr: 0, len: 8, loc: MemLoc::Gpu { device: 0 }, bus_id: None, handles: vec![] };
    let e = eng.write(&local, 0, &gpu, 0, 8, 1).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotSupported);
    assert!(e.msg.contains("tcp: remote memory 1 of engine \"other\" is GPU memory"), "{e}");
}
