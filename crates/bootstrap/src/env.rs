//! Rank / world / master discovery from launcher environment variables.
//!
//! See [`BootstrapEnv`] for the variables and their precedence.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::{env_tuning, SocketBootstrapConfig, DEFAULT_PORT};
use crate::error::BootstrapError;

/// Which launcher's variables supplied rank and world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `MORI_RANK` / `MORI_WORLD_SIZE`.
    Mori,
    /// torchrun / torch elastic: `RANK` / `WORLD_SIZE`.
    Torchrun,
    /// Open MPI: `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE`.
    OpenMpi,
    /// Slurm: `SLURM_PROCID` / `SLURM_NTASKS`.
    Slurm,
}

/// Everything the socket bootstrap needs, as found in the environment. Host names are not
/// resolved yet (see [`BootstrapEnv::master_addr`]).
///
/// Sources, first match wins:
/// 1. **MORI**: `MORI_RANK`, `MORI_WORLD_SIZE` (both required when either is set); master
///    host `MORI_MASTER_ADDR` else `MASTER_ADDR`; port `MORI_MASTER_PORT` else `MASTER_PORT`
///    else [`DEFAULT_PORT`].
/// 2. **torchrun**: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`. When torchrun's agent
///    hosts its own store on `MASTER_PORT` (`TORCHELASTIC_USE_AGENT_STORE=True`) that port
///    is taken on rank 0's host, so the bootstrap uses `MASTER_PORT + 1`.
/// 3. **Open MPI**: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `MASTER_ADDR` (required),
///    `MASTER_PORT` (default [`DEFAULT_PORT`]). Checked before Slurm because `mpirun`
///    inside an allocation inherits misleading `SLURM_PROCID` values.
/// 4. **Slurm**: `SLURM_PROCID`, `SLURM_NTASKS` (else `SLURM_NPROCS`); master host
///    `MASTER_ADDR` if set, else the first host of `SLURM_JOB_NODELIST` (else
///    `SLURM_NODELIST`); port `MASTER_PORT` else [`DEFAULT_PORT`].
///
/// In every case `MORI_MASTER_ADDR` / `MORI_MASTER_PORT` override the launcher's master,
/// and the timeouts / interface come from `MORI_BOOTSTRAP_TIMEOUT`,
/// `MORI_BOOTSTRAP_OP_TIMEOUT`, `MORI_SOCKET_IFNAME`. Empty values count as unset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapEnv {
    /// The launcher that supplied rank and world size.
    pub launcher: Launcher,
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank 0's host name or IP literal (brackets of IPv6 literals removed).
    pub master_host: String,
    /// Rendezvous port.
    pub master_port: u16,
    /// The variable `master_host` came from (or `SLURM_JOB_NODELIST`), for error messages.
    pub master_var: &'static str,
    /// Rendezvous budget (`MORI_BOOTSTRAP_TIMEOUT`, default 300 s).
    pub timeout: Duration,
    /// Per-collective deadline (`MORI_BOOTSTRAP_OP_TIMEOUT`, default = `timeout`).
    pub op_timeout: Duration,
    /// `MORI_SOCKET_IFNAME`, if set.
    pub ifname: Option<String>,
}

type Vars<'a> = dyn Fn(&str) -> Option<String> + 'a;

