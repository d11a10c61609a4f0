//! `cargo xtask compare-rdma [--secs N] [OPTIONS]`: bench_engine's rdma backend against
//! perftest on the same SoftRoCE device, in ONE guest run (DESIGN.md, "Measuring": under TCG
//! absolute numbers mean nothing; ratios measured in the same run do).
//!
//! For each op (write, read) and size (64 KiB, 256 KiB, 1 MiB by default):
//! 1. `ib_<op>_bw -d $RDMA_DEV -x $RDMA_GID_INDEX -F -s SIZE -D N+2 -f 1` (server in the
//!    background, client to $RDMA_IP; 1 s margins, so N seconds are measured). perftest prints
//!    MiB/s ("--report_gbits ... instead of MiB/sec" in its help): converted to GB = 1e9, and
//!    cross-checked against its MsgRate column .
//! 2. `bench_engine --local --backend rdma --op OP --enable-sess --buffer-size SIZE
//!    --transfer-batch-size B --iters I` for each variant (extra flags), with
//!    B = max(1, batch-bytes / SIZE) and I chosen in the guest from the perftest figure so
//!    the point lasts about N seconds at ratio 1.
//! 3. perftest again (the guest drifts: the peer figure is the mean of before and after).
//!
//! The guest prints tagged lines (`RESULT ib ...`, `RESULT bench ...`) that this task parses
//! from the rig's stdout (the rig runs as a child process, `xtask softroce`).
//!
//! Options:
//! - `--secs N` measured seconds per point (default 5).
//! - `--sizes A,B,..` message sizes in bytes (default 65536,262144,1048576).
//! - `--ops write,read` (default both).
//! - `--batch-bytes N` bytes per bench_engine iteration (default 4 MiB).
//! - `--variant 'FLAGS'` (repeatable) extra bench_engine flags of one variant; the default is
//!   one variant with no extra flags (4 QPs, chunking on, polling). `NAME=VALUE` words are
//!   set in bench_engine's environment instead (e.g. `MORI_IO_QP_MAX_SEND_WR=256`), and
//!   `--exe=PATH` runs that bench_engine for this variant (an A/B of two builds in one guest
//!   run: e.g. one built from a worktree of the previous commit).
//! - `--bench-exe PATH` a bench_engine built elsewhere (e.g. from a patched copy of the tree,
//!   to A/B a change in the same guest run) instead of building this tree's.
//! - `--ib-args 'FLAGS'` extra perftest flags (both sides).

use crate::util::workspace_root;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

struct Opts {
    secs: u32,
    sizes: Vec<u64>,
    ops: Vec<String>,
    batch_bytes: u64,
    variants: Vec<String>,
    ib_args: String,
    bench_exe: Option<String>,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        secs: 5,
        sizes: vec![64 << 10, 256 << 10, 1 << 20],
        ops: vec!["write".into(), "read".into()],
        batch_bytes: 4 << 20,
        variants: Vec::new(),
        ib_args: String::new(),
        bench_exe: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |what: &str| it.next().cloned().ok_or(format!("compare-rdma: {a} needs {what}"));
        match a.as_str() {
            "--secs" => o.secs = val("N")?.parse().ok().filter(|&n| n > 0).ok_or("--secs N: a positive number")?,
            "--sizes" => {
                o.sizes = val("A,B,..")?
                    .split(',')
                    .map(|s| s.trim().parse::<u64>().ok().filter(|&n| n > 0))
                    .collect::<Option<_>>()
                    .ok_or("--sizes: positive byte counts, comma-separated")?
            }
            "--ops" => {
                o.ops = val("write,read")?.split(',').map(str::to_string).collect();
                if o.ops.iter().any(|op| op != "write" && op != "read") {
                    return Err("--ops: write and/or read".into());
                }
            }
            "--batch-bytes" => o.batch_bytes = val("N")?.parse().ok().filter(|&n| n > 0).ok_or("--batch-bytes N: a positive number")?,
            "--variant" => o.variants.push(val("'FLAGS'")?),
            "--ib-args" => o.ib_args = val("'FLAGS'")?,
            "--bench-exe" => o.bench_exe = Some(val("PATH")?),
            "-h" | "--help" => return Err("usage: cargo xtask compare-rdma [--secs N] [--sizes A,B] [--ops write,read] [--batch-bytes N] [--variant 'FLAGS']... [--ib-args 'FLAGS'] [--bench-exe PATH]".into()),
            other => return Err(format!("compare-rdma: unknown argument {other}")),
        }
    }
    if o.variants.is_empty() {
        o.variants.push(String::new());
    }
    let unsafe_chars = |s: &str| s.chars().any(|c| "'\"`$\\;&|<>(){}\n".contains(c));
    if o.variants.iter().any(|v| unsafe_chars(v)) || unsafe_chars(&o.ib_args) {
        return Err("compare-rdma: flags may not contain quotes, $, `, \\, ;, &, |, <, >, parentheses or braces".into());
    }
    Ok(o)
}

