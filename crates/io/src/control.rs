//! Client side of the control plane: one cached connection per peer engine.

use mori_io_core::wire::{read_frame, write_frame, CtrlReply, CtrlRequest, Role};
use mori_io_core::{BackendKind, ControlClient, EngineDesc, ErrorCode, IoError, IoResult};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
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
        self.call_with(peer, req, what, false)
    }

    /// As [`CtrlPool::call`], for a request the peer must not apply twice (counter additions):
    /// it is sent again only when it cannot have been taken whole (its frame was not
    /// written out), never after it was written. A cached connection with bytes or an end of
    /// stream waiting before the request (the peer closed it while idle) is replaced first.
    pub(crate) fn call_at_most_once(&self, peer: &EngineDesc, req: &CtrlRequest, what: &str) -> IoResult<CtrlReply> {
        self.call_with(peer, req, what, true)
    }

    fn call_with(&self, peer: &EngineDesc, req: &CtrlRequest, what: &str, once: bool) -> IoResult<CtrlReply> {
        let mut retried = false;
        loop {
            let mut cached = self.conns.lock().get(&peer.key).cloned();
            if once && cached.as_ref().is_some_and(|c| !quiet(&c.lock())) {
                self.forget(&peer.key);
                cached = None;
            }
            let fresh = cached.is_none();
            let mut written = false;
            let r = match cached {
                Some(c) => Ok(c),
                None => self.dial(peer),
            }
            .and_then(|c| {
                let mut s = c.lock();
                write_frame(&mut *s, req)?;
                written = true;
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
                    if broken && !fresh && !retried && e.code != ErrorCode::Timeout && !(once && written) {
                        retried = true;
                        continue;
                    }
                    return Err(IoError::new(e.code, format!("{what} at engine {:?}: {}", peer.key, e.msg)));
                }
            }
        }
    }
}

/// Whether an idle request/reply connection has nothing waiting to be read (no stray bytes, no
/// end of stream, no error): then it is still usable as far as this side can tell.
fn quiet(s: &TcpStream) -> bool {
    matches!(mori_io_tcp::vio::wait_readable(s.as_raw_fd(), Duration::ZERO), Ok(false))
}

impl ControlClient for CtrlPool {
    fn request(&self, peer: &EngineDesc, backend: BackendKind, payload: Vec<u8>) -> IoResult<Vec<u8>> {
        match self.call(peer, &CtrlRequest::Backend { backend, payload }, &format!("{backend} control request"))? {
            CtrlReply::Backend(b) => Ok(b),
            other => Err(IoError::transport(format!("engine {:?} answered a {backend} request with {other:?}", peer.key))),
        }
    }
}
