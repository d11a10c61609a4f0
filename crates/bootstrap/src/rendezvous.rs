//! Rendezvous I/O: the root collects hellos, the others dial the root, then everyone
//! builds the ring. Every wait is bounded by a deadline.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::conn::{poll_until, Conn, Pumped};
use crate::error::BootstrapError;
use crate::mesh::{Mesh, Op};
use crate::report::Report;
use crate::roster::{Admit, Roster};
use crate::wire::{Dec, Enc, Hello, Table, Tag};

/// Binds the master address (SO_REUSEADDR) for rank 0.
pub(crate) fn bind_master(addr: SocketAddr) -> Result<TcpListener, BootstrapError> {
    use socket2::{Domain, Socket, Type};
    let what = |s: &str| format!("{s} master address {addr} (rank 0 binds it: is this host {}?)", addr.ip());
    let sock =
        Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(|e| BootstrapError::io(what("creating a socket for"), e))?;
    sock.set_reuse_address(true).map_err(|e| BootstrapError::io(what("setting SO_REUSEADDR on"), e))?;
    match sock.bind(&addr.into()) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => return Err(BootstrapError::AddressInUse { addr }),
        Err(e) => return Err(BootstrapError::io(what("binding"), e)),
        Ok(()) => {}
    }
    sock.listen(1024).map_err(|e| BootstrapError::io(what("listening on"), e))?;
    let l: TcpListener = sock.into();
    l.set_nonblocking(true).map_err(|e| BootstrapError::io(what("set_nonblocking on"), e))?;
    Ok(l)
}

/// Dials `addr` until it answers or `deadline` passes (backoff 50 ms doubling to 500 ms).
/// The error is the last connect failure.
pub(crate) fn connect_retry(addr: SocketAddr, deadline: Instant) -> Result<TcpStream, String> {
    let mut backoff = Duration::from_millis(50);
    let mut last = "deadline passed before the first attempt".to_string();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(last);
        }
        match TcpStream::connect_timeout(&addr, (deadline - now).min(Duration::from_secs(2))) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(last);
        }
        std::thread::sleep(backoff.min(deadline - now));
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// Random 64 bits (std's randomly seeded hasher over pid, time and a stack address; each call
/// builds a new `RandomState`, whose keys differ from the previous one's). Not for secrets.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.write_u128(t.as_nanos());
    let local = 0u8;
    h.write_usize(&local as *const u8 as usize);
    h.finish()
}

fn accept_all(l: &TcpListener, out: &mut Vec<Option<Conn>>) {
    loop {
        match l.accept() {
            Ok((s, from)) => match Conn::new(s, usize::MAX, from.to_string()) {
                Ok(c) => out.push(Some(c)),
                Err(e) => tracing::warn!("bootstrap: dropping connection from {from}: {e}"),
            },
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if e.kind() != io::ErrorKind::WouldBlock {
                    tracing::warn!("bootstrap: accept failed: {e}");
                }
                return;
            }
        }
    }
}

fn listener_fd(l: &TcpListener) -> libc::pollfd {
    libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 }
}

enum Step {
    Keep,
    Drop(String),
    Replaced(usize),
    Fail(BootstrapError),
}

fn serve(c: &mut Conn, id: usize, roster: &mut Roster, master: SocketAddr) -> Step {
    match c.pump() {
        Err(e) => return Step::Drop(e.to_string()),
        Ok(Pumped::WriteFailed(e)) => return Step::Drop(e),
        Ok(Pumped::Ok) => {}
    }
    let mut step = Step::Keep;
    while let Some(f) = c.inbox.pop_front() {
        if f.hdr.tag != Tag::Hello || c.peer != usize::MAX {
            return Step::Drop(format!("unexpected {:?} frame", f.hdr.tag));
        }
        let hello = match Hello::decode(&f.payload, &c.name) {
            Ok(h) => h,
            Err(e) => return Step::Drop(e.to_string()),
        };
        let from = c.peer_addr().unwrap_or(master);
        match roster.admit(id, from, &hello) {
            Admit::Accepted => {}
            Admit::Replaced { old_conn } => step = Step::Replaced(old_conn),
            Admit::Reject(e @ BootstrapError::Protocol { .. }) => return Step::Drop(e.to_string()),
            Admit::Reject(e) => return Step::Fail(e),
        }
        tracing::debug!("bootstrap: rank {} (pid {}) checked in from {from}", hello.rank, hello.pid);
        c.peer = hello.rank;
        c.name = format!("rank {} ({from})", hello.rank);
    }
    match &c.closed {
        Some(cause) => Step::Drop(cause.clone()),
        None => step,
    }
}

