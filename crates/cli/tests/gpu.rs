//! `mori check` and `mori peer-bw` on a machine with a GPU runtime (CUDA or HIP): ignored
//! elsewhere. Every test prints what was measured or reported (stderr) and asserts real values.
//!
//! The binary under test is `$MORI_BIN` when set, else the `mori` cargo built with this test
//! (a path of the build machine: set MORI_BIN when the test binary is carried elsewhere).
//!
//! ```text
//! cargo build --release -p mori-cli --bin mori
//! cargo test --release -p mori-cli --test gpu --no-run          # prints the test executable
//! MORI_BIN=<dir>/mori <test executable> --ignored --nocapture --test-threads=1
//! ```

mod common;
use common::*;
use serde_json::Value;

fn is_bus_id(s: &str) -> bool {
    let hex = |t: &str, n: std::ops::RangeInclusive<usize>| n.contains(&t.len()) && t.chars().all(|c| c.is_ascii_hexdigit());
    let Some((head, func)) = s.rsplit_once('.') else { return false };
    let parts: Vec<&str> = head.split(':').collect();
    parts.len() == 3
        && hex(parts[0], 4..=8)
        && hex(parts[1], 2..=2)
        && hex(parts[2], 2..=2)
        && func.len() == 1
        && func.chars().all(|c| ('0'..='7').contains(&c))
}

