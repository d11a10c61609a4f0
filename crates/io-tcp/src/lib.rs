//! MORI-IO TCP backend.
//!
//! - Several connections ("lanes") per peer; one transfer is striped over all of them when it
//!   is large enough ([`TcpConfig::min_lane_bytes`] per lane), so `--num-qp-per-transfer N`
//!   maps to N lanes.
//! - Payload moves with `writev`/`readv` straight out of and into registered memory (no
//!   staging copy on either side).
//! - The target checks every (region id, offset, length) against its registrations and refuses
//!   the rest (`InvalidArgs`, or `NotFound` for an unknown or deregistered region).
//! - A write completes only after the target applied it (the target acknowledges after the
//!   payload is in its memory); a read of deregistered memory fails with `NotFound`.
//! - Every socket operation has a deadline ([`TcpConfig::data_timeout`]); a dead peer yields
//!   `RemoteDisconnect`, an unresponsive one `Timeout`.

mod client;
pub mod proto;
mod server;
pub mod vio;

use client::{dial, run_lane, Job, LaneTimeouts};
use crossbeam_channel::Sender;
use mori_io_core::status::Completion;
use mori_io_core::{
    Backend, BackendContext, BackendKind, EngineDesc, InboundSlot, IoError, IoResult, MemoryDesc, Refusal, TransferRequest, TransferStatus,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Settings of the TCP backend.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// Connections per peer (default 4; the bench's `--num-qp-per-transfer`). 1..=64.
    pub lanes: usize,
    /// A transfer uses `min(lanes, ceil(bytes / min_lane_bytes))` lanes (default 256 KiB).
    pub min_lane_bytes: u64,
    /// Connect deadline (default 10 s, env `MORI_IO_CONTROL_TIMEOUT_MS`).
    pub connect_timeout: Duration,
    /// Deadline of every socket read/write of a data connection (default 30 s, env
    /// `MORI_IO_TCP_TIMEOUT_MS`).
    pub data_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig { lanes: 4, min_lane_bytes: 256 << 10, connect_timeout: Duration::from_secs(10), data_timeout: Duration::from_secs(30) }
    }
}

impl TcpConfig {
    /// Defaults with the deadlines taken from the environment where set.
    /// Errors: `InvalidArgs` naming a variable that does not parse.
    pub fn from_env() -> IoResult<Self> {
        let d = TcpConfig::default();
        Ok(TcpConfig {
            connect_timeout: mori_io_core::env_millis("MORI_IO_CONTROL_TIMEOUT_MS", d.connect_timeout)?,
            data_timeout: mori_io_core::env_millis("MORI_IO_TCP_TIMEOUT_MS", d.data_timeout)?,
            ..d
        })
    }
}

struct PeerLanes {
    lanes: Vec<Sender<Job>>,
}

/// The TCP transport (see the crate docs).
pub struct TcpBackend {
    ctx: BackendContext,
    cfg: TcpConfig,
    peers: Mutex<HashMap<String, Arc<PeerLanes>>>,
    shutdown: Arc<AtomicBool>,
}

impl TcpBackend {
    /// Creates the backend. Errors: `InvalidArgs` when `lanes` is outside 1..=64.
    pub fn new(ctx: BackendContext, cfg: TcpConfig) -> IoResult<Self> {
        if !(1..=64).contains(&cfg.lanes) {
            return Err(IoError::invalid(format!("tcp lanes (num-qp-per-transfer) = {}, allowed 1..=64", cfg.lanes)));
        }
        if cfg.connect_timeout.is_zero() || cfg.data_timeout.is_zero() {
            return Err(IoError::invalid(
                "tcp connect_timeout / data_timeout (env MORI_IO_CONTROL_TIMEOUT_MS / MORI_IO_TCP_TIMEOUT_MS) is 0: it would turn the deadline off",
            ));
        }
        Ok(TcpBackend { ctx, cfg, peers: Mutex::new(HashMap::new()), shutdown: Arc::new(AtomicBool::new(false)) })
    }

