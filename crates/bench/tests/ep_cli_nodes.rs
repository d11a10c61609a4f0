//! bench_dispatch_combine's node geometry on the command line: the kernel type and its
//! launch defaults follow `--gpus-per-node`, and refusals name the user's flags, before any
//! GPU is touched (these run on CI machines without a GPU).

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    run_env(args, &[])
}

fn run_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bench_dispatch_combine"))
        .args(args)
        .env("MORI_GPU_RUNTIME", "auto")
        .env_remove("MORI_GPU_POOL_ARMED")
        .envs(env.iter().copied())
        .output()
        .expect("spawn bench_dispatch_combine");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// Armed copy launches (`MORI_GPU_POOL_ARMED`) are refused for the inter-node EP over xgmi,
/// naming the variable and what they cost on a GPU; a bad value names the variable and its
/// range; 0 goes on to the xgmi stream limit; over tcp the variable plays no part.
#[test]
fn armed_launches_are_refused_over_xgmi() {
    let four = with_small(&["--kernel-type", "v1", "--world-size", "16", "--num-nodes", "4"]);
    let four: Vec<&str> = four.iter().map(String::as_str).collect();
    let (code, text) = run_env(&four, &[("MORI_GPU_POOL_ARMED", "2")]);
    assert_eq!(code, 1, "{text}");
    for want in ["MORI_GPU_POOL_ARMED = 2", "1-3 ms instead of 19-55 µs", "unset it or set 0"] {
        assert!(text.contains(want), "wanted {want:?} in {text}");
    }
    let (code, text) = run_env(&four, &[("MORI_GPU_POOL_ARMED", "x")]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("MORI_GPU_POOL_ARMED=\"x\"") && text.contains("0 (off) to 8"), "{text}");
    let (code, text) = run_env(&four, &[("MORI_GPU_POOL_ARMED", "0")]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("36 streams") && text.contains("at most 12 ranks in 4 nodes"), "{text}");
    let mut tcp = four.clone();
    tcp.extend(["--transport", "tcp"]);
    let (_, text) = run_env(&tcp, &[("MORI_GPU_POOL_ARMED", "2")]);
    assert!(!text.contains("MORI_GPU_POOL_ARMED"), "{text}");
}

const SMALL: &[&str] = &["--num-tokens", "8", "--hidden", "256", "--num-experts", "32", "--top-k", "2"];

fn with_small(args: &[&str]) -> Vec<String> {
    args.iter().chain(SMALL).map(|s| s.to_string()).collect()
}

#[test]
fn one_node_of_sixteen_passes_validation() {
    // Formerly refused with "rdma_block_num = 64 is invalid: InterNodeV1 needs 1..block_num (= 8)":
    // the kernel type was chosen for nodes of 8 before --gpus-per-node was applied.
    let args = with_small(&["--world-size", "16", "--gpus-per-node", "16", "--block-num", "8"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, text) = run(&args);
    assert!(!text.contains("rdma_block_num") && !text.contains("InterNodeV1"), "{text}");
    if text.contains("no GPU runtime") {
        assert_eq!(code, 1, "{text}");
        println!("path: validation passed, no GPU runtime on this machine");
    } else {
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("check (process 0): OK"), "{text}");
        println!("path: a GPU runtime is present; the 16-rank one-node run passed its check");
    }
}

