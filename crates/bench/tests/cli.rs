//! End-to-end tests of the `bench_engine` binary on loopback: the `--local` sweeps (table,
//! JSON, plot), two ranks started by hand (flag mismatch, `--skip-validate` on one rank, the
//! test-only corruption hook, the target killed mid-sweep) and the usage errors.
//!
//! Every child runs under a [`Proc`] guard: it has a deadline, and the guard kills and reaps it
//! on drop, so a failing assertion never leaves a rank behind.

use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bench_engine");
const HEADER: [&str; 6] = ["MsgSize(B)", "Batch", "Iters", "AvgBW(GB/s)", "AvgLat(us)", "TotalDur(us)"];
/// Small and quick, for every run that measures.
const QUICK: [&str; 4] = ["--iters", "5", "--warmup-iters", "1"];

// ------------------------------------------------------------------------------------------
// Child processes with a deadline.

/// A running child whose stdout and stderr are collected in the background. Dropping it kills
/// and reaps the child.
struct Proc {
    name: String,
    child: Option<Child>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    deadline: Instant,
}

/// A finished child.
#[derive(Debug)]
struct Done {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// When the exit was observed (polling every 10 ms).
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

/// Removes ANSI colour sequences (the log formatter may colour its output).
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

/// `bench_engine` with a clean, bounded environment.
fn bench(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args);
    for k in [
        "MORI_LOG",
        "MORI_BENCH_CORRUPT_SLOT",
        "MORI_BENCH_CORRUPT_UNTOUCHED",
        "MORI_BENCH_LOCAL_CHILD_PORT",
        "MORI_BENCH_LOCAL_TOKEN",
        "MORI_BENCH_LOCAL_PARENT",
        "MORI_BENCH_CHILD",
        "MORI_IO_TCP_TIMEOUT_MS",
        "MORI_BOOTSTRAP_OP_TIMEOUT",
        "MORI_SOCKET_IFNAME",
    ] {
        c.env_remove(k);
    }
    c.env("MORI_BOOTSTRAP_TIMEOUT", "30").env("NO_COLOR", "1");
    c
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

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// SIGKILL now (the exit is reaped by `wait` or on drop).
    fn sigkill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
        }
    }

    fn snapshot(&self) -> (String, String) {
        (strip_ansi(&self.out.lock().unwrap()), strip_ansi(&self.err.lock().unwrap()))
    }

    /// Waits for the exit; past the deadline the child is killed and the test fails with its
    /// output.
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
        // A grandchild (the --local target) may hold the pipes a little longer.
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
    fn expect_code(&self, code: i32, what: &str) {
        assert_eq!(self.code, Some(code), "{what}: {}", self.dump());
    }
}

fn run(name: &str, args: &[&str], limit: Duration) -> Done {
    Proc::spawn(name, bench(args), limit).wait()
}

// ------------------------------------------------------------------------------------------
// Ports and scratch files.

/// A base port with base, base+1 and base+2 free on loopback (bootstrap, engine 0, engine 1).
/// Chosen below the kernel's ephemeral range, so outgoing connections of concurrent tests do
/// not take it between the check and the use.
fn free_base() -> u16 {
    free_base_n(3)
}

