//! Runs `examples/kv_cache_transfer.rs` on a small request (256 tokens) through cargo and
//! checks that it verified every byte and exited 0.

use std::process::Command;

#[test]
fn kv_cache_example_moves_and_verifies_a_small_request() {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args(["run", "--quiet", "--example", "kv_cache_transfer"]);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    cmd.args(["--", "--tokens", "256", "--reps", "1", "--lanes", "2"]);
    let out = cmd.output().expect("spawn cargo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "example failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("verified: every byte OK"), "no verification line:\n{stdout}\n{stderr}");
    assert!(stdout.contains("descriptors: 1024"), "256 tokens = 16 blocks x 32 layers x K/V:\n{stdout}");
}
