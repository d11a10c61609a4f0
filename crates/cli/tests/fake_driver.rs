//! Runs the GPU tests of `mori` (tests/gpu.rs, included below) on the CPU against the stand-in
//! libcuda of mori-gpu (crates/gpu/tests/fake_cuda/fake_cuda.c: one device, FABRIC refused with
//! CUDA_ERROR_NOT_PERMITTED as without IMEX, copies done by the CPU). It covers the runtime path
//! of `mori check` (devices, capability flags, the FABRIC probe, the xgmi verdict on device
//! memory) and of `mori peer-bw` (allocation, streams, timing events, verification, the
//! detector), and the tests' own logic. It proves nothing about NVIDIA's driver: that is what
//! scripts/gpu-machine.sh is for.

#[path = "gpu.rs"]
mod gpu_tests;

use std::process::Command;

#[path = "../../gpu/tests/fake_cuda/build_fake.rs"]
mod fake_build;

#[test]
fn gpu_tests_pass_against_the_fake_driver() {
    let Some(dir) = fake_build::build_fake("cli") else { return };
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["gpu_tests::", "--ignored", "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "the GPU tests failed against the fake driver");
    assert!(stderr.contains("mori fake GPU"), "the fake driver was not loaded");
    assert!(stdout.contains("test result: ok. 2 passed; 0 failed"), "not both GPU tests ran");
}
