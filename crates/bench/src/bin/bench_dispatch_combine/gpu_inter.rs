//! `--device gpu --kernel-type v1|v1_ll|async_ll` across nodes: every rank on one GPU, the nodes
//! as groups of ranks (`mori_ep::gpu_internode::InterNodeGpu`), the inter-node leg through each
//! rank's proxy over MORI-IO xgmi (default) or tcp with host staging (`--transport tcp`).
//! The first iteration is checked against the host reference byte for byte (received rows,
//! weights, ids, scales, sources in the reference's order; combine summed in the scheme's
//! order, over destination ranks ascending for async_ll and per node for v1 and v1_ll, bit-exact on
//! these integer-valued inputs, within 1e-2 relative with `--weighted`); times are the kernels' GPU
//! event times of the slowest node, averaged over `--iters` after `--warmup`.

use crate::args::{err, AnyResult, Args, CombDType, KernelTypeArg, TransportArg};
use crate::gpu::host_images_and_oracle;
use crate::gpu_device_api::{device_inputs, upload_inputs};
use crate::inputs::{comb_value, gen_inputs};
use crate::table::print_ranks;
use mori_ep::gpu_internode::{trace, DeviceRankInputs, ElemSizes, InterNodeGpu, InterNodeOptions, InterPath, RankBytes, RecvBytes};
use mori_ep::internode::Scheme;
use mori_ep::proxy::RingProxyOptions;
use mori_ep::{accounting, bf16, combine, CombineOptions, EpConfig, OutOfRange, Tensor2, Weighting};
use mori_gpu::Device;
use std::time::Duration;

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub fn run(a: &Args, cfg: &EpConfig) -> AnyResult<bool> {
    if a.procs != 1 || a.num_gpus != 1 {
        return Err(err(format!(
            "--kernel-type {} on GPUs runs every rank in this process on one GPU (the nodes as groups of ranks): drop --procs and --num-gpus",
            KernelTypeArg::of(cfg.kernel_type).name()
        )));
    }
    // Output files are created before the GPU work, so an unwritable path fails first.
    if let Some(path) = &a.json {
        std::fs::File::create(path).map_err(|e| err(format!("--json {path}: cannot be written: {e}")))?;
    }
    if let Some(path) = &a.trace {
        if path.is_empty() {
            return Err(err("--trace needs a file path (PATH.rank<R>.json per rank)"));
        }
        for r in 0..cfg.world_size {
            let f = rank_path(path, r);
            std::fs::File::create(&f).map_err(|e| err(format!("--trace {path}: {f} cannot be written: {e}")))?;
        }
    }
    let path = match a.transport {
        Some(TransportArg::Tcp) => InterPath::Tcp { lanes: a.lanes.unwrap_or(4) },
        _ => InterPath::Xgmi,
    };
    let set_connections = path == InterPath::Xgmi && std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none();
    if set_connections {
        // Before the CUDA context exists: a hardware queue per stream (InterNodeGpu::new says why).
        std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", "32");
    }
    let rt = mori_gpu::detect()?;
    // Said once a GPU was found (without one, the error comes first and alone).
    if set_connections {
        println!("CUDA_DEVICE_MAX_CONNECTIONS=32 (set here: every copy and kernel stream of the job on a hardware queue of its own)");
    }
    let inp = gen_inputs(a, cfg)?;
    let (host, oracle) = host_images_and_oracle(a, cfg, &inp, true)?;
    let (orc, handle) = oracle.ok_or_else(|| err("the oracle was not computed"))?;
    let sz = ElemSizes {
        elem: a.dtype.size(),
        idx_size: a.idx_type.size(),
        comb_elem: a.combine_dtype.size(),
        out_elem: a.combine_dtype.size(),
    };
    let opts = InterNodeOptions {
        path,
        blocks_per_rank: cfg.block_num as u32,
        warps_per_block: cfg.warps_per_block as u32,
        timeout: Duration::from_millis(a.timeout_ms),
        weighted: a.weighted,
        ring_slots: 1024,
        copy_blocks: opts_copy_blocks(a),
        trace: a.trace.is_some(),
        proxy: RingProxyOptions {
            spin: a.proxy_spin_us.map_or(RingProxyOptions::default().spin, Duration::from_micros),
            ..RingProxyOptions::default()
        },
        combine_rows: !a.combine_staging,
        recv_in_window: !a.recv_copy_out,
    };
    let w = cfg.world_size;
    let rb: Vec<RankBytes<'_>> = (0..w)
        .map(|r| RankBytes { tokens: inp.idx[r].rows(), x: &host[r].x, weights: &host[r].w, idx: &host[r].idx, scales: &host[r].scales })
        .collect();
    // --device-api: every rank's inputs in device buffers, uploaded once, before the object
    // exists so that they are freed after it (no kernel of its calls still reads them).
    let dev_bufs = if a.device_api { Some(upload_inputs(&rt, &rb)?) } else { None };
    let mut ep = InterNodeGpu::new(rt.clone(), Device(0), cfg, sz, opts)?;
    println!("{}", ep.describe());
    // Combine inputs: a function of each received row's source (as the intranode bench).
    let h = cfg.hidden;
    let comb_rows = |r: usize| -> Vec<u8> {
        let mut v = Vec::with_capacity(orc[r].src.len() * h * a.combine_dtype.size());
        for s in &orc[r].src {
            for c in 0..h {
                let x = comb_value(*s, c);
                match a.combine_dtype {
                    CombDType::Bf16 => v.extend_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes()),
                    CombDType::F32 => v.extend_from_slice(&x.to_le_bytes()),
                }
            }
        }
        v
    };
    let cx: Vec<Vec<u8>> = (0..w).map(comb_rows).collect();
    let dev_in: Option<Vec<DeviceRankInputs<'_>>> = dev_bufs.as_ref().map(|b| device_inputs(&rb, b, cfg.scale_dim > 0)).transpose()?;
    println!(
        "calls: {}",
        if a.device_api {
            "device-resident (dispatch_device / combine_device: inputs in GPU buffers, records and combine rows left where the kernels use them)"
        } else {
            "host bytes (dispatch / combine: inputs uploaded, records and combined rows read back)"
        }
    );
    let mut ok = true;
    let (mut disp, mut comb, mut timed) = (0.0, 0.0, 0usize);
    // Every timed iteration's (dispatch, combine) µs, for the spread: one stalled iteration
    // moves the mean.
    let mut each: Vec<(f64, f64)> = Vec::with_capacity(a.iters);
    let mut per_kernel = [0.0f64; 7];
    // Host time of each whole call (uploads, launches, waits, read-back), summed over the
    // timed iterations: what the GPU events leave out.
    let (mut host_disp, mut host_comb) = (0.0f64, 0.0f64);
    let mut pool0 = mori_gpu::submit_stats();
    let mut proxies0 = ep.proxy_stats();
    let mut cpu0 = (process_cpu_s(), std::time::Instant::now());
    // The first iteration's results, checked after the loop: the check's host work stays out
    // of the timed window's CPU, copy-pool and proxy figures, with or without warm-up.
    let mut first: Option<(Vec<RecvBytes>, Vec<CombinedBytes>)> = None;
    for it in 0..a.warmup + a.iters {
        if it == a.warmup {
            pool0 = mori_gpu::submit_stats();
            proxies0 = ep.proxy_stats();
            cpu0 = (process_cpu_s(), std::time::Instant::now());
        }
        let (t0, t1, t2, t3);
        if let Some(dev_in) = &dev_in {
            t0 = std::time::Instant::now();
            let (recv, ticket) = ep.dispatch_device(dev_in)?;
            t1 = std::time::Instant::now();
            let rows: Vec<usize> = recv.iter().map(|d| d.total()).collect();
            if it == 0 {
                // The first iteration's records come back for the check, and the combine
                // input is written once: the inputs are the same every iteration, so the rows
                // stay valid where the kernels read them.
                let got = (0..w).map(|r| ep.read_recv(r)).collect::<Result<Vec<_>, _>>()?;
                for (r, g) in got.iter().enumerate() {
                    ep.write_combine_input(r, &cx[r], &g.weights)?;
                }
                first = Some((got, Vec::new()));
            }
            t2 = std::time::Instant::now();
            ep.combine_device(ticket, &rows)?;
            t3 = std::time::Instant::now();
            if let Some((_, out)) = first.as_mut().filter(|_| it == 0) {
                *out = (0..w).map(|r| ep.read_combined(r)).collect::<Result<Vec<_>, _>>()?;
            }
        } else {
            t0 = std::time::Instant::now();
            let (got, ticket) = ep.dispatch(&rb)?;
            t1 = std::time::Instant::now();
            let cw: Vec<&[u8]> = got.iter().map(|g| &g.weights[..]).collect();
            let cxr: Vec<&[u8]> = cx.iter().map(|v| &v[..]).collect();
            t2 = std::time::Instant::now();
            let out = ep.combine(ticket, &cxr, Some(&cw))?;
            t3 = std::time::Instant::now();
            if it == 0 {
                first = Some((got, out));
            }
        }
        if it >= a.warmup {
            let t = ep.times();
            disp += t.dispatch_us;
            comb += t.combine_us;
            each.push((t.dispatch_us, t.combine_us));
            host_disp += (t1 - t0).as_secs_f64() * 1e6;
            host_comb += (t3 - t2).as_secs_f64() * 1e6;
            for (acc, k) in per_kernel.iter_mut().zip(t.kernel_us) {
                *acc += k;
            }
            timed += 1;
        }
    }
    let (disp, comb) = (disp / timed.max(1) as f64, comb / timed.max(1) as f64);
    let (host_disp, host_comb) = (host_disp / timed.max(1) as f64, host_comb / timed.max(1) as f64);
    let pool = mori_gpu::submit_stats().since(&pool0);
    let busy_cores = (process_cpu_s() - cpu0.0) / cpu0.1.elapsed().as_secs_f64().max(1e-9);
    let ps: Vec<_> = ep.proxy_stats().iter().zip(&proxies0).map(|(now, then)| now.since(then)).collect();
    let Some((got, out)) = &first else { return Err("no iteration ran (--warmup + --iters is 0)".into()) };
    ok &= check(a, cfg, &orc, &handle, &inp.idx, got, out);
    let stamps = ep.trace()?;
    if let (Some(path), Some(stamps)) = (&a.trace, &stamps) {
        write_traces(path, stamps, cfg.gpus_per_node)?;
    }
    let nodes = w / cfg.gpus_per_node;
    let ex = cfg.experts_per_rank * w;
    let tok_bytes = (h * a.dtype.size() + cfg.scale_dim * cfg.scale_type_size) as f64;
    let mut lines = Vec::new();
    let mut rows = Vec::new();
    let mut rank_json = Vec::new();
    // Every iteration dispatches the same inputs: the first one's counts are every one's.
    for (r, lr) in got.iter().enumerate() {
        let recv = lr.src.len() / 4;
        let algo = accounting::rdma_algo_token_count(&inp.idx[r], ex, nodes, OutOfRange::default())? as u64;
        let phys = accounting::rdma_cross_node_token_count(&inp.idx[r], ex, nodes, r / cfg.gpus_per_node, OutOfRange::default())? as u64;
        lines.push((r, recv as u64, algo));
        rank_json.push(serde_json::json!({ "rank": r, "recv_tokens": recv, "rdma_algo_tokens": algo, "rdma_phys_tokens": phys }));
        let gbps = |tokens: f64, us: f64| if us > 0.0 { tokens * tok_bytes / us / 1e3 } else { 0.0 };
        rows.push(vec![
            r.to_string(),
            recv.to_string(),
            algo.to_string(),
            phys.to_string(),
            format!("{disp:.1}"),
            format!("{comb:.1}"),
            format!("{:.2}", gbps(recv as f64, disp)),
            format!("{:.2}", gbps(algo as f64, disp)),
            format!("{:.2}", gbps(phys as f64, disp)),
        ]);
    }
    print_ranks(
        &lines,
        &[
            "rank",
            "recv tokens",
            "rdma algo",
            "rdma phys",
            "dispatch µs",
            "combine µs",
            "dispatch XGMI GB/s",
            "RDMA algo GB/s",
            "RDMA phys GB/s",
        ],
        rows,
    );
    println!(
        "times: GPU events of the slowest node's kernels, mean of {timed} iterations after {} warm-up; RDMA = the inter-node leg through the proxies ({}); commands per proxy (timed iterations): {:?}",
        a.warmup,
        match path {
            InterPath::Xgmi => "xgmi".to_string(),
            InterPath::Tcp { lanes } => format!("tcp, {lanes} lanes"),
        },
        ps.iter().map(|s| s.commands).collect::<Vec<_>>()
    );
    let (ds, cs) = (Spread::of(each.iter().map(|e| e.0)), Spread::of(each.iter().map(|e| e.1)));
    println!(
        "spread over the timed iterations, µs: dispatch median {:.1} (min {:.1}, max {:.1}), combine median {:.1} (min {:.1}, max {:.1})",
        ds.median, ds.min, ds.max, cs.median, cs.min, cs.max
    );
    println!(
        "host time of each whole call ({}; host clock, mean), µs: dispatch {host_disp:.1}, combine {host_comb:.1}",
        if a.device_api {
            "the device calls: the launches, the wait, the status words and counts read back"
        } else {
            "uploading the inputs, the kernels, reading the outputs back"
        }
    );
    let sum = |f: fn(&mori_ep::proxy::RingProxyStats) -> u64| ps.iter().map(f).sum::<u64>();
    let (batches, data_batches) = (sum(|s| s.batches), sum(|s| s.data_batches));
    if batches > 0 {
        let landed = if data_batches > 0 {
            format!(
                ", {:.1} µs to the bytes landed ({data_batches} posted their pair after that)",
                sum(|s| s.data_ns) as f64 / data_batches as f64 / 1e3
            )
        } else {
            String::new()
        };
        println!(
            "proxies (host clock, timed iterations): {batches} writes; mean from taking the commands: {:.1} µs to posted{landed}, {:.1} µs to completed (the counter pair landed after the bytes); longest since the proxies started {:.1} µs",
            sum(|s| s.post_ns) as f64 / batches as f64 / 1e3,
            sum(|s| s.done_ns) as f64 / batches as f64 / 1e3,
            ps.iter().map(|s| s.done_ns_max).max().unwrap_or(0) as f64 / 1e3
        );
        println!(
            "proxies: {} posting calls into the engines, {:.1} µs each on average (the calls' own time); {} writes carried their counter pair in the same ordered batch ({} of them over MORI-IO sessions, the rest through the engine's one-shot calls; {} with the pair as tail words, the rest copied from the window), the other {} posted it once their bytes landed",
            sum(|s| s.post_calls),
            sum(|s| s.post_call_ns) as f64 / sum(|s| s.post_calls).max(1) as f64 / 1e3,
            sum(|s| s.ordered_batches),
            sum(|s| s.session_batches),
            sum(|s| s.word_batches),
            batches - sum(|s| s.ordered_batches)
        );
    }
    let writes = mori_ep::proxy::RingProxyStats {
        write_batches: sum(|s| s.write_batches),
        write_bytes: sum(|s| s.write_bytes),
        write_done_ns: sum(|s| s.write_done_ns),
        ..Default::default()
    };
    if let Some(gbps) = writes.write_gbps() {
        println!(
            "inter-node writes with data (proxies, host clock, timed iterations): {}, {:.0} B each on average, {:.1} µs each from taking the commands to completed: {gbps:.2} GB/s a write",
            writes.write_batches,
            writes.write_bytes as f64 / writes.write_batches as f64,
            writes.write_done_ns as f64 / writes.write_batches as f64 / 1e3
        );
    }
    println!(
        "host CPU (timed iterations): {busy_cores:.1} cores busy on average ({} threads in the process, {} cores online)",
        std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    let (wait_us, enqueue_us, record_us) = pool.mean_us();
    if pool.submissions > 0 {
        println!(
            "copy pools (host clock, timed iterations): {} submissions, µs each: {wait_us:.1} waiting for a slot, {enqueue_us:.1} queueing the copies (driver calls), {record_us:.1} closing it (flag write, event record); longest since the process started {:.1} µs; {} event queries by completion steps, {:.2} µs each; {} completion flags missed; {} of the submissions ordered batches in one launch of the ordered-copy kernel, {} posted to a resident copier ({} grids launched)",
            pool.submissions,
            pool.max_submit_ns as f64 / 1e3,
            pool.event_queries,
            pool.mean_query_us(),
            pool.flag_misses,
            pool.ordered_launches,
            pool.resident_posts,
            pool.resident_launches
        );
    }
    if pool.resident_timed > 0 {
        let (relay, run, done) = pool.resident_mean_us();
        println!(
            "resident copier (timed iterations, {} tables with their stamps), µs each: {relay:.2} from seeing the table posted to relaying it to the grid, {run:.2} from there to its completion flag's write (GPU clock); {done:.2} from the post's return to the completion seen (host clock)",
            pool.resident_timed
        );
    }
    let mut pk: Vec<String> = per_kernel.iter().map(|k| format!("{:.1}", k / timed.max(1) as f64)).collect();
    let in_window = ep.combine_in_window();
    if in_window {
        pk[3] = "not launched (input in the window)".to_string();
    }
    let recv_in_window = ep.recv_in_window();
    if recv_in_window {
        pk[2] = "not launched (records read from the window)".to_string();
    }
    let relay = cfg.kernel_type != mori_ep::KernelType::AsyncLL;
    let relay_sums = if relay { format!(", combine relay sums {}", pk[6]) } else { String::new() };
    println!(
        "per kernel µs (slowest node, mean): dispatch layout and staging {}, dispatch (with its wait) {}, copy-out {}, combine staging {}{relay_sums}, combine send (with its wait) {}, combine sum {}",
        pk[0], pk[1], pk[2], pk[3], pk[4], pk[5]
    );
    println!(
        "check: {}",
        if ok { "OK (dispatch rows, weights, indices, scales, sources; combine output and weights)" } else { "MISMATCH" }
    );
    if let Some(file) = &a.json {
        let mean = |n: u64, d: u64| if d > 0 { n as f64 / d as f64 / 1e3 } else { 0.0 };
        let legs = |ph: usize| {
            stamps
                .as_ref()
                .and_then(|s| leg_spread(s, ph))
                .map(|(n, lo, med, hi)| serde_json::json!({ "pairs": n, "min_us": lo, "median_us": med, "max_us": hi }))
        };
        let (r_relay, r_run, r_done) = pool.resident_mean_us();
        let resident = serde_json::json!({ "timed": pool.resident_timed, "relay_us": r_relay, "run_us": r_run, "done_us": r_done });
        let j = serde_json::json!({
            "kernel_type": KernelTypeArg::of(cfg.kernel_type).name(), "world_size": w, "num_nodes": nodes, "gpus_per_node": cfg.gpus_per_node,
            "num_tokens": a.num_tokens, "hidden": a.hidden, "num_experts": a.num_experts, "top_k": a.top_k,
            "dtype": a.dtype, "combine_dtype": a.combine_dtype, "block_num": cfg.block_num, "warps_per_block": cfg.warps_per_block,
            "copy_blocks": opts_copy_blocks(a), "weighted": a.weighted, "iters": timed, "warmup": a.warmup,
            "spread_us": { "dispatch": ds.json(), "combine": cs.json() },
            "inter_node_leg": match path { InterPath::Xgmi => "xgmi".to_string(), InterPath::Tcp { lanes } => format!("tcp, {lanes} lanes") },
            "dispatch_us": disp, "combine_us": comb, "combine_input_in_window": in_window, "records_in_window": recv_in_window,
            "host_call_us": { "dispatch": host_disp, "combine": host_comb }, "device_api": a.device_api,
            "kernel_us": { "dispatch_stage": per_kernel[0] / timed.max(1) as f64,
                "dispatch": per_kernel[1] / timed.max(1) as f64, "receive": (!recv_in_window).then(|| per_kernel[2] / timed.max(1) as f64),
                "combine_stage": (!in_window).then(|| per_kernel[3] / timed.max(1) as f64), "combine_send": per_kernel[4] / timed.max(1) as f64,
                "combine_reduce": per_kernel[5] / timed.max(1) as f64, "combine_relay": relay.then(|| per_kernel[6] / timed.max(1) as f64) },
            "proxies": { "writes": batches, "to_posted_us": mean(sum(|s| s.post_ns), batches),
                "to_landed_us": mean(sum(|s| s.data_ns), data_batches), "to_completed_us": mean(sum(|s| s.done_ns), batches),
                "posting_calls": sum(|s| s.post_calls), "posting_call_us": mean(sum(|s| s.post_call_ns), sum(|s| s.post_calls)),
                "ordered_batches": sum(|s| s.ordered_batches), "session_batches": sum(|s| s.session_batches),
                "word_batches": sum(|s| s.word_batches),
                "data_writes": writes.write_batches, "data_write_bytes": writes.write_bytes,
                "data_write_us": mean(writes.write_done_ns, writes.write_batches), "data_write_gbps": writes.write_gbps() },
            "busy_cores": busy_cores,
            "copy_pools": { "submissions": pool.submissions, "slot_wait_us": wait_us, "enqueue_us": enqueue_us,
                "record_us": record_us, "max_submit_us_since_start": pool.max_submit_ns as f64 / 1e3, "flag_misses": pool.flag_misses,
                "ordered_launches": pool.ordered_launches, "resident_posts": pool.resident_posts, "resident_launches": pool.resident_launches, "resident_tables": resident, "event_queries": pool.event_queries, "event_query_us": pool.mean_query_us() },
            "legs": { "dispatch": legs(0), "combine": legs(1) },
            "ranks": rank_json,
            "check": ok,
        });
        std::fs::write(file, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(ok)
}

/// One rank's combine output: `[T, H]` output elements and `[T, K]` f32 weight sums, as bytes.
type CombinedBytes = (Vec<u8>, Vec<u8>);

fn opts_copy_blocks(a: &Args) -> u32 {
    a.copy_blocks.unwrap_or(InterNodeOptions::default().copy_blocks)
}

/// Over every (rank, other-node peer) pair of phase `ph`: how many, and the min, median and
/// max of command pushed to segment seen, µs; `None` without any.
fn leg_spread(stamps: &[trace::RankStamps], ph: usize) -> Option<(usize, f64, f64, f64)> {
    let mut legs: Vec<f64> = Vec::new();
    for s in stamps {
        for (q, &p) in s.pushed[ph].iter().enumerate() {
            let seen = stamps.get(q).map_or(0, |d| d.seen[ph][s.rank]);
            if p > 0 && seen >= p {
                legs.push((seen - p) as f64 / 1e3);
            }
        }
    }
    legs.sort_by(f64::total_cmp);
    Some((legs.len(), *legs.first()?, legs[legs.len() / 2], *legs.last()?))
}

/// The first iteration against the oracle; prints the first difference.
fn check(
    a: &Args,
    cfg: &EpConfig,
    orc: &[crate::gpu::OracleRecv],
    handle: &mori_ep::DispatchHandle,
    idx: &[Tensor2<i64>],
    got: &[RecvBytes],
    out: &[(Vec<u8>, Vec<u8>)],
) -> bool {
    for (r, (g, o)) in got.iter().zip(orc).enumerate() {
        let src: Vec<u8> = o.src.iter().flat_map(|s| (s.flat(cfg.max_tokens_per_rank) as i32).to_le_bytes()).collect();
        for (name, x, y) in [
            ("rows", &g.x, &o.x),
            ("weights", &g.weights, &o.w),
            ("ids", &g.idx, &o.idx),
            ("scales", &g.scales, &o.scales),
            ("sources", &g.src, &src),
        ] {
            if x != y {
                println!("check: rank {r}: received {name} differ from the reference ({} vs {} bytes)", x.len(), y.len());
                return false;
            }
        }
    }
    let want = reference_combine(a, cfg, orc, handle, idx);
    let want = match want {
        Ok(w) => w,
        Err(e) => {
            println!("check: the reference combine failed: {e}");
            return false;
        }
    };
    let mut exact = true;
    for (r, ((gx, gw), w)) in out.iter().zip(&want).enumerate() {
        let wx: Vec<u8> = match a.combine_dtype {
            CombDType::F32 => w.x.as_slice().iter().flat_map(|v| v.to_le_bytes()).collect(),
            CombDType::Bf16 => w.x.as_slice().iter().flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes()).collect(),
        };
        // The kernels round each product before adding it, as the reference does, so weighted
        // sums of DeepEP's random weights are expected bit-exact too; accepted within 1e-2
        // relative, and said which.
        exact &= *gx == wx;
        let same = if a.weighted {
            let dec = |b: &[u8]| -> Vec<f32> {
                match a.combine_dtype {
                    CombDType::F32 => f32s(b),
                    CombDType::Bf16 => b.chunks_exact(2).map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect(),
                }
            };
            let (g, e) = (dec(gx), dec(&wx));
            g.len() == e.len() && g.iter().zip(&e).all(|(x, y)| (x - y).abs() <= 1e-2 * y.abs().max(1.0))
        } else {
            *gx == wx
        };
        if !same {
            println!("check: rank {r}: combined rows differ from the reference");
            return false;
        }
        let ww: Vec<u8> = w.weights.as_ref().map(|t| t.as_slice().iter().flat_map(|v| v.to_le_bytes()).collect()).unwrap_or_default();
        if *gw != ww {
            println!("check: rank {r}: combined weight sums differ from the reference");
            return false;
        }
    }
    if a.weighted {
        println!("check: weighted combine {}", if exact { "bit-exact" } else { "within 1e-2 relative, not bit-exact" });
    }
    true
}

/// The host reference's combine of the oracle's received rows (values `comb_value`), in the
/// run's combine dtype and sum order; an error building its inputs is returned, not hidden.
fn reference_combine(
    a: &Args,
    cfg: &EpConfig,
    orc: &[crate::gpu::OracleRecv],
    handle: &mori_ep::DispatchHandle,
    idx: &[Tensor2<i64>],
) -> mori_ep::EpResult<Vec<mori_ep::Combined<f32>>> {
    let xs: Vec<Tensor2<f32>> =
        orc.iter().map(|o| Tensor2::from_fn(o.src.len(), cfg.hidden, |i, c| comb_value(o.src[i], c))).collect::<Result<_, _>>()?;
    let ws: Vec<Tensor2<f32>> = orc.iter().map(|o| Tensor2::new(o.src.len(), cfg.top_k, f32s(&o.w))).collect::<Result<_, _>>()?;
    let opts = CombineOptions {
        weighting: if a.weighted { Weighting::RankSlotSum } else { Weighting::Unweighted },
        order: Scheme::from_kernel_type(cfg.kernel_type).sum_order(),
        ..CombineOptions::default()
    };
    // In the combine dtype: V1/V1-LL round other nodes' partials to it (PerNodeRounded).
    match a.combine_dtype {
        CombDType::F32 => combine::<f32, f32, i64>(cfg, handle, &xs, Some(&ws), idx, opts),
        CombDType::Bf16 => {
            let xb: Vec<Tensor2<bf16>> = xs
                .iter()
                .map(|x| Tensor2::new(x.rows(), x.cols(), x.as_slice().iter().map(|&v| bf16::from_f32(v)).collect()))
                .collect::<Result<_, _>>()?;
            combine::<bf16, f32, i64>(cfg, handle, &xb, Some(&ws), idx, opts)
        }
    }
}

/// `PATH` with `.rank<R>` before its extension (or at its end).
pub fn rank_path(path: &str, rank: usize) -> String {
    let p = std::path::Path::new(path);
    match (p.extension(), p.file_stem()) {
        (Some(ext), Some(stem)) => p.with_file_name(format!("{}.rank{rank}.{}", stem.to_string_lossy(), ext.to_string_lossy())),
        _ => p.with_file_name(format!("{}.rank{rank}", p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())),
    }
    .to_string_lossy()
    .into_owned()
}

/// One Perfetto file per rank of the last iteration's stamps; prints the files and, per
/// phase, the inter-node leg (command pushed to segment seen) over every (rank, peer) pair.
fn write_traces(path: &str, stamps: &[trace::RankStamps], gpn: usize) -> AnyResult<()> {
    for (r, t) in trace::perfetto(stamps, gpn) {
        let mut json = serde_json::to_string(&t)?;
        json.push('\n');
        std::fs::write(rank_path(path, r), json)?;
    }
    for (ph, name) in [(0, "dispatch"), (1, "combine")] {
        if let Some((n, lo, med, hi)) = leg_spread(stamps, ph) {
            println!(
                "trace: {name} inter-node legs (command pushed -> segment seen), {n} pairs: min {lo:.1} µs, median {med:.1} µs, max {hi:.1} µs"
            );
        }
    }
    println!("trace: {} files {}", stamps.len(), rank_path(path, 0).replace(".rank0", ".rank<R>"));
    Ok(())
}

/// User plus system CPU seconds this process has used (`getrusage(RUSAGE_SELF)`); 0 if the call fails.
fn process_cpu_s() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
        s(u.user_time()) + s(u.system_time())
    })
}

