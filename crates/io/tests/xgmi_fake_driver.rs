//! Runs the xgmi backend's GPU tests (tests/xgmi_gpu.rs, included below) on the CPU against
//! mori-gpu's stand-in libcuda (crates/gpu/tests/fake_cuda/fake_cuda.c): the engine, sessions,
//! ordered batches (one-shot and over sessions), paged batches, the two-process IPC path and
//! every error path, with the fake checking each driver call's arguments and moving the bytes.
//! It proves nothing about NVIDIA's driver or the kernels' device code: scripts/gpu-machine.sh
//! runs the same tests on a GPU.

#[path = "xgmi_gpu.rs"]
mod xgmi_tests;

use std::process::Command;

#[path = "../../gpu/tests/fake_cuda/build_fake.rs"]
mod fake_build;

#[test]
fn xgmi_tests_pass_against_the_fake_driver() {
    let Some(dir) = fake_build::build_fake("io-xgmi") else { return };
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["xgmi_tests::", "--ignored", "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("MORI_GPU_RUNTIME", "cuda")
        .env_remove(mori_gpu::ARMED_ENV)
        .env_remove(mori_gpu::ORDERED_ENV)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "the xgmi GPU tests failed against the fake driver");
    assert!(stdout.contains("test result: ok. 12 passed; 0 failed"), "not all 12 xgmi GPU tests ran");
}
