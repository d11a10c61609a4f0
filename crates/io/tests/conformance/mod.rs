//! The conformance cases every backend must pass (DESIGN.md: "Every backend passes one
//! conformance test suite"): data movement, batches, notifications, signalled writes, bounds,
//! argument errors, deregistration. Each test file calls them with its backend's configuration.

#![allow(dead_code, unused_imports)]

use mori_io::{BackendConfig, EngineConfig, ErrorCode, IoEngine, MemLoc, MemoryDesc};
use std::time::Duration;

mod notif;
mod paged;
mod signal;
pub use notif::*;
pub use paged::*;
pub use signal::*;

pub const T: Duration = Duration::from_secs(30);

/// One engine with one registered, patterned host buffer.
pub struct Side {
    pub eng: IoEngine,
    pub buf: Vec<u8>,
    pub mem: MemoryDesc,
}

pub fn side(key: &str, len: usize, cfg: BackendConfig, fill: impl Fn(usize) -> u8) -> Side {
    let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.create_backend(cfg).unwrap();
    let mut buf: Vec<u8> = (0..len).map(fill).collect();
    // SAFETY: `buf` is never reallocated and lives as long as the engine (fields drop in
    // declaration order: the engine first); every transfer is waited for before the end.
    let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
    Side { eng, buf, mem }
}

pub fn pair(len: usize, cfg: &dyn Fn() -> BackendConfig) -> (Side, Side) {
    let a = side("init", len, cfg(), |i| (i * 7 + 1) as u8);
    let b = side("target", len, cfg(), |i| (i * 13 + 5) as u8);
    a.eng.register_remote_engine(b.eng.desc().clone()).unwrap();
    b.eng.register_remote_engine(a.eng.desc().clone()).unwrap();
    (a, b)
}