/// A base port with `n` consecutive free ports (as [`free_base`]).
fn free_base_n(n: u16) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..500 {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = 20_000 + (seed.wrapping_add(k.wrapping_mul(7)) % 12_000) as u16;
        if (0..n).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no {n} consecutive free ports found in 20000..32000");
}

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!("mori-bench-cli-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, f: &str) -> String {
        self.0.join(f).to_str().unwrap().to_string()
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ------------------------------------------------------------------------------------------
// Parsing the table and the JSON.

#[derive(Debug, Clone, Copy)]
struct TableRow {
    msg: u64,
    batch: u64,
    iters: u64,
    bw: f64,
    lat: f64,
    total: f64,
}

/// Parses rank 0's stdout: header, rows, then `validation: ...`. Checks the header words and
/// that every row is consistent with the seed's formulas (within the printed rounding).
fn parse_table(stdout: &str) -> (Vec<TableRow>, String) {
    let mut lines = stdout.lines().filter(|l| !l.trim().is_empty());
    let head: Vec<&str> = lines.next().expect("no header line").split_whitespace().collect();
    assert_eq!(head, HEADER, "header line: {stdout}");
    let mut rows = Vec::new();
    let mut validation = None;
    for l in lines {
        if let Some(v) = l.strip_prefix("validation: ") {
            validation = Some(v.to_string());
            break;
        }
        rows.push(parse_row(l, true));
    }
    (rows, validation.unwrap_or_else(|| panic!("no validation line in\n{stdout}")))
}

/// One table row; with `formulas`, checked against the seed's formulas (within the printed
/// rounding).
fn parse_row(l: &str, formulas: bool) -> TableRow {
    let f: Vec<&str> = l.split_whitespace().collect();
    assert_eq!(f.len(), 6, "row {l:?}");
    let r = TableRow {
        msg: f[0].parse().unwrap(),
        batch: f[1].parse().unwrap(),
        iters: f[2].parse().unwrap(),
        bw: f[3].parse().unwrap(),
        lat: f[4].parse().unwrap(),
        total: f[5].parse().unwrap(),
    };
    assert!(r.total > 0.0 && r.lat > 0.0 && r.bw >= 0.0, "row {l:?}");
    if formulas {
        // latency = total / (iters * batch); bandwidth = bytes / 1e9 / seconds = bytes / (us * 1e3).
        let lat = r.total / (r.iters * r.batch) as f64;
        assert!((lat - r.lat).abs() <= 0.006 + lat * 1e-3, "latency {} vs total/(iters*batch) {lat}: {l:?}", r.lat);
        let bw = (r.msg * r.batch * r.iters) as f64 / (r.total * 1e3);
        assert!((bw - r.bw).abs() <= 0.0006 + bw * 1e-3, "bandwidth {} vs formula {bw}: {l:?}", r.bw);
    }
    r
}

/// The lines of `stdout` that start with `prefix` (and a space): a header, then rows (checked
/// against the formulas when `formulas`).
fn prefixed_rows(stdout: &str, prefix: &str, formulas: bool) -> Vec<TableRow> {
    let mut lines = stdout.lines().filter_map(|l| l.strip_prefix(prefix)?.strip_prefix(' '));
    let head: Vec<&str> = lines.next().unwrap_or_else(|| panic!("no {prefix} header in\n{stdout}")).split_whitespace().collect();
    assert_eq!(head, HEADER, "{prefix} header: {stdout}");
    lines.map(|l| parse_row(l, formulas)).collect()
}

/// Checks a several-pair table: `pairs` blocks `[gpu 0]`.. with the sweep's sizes, then
/// `[AGGREGATE]` rows whose bandwidth is the sum of the pairs' (within the printed rounding)
/// and whose total is the longest pair's. Returns the aggregate rows and the validation line.
fn check_pairs(stdout: &str, pairs: u32, msgs: &[u64]) -> (Vec<TableRow>, String) {
    let per: Vec<Vec<TableRow>> = (0..pairs).map(|g| prefixed_rows(stdout, &format!("[gpu {g}]"), true)).collect();
    let agg = prefixed_rows(stdout, "[AGGREGATE]", false);
    assert_eq!(agg.iter().map(|r| r.msg).collect::<Vec<_>>(), msgs, "{stdout}");
    for (k, a) in agg.iter().enumerate() {
        let rows: Vec<&TableRow> = per.iter().map(|p| &p[k]).collect();
        assert!(rows.iter().all(|r| r.msg == a.msg && r.batch == a.batch && r.iters == a.iters), "point {k}: {stdout}");
        let sum: f64 = rows.iter().map(|r| r.bw).sum();
        assert!(a.bw > 0.0 || sum == 0.0, "aggregate of point {k} is zero: {stdout}");
        assert!((a.bw - sum).abs() <= 0.0006 * (pairs as f64 + 1.0), "aggregate {} vs sum {sum} of point {k}: {stdout}", a.bw);
        let longest = rows.iter().map(|r| r.total).fold(0.0, f64::max);
        assert!((a.total - longest).abs() <= 0.051, "aggregate total {} vs longest {longest}: {stdout}", a.total);
    }
    let validation = stdout.lines().find_map(|l| l.strip_prefix("validation: ")).unwrap_or_else(|| panic!("no validation in\n{stdout}"));
    (agg, validation.to_string())
}

fn read_json(path: &str) -> serde_json::Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("--json {path}: {e}"));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("--json {path} is not JSON: {e}\n{s}"))
}

