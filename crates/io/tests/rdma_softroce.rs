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