/// Median, least and greatest of a set of times (0 when empty).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    /// The spread of `v`; the median of an even count is the mean of the middle two.
    fn of(v: impl Iterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = v.collect();
        if v.is_empty() {
            return Spread { median: 0.0, min: 0.0, max: 0.0 };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Spread { median, min: v[0], max: v[n - 1] }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({ "median": self.median, "min": self.min, "max": self.max })
    }
}

#[cfg(test)]
mod tests {
    use super::Spread;

    #[test]
    fn the_spread_is_median_min_and_max() {
        assert_eq!(Spread::of([3.0, 1.0, 200.0].into_iter()), Spread { median: 3.0, min: 1.0, max: 200.0 });
        assert_eq!(Spread::of([4.0, 1.0, 2.0, 3.0].into_iter()), Spread { median: 2.5, min: 1.0, max: 4.0 });
        assert_eq!(Spread::of(std::iter::empty()), Spread { median: 0.0, min: 0.0, max: 0.0 });
    }

    #[test]
    fn process_cpu_time_grows_with_work() {
        let before = super::process_cpu_s();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let spent = super::process_cpu_s() - before;
        // 50 ms of wall time spinning on this thread: at least most of it is CPU time.
        assert!(before > 0.0 && spent >= 0.02, "before {before} s, spent {spent} s");
    }
}
