//! The engine's one listener: control requests and backends' data connections.

use crate::engine::EngineInner;
use mori_io_core::handshake;
use mori_io_core::wire::{
    read_frame, read_frame_within, write_frame, CtrlReply, CtrlRequest, Hello, HelloAuth, HelloReply, Role, MAX_HELLO, PROTOCOL_VERSION,
};
use mori_io_core::{ErrorCode, InboundSlot, IoError};
use mori_io_tcp::vio::wait_readable;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(100);

/// Accept loop; returns when the engine shuts down.
pub(crate) fn accept_loop(listener: TcpListener, eng: Arc<EngineInner>) {
    let mut refused = 0u64;
    while !eng.shutdown.load(Ordering::Acquire) {
        match wait_readable(listener.as_raw_fd(), POLL) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::error!(error = %e, "engine listener poll failed; listener stops");
                return;
            }
        }
        match listener.accept() {
            Ok((s, addr)) => {
                let Some(slot) = InboundSlot::take(&eng.inbound_conns, eng.cfg.max_inbound, eng.cfg.idle_timeout) else {
                    refuse_over_cap(s, addr, &eng, &mut refused);
                    continue;
                };
                let e = eng.clone();
                let spawned = std::thread::Builder::new().name("mori-io-conn".into()).spawn(move || {
                    if let Err(err) = handle(s, addr, &e, slot) {
                        if err.code != ErrorCode::RemoteDisconnect {
                            tracing::warn!(%addr, error = %err, "inbound connection ended");
                        }
                    }
                });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot spawn connection thread");
                }
            }
            Err(e) => tracing::warn!(error = %e, "accept failed"),
        }
    }
}

/// A connection past `max_inbound`: told why (best effort, never blocking the accept loop),
/// then closed; logged once and then every 1000th time.
fn refuse_over_cap(s: TcpStream, addr: std::net::SocketAddr, eng: &EngineInner, refused: &mut u64) {
    let e = IoError::refused(format!(
        "engine {:?} serves at most {} inbound connections at once (EngineConfig::max_inbound, env MORI_IO_MAX_INBOUND) and all are in use; connection from {addr} closed",
        eng.desc.key, eng.cfg.max_inbound
    ));
    if refused.is_multiple_of(1000) {
        tracing::warn!(%addr, limit = eng.cfg.max_inbound, refused_so_far = *refused, "inbound connection refused: the cap is reached");
    }
    *refused += 1;
    if s.set_nonblocking(true).is_ok() {
        if let Ok(f) = mori_io_core::wire::encode_frame(&HelloReply::Refused(e)) {
            let _ = (&s).write(&f);
        }
    }
}

fn handle(mut s: TcpStream, addr: std::net::SocketAddr, eng: &EngineInner, slot: InboundSlot) -> Result<(), IoError> {
    s.set_nodelay(true).ok();
    s.set_read_timeout(Some(eng.cfg.control_timeout)).ok();
    s.set_write_timeout(Some(eng.cfg.control_timeout)).ok();
    // The whole hello within the control deadline, and small: the peer is not known yet.
    let until = std::time::Instant::now() + eng.cfg.control_timeout;
    let left = || until.saturating_duration_since(std::time::Instant::now());
    let max = MAX_HELLO.min(eng.cfg.max_frame);
    let mut hello: Hello = read_frame_within(&s, max, left())?;
    if hello.version != PROTOCOL_VERSION {
        let e =
            IoError::invalid(format!("engine {:?} speaks protocol {}, this engine {}", hello.from.key, hello.version, PROTOCOL_VERSION));
        write_frame(&mut s, &HelloReply::Refused(e.clone()))?;
        return Err(e);
    }
    // Prove who this engine is, then require the dialer's proof before anything is served.
    let (dn, ln, own) = (hello.nonce, handshake::nonce()?, &eng.desc.secret);
    write_frame(&mut s, &HelloReply::Challenge { nonce: ln, proof: handshake::listener_proof(own, dn, ln) })?;
    let auth: HelloAuth = read_frame_within(&s, max, left())?;
    s.set_read_timeout(Some(eng.cfg.control_timeout)).ok();
    if eng.cfg.auth && !handshake::same(&auth.proof, &handshake::dialer_proof(own, dn, ln)) {
        let e = IoError::refused(format!(
            "connection from {addr} (says it is engine {:?}) does not prove it holds the secret of engine {:?}: only holders of this engine's current descriptor (EngineDesc, through register_remote_engine) may connect; MORI_IO_AUTH=off turns the check off",
            hello.from.key, eng.desc.key
        ));
        write_frame(&mut s, &HelloReply::Refused(e.clone()))?;
        return Err(e);
    }
    hello.from.secret = handshake::mask(own, dn, ln, auth.secret);
    // A dialer naming an engine registered here must hold that engine's secret too.
    if let Some(known) = eng.registered_remote(&hello.from.key) {
        if known.epoch == hello.from.epoch && !known.secret.matches(&hello.from.secret) {
            let e = IoError::refused(format!(
                "connection from {addr} claims to be engine {:?} (epoch {:#x}) but does not hold that engine's secret",
                hello.from.key, hello.from.epoch
            ));
            write_frame(&mut s, &HelloReply::Refused(e.clone()))?;
            return Err(e);
        }
    }
    match hello.role {
        Role::Control => {
            write_frame(&mut s, &HelloReply::Ok((*eng.desc).clone()))?;
            serve_control(s, eng, hello.from, slot)
        }
        Role::Data { backend, lane } => match eng.backend(backend) {
            Some(b) => {
                write_frame(&mut s, &HelloReply::Ok((*eng.desc).clone()))?;
                b.accept(s, hello.from, lane, slot)
            }
            None => {
                // A dropped engine has let go of its backends: say so, not "no such backend".
                let e = if eng.shutdown.load(Ordering::Acquire) {
                    IoError::disconnected(format!("engine {:?} is shutting down", eng.desc.key))
                } else {
                    IoError::not_supported(format!(
                        "engine {:?} has no {backend} backend (create_backend was not called for it)",
                        eng.desc.key
                    ))
                };
                write_frame(&mut s, &HelloReply::Refused(e.clone()))?;
                Err(e)
            }
        },
    }
}

