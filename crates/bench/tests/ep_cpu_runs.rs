//! `bench_dispatch_combine --device cpu --local`: the host implementation as one process per
//! rank (or several ranks per process) on loopback, checked bit for bit against the host
//! reference by the bench itself; a killed rank is named by every other process in time.

use std::process::Command;
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> (i32, String, Duration) {
    run_env(args, &[])
}

fn run_env(args: &[&str], vars: &[(&str, &str)]) -> (i32, String, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_bench_dispatch_combine"))
        .envs(vars.iter().copied())
        .args(["--device", "cpu", "--local", "--iters", "2", "--warmup", "1"])
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MORI_RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .output()
        .expect("spawn bench_dispatch_combine");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text, t.elapsed())
}

/// The run succeeded, every process's check passed, and every rank printed its seed line.
fn passes(args: &[&str], procs: usize, world: usize) -> String {
    let (code, text, _) = run(args);
    assert_eq!(code, 0, "{args:?}: {text}");
    for p in 0..procs {
        assert!(
            text.contains(&format!(
                "check (process {p}): OK (dispatch rows, weights, scales, indices, sources; combine output and weights; bit-exact)"
            )),
            "{args:?}: process {p}: {text}"
        );
    }
    for r in 0..world {
        assert!(text.contains(&format!("rank {r} recv ")), "{args:?}: rank {r}: {text}");
    }
    text
}

const SMALL: &[&str] = &["--num-tokens", "24", "--hidden", "256", "--num-experts", "32", "--top-k", "4"];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    SMALL.iter().chain(extra).copied().collect()
}

#[test]
fn two_nodes_of_four_v1_fp8_one_process_per_rank() {
    let t = passes(&with(&["--world-size", "8", "--num-nodes", "2", "--kernel-type", "v1", "--dtype", "fp8"]), 8, 8);
    assert!(t.contains("mori_ep::host: V1, 2 node(s) x 4 ranks"), "{t}");
    assert!(t.contains("inter-node: MORI-IO tcp, 4 lanes per peer"), "{t}");
    // 24 tokens, top-4 over 2 nodes with DeepEP's grouped routing (2 groups): every token
    // reaches both nodes, so each rank counts 48 algo RDMA tokens.
    assert!(t.contains("rank 0 recv") && t.contains(" tokens 48 rdma tokens"), "{t}");
}

#[test]
fn remote_only_ranks_send_every_token_off_node_only() {
    // Ranks 0 and 3 route every token to the other node: 24 algo RDMA tokens (one node each);
    // the others keep DeepEP's routing, most tokens reaching both nodes (more than 24).
    let t = passes(&with(&["--world-size", "4", "--num-nodes", "2", "--kernel-type", "v1", "--remote-only-ranks", "0,3"]), 4, 4);
    let algo = |r: usize| -> u64 {
        let l = t.lines().find(|l| l.starts_with(&format!("rank {r} recv "))).unwrap_or_else(|| panic!("rank {r}: {t}"));
        l.trim_end_matches(" rdma tokens").rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{l}"))
    };
    assert_eq!((algo(0), algo(3)), (24, 24), "{t}");
    assert!(algo(1) > 24 && algo(2) > 24, "{t}");
    let (code, text, _) = run(&with(&["--world-size", "4", "--remote-only-ranks", "0"]));
    assert_ne!(code, 0);
    assert!(text.contains("--remote-only-ranks with one node"), "{text}");
    // More picks than the other nodes' experts: refused while checking the flags, once, before
    // any rank process starts.
    let (code, text, _) = run(&[
        "--num-tokens",
        "8",
        "--hidden",
        "256",
        "--num-experts",
        "8",
        "--top-k",
        "5",
        "--world-size",
        "4",
        "--num-nodes",
        "2",
        "--kernel-type",
        "v1",
        "--remote-only-ranks",
        "0",
    ]);
    assert_ne!(code, 0);
    assert_eq!(text.matches("--remote-only-ranks with --top-k 5: the other nodes hold 4 of the 8 experts").count(), 1, "{text}");
    assert!(!text.contains("exited with"), "no rank process started: {text}");
}

