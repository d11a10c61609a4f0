//! `trace_analyze`: `mori trace analyze TRACE`: the Perfetto / Chrome JSON trace
//! ([`parse`]), the iteration analysis ([`analyze`]), the text summary, the JSON output and
//! the kernel extents `mori rdma-util` reads. The Gantt PNG the command also draws is
//! `trace_gantt`'s (drawing takes tens of milliseconds an input).
//!
//! Input: JSON (read lossily as UTF-8). Asserted for a trace that parses: spans are sorted
//! by start, start finite and end not before start; for its analysis: iterations numbered in
//! order, every kernel row's duration its end minus its start and never negative, aggregates
//! with `min <= mean <= max` over `count > 0` spans; the summary renders and the analysis
//! serializes.

use mori_cli::trace::{analyze, parse, Analysis, Kernel};

const KERNELS: [Kernel; 10] = [
    Kernel::CopyToStaging,
    Kernel::DispatchSend,
    Kernel::DispatchRecv,
    Kernel::DispatchIntra,
    Kernel::DispatchSync,
    Kernel::CombineInter,
    Kernel::CombineIntra,
    Kernel::CombineSync,
    Kernel::CombineSyncBarrier,
    Kernel::CombineAll,
];

/// One input.
pub fn run(data: &[u8]) {
    let _ = analysis(data);
}

/// Parses and analyzes `data`, checking both (see the module docs).
pub fn analysis(data: &[u8]) -> Option<Analysis> {
    let text = String::from_utf8_lossy(data);
    let Ok(spans) = parse(&text) else { return None };
    for w in spans.spans.windows(2) {
        assert!(w[0].start_us <= w[1].start_us, "spans out of order: {:?} then {:?}", w[0], w[1]);
    }
    for s in &spans.spans {
        assert!(s.start_us.is_finite() && s.end_us >= s.start_us, "span {s:?}");
    }
    let Ok(a) = analyze(&spans) else { return None };
    for (i, it) in a.iterations.iter().enumerate() {
        assert_eq!(it.index, i, "iteration numbering");
        for r in &it.kernels {
            assert!(r.dur_us >= 0.0 && r.spans > 0, "kernel row {r:?}");
            assert_eq!(r.dur_us.to_bits(), (r.end_us - r.start_us).to_bits(), "kernel row {r:?}");
        }
    }
    let tol = |v: f64| v.abs() * 1e-9 + 1e-9;
    for g in &a.aggregates {
        assert!(g.count > 0, "aggregate {g:?}");
        if g.mean_us.is_finite() {
            assert!(g.min_us <= g.mean_us + tol(g.mean_us) && g.mean_us <= g.max_us + tol(g.max_us), "aggregate {g:?}");
        }
    }
    for k in KERNELS {
        let _ = a.mean_extent(k);
    }
    let _ = a.mean_iteration_us();
    let _ = mori_cli::render::trace(&a);
    serde_json::to_string(&a).expect("an analysis serializes");
    Some(a)
}

/// A compact trace of two iterations of every kernel with two warps each (B/E pairs), the
/// same as a bare array of `X` events, and an orphan end.
pub fn seeds() -> Vec<Vec<u8>> {
    let names = [
        "ep_dispatch_copy_to_staging",
        "dispatch_inter_node_send",
        "dispatch_inter_node_recv",
        "dispatch_intra_node",
        "dispatch_sync",
        "combine_inter_node",
        "combine_intra_node",
        "combine_sync",
        "ep_combine_sync_barrier",
        "ep_combine_all",
    ];
    let mut be = Vec::new();
    let mut x = Vec::new();
    let mut t = 0.0f64;
    for _ in 0..2 {
        for n in names {
            for tid in 0..2 {
                be.push(format!(r#"{{"name":"{n}","ph":"B","ts":{t},"pid":0,"tid":{tid}}}"#));
                be.push(format!(r#"{{"name":"{n}","ph":"E","ts":{},"pid":0,"tid":{tid}}}"#, t + 3.5));
                x.push(format!(r#"{{"name":"{n}","ph":"X","ts":{t},"dur":2.25,"pid":"gpu","tid":{tid}}}"#));
            }
            t += 4.0;
        }
    }
    let be = format!(r#"{{"traceEvents":[{}]}}"#, be.join(","));
    let x = format!("[{}]", x.join(","));
    vec![be.into_bytes(), x.into_bytes(), br#"{"traceEvents":[{"name":"ep_combine_all","ph":"E","ts":1}]}"#.to_vec()]
}

/// JSON punctuation and the trace's keys, phases and kernel names.
pub fn dict() -> Vec<&'static str> {
    vec![
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "null",
        "true",
        "false",
        "-1",
        "1e308",
        "0.5",
        "\"traceEvents\"",
        "\"name\"",
        "\"ph\"",
        "\"ts\"",
        "\"dur\"",
        "\"pid\"",
        "\"tid\"",
        "\"B\"",
        "\"E\"",
        "\"X\"",
        "\"i\"",
        "\"ep_dispatch_copy_to_staging\"",
        "\"dispatch_inter_node_send\"",
        "\"dispatch_inter_node_recv\"",
        "\"dispatch_inter_node_ll_send\"",
        "\"dispatch_intra_node\"",
        "\"dispatch_intra\"",
        "\"dispatch_sync\"",
        "\"combine_inter_node\"",
        "\"combine_inter_node_ll\"",
        "\"combine_intra_node\"",
        "\"combine_sync\"",
        "\"ep_combine_sync_barrier\"",
        "\"ep_combine_all\"",
    ]
}
