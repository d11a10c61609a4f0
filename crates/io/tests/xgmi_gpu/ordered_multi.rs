//! Ordered batches posted together on xgmi (`IoEngine::post_ordered_multi`, one process): the
//! batches to two peers share one ordered-copy kernel launch, each lands in full with its
//! tail word, and a batch with an entry out of range fails alone, naming the entry.

use super::*;

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn ordered_batches_to_two_peers_share_a_launch() {
    let rt = rt();
    let len = 4 * MIB;
    let a = gpu_side(&rt, "xgmi-om-a", vec![xgmi(32)], len, (0, len), 0x71);
    let b = gpu_side(&rt, "xgmi-om-b", vec![xgmi(32)], len, (0, len), 0x72);
    let c = gpu_side(&rt, "xgmi-om-c", vec![xgmi(32)], len, (0, len), 0x73);
    connect(&a, &b);
    connect(&a, &c);
    // Warm both paths (the first post to a region looks it up, off the caller's thread).
    wait("warm b", a.eng.write(&a.mem, 0, &b.mem, 0, 16, a.eng.allocate_transfer_uid()));
    wait("warm c", a.eng.write(&a.mem, 0, &c.mem, 0, 16, a.eng.allocate_transfer_uid()));
    let (b0, c0) = (snapshot(&rt, &b.buf), snapshot(&rt, &c.buf));
    // Per batch: a 1 MB segment (odd offsets) then a 16-byte tail word.
    let (lo1, ro1, sz1) = ([3u64, 3_000_000], [5u64, 3_500_000], [1_000_000u64, 16]);
    let (lo2, ro2, sz2) = ([1_100_000u64, 3_000_016], [7u64, 3_500_016], [1_200_001u64, 16]);
    let (lo3, ro3, sz3) = ([2_000_000u64, 3_000_032], [1_100_000u64, 3_500_032], [900_000u64, 16]);
    // Out of range at c: entry 1 runs past the end.
    let (lo4, ro4, sz4) = ([0u64, 16], [0u64, len as u64 - 8], [64u64, 16]);
    let ids: Vec<u64> = (0..4).map(|_| a.eng.allocate_transfer_uid()).collect();
    let batches = [
        mori_io::RegionBatch { local: &a.mem, local_offs: &lo1, remote: &b.mem, remote_offs: &ro1, sizes: &sz1, id: ids[0] },
        mori_io::RegionBatch { local: &a.mem, local_offs: &lo2, remote: &c.mem, remote_offs: &ro2, sizes: &sz2, id: ids[1] },
        mori_io::RegionBatch { local: &a.mem, local_offs: &lo4, remote: &c.mem, remote_offs: &ro4, sizes: &sz4, id: ids[2] },
        mori_io::RegionBatch { local: &a.mem, local_offs: &lo3, remote: &b.mem, remote_offs: &ro3, sizes: &sz3, id: ids[3] },
    ];
    let before = mori_gpu::submit_stats();
    let sts = a.eng.post_ordered_multi(mori_io::Op::Write, &batches);
    assert_eq!(sts.len(), 4, "one status per batch");
    let bad = sts[2].wait_for(T);
    expect_invalid("the batch out of range", bad, &[&format!("entry 1: remote range offset {} + length 16", len - 8)]);
    for (i, st) in sts.into_iter().enumerate().filter(|(i, _)| *i != 2) {
        wait(&format!("ordered batch {i}"), st);
    }
    let launches =
        check_launch_and_bytes(&rt, &before, &a, &[(&b, &b0, &[(&lo1, &ro1, &sz1), (&lo3, &ro3, &sz3)]), (&c, &c0, &[(&lo2, &ro2, &sz2)])]);
    eprintln!(
        "ordered multi-post: 3 batches to 2 peers in {launches} launch(es), every byte checked; the batch out of range refused alone"
    );
}

/// An ordered batch's entries: local offsets, remote offsets, sizes.
pub(super) type Entries<'a> = (&'a [u64], &'a [u64], &'a [u64]);

/// Asserts that the batches since `before` took one launch of the ordered-copy kernel (on by
/// default on CUDA, off on HIP, where it never ran; `MORI_GPU_POOL_ORDERED_KERNEL` overrides),
/// and that each target holds what it held (its snapshot) with its batches from `a` applied and
/// nothing else. Returns the launches.
pub(super) fn check_launch_and_bytes(
    rt: &Arc<dyn Runtime>,
    before: &mori_gpu::SubmitStats,
    a: &GpuSide,
    targets: &[(&GpuSide, &Vec<u8>, &[Entries<'_>])],
) -> u64 {
    let launches = mori_gpu::submit_stats().since(before).ordered_launches;
    let expect = match std::env::var(mori_gpu::ORDERED_ENV).ok().as_deref() {
        Some(v) => u64::from(v == "1"),
        None => u64::from(rt.kind() != RuntimeKind::Hip),
    };
    assert_eq!(launches, expect, "the good batches of two segments each: one launch of the ordered-copy kernel");
    for (t, snap, batches) in targets {
        let mut want = (*snap).clone();
        for (lo, ro, sz) in batches.iter() {
            apply(&mut want, ro, &a.init, lo, sz);
        }
        assert_bytes(&format!("{} after its batches (a refused one wrote nothing)", t.key()), &snapshot(rt, &t.buf), &want);
    }
    launches
}