fn verdict<'a>(v: &'a Value, backend: &str, memory: &str) -> &'a Value {
    v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backend"] == backend && b["memory"] == memory)
        .unwrap_or_else(|| panic!("no {backend}/{memory} verdict"))
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn check_reports_runtime_devices_fabric_and_xgmi() {
    let r = mori(&["check", "--json"]);
    assert_eq!(r.code, 0, "stdout: {}\nstderr: {}", r.stdout, r.stderr);
    let v = r.json();
    let g = &v["gpu_runtime"];
    eprintln!("gpu_runtime: {}", serde_json::to_string_pretty(g).unwrap());
    assert_eq!(g["available"], true, "{g}");
    assert!(g["kind"] == "CUDA" || g["kind"] == "HIP", "{}", g["kind"]);
    assert!(!g["library"].as_str().unwrap_or("").is_empty());
    assert!(g["driver_version"].as_str().is_some_and(|d| d.contains('.')), "{}", g["driver_version"]);
    let n = g["device_count"].as_u64().unwrap();
    assert!(n >= 1, "device_count {n}");
    let devs = g["devices"].as_array().unwrap();
    assert_eq!(devs.len() as u64, n, "every device's properties were read: {}", g["runtime_errors"]);
    assert_eq!(g["runtime_errors"], serde_json::json!([]));
    for d in devs {
        assert!(!d["name"].as_str().unwrap().trim().is_empty(), "{d}");
        let bus = d["pci_bus_id"].as_str().unwrap();
        assert!(is_bus_id(bus), "bus id {bus:?}");
        assert!(d["total_memory_bytes"].as_u64().unwrap() > 1 << 30, "{d}");
        assert!(d["multiprocessors"].as_u64().unwrap() > 0, "{d}");
        let cc = d["compute_capability"].as_str().unwrap();
        assert!(cc.split_once('.').is_some_and(|(a, b)| a.parse::<u32>().is_ok_and(|a| a > 0) && b.parse::<u32>().is_ok()), "{cc}");
        assert_eq!(d["capabilities"]["ipc"], true);
        // FABRIC: either it works, or it says plainly that the IMEX channel is missing (the
        // project's H200 has none: cuMemCreate gives CUDA_ERROR_NOT_PERMITTED).
        let f = &d["fabric"];
        if f["available"] == true {
            eprintln!("GPU{}: FABRIC available", d["index"]);
        } else {
            assert_eq!(f["status"], "not available (no IMEX channel)", "{f}");
            let err = f["error"].as_str().unwrap();
            assert!(err.contains("IMEX") && err.contains("(800)"), "{err}");
            eprintln!("GPU{}: FABRIC {} -- {err}", d["index"], f["status"].as_str().unwrap());
        }
    }
    assert_eq!(g["peer_access"].as_array().unwrap().len() as u64, n * (n - 1), "every ordered pair of distinct devices");
    assert_eq!(g["ipc"].as_str().map(|s| s.starts_with("available")), Some(true), "{}", g["ipc"]);
    // The engine itself: xgmi moves GPU memory here; tcp refuses GPU memory; nothing serves
    // xgmi for host memory.
    let x = verdict(&v, "xgmi", "gpu");
    eprintln!("xgmi/gpu: {x}");
    assert_eq!(x["serves"], true, "{x}");
    assert!(x["reason"].as_str().unwrap().starts_with("the engine chose xgmi for a GPU 0 -> GPU "), "{x}");
    assert_eq!(verdict(&v, "xgmi", "host")["serves"], false);
    assert_eq!(verdict(&v, "tcp", "gpu")["serves"], false);
    assert_eq!(verdict(&v, "tcp", "host")["serves"], true);
    // Exit status: xgmi for GPU memory can work.
    let ok = mori(&["check", "--backend", "xgmi", "--memory", "gpu"]);
    eprintln!("{}", ok.stdout);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(ok.stdout.contains("requested: xgmi for gpu memory: CAN work"), "{}", ok.stdout);
    assert!(ok.stdout.contains("FABRIC: "), "{}", ok.stdout);
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn peer_bw_measures_and_verifies_every_pair() {
    let r = mori(&["peer-bw", "--json", "--sizes", "1MiB,16MiB"]);
    eprintln!("stderr: {}", r.stderr);
    let v = r.json();
    let n = v["devices"].as_array().unwrap().len();
    assert!(n >= 1);
    assert_eq!(v["measured_here"], true);
    eprintln!("runtime {}; devices {}", v["runtime"], v["devices"]);
    eprintln!("topology {} {:?}", v["topology_source"], v["topology_notes"]);
    let ms = v["measurements"].as_array().unwrap();
    for m in ms {
        eprintln!(
            "GPU{} -> GPU{} ({}) {:>9} bytes: {:8.1} GB/s  peer {}  verified {}  {:.3} ms / {} copies",
            m["src"],
            m["dst"],
            m["label"].as_str().unwrap(),
            m["bytes"],
            m["gbps"].as_f64().unwrap(),
            m["peer_access"],
            m["verified"],
            m["elapsed_ms"].as_f64().unwrap(),
            m["iterations"]
        );
    }
    assert_eq!(ms.len(), n * n * 2, "every ordered pair (self included) at both sizes");
    for m in ms {
        assert_eq!(m["verified"], true, "{m}");
        assert_eq!(m["wrong_bytes"], 0, "{m}");
        assert!(m["gbps"].as_f64().unwrap() > 0.0, "{m}");
        assert_eq!(m["label"], if m["src"] == m["dst"] { "self" } else { "peer" });
    }
    for size in [1u64 << 20, 16 << 20] {
        let own = ms.iter().find(|m| m["src"] == 0 && m["dst"] == 0 && m["bytes"] == size);
        let own = own.unwrap_or_else(|| panic!("no 0 -> 0 measurement at {size} bytes"));
        assert_eq!(own["peer_access"], true);
    }
    assert_eq!(v["verification_failures"], 0);
    let pairs = v["pairs"].as_array().unwrap();
    let p00 = pairs.iter().find(|p| p["src"] == 0 && p["dst"] == 0).expect("pair 0 -> 0 judged");
    assert_eq!((p00["class"].as_str(), p00["bytes"].as_u64()), (Some("self"), Some(16 << 20)), "{p00}");
    for p in pairs.iter().filter(|p| !p["flags"].as_array().unwrap().is_empty()) {
        eprintln!("flagged: GPU{} -> GPU{}: {}", p["src"], p["dst"], p["reasons"]);
    }
    // Exit 1 only for flagged pairs (never for a verification failure here: asserted above).
    let flagged = v["flagged"].as_u64().unwrap();
    assert_eq!(r.code, if flagged > 0 { 1 } else { 0 }, "{}", r.stderr);
    // A device to itself is never flagged by class: on one GPU nothing is flagged.
    if n == 1 {
        assert_eq!((flagged, r.code), (0, 0));
    }
    // The text report, for the log.
    let t = mori(&["peer-bw", "--sizes", "1MiB", "--iters", "5"]);
    eprintln!("{}{}", t.stdout, t.stderr);
    assert!(t.stdout.contains("peer-copy bandwidth measured here"), "{}", t.stdout);
    assert!(t.stdout.contains("cross-check of the measurements above"), "{}", t.stdout);
}
