//! `mori`: check a node, read its topology, judge peer-copy numbers, model staging and
//! injection, analyze EP kernel traces and their RDMA utilization.

mod args;

use args::*;
use clap::Parser;
use mori_cli::class::{parse_group, LinkClass, TopoMatrix};
use mori_cli::error::read_input;
use mori_cli::peer_bw::{cross_check, MeasurementFile, Thresholds};
use mori_cli::rdma_util::{Durations, Shape};
use mori_cli::topo::Vendor;
use mori_cli::trace::Kernel;
use mori_cli::{check, gantt, model, rdma_util, render, topo, trace, CliError, CliResult, EXIT_NO, EXIT_OK};
use serde::Serialize;
use std::path::Path;

fn emit<T: Serialize>(json: bool, value: &T, text: impl FnOnce() -> String) -> CliResult<()> {
    if json {
        let s = serde_json::to_string_pretty(value).map_err(|e| CliError::input(format!("JSON output: {e}")))?;
        println!("{s}");
    } else {
        print!("{}", text());
    }
    Ok(())
}

fn scan(root: &Path) -> CliResult<mori_topo::Topology> {
    mori_topo::scan(root).map_err(|e| CliError::input(e.to_string()))
}

fn load_topo(input: Option<&Path>, vendor: Vendor, root: &Path) -> CliResult<TopoMatrix> {
    match input {
        Some(p) => {
            topo::parse_capture(&read_input(p)?, vendor).map_err(|e| CliError::input(format!("{}: {e}", p.display())))
        }
        None => topo::from_sysfs(&scan(root)?),
    }
}

fn run_check(a: CheckArgs) -> CliResult<i32> {
    let t = scan(&a.sysfs_root)?;
    let mut r = check::report(&t, &a.sysfs_root, std::env::vars());
    if let Some(b) = &a.backend {
        r.request(b, &a.memory);
    }
    emit(a.c.json, &r, || r.render())?;
    Ok(if r.requested.as_ref().is_some_and(|q| !q.ok) { EXIT_NO } else { EXIT_OK })
}

fn run_topo(a: TopoArgs) -> CliResult<i32> {
    let m = load_topo(a.input.as_deref(), a.vendor, &a.sysfs_root)?;
    let verdict = a.group.as_deref().map(|g| m.worst_class_in_group(&parse_group(g)?)).transpose()?;
    let limit = a.max_class.as_deref().map(LinkClass::parse).transpose()?;
    #[derive(Serialize)]
    struct Out<'a> {
        topology: &'a TopoMatrix,
        group: Option<&'a mori_cli::class::GroupVerdict>,
        within_max_class: Option<bool>,
    }
    let within = limit.zip(verdict.as_ref()).map(|(l, v)| v.worst <= l);
    emit(a.c.json, &Out { topology: &m, group: verdict.as_ref(), within_max_class: within }, || {
        let mut s = m.render();
        if let Some(v) = &verdict {
            let pairs: Vec<String> = v.worst_pairs.iter().map(|(a, b)| format!("GPU{a}-GPU{b}")).collect();
            s += &format!("group {:?}: worst class {} ({})\n", v.group, v.worst.name(), pairs.join(", "));
        }
        if let (Some(l), Some(ok)) = (limit, within) {
            s += &format!("max class {}: {}\n", l.name(), if ok { "within" } else { "EXCEEDED" });
        }
        s
    })?;
    Ok(if within == Some(false) { EXIT_NO } else { EXIT_OK })
}

fn run_peer_bw(a: PeerBwArgs) -> CliResult<i32> {
    let Some(path) = a.measurements else {
        return Err(CliError::Unavailable(
            "no GPU runtime in this build (`mori` uses no CUDA/HIP runtime crate yet): nothing was measured; to cross-check measurements taken elsewhere, pass --measurements FILE (and --topo CAPTURE)".into(),
        ));
    };
    let file: MeasurementFile = serde_json::from_str(&read_input(&path)?)
        .map_err(|e| CliError::input(format!("{}: not a measurement file: {e}", path.display())))?;
    let m = load_topo(a.topo.as_deref(), a.vendor, &a.sysfs_root)?;
    let th = Thresholds {
        pcie_ceiling_gbs: mori_cli::error::positive("--pcie-ceiling-gbs", a.pcie_ceiling_gbs)?,
        outlier_fraction: mori_cli::error::positive("--outlier-fraction", a.outlier_fraction)?,
    };
    let v = cross_check(&file.measurements, &m, th)?;
    #[derive(Serialize)]
    struct Out<'a> {
        measured_here: bool,
        topology_source: &'a str,
        thresholds: Thresholds,
        pairs: &'a [mori_cli::peer_bw::PairVerdict],
        flagged: usize,
    }
    let flagged = v.iter().filter(|p| !p.flags.is_empty()).count();
    let out = Out { measured_here: false, topology_source: &m.source, thresholds: th, pairs: &v, flagged };
    emit(a.c.json, &out, || render::peer_bw(&v, &th, &m.source))?;
    Ok(if flagged > 0 { EXIT_NO } else { EXIT_OK })
}

