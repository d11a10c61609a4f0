//! Signalled writes on the tcp backend with 8 lanes, every batch striped over them (64 bytes
//! per lane at least): 10 000 writes whose counters a checker on the target watches, then the
//! error cases.

mod conformance;

use conformance::*;
use mori_io::{BackendConfig, TcpConfig};
use std::time::Duration;

fn tcp8() -> BackendConfig {
    BackendConfig::Tcp(TcpConfig { lanes: 8, min_lane_bytes: 64, ..TcpConfig::default() })
}

#[test]
fn signalled_writes_tcp_8_lanes() {
    let n = 10_000;
    let (c, took) = signalled_writes(&tcp8, n, 512, Duration::from_secs(120));
    println!(
        "tcp, 8 lanes: {n} signalled writes in {:.3} s ({:.0} per s); checker verified {} ({} while writes were still being posted), {} mismatches",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        c.verified,
        c.verified_while_writing,
        c.mismatches
    );
    let plain = plain_writes(&tcp8, n, 512);
    println!(
        "tcp, 8 lanes: the same {n} writes without signals in {:.3} s ({:.0} per s)",
        plain.as_secs_f64(),
        n as f64 / plain.as_secs_f64()
    );
}

#[test]
fn signal_errors_tcp() {
    signal_errors(&tcp8, &["target engine refused", "exceeds region"]);
}

#[test]
fn planned_writes_stripe_and_stay_apart() {
    let (plan, bytes) = plan_writes(10_000);
    assert_eq!(plan.len(), 10_000);
    assert!(plan.iter().all(|p| (1..=8).contains(&p.sizes.len()) && p.sizes.iter().all(|&s| s > 0)));
    let totals: Vec<u64> = plan.iter().map(|p| p.sizes.iter().sum()).collect();
    assert_eq!(totals.iter().min(), Some(&1));
    assert_eq!(totals.iter().max(), Some(&65536));
    assert!(plan.windows(2).all(|w| w[0].slot.1 <= w[1].slot.0), "slots disjoint, in order");
    assert_eq!(plan.last().unwrap().slot.1 as usize, bytes);
    println!(
        "10 000 planned writes: {} bytes of data, {} entries",
        totals.iter().sum::<u64>(),
        plan.iter().map(|p| p.sizes.len()).sum::<usize>()
    );
}

