//! Setting a [`HostEp`] up: windows, engines, the descriptor exchange and its checks.

use super::shm::ShmWindow;
use super::{HostEp, HostOptions, InterTransport, RankStats};
use crate::config::EpConfig;
use crate::error::{EpError, EpResult};
use crate::internode::{Proto, Scheme};
use crate::layout::OutOfRange;
use crate::proxy::{PeerWindow, Proxy};
use mori_io::{BackendConfig, EngineConfig, EngineDesc, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

/// What each process tells the others.
#[derive(Serialize, Deserialize)]
struct Hello {
    ranks: (usize, usize),
    /// The configuration, field by field (name, value), compared across processes.
    shape: Vec<(String, String)>,
    /// Per local rank: its engine and its registered window (multi-node jobs only).
    engines: Vec<Option<(EngineDesc, MemoryDesc)>>,
}

fn host_err(what: impl Into<String>, detail: impl ToString) -> EpError {
    EpError::Host { what: what.into(), detail: detail.to_string() }
}

fn invalid(field: &'static str, value: String, reason: String) -> EpError {
    EpError::InvalidConfig { field, value, reason }
}

fn shape(cfg: &EpConfig, scheme: Scheme, opts: &HostOptions, window: usize) -> Vec<(String, String)> {
    let f = |n: &str, v: String| (n.to_string(), v);
    vec![
        f("world_size", cfg.world_size.to_string()),
        f("gpus_per_node", cfg.gpus_per_node.to_string()),
        f("max_tokens_per_rank", cfg.max_tokens_per_rank.to_string()),
        f("hidden", cfg.hidden.to_string()),
        f("num_experts", (cfg.experts_per_rank * cfg.world_size).to_string()),
        f("top_k", cfg.top_k.to_string()),
        f("max_token_type_size", cfg.max_token_type_size.to_string()),
        f("scale_dim", cfg.scale_dim.to_string()),
        f("scale_type_size", cfg.scale_type_size.to_string()),
        f("max_recv_tokens", cfg.max_recv_tokens.to_string()),
        f("kernel scheme", format!("{scheme:?}")),
        f("chunk_tokens", opts.chunk_tokens.to_string()),
        f("inter-node transport", format!("{:?}", opts.transport)),
        f("window bytes", window.to_string()),
    ]
}

fn engine_for(key: &str, opts: &HostOptions) -> EpResult<(IoEngine, String)> {
    let ecfg = EngineConfig::new(opts.host.clone(), 0).map_err(|e| host_err("MORI-IO engine configuration", e))?;
    let eng = IoEngine::new(key, ecfg).map_err(|e| host_err(format!("MORI-IO engine {key} on {}", opts.host), e))?;
    let path = match &opts.transport {
        InterTransport::Tcp { lanes } => {
            let mut t = TcpConfig::from_env().map_err(|e| host_err("tcp backend settings", e))?;
            t.lanes = *lanes;
            eng.create_backend(BackendConfig::Tcp(t)).map_err(|e| host_err(format!("tcp backend with {lanes} lanes"), e))?;
            format!("MORI-IO tcp, {lanes} lanes per peer")
        }
        InterTransport::Rdma { devices } => rdma_backend(&eng, devices.as_deref())?,
    };
    Ok((eng, path))
}

#[cfg(feature = "rdma")]
fn rdma_backend(eng: &IoEngine, devices: Option<&str>) -> EpResult<String> {
    if let Some(d) = devices {
        std::env::set_var("MORI_RDMA_DEVICES", d);
    }
    let c = mori_io::RdmaConfig::from_env().map_err(|e| host_err("rdma backend settings", e))?;
    let qps = c.qps_per_transfer;
    eng.create_backend(BackendConfig::Rdma(c)).map_err(|e| host_err("rdma backend (needs an active RDMA port)", e))?;
    Ok(format!("MORI-IO rdma, {qps} QPs per transfer"))
}

#[cfg(not(feature = "rdma"))]
fn rdma_backend(_: &IoEngine, _: Option<&str>) -> EpResult<String> {
    Err(host_err("inter-node transport rdma", "this build of mori-ep has no rdma backend (cargo feature `rdma`)"))
}

pub(super) fn build(
    cfg: &EpConfig,
    scheme: Scheme,
    local: Range<usize>,
    boot: &dyn mori_bootstrap::Bootstrap,
    opts: HostOptions,
) -> EpResult<HostEp> {
    let proto = Proto::new(cfg, scheme, opts.chunk_tokens, OutOfRange::default())?;
    let w = cfg.world_size;
    if local.is_empty() || local.end > w {
        return Err(invalid("local ranks", format!("{local:?}"), format!("must be a non-empty range inside 0..{w}")));
    }
    let topo = *proto.topology();
    // The window: the protocol's layout, then the abort word (super::abort).
    let size = proto.layout().size() + 8;
    // Bootstrap members are processes: their errors name processes (with their EP ranks
    // once the descriptors told them).
    let boot_err = |op: &str, e: mori_bootstrap::BootstrapError| {
        host_err(format!("bootstrap {op}"), super::process_names(&e.to_string(), &|p| (p == boot.rank()).then(|| local.clone())))
    };
    // The job's id names the shared-memory files: process 0's clock and pid.
    let seed = opts.job.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
            ^ u64::from(std::process::id()) << 32
    });
    let job =
        boot.broadcast(0, (boot.rank() == 0).then_some(&seed.to_le_bytes()[..])).map_err(|e| boot_err("broadcast of the job id", e))?;
    let job = u64::from_le_bytes(job.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(|| host_err("job id", "short broadcast"))?);
    let name = |r: usize| super::shm::window_name(job, r);
    let mut wins = BTreeMap::new();
    for r in local.clone() {
        wins.insert(r, ShmWindow::create(&name(r), size)?);
    }
    let multi = topo.num_nodes() > 1;
    let mut engines = Vec::new();
    let mut mine = Vec::new();
    let mut path = String::from("none (one node)");
    if multi {
        for r in local.clone() {
            let (eng, p) = engine_for(&format!("ep-{job:016x}-r{r}"), &opts)?;
            path = p;
            let win = &wins[&r];
            // SAFETY: the window stays mapped until HostEp's drop deregisters it first.
            let m = unsafe { eng.register_memory(win.ptr(), win.len(), MemLoc::Host { numa: None }) }
                .map_err(|e| host_err(format!("registering rank {r}'s window"), e))?;
            mine.push(Some((eng.desc().clone(), m)));
            engines.push(Arc::new(eng));
        }
    } else {
        mine.resize(local.len(), None);
    }
    let hello = Hello { ranks: (local.start, local.end), shape: shape(cfg, scheme, &opts, size), engines: mine.clone() };
    let bytes = postcard::to_stdvec(&hello).map_err(|e| host_err("encoding this process's descriptors", e))?;
    let all = boot.allgather(&bytes).map_err(|e| boot_err("allgather of descriptors", e))?;
    let hellos: Vec<Hello> = all
        .iter()
        .enumerate()
        .map(|(p, b)| postcard::from_bytes(b).map_err(|e| host_err(format!("descriptors of process {p}"), e)))
        .collect::<EpResult<_>>()?;
    check_peers(&hello, &hellos, w)?;
    // Every rank's (engine, window), by rank.
    let mut remote: Vec<Option<(EngineDesc, MemoryDesc)>> = vec![None; w];
    for h in &hellos {
        for (i, e) in h.engines.iter().enumerate() {
            remote[h.ranks.0 + i] = e.clone();
        }
    }
    let my_nodes: Vec<usize> = local.clone().map(|r| topo.node_of_rank(r)).collect();
    for r in 0..w {
        if !local.contains(&r) && my_nodes.contains(&topo.node_of_rank(r)) {
            wins.insert(r, ShmWindow::open(&name(r), size)?);
        }
    }
    if opts.inject_exit == Some(super::ProcessInjection::KillInSetup) {
        super::ProcessInjection::KillInSetup.raise();
    }
    boot.barrier().map_err(|e| {
        let ranks = |p: usize| hellos.get(p).map(|h| h.ranks.0..h.ranks.1);
        host_err("bootstrap barrier after mapping the windows", super::process_names(&e.to_string(), &ranks))
    })?;
    for r in local.clone() {
        if let Some(win) = wins.get_mut(&r) {
            win.unlink();
        }
    }
    let mut proxies = Vec::new();
    let mut peer_mems = Vec::new();
    let mut mems = Vec::new();
    for (li, r) in local.clone().enumerate() {
        let Some(eng) = engines.get(li) else {
            mems.push(None);
            continue;
        };
        let mut peers = vec![None; w];
        for (p, slot) in peers.iter_mut().enumerate() {
            if topo.node_of_rank(p) == topo.node_of_rank(r) {
                continue;
            }
            let Some((ed, md)) = remote[p].clone() else {
                return Err(host_err(format!("rank {p}'s descriptors"), "missing: its process sent no engine"));
            };
            eng.register_remote_engine(ed).map_err(|e| host_err(format!("registering rank {p}'s engine with rank {r}'s"), e))?;
            *slot = Some(md);
        }
        let m = mine[li].as_ref().map(|(_, m)| m.clone()).ok_or_else(|| host_err("window descriptor", "missing"))?;
        peer_mems.push(peers.clone());
        proxies.push(
            Proxy::start(r, eng.clone(), m.clone(), peers.into_iter().map(|p| p.map(PeerWindow::single)).collect(), opts.inject)
                .map_err(|e| host_err(format!("starting rank {r}'s proxy thread"), e))?,
        );
        mems.push(Some(m));
    }
    let g = topo.ranks_per_node();
    let describe = format!(
        "mori_ep::host: {scheme:?}, {} node(s) x {g} ranks; this process: ranks {}..{}; intra-node: shared memory (window {:.1} MB per rank); inter-node: {path}{}, signalled writes from one proxy thread per rank, {} tokens per write{}",
        topo.num_nodes(),
        local.start,
        local.end,
        size as f64 / 1e6,
        if multi { format!(" on {}", opts.host) } else { String::new() },
        opts.chunk_tokens,
        match opts.inject {
            Some(i) => format!("; injected proxy delays up to {:?}{}", i.max_delay, if i.reorder { " and reordering" } else { "" }),
            None => String::new(),
        }
    );
    let n = local.len();
    Ok(HostEp {
        proto,
        opts,
        local: local.clone(),
        proxies,
        mems,
        engines,
        wins,
        states: vec![None; n],
        staged: vec![0; n],
        peer_mems,
        abort_off: size - 8,
        poisoned: None,
        dispatches: 0,
        stats: local.map(|rank| RankStats { rank, ..RankStats::default() }).collect(),
        describe,
    })
}

/// The processes' ranges tile `0..w` in process order, and every process runs this shape.
fn check_peers(me: &Hello, all: &[Hello], w: usize) -> EpResult<()> {
    let mut next = 0;
    for (p, h) in all.iter().enumerate() {
        if h.ranks.0 != next || h.ranks.1 <= h.ranks.0 {
            return Err(invalid(
                "local ranks",
                format!("{}..{} on process {p}", h.ranks.0, h.ranks.1),
                format!("processes must host consecutive ranks in process order (expected {next}..)"),
            ));
        }
        next = h.ranks.1;
        for ((field, mine), (_, theirs)) in me.shape.iter().zip(&h.shape) {
            if mine != theirs {
                return Err(EpError::PeerMismatch {
                    rank: me.ranks.0,
                    field: field.clone(),
                    mine: mine.clone(),
                    peer: h.ranks.0,
                    theirs: theirs.clone(),
                });
            }
        }
    }
    if next != w {
        return Err(invalid("local ranks", format!("0..{next} over all processes"), format!("must cover world_size = {w}")));
    }
    Ok(())
}