/// Checks the JSON rows against the table rows and that every bandwidth is positive.
fn check_json(doc: &serde_json::Value, table: &[TableRow]) {
    assert_eq!(doc["validation"], "OK", "{doc}");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), table.len());
    for (j, t) in rows.iter().zip(table) {
        for k in ["msg_size", "batch", "iters", "avg_bw_gbps", "avg_lat_us", "total_us"] {
            assert!(j.get(k).is_some_and(|v| v.is_number()), "row lacks {k}: {j}");
        }
        assert_eq!(j["msg_size"].as_u64(), Some(t.msg));
        assert_eq!(j["batch"].as_u64(), Some(t.batch));
        assert_eq!(j["iters"].as_u64(), Some(t.iters));
        let bw = j["avg_bw_gbps"].as_f64().unwrap();
        assert!(bw > 0.0 && bw.is_finite(), "bandwidth must be positive: {j}");
        assert!((bw - t.bw).abs() <= 0.0006, "json {bw} vs table {}", t.bw);
        assert!((j["total_us"].as_f64().unwrap() - t.total).abs() <= 0.051, "{j}");
        assert!((j["avg_lat_us"].as_f64().unwrap() - t.lat).abs() <= 0.0051, "{j}");
    }
}

/// Runs `--local` with `extra` (plus `--json`), checks the table (sizes or batches as expected,
/// 5 iterations each), the JSON, and `validation: OK`.
fn local_sweep(extra: &[&str], msgs: &[u64], batches: &[u64]) -> Vec<TableRow> {
    let dir = TempDir::new("sweep");
    let json = dir.path("rows.json");
    // `--xgmi-single-process` runs both ranks in one process: no --local then.
    let mut args = if extra.contains(&"--xgmi-single-process") { vec![] } else { vec!["--local"] };
    args.extend_from_slice(extra);
    args.extend_from_slice(&QUICK);
    args.extend_from_slice(&["--json", &json]);
    let d = run(&format!("--local {}", extra.join(" ")), &args, Duration::from_secs(40));
    d.expect_code(0, "local sweep");
    let (rows, validation) = parse_table(&d.stdout);
    assert_eq!(validation, "OK", "{}", d.dump());
    assert_eq!(rows.iter().map(|r| r.msg).collect::<Vec<_>>(), msgs, "{}", d.stdout);
    assert_eq!(rows.iter().map(|r| r.batch).collect::<Vec<_>>(), batches, "{}", d.stdout);
    assert!(rows.iter().all(|r| r.iters == 5));
    check_json(&read_json(&json), &rows);
    rows
}

fn sizes_8_to_64k() -> Vec<u64> {
    (3..=16).map(|k| 1u64 << k).collect()
}

const SWEEP_64K: [&str; 7] = ["--all", "--sweep-start", "8", "--sweep-max", "65536", "--transfer-batch-size", "4"];

// ------------------------------------------------------------------------------------------
// --local sweeps.

#[test]
fn local_write_sweep_batch_mode() {
    let mut a = vec!["--op", "write"];
    a.extend_from_slice(&SWEEP_64K);
    let rows = local_sweep(&a, &sizes_8_to_64k(), &[4; 14]);
    assert_eq!(rows.len(), 14);
}

