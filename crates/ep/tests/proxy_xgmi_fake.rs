//! Runs the ring proxy's xgmi tests (tests/proxy_xgmi.rs, included below) on the CPU against
//! mori-gpu's stand-in libcuda (crates/gpu/tests/fake_cuda/fake_cuda.c): the proxy, MORI-IO
//! sessions and the copy pool's copies and stream writes, with the fake checking each driver
//! call's arguments and moving the bytes. It proves nothing about NVIDIA's driver.

#[path = "proxy_xgmi.rs"]
mod proxy_tests;

#[path = "../../gpu/tests/fake_cuda/build_fake.rs"]
mod fake_build;

#[test]
fn proxy_xgmi_tests_pass_against_the_fake_driver() {
    let unset = [mori_gpu::ARMED_ENV, mori_gpu::ORDERED_ENV, mori_ep::proxy::TAIL_WORDS_ENV, mori_ep::proxy::SESSIONS_ENV];
    let Some(run) = fake_build::run_module_against_fake("ep-proxy", "proxy_tests::", &[("MORI_GPU_RUNTIME", "cuda")], &unset) else {
        return;
    };
    assert!(run.success, "the proxy's xgmi tests failed against the fake driver");
    assert!(format!("{}{}", run.stdout, run.stderr).contains("mori fake GPU"), "the fake driver was not loaded");
    assert!(run.stdout.contains("test result: ok. 1 passed; 0 failed"), "the proxy's xgmi test did not run");
}