    /// The configuration in effect.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    fn timeouts(&self) -> LaneTimeouts {
        LaneTimeouts { connect: self.cfg.connect_timeout, data: self.cfg.data_timeout }
    }

    fn lanes_for(&self, peer: &EngineDesc) -> IoResult<Arc<PeerLanes>> {
        if let Some(p) = self.peers.lock().get(&peer.key) {
            return Ok(p.clone());
        }
        let peer_arc = Arc::new(peer.clone());
        let mut lanes = Vec::with_capacity(self.cfg.lanes);
        for i in 0..self.cfg.lanes {
            let s = dial(&self.ctx.local, peer, i as u32, self.timeouts())?;
            let (tx, rx) = crossbeam_channel::unbounded();
            let (local, p, t) = (self.ctx.local.clone(), peer_arc.clone(), self.timeouts());
            std::thread::Builder::new()
                .name(format!("mori-tcp-lane{i}"))
                .spawn(move || run_lane(rx, Some(s), local, p, i as u32, t))
                .map_err(|e| IoError::transport(format!("spawn tcp lane thread: {e}")))?;
            lanes.push(tx);
        }
        let p = Arc::new(PeerLanes { lanes });
        Ok(self.peers.lock().entry(peer.key.clone()).or_insert(p).clone())
    }
}

impl Drop for TcpBackend {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Release);
    }
}

impl Backend for TcpBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Tcp
    }

    fn can_serve(&self, local: &MemoryDesc, remote: &MemoryDesc, peer: &EngineDesc) -> Result<(), Refusal> {
        let refuse = |reason: String| Err(Refusal { backend: BackendKind::Tcp, reason });
        if !local.loc.is_host() {
            return refuse(format!(
                "local memory {} is GPU memory; the tcp backend moves host memory only (GPU memory over TCP needs explicit host staging, not enabled)",
                local.id
            ));
        }
        if !remote.loc.is_host() {
            return refuse(format!(
                "remote memory {} of engine {:?} is GPU memory; the tcp backend moves host memory only",
                remote.id, remote.engine_key
            ));
        }
        if peer.host.is_empty() || peer.port == 0 {
            return refuse(format!("engine {:?} advertises no control address", peer.key));
        }
        Ok(())
    }

    fn connect(&self, peer: &EngineDesc) -> IoResult<()> {
        self.lanes_for(peer).map(|_| ())
    }

    fn ready(&self, peer: &EngineDesc, _remote: &MemoryDesc) -> bool {
        self.peers.lock().contains_key(&peer.key)
    }

    fn post(&self, req: TransferRequest, status: TransferStatus) {
        let local = req.local_region.clone();
        let peer = match self.lanes_for(&req.peer) {
            Ok(p) => p,
            Err(e) => return status.complete_piece(Err(e)),
        };
        let n = peer.lanes.len();
        let pieces =
            mori_io_core::plan::stripe(&req.segs, n, (req.id % n as u64) as usize, self.cfg.min_lane_bytes, proto::MAX_SEGS_PER_REQ);
        // A batch of only zero-length entries still reaches the target (one empty request), so
        // its application sees the transfer in pop_inbound_status as for any other.
        let pieces = if pieces.is_empty() {
            vec![mori_io_core::Piece { lane: (req.id % n as u64) as usize, stream_off: 0, segs: Vec::new() }]
        } else {
            pieces
        };
        let total = pieces.len() as u32;
        status.add_pieces(total - 1);
        for p in pieces {
            let job = Job {
                op: req.op,
                transfer_id: req.id,
                remote_mem: req.remote.id,
                remote_epoch: req.remote.engine_epoch,
                piece_total: total,
                segs: p.segs,
                stream_off: p.stream_off,
                entries: req.entries.clone(),
                local: local.clone(),
                status: status.clone(),
            };
            if let Err(e) = peer.lanes[p.lane].send(job) {
                e.0.finish(Err(IoError::bad_state("tcp lane worker is gone (the backend is shutting down); nothing was sent")));
            }
        }
    }

    fn accept(&self, stream: TcpStream, from: EngineDesc, lane: u32, slot: InboundSlot) -> IoResult<()> {
        stream.set_nodelay(true).ok();
        stream.set_read_timeout(Some(self.cfg.data_timeout)).ok();
        stream.set_write_timeout(Some(self.cfg.data_timeout)).ok();
        let (ctx, sd) = (self.ctx.clone(), self.shutdown.clone());
        std::thread::Builder::new()
            .name(format!("mori-tcp-serve{lane}"))
            .spawn(move || server::serve(stream, ctx, from.key, sd, slot))
            .map(|_| ())
            .map_err(|e| IoError::transport(format!("spawn tcp server thread: {e}")))
    }

    fn disconnect(&self, peer_key: &str) {
        self.peers.lock().remove(peer_key);
    }
}