fn get(vars: &Vars, k: &str) -> Option<String> {
    vars(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn need(vars: &Vars, k: &str, why: &str) -> Result<String, BootstrapError> {
    get(vars, k).ok_or_else(|| BootstrapError::InvalidConfig(format!("{k} is not set ({why})")))
}

fn num(vars: &Vars, k: &str, why: &str) -> Result<usize, BootstrapError> {
    let v = need(vars, k, why)?;
    v.parse::<usize>().map_err(|_| BootstrapError::InvalidConfig(format!("{k}={v:?} is not a non-negative integer")))
}

fn port(vars: &Vars, k: &str) -> Result<Option<u16>, BootstrapError> {
    let Some(v) = get(vars, k) else {
        return Ok(None);
    };
    match v.parse::<u16>() {
        Ok(p) if p != 0 => Ok(Some(p)),
        _ => Err(BootstrapError::InvalidConfig(format!("{k}={v:?} is not a TCP port (1-65535)"))),
    }
}

impl BootstrapEnv {
    /// Parses launcher variables through `vars` (a lookup such as
    /// `|k| std::env::var(k).ok()`); touches nothing else.
    ///
    /// # Errors
    /// [`BootstrapError::InvalidConfig`] naming the missing or garbled variable, or saying
    /// that no launcher was recognised.
    pub fn parse(vars: &impl Fn(&str) -> Option<String>) -> Result<BootstrapEnv, BootstrapError> {
        let vars: &Vars = vars;
        let has = |k: &str| get(vars, k).is_some();
        let (launcher, rank, world_size, mut host, mut port_v) = if has("MORI_RANK") || has("MORI_WORLD_SIZE") {
            let why = "MORI_RANK and MORI_WORLD_SIZE go together";
            let host = get(vars, "MASTER_ADDR").map(|h| (h, "MASTER_ADDR"));
            (Launcher::Mori, num(vars, "MORI_RANK", why)?, num(vars, "MORI_WORLD_SIZE", why)?, host, port(vars, "MASTER_PORT")?)
        } else if has("RANK") && has("WORLD_SIZE") {
            let why = "torchrun sets it";
            let host = need(vars, "MASTER_ADDR", why)?;
            let mut p =
                port(vars, "MASTER_PORT")?.ok_or_else(|| BootstrapError::InvalidConfig(format!("MASTER_PORT is not set ({why})")))?;
            let agent = get(vars, "TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
            if agent && get(vars, "MORI_MASTER_PORT").is_none() {
                p = p.checked_add(1).ok_or_else(|| {
                    BootstrapError::InvalidConfig(format!(
                        "MASTER_PORT={p} is held by torchrun's agent store and {p}+1 is not a port; set MORI_MASTER_PORT"
                    ))
                })?;
            }
            let ws = "RANK and WORLD_SIZE go together";
            (Launcher::Torchrun, num(vars, "RANK", ws)?, num(vars, "WORLD_SIZE", ws)?, Some((host, "MASTER_ADDR")), Some(p))
        } else if has("OMPI_COMM_WORLD_RANK") {
            let why = "Open MPI launch";
            let host = get(vars, "MASTER_ADDR").map(|h| (h, "MASTER_ADDR"));
            let rank = num(vars, "OMPI_COMM_WORLD_RANK", why)?;
            (Launcher::OpenMpi, rank, num(vars, "OMPI_COMM_WORLD_SIZE", why)?, host, port(vars, "MASTER_PORT")?)
        } else if has("SLURM_PROCID") {
            let why = "Slurm launch";
            let size_var = if has("SLURM_NTASKS") { "SLURM_NTASKS" } else { "SLURM_NPROCS" };
            let (rank, world) = (num(vars, "SLURM_PROCID", why)?, num(vars, size_var, "set by srun")?);
            let host = match get(vars, "MASTER_ADDR") {
                Some(h) => Some((h, "MASTER_ADDR")),
                None => {
                    let var = if has("SLURM_JOB_NODELIST") { "SLURM_JOB_NODELIST" } else { "SLURM_NODELIST" };
                    let list = need(vars, var, "needed to find the master host when MASTER_ADDR is unset")?;
                    let first =
                        crate::nodelist::first_host(&list).map_err(|e| BootstrapError::InvalidConfig(format!("{var}={list:?}: {e}")))?;
                    Some((first, var))
                }
            };
            (Launcher::Slurm, rank, world, host, port(vars, "MASTER_PORT")?)
        } else {
            return Err(BootstrapError::InvalidConfig(
                "no launcher found: set MORI_RANK/MORI_WORLD_SIZE/MORI_MASTER_ADDR, or run under torchrun \
                 (RANK/WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_RANK) or Slurm (SLURM_PROCID)"
                    .into(),
            ));
        };
        if let Some(h) = get(vars, "MORI_MASTER_ADDR") {
            host = Some((h, "MORI_MASTER_ADDR"));
        }
        if let Some(p) = port(vars, "MORI_MASTER_PORT")? {
            port_v = Some(p);
        }
        let (master_host, master_var) = host.ok_or_else(|| {
            BootstrapError::InvalidConfig("MORI_MASTER_ADDR (or MASTER_ADDR) is not set: rank 0's host is unknown".into())
        })?;
        let bare = master_host.trim_start_matches('[').trim_end_matches(']');
        if bare.trim().is_empty() {
            return Err(BootstrapError::InvalidConfig(format!("{master_var}={master_host:?} names no host")));
        }
        let master_host = bare.to_string();
        let (timeout, op_timeout, ifname) = env_tuning(vars)?;
        let env = BootstrapEnv {
            launcher,
            rank,
            world_size,
            master_host,
            master_port: port_v.unwrap_or(DEFAULT_PORT),
            master_var,
            timeout,
            op_timeout,
            ifname,
        };
        if env.rank >= env.world_size {
            return Err(BootstrapError::InvalidConfig(format!(
                "rank {} (from {launcher:?} variables) is not below world size {}",
                env.rank, env.world_size
            )));
        }
        Ok(env)
    }

    /// [`BootstrapEnv::parse`] over the process environment.
    pub fn from_process_env() -> Result<BootstrapEnv, BootstrapError> {
        BootstrapEnv::parse(&|k: &str| std::env::var(k).ok())
    }

    /// Resolves the master host ([`crate::addr::resolve`]: IPv6 literals bare or bracketed,
    /// IPv4 preferred).
    ///
    /// # Errors
    /// [`BootstrapError::InvalidConfig`] naming the variable when resolution fails.
    pub fn master_addr(&self) -> Result<SocketAddr, BootstrapError> {
        let fail =
            |why: String| BootstrapError::InvalidConfig(format!("{}={:?} cannot be resolved: {why}", self.master_var, self.master_host));
        let addrs = crate::addr::resolve(&self.master_host, self.master_port).map_err(|e| fail(e.to_string()))?;
        addrs.first().copied().ok_or_else(|| fail("no addresses".into()))
    }

    /// Resolves the master and builds the socket bootstrap config.
    pub fn into_config(self) -> Result<SocketBootstrapConfig, BootstrapError> {
        let master = self.master_addr()?;
        Ok(SocketBootstrapConfig {
            rank: self.rank,
            world_size: self.world_size,
            master,
            timeout: self.timeout,
            op_timeout: self.op_timeout,
            ifname: self.ifname,
        })
    }
}

#[cfg(test)]
#[path = "env_tests.rs"]
mod tests;
