//! `bench_engine` between two "hosts": network namespaces joined by a veth pair, addresses
//! 198.18.0.1/24 (host A, rank 0) and 198.18.0.2/24 (host B, rank 1), from the RFC 2544
//! benchmarking range. Needs root and `ip netns`, so every test is ignored by default;
//! `cargo xtask test` runs them with `--ignored --test-threads=1`:
//!
//! ```text
//! cargo test -p mori-bench --test netns -- --ignored --test-threads=1
//! ```
//!
//! A [`Hosts`] guard deletes both namespaces (which removes the veth pair) and kills whatever
//! still runs in them on drop, also after a failed assertion; every rank runs under a [`Proc`]
//! guard with a deadline.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bench_engine");
const IP_A: &str = "198.18.0.1";
const IP_B: &str = "198.18.0.2";
/// The namespaces are fresh, so the default bootstrap port is free in them.
const PORT: u16 = 18515;

// ------------------------------------------------------------------------------------------
// Two hosts.

/// Two network namespaces joined by a veth pair, deleted on drop.
struct Hosts {
    a: String,
    b: String,
    veth_a: String,
    veth_b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
    }
}

impl Hosts {
    fn new() -> Hosts {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "these tests need root (ip netns); run them as root via cargo xtask test");
        static N: AtomicU32 = AtomicU32::new(0);
        let (pid, n) = (std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        // Interface names have at most 15 characters: "mb" + pid (<= 7 digits) + side + n.
        let h = Hosts {
            a: format!("mori-bench-a-{pid}-{n}"),
            b: format!("mori-bench-b-{pid}-{n}"),
            veth_a: format!("mb{pid}a{n}"),
            veth_b: format!("mb{pid}b{n}"),
        };
        // The guard exists before the first command, so a partial setup is removed too.
        let (a, b, va, vb) = (h.a.as_str(), h.b.as_str(), h.veth_a.as_str(), h.veth_b.as_str());
        let steps: [&[&str]; 11] = [
            &["netns", "add", a],
            &["netns", "add", b],
            &["-n", a, "link", "add", va, "type", "veth", "peer", "name", vb, "netns", b],
            &["-n", a, "addr", "add", "198.18.0.1/24", "dev", va],
            &["-n", b, "addr", "add", "198.18.0.2/24", "dev", vb],
            &["-n", a, "link", "set", "lo", "up"],
            &["-n", b, "link", "set", "lo", "up"],
            &["-n", a, "link", "set", va, "up"],
            &["-n", b, "link", "set", vb, "up"],
            // Both ends up and reachable before any test starts.
            &["netns", "exec", a, "ping", "-c", "1", "-W", "5", IP_B],
            &["netns", "exec", b, "ping", "-c", "1", "-W", "5", IP_A],
        ];
        for (k, s) in steps.iter().enumerate() {
            if let Err(e) = ip(s) {
                // ping may be missing: the link is up anyway, the ranks then retry.
                if k >= 9 && e.contains("No such file") {
                    continue;
                }
                panic!("setting up the two namespaces: {e}");
            }
        }
        h
    }