/// The target closes an idle control connection; the next signal goes over a fresh one and is
/// applied exactly once (a `Signal` request is never sent twice).
#[test]
fn a_signal_after_the_target_closed_the_idle_connection_applies_once() {
    use mori_io::{EngineConfig, IoEngine, MemLoc, Signal, SignalOp};
    let idle = EngineConfig { idle_timeout: Duration::from_millis(150), ..EngineConfig::new("127.0.0.1", 0).unwrap() };
    let t = IoEngine::new("idle-target", idle).unwrap();
    let a = IoEngine::new("idle-init", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    t.create_backend(tcp8()).unwrap();
    a.create_backend(tcp8()).unwrap();
    a.register_remote_engine(t.desc().clone()).unwrap();
    let ctr = AlignedBuf::new(64);
    // SAFETY: `ctr` outlives the registration, removed before the end.
    let mem = unsafe { t.register_memory(ctr.as_mut_ptr(), ctr.len(), MemLoc::Host { numa: None }) }.unwrap();
    let add = || a.signal(&[Signal { remote: mem.clone(), offset: 8, op: SignalOp::Add(1) }]).wait_for(T);
    for round in 1..=3u64 {
        add().unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(t.load_counter(&mem, 8).unwrap(), round);
        std::thread::sleep(Duration::from_millis(400));
    }
    assert_eq!(t.wait_counter(&mem, 8, 3, Duration::ZERO).unwrap(), 3);
    t.deregister_memory(&mem).unwrap();
}

/// An ordered batch (`post_ordered`) on tcp, whose lanes land stripes in any order, is refused
/// before anything is written, naming the backend and the regions.
#[test]
fn an_ordered_batch_is_refused_by_tcp_before_anything_is_written() {
    let (a, b) = pair(1 << 16, &tcp8);
    let before = b.buf.clone();
    let batch = mori_io::RegionBatch {
        local: &a.mem,
        local_offs: &[0, 4096],
        remote: &b.mem,
        remote_offs: &[0, 4096],
        sizes: &[4096, 16],
        id: a.eng.allocate_transfer_uid(),
    };
    let e = a.eng.post_ordered(mori_io::Op::Write, &batch).wait_for(T).unwrap_err();
    assert_eq!(e.code, mori_io::ErrorCode::NotSupported, "{e}");
    assert!(e.msg.contains("the tcp backend") && e.msg.contains("in order"), "{}", e.msg);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(b.buf, before, "nothing was written");
}

/// Ordered batches posted together (`post_ordered_multi`) on tcp: one status per batch, each
/// refused on its own before anything is written (`NotSupported` naming the backend; a batch
/// out of range with its own `InvalidArgs` naming the entry).
#[test]
fn ordered_batches_posted_together_are_refused_each_by_tcp() {
    let (a, b) = pair(1 << 16, &tcp8);
    let before = b.buf.clone();
    let ids: Vec<u64> = (0..3).map(|_| a.eng.allocate_transfer_uid()).collect();
    let far = (1u64 << 16) - 8;
    let batches = [
        mori_io::RegionBatch {
            local: &a.mem,
            local_offs: &[0, 4096],
            remote: &b.mem,
            remote_offs: &[0, 4096],
            sizes: &[4096, 16],
            id: ids[0],
        },
        mori_io::RegionBatch { local: &a.mem, local_offs: &[0, 16], remote: &b.mem, remote_offs: &[0, far], sizes: &[64, 16], id: ids[1] },
        mori_io::RegionBatch { local: &a.mem, local_offs: &[8192], remote: &b.mem, remote_offs: &[8192], sizes: &[100], id: ids[2] },
    ];
    let sts = a.eng.post_ordered_multi(mori_io::Op::Write, &batches);
    assert_eq!(sts.len(), 3, "one status per batch");
    let errs: Vec<mori_io::IoError> = sts.into_iter().map(|s| s.wait_for(T).unwrap_err()).collect();
    for i in [0, 2] {
        assert_eq!(errs[i].code, mori_io::ErrorCode::NotSupported, "batch {i}: {}", errs[i]);
        assert!(errs[i].msg.contains("the tcp backend") && errs[i].msg.contains("in order"), "batch {i}: {}", errs[i].msg);
    }
    assert_eq!(errs[1].code, mori_io::ErrorCode::InvalidArgs, "{}", errs[1]);
    assert!(errs[1].msg.contains(&format!("entry 1: remote range offset {far} + length 16")), "{}", errs[1].msg);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(b.buf, before, "nothing was written");
}

/// Ordered batches over a tcp session (`Session::post_ordered_many`): the session says it posts
/// none (`posts_ordered`), and each batch is refused on its own before anything is written
/// (`NotSupported` naming the backend and the one-shot call to use).
#[test]
fn ordered_batches_over_a_tcp_session_are_refused_each() {
    let (a, b) = pair(1 << 16, &tcp8);
    let before = b.buf.clone();
    let s = a.eng.create_session(&a.mem, &b.mem).unwrap();
    assert!(!s.posts_ordered(), "tcp sessions post no ordered batch");
    let ids: Vec<u64> = (0..2).map(|_| a.eng.allocate_transfer_uid()).collect();
    let batches = [
        mori_io::SessionBatch { session: &s, local_offs: &[0, 4096], remote_offs: &[0, 4096], sizes: &[4096, 16], words: &[], id: ids[0] },
        mori_io::SessionBatch { session: &s, local_offs: &[8192], remote_offs: &[8192], sizes: &[100], words: &[], id: ids[1] },
    ];
    let sts = mori_io::Session::post_ordered_many(mori_io::Op::Write, &batches);
    assert_eq!(sts.len(), 2, "one status per batch");
    for (i, st) in sts.into_iter().enumerate() {
        let e = st.wait_for(T).unwrap_err();
        assert_eq!(e.code, mori_io::ErrorCode::NotSupported, "batch {i}: {e}");
        assert!(e.msg.contains("its tcp backend") && e.msg.contains("IoEngine::post_ordered"), "batch {i}: {}", e.msg);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(b.buf, before, "nothing was written");
}
