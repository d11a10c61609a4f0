//! Text output of the analysis subcommands (tables through comfy-table).

use crate::gpu::{bytes_text, Measured};
use crate::model::{Injection, Staging, MODEL_BANNER};
use crate::peer_bw::{PairVerdict, Thresholds};
use crate::rdma_util::Report;
use crate::trace::Analysis;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY).set_header(header.to_vec());
    t
}

/// Per-iteration kernel extents and per-kernel span aggregates.
pub fn trace(a: &Analysis) -> String {
    let mut s = String::new();
    for it in &a.iterations {
        s += &format!("iteration {}  ({:.2} us, starts at {:.2} us)\n", it.index, it.dur_us, it.start_us);
        let mut t = table(&["kernel", "lane", "start", "end", "dur", "warps"]);
        for r in &it.kernels {
            t.add_row(vec![
                r.name.clone(),
                format!("{:?}", r.lane).to_lowercase(),
                format!("{:.2}", r.start_us),
                format!("{:.2}", r.end_us),
                format!("{:.2}", r.dur_us),
                r.spans.to_string(),
            ]);
        }
        s += &format!("{t}\n");
        for c in &it.concurrent {
            s += &format!("  concurrent ({}): {:.2} .. {:.2} us\n", c.phase, c.start_us, c.end_us);
        }
    }
    s += "per-kernel warp spans over all iterations (us)\n";
    let mut t = table(&["lane", "kernel", "count", "mean", "min", "max"]);
    for g in &a.aggregates {
        t.add_row(vec![
            format!("{:?}", g.lane).to_lowercase(),
            g.name.clone(),
            g.count.to_string(),
            format!("{:.2}", g.mean_us),
            format!("{:.2}", g.min_us),
            format!("{:.2}", g.max_us),
        ]);
    }
    s += &format!("{t}\n");
    for w in &a.warnings {
        s += &format!("note: {w}\n");
    }
    s
}

/// The RDMA utilization report and its interpretation table.
pub fn rdma(r: &Report) -> String {
    let sh = &r.shape;
    let mut s = format!(
        "shape: {} tokens x hidden {} x {} B, top-{}, scales {} x {} B, {} nodes\n",
        sh.tokens, sh.hidden, sh.elem_bytes, sh.top_k, sh.scale_dim, sh.scale_bytes, sh.nodes
    );
    s += &format!("link: {} Gb/s = {:.2} GB/s\n", r.link_gbit, r.link_gbs);
    let mut t = table(&["direction", "bytes/token", "bytes", "span us", "GB/s", "of link", "link-time us"]);
    t.add_row(vec![
        "dispatch send".into(),
        r.dispatch_bytes_per_token.to_string(),
        r.dispatch_bytes.to_string(),
        format!("{:.2}", r.durations.send_us),
        format!("{:.2}", r.dispatch_gbs),
        format!("{:.1}%", r.dispatch_link_fraction * 100.0),
        format!("{:.2}", r.ideal_send_us),
    ]);
    t.add_row(vec![
        "combine".into(),
        r.combine_bytes_per_token.to_string(),
        r.combine_bytes.to_string(),
        format!("{:.2}", r.durations.combine_us),
        format!("{:.2}", r.combine_gbs),
        format!("{:.1}%", r.combine_link_fraction * 100.0),
        format!("{:.2}", r.ideal_combine_us),
    ]);
    s += &format!("{t}\ninterpretation (RDMA-utilization note, step 4)\n");
    for f in &r.findings {
        let mark = match f.applies {
            Some(true) => "YES",
            Some(false) => "no ",
            None => "n/a",
        };
        s += &format!("  [{mark}] {}: {}\n", f.key, f.text);
    }
    s
}