    /// `bench_engine` run inside namespace `ns`, with a clean environment.
    fn bench(&self, ns: &str, args: &[String]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, BIN]).args(args);
        for k in ["MORI_LOG", "MORI_BENCH_CORRUPT_SLOT", "MORI_BENCH_LOCAL_CHILD_PORT", "MORI_BOOTSTRAP_OP_TIMEOUT", "MORI_SOCKET_IFNAME"] {
            c.env_remove(k);
        }
        c.env("MORI_BOOTSTRAP_TIMEOUT", "30").env("NO_COLOR", "1").env_remove("MORI_IO_TCP_TIMEOUT_MS");
        c
    }

    /// A counter of `iface` in namespace `ns` (`/sys/class/net/<iface>/statistics/<what>`).
    fn counter(&self, ns: &str, iface: &str, what: &str) -> u64 {
        let o =
            Command::new("ip").args(["netns", "exec", ns, "cat", &format!("/sys/class/net/{iface}/statistics/{what}")]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().parse().unwrap_or_else(|_| panic!("{what} of {iface}: {o:?}"))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            // Anything still running in our namespaces was started by this test.
            if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                    // SAFETY: kill(2) on a pid we read from our own namespace.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Child processes with a deadline (as in tests/cli.rs).

struct Proc {
    name: String,
    child: Option<Child>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    deadline: Instant,
}

#[derive(Debug)]
struct Done {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    at: Instant,
}

fn collect(mut r: impl Read + Send + 'static, buf: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            buf.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    })
}

fn strip_ansi(s: &[u8]) -> String {
    let s = String::from_utf8_lossy(s);
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' && it.peek() == Some(&'[') {
            it.next();
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, limit: Duration) -> Proc {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{name}: spawn {cmd:?}: {e}"));
        let out = Arc::new(Mutex::new(Vec::new()));
        let err = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![collect(child.stdout.take().unwrap(), out.clone()), collect(child.stderr.take().unwrap(), err.clone())];
        Proc { name: name.into(), child: Some(child), out, err, readers, deadline: Instant::now() + limit }
    }

    fn snapshot(&self) -> (String, String) {
        (strip_ansi(&self.out.lock().unwrap()), strip_ansi(&self.err.lock().unwrap()))
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_))))
    }

    fn wait(mut self) -> Done {
        let mut child = self.child.take().unwrap();
        let code = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st.code(),
                Ok(None) if Instant::now() < self.deadline => std::thread::sleep(Duration::from_millis(10)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let (o, e) = self.snapshot();
                    panic!("{}: still running at its deadline, killed\n--- stdout\n{o}\n--- stderr\n{e}", self.name);
                }
                Err(e) => panic!("{}: wait: {e}", self.name),
            }
        };
        let at = Instant::now();
        let until = Instant::now() + Duration::from_secs(5);
        for r in std::mem::take(&mut self.readers) {
            while !r.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            if r.is_finished() {
                let _ = r.join();
            }
        }
        let (stdout, stderr) = self.snapshot();
        Done { code, stdout, stderr, at }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Done {
    fn dump(&self) -> String {
        format!("exit {:?}\n--- stdout\n{}\n--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The engine's info log line `engine listening ... host=H port=P`, if present.
fn listens_on(stderr: &str, host: &str, port: u16) -> bool {
    stderr.lines().any(|l| l.contains("engine listening") && l.contains(&format!("host={host}")) && l.contains(&format!("port={port}")))
}

// ------------------------------------------------------------------------------------------

/// A write sweep between the two hosts: validation OK, the engines listen on the veth
/// addresses, and the bytes really crossed the veth. Then again with no `--self-ip` on either
/// rank: the default is the address that routes to the master (198.18.0.2 on host B).
#[test]
#[ignore = "needs root and ip netns; run by cargo xtask test"]
fn two_hosts_write_sweep() {
    let h = Hosts::new();
    let port = PORT.to_string();
    let work = [
        "--master-ip",
        IP_A,
        "--port",
        &port,
        "--op",
        "write",
        "--all",
        "--sweep-start",
        "8",
        "--sweep-max",
        "65536",
        "--transfer-batch-size",
        "4",
        "--iters",
        "5",
        "--warmup-iters",
        "1",
    ];
    // Payload rank 0 sends: every size x batch 4 x (5 + 1) iterations.
    let payload: u64 = (3..=16).map(|k| (1u64 << k) * 4 * 6).sum();

    for explicit in [true, false] {
        let tx0 = h.counter(&h.a, &h.veth_a, "tx_bytes");
        let rx0 = h.counter(&h.b, &h.veth_b, "rx_bytes");
        let mut a1 = strings(&["--rank", "1"]);
        let mut a0 = strings(&["--rank", "0"]);
        if explicit {
            a1.extend(strings(&["--self-ip", IP_B]));
            a0.extend(strings(&["--self-ip", IP_A]));
        }
        a1.extend(strings(&work));
        a0.extend(strings(&work));
        let t = Proc::spawn("rank 1 (host B)", h.bench(&h.b, &a1), Duration::from_secs(60));
        let i = Proc::spawn("rank 0 (host A)", h.bench(&h.a, &a0), Duration::from_secs(60));
        let (d0, d1) = (i.wait(), t.wait());
        let what = if explicit { "with --self-ip" } else { "without --self-ip" };
        assert_eq!(d0.code, Some(0), "rank 0 {what}: {}", d0.dump());
        assert_eq!(d1.code, Some(0), "rank 1 {what}: {}", d1.dump());
        assert!(d0.stdout.contains("validation: OK"), "{what}: {}", d0.dump());
        let rows = d0.stdout.lines().filter(|l| l.split_whitespace().count() == 6).count();
        assert_eq!(rows, 15, "header + 14 rows {what}: {}", d0.stdout);
        assert!(listens_on(&d0.stderr, IP_A, PORT + 1), "rank 0 engine on {IP_A}:{} {what}: {}", PORT + 1, d0.stderr);
        assert!(listens_on(&d1.stderr, IP_B, PORT + 2), "rank 1 engine on {IP_B}:{} {what}: {}", PORT + 2, d1.stderr);
        let (tx, rx) = (h.counter(&h.a, &h.veth_a, "tx_bytes") - tx0, h.counter(&h.b, &h.veth_b, "rx_bytes") - rx0);
        eprintln!("{what}: {payload} B of payload, veth A sent {tx} B, veth B received {rx} B");
        assert!(tx >= payload && rx >= payload, "the payload crossed the veth {what}: tx {tx}, rx {rx}, payload {payload}");
    }
}

/// The veth of host A goes down in the middle of a long write run: rank 0 reports the failed
/// transfer and exits non-zero within data timeout + bootstrap deadline, and rank 1 gives up
/// within its bootstrap deadline. Nobody hangs.
#[test]
#[ignore = "needs root and ip netns; run by cargo xtask test"]
fn link_down_mid_transfer() {
    let h = Hosts::new();
    let port = PORT.to_string();
    // One point of 1 MiB x 8 with a huge iteration count: rank 0 is inside the timed loop
    // (not in a checksum exchange) when the link goes down, so the transfer is what fails.
    // Rank 1 meanwhile waits in the post-point exchange, bounded by its bootstrap deadline.
    let work = [
        "--master-ip",
        IP_A,
        "--port",
        &port,
        "--op",
        "write",
        "--buffer-size",
        "1048576",
        "--transfer-batch-size",
        "8",
        "--iters",
        "1000000",
        "--warmup-iters",
        "1",
    ];
    let env = |mut c: Command| {
        c.env("MORI_IO_TCP_TIMEOUT_MS", "2000").env("MORI_BOOTSTRAP_TIMEOUT", "15").env("MORI_BOOTSTRAP_OP_TIMEOUT", "15");
        c
    };
    let mut a1 = strings(&["--rank", "1", "--self-ip", IP_B]);
    a1.extend(strings(&work));
    let mut a0 = strings(&["--rank", "0", "--self-ip", IP_A]);
    a0.extend(strings(&work));
    let mut t = Proc::spawn("rank 1 (host B)", env(h.bench(&h.b, &a1)), Duration::from_secs(90));
    let mut i = Proc::spawn("rank 0 (host A)", env(h.bench(&h.a, &a0)), Duration::from_secs(90));

    let t0 = Instant::now();
    while !i.snapshot().1.contains("bench_engine: op write") {
        assert!(!i.exited() && t0.elapsed() < Duration::from_secs(30), "rank 0 never started measuring: {:?}", i.snapshot());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!i.exited() && !t.exited(), "the run must still be going when the link goes down");
    ip(&["-n", &h.a, "link", "set", &h.veth_a, "down"]).unwrap();
    let down = Instant::now();

    let d0 = i.wait();
    let d1 = t.wait();
    let (took0, took1) = (d0.at - down, d1.at - down);
    eprintln!("link down -> rank 0 exited after {took0:.2?} (code {:?}), rank 1 after {took1:.2?} (code {:?})", d0.code, d1.code);
    eprintln!("rank 0 error: {}", d0.stderr.lines().filter(|l| l.starts_with("error")).collect::<Vec<_>>().join("\n"));
    eprintln!("rank 1 error: {}", d1.stderr.lines().filter(|l| l.starts_with("error")).collect::<Vec<_>>().join("\n"));

    assert!(matches!(d0.code, Some(c) if c != 0), "rank 0: {}", d0.dump());
    assert!(took0 < Duration::from_secs(20), "rank 0 took {took0:?} after link down");
    assert!(d0.stderr.contains("transfer failed"), "rank 0 names the failed transfer: {}", d0.stderr);
    assert!(!d0.stdout.contains("validation:"), "no result after a failed run: {}", d0.stdout);
    assert!(matches!(d1.code, Some(c) if c != 0), "rank 1: {}", d1.dump());
    assert!(took1 < Duration::from_secs(20), "rank 1 took {took1:?}, past its 15 s bootstrap deadline");
}

// ------------------------------------------------------------------------------------------
// MORI-EP's host implementation across the two hosts.

const EP_BIN: &str = env!("CARGO_BIN_EXE_bench_dispatch_combine");

/// `bench_dispatch_combine --device cpu` launched as torchrun launches upstream's test: one
/// process per rank with `RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`;
/// host A holds node 0 (ranks 0, 1), host B node 1 (ranks 2, 3). Every process checks its
/// ranks against the reference, and the inter-node bytes crossed the veth.
#[test]
#[ignore = "needs root and ip netns; run by cargo xtask test"]
fn ep_two_nodes_on_two_hosts_torchrun_style() {
    let h = Hosts::new();
    for (i, kernel) in ["v1", "async_ll"].into_iter().enumerate() {
        let before = h.counter(&h.b, &h.veth_b, "rx_bytes");
        let port = (PORT + 2 + i as u16).to_string();
        let procs: Vec<Proc> = (0..4)
            .map(|rank| {
                let (ns, ip) = if rank < 2 { (&h.a, IP_A) } else { (&h.b, IP_B) };
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, EP_BIN, "--device", "cpu", "--kernel-type", kernel, "--host", ip]).args([
                    "--num-tokens",
                    "64",
                    "--hidden",
                    "1024",
                    "--num-experts",
                    "32",
                    "--top-k",
                    "4",
                    "--iters",
                    "3",
                    "--warmup",
                    "1",
                    "--timeout-ms",
                    "20000",
                ]);
                for k in [
                    "MORI_RANK",
                    "MORI_WORLD_SIZE",
                    "MORI_MASTER_ADDR",
                    "MORI_MASTER_PORT",
                    "MORI_SOCKET_IFNAME",
                    "TORCHELASTIC_USE_AGENT_STORE",
                ] {
                    c.env_remove(k);
                }
                c.env("RANK", rank.to_string())
                    .env("WORLD_SIZE", "4")
                    .env("LOCAL_WORLD_SIZE", "2")
                    .env("MASTER_ADDR", IP_A)
                    .env("MASTER_PORT", &port);
                Proc::spawn(&format!("{kernel} rank {rank}"), c, Duration::from_secs(120))
            })
            .collect();
        let done: Vec<Done> = procs.into_iter().map(Proc::wait).collect();
        for d in &done {
            assert_eq!(d.code, Some(0), "{kernel}: {}", d.dump());
        }
        let out = &done[0].stdout;
        for p in 0..4 {
            assert!(out.contains(&format!("check (process {p}): OK")), "{kernel}: process {p}: {}", done[0].dump());
        }
        assert!(out.contains("2 node(s) x 2 ranks"), "{out}");
        assert!(out.contains("inter-node: MORI-IO tcp, 4 lanes per peer on 198.18.0.1"), "{out}");
        // Ranks 0 and 1 send 64 tokens x 1 KiB+ rows to node 1 each round (4 rounds).
        let crossed = h.counter(&h.b, &h.veth_b, "rx_bytes") - before;
        assert!(crossed > 4 * 2 * 64 * 1024, "{kernel}: only {crossed} bytes reached host B");
    }
}
