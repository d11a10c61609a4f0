//! RDMA utilization of the internode dispatch/combine kernels (RDMA-utilization note): bytes
//! per rank from the shape, observed GB/s from the send/combine spans, compared with the
//! link rate, and the note's interpretation table evaluated row by row.

use crate::error::{in_range, int_in_range, CliError, CliResult};
use mori_ep::accounting::{bandwidth_gbps_from_us, combine_xfer_bytes_per_token, dispatch_xfer_bytes_per_token, rdma_send_bytes};
use serde::Serialize;

/// "≈ saturated": observed send bandwidth at least this fraction of the link (the note: "if
/// observed < rated by >20%, look for ...").
pub const SATURATED_FRACTION: f64 = 0.8;
/// Above this fraction of the link the inputs are inconsistent (more than the wire can carry).
pub const OVER_LINK_FRACTION: f64 = 1.05;
/// `recv >> send` / `combine >> ideal`: at least this ratio.
pub const MUCH_LONGER: f64 = 2.0;
/// `recv << send`: at most this ratio.
pub const MUCH_SHORTER: f64 = 0.5;
/// "Iteration dominated by sync": sync kernels at least this share of the iteration.
pub const SYNC_DOMINATES: f64 = 0.5;

/// Most tokens of one rank (`--tokens`, 2^30).
pub const MAX_TOKENS: u64 = 1 << 30;
/// Largest hidden size (`--hidden`, 2^20).
pub const MAX_HIDDEN: u64 = 1 << 20;
/// Largest top-k (`--topk`).
pub const MAX_TOPK: u64 = 1024;
/// Most scale entries per token (`--scale-dim`, 2^20).
pub const MAX_SCALE_DIM: u64 = 1 << 20;
/// Largest scale entry (`--scale-bytes`).
pub const MAX_SCALE_BYTES: u64 = 8;
/// Most nodes (`--nodes`; at least 2: with one node nothing crosses RDMA).
pub const MAX_NODES: u64 = 1024;
/// Shortest span accepted, us (1 ns, the resolution of a GPU trace).
pub const SPAN_MIN_US: f64 = 1e-3;
/// Longest span accepted, us (1e12 us, about 11.6 days).
pub const SPAN_MAX_US: f64 = 1e12;
/// Slowest link accepted, Gb/s (1 Mb/s).
pub const LINK_MIN_GBIT: f64 = 1e-3;
/// Fastest link accepted, Gb/s (1 Pb/s).
pub const LINK_MAX_GBIT: f64 = 1e6;

// With every input at its limit the byte counts stay inside u64 (2^30 tokens x < 2^24 bytes
// per token x 1023 remote nodes < 2^64) and every ratio, bandwidth and time stays finite (the
// spans and link rates are bounded away from 0 and infinity).
const _: () = assert!(MAX_TOKENS as u128 * (max_bytes_per_token() as u128) * (MAX_NODES as u128 - 1) <= u64::MAX as u128);

/// Dispatch wire bytes per token with every shape input at its limit (4-byte elements).
const fn max_bytes_per_token() -> u64 {
    use mori_ep::accounting::{INDEX_BYTES, TOKEN_ID_BYTES, WEIGHT_BYTES};
    MAX_HIDDEN * 4 + MAX_TOPK * (INDEX_BYTES + WEIGHT_BYTES) + MAX_SCALE_DIM * MAX_SCALE_BYTES + TOKEN_ID_BYTES
}

/// The transfer shape of one rank.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    /// Tokens of this rank (`cur_rank_num_token`).
    pub tokens: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Bytes per hidden element (bf16 2, fp8 1, f32 4).
    pub elem_bytes: u64,
    /// Top-k.
    pub top_k: u64,
    /// Scale entries per token (0 without scales).
    pub scale_dim: u64,
    /// Bytes per scale entry.
    pub scale_bytes: u64,
    /// Nodes.
    pub nodes: u64,
    /// Whether combine carries the weights back.
    pub combine_weights: bool,
}

