//! `--device cpu`: the host implementation (`mori_ep::host::HostEp`): shared memory between the
//! ranks of a node, MORI-IO (TCP lanes or RDMA) between nodes; V1, V1-LL and AsyncLL.
//!
//! Processes: with `--local` this process spawns one child per `--ranks-per-proc R` ranks on
//! this host (children get `--proc-index` and the bootstrap root's address); without it, it is
//! one of the processes a launcher started (torchrun, srun, mpirun: rank, world and master from
//! the environment). Process p hosts EP ranks `[p*R, (p+1)*R)`; the bootstrap has one member
//! per process.
//!
//! Inputs are those of the GPU path (same seeds, DeepEP routing with one expert group per
//! node). The first iteration is checked bit for bit unless `--no-check`: every local rank's
//! received rows, weights, scales, indices and sources (both sides in canonical order) against
//! the host reference's dispatch, and the combine output and weights against the reference
//! combine of the same rows (summed per node for V1/V1-LL, ascending for AsyncLL). Every
//! iteration's combine rows are a function of each received row's source, so every iteration
//! is a valid round; times are the host implementation's own (RankStats), averaged over
//! `--iters` after `--warmup`.

use crate::args::{config, err, AnyResult, Args, CombDType, DType, IdxType, KillAt, TransportArg};
use crate::cpu_supervisor::Supervisor;
use crate::inputs::{bytes_of, comb_value, gen_inputs, Inputs, RowBytes};
use mori_bootstrap::{Bootstrap, BootstrapEnv, SocketBootstrap, SocketBootstrapConfig};
use mori_ep::host::{HostEp, HostOptions, InterTransport, ProcessInjection, ProxyInjection};
use mori_ep::internode::Scheme;
use mori_ep::{
    accounting, bf16, combine, dispatch, quantize_fp8_blocks, CombineOptions, CombineOut, DispatchOptions, Element, EpConfig, RankInput,
    Tensor2, TopkIndex, Weighting,
};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

/// One rank's figures (means over the timed iterations).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RankFigures {
    rank: usize,
    recv_tokens: u64,
    rdma_algo_tokens: u64,
    rdma_physical_tokens: u64,
    dispatch_us: f64,
    combine_us: f64,
    /// Algo RDMA bytes of dispatch (algo tokens x H x dispatch element size) over dispatch time.
    dispatch_rdma_algo_gbps: f64,
    dispatch_rdma_physical_gbps: f64,
    /// The same token counts in the combine dtype over combine time.
    combine_rdma_algo_gbps: f64,
    combine_rdma_physical_gbps: f64,
    /// Bytes this rank's inter-node leg moved in one dispatch.
    inter_bytes: u64,
    inter_dispatch_us: f64,
    inter_gbps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
struct ProcFigures {
    process: usize,
    describe: String,
    ranks: Vec<RankFigures>,
    check: String,
}

