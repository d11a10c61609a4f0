//! Client side of the control plane: one cached connection per peer engine.

use mori_io_core::wire::{read_frame, write_frame, CtrlReply, CtrlRequest, Role};
use mori_io_core::{BackendKind, ControlClient, EngineDesc, ErrorCode, IoError, IoResult};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

/// Control connections of one engine, keyed by peer engine key.
pub(crate) struct CtrlPool {
    local: Arc<EngineDesc>,
    timeout: Duration,
    max_frame: usize,
    conns: Mutex<HashMap<String, Arc<Mutex<TcpStream>>>>,
}

impl CtrlPool {
    pub(crate) fn new(local: Arc<EngineDesc>, timeout: Duration, max_frame: usize) -> Self {
        CtrlPool { local, timeout, max_frame, conns: Mutex::new(HashMap::new()) }
    }

    /// Drops the cached connection to `key`.
    pub(crate) fn forget(&self, key: &str) {
        self.conns.lock().remove(key);
    }

    fn dial(&self, peer: &EngineDesc) -> IoResult<Arc<Mutex<TcpStream>>> {
        let s = mori_io_core::wire::dial(&self.local, peer, Role::Control, self.timeout, self.timeout)?;
        let c = Arc::new(Mutex::new(s));
        self.conns.lock().insert(peer.key.clone(), c.clone());
        Ok(c)
    }

    /// One request/reply with `peer`. A cached connection that turns out dead (peer restarted)
    /// is replaced once; errors name the peer and what was asked.
    pub(crate) fn call(&self, peer: &EngineDesc, req: &CtrlRequest, what: &str) -> IoResult<CtrlReply> {
        let mut retried = false;
        loop {
            let cached = self.conns.lock().get(&peer.key).cloned();
            let fresh = cached.is_none();
            let r = match cached {
                Some(c) => Ok(c),
                None => self.dial(peer),
            }
            .and_then(|c| {
                let mut s = c.lock();
                write_frame(&mut *s, req)?;
                read_frame::<CtrlReply, _>(&mut *s, self.max_frame)
            });
            match r {
                Ok(CtrlReply::Error(e)) => return Err(e),
                Ok(reply) => return Ok(reply),
                Err(e) => {
                    let broken = matches!(e.code, ErrorCode::RemoteDisconnect | ErrorCode::Timeout | ErrorCode::Transport);
                    if broken {
                        self.forget(&peer.key);
                    }
                    if broken && !fresh && !retried && e.code != ErrorCode::Timeout {
                        retried = true;
                        continue;
                    }
                    return Err(IoError::new(e.code, format!("{what} at engine {:?}: {}", peer.key, e.msg)));
                }
            }
        }
    }
}

impl ControlClient for CtrlPool {
    fn request(&self, peer: &EngineDesc, backend: BackendKind, payload: Vec<u8>) -> IoResult<Vec<u8>> {
        match self.call(peer, &CtrlRequest::Backend { backend, payload }, &format!("{backend} control request"))? {
            CtrlReply::Backend(b) => Ok(b),
            other => Err(IoError::transport(format!("engine {:?} answered a {backend} request with {other:?}", peer.key))),
        }
    }
}