/// Sends `err` to every connection (best effort, at most 1 s) so that all fail promptly.
fn reject_all(conns: &mut [Option<Conn>], err: &BootstrapError) {
    let payload = Report::from_error(err, 0).encode();
    for c in conns.iter_mut().flatten() {
        c.queue(Tag::Reject, 0, 0, payload.clone());
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let mut fds = Vec::new();
        for c in conns.iter_mut().flatten() {
            if matches!(c.pump(), Ok(Pumped::Ok)) && c.has_output() {
                fds.extend(c.interest());
            }
        }
        if fds.is_empty() || !matches!(poll_until(&mut fds, deadline), Ok(true)) {
            return;
        }
    }
}

/// Root side: waits up to `timeout` for every rank's hello, then queues the address table
/// to each. Returns the star connections (index = rank - 1) and the table.
pub(crate) fn root_collect(
    l: &TcpListener,
    world: usize,
    master: SocketAddr,
    timeout: Duration,
) -> Result<(Vec<Conn>, Table), BootstrapError> {
    let deadline = Instant::now() + timeout;
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut roster = Roster::new(world, master);
    while !roster.is_complete() {
        accept_all(l, &mut conns);
        for id in 0..conns.len() {
            let Some(c) = conns[id].as_mut() else {
                continue;
            };
            match serve(c, id, &mut roster, master) {
                Step::Keep => {}
                Step::Replaced(old) => {
                    tracing::info!("bootstrap: {} reconnected; dropping its old connection", c.name);
                    if let Some(slot) = conns.get_mut(old) {
                        *slot = None;
                    }
                }
                Step::Drop(why) => {
                    if let Some(rank) = roster.forget(id) {
                        tracing::warn!("bootstrap: rank {rank} left before rendezvous completed: {why}");
                    } else {
                        tracing::warn!("bootstrap: dropping stray connection {}: {why}", c.name);
                    }
                    conns[id] = None;
                }
                Step::Fail(e) => {
                    reject_all(&mut conns, &e);
                    return Err(e);
                }
            }
        }
        if roster.is_complete() {
            break;
        }
        let mut fds = vec![listener_fd(l)];
        fds.extend(conns.iter().flatten().filter_map(Conn::interest));
        if !poll_until(&mut fds, deadline)? {
            let e = BootstrapError::RendezvousTimeout { missing: roster.missing(), waited: timeout, root: master };
            reject_all(&mut conns, &e);
            return Err(e);
        }
    }
    let table = roster.table(random_u64());
    let payload = table.encode();
    let mut star = Vec::with_capacity(world.saturating_sub(1));
    for id in roster.conns().into_iter().flatten() {
        if let Some(mut c) = conns.get_mut(id).and_then(Option::take) {
            c.queue(Tag::Table, 0, 0, payload.clone());
            star.push(c);
        }
    }
    if star.len() + 1 != world {
        return Err(BootstrapError::Protocol { from: "rendezvous".into(), detail: "roster lost a connection".into() });
    }
    Ok((star, table))
}