fn serve_control(mut s: TcpStream, eng: &EngineInner, from: mori_io_core::EngineDesc, slot: InboundSlot) -> Result<(), IoError> {
    let mut link = eng.links.opened(&from.key);
    let r = serve_requests(&mut s, eng, &from, &slot);
    if matches!(&r, Err(e) if e.code == ErrorCode::RemoteDisconnect) {
        link.closed_by_peer();
    }
    r
}

/// Answers `from`'s control requests until it closes the connection, this engine shuts down,
/// the connection stays idle for the slot's idle timeout, or a request fails to read or
/// answer.
fn serve_requests(s: &mut TcpStream, eng: &EngineInner, from: &mori_io_core::EngineDesc, slot: &InboundSlot) -> Result<(), IoError> {
    loop {
        // Idle wait up to the idle timeout, waking up to notice shutdown.
        let idle_since = std::time::Instant::now();
        loop {
            if eng.shutdown.load(Ordering::Acquire) {
                return Ok(());
            }
            if idle_since.elapsed() >= slot.idle_timeout() {
                tracing::debug!(peer = %from.key, "idle control connection closed");
                let _ = s.shutdown(std::net::Shutdown::Both);
                return Ok(());
            }
            match wait_readable(s.as_raw_fd(), POLL) {
                Ok(true) => break,
                Ok(false) => continue,
                Err(e) => return Err(IoError::from_io("control poll", &e)),
            }
        }
        let req: CtrlRequest = read_frame(s, eng.cfg.max_frame)?;
        let reply = match req {
            CtrlRequest::Ping => CtrlReply::Pong,
            CtrlRequest::Backend { backend, payload } => match eng.backend(backend) {
                Some(b) => match b.control(from, &payload) {
                    Ok(r) => CtrlReply::Backend(r),
                    Err(e) => CtrlReply::Error(e),
                },
                None => CtrlReply::Error(IoError::not_supported(format!(
                    "engine {:?} has no {backend} backend (create_backend was not called for it)",
                    eng.desc.key
                ))),
            },
            CtrlRequest::Notify(msgs) => match eng.notifs.push(&from.key, msgs) {
                Ok(()) => CtrlReply::Delivered,
                Err(e) => CtrlReply::Error(IoError::new(e.code, format!("engine {:?}: {}", eng.desc.key, e.msg))),
            },
            CtrlRequest::Signal(ops) => CtrlReply::Signalled(crate::signal::apply(eng, &ops)),
            CtrlRequest::LookupMemory(id) => match eng.local_memory(id) {
                Some(d) => CtrlReply::Memory(d),
                None => CtrlReply::Error(IoError::not_found(format!("memory {id} is not registered at engine {:?}", eng.desc.key))),
            },
        };
        write_frame(s, &reply)?;
    }
}
