//! A batch whose entry only the target can refuse (tcp, 4 lanes): the status ends only when
//! every lane finished, the error names the caller's entry and range, and per-entry outcomes
//! say exactly which entries landed.

use mori_io::{BackendConfig, EngineConfig, ErrorCode, IoEngine, MemLoc, TcpConfig};
use std::time::Duration;

const S: usize = 4 << 20;

fn engine(key: &str) -> IoEngine {
    let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 4, ..TcpConfig::default() })).unwrap();
    e
}

fn pattern(i: usize) -> u8 {
    (i % 251) as u8 | 1
}

#[test]
#[allow(clippy::single_range_in_vec_init)] // a list of one entry range
fn a_batch_refused_at_the_target_ends_with_its_last_lane_and_names_the_entry() {
    let (a, b) = (engine("A-outcome"), engine("B-outcome"));
    // Target: 8 entries of 4 MiB and nothing more. Initiator: entry 0 (4 KiB) then 8 × 4 MiB.
    let real = 8 * S;
    let mut dst = vec![0u8; real];
    let mut src: Vec<u8> = (0..4096 + 8 * S).map(pattern).collect();
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), real, MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    // A descriptor claiming 4 KiB more than the target registered: only the target can tell
    // that entry 0 (remote offset `real`) is outside its region.
    let mut forged = md.clone();
    forged.len = (real + 4096) as u64;
    let mut lo = vec![0u64];
    let mut ro = vec![real as u64];
    let mut sz = vec![4096u64];
    for i in 0..8 {
        lo.push((4096 + i * S) as u64);
        ro.push((i * S) as u64);
        sz.push(S as u64);
    }
    let st = a.batch_write(&ms, &lo, &forged, &ro, &sz, 1);
    let e = st.wait_for(Duration::from_secs(60)).unwrap_err();
    // No byte may move once the status is terminal.
    let at_end = dst.clone();
    std::thread::sleep(Duration::from_millis(300));
    assert!(dst == at_end, "bytes landed after the status turned terminal");

    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    assert!(
        e.msg.contains(&format!("batch entry 0 (the part of it in this request: local offset 0, remote offset {real}, 4096 bytes)")),
        "{e}"
    );
    assert!(e.msg.contains("target engine refused"), "{e}");

    // Stream bytes: entry 0 is [0, 4 KiB), entry i is [4 KiB + (i-1)·S, 4 KiB + i·S). Four
    // near-equal lane shares of 4 KiB + 8·S: the first, [0, 1 KiB + 2·S), holds all of entry 0,
    // entry 1 and part of entry 2; the target refused that request whole. The other three
    // shares landed.
    let failed = st.failed_entries().unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].entries, Some(vec![0..3]));
    let landed: Vec<bool> = (0..9).map(|i| st.entry_landed(i).unwrap()).collect();
    assert_eq!(landed, [false, false, false, true, true, true, true, true, true]);
    for i in 3..9 {
        let (l, r) = (lo[i] as usize, ro[i] as usize);
        assert!(dst[r..r + S] == src[l..l + S], "entry {i} is reported landed: its bytes must be there");
    }
    assert!(dst[..S].iter().all(|&x| x == 0), "entry 1 was refused with entry 0: none of it may land");
    a.deregister_memory(&ms).unwrap();
    b.deregister_memory(&md).unwrap();
    drop(src);
}

#[test]
fn a_batch_that_succeeds_reports_every_entry_landed() {
    let (a, b) = (engine("A-outcome-ok"), engine("B-outcome-ok"));
    let mut src: Vec<u8> = (0..1 << 20).map(pattern).collect();
    let mut dst = vec![0u8; 1 << 20];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), dst.len(), MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    let offs: Vec<u64> = (0..16).map(|i| i * 65536).collect();
    let st = a.batch_write(&ms, &offs, &md, &offs, &[65536; 16], 1);
    st.wait_for(Duration::from_secs(30)).unwrap();
    assert_eq!(st.failed_entries(), Some(vec![]));
    assert!((0..16).all(|i| st.entry_landed(i) == Some(true)));
    assert!(dst == src);
    a.deregister_memory(&ms).unwrap();
    b.deregister_memory(&md).unwrap();
    drop(src);
}

#[test]
fn a_batch_of_only_empty_entries_reaches_the_target() {
    let (a, b) = (engine("A-outcome-empty"), engine("B-outcome-empty"));
    let mut src = vec![1u8; 64];
    let mut dst = vec![0u8; 64];
    let ms = unsafe { a.register_memory(src.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    let md = unsafe { b.register_memory(dst.as_mut_ptr(), 64, MemLoc::Host { numa: None }) }.unwrap();
    a.register_remote_engine(b.desc().clone()).unwrap();
    a.batch_write(&ms, &[0, 8], &md, &[0, 8], &[0, 0], 5).wait_for(Duration::from_secs(10)).unwrap();
    let t = std::time::Instant::now();
    let got = loop {
        if let Some(r) = b.pop_inbound_status(a.desc().key.as_str(), 5) {
            break Some(r);
        }
        if t.elapsed() > Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(got, Some(Ok(())), "the target never saw the empty batch");
    assert!(dst.iter().all(|&x| x == 0));
    a.deregister_memory(&ms).unwrap();
    b.deregister_memory(&md).unwrap();
    drop(src);
}
