//! EP kernel traces (Perfetto / Chrome trace JSON, as the MORI-EP profiler writes them:
//! `traceEvents` with `B`/`E` pairs per warp `tid`, `ts` in microseconds; `X` complete events
//! are read too): spans, iterations, per-iteration kernel extents and aggregates.
//!
//! Kernels are put in the seed's lanes: serial (`ep_dispatch_copy_to_staging`,
//! `dispatch_sync`, `combine_sync`, `ep_combine_sync_barrier`, `ep_combine_all`, and the
//! mori-rs AsyncLL GPU phases `dispatch_layout`, `dispatch_copy_out`,
//! `combine_copy_to_staging`), internode
//! (`dispatch_inter_node_{send,recv}`, `combine_inter_node`, and `_ll` variants), intranode
//! (`dispatch_intra`, `combine_intra_node`, and `_ll`; mori-rs V1/V1-LL's relay steps
//! `dispatch_relay_forward` and `combine_relay_reduce`). An iteration starts where the
//! earliest-phase kernel present (normally the copy to staging) recurs after a kernel of a
//! later phase.

use crate::error::{CliError, CliResult};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;

pub use crate::kernel::{lane_of, Kernel, Lane};

/// One begin/end pair of one warp (or one `X` event).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Span {
    /// Event name.
    pub name: String,
    /// `pid/tid` of the event.
    pub thread: String,
    /// Begin, microseconds.
    pub start_us: f64,
    /// End, microseconds.
    pub end_us: f64,
}

/// What [`parse`] read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spans {
    /// Matched spans, by start.
    pub spans: Vec<Span>,
    /// What was skipped (orphan ends, unclosed begins, malformed events), one line each.
    pub warnings: Vec<String>,
}

fn id(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "-".into(),
    }
}

/// Reads a trace: an object with `traceEvents` or a bare array of events. `B`/`E` pair up per
/// (pid, tid) — an `E` closes the latest open `B` of its name (or the latest, if unnamed);
/// `X` uses `dur`; other phases are ignored. Errors (one line): not JSON, no event list,
/// no span at all.
pub fn parse(text: &str) -> CliResult<Spans> {
    let v: Value = serde_json::from_str(text).map_err(|e| CliError::input(format!("not a JSON trace: {e}")))?;
    let events = match &v {
        Value::Array(a) => a,
        Value::Object(o) => match o.get("traceEvents") {
            Some(Value::Array(a)) => a,
            _ => return Err(CliError::input("not a Perfetto/Chrome trace: no \"traceEvents\" array")),
        },
        _ => return Err(CliError::input("not a Perfetto/Chrome trace: neither an object nor an array")),
    };
    let mut open: HashMap<String, Vec<(String, f64)>> = HashMap::new();
    let (mut spans, mut warnings) = (Vec::new(), Vec::new());
    let (mut malformed, mut orphans, mut negative) = (0usize, 0usize, 0usize);
    for e in events {
        let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
        if !matches!(ph, "B" | "E" | "X") {
            continue;
        }
        let name = e.get("name").and_then(Value::as_str).map(str::to_string);
        let Some(ts) = e.get("ts").and_then(Value::as_f64).filter(|t| t.is_finite()) else {
            malformed += 1;
            continue;
        };
        let thread = format!("{}/{}", id(e.get("pid")), id(e.get("tid")));
        let mut push = |name: String, s: f64, t: f64| {
            if t >= s {
                spans.push(Span { name, thread: thread.clone(), start_us: s, end_us: t });
            } else {
                negative += 1;
            }
        };
        match (ph, name) {
            ("X", Some(n)) => match e.get("dur").and_then(Value::as_f64).filter(|d| d.is_finite()) {
                Some(d) => push(n, ts, ts + d),
                None => malformed += 1,
            },
            ("B", Some(n)) => open.entry(thread.clone()).or_default().push((n, ts)),
            ("E", n) => {
                let stack = open.entry(thread.clone()).or_default();
                let at = match &n {
                    Some(n) => stack.iter().rposition(|(m, _)| m == n),
                    None => stack.len().checked_sub(1),
                };
                match at {
                    Some(i) => {
                        let (n, s) = stack.remove(i);
                        push(n, s, ts);
                    }
                    None => orphans += 1,
                }
            }
            _ => malformed += 1,
        }
    }
    let unclosed: usize = open.values().map(Vec::len).sum();
    for (k, what) in [
        (malformed, "malformed events (no name or numeric ts) skipped"),
        (orphans, "end events without a begin skipped"),
        (unclosed, "begin events never ended skipped"),
        (negative, "spans ending before they begin skipped"),
    ] {
        if k > 0 {
            warnings.push(format!("{k} {what}"));
        }
    }
    if spans.is_empty() {
        return Err(CliError::input("the trace holds no complete span (B/E pair or X event)"));
    }
    spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us).then_with(|| a.name.cmp(&b.name)));
    Ok(Spans { spans, warnings })
}

