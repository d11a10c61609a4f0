//! Batch outcomes and posting on xgmi (GPU memory, one process): a batch naming an entry past
//! what the owner registered is refused naming that entry before anything is queued, a good
//! batch reports every entry landed, and the first post to a new region (its IPC lookup)
//! runs off the caller's thread. The tcp and rdma counterparts are in tests/batch_outcomes.rs
//! and tests/rdma_faults.rs.

use super::*;

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn batch_errors_name_the_entry_and_outcomes_are_per_entry() {
    let rt = rt();
    let len = MIB;
    let a = gpu_side(&rt, "xgmi-out-a", vec![xgmi(32)], len, (0, len), 0x5a);
    let b = gpu_side(&rt, "xgmi-out-b", vec![xgmi(32)], len, (0, len), 0x5b);
    connect(&a, &b);
    // Entries 0..3 valid and apart; entry 3 past the end of what b registered (the descriptor
    // claims 64 KiB more: only the owner's lookup tells).
    let mut forged = b.mem.clone();
    forged.len += 64 * 1024;
    let lo = [0u64, 8192, 16384, 24576];
    let ro = [0u64, 8192, 16384, len as u64];
    let sizes = [4096u64; 4];
    let t = std::time::Instant::now();
    let st = a.eng.batch_write(&a.mem, &lo, &forged, &ro, &sizes, a.eng.allocate_transfer_uid());
    let posted = t.elapsed();
    let m = expect_invalid("batch with entry 3 past the region", st.spin_for(T), &["batch entry 3: remote range"]);
    assert_eq!(st.entry_landed(3), Some(false));
    assert_bytes("nothing queued for a refused batch", &snapshot(&rt, &b.buf), &b.init);
    // The good batch: every entry landed.
    let st = a.eng.batch_write(&a.mem, &lo[..3], &b.mem, &ro[..3], &sizes[..3], a.eng.allocate_transfer_uid());
    wait("the good batch", st.clone());
    assert_eq!(st.failed_entries(), Some(vec![]));
    assert!((0..3).all(|i| st.entry_landed(i) == Some(true)));
    let mut want = b.init.clone();
    apply(&mut want, &ro[..3], &a.init, &lo[..3], &sizes[..3]);
    assert_bytes("good batch", &snapshot(&rt, &b.buf), &want);
    eprintln!("xgmi batch outcomes: {m}; first post returned after {posted:?}");
}
