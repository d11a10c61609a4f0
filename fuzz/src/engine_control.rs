//! `engine_control`: the engine's listener, end to end: the hello every connection starts
//! with, then the control requests of a control connection, sent over loopback to a real
//! engine (see [`crate::engine`]) and answered by its own connection threads.
//!
//! Input: `[mode] bytes...`. Mode 0 sends the bytes as they are (the hello and its answer to
//! the challenge are fuzzed too, and cannot prove the engine's random secret); mode 1 the
//! same, except that when the first frame decodes as a hello of this protocol for a control
//! connection (or a tcp lane: then only the hello is checked), the harness completes that
//! hello with the real proof and sends the rest; mode 2 sends a valid control hello first,
//! then the bytes; mode 3 sends a valid hello, then frames the bytes itself (`[len] body`
//! pieces, each sent as one frame), so that the request decoding is reached at once.
//!
//! A model predicts the answer from the same bytes, decoding them with the public decoders:
//! no answer to a hello that does not decode; a refusal naming `InvalidArgs` for another
//! protocol version; else the engine's challenge, then `Refused` to an answer that decodes (a
//! fuzzed proof never holds); for a
//! control connection, one reply per request up to the first one that does not decode (`Pong`
//! for `Ping`; the registered descriptor, or `NotFound`, for `LookupMemory`; `NotSupported`
//! for a backend request, as no backend here takes one; for `Signal`, per operation `Ok` or
//! the error code `check_counter` gives against the registration, `NotFound` for an unknown
//! region, the applied ones also applied to the shadow copies); a tcp data lane is answered `Ok`
//! (its bytes are `tcp_data`'s business). Asserted: the answer is exactly that stream of frames,
//! the engine closes the connection once the input ends, and every registered buffer equals
//! its shadow (guard bytes included: a counter never lands outside its region).

use crate::engine::{self, Target, GUARD};
use mori_io_core::counter::check_counter;
use mori_io_core::wire::{
    encode_frame, read_frame, CtrlReply, CtrlRequest, FrameDecoder, Hello, HelloAuth, HelloReply, Role, WireSignal, DEFAULT_MAX_FRAME,
    MAX_HELLO, PROTOCOL_VERSION,
};
use mori_io_core::{BackendKind, EngineDesc, ErrorCode, Secret, SignalOp};

/// A reply the model expects; errors are compared by code (their text is the engine's).
#[derive(Debug)]
enum Want {
    Challenge,
    Hello(Result<(), ErrorCode>),
    Reply(Result<CtrlReply, ErrorCode>),
    /// `Signalled`, one outcome per counter operation (errors by code).
    Signalled(Vec<Result<(), ErrorCode>>),
}

/// The outcome of counter operation `s` on the target's regions; an applied one is applied
/// to the region's shadow too (little-endian u64 at the offset).
fn signal(s: &WireSignal, t: &mut Target) -> Result<(), ErrorCode> {
    let b = t.bufs.iter_mut().find(|b| b.desc.id == s.mem).ok_or(ErrorCode::NotFound)?;
    check_counter(b.desc.id, b.desc.addr, b.desc.len, b.desc.loc, s.offset).map_err(|e| e.code)?;
    let at = GUARD + s.offset as usize;
    let word: &mut [u8] = &mut b.shadow[at..at + 8];
    let old = u64::from_le_bytes(word.try_into().unwrap_or_default());
    let new = match s.op {
        SignalOp::Add(v) => old.wrapping_add(v),
        SignalOp::Set(v) => v,
    };
    word.copy_from_slice(&new.to_le_bytes());
    Ok(())
}

/// The replies to the control requests in `stream`, up to the first that does not decode.
fn control(stream: &[u8], t: &mut Target, out: &mut Vec<Want>) {
    let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
    d.push(stream);
    // Notifications queued by this input (`run` empties the queue first).
    let mut queued = 0usize;
    while let Ok(Some(req)) = d.next_message::<CtrlRequest>() {
        out.push(match req {
            CtrlRequest::Ping => Want::Reply(Ok(CtrlReply::Pong)),
            CtrlRequest::LookupMemory(id) => {
                Want::Reply(t.bufs.iter().find(|b| b.desc.id == id).map(|b| CtrlReply::Memory(b.desc.clone())).ok_or(ErrorCode::NotFound))
            }
            CtrlRequest::Backend { .. } => Want::Reply(Err(ErrorCode::NotSupported)),
            CtrlRequest::Notify(msgs) => Want::Reply(if msgs.iter().any(|m| m.len() > mori_io_core::MAX_NOTIF_LEN) {
                Err(ErrorCode::InvalidArgs)
            } else if queued + msgs.len() > mori_io_core::notif::DEFAULT_MAX_QUEUED {
                Err(ErrorCode::Refused)
            } else {
                queued += msgs.len();
                Ok(CtrlReply::Delivered)
            }),
            CtrlRequest::Signal(ops) => Want::Signalled(ops.iter().map(|s| signal(s, t)).collect()),
        });
    }
}

