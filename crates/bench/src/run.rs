//! One rank of bench_engine: rendezvous, engine, sweep, validation.

use crate::args::{workload_diff, Args, BackendArg, MemArg, OpArg, PollArg};
use crate::baseline::CopyBaseline;
use crate::membuf::Buffer;
use crate::paged::PagedReport;
use crate::report::Row;
use crate::sweep::{buffer_bytes, offsets, points, Point};
use crate::validate::first_mismatch;
use mori_bootstrap::{Bootstrap, SocketBootstrap, SocketBootstrapConfig};
use mori_io::FabricConfig;
use mori_io::{
    BackendConfig, EngineConfig, EngineDesc, ErrorCode, IoEngine, IoError, MemoryDesc, PollMode, RdmaConfig, Session, TcpConfig,
    TransferStatus, XgmiConfig,
};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// What a rank ends with.
#[derive(Debug)]
pub struct Outcome {
    /// Rank 0's rows (empty on other ranks); with several pairs, the aggregate of
    /// [`Outcome::pairs`] (see [`aggregate`]).
    pub rows: Vec<Row>,
    /// `OK`, `skipped`, or `FAILED: ...` (with several pairs: the first failing pair's, named).
    pub validation: String,
    /// With `--num-initiator-dev N > 1`, on global rank 0: every pair's own result, in pair
    /// order. Empty otherwise.
    pub pairs: Vec<PairOutcome>,
    /// With `--paged`, on rank 0: the paged point's report (blocks, bytes, the paged and
    /// contiguous timings and their ratio).
    pub paged: Option<PagedReport>,
}

/// One initiator/target pair's result (`--num-initiator-dev N > 1`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PairOutcome {
    /// The initiator's GPU (`--gpu + i`; with host memory the same number names the pair).
    pub gpu: u32,
    /// The pair's rows, measured by its initiator.
    pub rows: Vec<Row>,
    /// The pair's validation: `OK`, `skipped`, or `FAILED: ...`.
    pub validation: String,
}

/// The `[AGGREGATE]` rows of several pairs, point by point: bandwidth summed over the pairs
/// (the seed's aggregate), latency the mean of the pairs' latencies, total the longest pair's
/// loop. Points are matched by position; every pair ran the same points.
pub fn aggregate(pairs: &[PairOutcome]) -> Vec<Row> {
    let Some(first) = pairs.first() else { return Vec::new() };
    (0..first.rows.len())
        .map(|k| {
            let rs: Vec<&Row> = pairs.iter().filter_map(|p| p.rows.get(k)).collect();
            let n = rs.len().max(1) as f64;
            Row {
                msg_size: first.rows[k].msg_size,
                batch: first.rows[k].batch,
                iters: first.rows[k].iters,
                avg_bw_gbps: rs.iter().map(|r| r.avg_bw_gbps).sum(),
                avg_lat_us: rs.iter().map(|r| r.avg_lat_us).sum::<f64>() / n,
                total_us: rs.iter().map(|r| r.total_us).fold(0.0, f64::max),
                copy_lat_us: None,
            }
        })
        .collect()
}

/// A failure of the run: the message, and whether it is a usage error (exit 2) or a run
/// error (exit 1).
#[derive(Debug)]
pub struct Failure {
    /// What went wrong, naming the flag, rank, point or peer.
    pub msg: String,
    /// Exit code to use.
    pub code: i32,
}

fn usage<S: Into<String>>(msg: S) -> Failure {
    Failure { msg: msg.into(), code: 2 }
}
pub(crate) fn fail<S: Into<String>>(msg: S) -> Failure {
    Failure { msg: msg.into(), code: 1 }
}

