//! `mori trace analyze`, `mori rdma-util`, `mori model`, `mori peer-bw` through the binary.

mod common;
use common::*;
use serde_json::Value;

fn close(v: &Value, want: f64) {
    let got = v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
    assert!((got - want).abs() < 1e-6 * want.abs().max(1.0), "got {got}, want {want}");
}

fn kernel<'a>(it: &'a Value, name: &str) -> &'a Value {
    it["kernels"].as_array().unwrap().iter().find(|k| k["name"] == name).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn trace_analyze_fixture() {
    let s = Scratch::new("trace");
    let png = s.path("timeline.png");
    let r = mori(&["trace", "analyze", &data("trace_internode_v1.json"), "--out", &png, "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = r.json();
    let its = v["iterations"].as_array().unwrap();
    assert_eq!(its.len(), 3);
    // Iteration 0: the RDMA-utilization note's step-2 table after a 30 us copy to staging.
    let i0 = &its[0];
    close(&i0["dur_us"], 840.0);
    for (name, lane, start, end) in [
        ("ep_dispatch_copy_to_staging", "serial", 0.0, 30.0),
        ("dispatch_inter_node_send", "internode", 30.0, 150.0),
        ("dispatch_inter_node_recv", "internode", 40.0, 380.0),
        ("dispatch_intra", "intranode", 30.0, 210.0),
        ("dispatch_sync", "serial", 380.0, 390.0),
        ("combine_sync", "serial", 390.0, 430.0),
        ("ep_combine_sync_barrier", "serial", 430.0, 450.0),
        ("combine_inter_node", "internode", 450.0, 790.0),
        ("combine_intra_node", "intranode", 450.0, 590.0),
        ("ep_combine_all", "serial", 790.0, 840.0),
    ] {
        let k = kernel(i0, name);
        assert_eq!(k["lane"], lane, "{name}");
        close(&k["start_us"], start);
        close(&k["end_us"], end);
        close(&k["dur_us"], end - start);
    }
    assert_eq!(kernel(i0, "dispatch_inter_node_send")["spans"], 4);
    assert_eq!(kernel(i0, "ep_combine_all")["spans"], 16);
    assert_eq!(
        i0["concurrent"],
        serde_json::json!([
            {"phase": "dispatch", "start_us": 30.0, "end_us": 210.0},
            {"phase": "combine", "start_us": 450.0, "end_us": 590.0}
        ])
    );
    // Iteration 1 is the slow one; iteration 2 starts at 1760 us.
    close(&its[1]["dur_us"], 880.0);
    close(&kernel(&its[1], "dispatch_inter_node_recv")["dur_us"], 360.0);
    close(&its[2]["start_us"], 1760.0);
    close(&kernel(&its[2], "dispatch_inter_node_send")["dur_us"], 118.0);
    // Aggregates over warp spans of all iterations.
    let agg = |n: &str| v["aggregates"].as_array().unwrap().iter().find(|a| a["name"] == n).unwrap().clone();
    let b = agg("ep_combine_sync_barrier");
    assert_eq!((b["count"].as_u64(), b["lane"].as_str()), (Some(3), Some("serial")));
    close(&b["mean_us"], 20.0);
    let send = agg("dispatch_inter_node_send");
    assert_eq!(send["count"], 12);
    close(&send["max_us"], 122.0);
    assert!(send["min_us"].as_f64().unwrap() >= 112.0 && send["mean_us"].as_f64().unwrap() < 120.0, "{send}");
    assert_eq!(agg("combine_inter_node")["count"], 24);
    assert_eq!(v["warnings"], serde_json::json!([]));
    // The PNG: signature and size (1400 x (60 + 170 per iteration)).
    assert_eq!(v["png"], png.as_str());
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 1400);
    assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), 60 + 170 * 3);
    // Text form.
    let t = mori(&["trace", "analyze", &data("trace_internode_v1.json"), "--no-png"]);
    assert_eq!(t.code, 0);
    assert!(t.stdout.contains("iteration 1  (880.00 us, starts at 870.00 us)"), "{}", t.stdout);
    assert!(t.stdout.contains("concurrent (combine): 450.00 .. 590.00 us"), "{}", t.stdout);
}