/// Measured spans, microseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Durations {
    /// `dispatch_inter_node_send` wall-clock span.
    pub send_us: f64,
    /// `dispatch_inter_node_recv` span, if known.
    pub recv_us: Option<f64>,
    /// `combine_inter_node` span.
    pub combine_us: f64,
    /// `dispatch_sync` + `combine_sync` + `ep_combine_sync_barrier`, if known.
    pub sync_us: Option<f64>,
    /// Whole iteration, if known.
    pub iteration_us: Option<f64>,
}

/// One row of the interpretation table.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Short key: `send-bound`, `over-link-rate`, `below-link-rate`, `receiver-waiting`,
    /// `receiver-underloaded`, `combine-stall`, `barrier-bound`.
    pub key: &'static str,
    /// Whether the row applies (`None`: the inputs to decide it are missing).
    pub applies: Option<bool>,
    /// The note's observation and likely cause, with the numbers.
    pub text: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Shape used.
    pub shape: Shape,
    /// Durations used.
    pub durations: Durations,
    /// Link rate, Gb/s (bits).
    pub link_gbit: f64,
    /// Link rate, GB/s (bytes; Gb/s / 8).
    pub link_gbs: f64,
    /// Dispatch wire bytes per token.
    pub dispatch_bytes_per_token: u64,
    /// Combine wire bytes per token.
    pub combine_bytes_per_token: u64,
    /// `tokens x dispatch_bytes_per_token x (nodes - 1)`.
    pub dispatch_bytes: u64,
    /// `tokens x combine_bytes_per_token x (nodes - 1)`.
    pub combine_bytes: u64,
    /// Observed dispatch send GB/s.
    pub dispatch_gbs: f64,
    /// Observed combine GB/s.
    pub combine_gbs: f64,
    /// `dispatch_gbs / link_gbs`.
    pub dispatch_link_fraction: f64,
    /// `combine_gbs / link_gbs`.
    pub combine_link_fraction: f64,
    /// Time the link needs for the dispatch bytes at its rate, us.
    pub ideal_send_us: f64,
    /// Same for the combine bytes, us.
    pub ideal_combine_us: f64,
    /// Interpretation rows.
    pub findings: Vec<Finding>,
}

