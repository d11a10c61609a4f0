//! The conformance suite on the rdma backend, plus rdma-specific checks. These need an RDMA
//! device with an active port: `cargo xtask test` runs them (`--ignored`) inside the SoftRoCE
//! guest (one rxe device; the two engines use separate QPs on it).

mod conformance;

use conformance::*;
use mori_io::{BackendConfig, BackendKind, ErrorCode, RdmaConfig};

fn rdma(qps: usize) -> impl Fn() -> BackendConfig {
    move || BackendConfig::Rdma(RdmaConfig { qps_per_transfer: qps, ..RdmaConfig::from_env().unwrap() })
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn batch_write_then_read_rdma() {
    batch_write_then_read(&rdma(4), BackendKind::Rdma);
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn many_small_descriptors_rdma() {
    many_small_descriptors(&rdma(2), 20_000);
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn bad_arguments_rdma() {
    // An access outside the target's MR is refused by the target NIC (remote access error).
    bad_arguments(&rdma(1), &["remote access error"]);
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn deregistration_rdma() {
    // The target's MR is gone: its rkey no longer grants access.
    deregistration(&rdma(2), ErrorCode::InvalidArgs);
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn tiny_send_queue_waits_for_room_and_succeeds() {
    // 4 WRs per QP and chunking off: 2000 scattered descriptors must pass through admission.
    let cfg = || {
        BackendConfig::Rdma(RdmaConfig { qps_per_transfer: 1, max_send_wr: 4, chunking: false, ..RdmaConfig::from_env().unwrap() })
    };
    many_small_descriptors(&cfg, 2000);
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn duplicate_registration_shares_one_mr_and_survives_one_deregistration() {
    let (a, b) = pair(1 << 16, &rdma(1));
    // Register the target buffer a second time: the registration cache reuses the MR.
    let again = unsafe { b.eng.register_memory(b.buf.as_ptr() as *mut u8, b.buf.len(), mori_io::MemLoc::Host { numa: None }) }.unwrap();
    let key = |m: &mori_io::MemoryDesc| m.handles.iter().find(|h| h.backend == BackendKind::Rdma).map(|h| h.bytes.clone());
    assert!(key(&again).is_some());
    assert_eq!(key(&again), key(&b.mem), "same range, same rkey");
    // Dropping the first registration leaves the second usable.
    b.eng.deregister_memory(&b.mem).unwrap();
    a.eng.write(&a.mem, 0, &again, 100, 4096, a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
    assert_eq!(&b.buf[100..4196], &a.buf[..4096]);
    b.eng.deregister_memory(&again).unwrap();
    assert_eq!(b.eng.deregister_memory(&again).unwrap_err().code, ErrorCode::NotFound, "double deregistration is an error");
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn auto_backends_prefer_rdma_when_a_port_is_active() {
    use mori_io::{EngineConfig, IoEngine, MemLoc, TcpConfig};
    let mk = |key: &str| {
        let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        assert_eq!(e.create_backends_auto(TcpConfig::default(), RdmaConfig::from_env().unwrap()).unwrap(), vec![BackendKind::Rdma, BackendKind::Tcp]);
        e
    };
    let (a, b) = (mk("auto-a"), mk("auto-b"));
    let (mut x, mut y) = (vec![1u8; 4096], vec![0u8; 4096]);
    let mx = unsafe { a.register_memory(x.as_mut_ptr(), x.len(), MemLoc::Host { numa: None }) }.unwrap();
    let my = unsafe { b.register_memory(y.as_mut_ptr(), y.len(), MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    let sess = a.create_session(&mx, &my).unwrap();
    assert_eq!(sess.backend(), BackendKind::Rdma, "rdma is preferred over tcp");
    sess.write(0, 0, 4096, 1).wait_for(T).unwrap();
    assert!(y.iter().all(|&v| v == 1));
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn event_completion_mode_moves_the_same_bytes() {
    let cfg = || {
        BackendConfig::Rdma(RdmaConfig { qps_per_transfer: 2, poll_mode: mori_io::PollMode::Event, ..RdmaConfig::from_env().unwrap() })
    };
    batch_write_then_read(&cfg, BackendKind::Rdma);
    many_small_descriptors(&cfg, 5000);
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn posting_workers_split_the_batch_and_move_the_same_bytes() {
    // Chunking off and 4 workers: the planner gives each worker a share of the batch and its
    // own QPs; workers 1..3 post on their threads.
    let cfg = || {
        BackendConfig::Rdma(RdmaConfig { qps_per_transfer: 4, workers: 4, chunking: false, ..RdmaConfig::from_env().unwrap() })
    };
    batch_write_then_read(&cfg, BackendKind::Rdma);
    many_small_descriptors(&cfg, 8000);
}
