//! Ordered batches over sessions on xgmi (`Session::post_ordered_many`, one process): batches
//! over two sessions share one ordered-copy kernel launch, each lands in full with its tail
//! word, a batch with an entry out of range fails alone naming the entry, a second batch under
//! an id in flight is refused, and a session whose local region was deregistered fails with `NotFound`;
//! batches with tail words land their segments and their words (a word out of range and a
//! read with words are refused; that the words land after the bytes, as seen by a polling
//! kernel, is what the inter-node EP GPU tests rely on).

use super::ordered_multi::{check_launch_and_bytes, Entries};
use super::*;
use mori_io::{Session, SessionBatch};

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn ordered_batches_over_two_sessions_share_a_launch() {
    let rt = rt();
    let len = 4 * MIB;
    let a = gpu_side(&rt, "xgmi-os-a", vec![xgmi(32)], len, (0, len), 0x81);
    let b = gpu_side(&rt, "xgmi-os-b", vec![xgmi(32)], len, (0, len), 0x82);
    let c = gpu_side(&rt, "xgmi-os-c", vec![xgmi(32)], len, (0, len), 0x83);
    connect(&a, &b);
    connect(&a, &c);
    let (sb, sc) = (a.eng.create_session(&a.mem, &b.mem).unwrap(), a.eng.create_session(&a.mem, &c.mem).unwrap());
    assert!(sb.posts_ordered() && sc.posts_ordered(), "xgmi sessions post ordered batches");
    let (b0, c0) = (snapshot(&rt, &b.buf), snapshot(&rt, &c.buf));
    // Per batch: a segment of about 1 MB (odd offsets) then a 16-byte tail word; the second
    // batch's entries are contiguous on both sides (kept as two segments; the bytes are the same
    // either way).
    let (lo1, ro1, sz1) = ([3u64, 3_000_000], [5u64, 3_500_000], [1_000_000u64, 16]);
    let (lo2, ro2, sz2) = ([1_100_000u64, 2_300_001], [7u64, 1_200_008], [1_200_001u64, 16]);
    let (lo3, ro3, sz3) = ([2_000_000u64, 3_000_032], [1_100_000u64, 3_500_032], [900_000u64, 16]);
    // Out of range at c: entry 1 runs past the end.
    let (lo4, ro4, sz4) = ([0u64, 16], [0u64, len as u64 - 8], [64u64, 16]);
    let ids: Vec<u64> = (0..4).map(|_| a.eng.allocate_transfer_uid()).collect();
    let sbatch = |session, local_offs, remote_offs, sizes, id| SessionBatch { session, local_offs, remote_offs, sizes, words: &[], id };
    let batches = [
        sbatch(&sb, &lo1[..], &ro1[..], &sz1[..], ids[0]),
        sbatch(&sc, &lo2[..], &ro2[..], &sz2[..], ids[1]),
        sbatch(&sc, &lo4[..], &ro4[..], &sz4[..], ids[2]),
        sbatch(&sb, &lo3[..], &ro3[..], &sz3[..], ids[3]),
        // The first batch's id again, in the same call: refused, nothing queued for it.
        sbatch(&sb, &lo3[..], &ro1[..], &sz1[..], ids[0]),
    ];
    let before = mori_gpu::submit_stats();
    let sts = Session::post_ordered_many(mori_io::Op::Write, &batches);
    assert_eq!(sts.len(), 5, "one status per batch");
    let bad = sts[2].wait_for(T);
    expect_invalid("the batch out of range", bad, &[&format!("entry 1: remote range offset {} + length 16", len - 8)]);
    expect_invalid("the reused id", sts[4].wait_for(T), &[&format!("transfer id {} to engine", ids[0]), "is still in flight"]);
    for (i, st) in sts.into_iter().enumerate().take(4).filter(|(i, _)| *i != 2) {
        wait(&format!("ordered batch {i}"), st);
    }
    let to_b: [Entries<'_>; 2] = [(&lo1, &ro1, &sz1), (&lo3, &ro3, &sz3)];
    let launches = check_launch_and_bytes(&rt, &before, &a, &[(&b, &b0, &to_b), (&c, &c0, &[(&lo2, &ro2, &sz2)])]);
    let b1 = snapshot(&rt, &b.buf);

    // The local region deregistered: the route notices, the batch fails as NotFound and
    // writes nothing.
    a.eng.deregister_memory(&a.mem).unwrap();
    let e = sb.post_ordered(mori_io::Op::Write, &lo1, &ro1, &sz1, a.eng.allocate_transfer_uid()).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    assert!(e.msg.contains("not xgmi-registered"), "{e}");
    assert_bytes("b after the refused batch", &snapshot(&rt, &b.buf), &b1);
    eprintln!("ordered sessions: 3 batches over 2 sessions in {launches} launch(es), every byte checked; the batch out of range refused alone; {e}");
}

/// `b`'s u64 at byte `off`.
fn word_at(bytes: &[u8], off: u64) -> u64 {
    u64::from_le_bytes(bytes[off as usize..off as usize + 8].try_into().unwrap())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn ordered_batches_with_tail_words_land_segments_and_words() {
    use mori_io::TailWord;
    let rt = rt();
    let len = 4 * MIB;
    let a = gpu_side(&rt, "xgmi-tw-a", vec![xgmi(32)], len, (0, len), 0x91);
    let b = gpu_side(&rt, "xgmi-tw-b", vec![xgmi(32)], len, (0, len), 0x92);
    let c = gpu_side(&rt, "xgmi-tw-c", vec![xgmi(32)], len, (0, len), 0x93);
    connect(&a, &b);
    connect(&a, &c);
    let (sb, sc) = (a.eng.create_session(&a.mem, &b.mem).unwrap(), a.eng.create_session(&a.mem, &c.mem).unwrap());
    assert!(sb.posts_tail_words() && sc.posts_tail_words(), "xgmi sessions store tail words");
    let (b0, c0) = (snapshot(&rt, &b.buf), snapshot(&rt, &c.buf));
    // A segment and a counter pair (count, count + 1) per batch, as the EP proxy posts them.
    let (lo1, ro1, sz1) = ([3u64], [5u64], [1_000_000u64]);
    let (lo2, ro2, sz2) = ([1_100_000u64], [7u64], [1_200_001u64]);
    let pair = |at: u64, count: u64| [TailWord { offset: at, value: count }, TailWord { offset: at + 8, value: count + 1 }];
    let (w1, w2) = (pair(3_500_000, 41), pair(3_600_000, 7));
    let out_of_range = [TailWord { offset: len as u64 - 4, value: 1 }];
    let ids: Vec<u64> = (0..3).map(|_| a.eng.allocate_transfer_uid()).collect();
    let sbatch = |session, local_offs, remote_offs, sizes, words, id| SessionBatch { session, local_offs, remote_offs, sizes, words, id };
    let batches = [
        sbatch(&sb, &lo1[..], &ro1[..], &sz1[..], &w1[..], ids[0]),
        sbatch(&sc, &lo2[..], &ro2[..], &sz2[..], &w2[..], ids[1]),
        sbatch(&sc, &lo1[..], &ro1[..], &sz1[..], &out_of_range[..], ids[2]),
    ];
    let sts = Session::post_ordered_many(mori_io::Op::Write, &batches);
    expect_invalid("the word out of range", sts[2].wait_for(T), &[&format!("tail word 0: offset {}", len - 4)]);
    for (i, st) in sts.into_iter().enumerate().take(2) {
        wait(&format!("batch {i} with tail words"), st);
    }
    let src = snapshot(&rt, &a.buf);
    for (side, before, (lo, ro, sz), words) in [(&b, &b0, (lo1, ro1, sz1), &w1), (&c, &c0, (lo2, ro2, sz2), &w2)] {
        let mut want = before.clone();
        want[ro[0] as usize..(ro[0] + sz[0]) as usize].copy_from_slice(&src[lo[0] as usize..(lo[0] + sz[0]) as usize]);
        for w in words {
            want[w.offset as usize..w.offset as usize + 8].copy_from_slice(&w.value.to_le_bytes());
        }
        let got = snapshot(&rt, &side.buf);
        assert_eq!((word_at(&got, words[0].offset), word_at(&got, words[1].offset)), (words[0].value, words[1].value), "the counter pair");
        assert_bytes("a segment with its tail words", &got, &want);
    }
    // A read with tail words is refused, naming why; nothing is written.
    let b1 = snapshot(&rt, &b.buf);
    let rd = [sbatch(&sb, &lo1[..], &ro1[..], &sz1[..], &w1[..], a.eng.allocate_transfer_uid())];
    let e = Session::post_ordered_many(mori_io::Op::Read, &rd).pop().unwrap().wait_for(T);
    expect_invalid("tail words on a read", e, &["tail words go with writes only"]);
    assert_bytes("b after the refused read", &snapshot(&rt, &b.buf), &b1);
    eprintln!("tail words: 2 batches over 2 sessions, segments and counter pairs checked; out-of-range word and read refused");
}
