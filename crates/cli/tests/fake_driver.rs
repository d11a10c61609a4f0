//! Runs the GPU tests of `mori` (tests/gpu.rs, included below) on the CPU against the stand-in
//! libcuda of mori-gpu (crates/gpu/tests/fake_cuda/fake_cuda.c: one device, FABRIC refused with
//! CUDA_ERROR_NOT_PERMITTED as without IMEX, copies done by the CPU). It covers the runtime path
//! of `mori check` (devices, capability flags, the FABRIC probe, the xgmi verdict on device
//! memory) and of `mori peer-bw` (allocation, streams, timing events, verification, the
//! detector), and the tests' own logic. It proves nothing about NVIDIA's driver: that is what
//! scripts/gpu-machine.sh is for.

#[path = "gpu.rs"]
mod gpu_tests;

#[path = "../../gpu/tests/fake_cuda/build_fake.rs"]
mod fake_build;

#[test]
fn gpu_tests_pass_against_the_fake_driver() {
    let Some(run) = fake_build::run_module_against_fake("cli", "gpu_tests::", &[], &[]) else { return };
    assert!(run.success, "the GPU tests failed against the fake driver");
    assert!(run.stderr.contains("mori fake GPU"), "the fake driver was not loaded");
    assert!(run.stdout.contains("test result: ok. 2 passed; 0 failed"), "not both GPU tests ran");
}
