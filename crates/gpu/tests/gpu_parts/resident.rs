//! The copy pool's resident copier on the GPU.

use super::ordered::{groups_wait, ordered_all_wait, ordered_wait};
use super::*;

/// The resident copier's tests pin their own pool configurations: the variables that would
/// override them must be unset.
fn resident_env_clear() -> R {
    for v in [mori_gpu::RESIDENT_ENV, mori_gpu::FLAGS_ENV, mori_gpu::ORDERED_ENV, mori_gpu::ARMED_ENV] {
        if std::env::var_os(v).is_some() {
            return fail(format!("unset {v} for the resident copier's tests: they pin the pool's paths and count its posts"));
        }
    }
    Ok(())
}

/// The resident copier (`CopyPoolConfig::resident_blocks`): ordered batches posted one at a
/// time, several in flight at once, and several in one post, all run by one grid launched by
/// the first post (no launch per batch); the grid exits once idle, memory is then freed while
/// the pool lives, and the next post launches a new grid that starts where the old one
/// stopped. Every byte checked, and nothing written outside the segments.
#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_resident_copier_runs_each_batch_with_no_launch_when_posted() -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg};
    resident_env_clear()?;
    let rt = rt()?;
    let what = "resident copier";
    let len = 4usize << 20;
    let a = rt.alloc(DEV, len)?;
    let b = rt.alloc(DEV, len)?;
    // Freed while the pool lives, once its grid exited.
    let spare = rt.alloc(DEV, 4096)?;
    // 24 blocks: one, two, three or four groups a post. An idle wait well over a round of
    // this test (about 0.25 s for the debug build's checks against the stand-in driver on two
    // busy cores); the longest gap between posts is measured, and one grid is expected only
    // when no gap reached it.
    let idle = Duration::from_secs(3);
    let cfg = CopyPoolConfig {
        num_events: 32,
        ordered_kernel: Some(true),
        resident_blocks: 24,
        resident_idle: idle,
        ..CopyPoolConfig::default()
    };
    let pool = CopyPool::new(rt.clone(), cfg, "test-resident")?;
    let quarter = (len / 4) as u64;
    // A batch: most of a quarter, then a 16-byte pair from the quarter's end.
    let pair = |g: u64| {
        vec![
            CopySeg { src: a.ptr() + g * quarter + 3, dst: b.ptr() + g * quarter + 8, len: quarter - 4096 - g * 777 },
            CopySeg { src: a.ptr() + g * quarter + quarter - 64, dst: b.ptr() + g * quarter + quarter - 32, len: 16 },
        ]
    };
    let verify = |name: &str, seed: u8, batches: &[u64]| -> R {
        let mut back = vec![0u8; len];
        rt.copy_dtoh(&mut back, &b.slice())?;
        let mut covered = vec![false; len];
        for &g in batches {
            for sg in pair(g) {
                let (so, d) = ((sg.src - a.ptr()) as usize, (sg.dst - b.ptr()) as usize);
                check(&format!("{what}: {name}, batch {g}, segment at {d}"), &back[d..d + sg.len as usize], |i| pat(i + so, seed))?;
                covered[d..d + sg.len as usize].iter_mut().for_each(|c| *c = true);
            }
        }
        if back.iter().zip(&covered).any(|(&x, &c)| !c && x != 0) {
            return fail(format!("{what}: {name}: bytes written outside the batches"));
        }
        Ok(())
    };
    let s0 = mori_gpu::submit_stats();
    let (mut last_post, mut gap) = (Instant::now(), Duration::ZERO);
    for k in 0..20u8 {
        rt.copy_htod(&a.slice(), &pattern(len, k))?;
        rt.memset(&b.slice(), 0)?;
        gap = gap.max(last_post.elapsed());
        // SAFETY: inside `a` and `b`, which outlive the wait.
        unsafe { ordered_wait(&pool, what, pair(u64::from(k % 4))) }?;
        last_post = Instant::now();
        verify(&format!("one at a time, round {k}"), k, &[u64::from(k % 4)])?;
    }
    // Four posted back to back (in flight together), then four in one post (four groups).
    rt.copy_htod(&a.slice(), &pattern(len, 90))?;
    rt.memset(&b.slice(), 0)?;
    // SAFETY: inside `a` and `b`, which outlive the wait.
    unsafe { ordered_all_wait(&pool, what, (0..4).map(pair).collect()) }?;
    verify("four back to back", 90, &[0, 1, 2, 3])?;
    rt.copy_htod(&a.slice(), &pattern(len, 91))?;
    rt.memset(&b.slice(), 0)?;
    let groups: Vec<Vec<CopySeg>> = (0..4).map(pair).collect();
    let refs: Vec<&[CopySeg]> = groups.iter().map(|g| g.as_slice()).collect();
    gap = gap.max(last_post.elapsed());
    // SAFETY: as above.
    unsafe { groups_wait(&pool, what, &refs) }?;
    verify("four in one post", 91, &[0, 1, 2, 3])?;
    let st = mori_gpu::submit_stats().since(&s0);
    let grids_ok = if gap < idle { st.resident_launches == 1 } else { (1..=25).contains(&st.resident_launches) };
    if (st.ordered_launches, st.resident_posts) != (0, 25) || !grids_ok {
        return fail(format!(
            "{what}: {} launches, {} resident posts and {} resident grids for 25 posts (longest gap between posts {gap:?}, idle wait {idle:?}), expected 0, 25 and 1",
            st.ordered_launches, st.resident_posts, st.resident_launches
        ));
    }
    // Every table's three stamps written, in order, before its flag.
    let (relay, run, done) = st.resident_mean_us();
    println!("{what}: per table, µs: {relay:.2} relaying it, {run:.2} running it (GPU clock), {done:.2} from the post to its completion seen (host clock)");
    if st.resident_timed != 25 || st.resident_done_ns == 0 {
        return fail(format!("{what}: {} of 25 tables timed by their stamps (post to done {done:.2} µs), expected all", st.resident_timed));
    }
    // Stopped by disarm (as IoEngine::quiesce does), the grid is gone well before its idle
    // wait: memory is freed at once, and the next post launches a grid again.
    let t = Instant::now();
    pool.disarm()?;
    let spare2 = rt.alloc(DEV, 4096)?;
    drop(spare2);
    let disarm_took = t.elapsed();
    let s2 = mori_gpu::submit_stats();
    // SAFETY: as above.
    unsafe { ordered_wait(&pool, what, pair(1)) }?;
    let st = mori_gpu::submit_stats().since(&s2);
    if (st.resident_posts, st.resident_launches) != (1, 1) || disarm_took > idle / 2 {
        return fail(format!(
            "{what}: after disarm ({disarm_took:?} with a free) {} resident posts and {} grids, expected 1 and 1",
            st.resident_posts, st.resident_launches
        ));
    }
    // Idle past its wait, the grid exits: memory is freed while the pool lives, without
    // waiting for the pool, and the next post launches a grid again.
    std::thread::sleep(idle + Duration::from_millis(100));
    let t = Instant::now();
    drop(spare);
    let free_took = t.elapsed();
    let s1 = mori_gpu::submit_stats();
    rt.copy_htod(&a.slice(), &pattern(len, 92))?;
    rt.memset(&b.slice(), 0)?;
    for g in [2u64, 3] {
        // SAFETY: as above.
        unsafe { ordered_wait(&pool, what, pair(g)) }?;
    }
    verify("after the idle exit", 92, &[2, 3])?;
    let st = mori_gpu::submit_stats().since(&s1);
    if (st.ordered_launches, st.resident_posts, st.resident_launches) != (0, 2, 1) {
        return fail(format!(
            "{what}: after the idle exit {} launches, {} resident posts and {} resident grids, expected 0, 2 and 1",
            st.ordered_launches, st.resident_posts, st.resident_launches
        ));
    }
    let t = Instant::now();
    drop(pool);
    let took = t.elapsed();
    if took > Duration::from_secs(2) || free_took > Duration::from_secs(1) {
        return fail(format!("{what}: freeing a buffer after the idle exit took {free_took:?}, dropping the pool {took:?}"));
    }
    println!(
        "{what}: 20 batches one at a time, 4 back to back and 4 in one post on one grid (0 launches, 25 posts), checked byte for byte; disarmed and a buffer allocated and freed in {disarm_took:?}, a batch on a new grid; idle exit, a buffer freed in {free_took:?}, 2 more batches on a new grid, checked; the pool dropped in {took:?}"
    );
    Ok(())
}

