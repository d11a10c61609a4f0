//! Control-plane messages and their framing: `u32` little-endian length, then a postcard body.
//!
//! [`FrameDecoder`] is the sans-IO core (feed bytes, take messages); [`read_frame`] and
//! [`write_frame`] are thin blocking helpers over `std::io`.

use crate::backend::BackendKind;
use crate::desc::{EngineDesc, MemId, MemoryDesc, Secret};
use crate::error::{IoError, IoResult};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Protocol version carried in every [`Hello`].
pub const PROTOCOL_VERSION: u16 = 6;

/// Default upper bound of one control frame's body, bytes (16 MiB).
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// Upper bound of a [`Hello`] or [`HelloReply`] body, bytes (64 KiB): read before the peer
/// is known to hold the secret, so a stranger cannot make the engine hold more.
pub const MAX_HELLO: usize = 64 << 10;

/// A TCP stream read under one deadline for the whole message: each read's socket timeout is
/// what is left of it (a peer trickling bytes cannot stretch it).
struct Within<'a> {
    s: &'a std::net::TcpStream,
    until: std::time::Instant,
}

impl Read for Within<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline passed"));
        }
        self.s.set_read_timeout(Some(left))?;
        (&*self.s).read(b)
    }
}

/// Reads one frame of at most `max` body bytes from `s` within `deadline` (for the whole
/// frame, however the peer paces its bytes). Errors as [`read_frame`]; `Timeout` once the
/// deadline passed. Leaves the stream's read timeout at whatever was left of the deadline.
pub fn read_frame_within<T: for<'de> Deserialize<'de>>(s: &std::net::TcpStream, max: usize, deadline: std::time::Duration) -> IoResult<T> {
    read_frame(&mut Within { s, until: std::time::Instant::now() + deadline }, max)
}

/// First frame on every connection to an engine's listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must equal [`PROTOCOL_VERSION`].
    pub version: u16,
    /// The connecting engine's descriptor with its secret blanked ([`Secret::NONE`]); the
    /// secret follows in [`HelloAuth`], once the listener proved who it is.
    pub from: EngineDesc,
    /// What the connection is for.
    pub role: Role,
    /// The dialer's fresh nonce ([`crate::handshake`]).
    pub nonce: u128,
}

/// The dialer's answer to `HelloReply::Challenge` ([`crate::handshake`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloAuth {
    /// `handshake::dialer_proof` with the listener's secret as the dialer's descriptor says.
    pub proof: crate::handshake::Proof,
    /// The dialer's own secret, masked (`handshake::mask`).
    pub secret: Secret,
}

/// Purpose of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Control requests ([`CtrlRequest`]).
    Control,
    /// A backend's data connection number `lane`.
    Data {
        /// Which backend owns it.
        backend: BackendKind,
        /// Lane index.
        lane: u32,
    },
}

/// Reply to a [`Hello`] (a `Challenge`) and then to its [`HelloAuth`] (`Ok` or `Refused`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// Accepted; carries the listener's engine.
    Ok(EngineDesc),
    /// The listener's nonce and its proof of its secret ([`crate::handshake`]).
    Challenge {
        /// The listener's fresh nonce.
        nonce: u128,
        /// `handshake::listener_proof`.
        proof: crate::handshake::Proof,
    },
    /// Refused, with the reason.
    Refused(IoError),
}

/// Requests on a control connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CtrlRequest {
    /// Look a registered region up by id.
    LookupMemory(MemId),
    /// Liveness check.
    Ping,
    /// A backend's own request (e.g. the RDMA queue-pair handshake), answered by that
    /// backend's [`crate::Backend::control`].
    Backend {
        /// Which backend it is for.
        backend: BackendKind,
        /// The backend's serialized request.
        payload: Vec<u8>,
    },
    /// Notifications for the target's queue (`crate::notif`), in order; sent only after the
    /// data of the transfers they follow is in place. Answered `Delivered` or `Error`.
    Notify(Vec<Vec<u8>>),
    /// Counter operations on the target's registered host memory (`crate::counter`), applied
    /// in order, each as an atomic with release ordering; sent only after the data of the
    /// writes they follow is in place. Answered `Signalled` (one result per operation) or
    /// `Error`.
    Signal(Vec<WireSignal>),
}

/// One counter operation of a [`CtrlRequest::Signal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSignal {
    /// The target's region.
    pub mem: MemId,
    /// Byte offset of the counter in it (8-byte aligned address, `offset + 8 <= len`).
    pub offset: u64,
    /// What to do to the counter.
    pub op: crate::counter::SignalOp,
}

/// Replies on a control connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CtrlReply {
    /// The region (answer to `LookupMemory`).
    Memory(MemoryDesc),
    /// Answer to `Ping`.
    Pong,
    /// A backend's reply to `CtrlRequest::Backend`.
    Backend(Vec<u8>),
    /// The request failed (`NotFound` for an unknown region id).
    Error(IoError),
    /// Answer to `Notify`: every message was queued.
    Delivered,
    /// Answer to `Signal`: per operation, in order, applied (`Ok`) or why not (the region is
    /// unknown, GPU memory, or the counter is out of bounds or misaligned).
    Signalled(Vec<Result<(), IoError>>),
}

