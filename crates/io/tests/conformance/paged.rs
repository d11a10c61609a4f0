//! Paged batches (block tables and per-side layouts) on a backend, checked byte for byte.

use super::*;
use mori_io::{PagedBatch, PagedLayout};

const BS: u64 = 1000;
const LAYERS: u32 = 3;
const HALVES: u32 = 2;
const POOL: u64 = 40;
/// Each side's buffer: a pool of [layer][half][POOL blocks] from the side's base, and a tail.
pub const PAGED_LEN: usize = 250_000;

/// splitmix64.
fn rand(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` distinct blocks of the pool in random order, with one run of 4 consecutive blocks.
fn table(n: usize, seed: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..POOL as u32).collect();
    let mut s = seed;
    for i in (1..p.len()).rev() {
        p.swap(i, (rand(&mut s) % (i as u64 + 1)) as usize);
    }
    // Blocks 30..34 back to back at entries 2..6 (on both sides when both tables do this).
    p.retain(|b| !(30..34).contains(b));
    p.truncate(n - 4);
    p.splice(2..2, 30..34);
    p
}

/// Every byte of `dst` equals what moving `batch` from `src` onto `before` gives.
fn check_moved(batch: &PagedBatch<'_>, src: &[u8], before: &[u8], dst: &[u8], src_lay: &PagedLayout, dst_lay: &PagedLayout) {
    let mut want = before.to_vec();
    let (sb, db) = if std::ptr::eq(src_lay, &batch.local) {
        (batch.local_blocks, batch.remote_blocks)
    } else {
        (batch.remote_blocks, batch.local_blocks)
    };
    for l in 0..LAYERS {
        for h in 0..HALVES {
            for (&x, &y) in sb.iter().zip(db) {
                let (so, d) = (src_lay.offset(l, h, x).unwrap() as usize, dst_lay.offset(l, h, y).unwrap() as usize);
                want[d..d + BS as usize].copy_from_slice(&src[so..so + BS as usize]);
            }
        }
    }
    if let Some(i) = (0..want.len()).find(|&i| want[i] != dst[i]) {
        panic!("byte {i} of the destination is {} but must be {} (every other byte checked too)", dst[i], want[i]);
    }
}

/// A paged write over a session and a paged read one-shot, each checked byte for byte; the
/// target learns of the write; a block past the region is refused naming it.
pub fn paged_write_then_read(cfg: &dyn Fn() -> BackendConfig, kind: mori_io::BackendKind) {
    let (a, b) = pair(PAGED_LEN, cfg);
    let local = PagedLayout::pool(0, BS, POOL, HALVES);
    let remote = PagedLayout::pool(64, BS, POOL, HALVES);
    let (lt, rt) = (table(12, 1), table(12, 2));
    let batch = PagedBatch { local_blocks: &lt, remote_blocks: &rt, block_size: BS, layers: LAYERS, halves: HALVES, local, remote };
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    assert_eq!(sess.backend(), kind);
    let before = b.buf.clone();
    let id = a.eng.allocate_transfer_uid();
    let st = sess.batch_write_paged(&batch, id);
    st.wait_for(T).unwrap();
    check_moved(&batch, &a.buf, &before, &b.buf, &batch.local, &batch.remote);
    assert_eq!(pop_eventually(&b, "init", id), Some(Ok(())));
    for k in 0..(LAYERS * HALVES * 12) as usize {
        assert_eq!(st.entry_landed(k), Some(true), "entry {k}");
    }

    // One-shot read of other blocks back into the initiator.
    let (lt2, rt2) = (table(9, 3), table(9, 4));
    let back = PagedBatch { local_blocks: &lt2, remote_blocks: &rt2, ..batch };
    let before = a.buf.clone();
    a.eng.batch_read_paged(&a.mem, &b.mem, &back, a.eng.allocate_transfer_uid()).wait_for(T).unwrap();
    check_moved(&back, &b.buf, &before, &a.buf, &back.remote, &back.local);

    // Block 200 of the last layer's V half starts at 64 + 2 * 80 000 + 40 000 + 200 * 1000, past the region.
    let mut far = rt.clone();
    far[3] = 200;
    let bad = PagedBatch { remote_blocks: &far, ..batch };
    let before = b.buf.clone();
    let e = sess.batch_write_paged(&bad, a.eng.allocate_transfer_uid()).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    assert!(
        e.msg.contains("remote block 200 (block table entry 3) at layer 2, half 1: range offset 400064 + length 1000 exceeds region"),
        "{e}"
    );
    let e = a.eng.batch_write_paged(&a.mem, &b.mem, &bad, a.eng.allocate_transfer_uid()).wait_for(T).unwrap_err();
    assert!(e.msg.contains("remote block 200"), "{e}");
    assert!(b.buf == before, "a refused batch must move nothing");
}