fn pop_eventually(s: &Side, from: &str, id: u64) -> Option<Result<(), mori_io::IoError>> {
    for _ in 0..2000 {
        if let Some(r) = s.eng.pop_inbound_status(from, id) {
            return Some(r);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Scattered batch write, striped when large; the target learns of it once; read back.
pub fn batch_write_then_read(cfg: &dyn Fn() -> BackendConfig, kind: mori_io::BackendKind) {
    let (a, b) = pair(1 << 20, cfg);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    assert_eq!(sess.backend(), kind);
    let (lo, ro, sz) = ([0u64, 5000, 100_000], [700_000u64, 10, 300_000], [4096u64, 1, 400_000]);
    let id = a.eng.allocate_transfer_uid();
    sess.batch_write(&lo, &ro, &sz, id).wait_for(T).unwrap();
    for i in 0..3 {
        let (l, r, n) = (lo[i] as usize, ro[i] as usize, sz[i] as usize);
        assert_eq!(&b.buf[r..r + n], &a.buf[l..l + n], "entry {i}");
    }
    assert_eq!(b.buf[11], (11 * 13 + 5) as u8, "byte after entry 1 untouched");
    assert_eq!(pop_eventually(&b, "init", id), Some(Ok(())));
    assert_eq!(b.eng.pop_inbound_status("init", id), None, "popped once");
    let id2 = a.eng.allocate_transfer_uid();
    sess.read(600_000, 300_000, 400_000, id2).wait_for(T).unwrap();
    assert_eq!(&a.buf[600_000..1_000_000], &a.buf[100_000..500_000]);
}

/// `n` descriptors of 8 bytes, non-contiguous remotely; zero-length entries are skipped.
pub fn many_small_descriptors(cfg: &dyn Fn() -> BackendConfig, n: u64) {
    let (a, b) = pair(((n * 16 + 64) as usize).max(1 << 16), cfg);
    let lo: Vec<u64> = (0..n).map(|i| i * 8).collect();
    let ro: Vec<u64> = (0..n).map(|i| i * 16 + 3).collect();
    let sz = vec![8u64; n as usize];
    a.eng.batch_write(&a.mem, &lo, &b.mem, &ro, &sz, a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
    for i in (0..n as usize).step_by(97) {
        assert_eq!(&b.buf[i * 16 + 3..i * 16 + 11], &a.buf[i * 8..i * 8 + 8], "descriptor {i}");
    }
    assert_eq!(b.buf[11], (11 * 13 + 5) as u8, "gap byte between descriptors untouched");
    a.eng.batch_write(&a.mem, &[0, 0], &b.mem, &[0, 0], &[0, 0], a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
}

/// Argument errors are named and touch nothing; a forged larger descriptor is refused by
/// the target side (`forged_code`: what the backend reports for an access outside the
/// registration); unknown memory is `NotFound`.
pub fn bad_arguments(cfg: &dyn Fn() -> BackendConfig, forged_words: &[&str]) {
    let (a, b) = pair(4096, cfg);
    let before = b.buf.clone();
    let e = a.eng.write(&a.mem, 0, &b.mem, 4000, 200, 1).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs);
    assert!(e.msg.contains("entry 0: remote range offset 4000 + length 200 exceeds region"), "{e}");
    let e = a.eng.batch_write(&a.mem, &[0, 1], &b.mem, &[0], &[1, 1], 2).wait_for(T).unwrap_err();
    assert!(e.msg.contains("2 local offsets, 1 remote offsets, 2 sizes"), "{e}");
    let e = a.eng.batch_write(&a.mem, &[], &b.mem, &[], &[], 3).wait_for(T).unwrap_err();
    assert!(e.msg.contains("empty batch"), "{e}");
    let mut forged = b.mem.clone();
    forged.len = 1 << 30;
    let e = a.eng.write(&a.mem, 0, &forged, 8192, 64, 4).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    for w in forged_words {
        assert!(e.msg.contains(w), "{e}");
    }
    let e = a.eng.read(&a.mem, 0, &forged, 8192, 64, 5).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    assert_eq!(b.buf, before, "target memory unchanged by refused requests");
    // After a refused request the pair still works.
    a.eng.write(&a.mem, 0, &b.mem, 0, 64, 6).wait_for(T).unwrap();
    assert_eq!(&b.buf[..64], &a.buf[..64]);
    let mut unknown = b.mem.clone();
    unknown.id = 999;
    let e = a.eng.create_session(&a.mem, &unknown).err().unwrap();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    assert!(e.msg.contains("memory 999 is not registered"), "{e}");
    let mut stranger = b.mem.clone();
    stranger.engine_key = "nobody".into();
    let e = a.eng.write(&a.mem, 0, &stranger, 0, 1, 7).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    let e = a.eng.write(&b.mem, 0, &b.mem, 0, 1, 8).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs);
}

/// Deregistration: reads of deregistered target memory fail (`dereg_code`); a second
/// deregistration is `NotFound`.
pub fn deregistration(cfg: &dyn Fn() -> BackendConfig, dereg_code: ErrorCode) {
    let (a, b) = pair(65536, cfg);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    sess.read(0, 0, 1024, 1).wait_for(T).unwrap();
    b.eng.deregister_memory(&b.mem).unwrap();
    let e = sess.read(0, 0, 1024, 2).wait_for(T).unwrap_err();
    assert_eq!(e.code, dereg_code, "{e}");
    let e = b.eng.deregister_memory(&b.mem).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
}

fn assert_stale(what: &str, r: Result<(), mori_io::IoError>, words: &[&str]) {
    let e = r.expect_err(what);
    assert_eq!(e.code, ErrorCode::RemoteDisconnect, "{what}: {e}");
    for w in words {
        assert!(e.msg.contains(w), "{what}: {e}");
    }
}

/// A peer restarted under the same key (region ids restart at 1): descriptors and sessions of
/// its earlier life are refused as stale, nothing lands in the new engine's region, and its
/// fresh descriptors work.
pub fn restarted_peer_refuses_stale_descriptors(cfg: &dyn Fn() -> BackendConfig) {
    let (a, b1) = pair(1 << 16, cfg);
    let old_sess = a.eng.create_session(&a.mem, &b1.mem).unwrap();
    old_sess.write(0, 0, 4096, a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
    let old_mem = b1.mem.clone();
    drop(b1);
    let b2 = side("target", 1 << 16, cfg(), |i| (i * 3 + 11) as u8);
    assert_eq!(b2.mem.id, old_mem.id, "region ids restart with the engine");
    assert_ne!(b2.mem.engine_epoch, old_mem.engine_epoch);
    let before = b2.buf.clone();
    a.eng.register_remote_engine(b2.eng.desc().clone()).unwrap();
    let id = a.eng.allocate_transfer_uid();
    assert_stale(
        "one-shot write through the old descriptor",
        a.eng.write(&a.mem, 0, &old_mem, 0, 4096, id).wait_for(T),
        &["stale descriptor", "restarted"],
    );
    let id = a.eng.allocate_transfer_uid();
    assert_stale("read through the old descriptor", a.eng.read(&a.mem, 0, &old_mem, 0, 64, id).wait_for(T), &["stale descriptor"]);
    for (i, st) in [old_sess.write(0, 0, 4096, 900), old_sess.batch_write(&[0], &[8], &[64], 901)].into_iter().enumerate() {
        assert_stale(&format!("old session call {i}"), st.wait_for(T), &["replaced", "make a new session"]);
    }
    assert_stale("session against the old descriptor", a.eng.create_session(&a.mem, &old_mem).map(|_| ()), &["stale descriptor"]);
    assert_eq!(b2.buf, before, "nothing landed in the new engine's region");
    let sess = a.eng.create_session(&a.mem, &b2.mem).unwrap();
    sess.write(0, 0, 4096, a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
    assert_eq!(&b2.buf[..4096], &a.buf[..4096], "the fresh descriptor works");
}

/// Two live engines under one key: once the initiator registered the second, nothing it sends
/// reaches the first (old sessions fail, new ones write into the second only).
pub fn two_live_engines_under_one_key_never_mix(cfg: &dyn Fn() -> BackendConfig) {
    let (a, b1) = pair(1 << 16, cfg);
    let b2 = side("target", 1 << 16, cfg(), |i| (i * 3 + 11) as u8);
    let s1 = a.eng.create_session(&a.mem, &b1.mem).unwrap();
    s1.write(0, 0, 64, a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
    let (was1, was2) = (b1.buf.clone(), b2.buf.clone());
    a.eng.register_remote_engine(b2.eng.desc().clone()).unwrap();
    assert_stale("the first engine's session", s1.write(0, 64, 64, a.eng.allocate_transfer_uid()).wait_for(T), &["replaced"]);
    let id = a.eng.allocate_transfer_uid();
    assert_stale("the first engine's descriptor", a.eng.write(&a.mem, 0, &b1.mem, 128, 64, id).wait_for(T), &["stale descriptor"]);
    let s2 = a.eng.create_session(&a.mem, &b2.mem).unwrap();
    s2.write(4096, 4096, 8192, a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
    assert_eq!(b1.buf, was1, "the first engine received nothing after the switch");
    assert_eq!(&b2.buf[4096..12288], &a.buf[4096..12288]);
    assert_eq!(&b2.buf[..4096], &was2[..4096], "the second engine got only its own session's bytes");
    // A descriptor of the second engine carrying the first one's epoch is refused too.
    let mut forged = b2.mem.clone();
    forged.engine_epoch = b1.mem.engine_epoch;
    let id = a.eng.allocate_transfer_uid();
    assert_stale("a forged epoch", a.eng.write(&a.mem, 0, &forged, 0, 64, id).wait_for(T), &["stale descriptor"]);
    // Deregistering the peer ends the second session as well.
    a.eng.deregister_remote_engine("target");
    assert_stale("after deregister_remote_engine", s2.write(0, 0, 64, a.eng.allocate_transfer_uid()).wait_for(T), &["deregistered"]);
}

/// A second transfer with the id of one still in flight is refused (the target would merge
/// their statuses); once the first finished, the id can be used again.
pub fn duplicate_in_flight_id_is_refused(cfg: &dyn Fn() -> BackendConfig) {
    let len = 64usize << 20;
    let (a, b) = pair(len, cfg);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    let one_shot = || a.eng.write(&a.mem, 0, &b.mem, 0, 64, 77);
    let on_session = || sess.write(0, 0, 64, 77);
    let seconds: [&dyn Fn() -> mori_io::TransferStatus; 2] = [&one_shot, &on_session];
    for (i, second) in seconds.into_iter().enumerate() {
        let first = a.eng.write(&a.mem, 0, &b.mem, 0, len as u64, 77);
        let dup = second();
        // 64 MiB take milliseconds on every rig here; the second post comes microseconds later.
        assert!(!first.is_done(), "case {i}: the 64 MiB write ended before the duplicate was posted");
        let r = dup.wait_for(T);
        first.wait_for(T).unwrap();
        let e = r.expect_err("duplicate id in flight");
        assert_eq!(e.code, ErrorCode::InvalidArgs, "case {i}: {e}");
        assert!(e.msg.contains("transfer id 77 to engine \"target\" is still in flight"), "case {i}: {e}");
        // Finished: the id is free again.
        sess.write(0, 0, 64, 77).wait_for(T).unwrap();
        assert_eq!(pop_eventually(&b, "init", 77), Some(Ok(())));
    }
    assert_eq!(&b.buf[..], &a.buf[..]);
}
