//! The conformance suite on the tcp backend, plus tcp-specific checks.

mod conformance;

use conformance::*;
use mori_io::{BackendConfig, BackendKind, EngineConfig, ErrorCode, IoEngine, MemLoc, MemoryDesc, TcpConfig};

fn tcp(lanes: usize) -> impl Fn() -> BackendConfig {
    move || BackendConfig::Tcp(TcpConfig { lanes, min_lane_bytes: 4096, ..TcpConfig::default() })
}

#[test]
fn batch_write_then_read_tcp() {
    batch_write_then_read(&tcp(4), BackendKind::Tcp);
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
    let e = eng.create_backend(BackendConfig::Fabric).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotSupported);
    assert!(e.msg.contains("fabric backend is not part of this build"), "{e}");
    // No GPU runtime on this host (or CI): xgmi says so, naming the libraries.
    if mori_gpu_absent() {
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
    let e = IoEngine::new("wild", EngineConfig::new("0.0.0.0", 0).unwrap()).err().unwrap();
    assert!(e.msg.contains("wildcard"), "{e}");
    let port = eng.desc().port;
    let e = IoEngine::new("clash", EngineConfig::new("127.0.0.1", port).unwrap()).err().unwrap();
    assert!(e.msg.contains(&format!("port {port}")) && e.msg.contains("in use"), "{e}");
    eng.create_backend(BackendConfig::Tcp(TcpConfig::default())).unwrap();
    assert!(eng.create_backend(BackendConfig::Tcp(TcpConfig::default())).is_err());
    let other = IoEngine::new("other", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.register_remote_engine(other.desc().clone()).unwrap();
    let local = unsafe { eng.register_memory(x.as_mut_ptr(), 8, MemLoc::Host { numa: None }) }.unwrap();
    let gpu = MemoryDesc { engine_key: "other".into(), id: 1, addr: 0, len: 8, loc: MemLoc::Gpu { device: 0 }, bus_id: None, handles: vec![] };
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