/// Computes the report. Errors (each names the input and its range): spans outside
/// [`SPAN_MIN_US`]..=[`SPAN_MAX_US`], a link rate outside [`LINK_MIN_GBIT`]..=[`LINK_MAX_GBIT`],
/// fewer than 2 or more than [`MAX_NODES`] nodes, zero tokens/hidden/element size, a shape
/// input above its `MAX_*` limit. Inside those ranges every figure is finite.
pub fn compute(shape: Shape, d: Durations, link_gbit: f64) -> CliResult<Report> {
    let span = |name: &str, v: f64| in_range(name, v, SPAN_MIN_US, SPAN_MAX_US, "us");
    span("--send-us (dispatch_inter_node_send span)", d.send_us)?;
    span("--combine-us (combine_inter_node span)", d.combine_us)?;
    let link_gbit = in_range("--link-gbit", link_gbit, LINK_MIN_GBIT, LINK_MAX_GBIT, "Gb/s")?;
    for (name, v) in [("--recv-us", d.recv_us), ("--sync-us", d.sync_us), ("--iteration-us", d.iteration_us)] {
        if let Some(v) = v {
            span(name, v)?;
        }
    }
    if shape.nodes < 2 {
        return Err(CliError::input(format!("--nodes {}: with one node nothing crosses RDMA", shape.nodes)));
    }
    for (name, v, lo, hi) in [
        ("--nodes", shape.nodes, 2, MAX_NODES),
        ("--tokens", shape.tokens, 1, MAX_TOKENS),
        ("--hidden", shape.hidden, 1, MAX_HIDDEN),
        ("element size", shape.elem_bytes, 1, 4),
        ("--topk", shape.top_k, 0, MAX_TOPK),
        ("--scale-dim", shape.scale_dim, 0, MAX_SCALE_DIM),
        ("--scale-bytes", shape.scale_bytes, 0, MAX_SCALE_BYTES),
    ] {
        int_in_range(name, v, lo, hi)?;
    }
    let e = |x: mori_ep::EpError| CliError::input(x.to_string());
    let dtok = dispatch_xfer_bytes_per_token(shape.hidden, shape.elem_bytes, shape.top_k, shape.scale_dim, shape.scale_bytes).map_err(e)?;
    let ctok = combine_xfer_bytes_per_token(shape.hidden, shape.elem_bytes, shape.top_k, shape.combine_weights).map_err(e)?;
    let dbytes = rdma_send_bytes(shape.tokens, dtok, shape.nodes).map_err(e)?;
    let cbytes = rdma_send_bytes(shape.tokens, ctok, shape.nodes).map_err(e)?;
    let link_gbs = link_gbit / 8.0;
    let dgbs = bandwidth_gbps_from_us(dbytes, d.send_us);
    let cgbs = bandwidth_gbps_from_us(cbytes, d.combine_us);
    let ideal_send = dbytes as f64 / (link_gbs * 1e9) * 1e6;
    let ideal_comb = cbytes as f64 / (link_gbs * 1e9) * 1e6;
    let (df, cf) = (dgbs / link_gbs, cgbs / link_gbs);
    let mut f = Vec::new();
    let pct = |x: f64| format!("{:.0}%", x * 100.0);
    f.push(Finding {
        key: "over-link-rate",
        applies: Some(df > OVER_LINK_FRACTION || cf > OVER_LINK_FRACTION),
        text: format!(
            "observed above the link rate (dispatch {} / combine {} of {link_gbs:.1} GB/s): more bytes than the wire can carry in that time; check the durations and the shape (tokens are this rank's, nodes all nodes)",
            pct(df),
            pct(cf)
        ),
    });
    f.push(Finding {
        key: "send-bound",
        applies: Some((SATURATED_FRACTION..=OVER_LINK_FRACTION).contains(&df)),
        text: format!("send_dur {:.1} us ≈ dispatch_bytes / NIC_BW {ideal_send:.1} us: send side is bandwidth-saturated (good)", d.send_us),
    });
    f.push(Finding {
        key: "below-link-rate",
        applies: Some(df < SATURATED_FRACTION),
        text: format!(
            "dispatch at {} of the link (more than 20% below): look for too few QPs, too small a batch, or the recv side blocking the send side",
            pct(df)
        ),
    });
    let ratio = d.recv_us.map(|r| r / d.send_us);
    f.push(Finding {
        key: "receiver-waiting",
        applies: ratio.map(|r| r >= MUCH_LONGER),
        text: format!(
            "recv_dur >> send_dur (recv/send {}): receiver spins waiting for data; the fabric or the sender is the bottleneck",
            ratio.map_or("unknown".into(), |r| format!("{r:.2}"))
        ),
    });
    f.push(Finding {
        key: "receiver-underloaded",
        applies: ratio.map(|r| r <= MUCH_SHORTER),
        text: "recv_dur << send_dur: receiver catches up quickly; may be underloaded (small batch)".into(),
    });
    f.push(Finding {
        key: "combine-stall",
        applies: Some(d.combine_us >= MUCH_LONGER * ideal_comb),
        text: format!(
            "combine_inter_dur {:.1} us vs combine_bytes / NIC_BW {ideal_comb:.1} us ({:.2}x): poll-loop stall or NIC contention when >= {MUCH_LONGER}x",
            d.combine_us,
            d.combine_us / ideal_comb
        ),
    });
    let share = match (d.sync_us, d.iteration_us) {
        (Some(s), Some(i)) => Some(s / i),
        _ => None,
    };
    f.push(Finding {
        key: "barrier-bound",
        applies: share.map(|s| s >= SYNC_DOMINATES),
        text: format!(
            "iteration dominated by dispatch_sync / combine_sync (sync share {}): barrier overhead, not bandwidth",
            share.map_or("unknown".into(), pct)
        ),
    });
    Ok(Report {
        shape,
        durations: d,
        link_gbit,
        link_gbs,
        dispatch_bytes_per_token: dtok,
        combine_bytes_per_token: ctok,
        dispatch_bytes: dbytes,
        combine_bytes: cbytes,
        dispatch_gbs: dgbs,
        combine_gbs: cgbs,
        dispatch_link_fraction: df,
        combine_link_fraction: cf,
        ideal_send_us: ideal_send,
        ideal_combine_us: ideal_comb,
        findings: f,
    })
}