#[test]
fn local_read_sweep_single_transfers() {
    let mut a = vec!["--op", "read", "--disable-batch-transfer"];
    a.extend_from_slice(&SWEEP_64K);
    local_sweep(&a, &sizes_8_to_64k(), &[4; 14]);
}

#[test]
fn single_process_write_sweep() {
    // Both ranks as threads of one process, joined by the in-process bootstrap.
    let mut a = vec!["--op", "write", "--xgmi-single-process"];
    a.extend_from_slice(&SWEEP_64K);
    local_sweep(&a, &sizes_8_to_64k(), &[4; 14]);
}

#[test]
fn local_read_sweep_contiguous_session() {
    let mut a = vec!["--op", "read", "--batch-contiguous", "--enable-sess"];
    a.extend_from_slice(&SWEEP_64K);
    local_sweep(&a, &sizes_8_to_64k(), &[4; 14]);
}

#[test]
fn local_write_batch_sweep() {
    let batches: Vec<u64> = (0..16).map(|k| 1u64 << k).collect();
    let rows = local_sweep(&["--op", "write", "--all-batch", "--buffer-size", "64", "--enable-sess"], &[64; 16], &batches);
    assert_eq!(rows.last().unwrap().batch, 32768);
}

#[test]
fn two_ranks_with_a_bracketed_ipv6_master() {
    // `--master-ip '[::1]'` was "Name or service not known": brackets are accepted wherever an
    // address is, and the engines advertise and dial IPv6 literals.
    let port = free_base().to_string();
    let side = |rank: &str| {
        let mut a = vec!["--rank", rank, "--master-ip", "[::1]", "--self-ip", "[::1]", "--port", &port, "--op", "write"];
        a.extend_from_slice(&SWEEP_64K);
        a.extend_from_slice(&QUICK);
        Proc::spawn(&format!("rank {rank}"), bench(&a), Duration::from_secs(40))
    };
    let t = side("1");
    let i = side("0");
    let (d0, d1) = (i.wait(), t.wait());
    d1.expect_code(0, "rank 1 over [::1]");
    d0.expect_code(0, "rank 0 over [::1]");
    let (rows, validation) = parse_table(&d0.stdout);
    assert_eq!(validation, "OK", "{}", d0.dump());
    assert_eq!(rows.iter().map(|r| r.msg).collect::<Vec<_>>(), sizes_8_to_64k());
}

/// A name in /etc/hosts (not `localhost`) that maps only to loopback addresses: Debian maps the
/// host's own name there (127.0.1.1); these machines map theirs to 127.0.0.1.
fn loopback_alias() -> Option<String> {
    let hosts = std::fs::read_to_string("/etc/hosts").ok()?;
    let mut names: Vec<(String, bool)> = Vec::new();
    for line in hosts.lines().map(|l| l.split('#').next().unwrap_or("")) {
        let mut f = line.split_whitespace();
        let Some(ip) = f.next().and_then(|ip| ip.parse::<std::net::IpAddr>().ok()) else { continue };
        for n in f {
            match names.iter_mut().find(|(m, _)| m == n) {
                Some((_, lo)) => *lo &= ip.is_loopback(),
                None => names.push((n.to_string(), ip.is_loopback())),
            }
        }
    }
    names.into_iter().find(|(n, lo)| *lo && !n.starts_with("localhost") && !n.starts_with("ip6-")).map(|(n, _)| n)
}

#[test]
fn a_master_name_that_resolves_to_loopback_is_refused_at_once() {
    let name = loopback_alias().expect("this rig's /etc/hosts maps a host name (other than localhost) to loopback");
    let t = Instant::now();
    let d = run("loopback master name", &["--rank", "0", "--master-ip", &name, "--port", "18601"], Duration::from_secs(10));
    d.expect_code(2, "a master name resolving to loopback");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}, not at once", t.elapsed());
    for w in
        [format!("--master-ip {name} resolves to 127."), "(loopback only)".to_string(), "127.0.0.1 when both ranks run on this host".into()]
    {
        assert!(d.stderr.contains(&w), "stderr lacks {w:?}: {}", d.stderr);
    }
}