/// Opens a connection to `peer`'s listener for `role` and exchanges hellos: connect within
/// `connect_timeout`, then every read and write of the stream bounded by `io_timeout`.
/// Errors: `InvalidArgs` for an address that does not resolve; `Timeout`/`RemoteDisconnect`/
/// `Transport` from the socket (naming the engine and address); the peer's refusal; `BadState`
/// when another engine than `peer` answers; `RemoteDisconnect` when an engine of that key but
/// another [`EngineDesc::epoch`] answers (the peer restarted since its descriptor was taken).
pub fn dial(
    local: &EngineDesc,
    peer: &EngineDesc,
    role: Role,
    connect_timeout: std::time::Duration,
    io_timeout: std::time::Duration,
) -> IoResult<std::net::TcpStream> {
    let key = &peer.key;
    let addr = mori_bootstrap::addr::resolve(&peer.host, peer.port)
        .map_err(|e| IoError::invalid(format!("engine {key:?} address {:?} port {}: {e}", peer.host, peer.port)))?[0];
    let what = match role {
        Role::Control => "control".to_string(),
        Role::Data { backend, lane } => format!("{backend} lane {lane}"),
    };
    // A Timeout says which deadline passed and where it is set.
    let hint = |mut err: IoError, which: &str| {
        if err.code == crate::ErrorCode::Timeout {
            err.msg.push_str(&format!(
                " (no answer within the {which} deadline of {:.3} s: EngineConfig::control_timeout / TcpConfig::connect_timeout, env MORI_IO_CONTROL_TIMEOUT_MS)",
                connect_timeout.as_secs_f64()
            ));
        }
        err
    };
    let mut s = std::net::TcpStream::connect_timeout(&addr, connect_timeout)
        .map_err(|e| hint(IoError::from_io(&format!("{what} connect to engine {key:?} at {addr}"), &e), "connect"))?;
    s.set_nodelay(true).ok();
    s.set_write_timeout(Some(io_timeout)).ok();
    let desc = handshake(&mut s, local, peer, role, connect_timeout)
        .map_err(|e| hint(IoError::new(e.code, format!("{what} hello to engine {key:?} at {addr}: {}", e.msg)), "control"))?;
    s.set_read_timeout(Some(io_timeout)).ok();
    match desc {
        d if d.key == *key && d.epoch == peer.epoch => Ok(s),
        d if d.key == *key => Err(IoError::disconnected(format!(
            "engine {key:?} at {addr} is another incarnation (epoch {:#x}, pid {}) than the one registered here (epoch {:#x}, pid {}): \
             it restarted; register its new descriptor and look its memory up again",
            d.epoch, d.pid, peer.epoch, peer.pid
        ))),
        d => Err(IoError::bad_state(format!("dialed engine {key:?} at {addr} but {:?} answered", d.key))),
    }
}

/// The dialer's side of the hello on a connected stream `s`, as engine `local` to engine
/// `peer` for `role`, all within `deadline` ([`crate::handshake`]): returns the listener's
/// descriptor. Errors: the listener's refusal; `Refused` when the listener cannot prove it
/// holds `peer`'s secret (nothing of `local`'s secret was sent then); `Transport` for an
/// unexpected reply; socket errors (`Timeout` once the deadline passed).
pub fn handshake(
    s: &mut std::net::TcpStream,
    local: &EngineDesc,
    peer: &EngineDesc,
    role: Role,
    deadline: std::time::Duration,
) -> IoResult<EngineDesc> {
    let until = std::time::Instant::now() + deadline;
    let left = || until.saturating_duration_since(std::time::Instant::now());
    let dn = crate::handshake::nonce()?;
    let from = EngineDesc { secret: Secret::NONE, ..local.clone() };
    write_frame(s, &Hello { version: PROTOCOL_VERSION, from, role, nonce: dn })?;
    let (ln, proof) = match read_frame_within::<HelloReply>(s, MAX_HELLO, left())? {
        HelloReply::Challenge { nonce, proof } => (nonce, proof),
        HelloReply::Refused(e) => return Err(e),
        HelloReply::Ok(_) => return Err(IoError::transport("the listener accepted before proving its secret (an older protocol?)")),
    };
    if !crate::handshake::same(&proof, &crate::handshake::listener_proof(&peer.secret, dn, ln)) {
        return Err(IoError::refused(format!(
            "the engine answering as {:?} does not prove it holds the secret of the descriptor registered under that key \
             (an impostor at that address, or a descriptor of another engine); nothing of this engine's was sent",
            peer.key
        )));
    }
    let auth = HelloAuth {
        proof: crate::handshake::dialer_proof(&peer.secret, dn, ln),
        secret: crate::handshake::mask(&peer.secret, dn, ln, local.secret),
    };
    write_frame(s, &auth)?;
    match read_frame_within::<HelloReply>(s, MAX_HELLO, left())? {
        HelloReply::Ok(d) => Ok(d),
        HelloReply::Refused(e) => Err(e),
        HelloReply::Challenge { .. } => Err(IoError::transport("the listener sent a second challenge")),
    }
}

