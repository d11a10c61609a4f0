//! `mori`: check a node, read its topology, judge peer-copy numbers, model staging and
//! injection, analyze EP kernel traces and their RDMA utilization.

mod args;

use args::*;
use clap::Parser;
use mori_cli::class::{parse_group, LinkClass, TopoMatrix};
use mori_cli::error::read_input;
use mori_cli::gpu::{self as gpu_rt, MeasureConfig, Measured};
use mori_cli::peer_bw::{cross_check, MeasurementFile, PairVerdict, Thresholds};
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
        Some(p) => topo::parse_capture(&read_input(p)?, vendor).map_err(|e| CliError::input(format!("{}: {e}", p.display()))),
        None => topo::from_sysfs(&scan(root)?),
    }
}

fn run_check(a: CheckArgs) -> CliResult<i32> {
    let t = scan(&a.sysfs_root)?;
    let rt = gpu_rt::detect();
    let mut r = check::report(&t, &a.sysfs_root, std::env::vars(), rt.as_ref().map_err(String::as_str));
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

fn thresholds(a: &PeerBwArgs) -> CliResult<Thresholds> {
    Ok(Thresholds {
        pcie_ceiling_gbs: mori_cli::error::positive("--pcie-ceiling-gbs", a.pcie_ceiling_gbs)?,
        outlier_fraction: mori_cli::error::positive("--outlier-fraction", a.outlier_fraction)?,
    })
}

fn run_peer_bw(a: PeerBwArgs) -> CliResult<i32> {
    let Some(path) = a.measurements.clone() else {
        return measure_peer_bw(a);
    };
    let file: MeasurementFile = serde_json::from_str(&read_input(&path)?)
        .map_err(|e| CliError::input(format!("{}: not a measurement file: {e}", path.display())))?;
    let m = load_topo(a.topo.as_deref(), a.vendor, &a.sysfs_root)?;
    let th = thresholds(&a)?;
    let v = cross_check(&file.measurements, &m, th)?;
    #[derive(Serialize)]
    struct Out<'a> {
        measured_here: bool,
        topology_source: &'a str,
        thresholds: Thresholds,
        pairs: &'a [PairVerdict],
        flagged: usize,
    }
    let flagged = v.iter().filter(|p| !p.flags.is_empty()).count();
    let out = Out { measured_here: false, topology_source: &m.source, thresholds: th, pairs: &v, flagged };
    emit(a.c.json, &out, || render::peer_bw(&v, &th, &m.source, false))?;
    Ok(if flagged > 0 { EXIT_NO } else { EXIT_OK })
}