#[test]
fn json_and_plot() {
    let dir = TempDir::new("plot");
    let (json, png) = (dir.path("out.json"), dir.path("p.png"));
    let mut args = vec!["--local", "--op", "write"];
    args.extend_from_slice(&SWEEP_64K);
    args.extend_from_slice(&QUICK);
    args.extend_from_slice(&["--json", &json, "--plot", &png]);
    let d = run("json+plot", &args, Duration::from_secs(40));
    d.expect_code(0, "--json --plot");
    let (rows, validation) = parse_table(&d.stdout);
    assert_eq!(validation, "OK");
    let doc = read_json(&json);
    check_json(&doc, &rows);
    assert_eq!(doc["rows"].as_array().unwrap().len(), 14);
    // The configuration is recorded as the workload flags.
    let cfg = doc["config"].to_string();
    assert!(cfg.contains("--op") && cfg.contains("write") && cfg.contains("--iters"), "config: {cfg}");
    let b = std::fs::read(&png).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert!(b.len() > 5000, "plot is only {} bytes", b.len());
}

#[test]
fn python_spellings_are_accepted() {
    let d = run(
        "python spellings",
        &[
            "--local",
            "--op-type",
            "write",
            "--host",
            "127.0.0.1",
            "--all",
            "--sweep-start-size",
            "8",
            "--sweep-max-size",
            "64",
            "--transfer-batch-size",
            "2",
            "--iters",
            "5",
            "--warmup-iters",
            "1",
        ],
        Duration::from_secs(30),
    );
    d.expect_code(0, "python spellings");
    let (rows, validation) = parse_table(&d.stdout);
    assert_eq!(validation, "OK");
    assert_eq!(rows.iter().map(|r| r.msg).collect::<Vec<_>>(), [8, 16, 32, 64]);
    assert!(d.stderr.contains("op write"), "--op-type write took effect: {}", d.stderr);
}

#[test]
fn help_lists_primary_names() {
    let d = run("--help", &["--help"], Duration::from_secs(10));
    d.expect_code(0, "--help");
    for f in ["--op ", "--master-ip", "--sweep-start", "--sweep-max", "--self-ip", "--port", "--local", "--all-batch", "--skip-validate"] {
        assert!(d.stdout.contains(f), "--help lacks {f}:\n{}", d.stdout);
    }
}

// ------------------------------------------------------------------------------------------
// Several pairs (--num-initiator-dev N): one process per pair member, `[gpu N]` rows and the
// `[AGGREGATE]` lines (host memory over tcp here; the GPU machine runs it with xgmi).

#[test]
fn local_pairs_print_rows_and_aggregate() {
    let dir = TempDir::new("pairs");
    let json = dir.path("rows.json");
    let mut a = vec!["--local", "--num-initiator-dev", "2", "--num-target-dev", "2", "--op", "write", "--json", &json];
    a.extend_from_slice(&SWEEP_64K);
    a.extend_from_slice(&QUICK);
    let d = run("--local two pairs", &a, Duration::from_secs(60));
    d.expect_code(0, "two pairs");
    let (agg, validation) = check_pairs(&d.stdout, 2, &sizes_8_to_64k());
    assert_eq!(validation, "OK", "{}", d.dump());
    assert!(d.stderr.contains("2 pair(s)"), "{}", d.stderr);
    // --json holds the aggregate rows.
    let doc = read_json(&json);
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), agg.len());
    for (j, t) in rows.iter().zip(&agg) {
        assert!((j["avg_bw_gbps"].as_f64().unwrap() - t.bw).abs() <= 0.0006, "{j} vs {t:?}");
    }
}

