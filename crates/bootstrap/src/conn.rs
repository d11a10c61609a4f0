//! Non-blocking framed TCP connections and a `poll(2)` loop with a deadline.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

use crate::error::BootstrapError;
use crate::wire::{Header, Tag, HEADER_LEN};

/// A received frame.
#[derive(Debug)]
pub(crate) struct Frame {
    pub hdr: Header,
    pub payload: Vec<u8>,
}

enum Dec {
    Header { buf: [u8; HEADER_LEN], filled: usize },
    Payload { hdr: Header, buf: Vec<u8>, filled: usize },
}

/// One framed connection to a peer.
pub(crate) struct Conn {
    stream: TcpStream,
    /// Peer rank (or `usize::MAX` while unknown, during rendezvous).
    pub peer: usize,
    /// Human name of the peer for errors ("rank 3", "10.0.0.2:40000").
    pub name: String,
    dec: Dec,
    /// Complete frames not yet consumed.
    pub inbox: VecDeque<Frame>,
    /// Set once the read side is finished (EOF or error): the cause.
    pub closed: Option<String>,
    out: VecDeque<Vec<u8>>,
    out_pos: usize,
}

/// Outcome of pumping a connection.
pub(crate) enum Pumped {
    Ok,
    /// The write side failed while we had data for the peer.
    WriteFailed(String),
}

impl Conn {
    /// Wraps a connected stream, switching it to non-blocking mode.
    pub fn new(stream: TcpStream, peer: usize, name: String) -> Result<Conn, BootstrapError> {
        stream.set_nonblocking(true).map_err(|e| BootstrapError::io(format!("set_nonblocking on {name}"), e))?;
        // Latency matters more than throughput for small bootstrap frames; failure is harmless.
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            peer,
            name,
            dec: Dec::Header { buf: [0; HEADER_LEN], filled: 0 },
            inbox: VecDeque::new(),
            closed: None,
            out: VecDeque::new(),
            out_pos: 0,
        })
    }

    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.peer_addr().ok()
    }

    /// Queues one frame. The caller checked `payload.len() <= MAX_FRAME_LEN`.
    pub fn queue(&mut self, tag: Tag, op: u8, seq: u64, payload: Vec<u8>) {
        let hdr = Header { tag, op, seq, len: payload.len() as u64 };
        self.out.push_back(hdr.encode().to_vec());
        if !payload.is_empty() {
            self.out.push_back(payload);
        }
    }

    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// True when nothing is half-written, so a new frame can follow cleanly.
    pub fn at_frame_boundary(&self) -> bool {
        self.out_pos == 0
    }

    /// Writes and reads as much as possible without blocking. Complete frames go to the
    /// inbox; a malformed or oversized frame is an error.
    pub fn pump(&mut self) -> Result<Pumped, BootstrapError> {
        while let Some(front) = self.out.front() {
            match self.stream.write(&front[self.out_pos..]) {
                Ok(0) => return Ok(Pumped::WriteFailed("connection closed while writing".into())),
                Ok(n) => {
                    self.out_pos += n;
                    if self.out_pos == front.len() {
                        self.out.pop_front();
                        self.out_pos = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Ok(Pumped::WriteFailed(e.to_string())),
            }
        }
        while self.closed.is_none() {
            match self.read_some() {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(Pumped::Ok)
    }

    /// One read; Ok(false) when it would block or the stream closed.
    fn read_some(&mut self) -> Result<bool, BootstrapError> {
        let res = match &mut self.dec {
            Dec::Header { buf, filled } => self.stream.read(&mut buf[*filled..]),
            Dec::Payload { hdr, buf, filled } => {
                if *filled == buf.len() {
                    // Grow step by step so that a declared length alone never allocates much.
                    let want = (hdr.len as usize).min(buf.len().saturating_mul(2).max(64 * 1024));
                    buf.resize(want, 0);
                }
                self.stream.read(&mut buf[*filled..])
            }
        };
        let n = match res {
            Ok(0) => {
                let mid = !matches!(self.dec, Dec::Header { filled: 0, .. });
                self.closed = Some(if mid { "connection closed in the middle of a frame" } else { "connection closed" }.into());
                return Ok(false);
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => {
                self.closed = Some(e.to_string());
                return Ok(false);
            }
        };
        match &mut self.dec {
            Dec::Header { buf, filled } => {
                *filled += n;
                if *filled == HEADER_LEN {
                    let hdr = Header::decode(buf, &self.name)?;
                    if hdr.len == 0 {
                        self.inbox.push_back(Frame { hdr, payload: Vec::new() });
                        self.dec = Dec::Header { buf: [0; HEADER_LEN], filled: 0 };
                    } else {
                        self.dec = Dec::Payload { hdr, buf: Vec::new(), filled: 0 };
                    }
                }
            }
            Dec::Payload { hdr, buf, filled } => {
                *filled += n;
                if *filled as u64 == hdr.len {
                    let payload = std::mem::take(buf);
                    self.inbox.push_back(Frame { hdr: *hdr, payload });
                    self.dec = Dec::Header { buf: [0; HEADER_LEN], filled: 0 };
                }
            }
        }
        Ok(true)
    }

    /// Poll interest: (fd, events), or None when there is nothing to wait for.
    pub fn interest(&self) -> Option<libc::pollfd> {
        let mut events = 0;
        if self.closed.is_none() {
            events |= libc::POLLIN;
        }
        if self.has_output() {
            events |= libc::POLLOUT;
        }
        (events != 0).then(|| libc::pollfd { fd: self.stream.as_raw_fd(), events, revents: 0 })
    }

    /// Best-effort: sends `frame` only if it fits without blocking, then closes both ways.
    pub fn abort_and_close(&mut self, frame: Option<Vec<u8>>) {
        if let Some(f) = frame {
            if self.at_frame_boundary() && self.closed.is_none() {
                let _ = self.stream.write(&f);
            }
        }
        self.out.clear();
        self.out_pos = 0;
        let _ = self.stream.shutdown(Shutdown::Both);
        if self.closed.is_none() {
            self.closed = Some("closed locally".into());
        }
    }
}

/// Waits until one of `fds` is ready or `deadline` passes. Returns false on timeout.
pub(crate) fn poll_until(fds: &mut [libc::pollfd], deadline: Instant) -> Result<bool, BootstrapError> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        // Round up so that we do not spin on sub-millisecond remainders.
        let ms = (deadline - now).as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        let nfds = fds.len() as libc::nfds_t;
        // SAFETY: `fds` is a valid, exclusively borrowed slice of `nfds` pollfd structs for
        // the duration of the call; poll only writes their `revents` fields.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), nfds, ms) };
        if rc >= 0 {
            return Ok(rc > 0 || Instant::now() < deadline);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(BootstrapError::io("poll on bootstrap sockets", e));
        }
    }
}