impl Report {
    /// Keys of the rows that apply.
    pub fn applying(&self) -> Vec<&'static str> {
        self.findings.iter().filter(|f| f.applies == Some(true)).map(|f| f.key).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(tokens: u64, top_k: u64, nodes: u64) -> Shape {
        Shape { tokens, hidden: 7168, elem_bytes: 2, top_k, scale_dim: 0, scale_bytes: 4, nodes, combine_weights: false }
    }

    /// The note's "Step 3" example: 2048 tokens, 4 nodes, hidden 7168, bf16, top-4, send
    /// 120 us, combine 340 us, recv 340 us; the 400 Gb/s link of its comment.
    #[test]
    fn seed_step3_example() {
        let d = Durations { send_us: 120.0, recv_us: Some(340.0), combine_us: 340.0, sync_us: Some(70.0), iteration_us: Some(810.0) };
        let r = compute(shape(2048, 4, 4), d, 400.0).unwrap();
        assert_eq!((r.dispatch_bytes_per_token, r.dispatch_bytes), (14_372, 88_301_568));
        assert_eq!((r.combine_bytes_per_token, r.combine_bytes), (14_336, 88_080_384));
        assert!((r.dispatch_gbs - 735.8464).abs() < 1e-3, "{}", r.dispatch_gbs);
        assert!((r.combine_gbs - 259.0599529).abs() < 1e-6, "{}", r.combine_gbs);
        assert_eq!(r.link_gbs, 50.0);
        // The example's spans are illustrative: 736 GB/s is above a 50 GB/s port, which the
        // table says out loud; recv/send = 2.83 reads as a waiting receiver.
        assert_eq!(r.applying(), vec!["over-link-rate", "receiver-waiting"]);
    }

    /// A saturated 2-node case: 4096 tokens, top-8, 1300 us send on a 400 Gb/s port.
    #[test]
    fn saturated_and_barrier_cases() {
        let d = Durations { send_us: 1300.0, recv_us: Some(1400.0), combine_us: 1250.0, sync_us: None, iteration_us: None };
        let r = compute(shape(4096, 8, 2), d, 400.0).unwrap();
        assert_eq!((r.dispatch_bytes_per_token, r.dispatch_bytes), (14_404, 58_998_784));
        assert!((r.dispatch_gbs - 45.384).abs() < 1e-3, "{}", r.dispatch_gbs);
        assert!((r.ideal_send_us - 1179.97568).abs() < 1e-6, "{}", r.ideal_send_us);
        assert_eq!(r.applying(), vec!["send-bound"]);
        assert_eq!(r.findings.iter().find(|f| f.key == "barrier-bound").unwrap().applies, None);
        let d =
            Durations { send_us: 4000.0, recv_us: Some(1000.0), combine_us: 5000.0, sync_us: Some(9000.0), iteration_us: Some(15000.0) };
        let r = compute(shape(4096, 8, 2), d, 400.0).unwrap();
        assert_eq!(r.applying(), vec!["below-link-rate", "receiver-underloaded", "combine-stall", "barrier-bound"]);
    }

    fn finite_figures(r: &Report) -> [f64; 8] {
        [
            r.dispatch_gbs,
            r.combine_gbs,
            r.dispatch_link_fraction,
            r.combine_link_fraction,
            r.ideal_send_us,
            r.ideal_combine_us,
            r.link_gbs,
            r.dispatch_bytes as f64 / r.combine_bytes as f64,
        ]
    }

