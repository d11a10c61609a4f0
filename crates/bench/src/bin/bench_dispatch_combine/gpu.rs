//! `--device gpu`: MORI-EP intranode dispatch/combine on GPUs, checked against the host
//! reference and timed next to a plain device-to-device copy of the same byte count (the
//! roofline) measured in the same run.
//!
//! Ranks: `--world-size W` ranks, `--num-gpus G` GPUs (rank r on GPU `r / (W/G)`),
//! `--procs P` processes (this one plus P-1 it spawns; each hosts W/P consecutive ranks and
//! their heaps are joined through IPC). Default: all ranks in one process on GPU 0 (the single
//! H200 setup: 8 ranks share one GPU, one launch serves them all).
//!
//! Times are CUDA-event times of one launch per device averaged over `--iters` after
//! `--warmup`. The first iteration is checked unless `--no-check`: every rank's received rows,
//! weights, indices, scales and sources (sorted by source) against the oracle's bytes, and the
//! combine output against the oracle's combine of the same inputs (bit-exact unweighted;
//! weighted within 1e-2 relative, f32 FMA contraction may differ). Later iterations reuse the
//! first iteration's combine input rows; their slot order may differ, so only their timing
//! counts.

use crate::args::{config, err, AnyResult, Args, DType, IdxType};
use crate::gpu_check::{check_combine, check_dispatch};
use crate::inputs::{bytes_of, comb_value, gen_inputs, Inputs};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use mori_bootstrap::{Bootstrap, SocketBootstrap, SocketBootstrapConfig};
use mori_ep::gpu::{perfetto_trace, CombineInput, CombineSpec, DispatchInput, DispatchSpec, IntranodeEp};
use mori_ep::{
    accounting, bf16, dispatch, quantize_fp8_blocks, DispatchHandle, DispatchOptions, EpConfig, OutOfRange, RankInput, SrcPos, Tensor2,
};
use mori_gpu::{Device, DeviceBuffer, Runtime, Stream};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RankFigures {
    rank: usize,
    gpu: u32,
    recv_tokens: usize,
    rdma_algo_tokens: u64,
    rdma_physical_tokens: f64,
    dispatch_us: f64,
    combine_us: f64,
    dispatch_bytes: u64,
    combine_bytes: u64,
    dispatch_gbps: f64,
    combine_gbps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeviceFigures {
    gpu: u32,
    ranks: Vec<usize>,
    dispatch_us: f64,
    combine_us: f64,
    dispatch_bytes: u64,
    combine_bytes: u64,
    dispatch_gbps: f64,
    combine_gbps: f64,
    copy_dispatch_gbps: f64,
    copy_combine_gbps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
struct ProcFigures {
    ranks: Vec<RankFigures>,
    devices: Vec<DeviceFigures>,
    check: String,
}

/// Host-side byte images of one rank's dispatch inputs.
pub struct HostRank {
    pub x: Vec<u8>,
    pub w: Vec<u8>,
    pub idx: Vec<u8>,
    pub scales: Vec<u8>,
}

/// The oracle's received bytes of one rank, in canonical (source) order.
pub struct OracleRecv {
    pub x: Vec<u8>,
    pub w: Vec<u8>,
    pub idx: Vec<u8>,
    pub scales: Vec<u8>,
    pub src: Vec<SrcPos>,
}

/// The oracle's dispatch of all ranks: received bytes per rank and the handle.
pub type Oracle = (Vec<OracleRecv>, DispatchHandle);

pub fn host_images_and_oracle(a: &Args, cfg: &EpConfig, inp: &Inputs, want_oracle: bool) -> AnyResult<(Vec<HostRank>, Option<Oracle>)> {
    let idx_bytes = |t: &Tensor2<i64>| match a.idx_type {
        IdxType::I64 => bytes_of(t),
        IdxType::I32 => bytes_of(&t.map(|&v| v as i32)),
    };
    macro_rules! go {
        ($xs:expr, $scales:expr) => {{
            let xs = $xs;
            let scales: Vec<Option<Tensor2<f32>>> = $scales;
            let host: Vec<HostRank> = (0..cfg.world_size)
                .map(|r| HostRank {
                    x: bytes_of(&xs[r]),
                    w: bytes_of(&inp.weights[r]),
                    idx: idx_bytes(&inp.idx[r]),
                    scales: scales[r].as_ref().map(bytes_of).unwrap_or_default(),
                })
                .collect();
            let oracle = if want_oracle {
                let inputs: Vec<RankInput<_, i64, f32>> = (0..cfg.world_size)
                    .map(|r| RankInput {
                        x: xs[r].clone(),
                        weights: inp.weights[r].clone(),
                        scales: scales[r].clone(),
                        indices: inp.idx[r].clone(),
                    })
                    .collect();
                let d = dispatch(cfg, &inputs, DispatchOptions::default())?;
                let recv = d
                    .ranks
                    .iter()
                    .map(|rr| OracleRecv {
                        x: bytes_of(&rr.x),
                        w: bytes_of(&rr.weights),
                        idx: idx_bytes(&rr.indices),
                        scales: rr.scales.as_ref().map(bytes_of).unwrap_or_default(),
                        src: rr.src.clone(),
                    })
                    .collect();
                Some((recv, d.handle))
            } else {
                None
            };
            (host, oracle)
        }};
    }
    Ok(match a.dtype {
        DType::F32 => go!(inp.x_f32.clone(), vec![None; cfg.world_size]),
        DType::Bf16 => go!(inp.x_f32.iter().map(|t| t.map(|&v| bf16::from_f32(v))).collect::<Vec<_>>(), vec![None; cfg.world_size]),
        DType::Fp8 => {
            let (q, s): (Vec<_>, Vec<_>) = inp.x_f32.iter().map(quantize_fp8_blocks).unzip();
            go!(q, s.into_iter().map(Some).collect())
        }
    })
}

pub fn run(a: &Args) -> AnyResult<bool> {
    let cfg = config(a)?;
    if cfg.kernel_type != mori_ep::KernelType::IntraNode {
        return crate::gpu_inter::run(a, &cfg);
    }
    // Output files are created before the GPU work, so an unwritable path fails first.
    if a.proc_index == 0 {
        for (flag, path) in [("--json", &a.json), ("--trace", &a.trace)] {
            if let Some(path) = path {
                std::fs::File::create(path).map_err(|e| err(format!("{flag} {path}: cannot be written: {e}")))?;
            }
        }
    }
    let rt: Arc<dyn Runtime> = mori_gpu::detect()?;
    let ndev = rt.device_count()? as usize;
    if a.num_gpus > ndev {
        return Err(err(format!("--num-gpus {} but the runtime sees {ndev} device(s)", a.num_gpus)));
    }
    let w = cfg.world_size;
    let per_proc = w / a.procs;
    let per_gpu = w / a.num_gpus;
    let local: Vec<(usize, Device)> =
        (a.proc_index * per_proc..(a.proc_index + 1) * per_proc).map(|r| (r, Device((r / per_gpu) as u32))).collect();

    // Processes: this one spawns the others and roots the bootstrap.
    let mut children: Vec<Child> = Vec::new();
    let boot: Option<SocketBootstrap> = if a.procs > 1 {
        let master = match a.proc_master {
            Some(m) => m,
            None => {
                let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
                let m: SocketAddr = format!("127.0.0.1:{port}").parse()?;
                let exe = std::env::current_exe()?;
                let argv: Vec<String> = std::env::args().skip(1).collect();
                for i in 1..a.procs {
                    children.push(
                        Command::new(&exe).args(&argv).args(["--proc-index", &i.to_string(), "--proc-master", &m.to_string()]).spawn()?,
                    );
                }
                m
            }
        };
        let bc = SocketBootstrapConfig::new(a.proc_index, a.procs, master).with_timeouts(Duration::from_secs(60), Duration::from_secs(120));
        Some(SocketBootstrap::new(bc)?)
    } else {
        None
    };
    let result = run_ranks(a, &cfg, rt, &local, boot.as_ref().map(|b| b as &dyn Bootstrap));
    for mut c in children {
        let st = c.wait()?;
        if !st.success() {
            eprintln!("bench_dispatch_combine: process {:?} exited with {st}", c.id());
            return Ok(false);
        }
    }
    result
}

fn run_ranks(a: &Args, cfg: &EpConfig, rt: Arc<dyn Runtime>, local: &[(usize, Device)], boot: Option<&dyn Bootstrap>) -> AnyResult<bool> {
    let t_setup = Instant::now();
    let check = !a.no_check;
    let inp = gen_inputs(a, cfg)?;
    let (host, oracle) = host_images_and_oracle(a, cfg, &inp, check)?;
    let host_s = t_setup.elapsed().as_secs_f64();
    let mut ep = IntranodeEp::new(rt.clone(), cfg, local, boot, Duration::from_millis(a.timeout_ms), a.trace.is_some())?;
    let devices = ep.devices();
    let streams: Vec<Stream> = devices.iter().map(|&d| rt.stream(d)).collect::<Result<_, _>>()?;
    let sref: Vec<&Stream> = streams.iter().collect();
    let idx_size = a.idx_type.size();
    let (c_in, c_out) = (a.combine_dtype.size(), a.combine_dtype.size());

    // Device inputs per local rank.
    let upload = |dev: Device, b: &[u8]| -> AnyResult<Option<DeviceBuffer>> {
        if b.is_empty() {
            return Ok(None);
        }
        let buf = rt.alloc(dev, b.len())?;
        rt.copy_htod(&buf.slice(), b)?;
        Ok(Some(buf))
    };
    struct Dev {
        x: Option<DeviceBuffer>,
        w: Option<DeviceBuffer>,
        idx: Option<DeviceBuffer>,
        scales: Option<DeviceBuffer>,
        out: DeviceBuffer,
        out_w: DeviceBuffer,
    }
    let mut dev_in = Vec::new();
    for &(r, d) in local {
        let h = &host[r];
        dev_in.push(Dev {
            x: upload(d, &h.x)?,
            w: upload(d, &h.w)?,
            idx: upload(d, &h.idx)?,
            scales: upload(d, &h.scales)?,
            out: rt.alloc(d, (a.num_tokens * a.hidden * c_out).max(16))?,
            out_w: rt.alloc(d, (a.num_tokens * a.top_k * 4).max(16))?,
        });
    }
    let empty = rt.alloc(devices[0], 16)?;
    let dispatch_inputs: Vec<DispatchInput<'_>> = dev_in
        .iter()
        .map(|d| DispatchInput {
            x: d.x.as_ref().map_or(empty.slice(), |b| b.slice()),
            weights: d.w.as_ref().map(|b| b.slice()),
            indices: d.idx.as_ref().map_or(empty.slice(), |b| b.slice()),
            scales: d.scales.as_ref().map(|b| b.slice()),
            num_tokens: a.num_tokens,
        })
        .collect();
    let dspec = DispatchSpec { elem_size: a.dtype.size(), idx_size, drop_out_of_range: false };
    let cspec = CombineSpec { in_elem: c_in, out_elem: c_out, weighted: a.weighted, idx_size };
    let flush = if a.l2_flush { Some(rt.alloc(devices[0], 256 << 20)?) } else { None };
    let ev: Vec<[mori_gpu::Event; 4]> = devices
        .iter()
        .map(|&d| Ok([rt.event(d, true)?, rt.event(d, true)?, rt.event(d, true)?, rt.event(d, true)?]))
        .collect::<AnyResult<_>>()?;

    let mut t_disp = vec![0f64; devices.len()];
    let mut t_comb = vec![0f64; devices.len()];
    let mut check_msg = if check { String::new() } else { "skipped".to_string() };
    let mut all_ok = true;
    let total_iters = a.warmup + a.iters;
    let mut recv_counts = Vec::new();
    for it in 0..total_iters.max(1) {
        if let Some(f) = &flush {
            rt.memset(&f.slice(), (it & 0xff) as u8)?;
        }
        for (i, s) in streams.iter().enumerate() {
            ev[i][0].record(s)?;
        }
        let ticket = ep.dispatch(&dispatch_inputs, dspec, &sref)?;
        for (i, s) in streams.iter().enumerate() {
            ev[i][1].record(s)?;
        }
        for s in &streams {
            s.synchronize()?;
        }
        let status = ep.sync_status()?;
        recv_counts = status.iter().map(|s| s.recv_count).collect();
        if it == 0 {
            // Combine inputs (in the heap): rows as a function of each slot's source.
            for (li, &(r, _)) in local.iter().enumerate() {
                let n = recv_counts[li];
                let [_, rw, _, _, rsrc] = ep.recv_slices(r, n, a.dtype.size(), idx_size)?;
                let mut src_b = vec![0u8; n * 4];
                if n > 0 {
                    rt.copy_dtoh(&mut src_b, &rsrc)?;
                }
                let mut rows = Vec::with_capacity(n * a.hidden * c_in);
                for c in src_b.chunks(4) {
                    let flat = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
                    let sp = SrcPos::from_flat(flat, cfg.max_tokens_per_rank).unwrap_or(SrcPos { rank: 0, token: 0 });
                    for h in 0..a.hidden {
                        let v = comb_value(sp, h);
                        if c_in == 2 {
                            rows.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
                        } else {
                            rows.extend_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                if n > 0 {
                    let cb = ep.combine_buffer(r, c_in)?;
                    rt.copy_htod(&cb.sub(0, rows.len())?, &rows)?;
                    // Combine weights = received weights, copied into the heap's weights region.
                    rt.copy_dtod(&ep.combine_weights_buffer(r)?.sub(0, n * a.top_k * 4)?, &rw)?;
                }
            }
            if let Some((orc, _)) = &oracle {
                match check_dispatch(&ep, rt.as_ref(), local, orc, a, idx_size, &recv_counts) {
                    Ok(()) => {}
                    Err(e) => {
                        all_ok = false;
                        check_msg = format!("dispatch MISMATCH: {e}");
                    }
                }
            }
        }
        if let Some(f) = &flush {
            rt.memset(&f.slice(), (it & 0xff) as u8)?;
        }
        let comb_inputs: Vec<CombineInput<'_>> = dev_in
            .iter()
            .map(|d| CombineInput { x: None, weights: None, weights_in_heap: true, out: d.out.slice(), out_weights: Some(d.out_w.slice()) })
            .collect();
        for (i, s) in streams.iter().enumerate() {
            ev[i][2].record(s)?;
        }
        ep.combine(&ticket, &comb_inputs, cspec, &sref)?;
        for (i, s) in streams.iter().enumerate() {
            ev[i][3].record(s)?;
        }
        for s in &streams {
            s.synchronize()?;
        }
        ep.sync_status()?;
        if it == 0 && check && all_ok {
            if let Some((orc, handle)) = &oracle {
                match check_combine(
                    a,
                    cfg,
                    &inp,
                    orc,
                    handle,
                    rt.as_ref(),
                    local,
                    &dev_in.iter().map(|d| (&d.out, &d.out_w)).collect::<Vec<_>>(),
                ) {
                    Ok(()) => check_msg = "OK (dispatch rows, weights, indices, scales, sources; combine output and weights)".into(),
                    Err(e) => {
                        all_ok = false;
                        check_msg = format!("combine MISMATCH: {e}");
                    }
                }
            }
        }
        if it >= a.warmup {
            for i in 0..devices.len() {
                t_disp[i] += ev[i][0].elapsed_ms(&ev[i][1])? as f64 * 1e3;
                t_comb[i] += ev[i][2].elapsed_ms(&ev[i][3])? as f64 * 1e3;
            }
        }
    }
    let iters = a.iters.max(1) as f64;
    if let Some(path) = &a.trace {
        if let Some(t) = ep.trace()? {
            if a.proc_index == 0 {
                let mut json = serde_json::to_string(&perfetto_trace(&t))?;
                json.push('\n');
                std::fs::write(path, json)?;
            }
        }
    }

    // Figures.
    let scale_bytes = cfg.scale_dim * cfg.scale_type_size;
    let d_tok = (a.hidden * a.dtype.size() + scale_bytes) as u64;
    let c_tok = (a.hidden * c_in) as u64;
    let mut pf = ProcFigures { check: check_msg.clone(), ..Default::default() };
    for (gi, &d) in devices.iter().enumerate() {
        let ranks: Vec<usize> = local.iter().filter(|l| l.1 == d).map(|l| l.0).collect();
        let n: usize = local.iter().enumerate().filter(|(_, l)| l.1 == d).map(|(i, _)| recv_counts[i]).sum();
        let (db, cb) = (n as u64 * d_tok, n as u64 * c_tok);
        let (du, cu) = (t_disp[gi] / iters, t_comb[gi] / iters);
        let copy_d = copy_gbps(rt.as_ref(), d, db as usize, &streams[gi])?;
        let copy_c = copy_gbps(rt.as_ref(), d, cb as usize, &streams[gi])?;
        pf.devices.push(DeviceFigures {
            gpu: d.0,
            ranks,
            dispatch_us: du,
            combine_us: cu,
            dispatch_bytes: db,
            combine_bytes: cb,
            dispatch_gbps: accounting::bandwidth_gbps_from_us(db, du),
            combine_gbps: accounting::bandwidth_gbps_from_us(cb, cu),
            copy_dispatch_gbps: copy_d,
            copy_combine_gbps: copy_c,
        });
    }
    for (li, &(r, d)) in local.iter().enumerate() {
        let gi = devices.iter().position(|&x| x == d).unwrap_or(0);
        let nodes = cfg.world_size / cfg.gpus_per_node.max(1);
        let algo = accounting::rdma_algo_token_count(&inp.idx[r], cfg.num_experts(), nodes.max(1), OutOfRange::Error)?;
        let (du, cu) = (t_disp[gi] / iters, t_comb[gi] / iters);
        let n = recv_counts[li] as u64;
        pf.ranks.push(RankFigures {
            rank: r,
            gpu: d.0,
            recv_tokens: recv_counts[li],
            rdma_algo_tokens: algo,
            rdma_physical_tokens: accounting::rdma_physical_tokens(algo, nodes as u64),
            dispatch_us: du,
            combine_us: cu,
            dispatch_bytes: n * d_tok,
            combine_bytes: n * c_tok,
            dispatch_gbps: accounting::bandwidth_gbps_from_us(n * d_tok, du),
            combine_gbps: accounting::bandwidth_gbps_from_us(n * c_tok, cu),
        });
    }
    // Gather to process 0.
    let all: Vec<ProcFigures> = match boot {
        Some(b) => b.allgather(&serde_json::to_vec(&pf)?)?.iter().map(|v| serde_json::from_slice(v)).collect::<Result<_, _>>()?,
        None => vec![pf],
    };
    let ok = all_ok && all.iter().all(|p| p.check.starts_with("OK") || p.check == "skipped");
    if a.proc_index == 0 {
        report(a, cfg, &all, host_s)?;
    }
    Ok(ok)
}

fn copy_gbps(rt: &dyn Runtime, d: Device, bytes: usize, s: &Stream) -> AnyResult<f64> {
    if bytes == 0 {
        return Ok(0.0);
    }
    let src = rt.alloc(d, bytes)?;
    let dst = rt.alloc(d, bytes)?;
    let (e0, e1) = (rt.event(d, true)?, rt.event(d, true)?);
    for _ in 0..3 {
        rt.copy_dtod_async(&dst.slice(), &src.slice(), s)?;
    }
    let n = 10;
    e0.record(s)?;
    for _ in 0..n {
        rt.copy_dtod_async(&dst.slice(), &src.slice(), s)?;
    }
    e1.record(s)?;
    s.synchronize()?;
    let us = e0.elapsed_ms(&e1)? as f64 * 1e3 / n as f64;
    Ok(accounting::bandwidth_gbps_from_us(bytes as u64, us))
}

fn report(a: &Args, cfg: &EpConfig, all: &[ProcFigures], host_s: f64) -> AnyResult<()> {
    println!(
        "bench_dispatch_combine: world {} ({} per GPU, {} GPU(s), {} process(es)), T={} H={} E={} K={} dispatch {:?} combine {:?} idx {:?}, {} blocks x {} warps per rank, iters {} warm-up {}{}{}",
        cfg.world_size,
        cfg.world_size / a.num_gpus,
        a.num_gpus,
        a.procs,
        a.num_tokens,
        a.hidden,
        a.num_experts,
        a.top_k,
        a.dtype,
        a.combine_dtype,
        a.idx_type,
        cfg.block_num,
        cfg.warps_per_block,
        a.iters,
        a.warmup,
        if a.l2_flush { ", L2 flushed" } else { "" },
        if a.weighted { ", weighted combine" } else { "" },
    );
    let mut ranks: Vec<&RankFigures> = all.iter().flat_map(|p| p.ranks.iter()).collect();
    ranks.sort_by_key(|r| r.rank);
    let lines: Vec<(usize, u64, u64)> = ranks.iter().map(|r| (r.rank, r.recv_tokens as u64, r.rdma_algo_tokens)).collect();
    let rows = ranks
        .iter()
        .map(|r| {
            vec![
                r.rank.to_string(),
                r.gpu.to_string(),
                r.recv_tokens.to_string(),
                r.rdma_algo_tokens.to_string(),
                format!("{:.0}", r.rdma_physical_tokens),
                format!("{:.1}", r.dispatch_us),
                format!("{:.1}", r.combine_us),
                format!("{:.1}", r.dispatch_gbps),
                format!("{:.1}", r.combine_gbps),
            ]
        })
        .collect();
    crate::table::print_ranks(
        &lines,
        &["rank", "gpu", "recv tokens", "rdma algo", "rdma phys", "dispatch µs", "combine µs", "dispatch XGMI GB/s", "combine XGMI GB/s"],
        rows,
    );
    let mut d = Table::new();
    d.load_preset(UTF8_BORDERS_ONLY);
    d.set_header(vec![
        "gpu",
        "ranks",
        "dispatch µs",
        "dispatch GB/s",
        "copy GB/s",
        "dispatch/copy",
        "combine µs",
        "combine GB/s",
        "copy GB/s",
        "combine/copy",
    ]);
    for p in all {
        for g in &p.devices {
            d.add_row(vec![
                g.gpu.to_string(),
                format!("{:?}", g.ranks),
                format!("{:.1}", g.dispatch_us),
                format!("{:.1}", g.dispatch_gbps),
                format!("{:.1}", g.copy_dispatch_gbps),
                format!("{:.2}", g.dispatch_gbps / g.copy_dispatch_gbps.max(1e-9)),
                format!("{:.1}", g.combine_us),
                format!("{:.1}", g.combine_gbps),
                format!("{:.1}", g.copy_combine_gbps),
                format!("{:.2}", g.combine_gbps / g.copy_combine_gbps.max(1e-9)),
            ]);
        }
    }
    println!("per GPU (bytes of all received tokens on the GPU; copy = cuMemcpyDtoD of the same byte count, same run):");
    println!("{d}");
    for (i, p) in all.iter().enumerate() {
        println!("check (process {i}): {}", p.check);
    }
    println!("host inputs + oracle: {host_s:.1} s");
    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "world_size": cfg.world_size, "num_gpus": a.num_gpus, "procs": a.procs,
            "num_tokens": a.num_tokens, "hidden": a.hidden, "num_experts": a.num_experts, "top_k": a.top_k,
            "dtype": a.dtype, "combine_dtype": a.combine_dtype, "block_num": cfg.block_num,
            "warps_per_block": cfg.warps_per_block, "iters": a.iters, "l2_flush": a.l2_flush, "weighted": a.weighted,
            "processes": all,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(())
}
