//! `bench_engine --local`: the parent (rank 0) starts every other process itself, so the
//! run must not collide with other runs on the same machine.
//!
//! - **Bootstrap port**: [`PortReservation`] holds a loopback port from before the children
//!   start until the bootstrap root listens on it. The reservation is a socket bound with
//!   `SO_REUSEADDR` to port 0 that never listens. The kernel gives it a port no other socket
//!   holds; while it is held, `bind` to port 0 and outgoing connections never pick that port
//!   and a socket without `SO_REUSEADDR` cannot bind it, but the bootstrap root, which binds
//!   the port by number with `SO_REUSEADDR`, can (Linux lets two such sockets share a port
//!   while neither listens). Another process that binds that very port by number with
//!   `SO_REUSEADDR` (std's `TcpListener` does) could still take it first: then the root's
//!   bind fails, loudly. `bench_engine --local` itself binds no port by number. (Probing a
//!   port and closing it, as before, let a concurrent run take it in between.)
//! - **Engine ports**: 0 (the kernel picks; the descriptors exchanged at rendezvous carry the
//!   real port), so nothing is chosen in advance.
//! - **Run token**: a random [`RunToken`] the parent hands to its children ([`TOKEN_ENV`]);
//!   every rank sends its token at rendezvous and all stop unless they agree
//!   ([`check_run_tokens`]), so a process of another run can never be paired with this one.
//! - **Parent death**: a child asks to be killed when its parent dies
//!   ([`die_with_parent`]), so no stray child outlives its run and dials a port that another
//!   run reserves later.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Environment variable through which the parent tells a child the bootstrap port.
pub const PORT_ENV: &str = "MORI_BENCH_LOCAL_CHILD_PORT";
/// Environment variable through which the parent tells a child the run token.
pub const TOKEN_ENV: &str = "MORI_BENCH_LOCAL_TOKEN";
/// Environment variable through which the parent tells a child its own pid.
pub const PARENT_ENV: &str = "MORI_BENCH_LOCAL_PARENT";

/// A loopback TCP port held for the bootstrap root (see the module documentation). Dropping
/// it releases the port.
#[derive(Debug)]
pub struct PortReservation {
    _fd: OwnedFd,
    port: u16,
}

impl PortReservation {
    /// Reserves a free port on 127.0.0.1. Errors: the socket calls' own, named.
    pub fn loopback() -> io::Result<PortReservation> {
        let named = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("reserving a loopback port: {what}: {e}"));
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(named("socket", io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a socket this function just created and owns alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        // SAFETY: `fd` is a live socket; the option value is a c_int of the given size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(named("SO_REUSEADDR", io::Error::last_os_error()));
        }
        let mut addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be() },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `addr` is a valid sockaddr_in of `len` bytes.
        if unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_in).cast(), len) } != 0 {
            return Err(named("bind 127.0.0.1:0", io::Error::last_os_error()));
        }
        let mut got = len;
        // SAFETY: `addr` has room for a sockaddr_in; `got` holds its size.
        if unsafe { libc::getsockname(fd.as_raw_fd(), (&mut addr as *mut libc::sockaddr_in).cast(), &mut got) } != 0 {
            return Err(named("getsockname", io::Error::last_os_error()));
        }
        let port = u16::from_be(addr.sin_port);
        if port == 0 {
            return Err(io::Error::other("reserving a loopback port: the kernel gave port 0"));
        }
        Ok(PortReservation { _fd: fd, port })
    }

    /// The port held.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// The random token of one `--local` run, shared by its parent and children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunToken(pub u64);

impl RunToken {
    /// A fresh token (std's randomly keyed hasher over the pid and the time).
    pub fn generate() -> RunToken {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
        RunToken(h.finish())
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
        return Err(format!("prctl(PR_SET_PDEATHSIG): {}", io::Error::last_os_error()));
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
    fn a_reserved_port_is_refused_to_others_and_distinct() {
        let held: Vec<PortReservation> = (0..64).map(|_| PortReservation::loopback().unwrap()).collect();
        let mut ports: Vec<u16> = held.iter().map(PortReservation::port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 64, "two reservations got one port");
        for r in &held {
            let e = bind_plain(r.port()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "port {}", r.port());
        }
        // Nobody binding port 0 gets a reserved one.
        let others: Vec<TcpListener> = (0..256).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        for o in &others {
            assert!(!ports.contains(&o.local_addr().unwrap().port()));
        }
        // Released on drop.
        let p = held[0].port();
        drop(held);
        assert!(bind_plain(p).is_ok());
    }

    /// bind(2) to 127.0.0.1:`port` without SO_REUSEADDR.
    fn bind_plain(port: u16) -> io::Result<OwnedFd> {
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(raw >= 0);
        // SAFETY: a socket just created, owned here alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be() },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `addr` is a valid sockaddr_in of `len` bytes.
        if unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_in).cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    #[test]
    fn the_bootstrap_root_listens_on_a_reserved_port() {
        let r = PortReservation::loopback().unwrap();
        let master = SocketAddr::from(([127, 0, 0, 1], r.port()));
        let cfg = move |rank| SocketBootstrapConfig::new(rank, 2, master).with_timeouts(Duration::from_secs(20), Duration::from_secs(20));
        let t = std::thread::spawn(move || SocketBootstrap::new(cfg(1)).map(|b| b.allgather(&[1]).unwrap()));
        let root = SocketBootstrap::new(cfg(0)).unwrap();
        assert_eq!(root.local_addr(), master);
        assert_eq!(root.allgather(&[0]).unwrap(), vec![vec![0], vec![1]]);
        assert_eq!(t.join().unwrap().unwrap(), vec![vec![0], vec![1]]);
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
