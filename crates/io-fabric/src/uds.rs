//! POSIX-FD handles between processes of one node: the owner serves [`Grant`]s with the
//! allocation's file descriptor attached (`SCM_RIGHTS`, through `mori_gpu::fdpass`) on an
//! abstract Unix socket; importers fetch them. Only processes of the owner's user are served
//! (`SO_PEERCRED`). Every read and write has a deadline.
//!
//! Request: `"MFR2"`, region id (u64 LE), the owner engine's secret as the requester's
//! descriptor of it says (16 bytes LE: only holders of the owner's `EngineDesc` are served,
//! unless the owner checks none), requester key length (u16 LE, at most [`MAX_KEY`]), key
//! bytes. Reply: status (u32 LE, an `ErrorCode` value, 0 = success) and body
//! length (u32 LE, at most [`MAX_BODY`]) with the descriptor attached, then the body: the
//! encoded [`Grant`], or the error message.

use crate::handle::Grant;
use mori_gpu::fdpass;
use mori_io_core::{ErrorCode, IoError, IoResult, MemId, Secret};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MAGIC: [u8; 4] = *b"MFR2";

/// Bytes before the requester key.
const HEAD: usize = 4 + 8 + 16 + 2;
/// Longest requester key accepted, bytes.
pub const MAX_KEY: usize = 1024;
/// Longest reply body accepted, bytes.
pub const MAX_BODY: usize = 64 * 1024;

/// What the server asks its owner for: the grant and descriptor of region `id` for engine `from`.
pub type GrantFn = dyn Fn(&str, MemId) -> IoResult<(Grant, OwnedFd)> + Send + Sync;

fn abstract_addr(name: &str) -> IoResult<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| IoError::invalid(format!("abstract socket name {name:?}: {e}")))
}