#[test]
fn local_three_pairs_read() {
    let mut a = vec!["--local", "--num-initiator-dev", "3", "--num-target-dev", "3", "--op", "read", "--enable-sess"];
    a.extend_from_slice(&["--all", "--sweep-start", "1024", "--sweep-max", "4096", "--transfer-batch-size", "2"]);
    a.extend_from_slice(&QUICK);
    let d = run("--local three pairs", &a, Duration::from_secs(60));
    d.expect_code(0, "three pairs");
    let (_, validation) = check_pairs(&d.stdout, 3, &[1024, 2048, 4096]);
    assert_eq!(validation, "OK", "{}", d.dump());
}

#[test]
fn pairs_started_by_hand_report_the_failing_pair() {
    // Each side's first process starts the other process of its side; a corrupted slot on
    // every target (the environment is inherited) is reported with the first pair's GPU.
    let mut a = vec!["--num-initiator-dev", "2", "--num-target-dev", "2", "--op", "write"];
    a.extend_from_slice(&["--all", "--sweep-start", "8", "--sweep-max", "256", "--transfer-batch-size", "4"]);
    a.extend_from_slice(&QUICK);
    let port = free_base_n(5).to_string();
    let spawn = |rank: &str, env: &[(&str, &str)]| {
        let mut c = bench(&["--rank", rank]);
        c.args(pair_args(&port, &a));
        for (k, v) in env {
            c.env(k, v);
        }
        Proc::spawn(&format!("side {rank}"), c, Duration::from_secs(60))
    };
    let t = spawn("1", &[("MORI_BENCH_CORRUPT_SLOT", "2")]);
    let i = spawn("0", &[]);
    let (d0, d1) = (i.wait(), t.wait());
    d0.expect_code(1, "initiators with corrupted targets");
    d1.expect_code(0, "targets");
    let (_, validation) = check_pairs(&d0.stdout, 2, &[8, 16, 32, 64, 128, 256]);
    assert!(validation.starts_with("FAILED: [gpu 0] first mismatching slot 2 (offset 256 B) at message size 8 B, batch 4"), "{validation}");
}

// ------------------------------------------------------------------------------------------
// Usage errors (exit 2, before any rendezvous).