#[test]
fn inputs_too_large_for_the_host_are_refused_before_anything_starts() {
    // 8 processes x every rank's f32 inputs (8 x 1e6 x 7168 x 4 B = 229 GB each): refused up
    // front with the figures, not an allocation abort.
    let (code, text, took) = run(&["--world-size", "8", "--num-nodes", "2", "--num-tokens", "1000000", "--hidden", "7168"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("at least 230.1 GB, x 8 process(es) on this host = 1841.2 GB >") && text.contains("MemAvailable"), "{text}");
    assert!(!text.contains("memory allocation"), "{text}");
    assert!(took < Duration::from_secs(10), "refused in {took:?}");
}

#[test]
fn four_nodes_of_two_async_ll_two_ranks_per_process_zero_token_ranks_and_none_rows() {
    passes(
        &with(&[
            "--world-size",
            "8",
            "--num-nodes",
            "4",
            "--ranks-per-proc",
            "2",
            "--kernel-type",
            "async_ll",
            "--dtype",
            "bf16",
            "--idx-type",
            "i32",
            "--weighted",
            "--zero-token-ranks",
            "1,6",
            "--none-rows-every",
            "3",
            "--lanes",
            "2",
        ]),
        4,
        8,
    );
}

/// Weighted V1 and V1-LL with bf16 combine inputs: the relays' partials cross to the other
/// node in bf16, which the bench's check expects (`SumOrder::PerNodeRounded`; with the order
/// of f32 partials it reports a mismatch).
#[test]
fn weighted_v1_and_v1_ll_with_bf16_partials() {
    for kt in ["v1", "v1_ll"] {
        passes(&with(&["--world-size", "4", "--num-nodes", "2", "--kernel-type", kt, "--dtype", "bf16", "--weighted"]), 4, 4);
    }
}

#[test]
fn v1_ll_with_proxy_delays_and_reordering() {
    passes(
        &with(&[
            "--world-size",
            "4",
            "--num-nodes",
            "2",
            "--kernel-type",
            "v1_ll",
            "--dtype",
            "fp8",
            "--lanes",
            "8",
            "--inject-delay-us",
            "400",
            "--inject-reorder",
            "--combine-dtype",
            "f32",
        ]),
        4,
        4,
    );
}

/// Whether `line` names EP rank `r`: "rank r" as a whole number, or in a "ranks [..]" list.
fn names_rank(line: &str, r: usize) -> bool {
    let whole = |at: usize, len: usize| !line[at + len..].starts_with(|c: char| c.is_ascii_digit());
    let single = format!("rank {r}");
    line.match_indices(&single).any(|(at, m)| whole(at, m.len()))
        || line.match_indices("ranks [").any(|(at, m)| {
            let rest = &line[at + m.len()..];
            rest[..rest.find(']').unwrap_or(0)].split(", ").any(|x| x == r.to_string())
        })
}

#[test]
fn a_killed_rank_is_named_by_every_other_process_within_the_deadline() {
    // Rank 2 dies inside its second dispatch, before issuing its puts, while the others are in
    // theirs, which therefore cannot complete: the write failure / lost connection / abort word
    // path, not a bootstrap barrier.
    let (code, text, took) =
        run(&with(&["--world-size", "4", "--num-nodes", "2", "--kernel-type", "v1", "--inject-kill-rank", "2", "--timeout-ms", "3000"]));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("process 2 (EP rank 2) (pid ") && text.contains("exited with signal: 9 (SIGKILL)"), "{text}");
    for p in [0, 1, 3] {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("error: process {p} (ranks {p}..{})", p + 1)))
            .unwrap_or_else(|| panic!("process {p}: {text}"));
        assert!(names_rank(line, 2), "process {p} does not name rank 2: {line}\n{text}");
        assert!(
            (line.contains(": dispatch") || line.contains("inter-node write to rank 2 failed")) && !line.contains("bootstrap"),
            "process {p} failed outside dispatch: {line}\n{text}"
        );
    }
    assert!(took < Duration::from_secs(10), "took {took:?}: {text}");
}

#[test]
fn a_process_lost_in_setup_is_named_with_its_ep_ranks_and_its_windows_removed() {
    let job = format!("{:x}", 0x7e57_0000_0000u64 | u64::from(std::process::id()));
    let (code, text, took) = run_env(
        &with(&[
            "--world-size",
            "8",
            "--num-nodes",
            "4",
            "--ranks-per-proc",
            "2",
            "--inject-kill-rank",
            "5",
            "--inject-kill-at",
            "setup",
            "--timeout-ms",
            "3000",
        ]),
        &[("MORI_EP_JOB", &job)],
    );
    assert_eq!(code, 1, "{text}");
    for p in [0, 1, 3] {
        let line = text.lines().find(|l| l.contains(&format!("error: process {p} "))).unwrap_or_else(|| panic!("process {p}: {text}"));
        // Where a survivor notices depends on how far its own setup got: at the barrier after
        // mapping the windows (every process's EP ranks known), or, under load, still in the
        // descriptor allgather (only its own known: "process 2" without its ranks).
        assert!(
            line.contains("bootstrap barrier after mapping the windows: process 2 (EP ranks 4, 5) was lost during barrier")
                || line.contains("bootstrap allgather of descriptors: process 2 was lost"),
            "{line}"
        );
        assert!(!line.contains("rank 2 was lost"), "{line}");
    }
    // Process 2 died with its windows (ranks 4 and 5) created and not unlinked: the parent
    // removed them once the children exited.
    let prefix = format!("mori-ep-{:0>16}-r", job);
    assert!(text.contains(&format!("removed 2 window(s) the job left in /dev/shm: {prefix}4, {prefix}5")), "{text}");
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {text}");
}

