//! The host executor: the inter-node protocol ([`crate::internode`]) run by host threads, with
//! every rank's window in host memory, no GPU.
//!
//! - **Ranks and processes**: a job is `W` ranks, `G` per node ([`EpConfig::gpus_per_node`]),
//!   spread over processes that each host a consecutive range of ranks (one per process when a
//!   launcher starts one process per rank; several for tests). The processes meet through a
//!   [`mori_bootstrap::Bootstrap`] with one member per process.
//! - **Intra-node leg**: each rank's window is a POSIX shared-memory file (`/dev/shm`), created
//!   by its process and mapped by every process of its node; a put to a rank of the same node is
//!   a copy into the peer's window, then the counter operation as an atomic with release
//!   ordering.
//! - **Inter-node leg**: each rank has its own MORI-IO engine (tcp lanes or rdma queue pairs,
//!   [`InterTransport`]) with its whole window registered, and a **proxy** thread. The rank
//!   stages outgoing bytes in its window's outbox area and hands the proxy fixed-size commands
//!   through a bounded ring; the proxy issues each as a signalled write
//!   ([`mori_io::IoEngine::post_signalled`]): the peer applies the counter operation only after
//!   the bytes are visible there.
//! - **Completion**: counter-based, as the protocol defines; every wait has the deadline
//!   [`HostOptions::deadline`], and a rank that never writes is named in the error
//!   ([`EpError::Timeout`]). Results equal the host reference bit for bit under
//!   [`crate::internode::Scheme::sum_order`].
//!
//! The path taken is printed by [`HostEp::describe`]: nothing falls back silently.

mod abort;
mod names;
mod phase;
mod setup;
mod shm;

use crate::config::EpConfig;
use crate::error::{EpError, EpResult};
use crate::internode::{CombineState, Proto, Scheme};
use mori_io::{IoEngine, MemoryDesc};
pub use names::process_names;
pub use shm::remove_job_windows;
use shm::ShmWindow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// How the inter-node leg moves bytes (printed by [`HostEp::describe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterTransport {
    /// MORI-IO's tcp backend with `lanes` connections per peer (1..=64).
    Tcp {
        /// Connections per peer.
        lanes: usize,
    },
    /// MORI-IO's rdma backend (RC queue pairs); NICs from `devices` (`MORI_RDMA_DEVICES`
    /// syntax: `a,b` or `^a,b`) or, when `None`, that variable / every active port. Needs the
    /// `rdma` cargo feature of mori-ep.
    Rdma {
        /// NIC selection.
        devices: Option<String>,
    },
}

/// Test injection: the proxy delays each command by a random time up to `max_delay` and, with
/// `reorder`, shuffles each burst of queued commands before posting them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyInjection {
    /// Seed of the delays and shuffles (mixed with the rank).
    pub seed: u64,
    /// Largest delay per command.
    pub max_delay: Duration,
    /// Shuffle each burst.
    pub reorder: bool,
}

/// Test injection: the process hosting these ranks ends itself (SIGKILL) or stops (SIGSTOP) at
/// a point of its run, as a crashed or hung process would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessInjection {
    /// SIGKILL during setup, after its windows exist and before they are unlinked.
    KillInSetup,
    /// SIGKILL in dispatch number `nth` (0-based), before its first local rank issues its puts
    /// (so that every other rank misses this process's writes of that dispatch, whatever the
    /// timing).
    KillInDispatch {
        /// Which dispatch.
        nth: u64,
    },
    /// SIGSTOP at the same point (the process hangs until continued).
    StopInDispatch {
        /// Which dispatch.
        nth: u64,
    },
}

impl ProcessInjection {
    fn raise(self) {
        let sig = if matches!(self, ProcessInjection::StopInDispatch { .. }) { libc::SIGSTOP } else { libc::SIGKILL };
        // SAFETY: signalling this process.
        unsafe { libc::kill(libc::getpid(), sig) };
    }
}

/// Settings of a [`HostEp`].
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// Inter-node transport (default tcp, 4 lanes).
    pub transport: InterTransport,
    /// Deadline of each phase and of setup's waits (default 30 s).
    pub deadline: Duration,
    /// Tokens per inter-node signalled write (default 32).
    pub chunk_tokens: usize,
    /// Proxy fault injection (tests; default none).
    pub inject: Option<ProxyInjection>,
    /// Address the MORI-IO engines listen on and advertise (default `127.0.0.1`; on several
    /// hosts, this host's address on the network between them).
    pub host: String,
    /// The job id naming the shared-memory windows, `/dev/shm/mori-ep-<job as 16 hex
    /// digits>-r<rank>` (process 0's is used by all). Default: from process 0's clock and pid.
    /// A launcher that picks it can remove what a process that died during setup left
    /// ([`remove_job_windows`]).
    pub job: Option<u64>,
    /// Process fault injection (tests; default none).
    pub inject_exit: Option<ProcessInjection>,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            transport: InterTransport::Tcp { lanes: 4 },
            deadline: Duration::from_secs(30),
            chunk_tokens: 32,
            inject: None,
            host: "127.0.0.1".into(),
            job: None,
            inject_exit: None,
        }
    }
}

