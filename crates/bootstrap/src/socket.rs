//! [`SocketBootstrap`]: TCP rendezvous at rank 0, then a ring plus a star through rank 0.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::collectives::Links;
use crate::config::SocketBootstrapConfig;
use crate::error::BootstrapError;
use crate::mesh::{Ctx, Mesh, Op};
use crate::rendezvous::{bind_master, build_ring, join_root, random_u64, root_collect};
use crate::wire::Hello;
use crate::{check_all_to_all, check_broadcast, check_len, Bootstrap};

struct State {
    links: Links,
    seq: u64,
    poisoned: Option<String>,
}

/// Socket bootstrap with MORI semantics.
///
/// Rank 0 binds `master` and is the root: every other rank binds a listener on its chosen
/// interface (see [`crate::choose_local_ip`]) with an ephemeral port, dials the root
/// (retrying for `timeout`) and says hello; the root answers with the address table. The
/// ranks then connect a ring (`rank -> rank + 1`) used by allgather and all_to_all, while
/// broadcast and barrier go through rank 0's star connections. `new` returns on every rank
/// only once the whole group is connected (a final barrier).
///
/// Any failure inside a collective aborts the group: this rank tells its peers (so that they
/// fail promptly with the same culprit) and further calls return
/// [`BootstrapError::Poisoned`]. Bad arguments do not poison.
pub struct SocketBootstrap {
    rank: usize,
    world_size: usize,
    op_timeout: Duration,
    local_addr: SocketAddr,
    master: SocketAddr,
    state: Mutex<State>,
}

impl std::fmt::Debug for SocketBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketBootstrap")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_addr", &self.local_addr)
            .field("master", &self.master)
            .finish()
    }
}

impl SocketBootstrap {
    /// Runs the rendezvous and connects the group. Blocks up to `cfg.timeout` for the
    /// rendezvous (a non-root may wait up to one more budget for the root's verdict once
    /// connected) plus up to `cfg.op_timeout` each for ring setup and the final barrier.
    ///
    /// # Errors
    /// [`BootstrapError::InvalidConfig`] (bad config or interface),
    /// [`BootstrapError::AddressInUse`] (rank 0's port taken),
    /// [`BootstrapError::RendezvousTimeout`] (ranks missing, or root unreachable),
    /// [`BootstrapError::DuplicateRank`], [`BootstrapError::WorldSizeMismatch`],
    /// [`BootstrapError::PeerLost`] / [`BootstrapError::Timeout`] (during ring setup),
    /// [`BootstrapError::Io`].
    pub fn new(cfg: SocketBootstrapConfig) -> Result<SocketBootstrap, BootstrapError> {
        Self::connect(cfg, None)
    }

    /// Binds and listens on `addr` as rank 0's root listener, for
    /// [`SocketBootstrap::with_root_listener`]: a process that must hold the root port before
    /// it starts the other ranks (a launcher of its own children) binds it first, so no other
    /// process can take it in between. Port 0 lets the kernel pick one (read it from
    /// `local_addr`). Errors: [`BootstrapError::AddressInUse`], [`BootstrapError::Io`].
    pub fn bind_root(addr: SocketAddr) -> Result<TcpListener, BootstrapError> {
        bind_master(addr)
    }

    /// As [`SocketBootstrap::new`] for rank 0, on a listener from
    /// [`SocketBootstrap::bind_root`] (the config's `master` port is then ignored in favour of
    /// the listener's). Errors as `new`; [`BootstrapError::InvalidConfig`] when `cfg.rank` is
    /// not 0.
    pub fn with_root_listener(cfg: SocketBootstrapConfig, root: TcpListener) -> Result<SocketBootstrap, BootstrapError> {
        if cfg.rank != 0 {
            return Err(BootstrapError::InvalidConfig(format!("a root listener is for rank 0; this is rank {}", cfg.rank)));
        }
        Self::connect(cfg, Some(root))
    }