/// One kernel in one iteration: its extent over all warps, relative to the iteration start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelRow {
    /// Name as in the trace.
    pub name: String,
    /// Lane.
    pub lane: Lane,
    /// First begin, us from the iteration start.
    pub start_us: f64,
    /// Last end, us from the iteration start.
    pub end_us: f64,
    /// `end - start`.
    pub dur_us: f64,
    /// Warp spans merged into this row.
    pub spans: usize,
}

/// Where internode and intranode kernels of one phase overlap (the shaded region).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Concurrent {
    /// `dispatch` or `combine`.
    pub phase: &'static str,
    /// Start, us from the iteration start.
    pub start_us: f64,
    /// End, us from the iteration start.
    pub end_us: f64,
}

/// One dispatch+combine iteration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Iteration {
    /// 0-based.
    pub index: usize,
    /// Absolute start (trace clock), us.
    pub start_us: f64,
    /// Last end minus start, us.
    pub dur_us: f64,
    /// Kernels by start.
    pub kernels: Vec<KernelRow>,
    /// Overlap regions.
    pub concurrent: Vec<Concurrent>,
}

/// Duration statistics of one kernel over every warp span of every iteration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Aggregate {
    /// Kernel name.
    pub name: String,
    /// Lane.
    pub lane: Lane,
    /// Spans.
    pub count: usize,
    /// Mean span, us.
    pub mean_us: f64,
    /// Shortest span, us.
    pub min_us: f64,
    /// Longest span, us.
    pub max_us: f64,
}

/// The whole analysis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Analysis {
    /// Iterations in time order.
    pub iterations: Vec<Iteration>,
    /// Per-kernel span statistics, by lane then name.
    pub aggregates: Vec<Aggregate>,
    /// Parse and grouping notes.
    pub warnings: Vec<String>,
}

fn extent<'a>(rows: impl Iterator<Item = &'a KernelRow>) -> Option<(f64, f64)> {
    rows.fold(None, |acc, r| match acc {
        None => Some((r.start_us, r.end_us)),
        Some((s, e)) => Some((s.min(r.start_us), e.max(r.end_us))),
    })
}