/// The guest's bash script. Tagged output lines:
/// `RESULT ib OP SIZE PASS MIB_S MPPS ITERS` and
/// `RESULT bench OP SIZE VARIANT BATCH ITERS RC GBPS VALIDATION`.
fn script(o: &Opts, bench: &str) -> String {
    let mut s = format!(
        r#"set -u
SECS={secs}; D=$((SECS + 2)); BENCH='{bench}'; IBARGS='{ib}'
ib() {{  # op size pass
    local tool=ib_$1_bw out line srv k
    $tool -d $RDMA_DEV -x $RDMA_GID_INDEX -F -s $2 -D $D -f 1 $IBARGS > /tmp/ib-srv.log 2>&1 &
    srv=$!
    for k in 1 2 3 4 5 6 7 8 9 10; do
        sleep 1
        out=$($tool -d $RDMA_DEV -x $RDMA_GID_INDEX -F -s $2 -D $D -f 1 $IBARGS $RDMA_IP 2>&1) && break
        kill -0 $srv 2>/dev/null || break
    done
    kill $srv 2>/dev/null; wait $srv 2>/dev/null
    line=$(echo "$out" | awk -v s=$2 '$1 == s && NF >= 5 {{ print $4, $5, $2 }}' | tail -1)
    if [ -z "$line" ]; then echo "$out" | tail -20; echo "RESULT ib $1 $2 $3 nan nan 0"; IB=0; return; fi
    echo "RESULT ib $1 $2 $3 $line"
    IB=$(echo $line | cut -d' ' -f1)
}}
bench() {{  # op size batch variant-index 'NAME=VALUE ...' exe flags...
    local op=$1 size=$2 batch=$3 v=$4 envs=$5 exe=$6 f=/tmp/mori-compare-rdma.json iters warm rc gbps val
    shift 6
    iters=$(awk -v mib=$IB -v s=$size -v b=$batch -v t=$SECS 'BEGIN {{ i = int(t * mib * 1048576 / (s * b)); if (i < 3) i = 3; if (i > 100000) i = 100000; print i }}')
    warm=$((iters / 10 + 2))
    rm -f $f
    env $envs timeout $((SECS * 20 + 120)) "$exe" --local --backend rdma --op $op --enable-sess --buffer-size $size \
        --transfer-batch-size $batch --iters $iters --warmup-iters $warm --log-level warning --json $f "$@" \
        > /tmp/bench.log 2>&1
    rc=$?
    gbps=$(tr -d ' \n' < $f 2>/dev/null | sed -n 's/.*"avg_bw_gbps":\([0-9.eE+-]*\).*/\1/p')
    val=$(tr -d ' \n' < $f 2>/dev/null | sed -n 's/.*"validation":"\([^"]*\)".*/\1/p')
    [ $rc = 0 ] || tail -20 /tmp/bench.log
    echo "RESULT bench $op $size $v $batch $iters $rc ${{gbps:-nan}} ${{val:-none}}"
}}
"#,
        secs = o.secs,
        ib = o.ib_args,
    );
    for op in &o.ops {
        for &size in &o.sizes {
            let batch = (o.batch_bytes / size).max(1);
            s.push_str(&format!("echo '== {op} {size}'; ib {op} {size} 1\n"));
            for (v, words) in o.variants.iter().enumerate() {
                let is_env = |w: &&str| {
                    w.split_once('=')
                        .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                };
                let exe = words.split_whitespace().find_map(|w| w.strip_prefix("--exe=")).unwrap_or(bench);
                let envs: Vec<&str> = words.split_whitespace().filter(is_env).collect();
                let flags: Vec<&str> = words.split_whitespace().filter(|w| !is_env(w) && !w.starts_with("--exe=")).collect();
                s.push_str(&format!("bench {op} {size} {batch} {v} '{}' '{exe}' {}\n", envs.join(" "), flags.join(" ")));
            }
            s.push_str(&format!("ib {op} {size} 2\n"));
        }
    }
    s.push_str("exit 0\n");
    s
}

#[derive(Default, Clone)]
struct Point {
    ib: Vec<(f64, f64)>,                         // (GB/s from MiB/s, GB/s from MsgRate)
    bench: Vec<Option<(u64, u64, f64, String)>>, // per variant: batch, iters, GB/s, validation
}

pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    let bench = match &o.bench_exe {
        Some(p) => std::fs::canonicalize(p).map_err(|e| format!("--bench-exe {p}: {e}"))?,
        None => {
            crate::util::cargo(&["build", "--release", "-p", "mori-bench", "--bin", "bench_engine"])?;
            workspace_root().join("target/release/bench_engine")
        }
    };
    let bench = bench.to_str().ok_or("the bench_engine path is not UTF-8")?.to_string();
    if bench.contains('\'') {
        return Err("the bench_engine path contains a quote".into());
    }
    let xtask = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    println!("xtask: compare-rdma in one SoftRoCE guest ({} s per point; peers: ib_write_bw, ib_read_bw)", o.secs);
    let mut child = Command::new(&xtask)
        .args(["softroce", "--", "bash", "-c"])
        .arg(script(&o, &bench))
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", xtask.display()))?;
    let mut points: std::collections::BTreeMap<(String, u64), Point> = Default::default();
    let out = child.stdout.take().ok_or("no stdout")?;
    for line in BufReader::new(out).lines() {
        let line = line.map_err(|e| format!("reading the guest's output: {e}"))?;
        println!("{line}");
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 2 || f[0] != "RESULT" {
            continue;
        }
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(f64::NAN);
        let key = |i: usize| (f[i].to_string(), f.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(0));
        match f[1] {
            "ib" if f.len() >= 8 => {
                let (k, size) = (key(2), num(3));
                // MiB/s -> GB/s; Mpps x size -> GB/s
                points.entry(k).or_default().ib.push((num(5) * 1048576.0 / 1e9, num(6) * size / 1e3));
            }
            "bench" if f.len() >= 10 => {
                let v: usize = f[4].parse().unwrap_or(0);
                let p = points.entry(key(2)).or_default();
                if p.bench.len() <= v {
                    p.bench.resize(v + 1, None);
                }
                let ok = f[7] == "0";
                p.bench[v] = ok.then(|| (num(5) as u64, num(6) as u64, num(8), f[9].to_string()));
            }
            _ => {}
        }
    }
    let st = child.wait().map_err(|e| format!("softroce: {e}"))?;
    if points.is_empty() {
        return Err(format!("the SoftRoCE guest reported no result ({st})"));
    }
    println!();
    println!("SoftRoCE (rxe, one device, loopback QPs), TCG guest; GB = 1e9; ratio = bench / mean(ib before, ib after)");
    for (v, flags) in o.variants.iter().enumerate() {
        println!("variant {v}: bench_engine --local --backend rdma --enable-sess {}", if flags.is_empty() { "(defaults)" } else { flags });
    }
    println!(
        "{:<6} {:>8} {:>10} {:>10} {:>10} {:>8} {:>4} {:>6} {:>7} {:>10} {:>7}",
        "op", "size", "ib before", "ib after", "ib (rate)", "variant", "B", "iters", "valid", "bench", "ratio"
    );
    let mut worst: Option<f64> = None;
    for ops in &o.ops {
        for &size in &o.sizes {
            let Some(p) = points.get(&(ops.clone(), size)) else { continue };
            let ib = |i: usize| p.ib.get(i).map(|x| x.0).filter(|x| x.is_finite() && *x > 0.0);
            let peer = match (ib(0), ib(1)) {
                (Some(a), Some(b)) => Some((a + b) / 2.0),
                (a, b) => a.or(b),
            };
            let rate = p.ib.iter().map(|x| x.1).filter(|x| x.is_finite()).fold(0.0, f64::max);
            let fmt = |x: Option<f64>| x.map(|v| format!("{v:.4}")).unwrap_or("-".into());
            for v in 0..o.variants.len() {
                let b = p.bench.get(v).cloned().flatten();
                let ratio = match (&b, peer) {
                    (Some((_, _, g, _)), Some(pe)) if g.is_finite() => Some(g / pe),
                    _ => None,
                };
                if let Some(r) = ratio {
                    worst = Some(worst.map_or(r, |w: f64| w.min(r)));
                }
                println!(
                    "{:<6} {:>8} {:>10} {:>10} {:>10} {:>8} {:>4} {:>6} {:>7} {:>10} {:>7}",
                    ops,
                    size,
                    fmt(ib(0)),
                    fmt(ib(1)),
                    format!("{rate:.4}"),
                    v,
                    b.as_ref().map(|x| x.0.to_string()).unwrap_or("-".into()),
                    b.as_ref().map(|x| x.1.to_string()).unwrap_or("-".into()),
                    b.as_ref().map(|x| x.3.clone()).unwrap_or("FAILED".into()),
                    fmt(b.as_ref().map(|x| x.2)),
                    ratio.map(|r| format!("{r:.3}")).unwrap_or("-".into()),
                );
            }
        }
    }
    println!("ib (rate) = perftest's MsgRate x size (a check of its MiB/s column); target ratio >= 0.9");
    if let Some(w) = worst {
        println!("lowest ratio: {w:.3}");
    }
    if !st.success() {
        return Err(format!("the SoftRoCE guest run failed ({st})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let a: Vec<String> =
            ["--secs", "3", "--sizes", "4096,8192", "--variant", "--num-qp-per-transfer 1"].iter().map(|s| s.to_string()).collect();
        let o = parse(&a).unwrap();
        assert_eq!((o.secs, o.sizes.clone(), o.variants.len()), (3, vec![4096, 8192], 1));
        let s = script(&o, "/x/bench_engine");
        assert!(s.contains("bench write 4096 1024 0 '' '/x/bench_engine' --num-qp-per-transfer 1"));
        let o = parse(&["--variant".to_string(), "A_B=1 --x C=2".to_string()]).unwrap();
        assert!(script(&o, "/x/b").contains("bench read 65536 64 0 'A_B=1 C=2' '/x/b' --x"));
        let o = parse(&["--variant".to_string(), "--exe=/y/old --x".to_string()]).unwrap();
        assert!(script(&o, "/x/b").contains("bench read 65536 64 0 '' '/y/old' --x\n"));
        assert!(parse(&["--variant".to_string(), "a;b".to_string()]).is_err());
    }
}
