//! The engine's one listener: control requests and backends' data connections.

use crate::engine::EngineInner;
use mori_io_core::wire::{read_frame, write_frame, CtrlReply, CtrlRequest, Hello, HelloReply, Role, PROTOCOL_VERSION};
use mori_io_core::{ErrorCode, IoError};
use mori_io_tcp::vio::wait_readable;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(100);

/// Accept loop; returns when the engine shuts down.
pub(crate) fn accept_loop(listener: TcpListener, eng: Arc<EngineInner>) {
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
                let e = eng.clone();
                let spawned = std::thread::Builder::new().name("mori-io-conn".into()).spawn(move || {
                    if let Err(err) = handle(s, &e) {
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

fn handle(mut s: TcpStream, eng: &EngineInner) -> Result<(), IoError> {
    s.set_nodelay(true).ok();
    s.set_read_timeout(Some(eng.cfg.control_timeout)).ok();
    s.set_write_timeout(Some(eng.cfg.control_timeout)).ok();
    let hello: Hello = read_frame(&mut s, eng.cfg.max_frame)?;
    if hello.version != PROTOCOL_VERSION {
        let e =
            IoError::invalid(format!("engine {:?} speaks protocol {}, this engine {}", hello.from.key, hello.version, PROTOCOL_VERSION));
        write_frame(&mut s, &HelloReply::Refused(e.clone()))?;
        return Err(e);
    }
    match hello.role {
        Role::Control => {
            write_frame(&mut s, &HelloReply::Ok((*eng.desc).clone()))?;
            serve_control(s, eng, hello.from)
        }
        Role::Data { backend, lane } => match eng.backend(backend) {
            Some(b) => {
                write_frame(&mut s, &HelloReply::Ok((*eng.desc).clone()))?;
                b.accept(s, hello.from, lane)
            }
            None => {
                let e = IoError::not_supported(format!(
                    "engine {:?} has no {backend} backend (create_backend was not called for it)",
                    eng.desc.key
                ));
                write_frame(&mut s, &HelloReply::Refused(e.clone()))?;
                Err(e)
            }
        },
    }
}

fn serve_control(mut s: TcpStream, eng: &EngineInner, from: mori_io_core::EngineDesc) -> Result<(), IoError> {
    loop {
        // Idle wait without a deadline, but wake up to notice shutdown.
        loop {
            if eng.shutdown.load(Ordering::Acquire) {
                return Ok(());
            }
            match wait_readable(s.as_raw_fd(), POLL) {
                Ok(true) => break,
                Ok(false) => continue,
                Err(e) => return Err(IoError::from_io("control poll", &e)),
            }
        }
        let req: CtrlRequest = read_frame(&mut s, eng.cfg.max_frame)?;
        let reply = match req {
            CtrlRequest::Ping => CtrlReply::Pong,
            CtrlRequest::Backend { backend, payload } => match eng.backend(backend) {
                Some(b) => match b.control(&from, &payload) {
                    Ok(r) => CtrlReply::Backend(r),
                    Err(e) => CtrlReply::Error(e),
                },
                None => CtrlReply::Error(IoError::not_supported(format!(
                    "engine {:?} has no {backend} backend (create_backend was not called for it)",
                    eng.desc.key
                ))),
            },
            CtrlRequest::LookupMemory(id) => match eng.local_memory(id) {
                Some(d) => CtrlReply::Memory(d),
                None => CtrlReply::Error(IoError::not_found(format!("memory {id} is not registered at engine {:?}", eng.desc.key))),
            },
        };
        write_frame(&mut s, &reply)?;
    }
}
