//! Out-of-band rendezvous for MORI ranks (see DESIGN.md, "foundations").
//!
//! * [`Bootstrap`]: the collectives contract (allgather, all_to_all, broadcast, barrier),
//!   every call bounded by [`Bootstrap::timeout`].
//! * [`SocketBootstrap`]: MORI's socket bootstrap. Rank 0 binds the master address and is
//!   the rendezvous root; the others dial it (retrying over `MORI_BOOTSTRAP_TIMEOUT`,
//!   default 300 s), then all ranks form a ring over ephemeral ports on the interface
//!   chosen by `MORI_SOCKET_IFNAME` (see [`choose_local_ip`]).
//! * [`SocketBootstrap::from_env`] / [`BootstrapEnv`]: rank, world size and master from
//!   MORI, torchrun, Open MPI or Slurm variables.
//! * [`LocalBootstrap`]: the same semantics for threads of one process (tests, single-node
//!   tools).
//!
//! Environment variables: `MORI_RANK`, `MORI_WORLD_SIZE`, `MORI_MASTER_ADDR`,
//! `MORI_MASTER_PORT` (default [`DEFAULT_PORT`] = 18515), `MORI_BOOTSTRAP_TIMEOUT`
//! (seconds, default 300), `MORI_BOOTSTRAP_OP_TIMEOUT` (seconds, default = the former),
//! `MORI_SOCKET_IFNAME`; launcher variables as listed on [`BootstrapEnv`].

#![warn(missing_docs)]

use std::time::Duration;

pub mod addr;
mod collectives;
mod config;
mod conn;
mod env;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod iface;
mod local;
mod mesh;
mod nodelist;
mod rendezvous;
mod report;
mod roster;
mod socket;
mod wire;

pub use config::{
    parse_secs, SocketBootstrapConfig, DEFAULT_PORT, DEFAULT_TIMEOUT, ENV_IFNAME, ENV_OP_TIMEOUT, ENV_TIMEOUT, MAX_WORLD_SIZE,
};
pub use env::{BootstrapEnv, Launcher};
pub use error::BootstrapError;
pub use iface::{choose_local_ip, ipv4_interfaces, InterfaceAddr};
pub use local::LocalBootstrap;
pub use nodelist::first_host as slurm_first_host;
pub use rendezvous::random_u64;
pub use socket::SocketBootstrap;

/// Largest frame (one contribution, or one all_to_all bundle) in bytes: 1 GiB. A peer
/// announcing more is a [`BootstrapError::FrameTooLarge`]; a caller passing more gets
/// [`BootstrapError::InvalidArgument`].
pub const MAX_FRAME_LEN: u64 = 1 << 30;

/// Out-of-band collectives among `world_size` ranks. Every call has a deadline.
///
/// All ranks must call the same collectives in the same order. A failed collective leaves
/// the implementation unusable ([`BootstrapError::Poisoned`]), except for
/// [`BootstrapError::InvalidArgument`], which is detected before anything is sent.
pub trait Bootstrap: Send + Sync {
    /// This process's rank, `0..world_size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Every rank contributes `data`; returns all contributions indexed by rank.
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError>;
    /// `data[j]` goes to rank `j`; returns what every rank sent to this one, indexed by source.
    fn all_to_all(&self, data: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, BootstrapError>;
    /// `root` passes `Some(bytes)`, the others `None`; every rank returns the root's bytes.
    fn broadcast(&self, root: usize, data: Option<&[u8]>) -> Result<Vec<u8>, BootstrapError>;
    /// Returns once every rank entered the barrier.
    fn barrier(&self) -> Result<(), BootstrapError>;
    /// The deadline applied to each collective.
    fn timeout(&self) -> Duration;
}

fn invalid(op: &'static str, detail: String) -> BootstrapError {
    BootstrapError::InvalidArgument { op, detail }
}

pub(crate) fn check_len(op: &'static str, len: u64) -> Result<(), BootstrapError> {
    if len > MAX_FRAME_LEN {
        return Err(invalid(op, format!("{len} bytes exceed MAX_FRAME_LEN ({MAX_FRAME_LEN})")));
    }
    Ok(())
}

pub(crate) fn check_all_to_all(data: &[Vec<u8>], me: usize, n: usize) -> Result<(), BootstrapError> {
    if data.len() != n {
        return Err(invalid("all_to_all", format!("{} blocks given, world size is {n}", data.len())));
    }
    let others = data.iter().enumerate().filter(|(j, _)| *j != me).map(|(_, b)| b.len());
    check_len("all_to_all", wire::blocks_len(others))
}

pub(crate) fn check_broadcast(root: usize, data: Option<&[u8]>, me: usize, n: usize) -> Result<(), BootstrapError> {
    if root >= n {
        return Err(invalid("broadcast", format!("root {root} is not below world size {n}")));
    }
    match data {
        None if me == root => Err(invalid("broadcast", format!("rank {me} is the root but passed no data"))),
        Some(d) => check_len("broadcast", d.len() as u64),
        None => Ok(()),
    }
}