/// `--master-ip` resolved (a name, or an IP literal, IPv6 bare or bracketed; IPv4 first).
/// Errors: an unresolvable master; a wildcard (`0`, `0.0.0.0`, `::`, `::ffff:0.0.0.0`, ...);
/// without `--local`, a *name* resolving only to loopback
/// (Debian maps its own hostname to 127.0.1.1): a rank on another host would resolve it to its
/// own loopback and both would wait out the bootstrap budget, so it is refused at once,
/// naming the resolution and this host's routable addresses.
pub fn master_addr(args: &Args, port: u16) -> Result<SocketAddr, Failure> {
    let addrs = mori_bootstrap::addr::resolve(&args.master_ip, port).map_err(|e| usage(format!("--master-ip {}: {e}", args.master_ip)))?;
    // Every rank dials it: a wildcard (any spelling) would make rank 1 dial its own host.
    mori_bootstrap::addr::refuse_wildcard("--master-ip", &args.master_ip, &addrs).map_err(|e| usage(e.to_string()))?;
    if !args.local {
        if let Some(ips) = mori_bootstrap::addr::loopback_name(&args.master_ip, &addrs) {
            let routable: Vec<String> = mori_bootstrap::ipv4_interfaces()
                .unwrap_or_default()
                .into_iter()
                .filter(|i| i.up && !i.loopback)
                .map(|i| format!("{} ({})", i.ip, i.name))
                .collect();
            let ips: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
            return Err(usage(format!(
                "--master-ip {} resolves to {} (loopback only): a rank on another host would reach its own loopback; give rank 0's \
                 routable address ({}), or 127.0.0.1 when both ranks run on this host",
                args.master_ip,
                ips.join(", "),
                if routable.is_empty() { "this host has none up".to_string() } else { format!("here: {}", routable.join(", ")) }
            )));
        }
    }
    Ok(addrs[0])
}

/// Address this rank advertises: `--self-ip`, else 127.0.0.1 for a loopback master, else the
/// local address the kernel would route to the master from (no packet is sent).
pub fn self_ip(args: &Args, master: SocketAddr) -> Result<String, Failure> {
    if let Some(ip) = &args.self_ip {
        return Ok(ip.clone());
    }
    if master.ip().is_loopback() {
        return Ok("127.0.0.1".into());
    }
    let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| usage(format!("cannot find a local address: {e}; pass --self-ip")))?;
    s.connect(master).map_err(|e| usage(format!("no route to --master-ip {master}: {e}; pass --self-ip")))?;
    Ok(s.local_addr().map_err(|e| usage(format!("local address: {e}; pass --self-ip")))?.ip().to_string())
}

/// `MemAvailable` of /proc/meminfo, bytes; `None` where it cannot be read.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// Default per-collective deadline of bench_engine when MORI_BOOTSTRAP_OP_TIMEOUT is unset.
pub const POINT_WAIT: Duration = Duration::from_secs(3600);

pub(crate) const MAGIC_OK: u8 = 0;
pub(crate) const MAGIC_SKIP: u8 = 1;
pub(crate) const MAGIC_ABORT: u8 = 2;

/// Runs this process: side `args.rank`, index `args.local_index` among its side's
/// `--num-initiator-dev` processes. `port` is the bootstrap port (engines use
/// port+1+global rank; with `--local`, ports the kernel picks). With `--local`, every rank's
/// `args.run_token` must match at rendezvous ([`crate::local`]). `ranks_here` is how many processes share this machine's memory (all of
/// them with --local) for the memory check. `root`: rank 0's bootstrap listener when the
/// caller bound it already (`--local`'s parent, before starting its children:
/// `SocketBootstrap::bind_root`); `None` binds `--master-ip:port` here.
pub fn run(args: &Args, port: u16, ranks_here: u64, root: Option<std::net::TcpListener>) -> Result<Outcome, Failure> {
    run_with(args, port, ranks_here, None, root)
}

/// `--xgmi-single-process`: both ranks in this process (rank 1 on a thread), joined by an
/// in-process bootstrap; no socket rendezvous. With `--backend xgmi` the two engines share one
/// address space, so copies use device pointers directly (no IPC), as the seed's Python
/// benchmark does by default. Returns rank 0's outcome.
pub fn run_single_process(args: &Args) -> Result<Outcome, Failure> {
    let timeout = std::env::var("MORI_BOOTSTRAP_OP_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .unwrap_or(POINT_WAIT);
    let mut group = mori_bootstrap::LocalBootstrap::new_group(2, timeout).into_iter();
    let (b0, b1) = match (group.next(), group.next()) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err(fail("in-process bootstrap: group of 2 not created")),
    };
    let mut a1 = args.clone();
    a1.rank = 1;
    let target = std::thread::Builder::new()
        .name("bench-rank1".into())
        .spawn(move || run_with(&a1, 0, 2, Some(Box::new(b1)), None))
        .map_err(|e| fail(format!("spawn the target rank's thread: {e}")))?;
    let mut a0 = args.clone();
    a0.rank = 0;
    let r0 = run_with(&a0, 0, 2, Some(Box::new(b0)), None);
    let r1 = target.join().map_err(|_| fail("the target rank's thread panicked"))?;
    match (r0, r1) {
        (Ok(o), Ok(_)) => Ok(o),
        (Err(e), Ok(_)) => Err(e),
        // Both failed: the target's error is often the cause (rank 0 then only saw it go).
        (Err(e0), Err(e1)) => Err(Failure { msg: format!("{}\ntarget rank: {}", e0.msg, e1.msg), code: e0.code.max(e1.code) }),
        (Ok(_), Err(e)) => Err(Failure { msg: format!("target rank: {}", e.msg), code: e.code }),
    }
}

