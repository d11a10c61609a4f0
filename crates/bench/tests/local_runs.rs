//! `bench_engine --local` runs side by side on one machine: each holds its own bootstrap
//! port (listening before its children start), its engines take ports the kernel picks, and a process carrying another run's token
//! (or none) is refused at rendezvous. Every process has a deadline and is killed on drop.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bench_engine");
const SMALL: [&str; 8] = ["--buffer-size", "64", "--transfer-batch-size", "2", "--iters", "3", "--warmup-iters", "1"];

/// `bench_engine ARGS` with every MORI_* variable of the caller removed.
fn bench(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("MORI_")) {
        c.env_remove(k);
    }
    c.env("MORI_BOOTSTRAP_TIMEOUT", "30").env("NO_COLOR", "1");
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// A child killed and reaped on drop.
struct Proc(Option<Child>);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Done {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Done {
    fn dump(&self) -> String {
        format!("exit {:?}\n--- stdout\n{}\n--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

fn spawn(mut c: Command) -> Proc {
    Proc(Some(c.spawn().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"))))
}

/// Waits for the exit until `deadline` (then kills it and fails), reading both pipes in
/// threads so a full pipe never blocks the child.
fn wait(mut p: Proc, name: &str, deadline: Instant) -> Done {
    let mut child = p.0.take().unwrap();
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = pipe(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = pipe(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let code = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.code(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{name}: still running at its deadline, killed");
            }
        }
    };
    Done { code, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

/// A port P with P and P + 1 free (rank 0's bootstrap and engine when started by hand), below
/// the kernel's ephemeral range so that the outgoing connections of the other tests do not
/// take it between the check and the use.
fn free_pair_below_ephemeral() -> u16 {
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    (0..500u32)
        .map(|k| 20_000 + (seed.wrapping_add(k.wrapping_mul(7919)) % 12_000) as u16)
        .find(|&p| (0..2).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()))
        .expect("no two free consecutive ports in 20000..32000")
}

#[test]
fn thirty_two_local_runs_at_once_all_validate() {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(60);
    let mut args = vec!["--local", "--op", "write"];
    args.extend_from_slice(&SMALL);
    let procs: Vec<Proc> = (0..32).map(|_| spawn(bench(&args))).collect();
    let done: Vec<Done> = procs.into_iter().enumerate().map(|(i, p)| wait(p, &format!("run {i}"), deadline)).collect();
    let failed: Vec<String> = done
        .iter()
        .enumerate()
        .filter(|(_, d)| d.code != Some(0) || !d.stdout.lines().any(|l| l == "validation: OK"))
        .map(|(i, d)| format!("run {i}: {}", d.dump()))
        .collect();
    assert!(failed.is_empty(), "{} of 32 runs failed:\n{}", failed.len(), failed.join("\n"));
    for d in &done {
        // One row: 64 B, batch 2, 3 iterations.
        let row: Vec<&str> = d.stdout.lines().find(|l| l.trim_start().starts_with("64 ")).unwrap_or_default().split_whitespace().collect();
        assert_eq!(row[..3], ["64", "2", "3"], "{}", d.dump());
    }
    assert!(t0.elapsed() < Duration::from_secs(60), "took {:?}", t0.elapsed());
}

/// Eight `--local` runs given one `--port`: the one whose parent holds the port validates, the
/// others stop at once naming the port, before any child of theirs could join the winner
/// (which used to fail too: a loser's child had dialled its root).
#[test]
fn local_runs_sharing_a_port_fail_cleanly_and_the_holder_validates() {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(60);
    let port = free_pair_below_ephemeral().to_string();
    let mut args = vec!["--local", "--op", "write", "--port", &port];
    args.extend_from_slice(&SMALL);
    let procs: Vec<Proc> = (0..8).map(|_| spawn(bench(&args))).collect();
    let done: Vec<Done> = procs.into_iter().enumerate().map(|(i, p)| wait(p, &format!("run {i}"), deadline)).collect();
    let ok = done.iter().filter(|d| d.code == Some(0) && d.stdout.lines().any(|l| l == "validation: OK")).count();
    let in_use =
        done.iter().filter(|d| d.code == Some(2) && d.stderr.contains("in use") && d.stderr.contains("pick another --port")).count();
    let all: Vec<String> = done.iter().map(Done::dump).collect();
    assert!(ok >= 1, "no run validated:\n{}", all.join("\n"));
    assert_eq!(ok + in_use, 8, "every run either validated or was refused for the port:\n{}", all.join("\n"));
}

/// A process posing as a `--local` child (another run's token) against a rank 0 started by
/// hand (no token): both stop at rendezvous, naming the tokens, before any transfer.
#[test]
fn a_process_of_another_run_is_refused_at_rendezvous() {
    let deadline = Instant::now() + Duration::from_secs(40);
    let port = free_pair_below_ephemeral().to_string();
    let mut r0 = vec!["--rank", "0", "--port", &port, "--op", "write"];
    r0.extend_from_slice(&SMALL);
    let mut c1 = bench(&["--local", "--op", "write"]);
    c1.args(SMALL)
        .env("MORI_BENCH_CHILD", "1:0")
        .env("MORI_BENCH_LOCAL_CHILD_PORT", &port)
        .env("MORI_BENCH_LOCAL_TOKEN", "00000000deadbeef")
        .env("MORI_BENCH_LOCAL_PARENT", std::process::id().to_string());
    let (p0, p1) = (spawn(bench(&r0)), spawn(c1));
    let (d0, d1) = (wait(p0, "rank 0", deadline), wait(p1, "stray child", deadline));
    assert!(matches!(d0.code, Some(c) if c != 0), "rank 0: {}", d0.dump());
    assert!(matches!(d1.code, Some(c) if c != 0), "stray child: {}", d1.dump());
    assert!(
        d0.stderr
            .contains("rank 1 belongs to another bench_engine run (token 00000000deadbeef; rank 0 has no token (not started by --local))"),
        "rank 0: {}",
        d0.dump()
    );
    assert!(d1.stderr.contains("rank 0 belongs to another bench_engine run (no token"), "stray child: {}", d1.dump());
    assert!(d1.stderr.contains("rank 1 has token 00000000deadbeef"), "stray child: {}", d1.dump());
    assert!(!d0.stdout.contains("validation"), "rank 0 measured: {}", d0.dump());
}

/// A `--local` child whose parent is not the pid it was given, or without its token, refuses
/// to start.
#[test]
fn a_child_checks_its_parent_and_token() {
    let deadline = Instant::now() + Duration::from_secs(20);
    let child = |env: &[(&str, &str)]| {
        let mut c = bench(&["--local"]);
        c.env("MORI_BENCH_CHILD", "1:0").env("MORI_BENCH_LOCAL_CHILD_PORT", "1");
        for (k, v) in env {
            c.env(k, v);
        }
        wait(spawn(c), "child", deadline)
    };
    let me = std::process::id().to_string();
    let d = child(&[("MORI_BENCH_LOCAL_TOKEN", "00000000deadbeef"), ("MORI_BENCH_LOCAL_PARENT", "1")]);
    assert_eq!(d.code, Some(2), "{}", d.dump());
    assert!(d.stderr.contains(&format!("the --local parent (pid 1) is gone (the parent is now pid {me})")), "{}", d.dump());
    let d = child(&[("MORI_BENCH_LOCAL_PARENT", &me)]);
    assert_eq!(d.code, Some(2), "{}", d.dump());
    assert!(d.stderr.contains("MORI_BENCH_CHILD is set with --local but MORI_BENCH_LOCAL_TOKEN is not"), "{}", d.dump());
    let d = child(&[("MORI_BENCH_LOCAL_TOKEN", "nothex"), ("MORI_BENCH_LOCAL_PARENT", &me)]);
    assert_eq!(d.code, Some(2), "{}", d.dump());
    assert!(d.stderr.contains("MORI_BENCH_LOCAL_TOKEN=\"nothex\": expected 16 hex digits"), "{}", d.dump());
}
