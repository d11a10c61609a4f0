//! Runs the GPU tests (tests/gpu.rs, included below) on the CPU against a stand-in libcuda built
//! from tests/fake_cuda/fake_cuda.c: the real loading path (cudarc finds `libcuda.so` on
//! `LD_LIBRARY_PATH`), every entry point this crate resolves, the per-thread context binding,
//! the argument order of every call (the fake checks ranges, flags and structures), the
//! two-process IPC and VMM tests, and the tests' own logic. It proves nothing about NVIDIA's
//! driver itself: that is what scripts/gpu-machine.sh is for.

#[path = "gpu.rs"]
mod gpu_tests;

use std::process::Command;

#[path = "fake_cuda/build_fake.rs"]
mod fake_build;

#[test]
fn gpu_tests_pass_against_the_fake_driver() {
    let Some(dir) = fake_build::build_fake("gpu") else { return };
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["gpu_tests::", "--ignored", "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("MORI_GPU_RUNTIME", "cuda")
        // The tests pin their own pool configurations (the armed one its own depth).
        .env_remove(mori_gpu::ARMED_ENV)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "the GPU tests failed against the fake driver");
    assert!(stdout.contains("runtime: CUDA from "), "the fake driver was not loaded");
    assert!(stdout.contains("test result: ok. 17 passed; 0 failed"), "not all 17 GPU tests ran");
}