fn run_model(cmd: ModelCmd) -> CliResult<i32> {
    #[derive(Serialize)]
    struct Out<T> {
        model: &'static str,
        result: T,
    }
    match cmd {
        ModelCmd::Staging { bytes, pcie_gbs, net_gbs, c } => {
            let m = model::staging(bytes, pcie_gbs, net_gbs)?;
            emit(c.json, &Out { model: model::MODEL_BANNER, result: &m }, || render::staging(&m))?;
        }
        ModelCmd::Injection { gpus_per_node, nics_per_node, nic_gbs, scaleup_gbs, target_ratio, c } => {
            let m = model::injection(gpus_per_node, nics_per_node, nic_gbs, scaleup_gbs, target_ratio)?;
            emit(c.json, &Out { model: model::MODEL_BANNER, result: &m }, || render::injection(&m))?;
        }
    }
    Ok(EXIT_OK)
}

fn analyze_file(p: &Path) -> CliResult<trace::Analysis> {
    let text = read_input(p)?;
    let spans = trace::parse(&text).map_err(|e| CliError::input(format!("{}: {e}", p.display())))?;
    trace::analyze(&spans).map_err(|e| CliError::input(format!("{}: {e}", p.display())))
}

fn run_trace(cmd: TraceCmd) -> CliResult<i32> {
    let TraceCmd::Analyze { trace: path, out, no_png, c } = cmd;
    let a = analyze_file(&path)?;
    let png = (!no_png).then(|| {
        out.unwrap_or_else(|| {
            let stem = path.file_stem().map_or("trace".into(), |s| s.to_string_lossy().into_owned());
            path.with_file_name(format!("{stem}.timeline.png"))
        })
    });
    if let Some(p) = &png {
        let title = path.file_name().map_or("trace".into(), |s| s.to_string_lossy().into_owned());
        gantt::draw(&a, p, &title)?;
    }
    #[derive(Serialize)]
    struct Out<'a> {
        png: Option<String>,
        #[serde(flatten)]
        analysis: &'a trace::Analysis,
    }
    let png_s = png.as_ref().map(|p| p.display().to_string());
    emit(c.json, &Out { png: png_s.clone(), analysis: &a }, || {
        let mut s = render::trace(&a);
        if let Some(p) = &png_s {
            s += &format!("timeline: {p}\n");
        }
        s
    })?;
    Ok(EXIT_OK)
}

fn run_rdma(a: RdmaArgs) -> CliResult<i32> {
    let elem_bytes = match a.dtype {
        DType::Bf16 => 2,
        DType::Fp8 => 1,
        DType::F32 => 4,
    };
    let default_scales = if matches!(a.dtype, DType::Fp8) { a.hidden.div_ceil(mori_ep::FP8_BLOCK as u64) } else { 0 };
    let shape = Shape {
        tokens: a.tokens,
        hidden: a.hidden,
        elem_bytes,
        top_k: a.topk,
        scale_dim: a.scale_dim.unwrap_or(default_scales),
        scale_bytes: a.scale_bytes,
        nodes: a.nodes,
        combine_weights: a.combine_weights,
    };
    let d = match &a.trace {
        Some(p) => {
            let t = analyze_file(p)?;
            let need = |k: Kernel| {
                t.mean_extent(k).map(|(d, _)| d).ok_or_else(|| {
                    CliError::input(format!(
                        "{}: no {} kernel in the trace (is it an internode trace?)",
                        p.display(),
                        k.label()
                    ))
                })
            };
            let sync: f64 = [Kernel::DispatchSync, Kernel::CombineSync, Kernel::CombineSyncBarrier]
                .iter()
                .filter_map(|k| t.mean_extent(*k).map(|(d, _)| d))
                .sum();
            Durations {
                send_us: need(Kernel::DispatchSend)?,
                recv_us: t.mean_extent(Kernel::DispatchRecv).map(|(d, _)| d),
                combine_us: need(Kernel::CombineInter)?,
                sync_us: (sync > 0.0).then_some(sync),
                iteration_us: Some(t.mean_iteration_us()),
            }
        }
        None => Durations {
            send_us: a.send_us.unwrap_or(0.0),
            recv_us: a.recv_us,
            combine_us: a.combine_us.unwrap_or(0.0),
            sync_us: a.sync_us,
            iteration_us: a.iteration_us,
        },
    };
    let r = rdma_util::compute(shape, d, a.link_gbit)?;
    emit(a.c.json, &r, || render::rdma(&r))?;
    Ok(EXIT_OK)
}

fn main() {
    let cli = Cli::parse();
    let (name, res) = match cli.cmd {
        Cmd::Check(a) => ("check", run_check(a)),
        Cmd::Topo(a) => ("topo", run_topo(a)),
        Cmd::PeerBw(a) => ("peer-bw", run_peer_bw(a)),
        Cmd::Model(m) => ("model", run_model(m)),
        Cmd::Trace(t) => ("trace", run_trace(t)),
        Cmd::RdmaUtil(a) => ("rdma-util", run_rdma(a)),
    };
    let code = res.unwrap_or_else(|e| {
        eprintln!("mori {name}: {e}");
        e.exit_code()
    });
    std::process::exit(code);
}