/// What the engine must answer to `stream` sent on a fresh connection (`dialed`: after a valid
/// control hello of the harness), and whether the connection became a tcp data lane.
fn model(stream: &[u8], dialed: bool, t: &mut Target) -> (Vec<Want>, bool) {
    let mut out = Vec::new();
    if dialed {
        control(stream, t, &mut out);
        return (out, false);
    }
    let mut r = stream;
    // The listener reads a hello of at most MAX_HELLO body bytes (before the secret is known).
    let Ok(hello) = read_frame::<Hello, _>(&mut r, MAX_HELLO) else { return (out, false) };
    if hello.version != PROTOCOL_VERSION {
        out.push(Want::Hello(Err(ErrorCode::InvalidArgs)));
        return (out, false);
    }
    out.push(Want::Challenge);
    if read_frame::<HelloAuth, _>(&mut r, MAX_HELLO).is_ok() {
        out.push(Want::Hello(Err(ErrorCode::Refused)));
    }
    (out, false)
}

/// Checks the engine's answer against the model: exactly the expected frames, nothing after
/// them (a connection that ended with a reset may stop early; after the hello of a tcp data lane the rest is the data protocol's, not checked here).
fn check(answer: &[u8], want: &[Want], data_lane: bool, reset: bool, eng: &EngineDesc) {
    let mut r = answer;
    for (i, w) in want.iter().enumerate() {
        match w {
            Want::Challenge => match read_frame::<HelloReply, _>(&mut r, DEFAULT_MAX_FRAME) {
                Ok(HelloReply::Challenge { .. }) => {}
                Err(_) if reset && r.is_empty() => return,
                other => panic!("answer {i}: no challenge: {other:?}"),
            },
            Want::Hello(h) => {
                let got = match read_frame::<HelloReply, _>(&mut r, DEFAULT_MAX_FRAME) {
                    Ok(g) => g,
                    Err(_) if reset && r.is_empty() => return,
                    Err(e) => panic!("answer {i}: no hello reply: {e}"),
                };
                match (h, got) {
                    (Ok(()), HelloReply::Ok(desc)) => assert_eq!(&desc, eng, "hello answered with another descriptor"),
                    (Err(code), HelloReply::Refused(e)) => assert_eq!(e.code, *code, "hello refused with {e}"),
                    (h, got) => panic!("hello: got {got:?}, the model expects {h:?}"),
                }
            }
            Want::Signalled(w) => {
                let got = match read_frame::<CtrlReply, _>(&mut r, DEFAULT_MAX_FRAME) {
                    Ok(g) => g,
                    Err(_) if reset && r.is_empty() => return,
                    Err(e) => panic!("answer {i}: no control reply: {e}"),
                };
                let CtrlReply::Signalled(got) = got else { panic!("reply {i}: got {got:?}, the model expects Signalled({w:?})") };
                let got: Vec<Result<(), ErrorCode>> = got.into_iter().map(|r| r.map_err(|e| e.code)).collect();
                assert_eq!(&got, w, "reply {i}: per-operation outcomes of a Signal request");
            }
            Want::Reply(w) => {
                let got = match read_frame::<CtrlReply, _>(&mut r, DEFAULT_MAX_FRAME) {
                    Ok(g) => g,
                    Err(_) if reset && r.is_empty() => return,
                    Err(e) => panic!("answer {i}: no control reply: {e}"),
                };
                match (w, got) {
                    (Ok(w), g) => assert_eq!(&g, w, "reply {i}"),
                    (Err(code), CtrlReply::Error(e)) => assert_eq!(e.code, *code, "reply {i}: {e}"),
                    (w, got) => panic!("reply {i}: got {got:?}, the model expects {w:?}"),
                }
            }
        }
    }
    assert!(data_lane || r.is_empty(), "{} bytes after the answers the model expects", r.len());
}