#[test]
fn node_refusals_name_the_users_flags() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--world-size", "16", "--gpus-per-node", "8", "--kernel-type", "intranode"],
            &["--kernel-type intranode with --world-size 16 and --gpus-per-node 8 (2 nodes)"],
        ),
        (&["--kernel-type", "v1"], &["--kernel-type v1 on GPUs runs across nodes", "one node"]),
        (
            &["--kernel-type", "v1", "--num-nodes", "2", "--block-num", "1"],
            &["--block-num 1 with --kernel-type v1 leaves no XGMI block", "though the GPU kernels here do not use it"],
        ),
        (&["--kernel-type", "v1_ll"], &["--kernel-type v1_ll on GPUs runs across nodes", "one node"]),
        (
            &["--kernel-type", "async_ll"],
            &[
                "--kernel-type async_ll on GPUs runs across nodes",
                "(8 ranks per node: none of --num-nodes, --gpus-per-node or a launcher gave a count) is one node",
            ],
        ),
        (&["--kernel-type", "async_ll", "--num-nodes", "2", "--transport", "rdma"], &["--transport rdma on GPUs: not built"]),
        (&["--lanes", "2"], &["--transport/--lanes on GPUs choose the inter-node leg of --kernel-type v1, v1_ll or async_ll"]),
        (&["--kernel-type", "async_ll", "--num-nodes", "2", "--lanes", "8"], &["--lanes on GPUs sets the TCP lanes of --transport tcp"]),
        (
            &["--kernel-type", "async_ll", "--world-size", "32", "--num-nodes", "2"],
            &["--world-size 32 over xgmi: 66 streams", "at most 14 ranks in 2 nodes"],
        ),
        (&["--world-size", "16", "--gpus-per-node", "6"], &["--gpus-per-node 6 must divide --world-size 16"]),
        (&["--proxy-spin-us", "10"], &["--proxy-spin-us/--copy-blocks/--combine-staging/--recv-copy-out/--device-api apply to the GPU inter-node kernels (--kernel-type v1, v1_ll or async_ll on GPUs) and their proxies; this run is not one of them (--kernel-type intranode)"]),
        (&["--combine-staging"], &["--proxy-spin-us/--copy-blocks/--combine-staging/--recv-copy-out/--device-api apply to the GPU inter-node kernels (--kernel-type v1, v1_ll or async_ll on GPUs) and their proxies; this run is not one of them (--kernel-type intranode)"]),
        (&["--recv-copy-out"], &["--proxy-spin-us/--copy-blocks/--combine-staging/--recv-copy-out/--device-api apply to the GPU inter-node kernels (--kernel-type v1, v1_ll or async_ll on GPUs) and their proxies; this run is not one of them (--kernel-type intranode)"]),
        (&["--device-api"], &["--proxy-spin-us/--copy-blocks/--combine-staging/--recv-copy-out/--device-api apply to the GPU inter-node kernels (--kernel-type v1, v1_ll or async_ll on GPUs) and their proxies; this run is not one of them (--kernel-type intranode)"]),
        (
            &["--kernel-type", "async_ll", "--num-nodes", "2", "--device-api", "--recv-copy-out"],
            &["--device-api leaves the received records in the window; --recv-copy-out copies them out: give one of them"],
        ),
        (
            &["--device", "cpu", "--local", "--kernel-type", "async_ll", "--num-nodes", "2", "--recv-copy-out"],
            &["this run is not one of them (--device cpu: the host executor)"],
        ),
        (
            &["--kernel-type", "v1", "--num-nodes", "2", "--transport", "tcp", "--combine-staging"],
            &["--combine-staging chooses how combine over xgmi hands its rows on", "--transport tcp always stages them: drop one of the two"],
        ),
        (
            &["--kernel-type", "v1_ll", "--world-size", "32", "--num-nodes", "2"],
            &["--world-size 32 over xgmi: 66 streams", "at most 14 ranks in 2 nodes"],
        ),
        (&["--kernel-type", "async_ll", "--num-nodes", "2", "--copy-blocks", "0"], &["--copy-blocks 0: give 1..=1024"]),
        (
            &["--kernel-type", "async_ll", "--num-nodes", "2", "--proxy-spin-us", "20000000"],
            &["--proxy-spin-us 20000000: at most 10000000 µs"],
        ),
        (
            &["--kernel-type", "async_ll", "--num-nodes", "2", "--json", "/nonexistent-dir/x.json"],
            &["--json /nonexistent-dir/x.json: cannot be written"],
        ),
        (&["--kernel-type", "v1", "--num-nodes", "2", "--zero-token-ranks", "1,1"], &["--zero-token-ranks: rank 1 given twice"]),
        (
            &["--kernel-type", "v1", "--num-nodes", "2", "--zero-token-ranks", "1", "--remote-only-ranks", "0,1"],
            &["rank 1 is in both --zero-token-ranks and --remote-only-ranks"],
        ),
        (&["--kernel-type", "v1", "--num-nodes", "2", "--remote-only-ranks", "8"], &["--remote-only-ranks 8: not a rank of --world-size 8 (0..=7)"]),
        (
            &["--zero-token-ranks", "1"],
            &["--zero-token-ranks/--remote-only-ranks shape the routing of the host executor (--device cpu) and of the GPU inter-node kernels", "not of --kernel-type intranode"],
        ),
        (
            // Accepted for the GPU inter-node kernels: validation passes and the run stops at
            // its first output file.
            &[
                "--kernel-type", "v1", "--world-size", "2", "--num-nodes", "2", "--zero-token-ranks", "1", "--remote-only-ranks", "0",
                "--json", "/nonexistent-dir/x.json",
            ],
            &["--json /nonexistent-dir/x.json: cannot be written"],
        ),
        (
            &["--kernel-type", "async_ll", "--num-nodes", "2", "--trace", "/nonexistent-dir/t.json"],
            &["--trace /nonexistent-dir/t.json: /nonexistent-dir/t.rank0.json cannot be written"],
        ),
    ];
    for (args, wants) in cases {
        let args = with_small(args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, text) = run(&args);
        assert_eq!(code, 1, "{args:?}: {text}");
        assert!(text.contains("bench_dispatch_combine: error:"), "{args:?}: {text}");
        for want in *wants {
            assert!(text.contains(want), "{args:?}: wanted {want:?} in {text}");
        }
        assert!(!text.contains("rdma_block_num") && !text.contains("no GPU runtime"), "{args:?}: {text}");
    }
}

/// `--kernel-type v1|v1_ll|async_ll --num-nodes 2` on GPUs (v1 also as the default of 2 nodes)
/// passes validation; without a GPU runtime it stops there, with one it runs every rank on GPU 0
/// and checks against the reference.
#[test]
fn inter_node_kernel_types_across_two_nodes_are_accepted_on_gpus() {
    for (kt, extra) in [
        ("async_ll", &[][..]),
        ("async_ll", &["--transport", "tcp", "--lanes", "2"][..]),
        ("v1_ll", &[][..]),
        ("v1_ll", &["--transport", "tcp", "--lanes", "2"][..]),
        ("v1", &[][..]),
        ("", &[][..]),
    ] {
        let mut args = with_small(&["--num-nodes", "2"]);
        if !kt.is_empty() {
            args.extend(["--kernel-type".to_string(), kt.to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, text) = run(&args);
        assert!(!text.contains("not built yet"), "{args:?}: {text}");
        if text.contains("no GPU runtime") {
            assert_eq!(code, 1, "{text}");
        } else {
            assert_eq!(code, 0, "{text}");
            assert!(text.contains("check: OK"), "{text}");
        }
    }
}