pub fn run(a: &Args) -> AnyResult<bool> {
    let cfg = config(a)?;
    let procs = a.cpu_procs();
    check_host_memory(a, if a.local { procs } else { 1 })?;
    let spawner = a.local && a.proc_master.is_none();
    if spawner || a.launch.as_ref().is_some_and(|l| l.rank == 0) {
        if let Some(path) = &a.json {
            std::fs::File::create(path).map_err(|e| err(format!("--json {path}: cannot be written: {e}")))?;
        }
    }
    let timeouts = bootstrap_timeouts(&|k: &str| std::env::var(k).ok())?;
    // The --local parent (process 0) picks the job id: it names every window of the job, so
    // that the parent can remove those a process that died during setup left.
    let job = if spawner { Some(job_id(&|k: &str| std::env::var(k).ok())?) } else { None };
    if a.local && a.inject_kill_at == Some(KillAt::Bootstrap) && a.inject_kill_rank.is_some_and(|r| r / a.rpp() == a.proc_index) {
        // SAFETY: signalling this process (test injection: dead before joining the bootstrap).
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let mut sup = None;
    let bc = match &a.launch {
        Some(env) => launcher_config(env, procs)?,
        None => {
            let master = match a.proc_master {
                Some(m) => m,
                None => {
                    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
                    let m: SocketAddr = format!("127.0.0.1:{port}").parse()?;
                    let exe = std::env::current_exe()?;
                    let argv: Vec<String> = std::env::args().skip(1).collect();
                    let mut children = Vec::new();
                    for i in 1..procs {
                        let child = Command::new(&exe)
                            .args(&argv)
                            .args(["--proc-index", &i.to_string(), "--proc-master", &m.to_string()])
                            .spawn()
                            .map_err(|e| err(format!("spawning process {i} of {procs} ({}): {e}", exe.display())));
                        match child {
                            Ok(c) => children.push((i, c)),
                            Err(e) => {
                                Supervisor::start(children, a, job).abort(&e.to_string());
                                return Err(e);
                            }
                        }
                    }
                    sup = Some(Supervisor::start(children, a, job));
                    m
                }
            };
            SocketBootstrapConfig::new(a.proc_index, procs, master).with_timeouts(timeouts.0, timeouts.1)
        }
    };
    let rpp = a.rpp();
    let boot = SocketBootstrap::new(bc).map_err(|e| err(format!("bootstrap: {}", members(&e, rpp))));
    if let (Some(s), Ok(_)) = (&sup, &boot) {
        s.joined();
    }
    let result = boot.and_then(|boot| run_process(a, &cfg, &boot, job));
    let children_ok = match sup {
        Some(s) => s.finish(!matches!(result, Ok(true))),
        None => true,
    };
    Ok(result? && children_ok)
}

/// The bootstrap's rendezvous and per-collective deadlines: `MORI_BOOTSTRAP_TIMEOUT` and
/// `MORI_BOOTSTRAP_OP_TIMEOUT` (seconds) when set, else 60 s and 120 s (a collective before a
/// timed phase waits for every process's previous phase and check).
fn bootstrap_timeouts(vars: &dyn Fn(&str) -> Option<String>) -> AnyResult<(Duration, Duration)> {
    let get = |k: &str, default: Duration| -> AnyResult<Duration> {
        match vars(k).filter(|v| !v.trim().is_empty()) {
            Some(v) => Ok(mori_bootstrap::parse_secs(k, &v)?),
            None => Ok(default),
        }
    };
    let set = vars(mori_bootstrap::ENV_TIMEOUT).is_some_and(|v| !v.trim().is_empty());
    let rendezvous = get(mori_bootstrap::ENV_TIMEOUT, Duration::from_secs(60))?;
    // As the bootstrap reads them: the per-collective deadline defaults to the rendezvous one.
    let op = get(mori_bootstrap::ENV_OP_TIMEOUT, if set { rendezvous } else { Duration::from_secs(120) })?;
    Ok((rendezvous, op))
}

/// The job id of a --local run: `MORI_EP_JOB` (16 hex digits at most) when set, else from the
/// clock and this process's id.
fn job_id(vars: &dyn Fn(&str) -> Option<String>) -> AnyResult<u64> {
    match vars("MORI_EP_JOB") {
        Some(v) => u64::from_str_radix(v.trim(), 16)
            .map_err(|e| err(format!("MORI_EP_JOB={v:?}: not a job id (1 to 16 hex digits, as in /dev/shm/mori-ep-<job>-r<rank>): {e}"))),
        None => Ok(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
            ^ u64::from(std::process::id()) << 32),
    }
}

/// A bootstrap error with its members named as processes and their EP ranks.
fn members(e: &mori_bootstrap::BootstrapError, rpp: usize) -> String {
    mori_ep::host::process_names(&e.to_string(), &|p| Some(p * rpp..(p + 1) * rpp))
}

/// Refuses a run whose inputs cannot fit: every process generates every rank's inputs (the
/// check needs them), at least `W x T x (4 H + 12 K)` bytes (f32 rows, i64 ids, f32 weights),
/// and `procs_here` processes run on this host; compared with /proc/meminfo's MemAvailable.
fn check_host_memory(a: &Args, procs_here: usize) -> AnyResult<()> {
    let per_proc = (a.world_size as u128) * (a.num_tokens as u128) * (4 * a.hidden as u128 + 12 * a.top_k as u128);
    let need = per_proc * procs_here as u128;
    let avail = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u128>().ok())
            .map(|kb| kb * 1024)
    });
    match avail {
        Some(avail) if need > avail => Err(err(format!(
            "--world-size {} --num-tokens {} --hidden {}: each process holds every rank's inputs for the check, at least {:.1} GB, x {procs_here} process(es) on this host = {:.1} GB > {:.1} GB available (MemAvailable); lower --num-tokens or --hidden",
            a.world_size,
            a.num_tokens,
            a.hidden,
            per_proc as f64 / 1e9,
            need as f64 / 1e9,
            avail as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}

fn launcher_config(env: &BootstrapEnv, procs: usize) -> AnyResult<SocketBootstrapConfig> {
    if env.world_size != procs {
        return Err(err(format!("the launcher's {} processes do not match the {procs} processes of these flags", env.world_size)));
    }
    Ok(env.clone().into_config()?)
}

fn host_options(a: &Args, local: &std::ops::Range<usize>, job: Option<u64>) -> HostOptions {
    let mut o = HostOptions {
        transport: match a.transport.unwrap_or(TransportArg::Tcp) {
            TransportArg::Tcp => InterTransport::Tcp { lanes: a.lanes.unwrap_or(4) },
            TransportArg::Rdma => InterTransport::Rdma { devices: None },
        },
        deadline: Duration::from_millis(a.timeout_ms),
        chunk_tokens: a.chunk_tokens.unwrap_or(HostOptions::default().chunk_tokens),
        inject: a.inject_delay_us.map(|us| ProxyInjection {
            seed: a.seed,
            max_delay: Duration::from_micros(us),
            reorder: a.inject_reorder,
        }),
        job,
        inject_exit: a.inject_kill_rank.filter(|r| local.contains(r)).and_then(|_| match a.inject_kill_at.unwrap_or(KillAt::Dispatch) {
            KillAt::Bootstrap => None,
            KillAt::Setup => Some(ProcessInjection::KillInSetup),
            // The second dispatch: iteration 1, the others in theirs.
            KillAt::Dispatch => Some(ProcessInjection::KillInDispatch { nth: 1 }),
            KillAt::StopInDispatch => Some(ProcessInjection::StopInDispatch { nth: 1 }),
        }),
        ..HostOptions::default()
    };
    if let Some(ip) = a.host {
        o.host = ip.to_string();
    }
    o
}

fn run_process(a: &Args, cfg: &EpConfig, boot: &SocketBootstrap, job: Option<u64>) -> AnyResult<bool> {
    let t0 = Instant::now();
    let p = boot.rank();
    let rpp = a.rpp();
    let local = p * rpp..(p + 1) * rpp;
    let local_start = local.start;
    let inp = gen_inputs(a, cfg)?;
    let host_s = t0.elapsed().as_secs_f64();
    let scheme = Scheme::from_kernel_type(cfg.kernel_type);
    let mut ep = HostEp::new(cfg, scheme, local.clone(), boot, host_options(a, &local, job))
        .map_err(|e| err(format!("process {p} (ranks {}..{}): setup: {e}", local.start, local.end)))?;
    let mut pf = ProcFigures { process: p, describe: ep.describe(), ..Default::default() };
    if p == 0 {
        println!("{}", pf.describe);
    }
    let mut run = Run { a, cfg, boot, ep: &mut ep, inp: &inp, local };
    let outcome = match a.dtype {
        DType::F32 => run.by_idx(inp.x_f32.clone(), vec![None; cfg.world_size]),
        DType::Bf16 => {
            let xs = inp.x_f32.iter().map(|t| t.map(|&v| bf16::from_f32(v))).collect();
            run.by_idx(xs, vec![None; cfg.world_size])
        }
        DType::Fp8 => {
            let (q, s): (Vec<_>, Vec<_>) = inp.x_f32.iter().map(quantize_fp8_blocks).unzip();
            run.by_idx(q, s.into_iter().map(Some).collect())
        }
    };
    // An error ends this process at once (its peers fail on their own deadlines): no final
    // collective that a dead peer would hold up, and no orderly shutdown of the executor (its
    // engines would wait for a stopped peer's connections; its windows are unlinked already).
    if outcome.is_err() {
        std::mem::forget(ep);
    }
    let (ranks, check) = outcome.map_err(|e| err(format!("process {p} (ranks {}..{}): {e}", local_start, local_start + rpp)))?;
    pf.ranks = ranks;
    pf.check = check;
    let all: Vec<ProcFigures> = boot
        .allgather(&serde_json::to_vec(&pf)?)
        .map_err(|e| err(format!("process {p}: bootstrap allgather of the figures: {}", members(&e, rpp))))?
        .iter()
        .map(|v| serde_json::from_slice(v))
        .collect::<Result<_, _>>()?;
    let ok = all.iter().all(|p| p.check.starts_with("OK") || p.check == "skipped");
    if p == 0 {
        report(a, cfg, &all, host_s)?;
    }
    Ok(ok)
}

type Outcome = AnyResult<(Vec<RankFigures>, String)>;

/// One process's run: its flags, configuration, bootstrap, executor, inputs and ranks.
struct Run<'a> {
    a: &'a Args,
    cfg: &'a EpConfig,
    boot: &'a dyn Bootstrap,
    ep: &'a mut HostEp,
    inp: &'a Inputs,
    local: std::ops::Range<usize>,
}

impl Run<'_> {
    fn by_idx<X: Element + RowBytes>(&mut self, xs: Vec<Tensor2<X>>, scales: Vec<Option<Tensor2<f32>>>) -> Outcome {
        match self.a.idx_type {
            IdxType::I64 => {
                let idx = self.inp.idx.clone();
                self.by_comb(xs, scales, idx)
            }
            IdxType::I32 => {
                let idx = self.inp.idx.iter().map(|t| t.map(|&v| v as i32)).collect();
                self.by_comb(xs, scales, idx)
            }
        }
    }

    fn by_comb<X: Element + RowBytes, I: TopkIndex + RowBytes>(
        &mut self,
        xs: Vec<Tensor2<X>>,
        scales: Vec<Option<Tensor2<f32>>>,
        idx: Vec<Tensor2<I>>,
    ) -> Outcome {
        let inputs: Vec<RankInput<X, I>> = (0..self.cfg.world_size)
            .map(|r| RankInput {
                x: xs[r].clone(),
                weights: self.inp.weights[r].clone(),
                scales: scales[r].clone(),
                indices: idx[r].clone(),
            })
            .collect();
        let (a, cfg, boot, local) = (self.a, self.cfg, self.boot, self.local.clone());
        match a.combine_dtype {
            CombDType::Bf16 => rounds::<X, I, bf16>(a, cfg, boot, self.ep, local, &inputs),
            CombDType::F32 => rounds::<X, I, f32>(a, cfg, boot, self.ep, local, &inputs),
        }
    }
}

/// Warm-up and timed rounds of dispatch then combine; the first checked against the reference.
fn rounds<X: Element + RowBytes, I: TopkIndex + RowBytes, C: Element + CombineOut + RowBytes>(
    a: &Args,
    cfg: &EpConfig,
    boot: &dyn Bootstrap,
    ep: &mut HostEp,
    local: std::ops::Range<usize>,
    inputs: &[RankInput<X, I>],
) -> Outcome {
    let sync = || boot.barrier().map_err(|e| err(format!("bootstrap barrier before a timed phase: {}", members(&e, a.rpp()))));
    let check = !a.no_check;
    let weighting = if a.weighted { Weighting::RankSlotSum } else { Weighting::Unweighted };
    let mine = &inputs[local.clone()];
    let n_local = local.len();
    let mut sum = vec![[0f64; 3]; n_local]; // dispatch µs, combine µs, inter-node dispatch µs
    let mut last = Vec::new();
    let mut check_msg = if check { String::new() } else { "skipped".to_string() };
    for it in 0..a.warmup + a.iters {
        sync()?;
        let recv = ep.dispatch(mine)?;
        let xs: Vec<Tensor2<C>> = recv
            .iter()
            .map(|rr| Tensor2::from_fn(rr.src.len(), cfg.hidden, |i, h| C::from_f32(comb_value(rr.src[i], h))))
            .collect::<Result<_, _>>()?;
        let ws: Vec<Tensor2<f32>> = recv.iter().map(|rr| rr.weights.clone()).collect();
        sync()?;
        let out = ep.combine::<C, C>(&xs, Some(&ws), weighting)?;
        if it == 0 && check {
            check_msg = match check_round(cfg, inputs, local.clone(), &recv, &out, weighting) {
                Ok(()) => "OK (dispatch rows, weights, scales, indices, sources; combine output and weights; bit-exact)".into(),
                Err(e) => format!("MISMATCH: {e}"),
            };
        }
        let stats = ep.last_stats();
        if it >= a.warmup {
            for (s, st) in sum.iter_mut().zip(&stats) {
                s[0] += st.dispatch_us;
                s[1] += st.combine_us;
                s[2] += st.inter_dispatch_us;
            }
        }
        last = stats;
    }
    let iters = a.iters.max(1) as f64;
    let (h, de, ce) = (cfg.hidden as u64, a.dtype.size() as u64, a.combine_dtype.size() as u64);
    let mut figs = Vec::new();
    for (st, s) in last.iter().zip(&sum) {
        let (du, cu, iu) = (s[0] / iters, s[1] / iters, s[2] / iters);
        let gbps = |tokens: u64, elem: u64, us: f64| -> AnyResult<f64> {
            Ok(accounting::bandwidth_gbps_from_us(accounting::rdma_algo_bytes(tokens, h, elem)?, us))
        };
        figs.push(RankFigures {
            rank: st.rank,
            recv_tokens: st.recv_tokens,
            rdma_algo_tokens: st.rdma_algo_tokens,
            rdma_physical_tokens: st.rdma_physical_tokens,
            dispatch_us: du,
            combine_us: cu,
            dispatch_rdma_algo_gbps: gbps(st.rdma_algo_tokens, de, du)?,
            dispatch_rdma_physical_gbps: gbps(st.rdma_physical_tokens, de, du)?,
            combine_rdma_algo_gbps: gbps(st.rdma_algo_tokens, ce, cu)?,
            combine_rdma_physical_gbps: gbps(st.rdma_physical_tokens, ce, cu)?,
            inter_bytes: st.inter_bytes,
            inter_dispatch_us: iu,
            inter_gbps: accounting::bandwidth_gbps_from_us(st.inter_bytes, iu),
        });
    }
    Ok((figs, check_msg))
}

/// The local ranks' first round against the host reference over all ranks, bit for bit.
fn check_round<X: Element + RowBytes, I: TopkIndex + RowBytes, C: Element + CombineOut + RowBytes>(
    cfg: &EpConfig,
    inputs: &[RankInput<X, I>],
    local: std::ops::Range<usize>,
    recv: &[mori_ep::RankRecv<X, I>],
    out: &[mori_ep::Combined<C>],
    weighting: Weighting,
) -> AnyResult<()> {
    let want = dispatch(cfg, inputs, DispatchOptions::default())?;
    for (li, r) in local.clone().enumerate() {
        let got = recv[li].canonicalize(r)?;
        let w = want.ranks[r].canonicalize(r)?;
        if got.src != w.src {
            return Err(err(format!("rank {r} received {} tokens, the reference {} (or other sources)", got.src.len(), w.src.len())));
        }
        let pairs = [
            ("rows", bytes_of(&got.x), bytes_of(&w.x)),
            ("weights", bytes_of(&got.weights), bytes_of(&w.weights)),
            ("indices", bytes_of(&got.indices), bytes_of(&w.indices)),
            ("scales", got.scales.as_ref().map(bytes_of).unwrap_or_default(), w.scales.as_ref().map(bytes_of).unwrap_or_default()),
        ];
        for (what, g, e) in pairs {
            if g != e {
                return Err(err(format!("rank {r}: dispatch {what} differ from the reference")));
            }
        }
    }
    // Reference combine: every rank's rows in the reference's received order, as the bench
    // builds them (a function of the source), weights = the received weights.
    let xs: Vec<Tensor2<C>> = want
        .ranks
        .iter()
        .map(|rr| Tensor2::from_fn(rr.src.len(), cfg.hidden, |i, h| C::from_f32(comb_value(rr.src[i], h))))
        .collect::<Result<_, _>>()?;
    let ws: Vec<Tensor2<f32>> = want.ranks.iter().map(|rr| rr.weights.clone()).collect();
    let idx: Vec<Tensor2<I>> = inputs.iter().map(|i| i.indices.clone()).collect();
    let opts = CombineOptions { weighting, order: Scheme::from_kernel_type(cfg.kernel_type).sum_order(), ..Default::default() };
    let comb = combine::<C, C, I>(cfg, &want.handle, &xs, Some(&ws), &idx, opts)?;
    for (li, r) in local.enumerate() {
        if bytes_of(&out[li].x) != bytes_of(&comb[r].x) {
            let (g, e) = (out[li].x.as_slice(), comb[r].x.as_slice());
            let at = g.iter().zip(e).position(|(a, b)| a.to_f32().to_bits() != b.to_f32().to_bits()).unwrap_or(0);
            let cols = cfg.hidden.max(1);
            return Err(err(format!(
                "rank {r} token {} column {}: combine gave {:?}, the reference {:?}",
                at / cols,
                at % cols,
                g.get(at),
                e.get(at)
            )));
        }
        let gw = out[li].weights.as_ref().map(bytes_of).unwrap_or_default();
        let ew = comb[r].weights.as_ref().map(bytes_of).unwrap_or_default();
        if gw != ew {
            return Err(err(format!("rank {r}: combine weights differ from the reference")));
        }
    }
    Ok(())
}

fn report(a: &Args, cfg: &EpConfig, all: &[ProcFigures], host_s: f64) -> AnyResult<()> {
    println!(
        "bench_dispatch_combine --device cpu: world {} ({} node(s) x {}, {} process(es) x {} rank(s)), {:?}, T={} H={} E={} K={} dispatch {:?} combine {:?} idx {:?}, iters {} warm-up {}{}",
        cfg.world_size,
        cfg.world_size / cfg.gpus_per_node.max(1),
        cfg.gpus_per_node,
        all.len(),
        a.rpp(),
        cfg.kernel_type,
        a.num_tokens,
        a.hidden,
        a.num_experts,
        a.top_k,
        a.dtype,
        a.combine_dtype,
        a.idx_type,
        a.iters,
        a.warmup,
        if a.weighted { ", weighted combine" } else { "" },
    );
    let mut ranks: Vec<&RankFigures> = all.iter().flat_map(|p| p.ranks.iter()).collect();
    ranks.sort_by_key(|r| r.rank);
    let lines: Vec<(usize, u64, u64)> = ranks.iter().map(|r| (r.rank, r.recv_tokens, r.rdma_algo_tokens)).collect();
    let rows = ranks
        .iter()
        .map(|r| {
            vec![
                r.rank.to_string(),
                r.recv_tokens.to_string(),
                r.rdma_algo_tokens.to_string(),
                r.rdma_physical_tokens.to_string(),
                format!("{:.1}", r.dispatch_us),
                format!("{:.1}", r.combine_us),
                format!("{:.2}", r.dispatch_rdma_algo_gbps),
                format!("{:.2}", r.dispatch_rdma_physical_gbps),
                format!("{:.2}", r.combine_rdma_algo_gbps),
                format!("{:.2}", r.combine_rdma_physical_gbps),
                r.inter_bytes.to_string(),
                format!("{:.2}", r.inter_gbps),
            ]
        })
        .collect();
    crate::table::print_ranks(
        &lines,
        &[
            "rank",
            "recv tokens",
            "rdma algo",
            "rdma phys",
            "dispatch µs",
            "combine µs",
            "disp RDMA algo GB/s",
            "disp RDMA phys GB/s",
            "comb RDMA algo GB/s",
            "comb RDMA phys GB/s",
            "inter-node bytes",
            "inter-node GB/s",
        ],
        rows,
    );
    for p in all {
        println!("check (process {}): {}", p.process, p.check);
    }
    println!("host inputs: {host_s:.1} s");
    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "device": "cpu", "world_size": cfg.world_size, "gpus_per_node": cfg.gpus_per_node,
            "kernel_type": cfg.kernel_type, "procs": all.len(), "ranks_per_proc": a.rpp(),
            "transport": a.transport.unwrap_or(TransportArg::Tcp), "lanes": a.lanes.unwrap_or(4),
            "num_tokens": a.num_tokens, "hidden": a.hidden, "num_experts": a.num_experts, "top_k": a.top_k,
            "dtype": a.dtype, "combine_dtype": a.combine_dtype, "iters": a.iters, "warmup": a.warmup,
            "weighted": a.weighted, "processes": all,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{bootstrap_timeouts, job_id};
    use std::time::Duration;

    #[test]
    fn local_bootstrap_deadlines_honour_the_variables_their_errors_name() {
        let vars =
            |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let s = Duration::from_secs;
        assert_eq!(bootstrap_timeouts(&vars(&[])).unwrap(), (s(60), s(120)));
        assert_eq!(bootstrap_timeouts(&vars(&[("MORI_BOOTSTRAP_TIMEOUT", "5")])).unwrap(), (s(5), s(5)));
        assert_eq!(
            bootstrap_timeouts(&vars(&[("MORI_BOOTSTRAP_TIMEOUT", "5"), ("MORI_BOOTSTRAP_OP_TIMEOUT", "2.5")])).unwrap(),
            (s(5), Duration::from_millis(2500))
        );
        let e = bootstrap_timeouts(&vars(&[("MORI_BOOTSTRAP_TIMEOUT", "soon")])).unwrap_err().to_string();
        assert!(e.contains("MORI_BOOTSTRAP_TIMEOUT") && e.contains("soon"), "{e}");
        assert_eq!(job_id(&vars(&[("MORI_EP_JOB", "00ab")])).unwrap(), 0xab);
        let e = job_id(&vars(&[("MORI_EP_JOB", "xyz")])).unwrap_err().to_string();
        assert!(e.starts_with("MORI_EP_JOB=\"xyz\": not a job id"), "{e}");
    }
}