/// One local rank's figures of the last dispatch and combine.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankStats {
    /// The rank.
    pub rank: usize,
    /// Tokens it received in dispatch.
    pub recv_tokens: u64,
    /// RDMA algo tokens of its dispatch: unique (token, node) pairs, local node included
    /// ([`crate::accounting::rdma_algo_token_count`]).
    pub rdma_algo_tokens: u64,
    /// The pairs whose node is another one ([`crate::accounting::rdma_cross_node_token_count`]).
    pub rdma_physical_tokens: u64,
    /// Bytes its proxy wrote to other nodes in dispatch (records, as staged).
    pub inter_bytes: u64,
    /// Dispatch time, µs: from the call until this rank's output was complete.
    pub dispatch_us: f64,
    /// Combine time, µs: from the call until this rank's output was complete.
    pub combine_us: f64,
    /// Time its proxy was busy in dispatch, µs: first post to last completion.
    pub inter_dispatch_us: f64,
}

/// The EP ranks this process hosts, set up and ready for rounds of [`HostEp::dispatch`] then
/// [`HostEp::combine`]. Every process of the job calls the same methods in the same order.
pub struct HostEp {
    proto: Proto,
    opts: HostOptions,
    local: Range<usize>,
    proxies: Vec<crate::proxy::Proxy>,
    mems: Vec<Option<MemoryDesc>>,
    engines: Vec<Arc<IoEngine>>,
    wins: BTreeMap<usize, ShmWindow>,
    states: Vec<Option<CombineState>>,
    /// Per local rank: bytes of its outbox area used in the current phase.
    staged: Vec<usize>,
    stats: Vec<RankStats>,
    describe: String,
    /// Per local rank with an engine: every other node's windows, by rank.
    peer_mems: Vec<Vec<Option<MemoryDesc>>>,
    /// Byte offset of the abort word in every window.
    abort_off: usize,
    /// Set by a failed phase: the HostEp is then unusable.
    poisoned: Option<String>,
    /// Dispatches begun (for [`HostOptions::inject_exit`]).
    dispatches: u64,
}

impl HostEp {
    /// Sets up ranks `local` of the job `cfg` (validated) under `scheme`: creates their windows
    /// and, with more than one node, their MORI-IO engines and proxies; exchanges descriptors
    /// with the other processes through `boot` (one member per process, each hosting a
    /// consecutive range of ranks, together `0..world_size`); checks that every process runs
    /// the same configuration.
    ///
    /// Errors: [`Proto::new`]'s; `InvalidConfig` for an empty or out-of-range `local`, ranges
    /// that do not tile the world, or a zero chunk; `PeerMismatch` naming the first field that
    /// differs between two processes (e.g. `max_tokens_per_rank`) and both values; `Host` for
    /// shared memory, bootstrap or engine failures.
    pub fn new(
        cfg: &EpConfig,
        scheme: Scheme,
        local: Range<usize>,
        boot: &dyn mori_bootstrap::Bootstrap,
        opts: HostOptions,
    ) -> EpResult<Self> {
        setup::build(cfg, scheme, local, boot, opts)
    }

    /// One line: scheme, nodes × ranks, the ranks here, the intra-node and inter-node paths.
    pub fn describe(&self) -> String {
        self.describe.clone()
    }

    /// The protocol constants (layout, topology, scheme).
    pub fn proto(&self) -> &Proto {
        &self.proto
    }

    /// The ranks this process hosts.
    pub fn local_ranks(&self) -> Range<usize> {
        self.local.clone()
    }

    /// Per local rank, the figures of the last dispatch and combine.
    pub fn last_stats(&self) -> Vec<RankStats> {
        self.stats.clone()
    }

    fn win(&self, r: usize) -> EpResult<&ShmWindow> {
        self.wins.get(&r).ok_or_else(|| EpError::Host { what: format!("window of rank {r}"), detail: "not mapped in this process".into() })
    }
}

impl Drop for HostEp {
    fn drop(&mut self) {
        self.proxies.clear();
        for (e, m) in self.engines.iter().zip(&self.mems) {
            if let Some(m) = m {
                let _ = e.deregister_memory(m);
            }
        }
        self.engines.clear();
        self.wins.clear();
    }
}
