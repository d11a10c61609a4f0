//! `tcp_data`: the tcp backend's data connections, end to end. After a valid hello for a
//! tcp data lane, the input's requests ([`ReqHeader`], [`SegWire`] table, write payload) go
//! to a real engine over loopback and its target side (`mori_io_tcp` `serve_one`: header
//! checks, epoch, region lookup, bounds of every segment, the length sum, then the payload
//! moved straight into or out of registered memory) answers them.
//!
//! A model of that protocol, written from its documentation (crates/io-tcp/src/proto.rs and
//! the crate docs), predicts from the same bytes what the engine must answer and what must end
//! up in memory. Asserted: the reply stream is exactly the predicted one (codes, echoed ids,
//! payload lengths, error text within [`MAX_MSG`] and valid UTF-8, read payloads equal to the
//! region's bytes), the engine closes the connection where the protocol says, and every
//! registered buffer equals its shadow, guard bytes included (see [`crate::engine`]).
//!
//! Input: requests, each `[flags] [sel] [48-byte header] [segments] [payload]`. Flags patch
//! the header toward validity so the fuzzer reaches the deep paths quickly (bit 0 magic, 1 op
//! = write or read by `sel` bit 3, 2 the engine's epoch, 3 the region `sel % 5` (the three
//! regions, the deregistered one, or as given), 4 at most 4 segments, 5 segments clamped into
//! the region, 6 total length = segment sum); the rest of the bytes are taken as they are.
//! The harness takes exactly the bytes the header announces, so the stream the engine sees
//! is the input with the patches applied.

use crate::engine::{self, Target, GUARD};
use mori_io_core::wire::Role;
use mori_io_core::{BackendKind, ErrorCode};
use mori_io_tcp::proto::{ReplyHeader, ReqHeader, SegWire, MAGIC, MAX_MSG, MAX_SEGS_PER_REQ, OP_READ, OP_WRITE};

// The model reads the headers at these offsets (the `#[repr(C)]` layouts of proto.rs).
const REQ: usize = 48;
const SEG: usize = 16;
const REPLY: usize = 32;
const _: () = assert!(std::mem::size_of::<ReqHeader>() == REQ);
const _: () = assert!(std::mem::size_of::<SegWire>() == SEG);
const _: () = assert!(std::mem::size_of::<ReplyHeader>() == REPLY);

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Request header fields (offsets in [`ReqHeader`]).
struct Req {
    magic: u32,
    op: u32,
    transfer_id: u64,
    mem_id: u64,
    total_len: u64,
    nsegs: u32,
    epoch: u64,
}

impl Req {
    fn parse(b: &[u8]) -> Req {
        Req {
            magic: u32_at(b, 0),
            op: u32_at(b, 4),
            transfer_id: u64_at(b, 8),
            mem_id: u64_at(b, 16),
            total_len: u64_at(b, 24),
            nsegs: u32_at(b, 32),
            epoch: u64_at(b, 40),
        }
    }
}

/// Builds the byte stream from the input (see the module docs).
fn build(data: &[u8], t: &Target) -> Vec<u8> {
    let mut c = crate::Cursor::new(data);
    let mut out = Vec::with_capacity(data.len());
    let epoch = t.eng().desc().epoch;
    while !c.is_empty() {
        let (flags, sel) = (c.u8(), c.u8());
        let mut h = c.array::<REQ>();
        if flags & 1 != 0 {
            put32(&mut h, 0, MAGIC);
        }
        if flags & 2 != 0 {
            put32(&mut h, 4, if sel & 8 == 0 { OP_WRITE } else { OP_READ });
        }
        if flags & 4 != 0 {
            put64(&mut h, 40, epoch);
        }
        let (id, region) = match sel % 5 {
            k @ 0..=2 => (Some(t.bufs[k as usize].desc.id), Some(&t.bufs[k as usize])),
            3 => (Some(t.gone), None),
            _ => (None, None),
        };
        if let (true, Some(id)) = (flags & 8 != 0, id) {
            put64(&mut h, 16, id);
        }
        if flags & 16 != 0 {
            let n = u32_at(&h, 32) % 5;
            put32(&mut h, 32, n);
        }
        let r = Req::parse(&h);
        let stops = r.magic != MAGIC || (r.op != OP_WRITE && r.op != OP_READ) || r.nsegs as usize > MAX_SEGS_PER_REQ;
        let want = r.nsegs as usize * SEG;
        let mut segs = c.take(want).to_vec();
        if stops || segs.len() < want {
            out.extend_from_slice(&h);
            out.extend_from_slice(&segs);
            out.extend_from_slice(c.rest());
            break;
        }
        if let (true, Some(reg)) = (flags & 32 != 0, region) {
            let len = reg.len as u64;
            for s in segs.chunks_mut(SEG) {
                let off = u64_at(s, 0) % (len + 1);
                let n = u64_at(s, 8) % (len - off + 1);
                put64(s, 0, off);
                put64(s, 8, n);
            }
        }
        if flags & 64 != 0 {
            let sum = segs.chunks(SEG).try_fold(0u64, |a, s| a.checked_add(u64_at(s, 8)));
            if let Some(sum) = sum {
                put64(&mut h, 24, sum);
            }
        }
        out.extend_from_slice(&h);
        out.extend_from_slice(&segs);
        if r.op == OP_WRITE {
            let total = u64_at(&h, 24);
            let p = c.take(usize::try_from(total).unwrap_or(usize::MAX));
            out.extend_from_slice(p);
            if (p.len() as u64) < total {
                out.extend_from_slice(c.rest());
                break;
            }
            if empty_segments(&segs) {
                // See `model`: nothing may follow such a write.
                break;
            }
        }
    }
    out
}

