//! Runs the xgmi backend's GPU tests (tests/xgmi_gpu.rs, included below) on the CPU against
//! mori-gpu's stand-in libcuda (crates/gpu/tests/fake_cuda/fake_cuda.c): the engine, sessions,
//! ordered batches (one-shot and over sessions), paged batches, the two-process IPC path and
//! every error path, with the fake checking each driver call's arguments and moving the bytes.
//! It proves nothing about NVIDIA's driver or the kernels' device code: scripts/gpu-machine.sh
//! runs the same tests on a GPU.

#[path = "xgmi_gpu.rs"]
mod xgmi_tests;

#[path = "../../gpu/tests/fake_cuda/build_fake.rs"]
mod fake_build;

#[test]
fn xgmi_tests_pass_against_the_fake_driver() {
    let unset = [mori_gpu::ARMED_ENV, mori_gpu::ORDERED_ENV];
    let Some(run) = fake_build::run_module_against_fake("io-xgmi", "xgmi_tests::", &[("MORI_GPU_RUNTIME", "cuda")], &unset) else { return };
    assert!(run.success, "the xgmi GPU tests failed against the fake driver");
    assert!(format!("{}{}", run.stdout, run.stderr).contains("mori fake GPU"), "the fake driver was not loaded");
    assert!(run.stdout.contains("test result: ok. 13 passed; 0 failed"), "not all 13 xgmi GPU tests ran");
}