/// A batch posted while the resident grid is deciding to exit (held there: on the stand-in
/// driver by `MORI_FAKE_RESIDENT_EXIT_PAUSE_MS`, which the harness sets to 150; on a GPU the
/// window is a fence and a read wide, so the post usually lands on either side of it) runs
/// exactly once: by that grid, or by the one the post launches, never also by a launch of its
/// own. Its destination is zeroed after its completion and must stay zero.
#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_resident_copier_runs_a_batch_posted_during_its_exit_once() -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg};
    resident_env_clear()?;
    let rt = rt()?;
    let what = "resident copier, a post during its exit";
    let len = 1usize << 20;
    let a = rt.alloc(DEV, len)?;
    let b = rt.alloc(DEV, len)?;
    rt.copy_htod(&a.slice(), &pattern(len, 7))?;
    let idle = Duration::from_millis(20);
    let cfg = CopyPoolConfig { ordered_kernel: Some(true), resident_blocks: 8, resident_idle: idle, ..CopyPoolConfig::default() };
    let pool = CopyPool::new(rt.clone(), cfg, "test-resident-exit")?;
    let segs = vec![
        CopySeg { src: a.ptr(), dst: b.ptr(), len: (len / 2) as u64 },
        CopySeg { src: a.ptr() + (len - 16) as u64, dst: b.ptr() + (len - 16) as u64, len: 16 },
    ];
    let s0 = mori_gpu::submit_stats();
    for round in 0..4 {
        rt.memset(&b.slice(), 0)?;
        // SAFETY: inside `a` and `b`, which outlive the wait and the check after it.
        unsafe { ordered_wait(&pool, what, segs.clone()) }?;
        let mut back = vec![0u8; len];
        rt.copy_dtoh(&mut back, &b.slice())?;
        check(&format!("{what}: round {round}, segment"), &back[..len / 2], |i| pat(i, 7))?;
        check(&format!("{what}: round {round}, pair"), &back[len - 16..], |i| pat(i + len - 16, 7))?;
        // The grid goes idle and starts its exit (held there on the stand-in); the next round
        // posts into that window.
        std::thread::sleep(idle + Duration::from_millis(30));
    }
    // Nothing runs a batch again after its completion.
    rt.memset(&b.slice(), 0)?;
    std::thread::sleep(Duration::from_millis(400));
    let mut back = vec![0u8; len];
    rt.copy_dtoh(&mut back, &b.slice())?;
    if let Some(i) = back.iter().position(|&x| x != 0) {
        return fail(format!("{what}: byte {i} written after every batch completed (a batch ran twice)"));
    }
    let st = mori_gpu::submit_stats().since(&s0);
    if (st.ordered_launches, st.resident_posts) != (0, 4) || !(1..=4).contains(&st.resident_launches) {
        return fail(format!(
            "{what}: {} launches, {} resident posts, {} resident grids for 4 posts, expected 0, 4 and 1 to 4",
            st.ordered_launches, st.resident_posts, st.resident_launches
        ));
    }
    println!("{what}: 4 posts, {} grids, each batch checked, nothing written after the last completion", st.resident_launches);
    Ok(())
}