/// A table of one or more segments, all of length 0. The target side fails a write of such a
/// table as if the peer had gone (`read_exact_vectored` of empty buffers reads 0 bytes, taken
/// for the end of the stream): it closes the connection without a reply instead of answering
/// `Ok` (no initiator of this crate sends one: zero-length batch entries are skipped). The
/// model accepts either answer, and the harness sends nothing after such a write.
fn empty_segments(table: &[u8]) -> bool {
    !table.is_empty() && table.chunks(SEG).all(|s| u64_at(s, 8) == 0)
}

/// One reply the model expects.
#[derive(Debug, PartialEq)]
struct Reply {
    code: u32,
    transfer_id: u64,
    payload: Vec<u8>,
}

/// What the target side must do with `stream`: the replies, in order, and the writes applied
/// to the shadows. Follows the documented protocol: a request whose header is bad, or that
/// is cut short, ends the connection without an answer; more than [`MAX_SEGS_PER_REQ`]
/// segments are refused, then the connection ends; otherwise the request is checked (epoch,
/// region, each segment inside it, the sum) and answered, a refused write's payload skipped.
///
/// Returns the replies and whether the last one may be missing (see [`empty_segments`]).
fn model(stream: &[u8], t: &mut Target) -> (Vec<Reply>, bool) {
    let epoch = t.eng().desc().epoch;
    let mut c = crate::Cursor::new(stream);
    let mut replies = Vec::new();
    loop {
        let h = c.take(REQ);
        if h.len() < REQ {
            return (replies, false);
        }
        let r = Req::parse(h);
        if r.magic != MAGIC || (r.op != OP_WRITE && r.op != OP_READ) {
            return (replies, false);
        }
        let refuse = |code: ErrorCode| Reply { code: code.as_u32(), transfer_id: r.transfer_id, payload: Vec::new() };
        if r.nsegs as usize > MAX_SEGS_PER_REQ {
            replies.push(refuse(ErrorCode::InvalidArgs));
            return (replies, false);
        }
        let table = c.take(r.nsegs as usize * SEG);
        if table.len() < r.nsegs as usize * SEG {
            return (replies, false);
        }
        let segs: Vec<(u64, u64)> = table.chunks(SEG).map(|s| (u64_at(s, 0), u64_at(s, 8))).collect();
        let checked = if r.epoch != epoch {
            Err(ErrorCode::RemoteDisconnect)
        } else {
            match t.bufs.iter().position(|b| b.desc.id == r.mem_id) {
                None => Err(ErrorCode::NotFound),
                Some(k) => {
                    let len = t.bufs[k].len as u64;
                    let inside = segs.iter().all(|&(off, n)| off.checked_add(n).is_some_and(|end| end <= len));
                    let sum = segs.iter().try_fold(0u64, |a, &(_, n)| a.checked_add(n));
                    if inside && sum == Some(r.total_len) {
                        Ok(k)
                    } else {
                        Err(ErrorCode::InvalidArgs)
                    }
                }
            }
        };
        match (r.op, checked) {
            (OP_WRITE, Ok(k)) => {
                let shadow = &mut t.bufs[k].shadow;
                for &(off, n) in &segs {
                    let p = c.take(n as usize);
                    let at = GUARD + off as usize;
                    shadow[at..at + p.len()].copy_from_slice(p);
                    if (p.len() as u64) < n {
                        return (replies, false);
                    }
                }
                replies.push(Reply { code: 0, transfer_id: r.transfer_id, payload: Vec::new() });
                if empty_segments(table) {
                    return (replies, true);
                }
            }
            (OP_WRITE, Err(code)) => {
                let skipped = c.take(usize::try_from(r.total_len).unwrap_or(usize::MAX));
                if (skipped.len() as u64) < r.total_len {
                    return (replies, false);
                }
                replies.push(refuse(code));
            }
            (_, Ok(k)) => {
                let shadow = &t.bufs[k].shadow;
                let payload =
                    segs.iter().flat_map(|&(off, n)| &shadow[GUARD + off as usize..GUARD + (off + n) as usize]).copied().collect();
                replies.push(Reply { code: 0, transfer_id: r.transfer_id, payload });
            }
            (_, Err(code)) => replies.push(refuse(code)),
        }
    }
}

