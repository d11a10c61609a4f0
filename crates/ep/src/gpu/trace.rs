//! The intranode kernels' phase stamps as a Perfetto / Chrome trace.

/// One rank's phase timestamps: (rank, per block `[dispatch start, send done, receive done,
/// combine start, barrier done, end]` in ns of the GPU clock; 0 = not stamped).
pub type RankTrace = (usize, Vec<[u64; 6]>);

/// One event of a Perfetto / Chrome trace (the JSON object format's fields).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TraceEvent {
    /// Phase name, as upstream's intranode profiler names it.
    pub name: String,
    /// `B` (begin) or `E` (end).
    pub ph: &'static str,
    /// Microseconds from the earliest stamp of the trace.
    pub ts: f64,
    /// The rank.
    pub pid: usize,
    /// The block.
    pub tid: usize,
}

/// A Perfetto / Chrome trace: `{"traceEvents": [...], "displayTimeUnit": "ns"}` once
/// serialized (serde; `serde_json::to_string` writes what `mori trace analyze` reads).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PerfettoTrace {
    /// The events, rank by rank, block by block, phase by phase; each begin before its end.
    pub trace_events: Vec<TraceEvent>,
    /// Always `ns`: how viewers show the times.
    pub display_time_unit: &'static str,
}

/// Phases of [`perfetto_trace`]: (name, start stamp, end stamp) indices into a block's
/// [`RankTrace`] stamps.
const TRACE_PHASES: [(&str, usize, usize); 4] =
    [("dispatch_intra", 0, 1), ("dispatch_sync", 1, 2), ("combine_sync", 3, 4), ("combine_intra_node", 4, 5)];

/// Perfetto / Chrome trace (`traceEvents`, `ph` B/E, `ts` in µs from the earliest stamp) of
/// [`super::IntranodeEp::trace`]'s output: one process per rank, one thread per block, phases named
/// as upstream's intranode profiler names them (so `mori trace analyze` reads them):
/// `dispatch_intra` (send), `dispatch_sync` (block 0 waiting for every block's signal),
/// `combine_sync` (cross-rank barrier), `combine_intra_node` (gather and accumulate). A phase
/// whose start is unstamped (0) or whose end precedes its start is left out.
pub fn perfetto_trace(trace: &[RankTrace]) -> PerfettoTrace {
    let t0 = trace.iter().flat_map(|(_, b)| b.iter().flat_map(|t| t.iter())).filter(|&&v| v > 0).min().copied().unwrap_or(0);
    let us = |v: u64| (v.saturating_sub(t0)) as f64 / 1000.0;
    let mut ev = Vec::new();
    for &(rank, ref blocks) in trace {
        for (b, t) in blocks.iter().enumerate() {
            for (name, s, e) in TRACE_PHASES {
                if t[s] > 0 && t[e] >= t[s] {
                    for (ph, at) in [("B", t[s]), ("E", t[e])] {
                        ev.push(TraceEvent { name: name.to_string(), ph, ts: us(at), pid: rank, tid: b });
                    }
                }
            }
        }
    }
    PerfettoTrace { trace_events: ev, display_time_unit: "ns" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfetto_trace_has_begin_end_pairs_in_microseconds() {
        // Rank 3, two blocks; block 1 has no dispatch stamps and a combine_sync ending before it starts.
        let t = vec![(3usize, vec![[1_000u64, 3_000, 4_000, 10_000, 12_000, 15_000], [0, 0, 0, 11_000, 10_500, 16_500]])];
        let p = perfetto_trace(&t);
        assert_eq!(p.display_time_unit, "ns");
        let ev = |name: &str, ph: &str, ts: f64, tid: usize| TraceEvent {
            name: name.into(),
            ph: if ph == "B" { "B" } else { "E" },
            ts,
            pid: 3,
            tid,
        };
        assert_eq!(
            p.trace_events,
            vec![
                ev("dispatch_intra", "B", 0.0, 0),
                ev("dispatch_intra", "E", 2.0, 0),
                ev("dispatch_sync", "B", 2.0, 0),
                ev("dispatch_sync", "E", 3.0, 0),
                ev("combine_sync", "B", 9.0, 0),
                ev("combine_sync", "E", 11.0, 0),
                ev("combine_intra_node", "B", 11.0, 0),
                ev("combine_intra_node", "E", 14.0, 0),
                ev("combine_intra_node", "B", 9.5, 1),
                ev("combine_intra_node", "E", 15.5, 1),
            ]
        );
        assert!(perfetto_trace(&[]).trace_events.is_empty());
    }
}
