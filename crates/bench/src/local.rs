//! `bench_engine --local`: the parent (rank 0) starts every other process itself, so the
//! run must not collide with other runs on the same machine.
//!
//! - **Bootstrap port**: the parent binds and listens on it before any child starts
//!   (`SocketBootstrap::bind_root`; `--port`, or a port the kernel picks) and its bootstrap
//!   root serves on that very listener (`SocketBootstrap::with_root_listener`). No other
//!   process can take the port in between, and a second run given the same `--port` fails at
//!   once with "address in use" before it starts a child (so none of its children can dial
//!   this run's root). (Probing a port and closing it, as before, let a concurrent run take it
//!   in between; a reservation socket that never listened still let two runs share a `--port`.)
//! - **Engine ports**: 0 (the kernel picks; the descriptors exchanged at rendezvous carry the
//!   real port), so nothing is chosen in advance.
//! - **Run token**: a random [`RunToken`] the parent hands to its children ([`TOKEN_ENV`]);
//!   every rank sends its token at rendezvous and all stop unless they agree
//!   ([`check_run_tokens`]), so a process of another run can never be paired with this one.
//! - **Parent death**: a child asks to be killed when its parent dies
//!   ([`die_with_parent`]), so no stray child outlives its run and dials a port that another
//!   run reserves later.

/// Environment variable through which the parent tells a child the bootstrap port.
pub const PORT_ENV: &str = "MORI_BENCH_LOCAL_CHILD_PORT";
/// Environment variable through which the parent tells a child the run token.
pub const TOKEN_ENV: &str = "MORI_BENCH_LOCAL_TOKEN";
/// Environment variable through which the parent tells a child its own pid.
pub const PARENT_ENV: &str = "MORI_BENCH_LOCAL_PARENT";

/// The random token of one `--local` run, shared by its parent and children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunToken(pub u64);

impl RunToken {
    /// A fresh token ([`mori_bootstrap::random_u64`]).
    pub fn generate() -> RunToken {
        RunToken(mori_bootstrap::random_u64())
    }

    /// Reads the 16 hex digits [`RunToken`]'s `Display` writes. Errors name [`TOKEN_ENV`].
    pub fn parse(s: &str) -> Result<RunToken, String> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{TOKEN_ENV}={s:?}: expected 16 hex digits"));
        }
        u64::from_str_radix(s, 16).map(RunToken).map_err(|e| format!("{TOKEN_ENV}={s:?}: {e}"))
    }

    /// The bytes each rank sends at rendezvous.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0.to_le_bytes()
    }
}

impl std::fmt::Display for RunToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Checks the tokens every rank sent at rendezvous (`all[k]`: rank k's bytes; empty for a
/// process not started by `--local`) against this rank's `mine`: all must be equal. Errors
/// name the first rank that differs and both tokens.
pub fn check_run_tokens(all: &[Vec<u8>], me: usize, mine: Option<RunToken>) -> Result<(), String> {
    let show = |b: &[u8]| match <[u8; 8]>::try_from(b) {
        Ok(a) => format!("token {}", RunToken(u64::from_le_bytes(a))),
        Err(_) if b.is_empty() => "no token (not started by --local)".to_string(),
        Err(_) => format!("{} bytes that are no token", b.len()),
    };
    let want: Vec<u8> = mine.map(|t| t.to_bytes().to_vec()).unwrap_or_default();
    match all.iter().enumerate().find(|(_, b)| **b != want) {
        None => Ok(()),
        Some((k, b)) => Err(format!(
            "rank {k} belongs to another bench_engine run ({}; rank {me} has {}): processes of two runs met at one bootstrap port; all stop",
            show(b),
            show(&want)
        )),
    }
}

/// Makes this (child) process get SIGKILL when its parent dies, and checks that the parent is
/// still `parent` (it may have died before the request). Errors say which failed.
pub fn die_with_parent(parent: u32) -> Result<(), String> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and changes only this process.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(format!("prctl(PR_SET_PDEATHSIG): {}", std::io::Error::last_os_error()));
    }
    // SAFETY: getppid has no preconditions.
    check_parent(parent, unsafe { libc::getppid() } as u32)
}

