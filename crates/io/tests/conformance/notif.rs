//! Notifications and the multi-pair batch, on any backend.

use super::*;
use mori_io::{Op, RegionBatch, MAX_NOTIF_LEN};

/// A write carrying a message: when the target sees the message every byte is there; a read
/// carrying one; a burst of 200 in order; a message alone; a failed transfer sends none; a
/// message over the limit is refused before anything moves.
pub fn notifications(cfg: &dyn Fn() -> BackendConfig, kind: mori_io::BackendKind) {
    let (a, b) = pair(1 << 20, cfg);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    assert_eq!(sess.backend(), kind);
    let target_view = |off: usize, n: usize| -> Vec<u8> { b.buf[off..off + n].to_vec() };

    // One-shot write with a message: the target waits for it, then checks the bytes.
    let (lo, ro, sz) = ([0u64, 300_000], [100_000u64, 600_000], [65_536u64, 200_000]);
    let id = a.eng.allocate_transfer_uid();
    let st = a.eng.post(
        Op::Write,
        &RegionBatch { local: &a.mem, local_offs: &lo, remote: &b.mem, remote_offs: &ro, sizes: &sz, id },
        Some(b"req-1"),
    );
    let (from, msg) = b.eng.wait_notif(T).unwrap();
    assert_eq!((from.as_str(), msg.as_slice()), ("init", b"req-1".as_slice()));
    for i in 0..2 {
        let (l, r, n) = (lo[i] as usize, ro[i] as usize, sz[i] as usize);
        assert_eq!(target_view(r, n), a.buf[l..l + n], "entry {i} not in place when its notification arrived");
    }
    st.wait_for(T).unwrap();

    // A read with a message through the session: the target hears it once the reader has the data.
    let id = a.eng.allocate_transfer_uid();
    sess.post(Op::Read, &[700_000], &[0], &[4096], id, Some(b"read-done")).wait_for(T).unwrap();
    assert_eq!(&a.buf[700_000..704_096], &b.buf[0..4096]);
    assert_eq!(b.eng.wait_notif(T).unwrap(), ("init".to_string(), b"read-done".to_vec()));

    // A burst: every status ended means every message is queued, each once (in the order the
    // transfers completed, which concurrent transfers do not fix).
    let sts: Vec<_> = (0..200u64)
        .map(|i| sess.post(Op::Write, &[i * 8], &[i * 8], &[8], a.eng.allocate_transfer_uid(), Some(format!("m{i}").as_bytes())))
        .collect();
    for s in &sts {
        s.wait_for(T).unwrap();
    }
    let got = b.eng.get_new_notifs();
    let mut want: Vec<Vec<u8>> = (0..200).map(|i| format!("m{i}").into_bytes()).collect();
    assert_eq!(got.len(), 1, "one sender");
    let mut have = got["init"].clone();
    have.sort();
    want.sort();
    assert_eq!(have, want);
    assert!(b.eng.get_new_notifs().is_empty(), "taken once");

    // A message alone, and the largest one allowed.
    a.eng.send_notif("target", &vec![7u8; MAX_NOTIF_LEN]).wait_for(T).unwrap();
    assert_eq!(b.eng.wait_notif(T).unwrap().1.len(), MAX_NOTIF_LEN);

    // A transfer that fails sends nothing; a message over the limit is refused up front.
    let id = a.eng.allocate_transfer_uid();
    let e = sess.post(Op::Write, &[0], &[(1 << 20) - 4], &[8], id, Some(b"never")).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    let e =
        sess.post(Op::Write, &[0], &[0], &[8], a.eng.allocate_transfer_uid(), Some(&vec![0u8; MAX_NOTIF_LEN + 1])).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs);
    assert!(e.msg.contains(&format!("at most {MAX_NOTIF_LEN}")), "{e}");
    let e = b.eng.wait_notif(Duration::from_millis(200)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Timeout, "{e}");
    let e = a.eng.send_notif("nobody", b"x").wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
}

/// Three region pairs in one call (MORI's multi-pair batch): one status each, each pair's
/// bytes in place; a bad pair fails alone.
pub fn multi_pair(cfg: &dyn Fn() -> BackendConfig) {
    let (a, b) = pair(1 << 20, cfg);
    let a2 = unsafe_side_region(&a, 1 << 20);
    let b2 = unsafe_side_region(&b, 1 << 20);
    let (lo, ro, sz) = ([0u64, 4096], [8192u64, 65_536], [4096u64, 100]);
    let bad = [(1u64 << 20) - 1];
    let ids: Vec<u64> = (0..3).map(|_| a.eng.allocate_transfer_uid()).collect();
    let batches = [
        RegionBatch { local: &a.mem, local_offs: &lo, remote: &b.mem, remote_offs: &ro, sizes: &sz, id: ids[0] },
        RegionBatch { local: &a2.1, local_offs: &lo, remote: &b2.1, remote_offs: &ro, sizes: &sz, id: ids[1] },
        RegionBatch { local: &a.mem, local_offs: &[0], remote: &b2.1, remote_offs: &bad, sizes: &[2], id: ids[2] },
    ];
    let sts = a.eng.post_multi(Op::Write, &batches);
    assert_eq!(sts.len(), 3);
    sts[0].wait_for(T).unwrap();
    sts[1].wait_for(T).unwrap();
    assert_eq!(sts[2].wait_for(T).unwrap_err().code, ErrorCode::InvalidArgs);
    for i in 0..2 {
        let (l, r, n) = (lo[i] as usize, ro[i] as usize, sz[i] as usize);
        assert_eq!(&b.buf[r..r + n], &a.buf[l..l + n], "pair 0 entry {i}");
        assert_eq!(&b2.0[r..r + n], &a2.0[l..l + n], "pair 1 entry {i}");
    }
    let sts = a.eng.post_multi(Op::Read, &batches[..2]);
    for s in &sts {
        s.wait_for(T).unwrap();
    }
    b.eng.deregister_memory(&b2.1).unwrap();
    a.eng.deregister_memory(&a2.1).unwrap();
}

/// A second patterned region registered with `s`'s engine (buffer, descriptor); deregister it
/// before dropping the buffer.
fn unsafe_side_region(s: &Side, len: usize) -> (Vec<u8>, MemoryDesc) {
    let mut buf: Vec<u8> = (0..len).map(|i| (i * 31 + 3) as u8).collect();
    // SAFETY: the buffer's heap block does not move when the Vec is moved out; the caller
    // deregisters before dropping it.
    let mem = unsafe { s.eng.register_memory(buf.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
    (buf, mem)
}
