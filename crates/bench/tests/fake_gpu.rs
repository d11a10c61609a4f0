//! bench_engine's xgmi paths against the stand-in libcuda of mori-gpu (CPU copies; see
//! crates/gpu/tests/fake_cuda/fake_cuda.c): two processes through IPC and one process, with
//! `--copy-baseline`, so CI runs the backend, the baseline's columns and the initiator-first
//! teardown. The numbers mean nothing here (the H200 runs are in docs/PERFORMANCE.md); the
//! checks are on the table's shape, the ratio column and clean ends.

#[path = "../../gpu/tests/fake_cuda/build_fake.rs"]
mod fake_build;

use std::process::Command;

/// Runs bench_engine with the fake driver; returns (exit code, stdout, stderr).
fn bench(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bench_engine"))
        .args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("MORI_GPU_RUNTIME", "cuda")
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn copy_baseline_columns_on_both_xgmi_paths() {
    let Some(dir) = fake_build::build_fake("bench") else { return };
    let common = [
        "--backend",
        "xgmi",
        "--mem-type",
        "gpu",
        "--all",
        "--sweep-start",
        "64",
        "--sweep-max",
        "4096",
        "--iters",
        "40",
        "--warmup-iters",
        "4",
        "--log-level",
        "warning",
        "--copy-baseline",
    ];
    // Sessions (a prepared route) and one-shot calls, two processes and one.
    // (--batch-contiguous: the engine merges the slots into one copy, and so does the baseline.)
    for (mode, op, batch, sess, extra) in [
        ("--local", "read", "1", true, None),
        ("--local", "write", "3", false, None),
        ("--xgmi-single-process", "write", "1", true, None),
        ("--xgmi-single-process", "read", "2", false, None),
        ("--xgmi-single-process", "write", "8", true, Some("--batch-contiguous")),
    ] {
        let mut args = vec![mode, "--op", op, "--transfer-batch-size", batch];
        if sess {
            args.push("--enable-sess");
        }
        args.extend(extra);
        args.extend(common);
        let (code, out, err) = bench(&dir, &args);
        let what = format!("{args:?}\n--- stdout\n{out}\n--- stderr\n{err}");
        assert_eq!(code, Some(0), "{what}");
        assert!(out.contains("validation: OK"), "{what}");
        assert!(out.contains("CopyLat(us)") && out.contains("Lat/Copy"), "{what}");
        // Initiator-first teardown: every notification reached a live target.
        assert!(!err.contains("WARN") && !err.contains("ERROR"), "{what}");
        let rows: Vec<Vec<f64>> = out
            .lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| l.split_whitespace().map(|x| x.parse::<f64>().unwrap()).collect())
            .collect();
        assert_eq!(rows.len(), 7, "64 B..4 KiB: {what}");
        for r in &rows {
            let (lat, copy, ratio) = (r[4], r[6], r[7]);
            assert_eq!(r[1], batch.parse::<f64>().unwrap(), "{what}");
            assert!(copy > 0.0 && lat > 0.0, "{r:?}: {what}");
            // Both printed rounded to 2 decimals: the ratio (3 decimals) lies within what the
            // rounded values allow.
            let (lo, hi) = ((lat - 0.005) / (copy + 0.005) - 0.0005, (lat + 0.005) / (copy - 0.005).max(1e-9) + 0.0005);
            assert!(lo <= ratio && ratio <= hi, "{r:?}: ratio outside {lo:.3}..{hi:.3}: {what}");
        }
    }
    // Refused with a clear message where it cannot apply.
    let (code, _, err) = bench(&dir, &["--local", "--backend", "tcp", "--copy-baseline"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--copy-baseline") && err.contains("--backend xgmi"), "{err}");
    let (code, _, err) = bench(&dir, &["--local", "--backend", "xgmi", "--mem-type", "gpu", "--disable-batch-transfer", "--copy-baseline"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("drop --disable-batch-transfer"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn paged_points_on_both_xgmi_paths() {
    let Some(dir) = fake_build::build_fake("bench-paged") else { return };
    let shape = ["--paged", "--block-size", "4096", "--num-blocks", "16", "--layers", "2", "--halves", "2", "--pool-blocks", "40"];
    let common =
        ["--backend", "xgmi", "--mem-type", "gpu", "--iters", "6", "--warmup-iters", "1", "--log-level", "warning", "--copy-baseline"];
    for (mode, op, sess) in [("--local", "write", false), ("--local", "read", true), ("--xgmi-single-process", "read", false)] {
        let mut args = vec![mode, "--op", op];
        if sess {
            args.push("--enable-sess");
        }
        args.extend(shape);
        args.extend(common);
        let (code, out, err) = bench(&dir, &args);
        let what = format!("{args:?}\n--- stdout\n{out}\n--- stderr\n{err}");
        assert_eq!(code, Some(0), "{what}");
        assert!(out.contains("validation: OK"), "{what}");
        let row: Vec<f64> = out.lines().nth(1).unwrap().split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(&row[..3], &[4096.0, 64.0, 6.0], "block size, 2 x 2 x 16 blocks: {what}");
        for l in ["paged: 64 blocks (2 layers x 2 halves x 16 table entries; ", "contiguous: 1 entry of 262144 B", "paged/contiguous: "] {
            assert!(out.contains(l), "{l:?}: {what}");
        }
        assert!(out.contains("bare copy: 1 device copy of 262144 B per transfer: ") && out.contains("paged/copy: "), "{what}");
        assert!(!err.contains("WARN") && !err.contains("ERROR"), "{what}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
