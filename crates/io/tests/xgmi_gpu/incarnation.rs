//! Engine incarnations on xgmi (GPU memory, one process): descriptors and sessions of a peer
//! that restarted or was replaced under the same key are refused, and a transfer id still in
//! flight cannot be used twice. The same cases run on tcp and rdma through the conformance
//! suite (`tests/conformance`).

use super::*;

fn expect_stale(what: &str, r: Result<(), IoError>, words: &[&str]) -> String {
    expect_code(what, r, ErrorCode::RemoteDisconnect, words)
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn restarted_or_replaced_peers_never_receive_stale_writes() {
    let rt = rt();
    let len = MIB;
    let a = gpu_side(&rt, "xgmi-inc-a", vec![xgmi(32)], len, (0, len), 0x1a);
    let b1 = gpu_side(&rt, "xgmi-inc-b", vec![xgmi(32)], len, (0, len), 0x1b);
    connect(&a, &b1);
    let old_sess = a.eng.create_session(&a.mem, &b1.mem).unwrap();
    old_sess.write(0, 0, 4096, a.eng.allocate_transfer_uid()).spin_for(T).unwrap();
    let mut want_b1 = b1.init.clone();
    apply(&mut want_b1, &[0], &a.init, &[0], &[4096]);

    // Case 7: a second live engine takes the key; nothing sent afterwards reaches the first.
    let b2 = gpu_side(&rt, "xgmi-inc-b", vec![xgmi(32)], len, (0, len), 0x2b);
    assert_eq!(b2.mem.id, b1.mem.id, "region ids restart with each engine");
    a.eng.register_remote_engine(b2.eng.desc().clone()).unwrap();
    let m1 = expect_stale("old session after the key moved", old_sess.write(0, 0, 4096, 9001).spin_for(T), &["replaced"]);
    let m2 = expect_stale(
        "one-shot through the first engine's descriptor",
        a.eng.write(&a.mem, 0, &b1.mem, 0, 4096, 9002).spin_for(T),
        &["stale descriptor"],
    );
    let new_sess = a.eng.create_session(&a.mem, &b2.mem).unwrap();
    new_sess.write(8192, 8192, 4096, a.eng.allocate_transfer_uid()).spin_for(T).unwrap();
    let mut want_b2 = b2.init.clone();
    apply(&mut want_b2, &[8192], &a.init, &[8192], &[4096]);
    assert_bytes("first engine after the key moved", &snapshot(&rt, &b1.buf), &want_b1);
    assert_bytes("second engine", &snapshot(&rt, &b2.buf), &want_b2);

    // Case 1: the first engine is gone for good (dropped); its descriptor stays stale, even
    // though its region id names a live region of the second.
    let old_mem = b1.mem.clone();
    drop(b1);
    expect_stale(
        "session against a dropped engine's descriptor",
        a.eng.create_session(&a.mem, &old_mem).map(|_| ()),
        &["stale descriptor"],
    );
    expect_stale("read through it", a.eng.read(&a.mem, 0, &old_mem, 0, 64, 9003).spin_for(T), &["stale descriptor"]);
    assert_bytes("second engine untouched by stale calls", &snapshot(&rt, &b2.buf), &want_b2);

    // A transfer id still in flight is refused; once finished it is free again.
    let big = 512 * MIB;
    let c = gpu_side(&rt, "xgmi-inc-c", vec![xgmi(32)], big, (0, big), 0x3c);
    let d = gpu_side(&rt, "xgmi-inc-d", vec![xgmi(32)], big, (0, big), 0x4d);
    connect(&c, &d);
    let sess = c.eng.create_session(&c.mem, &d.mem).unwrap();
    // The refusal itself shows that the first was still in flight when the duplicate was
    // posted. On a GPU 512 MiB take about 0.2 ms and the duplicate comes microseconds later;
    // the stand-in driver copies inside the driver calls, so its completion thread can finish
    // the first write before the second post: then both land (drained here) and it tries again
    // with the next id, 5 times at most.
    let mut refused = None;
    for id in 77..82u64 {
        let first = sess.write(0, 0, big as u64, id);
        let dup = sess.write(0, 0, 64, id).spin_for(T);
        wait("the 512 MiB write", first);
        if dup.is_ok() {
            // Both landed; the target keeps one status per id (the second may replace the first).
            assert_eq!(pop_inbound(&d.eng, c.key(), id, INBOUND_WAIT), Some(Ok(())), "id {id}: the writes notified");
            let _ = pop_inbound(&d.eng, c.key(), id, Duration::from_millis(20));
            continue;
        }
        let words = format!("transfer id {id} to engine \"xgmi-inc-d\" is still in flight");
        let m = expect_invalid("duplicate id in flight", dup, &[&words]);
        sess.write(0, 0, 64, id).spin_for(T).unwrap();
        assert_eq!(pop_inbound(&d.eng, c.key(), id, INBOUND_WAIT), Some(Ok(())));
        refused = Some(m);
        break;
    }
    let m3 = refused.expect("in 5 tries the 512 MiB write always ended before the duplicate was posted");
    eprintln!("incarnations on xgmi: moved key: {m1}; stale one-shot: {m2}; duplicate id: {m3}");
}