fn run_with(
    args: &Args,
    port: u16,
    ranks_here: u64,
    local: Option<Box<dyn Bootstrap>>,
    root: Option<std::net::TcpListener>,
) -> Result<Outcome, Failure> {
    let rank = args.rank;
    let same_process = local.is_some();
    let n = args.pairs() as usize;
    let (me, world) = if local.is_some() { (rank, 2) } else { (args.global_rank(), 2 * n) };
    let peer_rank = (me + world / 2) % world;
    let master = master_addr(args, port)?;
    let self_ip = self_ip(args, master)?;

    // Memory first: refuse before anything else if the buffers cannot fit.
    let pts = points(args);
    let shape = args.paged_shape();
    let bytes = match &shape {
        Some(s) => s.buffer_bytes().map_err(usage)?,
        None => buffer_bytes(&pts, args.batch_contiguous).map_err(usage)?,
    };
    if let Some(avail) = mem_available() {
        if bytes.saturating_mul(ranks_here) > avail / 10 * 8 {
            let lower =
                if shape.is_some() { "--pool-blocks/--block-size/--layers" } else { "--sweep-max/--buffer-size or --transfer-batch-size" };
            return Err(usage(format!(
                "the {} needs a {bytes}-byte buffer per rank ({} rank(s) here) but MemAvailable is {avail} bytes; lower {lower}",
                if shape.is_some() { "paged pool" } else { "sweep" },
                ranks_here
            )));
        }
    }

    // Engine, backend, memory first: a rank that cannot serve the backend stops at once.
    let eport = if local.is_some() || args.local {
        // In-process ranks and --local: ports the kernel picks (the descriptors exchanged at
        // rendezvous carry them), so nothing chosen in advance can be taken by another run.
        0
    } else {
        u16::try_from(u32::from(port) + 1 + me as u32).map_err(|_| usage(format!("--port {port}: port+1+rank {me} exceeds 65535")))?
    };
    let ecfg = EngineConfig::new(self_ip.clone(), eport).map_err(|e| usage(e.to_string()))?;
    let mut buf = match args.mem_type {
        MemArg::Cpu => Buffer::host(bytes as usize),
        MemArg::Gpu => {
            let dev = args.device_for(rank, args.local_index).unwrap_or(0);
            if args.backend == BackendArg::Fabric { Buffer::fabric(dev, bytes as usize) } else { Buffer::gpu(dev, bytes as usize) }
                .map_err(usage)?
        }
    };
    let eng = IoEngine::new(&format!("bench-rank{me}-{}", std::process::id()), ecfg)
        .map_err(|e| fail(format!("engine on --self-ip {self_ip} port {eport}: {e}")))?;
    let tcp = TcpConfig { lanes: args.num_qp_per_transfer, ..TcpConfig::from_env().map_err(|e| usage(e.to_string()))? };
    let deadline = tcp.data_timeout * 2 + Duration::from_secs(1);
    let bcfg = match args.backend {
        BackendArg::Rdma => BackendConfig::Rdma(rdma_config(args).map_err(|e| usage(e.to_string()))?),
        BackendArg::Xgmi => BackendConfig::Xgmi(XgmiConfig {
            num_streams: args.num_streams as usize,
            num_events: args.num_events as usize,
            ..XgmiConfig::default()
        }),
        BackendArg::Fabric => BackendConfig::Fabric(FabricConfig {
            num_streams: args.num_streams as usize,
            num_events: args.num_events as usize,
            ..FabricConfig::from_env().map_err(|e| usage(e.to_string()))?
        }),
        _ => BackendConfig::Tcp(tcp),
    };
    eng.create_backend(bcfg).map_err(|e| usage(format!("--backend {}: {e}", format!("{:?}", args.backend).to_lowercase())))?;
    // SAFETY: `buf` is declared before `eng`, so it outlives the engine; it is not resized
    // while registered, and the final barrier ensures no transfer is in flight at the end.
    // (Device memory is registered by its device address.)
    let (ptr, len, loc) = buf.region();
    let mem = unsafe { eng.register_memory(ptr, len, loc) }.map_err(|e| fail(e.to_string()))?;
    let boot: Box<dyn Bootstrap> = match local {
        Some(b) => b,
        None => {
            let mut cfg = SocketBootstrapConfig::with_env_defaults(me, world, master).map_err(|e| usage(e.to_string()))?;
            // The target waits inside one collective for each point's whole timed loop: unless
            // MORI_BOOTSTRAP_OP_TIMEOUT says otherwise, allow an hour per point (a dead peer is
            // still noticed at once: its sockets close).
            if std::env::var_os("MORI_BOOTSTRAP_OP_TIMEOUT").is_none() {
                cfg.op_timeout = cfg.op_timeout.max(POINT_WAIT);
            }
            let group = match root {
                Some(l) => SocketBootstrap::with_root_listener(cfg, l),
                None => SocketBootstrap::new(cfg),
            };
            Box::new(group.map_err(|e| fail(format!("bootstrap (rank {me} of {world}, master {master}): {e}")))?)
        }
    };

    // Every rank must belong to this run: with --local all carry the parent's token, ranks
    // started by hand none.
    let tokens = boot
        .allgather(args.run_token.map(|t| t.to_bytes().to_vec()).unwrap_or_default().as_slice())
        .map_err(|e| fail(format!("exchanging run tokens: {e}")))?;
    crate::local::check_run_tokens(&tokens, me, args.run_token).map_err(fail)?;

    // Both ranks must run the same workload.
    let mine: Vec<(String, String)> = args.workload().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let all = boot
        .allgather(&postcard::to_allocvec(&mine).map_err(|e| fail(e.to_string()))?)
        .map_err(|e| fail(format!("exchanging workload flags: {e}")))?;
    let decode = |b: &[u8]| postcard::from_bytes::<Vec<(String, String)>>(b).map_err(|e| fail(format!("peer's workload flags: {e}")));
    let w0 = decode(&all[0])?;
    for (k, w) in all.iter().enumerate().skip(1) {
        let diff = workload_diff(&w0, &decode(w)?, k);
        if !diff.is_empty() {
            return Err(usage(format!("workload flags differ between the ranks (all stop):\n  {}", diff.join("\n  "))));
        }
    }

    let descs = boot
        .allgather(&postcard::to_allocvec(&(eng.desc().pack(), mem.pack())).map_err(|e| fail(e.to_string()))?)
        .map_err(|e| fail(format!("exchanging engine descriptors: {e}")))?;
    let (pe, pm): (Vec<u8>, Vec<u8>) = postcard::from_bytes(descs.get(peer_rank).map(Vec::as_slice).unwrap_or_default())
        .map_err(|e| fail(format!("peer descriptors: {e}")))?;
    let peer = EngineDesc::unpack(&pe).map_err(|e| fail(e.to_string()))?;
    let remote = MemoryDesc::unpack(&pm).map_err(|e| fail(e.to_string()))?;
    eng.register_remote_engine(peer).map_err(|e| fail(e.to_string()))?;

    let sess = if rank == 0 && args.enable_sess {
        Some(eng.create_session(&mem, &remote).map_err(|e| fail(format!("create_session: {e}")))?)
    } else {
        None
    };
    let baseline = if rank == 0 && args.copy_baseline {
        let (ptr, len, _) = buf.region();
        let dev = args.device_for(0, args.local_index).unwrap_or(0);
        Some(CopyBaseline::new(dev, ptr as u64, len as u64, &remote, same_process).map_err(fail)?)
    } else {
        None
    };
    if me == 0 {
        let b = eng.backend_for(&mem, &remote).map_err(|e| fail(e.to_string()))?;
        eprintln!(
            "bench_engine: op {}, backend {b} ({} connection(s) or QPs), {} point(s), iters {} + warmup {}, batch mode {}, session {}, contiguous {}, {n} pair(s)",
            format!("{:?}", args.op).to_lowercase(), args.num_qp_per_transfer, pts.len(), args.iters, args.warmup_iters,
            if args.batch_transfer() { "on" } else { "off" }, args.enable_sess, args.batch_contiguous
        );
        let ignored = args.ignored_by_backend();
        if !ignored.is_empty() {
            eprintln!("note: no effect on the {b} backend: {}", ignored.join(", "));
        }
        if let Some(s) = &shape {
            eprintln!(
                "paged: {} layers x {} halves x {} blocks of {} B per transfer, pools of {} blocks per layer and half, block tables of seed {} (one pair per point), contiguous baseline of {} B",
                s.layers, s.halves, s.blocks, s.block_size, s.pool_blocks, s.seed, s.total_bytes().unwrap_or(0)
            );
        }
    }

    let bar = progress(me, pts.len());
    let mut rows = Vec::new();
    let mut validation: Option<String> = None;
    let mut skipped = false;
    let mut paged = None;
    if let Some(s) = &shape {
        let ctx = crate::paged_run::Ctx {
            args,
            boot: boot.as_ref(),
            eng: &eng,
            sess: sess.as_ref(),
            mem: &mem,
            remote: &remote,
            deadline,
            baseline: baseline.as_ref(),
            peer_rank,
        };
        let r = crate::paged_run::point(&ctx, s, &mut buf)?;
        rows.extend(r.row);
        (paged, validation, skipped) = (r.report, r.validation, r.skipped);
    }
    // (--paged measured its one point above.)
    let swept: &[Point] = if shape.is_some() { &[] } else { &pts };
    for (pi, &p) in swept.iter().enumerate() {
        let offs = offsets(p, args.batch_contiguous);
        let src_rank = if args.op == OpArg::Write { 0 } else { 1 };
        if rank == src_rank {
            buf.fill(&offs, p.msg, src_rank as u64, pi as u64).map_err(fail)?;
        }
        boot.barrier().map_err(|e| fail(format!("barrier before point {pi}: {e}")))?;
        let result = if rank == 0 {
            if let Some(b) = &bar {
                b.set_message(format!("msg {} B, batch {}", p.msg, p.batch));
            }
            Some(measure(args, &eng, sess.as_ref(), &mem, &remote, p, &offs, deadline, baseline.as_ref()))
        } else {
            None
        };
        // First exchange: a status byte (rank 0 finished or aborted; either rank skips).
        let status = match &result {
            Some(Err(_)) => MAGIC_ABORT,
            _ if args.skip_validate => MAGIC_SKIP,
            _ => MAGIC_OK,
        };
        let got = boot.allgather(&[status]);
        if let Some(Err(e)) = result {
            return Err(fail(format!("transfer failed at message size {} B, batch {}: {e}", p.msg, p.batch)));
        }
        let got = got.map_err(|e| fail(format!("exchange after point {pi} (is the peer still reachable?): {e}")))?;
        if let Some(k) = got.iter().take(world / 2).position(|g| g.first() == Some(&MAGIC_ABORT)) {
            return Err(fail(format!("initiator {k} (rank {k}) aborted; see its output")));
        }
        if got.iter().any(|g| g.first() == Some(&MAGIC_SKIP)) {
            skipped = true;
        }
        // Second exchange (now that the data moved): rank 1's checksum of every slot.
        if !skipped {
            let mut sums = Vec::new();
            if rank == 1 {
                corrupt_for_test(args, &mut buf, &offs).map_err(fail)?;
                for c in buf.checksums(&offs, p.msg).map_err(fail)? {
                    sums.extend_from_slice(&c.to_le_bytes());
                }
            }
            let got = boot.allgather(&sums).map_err(|e| fail(format!("checksum exchange after point {pi}: {e}")))?;
            if rank == 0 && validation.is_none() {
                let theirs: Vec<u64> = got
                    .get(peer_rank)
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect();
                let ours = buf.checksums(&offs, p.msg).map_err(fail)?;
                if let Some(i) = first_mismatch(&ours, &theirs) {
                    validation = Some(format!(
                        "FAILED: first mismatching slot {i} (offset {} B) at message size {} B, batch {}",
                        offs.get(i).copied().unwrap_or(0),
                        p.msg,
                        p.batch
                    ));
                }
            }
        }
        if rank == 0 {
            if let Some(Ok(row)) = result {
                rows.push(row);
            }
            if let Some(b) = &bar {
                b.inc(1);
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    // Initiators end first, while the targets still hold their memory: their engines deliver
    // the last completion notifications and close their IPC mappings (the engine's and the
    // copy baseline's) before a target frees the buffer behind them; targets end after the
    // final barrier.
    type Parts = Option<(Option<Session>, Option<CopyBaseline>, IoEngine)>;
    let end = |parts: &mut Parts| -> Result<(), Failure> {
        if let Some((sess, baseline, eng)) = parts.take() {
            drop(sess);
            drop(baseline);
            // Deregister before the engine goes: waits for anything still using the buffer.
            eng.deregister_memory(&mem).map_err(|e| fail(format!("deregister the buffer: {e}")))?;
            drop(eng);
        }
        Ok(())
    };
    let mut parts: Parts = Some((sess, baseline, eng));
    if rank == 0 {
        end(&mut parts)?;
    }
    boot.barrier().map_err(|e| fail(format!("final barrier: {e}")))?;
    end(&mut parts)?;
    drop(buf);
    let validation = if skipped { "skipped".to_string() } else { validation.unwrap_or_else(|| "OK".into()) };
    if world == 2 {
        return Ok(Outcome { rows, validation, pairs: Vec::new(), paged });
    }
    // Several pairs: every initiator's rows and validation go to global rank 0.
    let mine = PairOutcome { gpu: args.device_for(0, args.local_index).unwrap_or(0), rows, validation };
    let all = boot
        .allgather(&postcard::to_allocvec(&mine).map_err(|e| fail(e.to_string()))?)
        .map_err(|e| fail(format!("gathering the pairs' rows: {e}")))?;
    if me != 0 {
        return Ok(Outcome { rows: Vec::new(), validation: mine.validation, pairs: Vec::new(), paged: None });
    }
    let pairs = all
        .iter()
        .take(n)
        .map(|b| postcard::from_bytes::<PairOutcome>(b).map_err(|e| fail(format!("a pair's rows: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let validation = match pairs.iter().find(|p| p.validation.starts_with("FAILED")) {
        Some(p) => format!("FAILED: [gpu {}] {}", p.gpu, p.validation.trim_start_matches("FAILED: ")),
        None => pairs.first().map(|p| p.validation.clone()).unwrap_or(mine.validation),
    };
    Ok(Outcome { rows: aggregate(&pairs), validation, pairs, paged: None })
}

/// The rdma backend's settings from the environment and the seed's tuning flags.
pub fn rdma_config(args: &Args) -> Result<RdmaConfig, IoError> {
    let mut c = RdmaConfig::from_env()?;
    c.qps_per_transfer = args.num_qp_per_transfer;
    c.workers = args.num_worker_threads;
    c.chunking = !args.disable_chunking;
    c.chunk_bytes = args.chunk_bytes;
    c.max_chunks = args.max_chunks as usize;
    if let Some(v) = args.max_send_wr {
        c.max_send_wr = v;
    }
    if let Some(v) = args.max_msg_sge {
        c.max_msg_sge = v;
    }
    c.poll_mode = if args.poll_cq_mode == PollArg::Event { PollMode::Event } else { PollMode::Polling };
    Ok(c)
}

/// Test-only fault injection: with `MORI_BENCH_CORRUPT_SLOT=N` (write op), rank 1 flips one
/// byte of slot N after the transfer, so the end-to-end mismatch report can be tested.
fn corrupt_for_test(args: &Args, buf: &mut Buffer, offs: &[u64]) -> Result<(), String> {
    if args.op != OpArg::Write {
        return Ok(());
    }
    if let Some(i) = std::env::var("MORI_BENCH_CORRUPT_SLOT").ok().and_then(|v| v.parse::<usize>().ok()) {
        if let Some(&o) = offs.get(i) {
            buf.flip(o)?;
        }
    }
    Ok(())
}

fn progress(rank: usize, n: usize) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if rank != 0 || n < 2 || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(n as u64);
    if let Ok(s) = indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} points  {msg}") {
        b.set_style(s);
    }
    Some(b)
}

#[allow(clippy::too_many_arguments)]
fn measure(
    args: &Args,
    eng: &IoEngine,
    sess: Option<&Session>,
    mem: &MemoryDesc,
    remote: &MemoryDesc,
    p: Point,
    offs: &[u64],
    deadline: Duration,
    baseline: Option<&CopyBaseline>,
) -> Result<Row, IoError> {
    let sizes = vec![p.msg; offs.len()];
    let write = args.op == OpArg::Write;
    let wait = |st: TransferStatus| match args.poll_cq_mode {
        PollArg::Polling => st.spin_for(deadline),
        PollArg::Event => st.wait_for(deadline),
    };
    let batch = |id| match (sess, write) {
        (Some(s), true) => s.batch_write(offs, offs, &sizes, id),
        (Some(s), false) => s.batch_read(offs, offs, &sizes, id),
        (None, true) => eng.batch_write(mem, offs, remote, offs, &sizes, id),
        (None, false) => eng.batch_read(mem, offs, remote, offs, &sizes, id),
    };
    let single = |o: u64, id| match (sess, write) {
        (Some(s), true) => s.write(o, o, p.msg, id),
        (Some(s), false) => s.read(o, o, p.msg, id),
        (None, true) => eng.write(mem, o, remote, o, p.msg, id),
        (None, false) => eng.read(mem, o, remote, o, p.msg, id),
    };
    let iter = || -> Result<(), IoError> {
        if args.batch_transfer() {
            wait(batch(eng.allocate_transfer_uid()))
        } else {
            let sts: Vec<TransferStatus> = offs.iter().map(|&o| single(o, eng.allocate_transfer_uid())).collect();
            sts.into_iter().try_for_each(wait)
        }
    };
    for _ in 0..args.warmup_iters {
        iter()?;
    }
    let Some(b) = baseline else {
        let t0 = Instant::now();
        for _ in 0..args.iters {
            iter()?;
        }
        return Ok(Row::new(p.msg, p.batch, args.iters, t0.elapsed()));
    };
    // --copy-baseline: the timed iterations in blocks, each followed by as many bare copies
    // of the same slots (their own warm-up first); each side's time is the sum of its blocks.
    let gpu_err = |e: String| IoError::new(ErrorCode::GpuOp, e);
    let views = b.views(offs, p.msg, write).map_err(gpu_err)?;
    for _ in 0..args.warmup_iters {
        b.once(&views).map_err(gpu_err)?;
    }
    let blocks = BASELINE_BLOCKS.min(args.iters).max(1);
    let (mut engine, mut copies) = (Duration::ZERO, Duration::ZERO);
    for k in 0..blocks {
        let n = args.iters / blocks + u64::from(k < args.iters % blocks);
        let t0 = Instant::now();
        for _ in 0..n {
            iter()?;
        }
        engine += t0.elapsed();
        let t0 = Instant::now();
        for _ in 0..n {
            b.once(&views).map_err(gpu_err)?;
        }
        copies += t0.elapsed();
    }
    let mut row = Row::new(p.msg, p.batch, args.iters, engine);
    row.copy_lat_us = Some(copies.as_secs_f64() * 1e6 / (args.iters * p.batch).max(1) as f64);
    if std::env::var_os(SPLIT_ENV).is_some() {
        // Diagnostic: where each side's time goes, posting (the call that queues the work)
        // against waiting (until the spin saw it done), over as many more iterations.
        let (mut ep, mut ew, mut cp, mut cw) = (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for _ in 0..args.iters {
            let t0 = Instant::now();
            let st = batch(eng.allocate_transfer_uid());
            let t1 = Instant::now();
            wait(st)?;
            let t2 = Instant::now();
            let (q, w) = b.once_split(&views).map_err(gpu_err)?;
            ep += t1 - t0;
            ew += t2 - t1;
            cp += q;
            cw += w;
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6 / args.iters.max(1) as f64;
        eprintln!(
            "split {} B x {}: engine post {:.2} + wait {:.2} us; copy post {:.2} + wait {:.2} us",
            p.msg,
            p.batch,
            us(ep),
            us(ew),
            us(cp),
            us(cw)
        );
    }
    Ok(row)
}

/// With `--copy-baseline`, setting this variable prints per point how each side's time
/// splits into posting and waiting (a diagnostic; more iterations, not in the table).
pub const SPLIT_ENV: &str = "MORI_BENCH_SPLIT";

/// Blocks per point with `--copy-baseline` (engine and bare copies alternate this often). The
/// H200 machine's copy submission cost drifts between two levels (about 4.2 and 5.5 µs per
/// `cuMemcpyDtoDAsync` call) over time, on every stream alike: fine alternation puts both sides
/// in the same windows (20 blocks let one run in call 10 land 1.096 at 4 MiB; see
/// docs/PERFORMANCE.md).
pub const BASELINE_BLOCKS: u64 = 100;