/// Parses the engine's answers, asserting the invariants every reply has.
fn parse_replies(mut b: &[u8], expected: &[Reply]) -> Vec<Reply> {
    let mut out = Vec::new();
    while b.len() >= REPLY {
        let (magic, code, transfer_id) = (u32_at(b, 0), u32_at(b, 4), u64_at(b, 8));
        let (payload_len, msg_len) = (u64_at(b, 16), u32_at(b, 24) as usize);
        assert_eq!(magic, MAGIC, "reply {} has magic {magic:#x}", out.len());
        assert!(msg_len <= MAX_MSG, "reply {} carries {msg_len} bytes of text, above {MAX_MSG}", out.len());
        assert!(ErrorCode::from_u32(code).as_u32() == code, "reply {} has unknown code {code}", out.len());
        assert_eq!(msg_len == 0, code == 0, "reply {}: code {code} with {msg_len} bytes of text", out.len());
        if code != 0 {
            assert_eq!(payload_len, 0, "refusal {} announces a payload", out.len());
        }
        let Some(msg) = b.get(REPLY..REPLY + msg_len) else { break };
        let msg = std::str::from_utf8(msg).unwrap_or_else(|e| panic!("reply {}: error text is not UTF-8: {e}", out.len()));
        let Some(want) = usize::try_from(payload_len).ok().and_then(|n| n.checked_add(REPLY + msg_len)) else {
            panic!("reply {} announces {payload_len} payload bytes", out.len())
        };
        let Some(payload) = b.get(REPLY + msg_len..want) else { break };
        if let Some(e) = expected.get(out.len()) {
            if e.code != code {
                panic!("reply {}: code {code} ({msg:?}), the model expects {}", out.len(), e.code);
            }
        }
        out.push(Reply { code, transfer_id, payload: payload.to_vec() });
        b = &b[want..];
    }
    assert!(b.is_empty() || out.len() < expected.len(), "{} bytes after the last expected reply", b.len());
    out
}

/// One input.
pub fn run(data: &[u8]) {
    let mut t = engine::target();
    let stream = build(data, &t);
    let s = engine::dial(&t, Role::Data { backend: BackendKind::Tcp, lane: 0 });
    let (answer, reset) = engine::exchange(s, &stream);
    let (expected, last_optional) = model(&stream, &mut t);
    let got = parse_replies(&answer, &expected);
    if last_optional && got.len() + 1 == expected.len() && got[..] == expected[..got.len()] {
        // The known early close (see `empty_segments`).
    } else if reset {
        // A connection the engine closed with input unread may end with a reset: what came
        // before it must still be right.
        assert!(got.len() <= expected.len() && got[..] == expected[..got.len()], "replies {got:?}, model {expected:?}");
    } else {
        assert_eq!(got, expected, "the engine's replies differ from the protocol model");
    }
    t.check_memory();
}

fn req(flags: u8, sel: u8, op: u32, id: u64, segs: &[(u64, u64)], payload: &[u8]) -> Vec<u8> {
    let mut v = vec![flags, sel];
    let mut h = [0u8; REQ];
    put32(&mut h, 0, MAGIC);
    put32(&mut h, 4, op);
    put64(&mut h, 8, id);
    put64(&mut h, 24, segs.iter().map(|s| s.1).sum());
    put32(&mut h, 32, segs.len() as u32);
    put32(&mut h, 36, 1);
    v.extend_from_slice(&h);
    for &(off, len) in segs {
        v.extend_from_slice(&off.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
    }
    v.extend_from_slice(payload);
    v
}

/// Writes and reads of each region, in and out of bounds, with and without the patches.
pub fn seeds() -> Vec<Vec<u8>> {
    let all = 0x7f; // every patch
    let fixed = 0x0f; // magic, op, epoch, region
    vec![
        req(all, 0, OP_WRITE, 1, &[(0, 8), (100, 4)], b"abcdefghWXYZ"),
        [req(fixed, 0, OP_WRITE, 2, &[(4088, 8)], b"01234567"), req(fixed, 8, OP_READ, 3, &[(4088, 8), (0, 2)], b"")].concat(),
        req(fixed, 1, OP_WRITE, 4, &[(60, 8)], b"overflow"),
        req(fixed, 2, OP_READ, 5, &[(0, 1), (1, 0)], b""),
        req(fixed, 3, OP_WRITE, 6, &[(0, 4)], b"gone"),
        req(0x0b, 0, OP_READ, 7, &[(0, 16)], b""),
        req(all, 9, OP_READ, 8, &[(u64::MAX, 2)], b""),
    ]
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