/// The owner's side: an accept thread on an abstract socket, one short-lived thread per request.
pub struct FdServer {
    name: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdServer {
    /// Listens on a fresh abstract name (`mori-fabric.<pid>.<n>.<tag>`, `tag` cut to fit) and
    /// answers each request with `grant` (which runs on a server thread), within `timeout`
    /// per connection, to requesters presenting `secret` (any, when it is [`Secret::NONE`]).
    /// Errors: `Transport` if the socket cannot be bound or the thread spawned.
    pub fn start(tag: &str, timeout: Duration, secret: Secret, grant: Arc<GrantFn>) -> IoResult<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tag: String = tag.chars().filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c)).take(48).collect();
        let name = format!("mori-fabric.{}.{}.{tag}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let listener =
            UnixListener::bind_addr(&abstract_addr(&name)?).map_err(|e| IoError::transport(format!("bind fabric socket @{name}: {e}")))?;
        listener.set_nonblocking(true).map_err(|e| IoError::from_io("fabric socket non-blocking", &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let n2 = name.clone();
        let thread = std::thread::Builder::new()
            .name("mori-fabric-fds".into())
            .spawn(move || accept_loop(listener, &n2, &s2, timeout, secret, grant))
            .map_err(|e| IoError::transport(format!("spawn fabric socket thread: {e}")))?;
        Ok(FdServer { name, stop, thread: Some(thread) })
    }

    /// The abstract socket name (what goes into the memory descriptor).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Most handle requests served at once; connections beyond it are closed unanswered (the
/// requester sees its read fail at once), so a flood of local connections cannot pile up
/// threads.
pub const MAX_CONCURRENT_REQUESTS: usize = 64;

fn accept_loop(listener: UnixListener, name: &str, stop: &AtomicBool, timeout: Duration, secret: Secret, grant: Arc<GrantFn>) {
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, _)) => {
                if in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_CONCURRENT_REQUESTS {
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(socket = name, limit = MAX_CONCURRENT_REQUESTS, "fabric socket: too many requests at once; one refused");
                    drop(s);
                    continue;
                }
                let g = grant.clone();
                let count = in_flight.clone();
                let spawned = std::thread::Builder::new().name("mori-fabric-fd".into()).spawn(move || {
                    if let Err(e) = serve(s, timeout, &secret, &*g) {
                        tracing::warn!(error = %e, "fabric handle request failed");
                    }
                    count.fetch_sub(1, Ordering::AcqRel);
                });
                if let Err(e) = spawned {
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(error = %e, "fabric socket: cannot spawn a request thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => {
                tracing::warn!(socket = name, error = %e, "fabric socket accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> IoError + '_ {
    move |e| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            IoError::timeout(format!("{what}: no answer within the deadline"))
        } else {
            IoError::from_io(what, &e)
        }
    }
}

fn set_deadline(s: &UnixStream, timeout: Duration) -> IoResult<()> {
    s.set_nonblocking(false).map_err(io_err("fabric socket blocking mode"))?;
    s.set_read_timeout(Some(timeout)).map_err(io_err("fabric socket read timeout"))?;
    s.set_write_timeout(Some(timeout)).map_err(io_err("fabric socket write timeout"))
}

fn serve(s: UnixStream, timeout: Duration, secret: &Secret, grant: &GrantFn) -> IoResult<()> {
    set_deadline(&s, timeout)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let cred = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| IoError::transport(format!("fabric socket SO_PEERCRED: {e}")))?;
    let mut head = [0u8; HEAD];
    (&s).read_exact(&mut head).map_err(io_err("read fabric handle request"))?;
    let reply = |code: ErrorCode, body: &[u8], fd: Option<&OwnedFd>| -> IoResult<()> {
        let mut h = [0u8; 8];
        h[..4].copy_from_slice(&code.as_u32().to_le_bytes());
        h[4..].copy_from_slice(&(body.len() as u32).to_le_bytes());
        fdpass::send_with_fd(&s, &h, fd.map(|f| f.as_fd())).map_err(|e| IoError::transport(format!("send fabric handle: {e}")))?;
        (&s).write_all(body).map_err(io_err("send fabric handle body"))
    };
    let refuse = |e: IoError| -> IoResult<()> {
        let msg: Vec<u8> = e.msg.bytes().take(MAX_BODY).collect();
        reply(e.code, &msg, None)?;
        Err(e)
    };
    if head[..4] != MAGIC {
        return refuse(IoError::invalid("fabric handle request: bad magic"));
    }
    if cred.uid() != me {
        return refuse(IoError::invalid(format!(
            "fabric handle request from pid {} of uid {}: only processes of uid {me} are served",
            cred.pid(),
            cred.uid()
        )));
    }
    let id = u64::from_le_bytes(head[4..12].try_into().unwrap_or_default());
    let given = Secret(u128::from_le_bytes(head[12..28].try_into().unwrap_or_default()));
    if *secret != Secret::NONE && !secret.matches(&given) {
        return refuse(IoError::refused(format!(
            "fabric handle request for memory {id} from pid {} does not carry the owner engine's secret (the requester must hold its EngineDesc)",
            cred.pid()
        )));
    }
    let klen = u16::from_le_bytes([head[28], head[29]]) as usize;
    if klen > MAX_KEY {
        return refuse(IoError::invalid(format!("fabric handle request: key of {klen} bytes (at most {MAX_KEY})")));
    }
    let mut key = vec![0u8; klen];
    (&s).read_exact(&mut key).map_err(io_err("read fabric handle request key"))?;
    let key = String::from_utf8_lossy(&key).into_owned();
    match grant(&key, id) {
        Ok((g, fd)) => reply(ErrorCode::Success, &g.to_bytes(), Some(&fd)),
        Err(e) => refuse(e),
    }
}

/// The importer's side: asks the owner listening at `name` for region `id` on behalf of engine
/// `me`, presenting the owner's `secret`, within `timeout`. Errors: `Transport` when the socket
/// cannot be reached (naming it), `Timeout`, the owner's own error (its code and message:
/// `Refused` for a wrong secret), `InvalidArgs` for a malformed reply.
pub fn fetch(name: &str, me: &str, id: MemId, secret: &Secret, timeout: Duration) -> IoResult<(Grant, OwnedFd)> {
    let s = UnixStream::connect_addr(&abstract_addr(name)?).map_err(|e| {
        IoError::transport(format!(
            "connect to the fabric handle socket @{name}: {e} (is the owner alive, on this node, in this network namespace?)"
        ))
    })?;
    set_deadline(&s, timeout)?;
    let key = me.as_bytes();
    if key.len() > MAX_KEY {
        return Err(IoError::invalid(format!("engine key of {} bytes (fabric requests allow {MAX_KEY})", key.len())));
    }
    let mut req = Vec::with_capacity(HEAD + key.len());
    req.extend_from_slice(&MAGIC);
    req.extend_from_slice(&id.to_le_bytes());
    req.extend_from_slice(&secret.0.to_le_bytes());
    req.extend_from_slice(&(key.len() as u16).to_le_bytes());
    req.extend_from_slice(key);
    (&s).write_all(&req).map_err(io_err("send fabric handle request"))?;
    let mut h = [0u8; 8];
    let fd = fdpass::recv_with_fd(&s, &mut h).map_err(|e| match &e {
        mori_gpu::GpuError::Io { source, .. } if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            IoError::timeout(format!("fabric handle from @{name}: no answer within {timeout:?}"))
        }
        _ => IoError::transport(format!("receive fabric handle from @{name}: {e}")),
    })?;
    let code = u32::from_le_bytes(h[..4].try_into().unwrap_or_default());
    let blen = u32::from_le_bytes(h[4..].try_into().unwrap_or_default()) as usize;
    if blen > MAX_BODY {
        return Err(IoError::invalid(format!("fabric handle reply of {blen} bytes (at most {MAX_BODY})")));
    }
    let mut body = vec![0u8; blen];
    (&s).read_exact(&mut body).map_err(io_err("receive fabric handle reply"))?;
    if code != ErrorCode::Success.as_u32() {
        return Err(IoError::new(ErrorCode::from_u32(code), format!("owner of memory {id}: {}", String::from_utf8_lossy(&body))));
    }
    let g = Grant::from_bytes(&body)?;
    let fd = fd.ok_or_else(|| IoError::invalid(format!("fabric handle reply for memory {id} arrived without a file descriptor")))?;
    Ok((g, fd))
}
