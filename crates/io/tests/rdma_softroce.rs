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