/// The staged-versus-direct model.
pub fn staging(m: &Staging) -> String {
    let mut s = format!("{MODEL_BANNER}\n");
    s += &format!("message {} bytes, PCIe {} GB/s per side, network {} GB/s (GB = 1e9)\n", m.bytes, m.pcie_gbs, m.net_gbs);
    let mut t = table(&["path", "serial s", "pipelined s", "bottleneck", "host-memory bytes"]);
    for (name, p) in [("staged via host", &m.staged), ("direct (GPUDirect)", &m.direct)] {
        t.add_row(vec![
            name.to_string(),
            format!("{:.6}", p.serial_s),
            format!("{:.6}", p.pipelined_s),
            p.bottleneck.to_string(),
            format!("{}", p.host_memory_bytes),
        ]);
    }
    s += &format!("{t}\n");
    s += &format!("staged/direct: serial {:.3}x, pipelined {:.3}x\n", m.serial_ratio, m.pipelined_ratio);
    s += &format!(
        "crossover: below {} GB/s of PCIe the staged path is bandwidth-limited (direct path: below {} GB/s)\n",
        m.staged_crossover_pcie_gbs, m.direct_crossover_pcie_gbs
    );
    s
}

/// The injection model.
pub fn injection(m: &Injection) -> String {
    let mut s = format!("{MODEL_BANNER}\n");
    s += &format!("{} GPUs, {} adapters x {} GB/s, scale-up {} GB/s per GPU\n", m.gpus, m.nics, m.nic_gbs, m.scaleup_gbs);
    s += &format!("node injection:  {} GB/s\n", m.node_gbs);
    s += &format!("per-GPU share:   {} GB/s\n", m.per_gpu_gbs);
    s += &format!("ratio to scale-up: {} (1/{:.1})\n", m.ratio_to_scaleup, 1.0 / m.ratio_to_scaleup);
    if let (Some(t), Some(n)) = (m.target_ratio, m.min_nics_for_target) {
        s += &format!("adapters needed for ratio {t}: {n}\n");
    }
    s
}

/// The peer-copy cross-check.
pub fn peer_bw(v: &[PairVerdict], th: &Thresholds, source: &str, measured_here: bool) -> String {
    let what = if measured_here { "the measurements above" } else { "supplied measurements" };
    let tail = if measured_here { "" } else { "; nothing was measured by this command" };
    let mut s = format!("cross-check of {what} against {source} (PCIe ceiling {} GB/s{tail})\n", th.pcie_ceiling_gbs);
    let mut t = table(&["src", "dst", "class", "bytes", "GB/s", "peer", "wrong", "flags"]);
    for p in v {
        t.add_row(vec![
            p.src.to_string(),
            p.dst.to_string(),
            p.class.name().to_string(),
            p.bytes.to_string(),
            format!("{:.1}", p.gbps),
            if p.peer_access { "yes" } else { "no" }.to_string(),
            p.wrong_bytes.to_string(),
            p.flags.join(","),
        ]);
    }
    s += &format!("{t}\n");
    for p in v {
        for r in &p.reasons {
            s += &format!("GPU{} -> GPU{}: {r}\n", p.src, p.dst);
        }
    }
    let n = v.iter().filter(|p| !p.flags.is_empty()).count();
    s += &format!("{n} of {} pairs flagged\n", v.len());
    s
}

/// Copies measured here: one row per (pair, size).
pub fn measured(ms: &[Measured], class_of: impl Fn(usize, usize) -> String) -> String {
    let mut t = table(&["src", "dst", "kind", "class", "size", "GB/s", "peer", "verified", "ms", "iters"]);
    for m in ms {
        t.add_row(vec![
            m.m.src.to_string(),
            m.m.dst.to_string(),
            m.label.to_string(),
            class_of(m.m.src, m.m.dst),
            bytes_text(m.m.bytes),
            format!("{:.1}", m.m.gbps),
            if m.m.peer_access { "yes" } else { "no" }.to_string(),
            if m.verified { "yes".to_string() } else { format!("NO ({} wrong bytes)", m.m.wrong_bytes) },
            format!("{:.3}", m.elapsed_ms),
            m.iterations.to_string(),
        ]);
    }
    format!("{t}\n")
}