#[test]
fn usage_errors_name_the_flag() {
    let mut cases: Vec<(&[&str], &[&str])> = vec![
        (&["--buffer-size", "18446744073709551615"], &["does not fit in memory"]),
        (&["--port", "0"], &["--port 0", "allowed 1..=65533"]),
        (&["--self-ip", "0.0.0.0"], &["--self-ip", "0.0.0.0", "loopback"]),
        // Every spelling of a wildcard, not only the two literal ones.
        (&["--self-ip", "0"], &["--self-ip \"0\" is a wildcard (0.0.0.0)"]),
        (&["--self-ip", "::0"], &["--self-ip \"::0\" is a wildcard (::)"]),
        (&["--self-ip", "0:0:0:0:0:0:0:0"], &["is a wildcard (::)"]),
        (&["--self-ip", "[::ffff:0.0.0.0]"], &["is a wildcard (::ffff:0.0.0.0)"]),
        // Every rank dials --master-ip: a wildcard there is refused too (it used to wait out
        // the bootstrap budget, or "work" only with both ranks on one host).
        (&["--master-ip", "0"], &["--master-ip \"0\" is a wildcard (0.0.0.0)"]),
        (&["--master-ip", "[::]"], &["--master-ip \"[::]\" is a wildcard (::)"]),
        (&["--master-ip", "::ffff:0.0.0.0", "--rank", "1"], &["is a wildcard (::ffff:0.0.0.0)"]),
        (&["--buffer-size", "0"], &["--buffer-size"]),
        (&["--backend", "fabric"], &["--backend fabric moves GPU memory only", "--mem-type gpu"]),
        (&["--backend", "xgmi"], &["--backend xgmi", "--mem-type gpu"]),
        (&["--mem-type", "gpu"], &["--mem-type gpu", "tcp", "xgmi"]),
        (
            &["--mem-type", "gpu", "--backend", "xgmi", "--gpu", "1", "--dst-gpu", "0", "--target-dev-offset", "1"],
            &["--dst-gpu 0 conflicts"],
        ),
        // The same conflict with --gpu left at its default.
        (
            &["--mem-type", "gpu", "--backend", "xgmi", "--dst-gpu", "1", "--target-dev-offset", "3"],
            &["--dst-gpu 1 conflicts with --target-dev-offset 3 (with --gpu 0, the default, it means offset 1)"],
        ),
        (&["--gpu", "0"], &["--mem-type gpu"]),
        (&["--rank", "2"], &["--rank 2"]),
        (&["--num-initiator-dev", "2"], &["--num-initiator-dev 2 and --num-target-dev 1 must be equal"]),
        (&["--num-initiator-dev", "0", "--num-target-dev", "0"], &["--num-initiator-dev 0", "allowed 1..=64"]),
        (&["--num-initiator-dev", "2", "--num-target-dev", "2", "--xgmi-single-process"], &["--xgmi-single-process", "one pair"]),
        (&["--num-initiator-dev", "4", "--num-target-dev", "4", "--port", "65530"], &["--port 65530", "65531..=65538", "past 65535"]),
    ];
    // Without an RDMA device (this host, CI) the rdma backend is refused at once, saying why.
    if std::fs::read_dir("/sys/class/infiniband").map(|d| d.count() == 0).unwrap_or(true) {
        cases.push((&["--backend", "rdma"], &["--backend rdma", "RDMA"]));
    }
    // Without a GPU runtime (this host, CI) GPU memory is refused at once, saying why.
    if !std::path::Path::new("/dev/nvidiactl").exists() && !std::path::Path::new("/dev/kfd").exists() {
        cases.push((&["--backend", "xgmi", "--mem-type", "gpu"], &["no GPU runtime"]));
    }
    for (args, words) in cases {
        let t = Instant::now();
        let d = run(&args.join(" "), args, Duration::from_secs(10));
        d.expect_code(2, &args.join(" "));
        for w in words {
            assert!(d.stderr.contains(w), "{args:?}: stderr lacks {w:?}: {}", d.stderr);
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{args:?} took {:?}: refused before rendezvous?", t.elapsed());
    }
}

#[test]
fn port_in_use_is_named() {
    let base = free_base();
    let _hold = TcpListener::bind(("127.0.0.1", base)).unwrap();
    let p = base.to_string();
    let mut a = vec!["--rank", "0", "--port", &p, "--op", "write"];
    a.extend_from_slice(&QUICK);
    let d = run("rank 0 on a busy port", &a, Duration::from_secs(20));
    assert!(matches!(d.code, Some(c) if c != 0), "{}", d.dump());
    assert!(d.stderr.contains(&p) && d.stderr.contains("in use"), "stderr names the port {p}: {}", d.stderr);
}

// ------------------------------------------------------------------------------------------
// Two ranks started by hand.

fn pair_args(port: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["--master-ip", "127.0.0.1", "--port", port].iter().map(|s| s.to_string()).collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Starts rank 1 then rank 0 with their own extra flags (and extra env for rank 1).
fn start_pair(r0: &[&str], r1: &[&str], r1_env: &[(&str, &str)], limit: Duration) -> (Proc, Proc) {
    let port = free_base().to_string();
    let mut c1 = bench(&["--rank", "1"]);
    c1.args(pair_args(&port, r1));
    for (k, v) in r1_env {
        c1.env(k, v);
    }
    let t = Proc::spawn("rank 1", c1, limit);
    let mut c0 = bench(&["--rank", "0"]);
    c0.args(pair_args(&port, r0));
    let i = Proc::spawn("rank 0", c0, limit);
    (i, t)
}

#[test]
fn mismatched_flags_stop_both_ranks() {
    let (i, t) = start_pair(
        &["--op", "write", "--iters", "5", "--warmup-iters", "1"],
        &["--op", "read", "--iters", "7", "--warmup-iters", "1"],
        &[],
        Duration::from_secs(30),
    );
    let (d0, d1) = (i.wait(), t.wait());
    for (d, who) in [(&d0, "rank 0"), (&d1, "rank 1")] {
        d.expect_code(2, who);
        for w in ["--iters: rank 0 = 5, rank 1 = 7", "--op: rank 0 = write, rank 1 = read"] {
            assert!(d.stderr.contains(w), "{who} stderr lacks {w:?}: {}", d.stderr);
        }
        assert!(!d.stderr.contains("--buffer-size:"), "only differing flags are listed: {}", d.stderr);
    }
    assert!(d0.stdout.is_empty(), "no table on a mismatch: {}", d0.stdout);
}

#[test]
fn skip_validate_on_one_rank() {
    let mut a = vec!["--op", "write", "--all", "--sweep-start", "8", "--sweep-max", "1024", "--transfer-batch-size", "4"];
    a.extend_from_slice(&QUICK);
    let mut a1 = a.clone();
    a1.push("--skip-validate");
    let (i, t) = start_pair(&a, &a1, &[], Duration::from_secs(30));
    let (d0, d1) = (i.wait(), t.wait());
    d0.expect_code(0, "rank 0");
    d1.expect_code(0, "rank 1");
    let (rows, validation) = parse_table(&d0.stdout);
    assert_eq!(validation, "skipped");
    assert_eq!(rows.len(), 8);
}

#[test]
fn corrupted_slot_is_reported() {
    let mut a = vec!["--op", "write", "--all", "--sweep-start", "8", "--sweep-max", "256", "--transfer-batch-size", "4"];
    a.extend_from_slice(&QUICK);
    let (i, t) = start_pair(&a, &a, &[("MORI_BENCH_CORRUPT_SLOT", "2")], Duration::from_secs(30));
    let (d0, d1) = (i.wait(), t.wait());
    d0.expect_code(1, "rank 0 with a corrupted slot on rank 1");
    d1.expect_code(0, "rank 1");
    let (rows, validation) = parse_table(&d0.stdout);
    assert_eq!(rows.len(), 6, "the table is still printed");
    // Slot 2 of the first point (8 B messages, stride 128 B) starts at byte 256.
    assert!(validation.starts_with("FAILED: first mismatching slot 2 (offset 256 B) at message size 8 B, batch 4"), "{validation}");
}

#[test]
fn target_killed_mid_sweep() {
    let mut a = vec!["--op", "write", "--all", "--sweep-start", "65536", "--sweep-max", "262144"];
    a.extend_from_slice(&["--transfer-batch-size", "16", "--iters", "1000000", "--warmup-iters", "1"]);
    let port = free_base().to_string();
    let spawn = |rank: &str| {
        let mut c = bench(&["--rank", rank]);
        c.args(pair_args(&port, &a)).env("MORI_IO_TCP_TIMEOUT_MS", "3000");
        Proc::spawn(&format!("rank {rank}"), c, Duration::from_secs(30))
    };
    let mut t = spawn("1");
    let i = spawn("0");
    // Wait until rank 0 is measuring (it prints its configuration line), then one more second.
    let t0 = Instant::now();
    while !i.snapshot().1.contains("bench_engine: op write") {
        assert!(t0.elapsed() < Duration::from_secs(20), "rank 0 never started measuring: {:?}", i.snapshot());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    let pid = t.pid();
    t.sigkill();
    let killed = Instant::now();
    let d = i.wait();
    let took = d.at - killed;
    eprintln!("rank 0 exited {took:?} after SIGKILL of rank 1 (pid {pid})");
    d.expect_code(1, "rank 0 after its target was killed");
    assert!(took < Duration::from_secs(10), "rank 0 took {took:?}");
    assert!(
        d.stderr.contains("transfer failed at message size") && d.stderr.contains("RemoteDisconnect"),
        "stderr names the failed transfer and RemoteDisconnect: {}",
        d.stderr
    );
    assert!(d.stdout.is_empty(), "no table after a failed run: {}", d.stdout);
}
