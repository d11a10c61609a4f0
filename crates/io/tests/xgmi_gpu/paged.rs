//! Paged batches on xgmi (GPU memory, one process): the block table goes to the GPU whole
//! (one paged-copy kernel), checked byte for byte against the host reference for reads and
//! writes, sessions and one-shot calls, odd and KV-sized blocks, with and without runs; a
//! block past what the owner registered is refused naming it before anything is queued.
//! The host-memory counterpart (tcp, rdma) is tests/conformance/paged.rs.

use super::*;
use mori_io::{PagedBatch, PagedLayout};

/// `n` distinct blocks of `0..pool` in random order; with `run`, entries 1..5 are 4 blocks
/// back to back (from pool - 4), so both sides' tables merge there.
fn table(rng: &mut Rng, n: usize, pool: u32, run: bool) -> Vec<u32> {
    let mut p: Vec<u32> = (0..pool).collect();
    for i in (1..p.len()).rev() {
        p.swap(i, rng.range(0, i as u64) as usize);
    }
    if run {
        p.retain(|&b| b < pool - 4);
        p.truncate(n - 4);
        p.splice(1..1, pool - 4..pool);
    } else {
        p.truncate(n);
    }
    p
}

/// The batch as (destination offsets, source offsets, sizes) for `apply`.
fn offsets(b: &PagedBatch<'_>, write: bool) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let (mut d, mut s, mut n) = (Vec::new(), Vec::new(), Vec::new());
    for l in 0..b.layers {
        for h in 0..b.halves {
            for (&x, &y) in b.local_blocks.iter().zip(b.remote_blocks) {
                let (lo, ro) = (b.local.offset(l, h, x).unwrap(), b.remote.offset(l, h, y).unwrap());
                let (dd, ss) = if write { (ro, lo) } else { (lo, ro) };
                d.push(dd);
                s.push(ss);
                n.push(b.block_size);
            }
        }
    }
    (d, s, n)
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn paged_batches_go_to_the_gpu_whole_and_are_exact() {
    let rt = rt();
    let mut rng = Rng(18);
    // (block size, layers, halves, pool blocks, table length, run)
    let shapes = [(4100u64, 3u32, 2u32, 40u32, 24usize, true), (32 << 10, 4, 2, 48, 32, false), (4096, 2, 1, 300, 256, true)];
    for (k, &(bs, layers, halves, pool, n, run)) in shapes.iter().enumerate() {
        let local = PagedLayout::pool(0, bs, u64::from(pool), halves);
        let remote = PagedLayout::pool(4096 + 8, bs, u64::from(pool), halves);
        let len = (4096 + 8 + u64::from(layers) * remote.layer_stride + 4096) as usize;
        let a = gpu_side(&rt, &format!("xgmi-paged-a{k}"), vec![xgmi(32)], len, (0, len), 0x31 + k as u8);
        let b = gpu_side(&rt, &format!("xgmi-paged-b{k}"), vec![xgmi(32)], len, (0, len), 0x41 + k as u8);
        connect(&a, &b);
        let (lt, rt_) = (table(&mut rng, n, pool, run), table(&mut rng, n, pool, run));
        let batch = PagedBatch { local_blocks: &lt, remote_blocks: &rt_, block_size: bs, layers, halves, local, remote };
        // Session write.
        let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
        let t = wait("paged session write", sess.batch_write_paged(&batch, a.eng.allocate_transfer_uid()));
        let mut want_b = b.init.clone();
        let (d, s, sz) = offsets(&batch, true);
        apply(&mut want_b, &d, &a.init, &s, &sz);
        assert_bytes(&format!("shape {k}: paged session write"), &snapshot(&rt, &b.buf), &want_b);
        // One-shot read of other blocks.
        let (lt2, rt2) = (table(&mut rng, n, pool, !run), table(&mut rng, n, pool, !run));
        let back = PagedBatch { local_blocks: &lt2, remote_blocks: &rt2, ..batch };
        let st = a.eng.batch_read_paged(&a.mem, &b.mem, &back, a.eng.allocate_transfer_uid());
        wait("paged one-shot read", st.clone());
        assert_eq!(st.failed_entries(), Some(vec![]));
        let mut want_a = a.init.clone();
        let (d, s, sz) = offsets(&back, false);
        apply(&mut want_a, &d, &want_b, &s, &sz);
        assert_bytes(&format!("shape {k}: paged one-shot read"), &snapshot(&rt, &a.buf), &want_a);
        eprintln!("xgmi paged shape {k}: {n} blocks x {layers} layers x {halves} halves of {bs} B: session write {t:?}");
    }

    // The owner registered less than the descriptor claims: only its lookup tells.
    let bs = 4096u64;
    let lay = PagedLayout::pool(0, bs, 16, 2);
    let len = (2 * lay.layer_stride) as usize;
    let a = gpu_side(&rt, "xgmi-paged-fa", vec![xgmi(32)], len, (0, len), 0x51);
    let b = gpu_side(&rt, "xgmi-paged-fb", vec![xgmi(32)], len, (0, len - 4096), 0x52);
    connect(&a, &b);
    let mut forged = b.mem.clone();
    forged.len = len as u64;
    let (lt, rt_) = ([0u32, 1, 2], [3u32, 15, 4]);
    let bad = PagedBatch { local_blocks: &lt, remote_blocks: &rt_, block_size: bs, layers: 2, halves: 2, local: lay, remote: lay };
    let r = a.eng.batch_write_paged(&a.mem, &forged, &bad, a.eng.allocate_transfer_uid()).spin_for(T);
    let m = expect_invalid(
        "paged block past the owner's registration",
        r,
        &["remote block 15 (block table entry 1) at layer 1, half 1", &format!("exceeds region {} of {} bytes", b.mem.id, len - 4096)],
    );
    assert_bytes("nothing queued for a refused paged batch", &snapshot(&rt, &b.buf), &b.init);
    eprintln!("xgmi paged refusal: {m}");
}