/// `Ok` when this process's parent `now` is still the `--local` parent `want`.
pub fn check_parent(want: u32, now: u32) -> Result<(), String> {
    if now == want {
        Ok(())
    } else {
        Err(format!("the --local parent (pid {want}) is gone (the parent is now pid {now}): nothing to join"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mori_bootstrap::{Bootstrap, SocketBootstrap, SocketBootstrapConfig};
    use std::net::{SocketAddr, TcpListener};
    use std::time::Duration;

    #[test]
    fn a_root_listener_bound_first_serves_the_group_and_keeps_the_port() {
        let l = SocketBootstrap::bind_root(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let master = l.local_addr().unwrap();
        // While held, nobody else can bind the port, with SO_REUSEADDR or without.
        let e = SocketBootstrap::bind_root(master).unwrap_err();
        assert!(matches!(e, mori_bootstrap::BootstrapError::AddressInUse { .. }), "{e}");
        assert!(TcpListener::bind(master).is_err());
        let cfg = move |rank| SocketBootstrapConfig::new(rank, 2, master).with_timeouts(Duration::from_secs(20), Duration::from_secs(20));
        // The other rank may dial before the root runs: the listener queues it.
        let t = std::thread::spawn(move || SocketBootstrap::new(cfg(1)).map(|b| b.allgather(&[1]).unwrap()));
        std::thread::sleep(Duration::from_millis(100));
        let root = SocketBootstrap::with_root_listener(cfg(0), l).unwrap();
        assert_eq!(root.local_addr(), master);
        assert_eq!(root.allgather(&[0]).unwrap(), vec![vec![0], vec![1]]);
        assert_eq!(t.join().unwrap().unwrap(), vec![vec![0], vec![1]]);
        let e = SocketBootstrap::with_root_listener(cfg(1), TcpListener::bind("127.0.0.1:0").unwrap()).unwrap_err();
        assert!(e.to_string().contains("rank 1"), "{e}");
    }

    #[test]
    fn tokens_round_trip_and_must_agree() {
        let t = RunToken(0x0123_4567_89ab_cdef);
        assert_eq!(t.to_string(), "0123456789abcdef");
        assert_eq!(RunToken::parse("0123456789abcdef"), Ok(t));
        for bad in ["", "0123456789abcde", "0123456789abcdefa", "0123456789abcdeg", "+123456789abcdef"] {
            assert!(RunToken::parse(bad).unwrap_err().contains("expected 16 hex digits"), "{bad:?}");
        }
        assert_ne!(RunToken::generate(), RunToken::generate());
        let other = RunToken(7);
        let mine = t.to_bytes().to_vec();
        assert_eq!(check_run_tokens(&[mine.clone(), mine.clone()], 1, Some(t)), Ok(()));
        assert_eq!(check_run_tokens(&[vec![], vec![]], 0, None), Ok(()));
        assert_eq!(
            check_run_tokens(&[mine.clone(), other.to_bytes().to_vec()], 0, Some(t)).unwrap_err(),
            "rank 1 belongs to another bench_engine run (token 0000000000000007; rank 0 has token 0123456789abcdef): processes of two runs met at one bootstrap port; all stop"
        );
        let e = check_run_tokens(&[vec![], mine.clone()], 1, Some(t)).unwrap_err();
        assert!(e.starts_with("rank 0 belongs to another bench_engine run (no token (not started by --local);"), "{e}");
        let e = check_run_tokens(&[mine, vec![1, 2, 3]], 0, Some(t)).unwrap_err();
        assert!(e.contains("(3 bytes that are no token;"), "{e}");
    }

    #[test]
    fn parent_check() {
        assert_eq!(check_parent(41, 41), Ok(()));
        assert_eq!(check_parent(41, 1).unwrap_err(), "the --local parent (pid 41) is gone (the parent is now pid 1): nothing to join");
    }
}