/// Encodes one frame: `len: u32 LE` then the postcard body.
pub fn encode_frame<T: Serialize>(msg: &T) -> IoResult<Vec<u8>> {
    let body = postcard::to_allocvec(msg).map_err(|e| IoError::invalid(format!("control message encode: {e}")))?;
    let len =
        u32::try_from(body.len()).map_err(|_| IoError::invalid(format!("control message of {} bytes exceeds u32 framing", body.len())))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Incremental frame decoder with a maximum body size.
pub struct FrameDecoder {
    buf: Vec<u8>,
    max: usize,
}

impl FrameDecoder {
    /// A decoder refusing bodies larger than `max` bytes.
    pub fn new(max: usize) -> Self {
        FrameDecoder { buf: Vec::new(), max }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Takes the next complete message. `Ok(None)`: more bytes needed. Errors: `InvalidArgs`
    /// when the declared length exceeds the maximum (naming both) or the body does not decode
    /// as `T` exactly.
    pub fn next_message<T: for<'de> Deserialize<'de>>(&mut self) -> IoResult<Option<T>> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.max {
            return Err(IoError::invalid(format!("control frame declares {len} bytes, above the maximum of {} bytes", self.max)));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let r = decode_body(&self.buf[4..4 + len]);
        self.buf.drain(..4 + len);
        r.map(Some)
    }
}

fn decode_body<T: for<'de> Deserialize<'de>>(body: &[u8]) -> IoResult<T> {
    match postcard::take_from_bytes::<T>(body) {
        Ok((v, [])) => Ok(v),
        Ok((_, rest)) => Err(IoError::invalid(format!("control frame has {} trailing bytes", rest.len()))),
        Err(e) => Err(IoError::invalid(format!("control frame does not decode: {e}"))),
    }
}

/// Writes one frame (blocking, honouring the stream's write timeout).
pub fn write_frame<T: Serialize, W: Write>(w: &mut W, msg: &T) -> IoResult<()> {
    let f = encode_frame(msg)?;
    w.write_all(&f).map_err(|e| IoError::from_io("control write", &e))
}

/// Reads one frame (blocking, honouring the stream's read timeout). Errors as
/// [`FrameDecoder::next_message`], plus `RemoteDisconnect`/`Timeout`/`Transport` from the socket.
pub fn read_frame<T: for<'de> Deserialize<'de>, R: Read>(r: &mut R, max: usize) -> IoResult<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(|e| IoError::from_io("control read", &e))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(IoError::invalid(format!("control frame declares {len} bytes, above the maximum of {max} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| IoError::from_io("control read", &e))?;
    decode_body(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn oversized_frame_is_refused_by_name() {
        let mut d = FrameDecoder::new(8);
        d.push(&100u32.to_le_bytes());
        let e = d.next_message::<CtrlRequest>().unwrap_err();
        assert!(e.msg.contains("declares 100 bytes, above the maximum of 8 bytes"), "{e}");
        let mut r: &[u8] = &[200, 0, 0, 0];
        assert!(read_frame::<CtrlRequest, _>(&mut r, 8).is_err());
    }

    #[test]
    fn truncated_stream_is_a_disconnect() {
        let f = encode_frame(&CtrlRequest::LookupMemory(7)).unwrap();
        let mut r: &[u8] = &f[..f.len() - 1];
        let e = read_frame::<CtrlRequest, _>(&mut r, 1024).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::RemoteDisconnect);
    }

    proptest! {
        #[test]
        fn decoder_reassembles_any_split(ids in proptest::collection::vec(any::<u64>(), 1..20), cut in 1usize..7) {
            let msgs: Vec<CtrlRequest> = ids.iter().map(|&i| match i % 4 {
                0 => CtrlRequest::Ping,
                1 => CtrlRequest::Signal(vec![WireSignal { mem: i, offset: i.rotate_left(7), op: crate::SignalOp::Add(i) }, WireSignal { mem: 1, offset: 8, op: crate::SignalOp::Set(i) }]),
                _ => CtrlRequest::LookupMemory(i),
            }).collect();
            let stream: Vec<u8> = msgs.iter().flat_map(|m| encode_frame(m).unwrap()).collect();
            let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            for chunk in stream.chunks(cut) {
                d.push(chunk);
                while let Some(m) = d.next_message::<CtrlRequest>().unwrap() { got.push(m); }
            }
            prop_assert_eq!(got, msgs);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut d = FrameDecoder::new(64);
            d.push(&bytes);
            for _ in 0..8 { if !matches!(d.next_message::<CtrlReply>(), Ok(Some(_))) { break; } }
        }
    }
}