    /// Inputs that used to give inf (a span or link rate near 0: 1440400 bytes in 1e-310 us is
    /// inf GB/s; a 1e-320 Gb/s link made every link fraction and link time inf) or a u64
    /// overflow deep in the accounting are refused up front, naming the input and its range.
    #[test]
    fn inputs_that_overflowed_are_refused_with_their_range() {
        let d = Durations { send_us: 1.0, combine_us: 1.0, ..Default::default() };
        let err = |shape: Shape, d: Durations, link: f64| compute(shape, d, link).unwrap_err().to_string();
        assert_eq!(
            err(shape(100, 8, 2), Durations { send_us: 1e-310, ..d.clone() }, 400.0),
            "--send-us (dispatch_inter_node_send span) must be in 1e-3..=1e12 us, got 1e-310"
        );
        assert_eq!(err(shape(100, 8, 2), d.clone(), 1e-320), "--link-gbit must be in 1e-3..=1e6 Gb/s, got 1e-320");
        assert_eq!(err(shape(100, 8, 2), d.clone(), f64::INFINITY), "--link-gbit must be in 1e-3..=1e6 Gb/s, got inf");
        assert_eq!(
            err(shape(100, 8, 2), Durations { iteration_us: Some(f64::NAN), ..d.clone() }, 400.0),
            "--iteration-us must be in 1e-3..=1e12 us, got NaN"
        );
        assert_eq!(err(shape(u64::MAX, 8, 2), d.clone(), 400.0), "--tokens must be in 1..=1073741824, got 18446744073709551615");
        assert_eq!(
            err(Shape { hidden: 1 << 40, ..shape(1, 8, 2) }, d.clone(), 400.0),
            "--hidden must be in 1..=1048576, got 1099511627776"
        );
        assert_eq!(err(shape(1, 1 << 62, 2), d.clone(), 400.0), "--topk must be in 0..=1024, got 4611686018427387904");
        assert_eq!(err(shape(1, 8, 1 << 40), d.clone(), 400.0), "--nodes must be in 2..=1024, got 1099511627776");
        assert_eq!(
            err(Shape { scale_dim: 1 << 21, ..shape(1, 8, 2) }, d.clone(), 400.0),
            "--scale-dim must be in 0..=1048576, got 2097152"
        );
        assert_eq!(err(Shape { scale_bytes: 9, scale_dim: 1, ..shape(1, 8, 2) }, d, 400.0), "--scale-bytes must be in 0..=8, got 9");
    }

    /// Every corner of the accepted ranges gives finite figures and exact byte counts.
    #[test]
    fn range_corners_stay_finite() {
        let big = Shape {
            tokens: MAX_TOKENS,
            hidden: MAX_HIDDEN,
            elem_bytes: 4,
            top_k: MAX_TOPK,
            scale_dim: MAX_SCALE_DIM,
            scale_bytes: MAX_SCALE_BYTES,
            nodes: MAX_NODES,
            combine_weights: true,
        };
        let small = Shape { tokens: 1, hidden: 1, elem_bytes: 1, top_k: 0, scale_dim: 0, scale_bytes: 0, nodes: 2, combine_weights: false };
        for sh in [big.clone(), small] {
            for (a, b) in [(SPAN_MIN_US, SPAN_MAX_US), (SPAN_MAX_US, SPAN_MIN_US), (SPAN_MIN_US, SPAN_MIN_US), (SPAN_MAX_US, SPAN_MAX_US)] {
                for link in [LINK_MIN_GBIT, LINK_MAX_GBIT] {
                    let d = Durations { send_us: a, combine_us: b, recv_us: Some(b), sync_us: Some(a), iteration_us: Some(b) };
                    let r = compute(sh.clone(), d, link).unwrap();
                    assert!(
                        finite_figures(&r).iter().all(|v| v.is_finite() && *v > 0.0),
                        "{:?} {a} {b} {link}: {:?}",
                        sh,
                        finite_figures(&r)
                    );
                }
            }
        }
        let d = Durations { send_us: 1.0, combine_us: 1.0, ..Default::default() };
        let r = compute(big, d, 400.0).unwrap();
        // 2^20 x 4 + 1024 x 8 + 2^20 x 8 + 4 bytes per token, 2^30 tokens, 1023 remote nodes.
        assert_eq!(r.dispatch_bytes_per_token, 12_591_108);
        assert_eq!(r.dispatch_bytes as u128, (1u128 << 30) * 12_591_108 * 1023);
    }

    #[test]
    fn rejects_bad_inputs() {
        let d = Durations { send_us: 100.0, combine_us: 100.0, ..Default::default() };
        assert!(compute(shape(1, 1, 1), d.clone(), 400.0).is_err());
        assert!(compute(shape(0, 1, 2), d.clone(), 400.0).is_err());
        assert!(compute(shape(1, 1, 2), d.clone(), 0.0).is_err());
        assert!(compute(shape(1, 1, 2), Durations { send_us: 0.0, ..d.clone() }, 400.0).is_err());
        assert!(compute(shape(1, 1, 2), Durations { recv_us: Some(-1.0), ..d }, 400.0).is_err());
    }
}
