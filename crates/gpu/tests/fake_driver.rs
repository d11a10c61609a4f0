//! Runs the GPU tests (tests/gpu.rs, included below) on the CPU against a stand-in libcuda built
//! from tests/fake_cuda/fake_cuda.c: the real loading path (cudarc finds `libcuda.so` on
//! `LD_LIBRARY_PATH`), every entry point this crate resolves, the per-thread context binding,
//! the argument order of every call (the fake checks ranges, flags and structures), the
//! two-process IPC and VMM tests, and the tests' own logic. It proves nothing about NVIDIA's
//! driver itself: that is what scripts/gpu-machine.sh is for.

#[path = "gpu.rs"]
mod gpu_tests;

use std::path::PathBuf;
use std::process::Command;

/// Builds the fake driver with the system C compiler; `None` (and a note) without one.
fn build_fake() -> Option<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cuda/fake_cuda.c");
    let dir = std::env::temp_dir().join(format!("mori-gpu-fake-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = match Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fvisibility=hidden",
            "-o",
        ])
        .arg(&lib)
        .arg(&src)
        .arg("-lpthread")
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            println!("no C compiler ({cc}: {e}): the fake-driver run is skipped");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "building the fake libcuda failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
    Some(dir)
}

#[test]
fn gpu_tests_pass_against_the_fake_driver() {
    let Some(dir) = build_fake() else { return };
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "gpu_tests::",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", &dir)
        .env("MORI_GPU_RUNTIME", "cuda")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "the GPU tests failed against the fake driver"
    );
    assert!(
        stdout.contains("runtime: CUDA from "),
        "the fake driver was not loaded"
    );
    assert!(
        stdout.contains("test result: ok. 11 passed; 0 failed"),
        "not all 11 GPU tests ran"
    );
}