/// Non-root side: dials the root within `timeout`, says hello, waits for the table (the
/// root answers within its own budget, which started before it accepted us).
pub(crate) fn join_root(hello: &Hello, master: SocketAddr, timeout: Duration) -> Result<(Conn, Table), BootstrapError> {
    let stream = connect_retry(master, Instant::now() + timeout).map_err(|cause| {
        tracing::debug!("bootstrap: last connect error to {master}: {cause}");
        BootstrapError::RendezvousTimeout { missing: vec![0], waited: timeout, root: master }
    })?;
    let mut c = Conn::new(stream, 0, format!("rank 0 ({master})"))?;
    c.queue(Tag::Hello, 0, 0, hello.encode());
    let deadline = Instant::now() + timeout + Duration::from_secs(1);
    let lost = |cause: String| BootstrapError::PeerLost { rank: 0, during: "rendezvous", cause };
    loop {
        if let Pumped::WriteFailed(e) = c.pump()? {
            return Err(lost(e));
        }
        if let Some(f) = c.inbox.pop_front() {
            return match f.hdr.tag {
                Tag::Table => {
                    let table = Table::decode(&f.payload, &c.name, hello.world_size)?;
                    Ok((c, table))
                }
                Tag::Reject | Tag::Abort => Err(Report::decode(&f.payload, &c.name)?.to_error("rendezvous", master)),
                t => Err(crate::wire::proto(&c.name, format!("unexpected {t:?} frame during rendezvous"))),
            };
        }
        if let Some(cause) = &c.closed {
            return Err(lost(cause.clone()));
        }
        let mut fds: Vec<libc::pollfd> = c.interest().into_iter().collect();
        if !poll_until(&mut fds, deadline)? {
            return Err(BootstrapError::Timeout { op: "rendezvous", waiting_for: vec![0], after: timeout });
        }
    }
}

fn ring_hello(session: u64, rank: usize) -> Vec<u8> {
    let mut e = Enc::default();
    e.u64(session).uz(rank);
    e.0
}

/// Connects to the ring successor and accepts the predecessor; both are appended to
/// `mesh.conns`. Returns their connection ids `(next, prev)`.
pub(crate) fn build_ring(
    mesh: &mut Mesh,
    l: &TcpListener,
    me: usize,
    table: &Table,
    deadline: Instant,
    budget: Duration,
) -> Result<(usize, usize), BootstrapError> {
    let n = table.addrs.len();
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let to = table.addrs[next];
    let stream = connect_retry(to, deadline).map_err(|cause| BootstrapError::PeerLost {
        rank: next,
        during: "ring setup",
        cause: format!("cannot connect to its listener {to}: {cause}"),
    })?;
    let mut c = Conn::new(stream, next, format!("rank {next} ({to})"))?;
    c.queue(Tag::RingHello, Op::Setup as u8, 0, ring_hello(table.session, me));
    mesh.conns.push(c);
    let next_id = mesh.conns.len() - 1;
    let mut pending: Vec<Option<Conn>> = Vec::new();
    loop {
        mesh.pump_all(Op::Setup)?;
        accept_all(l, &mut pending);
        for slot in pending.iter_mut() {
            let Some(c) = slot.as_mut() else { continue };
            let ok = match (c.pump(), c.inbox.pop_front()) {
                (Ok(_), Some(f)) if f.hdr.tag == Tag::RingHello => {
                    let mut d = Dec::new(&f.payload, &c.name);
                    matches!((d.u64(), d.uz(), d.end()), (Ok(s), Ok(r), Ok(())) if s == table.session && r == prev)
                }
                (Ok(_), None) if c.closed.is_none() => continue,
                _ => false,
            };
            if let Some(mut c) = slot.take() {
                if ok {
                    c.peer = prev;
                    c.name = format!("rank {prev} ({})", c.name);
                    mesh.conns.push(c);
                    return Ok((next_id, mesh.conns.len() - 1));
                }
                tracing::warn!("bootstrap: dropping stray connection {} during ring setup", c.name);
            }
        }
        let mut fds = vec![listener_fd(l)];
        fds.extend(pending.iter().flatten().filter_map(Conn::interest));
        fds.extend(mesh.conns.iter().filter_map(Conn::interest));
        if !poll_until(&mut fds, deadline)? {
            return Err(BootstrapError::Timeout { op: "ring setup", waiting_for: vec![prev], after: budget });
        }
    }
}