/// `mori peer-bw` without --measurements: every ordered pair of this machine's GPUs.
fn measure_peer_bw(a: PeerBwArgs) -> CliResult<i32> {
    let th = thresholds(&a)?;
    let cfg = MeasureConfig { sizes: gpu_rt::parse_sizes(&a.sizes)?, iterations: a.iters, warmup: a.warmup };
    if cfg.iterations == 0 {
        return Err(CliError::input("--iters must be at least 1"));
    }
    // A capture given with --topo is read before any GPU work: bad input fails fast.
    let capture = a
        .topo
        .as_deref()
        .map(|p| topo::parse_capture(&read_input(p)?, a.vendor).map_err(|e| CliError::input(format!("{}: {e}", p.display()))))
        .transpose()?;
    let rt = gpu_rt::detect().map_err(|e| {
        CliError::Unavailable(format!(
            "{e}: nothing was measured; to cross-check measurements taken elsewhere, pass --measurements FILE (and --topo CAPTURE)"
        ))
    })?;
    let n = rt.device_count().map_err(|e| CliError::Unavailable(format!("GPU device count: {}", gpu_rt::one_line(&e.to_string()))))?;
    #[derive(Serialize)]
    struct Dev {
        index: u32,
        name: String,
        pci_bus_id: String,
    }
    let mut devices = Vec::new();
    for i in 0..n {
        let p = rt
            .device_properties(mori_gpu::Device(i))
            .map_err(|e| CliError::Unavailable(format!("properties of GPU {i}: {}", gpu_rt::one_line(&e.to_string()))))?;
        devices.push(Dev { index: i, name: p.name, pci_bus_id: p.pci_bus_id.to_string() });
    }
    let bus: Vec<String> = devices.iter().map(|d| d.pci_bus_id.clone()).collect();
    let topo_m = match capture {
        Some(c) => gpu_rt::align_topology(&bus, Ok(c), true)?,
        None => {
            let sys = scan(&a.sysfs_root).and_then(|t| topo::from_sysfs(&t)).map_err(|e| e.to_string());
            gpu_rt::align_topology(&bus, sys, false)?
        }
    };
    let json = a.c.json;
    let ms = gpu_rt::measure(&rt, &cfg, |m| {
        if !json {
            eprintln!(
                "GPU{} -> GPU{} {:>8}: {:8.1} GB/s{}",
                m.m.src,
                m.m.dst,
                gpu_rt::bytes_text(m.m.bytes),
                m.m.gbps,
                if m.verified { String::new() } else { format!("  {} WRONG BYTES", m.m.wrong_bytes) }
            );
        }
    })?;
    let plain: Vec<_> = ms.iter().map(|m| m.m.clone()).collect();
    let v = cross_check(&plain, &topo_m, th)?;
    let flagged = v.iter().filter(|p| !p.flags.is_empty()).count();
    let failures = ms.iter().filter(|m| !m.verified).count();
    #[derive(Serialize)]
    struct Out<'a> {
        measured_here: bool,
        runtime: String,
        devices: &'a [Dev],
        config: &'a MeasureConfig,
        topology_source: &'a str,
        topology_notes: &'a [String],
        topology: &'a [Vec<mori_cli::class::LinkClass>],
        thresholds: Thresholds,
        measurements: &'a [Measured],
        verification_failures: usize,
        pairs: &'a [PairVerdict],
        flagged: usize,
    }
    let runtime = format!(
        "{} ({}{})",
        rt.kind(),
        rt.library(),
        rt.driver_version().map_or(String::new(), |d| format!(", driver {}", gpu_rt::driver_version_text(rt.kind(), d)))
    );
    let out = Out {
        measured_here: true,
        runtime,
        devices: &devices,
        config: &cfg,
        topology_source: &topo_m.source,
        topology_notes: &topo_m.notes,
        topology: &topo_m.gpu_gpu,
        thresholds: th,
        measurements: &ms,
        verification_failures: failures,
        pairs: &v,
        flagged,
    };
    emit(json, &out, || {
        let mut s = format!(
            "peer-copy bandwidth measured here: {}; {} device(s); {} timed copies after {} warm-up per pair and size; GB = 1e9 bytes of payload\n",
            out.runtime,
            devices.len(),
            cfg.iterations,
            cfg.warmup
        );
        for d in &devices {
            s += &format!("  GPU{} {} ({})\n", d.index, d.name, d.pci_bus_id);
        }
        s += &render::measured(&ms, |i, j| topo_m.gpu_gpu[i][j].name().to_string());
        for note in &topo_m.notes {
            s += &format!("topology note: {note}\n");
        }
        s += &render::peer_bw(&v, &th, &topo_m.source, true);
        if failures > 0 {
            s += &format!("{failures} copies did NOT verify\n");
        }
        s
    })?;
    Ok(if flagged > 0 || failures > 0 { EXIT_NO } else { EXIT_OK })
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
                    CliError::input(format!("{}: no {} kernel in the trace (is it an internode trace?)", p.display(), k.label()))
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
    // Like other Unix tools, end quietly when the reader of stdout goes away
    // (`mori ... --json | head`): Rust ignores SIGPIPE, which turned that into a panic.
    // SAFETY: restoring a signal's default disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
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