    fn connect(cfg: SocketBootstrapConfig, root: Option<TcpListener>) -> Result<SocketBootstrap, BootstrapError> {
        cfg.validate()?;
        let (rank, n, master) = (cfg.rank, cfg.world_size, cfg.master);
        let mesh = |conns| Mesh { conns, root: master, received: None };
        let empty = Links { mesh: mesh(Vec::new()), star: Vec::new(), next: 0, prev: 0, me: rank, n };
        if n == 1 {
            return Ok(Self::assemble(&cfg, master, empty));
        }
        let (listener, local_addr, star_conns, table) = if rank == 0 {
            let l = match root {
                Some(l) => l,
                None => bind_master(master)?,
            };
            let local = l.local_addr().unwrap_or(master);
            tracing::debug!("bootstrap: rank 0 waiting for {} ranks on {local}", n - 1);
            let (star, table) = root_collect(&l, n, master, cfg.timeout)?;
            (l, local, star, table)
        } else {
            let ip = crate::iface::choose_local_ip(cfg.ifname.as_deref(), &master)?;
            let what = |s: &str| format!("{s} ring listener on {ip}");
            let l = TcpListener::bind((ip, 0)).map_err(|e| BootstrapError::io(what("binding"), e))?;
            l.set_nonblocking(true).map_err(|e| BootstrapError::io(what("set_nonblocking on"), e))?;
            let local = l.local_addr().map_err(|e| BootstrapError::io(what("reading the address of"), e))?;
            let hello = Hello { rank, world_size: n, listen: local, nonce: random_u64(), pid: std::process::id() };
            tracing::debug!("bootstrap: rank {rank} listening on {local}, dialing root {master}");
            let (conn, table) = join_root(&hello, master, cfg.timeout)?;
            (l, local, vec![conn], table)
        };
        let star = (0..star_conns.len()).collect();
        let mut links = Links { mesh: mesh(star_conns), star, next: 0, prev: 0, me: rank, n };
        let deadline = Instant::now() + cfg.op_timeout;
        match build_ring(&mut links.mesh, &listener, rank, &table, deadline, cfg.op_timeout) {
            Ok((next, prev)) => (links.next, links.prev) = (next, prev),
            Err(e) => {
                links.mesh.abort(&e, rank);
                return Err(e);
            }
        }
        drop(listener);
        let bs = Self::assemble(&cfg, local_addr, links);
        bs.run(Op::Setup, |l, ctx| l.barrier(ctx))?;
        tracing::debug!("bootstrap: rank {rank} of {n} connected");
        Ok(bs)
    }

    fn assemble(cfg: &SocketBootstrapConfig, local_addr: SocketAddr, links: Links) -> SocketBootstrap {
        SocketBootstrap {
            rank: cfg.rank,
            world_size: cfg.world_size,
            op_timeout: cfg.op_timeout,
            local_addr,
            master: cfg.master,
            state: Mutex::new(State { links, seq: 0, poisoned: None }),
        }
    }

    /// Reads the launcher environment (see [`crate::BootstrapEnv`]) and connects.
    ///
    /// # Errors
    /// As [`crate::BootstrapEnv::parse`], [`crate::BootstrapEnv::master_addr`] and
    /// [`SocketBootstrap::new`].
    pub fn from_env() -> Result<SocketBootstrap, BootstrapError> {
        SocketBootstrap::new(crate::BootstrapEnv::from_process_env()?.into_config()?)
    }

    /// The address of this rank's listener during rendezvous (rank 0: the master address
    /// as bound; world size 1: the configured master).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Rank 0's rendezvous address.
    pub fn master(&self) -> SocketAddr {
        self.master
    }

    fn run<T>(&self, op: Op, f: impl FnOnce(&mut Links, &Ctx) -> Result<T, BootstrapError>) -> Result<T, BootstrapError> {
        let mut st = self.state.lock();
        if let Some(first) = &st.poisoned {
            return Err(BootstrapError::Poisoned { first: first.clone() });
        }
        st.seq += 1;
        let ctx = Ctx { op, seq: st.seq, deadline: Instant::now() + self.op_timeout, budget: self.op_timeout };
        let res = f(&mut st.links, &ctx);
        if let Err(e) = &res {
            tracing::warn!("bootstrap: rank {} failed in {}: {e}", self.rank, op.name());
            st.poisoned = Some(e.to_string());
            st.links.mesh.abort(e, self.rank);
        }
        res
    }
}

impl Bootstrap for SocketBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        check_len("allgather", data.len() as u64)?;
        self.run(Op::Allgather, |l, ctx| l.allgather(ctx, data))
    }
    fn all_to_all(&self, data: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, BootstrapError> {
        check_all_to_all(&data, self.rank, self.world_size)?;
        self.run(Op::AllToAll, |l, ctx| l.all_to_all(ctx, data))
    }
    fn broadcast(&self, root: usize, data: Option<&[u8]>) -> Result<Vec<u8>, BootstrapError> {
        check_broadcast(root, data, self.rank, self.world_size)?;
        self.run(Op::Broadcast, |l, ctx| l.broadcast(ctx, root, data))
    }
    fn barrier(&self) -> Result<(), BootstrapError> {
        self.run(Op::Barrier, |l, ctx| l.barrier(ctx))
    }
    fn timeout(&self) -> Duration {
        self.op_timeout
    }
}