/// Groups spans into iterations and computes rows, overlaps and aggregates. Errors: no EP
/// kernel name in the trace.
pub fn analyze(parsed: &Spans) -> CliResult<Analysis> {
    let anchor = parsed.spans.iter().filter_map(|s| Kernel::of(&s.name)).min_by_key(|k| k.phase());
    let anchor =
        anchor.ok_or_else(|| CliError::input("the trace names no EP kernel (dispatch_inter_node_send, combine_intra_node, ...)"))?;
    let mut warnings = parsed.warnings.clone();
    let mut groups: Vec<Vec<&Span>> = Vec::new();
    let (mut seen_later, mut before) = (false, 0usize);
    for s in &parsed.spans {
        let kind = Kernel::of(&s.name);
        if kind == Some(anchor) && (groups.is_empty() || seen_later) {
            groups.push(Vec::new());
            seen_later = false;
        }
        match groups.last_mut() {
            Some(g) => g.push(s),
            None => before += 1,
        }
        seen_later |= kind.is_some_and(|k| k.phase() > anchor.phase());
    }
    if before > 0 {
        warnings.push(format!("{before} spans before the first {} ignored", anchor.label()));
    }
    let mut iterations = Vec::new();
    for (index, g) in groups.iter().enumerate() {
        let t0 = g.iter().map(|s| s.start_us).fold(f64::INFINITY, f64::min);
        let t1 = g.iter().map(|s| s.end_us).fold(f64::NEG_INFINITY, f64::max);
        let mut rows: Vec<KernelRow> = Vec::new();
        for s in g {
            let (a, b) = (s.start_us - t0, s.end_us - t0);
            match rows.iter_mut().find(|r| r.name == s.name) {
                Some(r) => {
                    r.start_us = r.start_us.min(a);
                    r.end_us = r.end_us.max(b);
                    r.spans += 1;
                }
                None => {
                    rows.push(KernelRow { name: s.name.clone(), lane: lane_of(&s.name), start_us: a, end_us: b, dur_us: 0.0, spans: 1 })
                }
            }
        }
        rows.iter_mut().for_each(|r| r.dur_us = r.end_us - r.start_us);
        rows.sort_by(|a, b| a.start_us.total_cmp(&b.start_us).then_with(|| a.name.cmp(&b.name)));
        let mut concurrent = Vec::new();
        for (phase, p) in [("dispatch", Kernel::DispatchSend.phase()), ("combine", Kernel::CombineInter.phase())] {
            let in_phase = |lane: Lane| {
                let rows = rows.iter().filter(move |r| r.lane == lane && Kernel::of(&r.name).is_some_and(|k| k.phase() == p));
                extent(rows)
            };
            if let (Some((a0, a1)), Some((b0, b1))) = (in_phase(Lane::Internode), in_phase(Lane::Intranode)) {
                let (s, e) = (a0.max(b0), a1.min(b1));
                if e > s {
                    concurrent.push(Concurrent { phase, start_us: s, end_us: e });
                }
            }
        }
        iterations.push(Iteration { index, start_us: t0, dur_us: t1 - t0, kernels: rows, concurrent });
    }
    let mut by_name: HashMap<&str, Vec<f64>> = HashMap::new();
    for s in groups.iter().flatten() {
        by_name.entry(&s.name).or_default().push(s.end_us - s.start_us);
    }
    let mut aggregates: Vec<Aggregate> = by_name
        .into_iter()
        .map(|(name, d)| Aggregate {
            name: name.to_string(),
            lane: lane_of(name),
            count: d.len(),
            mean_us: d.iter().sum::<f64>() / d.len() as f64,
            min_us: d.iter().copied().fold(f64::INFINITY, f64::min),
            max_us: d.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
        .collect();
    aggregates.sort_by_key(|a| (a.lane, Kernel::of(&a.name), a.name.clone()));
    let others: Vec<&str> = aggregates.iter().filter(|a| a.lane == Lane::Other).map(|a| a.name.as_str()).collect();
    if !others.is_empty() {
        warnings.push(format!("not EP kernels of the seed's lanes (listed, not drawn): {}", others.join(", ")));
    }
    Ok(Analysis { iterations, aggregates, warnings })
}

impl Analysis {
    /// Mean over iterations of the extent of the first kernel of kind `k` (us), with the
    /// number of iterations that had it; `None` when no iteration has it.
    pub fn mean_extent(&self, k: Kernel) -> Option<(f64, usize)> {
        let d: Vec<f64> =
            self.iterations.iter().filter_map(|it| it.kernels.iter().find(|r| Kernel::of(&r.name) == Some(k)).map(|r| r.dur_us)).collect();
        (!d.is_empty()).then(|| (d.iter().sum::<f64>() / d.len() as f64, d.len()))
    }

    /// Mean iteration duration, us.
    pub fn mean_iteration_us(&self) -> f64 {
        self.iterations.iter().map(|i| i.dur_us).sum::<f64>() / self.iterations.len().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lanes_phases() {
        assert_eq!(Kernel::of("ep_dispatch_copy_to_staging"), Some(Kernel::CopyToStaging));
        assert_eq!(Kernel::of("DISPATCH_INTER_NODE_LL_SEND"), Some(Kernel::DispatchSend));
        assert_eq!(Kernel::of("combine_intra_node_ll"), Some(Kernel::CombineIntra));
        assert_eq!(Kernel::of("ep_combine_sync_barrier"), Some(Kernel::CombineSyncBarrier));
        assert_eq!(Kernel::of("gemm"), None);
        assert_eq!(lane_of("dispatch_inter_node_recv"), Lane::Internode);
        assert_eq!(lane_of("dispatch_intra"), Lane::Intranode);
        assert_eq!(Kernel::of("dispatch_relay_forward"), Some(Kernel::DispatchIntra));
        assert_eq!(Kernel::of("combine_relay_reduce"), Some(Kernel::CombineIntra));
        assert_eq!(lane_of("combine_sync"), Lane::Serial);
        assert_eq!(lane_of("gemm"), Lane::Other);
        assert!(Kernel::CopyToStaging.phase() < Kernel::DispatchSend.phase());
        // mori-rs AsyncLL's own phases: serial, in call order around the seed's.
        assert_eq!(Kernel::of("dispatch_layout"), Some(Kernel::Layout));
        assert_eq!(lane_of("dispatch_copy_out"), Lane::Serial);
        assert_eq!(lane_of("combine_copy_to_staging"), Lane::Serial);
        assert!(Kernel::Layout.phase() < Kernel::CopyToStaging.phase());
        assert!(Kernel::DispatchSync.phase() < Kernel::CopyOut.phase());
        assert!(Kernel::CopyOut.phase() < Kernel::CombineStaging.phase());
        assert!(Kernel::CombineStaging.phase() < Kernel::CombineIntra.phase());
        assert_eq!(Kernel::DispatchSend.phase(), Kernel::DispatchIntra.phase());
    }

    #[test]
    fn pairing_rules() {
        // Nested B/E on one thread, an unnamed E, an X event, an orphan E, an unclosed B, an
        // instant, a bare-array document.
        let t = r#"[
            {"name": "combine_sync", "ph": "B", "ts": 0, "pid": 0, "tid": 1},
            {"name": "inner", "ph": "B", "ts": 1, "pid": 0, "tid": 1},
            {"ph": "E", "ts": 2, "pid": 0, "tid": 1},
            {"name": "combine_sync", "ph": "E", "ts": 5.5, "pid": 0, "tid": 1},
            {"name": "ep_combine_all", "ph": "X", "ts": 6, "dur": 2, "pid": 0, "tid": "w2"},
            {"name": "dispatch_sync", "ph": "E", "ts": 9, "pid": 0, "tid": 3},
            {"name": "dispatch_sync", "ph": "B", "ts": 10, "pid": 0, "tid": 3},
            {"name": "dispatch_sync", "ph": "i", "ts": 11, "pid": 0, "tid": 3},
            {"name": "late", "ph": "B", "ts": "x"}
        ]"#;
        let p = parse(t).unwrap();
        let got: Vec<(&str, &str, f64, f64)> = p.spans.iter().map(|s| (s.name.as_str(), s.thread.as_str(), s.start_us, s.end_us)).collect();
        assert_eq!(got, [("combine_sync", "0/1", 0.0, 5.5), ("inner", "0/1", 1.0, 2.0), ("ep_combine_all", "0/w2", 6.0, 8.0)]);
        assert_eq!(
            p.warnings,
            [
                "1 malformed events (no name or numeric ts) skipped",
                "1 end events without a begin skipped",
                "1 begin events never ended skipped"
            ]
        );
        let a = analyze(&p).unwrap();
        // The anchor is combine_sync (earliest phase present); one iteration.
        assert_eq!(a.iterations.len(), 1);
        assert_eq!(a.iterations[0].dur_us, 8.0);
        assert!(a.warnings.iter().any(|w| w.contains("inner")), "{:?}", a.warnings);
    }

    #[test]
    fn async_ll_phases_give_one_iteration_with_both_overlaps() {
        let ev = |n: &str, s: f64, e: f64, tid: u32| {
            format!(r#"{{"name": "{n}", "ph": "X", "ts": {s}, "dur": {}, "pid": 0, "tid": {tid}}}"#, e - s)
        };
        let v = [
            ev("dispatch_layout", 0.0, 5.0, 0),
            ev("ep_dispatch_copy_to_staging", 6.0, 10.0, 0),
            ev("dispatch_intra", 10.0, 30.0, 0),
            ev("dispatch_inter_node_send", 10.0, 60.0, 1001),
            ev("dispatch_sync", 30.0, 62.0, 0),
            ev("dispatch_copy_out", 63.0, 70.0, 0),
            ev("combine_copy_to_staging", 71.0, 75.0, 0),
            ev("combine_intra_node", 75.0, 90.0, 0),
            ev("combine_inter_node", 75.0, 120.0, 1001),
            ev("combine_sync", 91.0, 121.0, 0),
            ev("ep_combine_all", 121.0, 130.0, 0),
        ];
        let a = analyze(&parse(&format!("[{}]", v.join(","))).unwrap()).unwrap();
        assert_eq!(a.iterations.len(), 1);
        assert_eq!(a.iterations[0].dur_us, 130.0);
        let c: Vec<(&str, f64, f64)> = a.iterations[0].concurrent.iter().map(|c| (c.phase, c.start_us, c.end_us)).collect();
        assert_eq!(c, [("dispatch", 10.0, 30.0), ("combine", 75.0, 90.0)]);
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    }

    #[test]
    fn iterations_start_at_the_anchor() {
        let ev = |n: &str, s: f64, e: f64| format!(r#"{{"name": "{n}", "ph": "X", "ts": {s}, "dur": {}, "pid": 0, "tid": 0}}"#, e - s);
        let mut v = vec![ev("combine_all", 0.0, 1.0)]; // before the first anchor: ignored
        for k in 0..3 {
            let t = 100.0 * f64::from(k);
            v.push(ev("dispatch_inter_node_send", t + 10.0, t + 40.0));
            v.push(ev("dispatch_inter_node_send", t + 12.0, t + 42.0)); // a second warp
            v.push(ev("dispatch_intra", t + 10.0, t + 20.0));
            v.push(ev("combine_inter_node", t + 50.0, t + 90.0));
        }
        let a = analyze(&parse(&format!("[{}]", v.join(","))).unwrap()).unwrap();
        assert_eq!(a.iterations.len(), 3);
        assert_eq!(a.iterations[2].start_us, 210.0);
        assert_eq!(a.iterations[1].dur_us, 80.0);
        assert_eq!(a.iterations[0].concurrent[0].end_us, 10.0);
        assert_eq!(a.mean_extent(Kernel::DispatchSend), Some((32.0, 3)));
        assert_eq!(a.mean_extent(Kernel::CombineAll), None);
        assert!(a.warnings[0].starts_with("1 spans before the first disp_send"), "{:?}", a.warnings);
    }
}