/// One input.
pub fn run(data: &[u8]) {
    let mut t = engine::target();
    let mut c = crate::Cursor::new(data);
    let mode = c.u8() % 4;
    let rest = c.rest();
    let (s, stream) = match mode {
        0 => (engine::connect(&t), rest.to_vec()),
        1 => {
            let mut r = rest;
            match read_frame::<Hello, _>(&mut r, DEFAULT_MAX_FRAME) {
                Ok(h) if h.version == PROTOCOL_VERSION && matches!(h.role, Role::Control) => (engine::dial(&t, h.role), r.to_vec()),
                Ok(h) if h.version == PROTOCOL_VERSION && matches!(h.role, Role::Data { backend: BackendKind::Tcp, .. }) => {
                    // A tcp data lane: its bytes are tcp_data's; the hello is what is checked here.
                    drop(engine::dial(&t, h.role));
                    return;
                }
                _ => (engine::connect(&t), rest.to_vec()),
            }
        }
        2 => (engine::dial(&t, Role::Control), rest.to_vec()),
        _ => {
            let mut c = crate::Cursor::new(rest);
            let mut v = Vec::new();
            while !c.is_empty() {
                let n = c.u8() as usize;
                let body = c.take(n);
                v.extend_from_slice(&(body.len() as u32).to_le_bytes());
                v.extend_from_slice(body);
            }
            (engine::dial(&t, Role::Control), v)
        }
    };
    let dialed = mode >= 2 || (mode == 1 && stream.len() < rest.len());
    // Notifications of earlier inputs would fill the target's queue: start from empty.
    let _ = t.eng().get_new_notifs();
    let (want, data_lane) = model(&stream, dialed, &mut t);
    let (answer, reset) = engine::exchange(s, &stream);
    check(&answer, &want, data_lane, reset, t.eng().desc());
    t.check_memory();
}

fn frames<T: serde::Serialize>(msgs: &[T]) -> Vec<u8> {
    msgs.iter().flat_map(|m| encode_frame(m).unwrap_or_default()).collect()
}

/// Hellos of each kind followed by requests of each kind, raw and pre-framed.
pub fn seeds() -> Vec<Vec<u8>> {
    let from = EngineDesc {
        key: "prefill-0".into(),
        node_id: "n".into(),
        hostname: "h".into(),
        host: "127.0.0.1".into(),
        port: 2,
        pid: 3,
        epoch: 4,
        secret: Secret::NONE,
    };
    let hello = |version, role| encode_frame(&Hello { version, from: from.clone(), role, nonce: 1 }).unwrap_or_default();
    let reqs = frames(&[
        CtrlRequest::Ping,
        CtrlRequest::LookupMemory(1),
        CtrlRequest::LookupMemory(4),
        CtrlRequest::Backend { backend: BackendKind::Tcp, payload: vec![1, 2] },
        CtrlRequest::Backend { backend: BackendKind::Xgmi, payload: vec![] },
        CtrlRequest::Notify(vec![b"req-1:1".to_vec(), Vec::new()]),
        CtrlRequest::Notify(Vec::new()),
        CtrlRequest::Signal(vec![
            WireSignal { mem: 1, offset: 0, op: SignalOp::Add(3) },
            WireSignal { mem: 1, offset: 8, op: SignalOp::Set(u64::MAX) },
            WireSignal { mem: 1, offset: 0, op: SignalOp::Add(u64::MAX) },
            WireSignal { mem: 1, offset: 4092, op: SignalOp::Add(1) },
            WireSignal { mem: 2, offset: 60, op: SignalOp::Set(1) },
            WireSignal { mem: 3, offset: 0, op: SignalOp::Set(1) },
            WireSignal { mem: 99, offset: 0, op: SignalOp::Add(1) },
        ]),
    ]);
    let mut pre = Vec::new();
    for m in [CtrlRequest::Ping, CtrlRequest::LookupMemory(2), CtrlRequest::LookupMemory(99)] {
        let f = encode_frame(&m).unwrap_or_default();
        pre.push((f.len() - 4) as u8);
        pre.extend_from_slice(&f[4..]);
    }
    vec![
        [&[0u8][..], &hello(PROTOCOL_VERSION, Role::Control), &reqs].concat(),
        [&[1u8][..], &hello(PROTOCOL_VERSION, Role::Control), &reqs].concat(),
        [&[1u8][..], &hello(PROTOCOL_VERSION + 1, Role::Control)].concat(),
        [&[1u8][..], &hello(PROTOCOL_VERSION, Role::Data { backend: BackendKind::Rdma, lane: 0 })].concat(),
        [&[1u8][..], &hello(PROTOCOL_VERSION, Role::Data { backend: BackendKind::Tcp, lane: 1 })].concat(),
        [&[2u8][..], &reqs].concat(),
        [&[3u8][..], &pre].concat(),
    ]
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
