//! Runs the ring proxy's xgmi tests (tests/proxy_xgmi.rs, included below) on the CPU against
//! mori-gpu's stand-in libcuda (crates/gpu/tests/fake_cuda/fake_cuda.c): the proxy, MORI-IO
//! sessions and the copy pool's copies and stream writes, with the fake checking each driver
//! call's arguments and moving the bytes. It proves nothing about NVIDIA's driver.

#[path = "proxy_xgmi.rs"]
mod proxy_tests;

#[path = "../../gpu/tests/fake_cuda/build_fake.rs"]
mod fake_build;

const UNSET: [&str; 5] =
    [mori_gpu::ARMED_ENV, mori_gpu::ORDERED_ENV, mori_gpu::RESIDENT_ENV, mori_ep::proxy::TAIL_WORDS_ENV, mori_ep::proxy::SESSIONS_ENV];

/// Runs the module with `envs` (and the CUDA runtime); returns its standard output.
fn run_with(tag: &str, envs: &[(&str, &str)]) -> Option<String> {
    let mut all = vec![("MORI_GPU_RUNTIME", "cuda")];
    all.extend_from_slice(envs);
    let unset: Vec<&str> = UNSET.into_iter().filter(|u| !envs.iter().any(|(k, _)| k == u)).collect();
    let run = fake_build::run_module_against_fake(tag, "proxy_tests::", &all, &unset)?;
    assert!(run.success, "the proxy's xgmi tests failed against the fake driver ({envs:?})");
    assert!(format!("{}{}", run.stdout, run.stderr).contains("mori fake GPU"), "the fake driver was not loaded");
    assert!(run.stdout.contains("test result: ok. 3 passed; 0 failed"), "the proxy's xgmi tests did not all run");
    Some(run.stdout)
}

#[test]
fn proxy_xgmi_tests_pass_against_the_fake_driver() {
    let Some(out) = run_with("ep-proxy", &[]) else { return };
    assert!(out.contains("copy pool: 1 ordered launches, 0 resident posts"), "no resident copier unless asked for: {out}");
}

#[test]
fn proxy_xgmi_tests_pass_over_the_resident_copier() {
    let Some(out) = run_with("ep-proxy-resident", &[(mori_gpu::RESIDENT_ENV, "24")]) else { return };
    assert!(out.contains("copy pool: 0 ordered launches, 1 resident posts"), "the ordered batch went to the resident copier: {out}");
}
