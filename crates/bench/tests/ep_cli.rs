//! bench_dispatch_combine's command line on a machine without a GPU (CI): shape and launch
//! errors name the flag and the limit before any GPU work, and a missing runtime is named.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bench_dispatch_combine"))
        .args(args)
        .env("MORI_GPU_RUNTIME", "auto")
        .output()
        .expect("spawn bench_dispatch_combine");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn shape_and_launch_errors_name_the_flag_and_the_limit() {
    let cases: &[(&[&str], &str)] = &[
        (&["--procs", "3"], "--procs 3 must divide --world-size 8"),
        (&["--num-gpus", "3"], "--num-gpus 3 must divide --world-size 8"),
        (&["--procs", "2"], "--procs 2 above --num-gpus 1"),
        (&["--top-k", "40"], "--top-k 40 exceeds the limit 32"),
        (&["--num-experts", "100"], "100"),
        (&["--hidden", "100", "--dtype", "fp8", "--combine-dtype", "bf16"], "hidden"),
        (&["--warps-per-block", "40"], "--warps-per-block 40: must be at most 32"),
        (&["--top-k", "0"], "--top-k 0: must be at least 1"),
        (&["--procs", "2", "--num-gpus", "4"], "--num-gpus must equal --procs"),
        (&["--ranks-per-gpu", "3"], "--ranks-per-gpu 3 must divide --world-size 8"),
        (&["--ranks-per-gpu", "4", "--procs", "4"], "--procs 4 above --num-gpus 2"),
        (&["--num-tokens", "0"], "--num-tokens 0: must be in 1..=1048576"),
        (&["--iters", "0"], "--iters 0"),
        (&["--timeout-ms", "0"], "--timeout-ms 0"),
        (&["--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json: cannot be written"),
    ];
    for (args, want) in cases {
        let (code, text) = run(args);
        assert_eq!(code, 1, "{args:?}: {text}");
        assert!(text.contains("bench_dispatch_combine: error:"), "{args:?}: {text}");
        assert!(text.contains(want), "{args:?}: wanted {want:?} in {text}");
    }
}

#[test]
fn without_a_gpu_the_missing_runtime_is_named() {
    let (code, text) = run(&["--num-tokens", "8", "--hidden", "256", "--num-experts", "16", "--top-k", "2"]);
    if text.contains("no GPU runtime") {
        assert_eq!(code, 1, "{text}");
        assert!(text.contains("libcuda") && text.contains("libamdhip64"), "both runtimes named: {text}");
        println!("path: no GPU runtime on this machine, refused as expected");
    } else {
        // A GPU machine: the run must then pass its oracle check.
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("check (process 0): OK"), "{text}");
        println!("path: a GPU runtime is present; the small run passed its check");
    }
}

#[test]
fn long_help_names_the_environment_switches() {
    let (code, text) = run(&["--help"]);
    assert_eq!(code, 0, "{text}");
    for var in [
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "MORI_EP_PROXY_SESSIONS=0",
        "MORI_EP_PROXY_TAIL_WORDS",
        "MORI_EP_PROXY_GROUPED=0",
        "MORI_GPU_POOL_ORDERED_KERNEL=0",
        "MORI_GPU_POOL_ARMED",
        "MORI_GPU_POOL_RESIDENT",
        "MORI_GPU_POOL_RESIDENT_CARVEOUT",
    ] {
        assert!(text.contains(var), "--help lacks {var}: {text}");
    }
}
