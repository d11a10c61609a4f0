//! Runs the GPU tests (tests/gpu.rs, included below) on the CPU against a stand-in libcuda built
//! from tests/fake_cuda/fake_cuda.c: the real loading path (cudarc finds `libcuda.so` on
//! `LD_LIBRARY_PATH`), every entry point this crate resolves, the per-thread context binding,
//! the argument order of every call (the fake checks ranges, flags and structures), the
//! two-process IPC and VMM tests, and the tests' own logic. It proves nothing about NVIDIA's
//! driver itself: that is what scripts/gpu-machine.sh is for.

#[path = "gpu.rs"]
mod gpu_tests;

#[path = "fake_cuda/build_fake.rs"]
mod fake_build;

#[test]
fn gpu_tests_pass_against_the_fake_driver() {
    // The tests pin their own pool configurations (the armed one its own depth).
    // The resident copier's grid held 150 ms in its exit decision (the test of a post made then).
    let envs = [("MORI_GPU_RUNTIME", "cuda"), ("MORI_FAKE_RESIDENT_EXIT_PAUSE_MS", "150")];
    let Some(run) = fake_build::run_module_against_fake(
        "gpu",
        "gpu_tests::",
        &envs,
        &[mori_gpu::ARMED_ENV, mori_gpu::RESIDENT_ENV, mori_gpu::CARVEOUT_ENV, mori_gpu::FLAGS_ENV, mori_gpu::ORDERED_ENV],
    ) else {
        return;
    };
    assert!(run.success, "the GPU tests failed against the fake driver");
    assert!(run.stdout.contains("runtime: CUDA from "), "the fake driver was not loaded");
    assert!(run.stdout.contains("test result: ok. 20 passed; 0 failed"), "not all 20 GPU tests ran");
}