#[test]
fn a_dead_or_hung_process_ends_the_local_job_and_is_named() {
    // Dead before joining the bootstrap: the job ends at once (not after the 60 s rendezvous),
    // the others killed and named.
    let (code, text, took) =
        run(&with(&["--world-size", "4", "--num-nodes", "2", "--inject-kill-rank", "2", "--inject-kill-at", "bootstrap"]));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("process 2 (EP rank 2) (pid ") && text.contains("exited with signal: 9 (SIGKILL) before the bootstrap completed"),
        "{text}"
    );
    for p in [1, 3] {
        assert!(text.contains(&format!("killed process {p} (EP rank {p}) (pid ")), "process {p}: {text}");
    }
    assert!(took < Duration::from_secs(5), "took {took:?}: {text}");
    // Stopped inside its second dispatch: the others time out after --timeout-ms, naming the
    // missing writers without calling them failed; the parent kills it after --timeout-ms + 2 s.
    let (code, text, took) = run(&with(&[
        "--world-size",
        "4",
        "--num-nodes",
        "2",
        "--inject-kill-rank",
        "3",
        "--inject-kill-at",
        "stop-in-dispatch",
        "--timeout-ms",
        "1000",
    ]));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("killed process 3 (EP rank 3) (pid ") && text.contains("still running 3.0 s after"), "{text}");
    assert!(!text.contains("rank 3 failed"), "a stopped rank is not seen to fail: {text}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {text}");
}

#[test]
fn bad_lanes_kill_rank_and_fp8_hidden_are_refused_once_before_any_process_starts() {
    let cases: [(&[&str], &str); 4] = [
        (&["--world-size", "8", "--num-nodes", "2", "--lanes", "65"], "error: --lanes 65: the inter-node leg takes 1..=64 TCP lanes per peer"),
        (&["--world-size", "8", "--num-nodes", "2", "--inject-kill-rank", "8"], "error: --inject-kill-rank 8: not a rank of --world-size 8 (0..=7)"),
        (
            &["--world-size", "8", "--num-nodes", "2", "--num-experts", "32", "--top-k", "4", "--num-tokens", "40", "--hidden", "264", "--dtype", "fp8"],
            "error: --hidden 264 with --dtype fp8: a row is 264 elements x 1 B = 264 B, not a multiple of 16 B (rows move as 16-byte vectors); give --hidden a multiple of 16",
        ),
        (&["--world-size", "4", "--num-nodes", "2", "--hidden", "260", "--dtype", "bf16"], "--hidden 260 with --dtype bf16: a row is 260 elements x 2 B = 520 B"),
    ];
    for (args, want) in cases {
        let (code, text, took) = run(args);
        assert_eq!(code, 1, "{args:?}: {text}");
        assert_eq!(text.matches(want).count(), 1, "{args:?}: once, from the parent alone: {text}");
        assert_eq!(text.matches("error:").count(), 1, "{args:?}: {text}");
        assert!(!text.contains("num-qp-per-transfer") && !text.contains("MISMATCH"), "{args:?}: {text}");
        assert!(took < Duration::from_secs(5), "{args:?}: refused in {took:?}");
    }
}

#[test]
fn sigint_to_the_process_group_during_setup_leaves_no_window() {
    use std::os::unix::process::CommandExt;
    let job = format!("{:x}", 0x5161_0000_0000u64 | u64::from(std::process::id()));
    let prefix = format!("mori-ep-{job:0>16}-r");
    let ours = || -> Vec<String> {
        std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect()
    };
    // The windows exist between their creation and the unlink after the setup barrier; a
    // loaded machine can run a whole setup between two polls, so a run in which none was seen
    // is ended and retried (at most 3 runs).
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_bench_dispatch_combine"))
            .args(["--device", "cpu", "--local", "--world-size", "8", "--num-nodes", "2", "--num-tokens", "256", "--hidden", "7168"])
            .args(["--num-experts", "32", "--top-k", "4", "--iters", "2", "--warmup", "1"])
            .env("MORI_EP_JOB", &job)
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .process_group(0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut attempt = 0;
    let (mut child, pg) = loop {
        attempt += 1;
        let mut child = spawn();
        let pg = child.id() as i32;
        let t = Instant::now();
        while ours().is_empty() && t.elapsed() < Duration::from_secs(20) && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_micros(200));
        }
        if !ours().is_empty() {
            break (child, pg);
        }
        // SAFETY: killing the test's own child process group.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
        let _ = child.wait();
        assert!(attempt < 3, "no window of job {job} appeared in 3 runs");
    };
    // SAFETY: signalling the test's own child process group.
    unsafe { libc::kill(-pg, libc::SIGINT) };
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(10) {
            // SAFETY: as above.
            unsafe { libc::kill(-pg, libc::SIGKILL) };
            panic!("not ended 10 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert_eq!(ours(), Vec::<String>::new(), "{err}");
}
