//! [`SocketBootstrapConfig`] and the timeout / interface environment variables.

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::BootstrapError;

/// Env var: rendezvous budget in seconds (decimal allowed, > 0). Default [`DEFAULT_TIMEOUT`].
pub const ENV_TIMEOUT: &str = "MORI_BOOTSTRAP_TIMEOUT";
/// Env var: per-collective deadline in seconds (decimal allowed, > 0). Default: the
/// rendezvous budget.
pub const ENV_OP_TIMEOUT: &str = "MORI_BOOTSTRAP_OP_TIMEOUT";
/// Env var: network interface whose IPv4 address the ring listener binds (exact name, e.g.
/// `ens14np0`). Default: loopback if the master is loopback, else the first non-loopback
/// IPv4 interface that is up.
pub const ENV_IFNAME: &str = "MORI_SOCKET_IFNAME";
/// Default rendezvous budget: 300 s (as MORI's `MORI_BOOTSTRAP_TIMEOUT`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default rendezvous port when a launcher provides no `MASTER_PORT`: 18515.
pub const DEFAULT_PORT: u16 = 18515;
/// Largest supported world size (ranks).
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// Configuration of a [`crate::SocketBootstrap`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketBootstrapConfig {
    /// This process's rank, `0..world_size`. Rank 0 is the rendezvous root.
    pub rank: usize,
    /// Number of ranks, `1..=MAX_WORLD_SIZE`.
    pub world_size: usize,
    /// Rank 0's rendezvous address (`ip:port`); rank 0 binds it, the others connect to it.
    /// Port 0 is allowed on rank 0 only (world size 1, or tests).
    pub master: SocketAddr,
    /// Rendezvous budget: how long connecting to the root (non-root) or waiting for every
    /// rank (root) may take. Default [`DEFAULT_TIMEOUT`], env [`ENV_TIMEOUT`].
    pub timeout: Duration,
    /// Deadline of each collective (and of ring setup). Default: `timeout`, env
    /// [`ENV_OP_TIMEOUT`].
    pub op_timeout: Duration,
    /// Interface for the ring listener; `None` consults [`ENV_IFNAME`] at bind time, then
    /// falls back to loopback / first non-loopback IPv4 interface that is up.
    pub ifname: Option<String>,
}

impl SocketBootstrapConfig {
    /// A config with fixed defaults (300 s budget, same per-op deadline, automatic
    /// interface); does not read the environment.
    pub fn new(rank: usize, world_size: usize, master: SocketAddr) -> Self {
        SocketBootstrapConfig { rank, world_size, master, timeout: DEFAULT_TIMEOUT, op_timeout: DEFAULT_TIMEOUT, ifname: None }
    }

    /// Like [`SocketBootstrapConfig::new`] but takes the timeouts and interface from
    /// [`ENV_TIMEOUT`], [`ENV_OP_TIMEOUT`] and [`ENV_IFNAME`].
    ///
    /// # Errors
    /// [`BootstrapError::InvalidConfig`] naming a garbled variable.
    pub fn with_env_defaults(rank: usize, world_size: usize, master: SocketAddr) -> Result<Self, BootstrapError> {
        let (timeout, op_timeout, ifname) = env_tuning(&|k: &str| std::env::var(k).ok())?;
        Ok(SocketBootstrapConfig { rank, world_size, master, timeout, op_timeout, ifname })
    }

    /// Sets both the rendezvous budget and the per-op deadline.
    pub fn with_timeouts(mut self, timeout: Duration, op_timeout: Duration) -> Self {
        self.timeout = timeout;
        self.op_timeout = op_timeout;
        self
    }

