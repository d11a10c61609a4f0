//! End-to-end tests of `bench_engine --paged` on loopback (tcp, host memory): the row, the
//! paged and contiguous lines and the JSON of a read and a write; a corrupted moved block and
//! a corrupted untouched block named in the validation line; differing paged flags stopping
//! both ranks. Every child has a deadline and is killed and reaped on drop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bench_engine");

/// A scratch directory removed on drop.
struct Scratch(PathBuf);
impl Scratch {
    fn new(tag: &str) -> Scratch {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!("mori-paged-cli-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn file(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child whose stdout and stderr go to files; killed and reaped on drop.
struct Proc {
    child: Option<Child>,
    dir: Scratch,
    deadline: Instant,
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

fn spawn(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Proc {
    let dir = Scratch::new("proc");
    let mut c = Command::new(BIN);
    c.args(args);
    for k in ["MORI_LOG", "MORI_BENCH_CORRUPT_SLOT", "MORI_BENCH_CORRUPT_UNTOUCHED", "MORI_BENCH_CHILD", "MORI_IO_TCP_TIMEOUT_MS"] {
        c.env_remove(k);
    }
    c.env("MORI_BOOTSTRAP_TIMEOUT", "30").env("NO_COLOR", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = std::fs::File::create(dir.file("out")).unwrap();
    let err = std::fs::File::create(dir.file("err")).unwrap();
    let child = c.stdin(Stdio::null()).stdout(out).stderr(err).spawn().unwrap();
    Proc { child: Some(child), dir, deadline: Instant::now() + limit }
}

impl Proc {
    fn wait(mut self) -> Done {
        let mut child = self.child.take().unwrap();
        let code = loop {
            match child.try_wait().unwrap() {
                Some(st) => break st.code(),
                None if Instant::now() < self.deadline => std::thread::sleep(Duration::from_millis(10)),
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("still running at its deadline, killed: {}", std::fs::read_to_string(self.dir.file("err")).unwrap_or_default());
                }
            }
        };
        // A --local target (a grandchild) may still write a little.
        std::thread::sleep(Duration::from_millis(50));
        let read = |f: &str| std::fs::read_to_string(self.dir.file(f)).unwrap_or_default();
        Done { code, stdout: read("out"), stderr: read("err") }
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

fn run(args: &[&str], env: &[(&str, &str)]) -> Done {
    spawn(args, env, Duration::from_secs(60)).wait()
}

/// 3 layers x 2 halves x 12 blocks of 4 KiB, pools of 24 blocks.
const SHAPE: [&str; 7] = ["--paged", "--block-size", "4096", "--num-blocks", "12", "--layers", "3"];
const QUICK: [&str; 4] = ["--iters", "4", "--warmup-iters", "1"];

fn local(extra: &[&str], env: &[(&str, &str)]) -> Done {
    let args: Vec<&str> = [&["--local", "--log-level", "error"][..], &SHAPE, &QUICK, extra].concat();
    run(&args, env)
}

/// The value after `key` in `line` (up to the next space, comma or semicolon).
fn after<'a>(line: &'a str, key: &str) -> &'a str {
    let i = line.find(key).unwrap_or_else(|| panic!("{key:?} not in {line:?}")) + key.len();
    line[i..].split([' ', ',', ';']).next().unwrap()
}

#[test]
fn local_paged_read_and_write_report_and_validate() {
    for (op, sess) in [("write", false), ("read", true)] {
        let dir = Scratch::new("json");
        let json = dir.file("rows.json");
        let mut extra = vec!["--op", op, "--json", json.to_str().unwrap()];
        if sess {
            extra.push("--enable-sess");
        }
        let d = local(&extra, &[]);
        assert_eq!(d.code, Some(0), "{}", d.dump());
        let lines: Vec<&str> = d.stdout.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["MsgSize(B)", "Batch", "Iters", "AvgBW(GB/s)", "AvgLat(us)", "TotalDur(us)"]
        );
        let row: Vec<f64> = lines[1].split_whitespace().map(|f| f.parse().unwrap()).collect();
        assert_eq!(&row[..3], &[4096.0, 72.0, 4.0], "block size, 3 x 2 x 12 blocks, iterations: {}", d.stdout);
        // Bandwidth = bytes / 1e9 / seconds, from the printed total.
        let bw = 4096.0 * 72.0 * 4.0 / (row[5] * 1e3);
        assert!((bw - row[3]).abs() <= 0.0006 + bw * 1e-3, "{}", d.stdout);
        let paged = lines[2];
        assert!(paged.starts_with("paged: 72 blocks (3 layers x 2 halves x 12 table entries; "), "{paged}");
        assert!(paged.contains(" of 4096 B = 294912 B per transfer: "), "{paged}");
        let gbps: f64 = after(paged, "per transfer: ").parse().unwrap();
        assert!((gbps - row[3]).abs() < 0.0011, "the line and the row agree: {}", d.stdout);
        assert!(lines[3].starts_with("contiguous: 1 entry of 294912 B per transfer: "), "{}", lines[3]);
        let cg: f64 = after(lines[3], "per transfer: ").parse().unwrap();
        let ratio: f64 = lines[4].strip_prefix("paged/contiguous: ").unwrap().parse().unwrap();
        assert!(cg > 0.0 && ratio > 0.0 && (ratio - gbps / cg).abs() < 0.01 + ratio * 0.01, "{}", d.stdout);
        assert_eq!(lines[5], "validation: OK", "{}", d.dump());
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let p = &doc["paged"];
        assert_eq!(
            (p["blocks_moved"].as_u64(), p["block_size"].as_u64(), p["bytes_per_transfer"].as_u64()),
            (Some(72), Some(4096), Some(294912))
        );
        assert_eq!((p["table_entries"].as_u64(), p["pool_blocks"].as_u64(), p["halves"].as_u64()), (Some(12), Some(24), Some(2)));
        assert!(p["contiguous"]["gbps"].as_f64().unwrap() > 0.0 && p["copy"].is_null(), "{doc}");
        assert_eq!(doc["rows"][0]["batch"].as_u64(), Some(72));
        assert!(d.stderr.contains(&format!("session {sess}")), "{}", d.stderr);
    }
}

#[test]
fn corrupted_blocks_are_named() {
    // Entry 30 of the stream: layer 1, half 0, block table entry 6.
    let d = local(&["--op", "write"], &[("MORI_BENCH_CORRUPT_SLOT", "30")]);
    assert_eq!(d.code, Some(1), "{}", d.dump());
    let v = d.stdout.lines().find_map(|l| l.strip_prefix("validation: ")).unwrap();
    assert!(v.starts_with("FAILED: paged entry 30 (layer 1, half 0, block table entry 6: rank 0 block "), "{v}");
    // Untouched block 13 of rank 1: 12 untouched blocks per (layer, half), so layer 0, half 1.
    let d = local(&["--op", "write", "--halves", "2"], &[("MORI_BENCH_CORRUPT_UNTOUCHED", "13")]);
    assert_eq!(d.code, Some(1), "{}", d.dump());
    let v = d.stdout.lines().find_map(|l| l.strip_prefix("validation: ")).unwrap();
    assert!(
        v.starts_with("FAILED: rank 1's pool block ")
            && v.ends_with("of layer 0, half 1 is in no block table entry but changed (untouched block 13)"),
        "{v}"
    );
}

fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..500 {
        let base = 33_000 + (seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) * 7) % 7_000) as u16;
        if (0..3).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no 3 consecutive free ports in 33000..40000");
}

#[test]
fn differing_paged_flags_stop_both_ranks() {
    let port = free_port().to_string();
    let common = ["--master-ip", "127.0.0.1", "--port", &port, "--log-level", "error"];
    let r1: Vec<&str> = [&["--rank", "1"][..], &common, &SHAPE, &["--seed", "5"], &QUICK].concat();
    let r0: Vec<&str> = [&["--rank", "0"][..], &common, &SHAPE, &QUICK].concat();
    let t = spawn(&r1, &[], Duration::from_secs(40));
    let i = spawn(&r0, &[], Duration::from_secs(40));
    for (d, who) in [(i.wait(), "rank 0"), (t.wait(), "rank 1")] {
        assert_eq!(d.code, Some(2), "{who}: {}", d.dump());
        assert!(d.stderr.contains("--seed: rank 0 = -, rank 1 = 5"), "{who}: {}", d.stderr);
    }
}

#[test]
fn bad_combinations_are_refused_before_rendezvous() {
    for (args, want) in [
        (
            &["--paged", "--block-size", "8", "--layers", "2"][..],
            "--paged needs --block-size, --num-blocks and --layers (missing: --num-blocks)",
        ),
        (&["--num-blocks", "8"], "--num-blocks set the shape of a --paged run: add --paged"),
        (&[&SHAPE[..], &["--pool-blocks", "4"]].concat(), "--pool-blocks 4 is smaller than --num-blocks 12"),
        (&[&SHAPE[..], &["--all"]].concat(), "drop --all"),
        (&[&SHAPE[..], &["--copy-baseline"]].concat(), "--copy-baseline"),
    ] {
        let t = Instant::now();
        let d = run(args, &[]);
        assert_eq!(d.code, Some(2), "{args:?}: {}", d.dump());
        assert!(d.stderr.contains(want), "{args:?}: {}", d.stderr);
        assert!(t.elapsed() < Duration::from_secs(5), "{args:?}: refused before any rendezvous");
    }
}
