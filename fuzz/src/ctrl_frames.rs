//! `ctrl_frames`: the control-plane framing, [`FrameDecoder`] and [`read_frame`], decoding the
//! four message types a peer sends or answers ([`Hello`], [`HelloReply`], [`CtrlRequest`],
//! [`CtrlReply`]).
//!
//! Input: `[type] [max] [split] stream...`: `type` picks the message type, `max` the largest
//! body accepted (16 MiB, or a small limit so that the refusal path is reached), `split`
//! seeds how the stream is cut into pushes. Asserted:
//! - the decoder fed the whole stream at once and fed it in pieces yields the same messages
//!   and stops at the same error (framing does not depend on how TCP segments the stream);
//! - [`read_frame`] over the stream yields the same messages and errors, and reports a
//!   truncated last frame as the peer going away;
//! - every decoded message, encoded again, decodes to itself in a frame no longer than the
//!   one it came from.

use mori_io_core::wire::{
    encode_frame, read_frame, CtrlReply, CtrlRequest, FrameDecoder, Hello, HelloReply, Role, DEFAULT_MAX_FRAME, PROTOCOL_VERSION,
};
use mori_io_core::{BackendHandle, BackendKind, EngineDesc, ErrorCode, IoError, MemLoc, MemoryDesc, Secret};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// One input.
pub fn run(data: &[u8]) {
    let mut c = crate::Cursor::new(data);
    let (ty, max, split) = (c.u8(), c.u8(), c.u8());
    let max = match max % 4 {
        0 | 1 => DEFAULT_MAX_FRAME,
        2 => usize::from(max / 4),
        _ => usize::from(max) * 16,
    };
    let stream = c.rest();
    match ty % 4 {
        0 => check::<Hello>(stream, max, split),
        1 => check::<HelloReply>(stream, max, split),
        2 => check::<CtrlRequest>(stream, max, split),
        _ => check::<CtrlReply>(stream, max, split),
    }
}

/// What a decoder made of a stream: the messages, with the frame length each came from, then
/// how it ended (`None`: cleanly or waiting for more bytes; `Some`: the error message).
type Outcome<T> = (Vec<(T, usize)>, Option<String>);

fn whole<T: DeserializeOwned>(stream: &[u8], max: usize) -> Outcome<T> {
    let mut d = FrameDecoder::new(max);
    d.push(stream);
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        match d.next_message::<T>() {
            Ok(Some(m)) => {
                let len = frame_len(&stream[at..]);
                at += len;
                out.push((m, len));
            }
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e.msg)),
        }
    }
}

/// Length of the frame starting `b` (its header says).
fn frame_len(b: &[u8]) -> usize {
    4 + u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
}

fn pieces<T: DeserializeOwned>(stream: &[u8], max: usize, split: u8) -> Outcome<T> {
    let mut d = FrameDecoder::new(max);
    let mut rng = u32::from(split) | 1;
    let (mut at, mut fed) = (0, 0);
    let mut out = Vec::new();
    while fed < stream.len() {
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        let n = ((rng % 9) as usize).min(stream.len() - fed);
        d.push(&stream[fed..fed + n]);
        fed += n;
        loop {
            match d.next_message::<T>() {
                Ok(Some(m)) => {
                    let len = frame_len(&stream[at..]);
                    at += len;
                    out.push((m, len));
                }
                Ok(None) => break,
                Err(e) => return (out, Some(e.msg)),
            }
        }
    }
    (out, None)
}

fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(stream: &[u8], max: usize, split: u8) {
    let (msgs, end) = whole::<T>(stream, max);
    let (msgs2, end2) = pieces::<T>(stream, max, split);
    assert_eq!(msgs, msgs2, "messages differ between one push and pieces");
    assert_eq!(end, end2, "end differs between one push and pieces");

    // read_frame over the same bytes: the same messages, then the same error, or a disconnect
    // when the stream stops inside a frame.
    let mut r = stream;
    for (m, _) in &msgs {
        let got = read_frame::<T, _>(&mut r, max);
        assert_eq!(got.as_ref(), Ok(m), "read_frame disagrees with FrameDecoder");
    }
    match (&end, r.is_empty()) {
        (None, true) => {}
        (None, false) => {
            let e = read_frame::<T, _>(&mut r, max).expect_err("FrameDecoder waits for more bytes, read_frame decoded");
            assert_eq!(e.code, ErrorCode::RemoteDisconnect, "truncated frame: {e}");
        }
        (Some(msg), _) => {
            let e = read_frame::<T, _>(&mut r, max).expect_err("FrameDecoder failed, read_frame decoded");
            assert_eq!(&e.msg, msg, "read_frame fails differently");
        }
    }

    for (m, len) in &msgs {
        let f = encode_frame(m).expect("a decoded message encodes");
        assert!(f.len() <= *len, "re-encoded frame of {} bytes from one of {len}", f.len());
        let mut d = FrameDecoder::new(f.len());
        d.push(&f);
        assert_eq!(d.next_message::<T>().as_ref().map(Option::as_ref), Ok(Some(m)), "frame round trip");
    }
}

fn engine(key: &str) -> EngineDesc {
    EngineDesc {
        key: key.into(),
        node_id: "node".into(),
        hostname: "host".into(),
        host: "127.0.0.1".into(),
        port: 18516,
        pid: 77,
        epoch: 0xfeed_f00d,
        secret: Secret::NONE,
    }
}

/// A stream of several frames of each type.
pub fn seeds() -> Vec<Vec<u8>> {
    let mem = MemoryDesc {
        engine_key: "decode-0".into(),
        engine_epoch: 5,
        id: 3,
        addr: 0x1000,
        len: 4096,
        loc: MemLoc::Gpu { device: 1 },
        bus_id: Some("0000:01:00.0".into()),
        handles: vec![BackendHandle { backend: BackendKind::Fabric, bytes: vec![1, 2, 3] }],
    };
    let hellos = [
        Hello { version: PROTOCOL_VERSION, from: engine("prefill-0"), role: Role::Control, nonce: 7 << 64 | 9 },
        Hello {
            version: PROTOCOL_VERSION,
            from: engine("prefill-1"),
            role: Role::Data { backend: BackendKind::Tcp, lane: 3 },
            nonce: u128::MAX,
        },
    ];
    let hello_replies = [
        HelloReply::Ok(EngineDesc { secret: Secret(5), ..engine("decode-0") }),
        HelloReply::Refused(IoError::refused("no secret")),
        HelloReply::Challenge { nonce: 3, proof: [9; 32] },
    ];
    let requests = [
        CtrlRequest::Ping,
        CtrlRequest::LookupMemory(3),
        CtrlRequest::Backend { backend: BackendKind::Rdma, payload: vec![0, 1, 2, 3, 4] },
        CtrlRequest::Notify(vec![b"done".to_vec()]),
    ];
    let replies = [
        CtrlReply::Pong,
        CtrlReply::Memory(mem),
        CtrlReply::Backend(vec![7; 12]),
        CtrlReply::Delivered,
        CtrlReply::Error(IoError::not_found("memory 9 is not registered")),
    ];
    fn stream<T: Serialize>(msgs: &[T]) -> Vec<u8> {
        msgs.iter().flat_map(|m| encode_frame(m).unwrap_or_default()).collect()
    }
    let mut out = Vec::new();
    for (ty, s) in [(0u8, stream(&hellos)), (1, stream(&hello_replies)), (2, stream(&requests)), (3, stream(&replies))] {
        out.push([&[ty, 0, 7][..], &s].concat());
        // A small limit, and a frame cut short.
        out.push([&[ty, 2 + 4 * 16, 3][..], &s].concat());
        out.push([&[ty, 1, 9][..], &s[..s.len() - 1]].concat());
    }
    out
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