    /// Checks ranks, sizes and timeouts.
    ///
    /// # Errors
    /// [`BootstrapError::InvalidConfig`] naming the bad field and its value.
    pub fn validate(&self) -> Result<(), BootstrapError> {
        let bad = |m: String| Err(BootstrapError::InvalidConfig(m));
        if self.world_size == 0 || self.world_size > MAX_WORLD_SIZE {
            return bad(format!("world_size {} is not in 1..={MAX_WORLD_SIZE}", self.world_size));
        }
        if self.rank >= self.world_size {
            return bad(format!("rank {} is not below world_size {}", self.rank, self.world_size));
        }
        if self.timeout.is_zero() {
            return bad("timeout is zero".into());
        }
        if self.op_timeout.is_zero() {
            return bad("op_timeout is zero".into());
        }
        if self.rank != 0 && self.master.port() == 0 {
            return bad(format!("master {} has port 0; only rank 0 may bind an ephemeral port", self.master));
        }
        Ok(())
    }
}

/// Reads (timeout, op_timeout, ifname) from [`ENV_TIMEOUT`], [`ENV_OP_TIMEOUT`], [`ENV_IFNAME`].
pub(crate) fn env_tuning(
    vars: &(impl Fn(&str) -> Option<String> + ?Sized),
) -> Result<(Duration, Duration, Option<String>), BootstrapError> {
    let get = |k: &str| vars(k).filter(|v| !v.trim().is_empty());
    let timeout = match get(ENV_TIMEOUT) {
        Some(v) => parse_secs(ENV_TIMEOUT, &v)?,
        None => DEFAULT_TIMEOUT,
    };
    let op_timeout = match get(ENV_OP_TIMEOUT) {
        Some(v) => parse_secs(ENV_OP_TIMEOUT, &v)?,
        None => timeout,
    };
    Ok((timeout, op_timeout, get(ENV_IFNAME).map(|s| s.trim().to_string())))
}

/// Parses a positive number of seconds (`"300"`, `"2.5"`) as the bootstrap variables take it:
/// decimals allowed, at least 1 µs (a smaller value would round to a deadline that has already
/// passed) and at most 1e9. Errors: `InvalidConfig` naming `var`, `value` and the limits.
pub fn parse_secs(var: &str, value: &str) -> Result<Duration, BootstrapError> {
    let v = value.trim();
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && (1e-6..=1e9).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(BootstrapError::InvalidConfig(format!("{var}={value:?} is not a number of seconds from 0.000001 to 1e9"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_from_vars() {
        let none = |_: &str| None;
        assert_eq!(env_tuning(&none).unwrap(), (DEFAULT_TIMEOUT, DEFAULT_TIMEOUT, None));
        let some = |k: &str| match k {
            ENV_TIMEOUT => Some("2.5".to_string()),
            ENV_IFNAME => Some("eth0".to_string()),
            _ => None,
        };
        let t = Duration::from_millis(2500);
        assert_eq!(env_tuning(&some).unwrap(), (t, t, Some("eth0".into())));
        let bad = |k: &str| (k == ENV_OP_TIMEOUT).then(|| "soon".to_string());
        let e = env_tuning(&bad).unwrap_err().to_string();
        assert!(e.contains("MORI_BOOTSTRAP_OP_TIMEOUT=\"soon\""), "{e}");
        assert!(parse_secs("X", "0").is_err());
        assert!(parse_secs("X", "-1").is_err());
        assert!(parse_secs("X", "nan").is_err());
        assert!(parse_secs("X", "1e10").is_err());
        // Positive but far below a nanosecond: refused rather than becoming a zero deadline.
        let e = parse_secs("X", ".0000000000000000000001").unwrap_err().to_string();
        assert!(e.contains("0.000001 to 1e9"), "{e}");
        assert_eq!(parse_secs("X", "0.000001").unwrap(), Duration::from_micros(1));
    }

    #[test]
    fn validate_names_the_field() {
        let m: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(SocketBootstrapConfig::new(0, 1, m).validate().is_ok());
        let e = SocketBootstrapConfig::new(4, 4, m).validate().unwrap_err().to_string();
        assert!(e.contains("rank 4 is not below world_size 4"), "{e}");
        assert!(SocketBootstrapConfig::new(0, 0, m).validate().is_err());
        let m0: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(SocketBootstrapConfig::new(1, 2, m0).validate().is_err());
    }
}