#[test]
fn trace_bad_inputs() {
    let s = Scratch::new("trace-bad");
    let cases = [
        ("nojson.json", "{not json", "not a JSON trace"),
        ("noevents.json", "{\"foo\": 1}", "no \"traceEvents\" array"),
        ("nospans.json", "{\"traceEvents\": [{\"name\": \"x\", \"ph\": \"B\", \"ts\": 1}]}", "no complete span"),
        ("notep.json", "[{\"name\": \"gemm\", \"ph\": \"X\", \"ts\": 1, \"dur\": 5, \"pid\": 0, \"tid\": 0}]", "names no EP kernel"),
    ];
    for (name, text, msg) in cases {
        std::fs::write(s.0.join(name), text).unwrap();
        mori(&["trace", "analyze", &s.path(name), "--no-png"]).assert_one_line_error(2, msg);
    }
}

#[test]
fn rdma_util_from_trace_and_from_durations() {
    // 128 tokens per rank, 2 nodes, top-8 bf16: a small (low-latency) batch.
    let r = mori(&[
        "rdma-util",
        "--trace",
        &data("trace_internode_v1.json"),
        "--tokens",
        "128",
        "--hidden",
        "7168",
        "--topk",
        "8",
        "--nodes",
        "2",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = r.json();
    assert_eq!(v["dispatch_bytes_per_token"], 14_404);
    assert_eq!(v["dispatch_bytes"], 1_843_712);
    assert_eq!(v["combine_bytes"], 1_835_008);
    close(&v["durations"]["send_us"], 120.0); // mean of 120, 122, 118
    close(&v["durations"]["recv_us"], 1040.0 / 3.0);
    close(&v["durations"]["sync_us"], 70.0);
    close(&v["durations"]["iteration_us"], 2560.0 / 3.0);
    close(&v["dispatch_gbs"], 1_843_712.0 / 120e-6 / 1e9);
    close(&v["link_gbs"], 50.0);
    let applying: Vec<&str> =
        v["findings"].as_array().unwrap().iter().filter(|f| f["applies"] == true).map(|f| f["key"].as_str().unwrap()).collect();
    assert_eq!(applying, ["below-link-rate", "receiver-waiting", "combine-stall"]);
    // The note's step-3 numbers, given as durations.
    let s = mori(&[
        "rdma-util",
        "--send-us",
        "120",
        "--combine-us",
        "340",
        "--recv-us",
        "340",
        "--tokens",
        "2048",
        "--hidden",
        "7168",
        "--topk",
        "4",
        "--nodes",
        "4",
    ]);
    assert_eq!(s.code, 0, "{}", s.stderr);
    assert!(s.stdout.contains("88301568") && s.stdout.contains("735.85") && s.stdout.contains("259.06"), "{}", s.stdout);
    assert!(s.stdout.contains("[YES] receiver-waiting") && s.stdout.contains("[YES] over-link-rate"), "{}", s.stdout);
    // fp8: 1-byte elements and hidden/128 four-byte scales by default.
    let f = mori(&[
        "rdma-util",
        "--send-us",
        "100",
        "--combine-us",
        "100",
        "--tokens",
        "1",
        "--hidden",
        "7168",
        "--dtype",
        "fp8",
        "--topk",
        "8",
        "--nodes",
        "2",
        "--json",
    ]);
    assert_eq!(f.json()["dispatch_bytes_per_token"], 7168 + 32 + 32 + 56 * 4 + 4);
    let one = mori(&["rdma-util", "--send-us", "1", "--combine-us", "1", "--tokens", "1", "--hidden", "1", "--topk", "1", "--nodes", "1"]);
    one.assert_one_line_error(2, "nothing crosses RDMA");
    let intra = Scratch::new("rdma-intra");
    std::fs::write(intra.0.join("t.json"), "[{\"name\": \"dispatch_intra\", \"ph\": \"X\", \"ts\": 0, \"dur\": 5}]").unwrap();
    mori(&["rdma-util", "--trace", &intra.path("t.json"), "--tokens", "1", "--hidden", "1", "--topk", "1", "--nodes", "2"])
        .assert_one_line_error(2, "no disp_send kernel");
}

#[test]
fn models() {
    let s = mori(&["model", "staging", "--bytes", "1e9", "--pcie-gbs", "20", "--net-gbs", "10", "--json"]).json();
    assert!(s["model"].as_str().unwrap().starts_with("MODEL, not a measurement"));
    close(&s["result"]["staged"]["serial_s"], 0.3);
    close(&s["result"]["direct"]["serial_s"], 0.2);
    close(&s["result"]["staged"]["pipelined_s"], 0.1);
    close(&s["result"]["staged_crossover_pcie_gbs"], 20.0);
    assert_eq!(s["result"]["staged"]["host_memory_bytes"], 4e9);
    let t = mori(&["model", "staging", "--bytes", "1073741824", "--pcie-gbs", "8", "--net-gbs", "10"]);
    assert!(t.stdout.starts_with("MODEL, not a measurement"), "{}", t.stdout);
    assert!(t.stdout.contains("pcie"), "{}", t.stdout);
    let i = mori(&[
        "model",
        "injection",
        "--gpus-per-node",
        "8",
        "--nics-per-node",
        "1",
        "--nic-gbs",
        "25",
        "--scaleup-gbs",
        "400",
        "--target-ratio",
        "0.0625",
        "--json",
    ])
    .json();
    close(&i["result"]["per_gpu_gbs"], 3.125);
    close(&i["result"]["ratio_to_scaleup"], 0.0078125);
    assert_eq!(i["result"]["min_nics_for_target"], 8);
    for bad in [
        vec!["model", "staging", "--bytes", "0", "--pcie-gbs", "20", "--net-gbs", "10"],
        vec!["model", "staging", "--bytes", "1", "--pcie-gbs=-20", "--net-gbs", "10"],
        vec!["model", "injection", "--gpus-per-node", "8", "--nics-per-node", "0", "--nic-gbs", "25", "--scaleup-gbs", "400"],
        vec!["model", "injection", "--gpus-per-node", "8", "--nics-per-node", "1", "--nic-gbs", "25", "--scaleup-gbs", "0"],
    ] {
        let r = mori(&bad);
        assert_eq!(r.code, 2, "{bad:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    }
}

#[test]
fn peer_bw_detector() {
    if !gpu_runtime_present() {
        // Nothing to measure with: one line naming both runtime libraries, exit 1.
        let none = mori(&["peer-bw"]);
        none.assert_one_line_error(1, "nothing was measured");
        for part in ["no GPU runtime", "libcuda", "libamdhip64", "--measurements FILE"] {
            assert!(none.stderr.contains(part), "{part}: {}", none.stderr);
        }
    }
    // Measuring flags do not go with --measurements; bad sizes are bad input (before any GPU work).
    let r = mori(&["peer-bw", "--measurements", &data("peer_bw_2socket.json"), "--sizes", "1MiB"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    mori(&["peer-bw", "--sizes", "1MiB,0"]).assert_one_line_error(2, "--sizes");
    mori(&["peer-bw", "--sizes", "1TiB"]).assert_one_line_error(2, "unknown unit");
    mori(&["peer-bw", "--iters", "0"]).assert_one_line_error(2, "--iters must be at least 1");
    let r = mori(&["peer-bw", "--measurements", &data("peer_bw_2socket.json"), "--topo", &data("nvidia_2socket_nics.txt"), "--json"]);
    assert_eq!(r.code, 1, "flagged pairs exit 1: {}", r.stderr);
    let v = r.json();
    assert_eq!(v["measured_here"], false);
    assert_eq!(v["flagged"], 3);
    let flags = |s: u64, d: u64| -> Vec<String> {
        let p = v["pairs"].as_array().unwrap().iter().find(|p| p["src"] == s && p["dst"] == d).unwrap();
        p["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect()
    };
    assert_eq!(flags(2, 3), ["staged-on-direct", "no-peer-access", "slow-outlier"]);
    assert_eq!(flags(1, 3), ["direct-on-pcie"]);
    assert_eq!(flags(3, 1), ["corrupt"]);
    assert!(flags(0, 1).is_empty() && flags(0, 2).is_empty());
    assert_eq!(v["pairs"][0]["bytes"], 268_435_456);
    close(&v["pairs"][0]["gbps"], 182.4);
    // Only the healthy pairs: exit 0.
    let s = Scratch::new("peer");
    std::fs::write(
        s.0.join("ok.json"),
        r#"{"measurements": [{"src": 0, "dst": 1, "bytes": 1048576, "gbps": 150.0, "peer_access": true},
                             {"src": 1, "dst": 0, "bytes": 1048576, "gbps": 149.0, "peer_access": true}]}"#,
    )
    .unwrap();
    let ok = mori(&["peer-bw", "--measurements", &s.path("ok.json"), "--topo", &data("nvidia_2socket_nics.txt")]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(ok.stdout.contains("0 of 2 pairs flagged"), "{}", ok.stdout);
    std::fs::write(s.0.join("bad.json"), r#"{"measurements": [{"src": 0, "dst": 7, "bytes": 1, "gbps": 1.0, "peer_access": true}]}"#)
        .unwrap();
    mori(&["peer-bw", "--measurements", &s.path("bad.json"), "--topo", &data("nvidia_2socket_nics.txt")])
        .assert_one_line_error(2, "not a pair of GPUs of the topology");
    // A device to itself is a pair of class self (the --json output of a measuring run,
    // self copies included, reads back as a measurement file).
    std::fs::write(
        s.0.join("self.json"),
        r#"{"measurements": [{"src": 0, "dst": 0, "bytes": 268435456, "gbps": 1650.0, "peer_access": true, "wrong_bytes": 0,
                              "label": "self", "verified": true, "iterations": 20, "elapsed_ms": 3.2}]}"#,
    )
    .unwrap();
    let own = mori(&["peer-bw", "--measurements", &s.path("self.json"), "--topo", &data("nvidia_2socket_nics.txt"), "--json"]);
    assert_eq!(own.code, 0, "{}", own.stderr);
    assert_eq!(own.json()["pairs"][0]["class"], "self");
}

/// Spans or link rates near 0 made the figures inf (and shapes at u64's edge overflowed):
/// refused in one line, naming the flag and its range.
#[test]
fn rdma_util_refuses_inputs_that_overflowed() {
    let base = ["rdma-util", "--send-us", "1", "--combine-us", "1", "--tokens", "100", "--hidden", "7168", "--topk", "8", "--nodes", "2"];
    let with = |flag: &str, v: &str| {
        let mut a: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        match a.iter().position(|x| x == flag) {
            Some(i) => a[i + 1] = v.to_string(),
            None => a.extend([flag.to_string(), v.to_string()]),
        }
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        mori(&refs)
    };
    with("--send-us", "1e-310").assert_one_line_error(2, "--send-us (dispatch_inter_node_send span) must be in 1e-3..=1e12 us, got 1e-310");
    with("--link-gbit", "1e-320").assert_one_line_error(2, "--link-gbit must be in 1e-3..=1e6 Gb/s, got 1e-320");
    with("--tokens", "18446744073709551615").assert_one_line_error(2, "--tokens must be in 1..=1073741824, got 18446744073709551615");
    with("--hidden", "4294967296").assert_one_line_error(2, "--hidden must be in 1..=1048576, got 4294967296");
    // The same shape with sane spans gives finite numbers.
    let mut ok = base.to_vec();
    ok.push("--json");
    let v = mori(&ok).json();
    // 100 tokens x 14404 bytes in 1 us.
    assert_eq!(v["dispatch_bytes"], 1_440_400);
    close(&v["dispatch_gbs"], 1440.4);
}
