//! The trace `bench_dispatch_combine --trace` writes (mori-ep's `perfetto_trace`, serialized
//! with serde_json) read back by `mori trace analyze`'s parser and by the binary.

mod common;
use common::*;
use mori_cli::trace;
use mori_ep::gpu::{perfetto_trace, PerfettoTrace, TraceEvent};

/// Two ranks of two blocks each; rank 1 block 1 never stamped its dispatch phases.
fn sample() -> Vec<(usize, Vec<[u64; 6]>)> {
    vec![
        (0, vec![[1_000, 3_000, 4_000, 10_000, 12_000, 15_000], [1_500, 3_500, 0, 10_500, 12_000, 14_000]]),
        (1, vec![[2_000, 2_500, 5_000, 11_000, 12_000, 13_000], [0, 0, 0, 11_000, 12_000, 16_000]]),
    ]
}

#[test]
fn written_trace_parses_back_with_every_span() {
    let p = perfetto_trace(&sample());
    // 4 phases x 2 blocks of rank 0 (block 1's dispatch_sync ends at 0, before its start:
    // left out), 4 of rank 1 block 0, 2 of rank 1 block 1.
    assert_eq!(p.trace_events.len(), 2 * (4 + 3 + 4 + 2));
    let json = serde_json::to_string(&p).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["displayTimeUnit"], "ns");
    assert_eq!(v["traceEvents"].as_array().unwrap().len(), 26);
    assert_eq!(v["traceEvents"][0], serde_json::json!({"name": "dispatch_intra", "ph": "B", "ts": 0.0, "pid": 0, "tid": 0}));

    let spans = trace::parse(&json).unwrap();
    assert!(spans.warnings.is_empty(), "{:?}", spans.warnings);
    assert_eq!(spans.spans.len(), 13);
    let find = |name: &str, thread: &str| {
        spans
            .spans
            .iter()
            .find(|s| s.name == name && s.thread == thread)
            .unwrap_or_else(|| panic!("no {name} on {thread}: {:?}", spans.spans))
    };
    let s = find("dispatch_intra", "0/0");
    assert_eq!((s.start_us, s.end_us), (0.0, 2.0));
    let s = find("combine_intra_node", "1/1");
    assert_eq!((s.start_us, s.end_us), (11.0, 15.0));
    let s = find("dispatch_sync", "1/0");
    assert_eq!((s.start_us, s.end_us), (1.5, 4.0));
    assert!(spans.spans.iter().all(|s| s.thread != "0/1" || s.name != "dispatch_sync"));
    assert_eq!(spans.spans.iter().filter(|s| s.thread == "1/1").count(), 2);
}

#[test]
fn names_that_need_escaping_round_trip() {
    let name = "we\"ird\\name\n\u{1}";
    let p = PerfettoTrace {
        trace_events: vec![
            TraceEvent { name: name.into(), ph: "B", ts: 1.25, pid: 7, tid: 2 },
            TraceEvent { name: name.into(), ph: "E", ts: 3.5, pid: 7, tid: 2 },
        ],
        display_time_unit: "ns",
    };
    let spans = trace::parse(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(spans.spans.len(), 1);
    let s = &spans.spans[0];
    assert_eq!((s.name.as_str(), s.thread.as_str(), s.start_us, s.end_us), (name, "7/2", 1.25, 3.5));
}

#[test]
fn mori_trace_analyze_reads_the_written_file() {
    let dir = Scratch::new("ep-trace");
    let path = dir.path("trace.json");
    std::fs::write(&path, serde_json::to_string(&perfetto_trace(&sample())).unwrap()).unwrap();
    let r = mori(&["trace", "analyze", &path, "--no-png", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = r.json();
    let its = v["iterations"].as_array().unwrap();
    assert_eq!(its.len(), 1, "{v}");
    let names: Vec<&str> = its[0]["kernels"].as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
    for k in ["dispatch_intra", "dispatch_sync", "combine_sync", "combine_intra_node"] {
        assert!(names.contains(&k), "{k} missing from {names:?}");
    }
    // The iteration spans the earliest begin (0 us) to the latest end (15 us).
    assert_eq!(its[0]["dur_us"].as_f64(), Some(15.0), "{}", its[0]);
}
