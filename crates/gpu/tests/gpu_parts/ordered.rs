//! The copy pool's ordered batches on the GPU: one launch per batch, grouped posts, the order a
//! host observer sees, armed launches.

use super::*;

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_ordered_batches_land_through_one_launch() -> R {
    // Completion told by the flag the kernel writes, then by events; then the same batches
    // with the kernel off, and a batch the kernel does not take (9 segments).
    copy_pool_ordered(true, Some(true))?;
    copy_pool_ordered(false, Some(true))?;
    copy_pool_ordered(true, Some(false))
}

/// Twenty ordered batches of a 1 MiB segment (at an odd offset: byte copies at its ends)
/// then a 16-byte pair, each checked once done, then one of 9 segments; counts the batches
/// that went through the ordered-copy kernel.
fn copy_pool_ordered(host_flags: bool, kernel: Option<bool>) -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg};
    let rt = rt()?;
    let cfg = CopyPoolConfig { num_events: 4, host_flags: Some(host_flags), ordered_kernel: kernel, ..CopyPoolConfig::default() };
    let (big, len) = (1usize << 20, 2usize << 20);
    let a = rt.alloc(DEV, len)?;
    let b = rt.alloc(DEV, len)?;
    // After the buffers, so dropped before them (with `MORI_GPU_POOL_ARMED` set, a free while
    // launches are armed would wait for them).
    let pool = CopyPool::new(rt.clone(), cfg, "test-ordered")?;
    let what = format!("ordered batches (host_flags {host_flags}, kernel {kernel:?})");
    let stats0 = mori_gpu::submit_stats();
    for k in 0..20u8 {
        rt.copy_htod(&a.slice(), &pattern(len, k))?;
        rt.memset(&b.slice(), 0)?;
        let (src, dst) = (a.ptr(), b.ptr());
        let segs =
            [CopySeg { src: src + 3, dst: dst + 5, len: big as u64 }, CopySeg { src: src + 1_500_000, dst: dst + 1_600_000, len: 16 }];
        // SAFETY: both ranges lie inside `a` and `b`, which outlive the wait.
        unsafe { ordered_wait(&pool, &what, segs.to_vec()) }?;
        let mut back = vec![0u8; len];
        rt.copy_dtoh(&mut back, &b.slice())?;
        check(&format!("{what}: batch {k}, segment"), &back[5..5 + big], |i| pat(i + 3, k))?;
        check(&format!("{what}: batch {k}, pair"), &back[1_600_000..1_600_016], |i| pat(i + 1_500_000, k))?;
        if back[..5].iter().chain(&back[5 + big..1_600_000]).chain(&back[1_600_016..]).any(|&x| x != 0) {
            return fail(format!("{what}: batch {k} wrote outside its segments"));
        }
    }
    // One, three and eight segments (the kernel's table full): a lone 64 KiB segment; 1 MiB
    // then 16-byte words at scattered offsets.
    for n in [1usize, 3, 8] {
        rt.copy_htod(&a.slice(), &pattern(len, 40 + n as u8))?;
        rt.memset(&b.slice(), 0)?;
        let first = if n == 1 { 64 << 10 } else { big as u64 };
        let mut segs = vec![CopySeg { src: a.ptr() + 8, dst: b.ptr() + 24, len: first }];
        segs.extend((1..n as u64).map(|i| CopySeg { src: a.ptr() + 1_200_000 + i * 4000, dst: b.ptr() + 1_300_000 + i * 5000, len: 16 }));
        let want = segs.clone();
        // SAFETY: as above.
        unsafe { ordered_wait(&pool, &what, segs) }?;
        let mut back = vec![0u8; len];
        rt.copy_dtoh(&mut back, &b.slice())?;
        let mut covered = vec![false; len];
        for g in &want {
            let (so, d) = ((g.src - a.ptr()) as usize, (g.dst - b.ptr()) as usize);
            check(&format!("{what}: {n} segments, the one at {d}"), &back[d..d + g.len as usize], |i| pat(i + so, 40 + n as u8))?;
            covered[d..d + g.len as usize].iter_mut().for_each(|c| *c = true);
        }
        if back.iter().zip(&covered).any(|(&x, &c)| !c && x != 0) {
            return fail(format!("{what}: the batch of {n} segments wrote outside them"));
        }
    }
    let st = mori_gpu::submit_stats().since(&stats0);
    // An armed launch (MORI_GPU_POOL_ARMED) is the same kernel, fired instead of launched.
    let launches = st.ordered_launches + st.armed_fires;
    // The kernel writes the flag itself: none missed (each would have waited for the
    // once-a-millisecond event check).
    if host_flags && std::env::var_os(mori_gpu::FLAGS_ENV).is_none() && st.flag_misses != 0 {
        return fail(format!("{what}: {} completion flags missed", st.flag_misses));
    }
    // Nine segments are more than the kernel's table: copies, in order.
    rt.memset(&b.slice(), 0)?;
    let nine: Vec<CopySeg> = (0..9u64).map(|i| CopySeg { src: a.ptr() + i * 4096, dst: b.ptr() + i * 4096, len: 4096 }).collect();
    let before = mori_gpu::submit_stats();
    // SAFETY: as above.
    unsafe { ordered_wait(&pool, &what, nine) }?;
    let mut back = vec![0u8; 9 * 4096];
    rt.copy_dtoh(&mut back, &b.sub(0, 9 * 4096)?)?;
    check(&format!("{what}: 9 segments"), &back, |i| pat(i, 48))?;
    let nine = mori_gpu::submit_stats().since(&before);
    let nine_launches = nine.ordered_launches + nine.armed_fires;
    // The variable, when set, overrides `ordered_kernel`.
    let expect = match std::env::var(mori_gpu::ORDERED_ENV).ok().as_deref() {
        Some("1") => 23,
        Some(_) => 0,
        None if kernel == Some(false) => 0,
        None => 23,
    };
    if launches != expect || nine_launches != 0 {
        return fail(format!(
            "{what}: {launches} of 23 batches through the kernel (expected {expect}), {nine_launches} for 9 segments (expected 0)"
        ));
    }
    println!(
        "{what}: 20 batches of 1 MiB + 16 B and batches of 1, 3 and 8 segments checked, {launches} through the ordered-copy kernel; 9 segments as copies"
    );
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_grouped_batches_share_launches() -> R {
    copy_pool_grouped(Some(true))?;
    copy_pool_grouped(Some(false))
}

/// Seven ordered batches posted together (`copy_groups_in_order_with`): four of a 1 MiB
/// segment and a 16-byte pair (one launch), one of nine 4 KiB segments (more than the
/// kernel's table: copies), two more of a segment and a pair (a second launch). Checks every
/// byte, that nothing else was written, each submission's group range, and the launch count.
fn copy_pool_grouped(kernel: Option<bool>) -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg};
    let rt = rt()?;
    let cfg = CopyPoolConfig { num_events: 4, ordered_kernel: kernel, ..CopyPoolConfig::default() };
    let len = 8usize << 20;
    let a = rt.alloc(DEV, len)?;
    let b = rt.alloc(DEV, len)?;
    // After the buffers, so dropped before them (as in copy_pool_ordered).
    let pool = CopyPool::new(rt.clone(), cfg, "test-grouped")?;
    let what = format!("grouped batches (kernel {kernel:?})");
    rt.copy_htod(&a.slice(), &pattern(len, 61))?;
    rt.memset(&b.slice(), 0)?;
    let (ap, bp) = (a.ptr(), b.ptr());
    let pair = |g: u64| {
        vec![
            CopySeg { src: ap + 3 + g * (1 << 20), dst: bp + 5 + g * (1 << 20) + g, len: (1 << 20) - 64 * g },
            CopySeg { src: ap + 7_500_000 + g * 32, dst: bp + 7_600_000 + g * 32, len: 16 },
        ]
    };
    let nine: Vec<CopySeg> =
        (0..9u64).map(|i| CopySeg { src: ap + 7_000_000 + i * 4096, dst: bp + 7_000_000 + i * 4096, len: 4096 }).collect();
    let groups: Vec<Vec<CopySeg>> = vec![pair(0), pair(1), pair(2), pair(3), nine, pair(4), pair(5)];
    let refs: Vec<&[CopySeg]> = groups.iter().map(|g| g.as_slice()).collect();
    let before = mori_gpu::submit_stats();
    let (tx, rx) = std::sync::mpsc::channel();
    // SAFETY: every range lies inside `a` and `b`, which outlive the waits below.
    unsafe {
        pool.copy_groups_in_order_with(DEV, &refs, |range| {
            let tx = tx.clone();
            move |r| {
                let _ = tx.send((range, r));
            }
        })
    }
    .map_err(|(i, e)| Fail(format!("{what}: groups {i}.. not queued: {e}")))?;
    let on = match std::env::var(mori_gpu::ORDERED_ENV).ok().as_deref() {
        Some(v) => v == "1",
        None => kernel != Some(false),
    };
    let (want_ranges, want_launches) = if on { (vec![0..4, 4..5, 5..7], 2) } else { ((0..7).map(|i| i..i + 1).collect(), 0) };
    let mut ranges = Vec::new();
    let t = Instant::now();
    while ranges.len() < want_ranges.len() {
        pool.progress();
        if let Ok((range, r)) = rx.try_recv() {
            r.map_err(|e| Fail(format!("{what}: groups {range:?}: {e}")))?;
            ranges.push(range);
        }
        if t.elapsed() > WAIT_TIMEOUT {
            return fail(format!("{what}: {} of {} submissions done after {WAIT_TIMEOUT:?}", ranges.len(), want_ranges.len()));
        }
        std::thread::yield_now();
    }
    ranges.sort_by_key(|r| r.start);
    // An armed launch (MORI_GPU_POOL_ARMED) is the same kernel, fired instead of launched.
    let st = mori_gpu::submit_stats().since(&before);
    let launches = st.ordered_launches + st.armed_fires;
    if ranges != want_ranges || launches != want_launches {
        return fail(format!("{what}: submissions {ranges:?} with {launches} launches, expected {want_ranges:?} with {want_launches}"));
    }
    let mut back = vec![0u8; len];
    rt.copy_dtoh(&mut back, &b.slice())?;
    let mut covered = vec![false; len];
    for (gi, g) in groups.iter().enumerate() {
        for sg in g {
            let (so, d) = ((sg.src - ap) as usize, (sg.dst - bp) as usize);
            check(&format!("{what}: group {gi}, segment at {d}"), &back[d..d + sg.len as usize], |i| pat(i + so, 61))?;
            covered[d..d + sg.len as usize].iter_mut().for_each(|c| *c = true);
        }
    }
    if back.iter().zip(&covered).any(|(&x, &c)| !c && x != 0) {
        return fail(format!("{what}: bytes written outside the segments"));
    }
    println!("{what}: 7 batches (6 of a segment and a pair, 1 of 9 segments) checked, submissions {ranges:?}, {launches} launches of the ordered-copy kernel");
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_ordered_batches_land_in_order_for_a_host_observer() -> R {
    // Through the ordered-copy kernel, then as copies; then two batches sharing a launch; then
    // both through armed launches.
    ordered_probe(Some(true), 0)?;
    ordered_probe(Some(false), 0)?;
    grouped_probe(Some(true), 0)?;
    ordered_probe(Some(true), 2)?;
    grouped_probe(Some(true), 2)
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_armed_launches_copy_each_batch_with_no_launch_when_posted() -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg};
    if std::env::var_os(mori_gpu::ARMED_ENV).is_some() {
        return fail(format!("unset {} for this test: it counts armed fires against its own depth", mori_gpu::ARMED_ENV));
    }
    let rt = rt()?;
    let what = "armed launches";
    let (big, len) = (1usize << 20, 4usize << 20);
    let a = rt.alloc(DEV, len)?;
    let b = rt.alloc(DEV, len)?;
    // Freed while the pool lives, once it is disarmed.
    let spare = rt.alloc(DEV, 4096)?;
    // Made after the buffers, so dropped before them: freeing memory while launches are armed
    // would wait for the armed stream.
    let cfg = CopyPoolConfig { num_events: 8, ordered_kernel: Some(true), armed_depth: 2, ..CopyPoolConfig::default() };
    let pool = CopyPool::new(rt.clone(), cfg, "test-armed")?;
    let s0 = mori_gpu::submit_stats();
    // One at a time: the first post launches (nothing armed yet) and arms two; every later one
    // fires an armed launch and arms one in its place.
    for k in 0..20u8 {
        rt.copy_htod(&a.slice(), &pattern(len, k))?;
        rt.memset(&b.slice(), 0)?;
        let segs = [
            CopySeg { src: a.ptr() + 3, dst: b.ptr() + 5, len: (big + 4096 * k as usize) as u64 },
            CopySeg { src: a.ptr() + 3_500_000, dst: b.ptr() + 3_600_000, len: 16 },
        ];
        // SAFETY: both ranges lie inside `a` and `b`, which outlive the wait.
        unsafe { ordered_wait(&pool, what, segs.to_vec()) }?;
        let mut back = vec![0u8; len];
        rt.copy_dtoh(&mut back, &b.slice())?;
        let n = segs[0].len as usize;
        check(&format!("{what}: batch {k}, segment"), &back[5..5 + n], |i| pat(i + 3, k))?;
        check(&format!("{what}: batch {k}, pair"), &back[3_600_000..3_600_016], |i| pat(i + 3_500_000, k))?;
        if back[..5].iter().chain(&back[5 + n..3_600_000]).chain(&back[3_600_016..]).any(|&x| x != 0) {
            return fail(format!("{what}: batch {k} wrote outside its segments"));
        }
    }
    let st = mori_gpu::submit_stats().since(&s0);
    if (st.ordered_launches, st.armed_fires) != (1, 19) {
        return fail(format!(
            "{what}: {} launches and {} armed fires for 20 batches, expected 1 and 19",
            st.ordered_launches, st.armed_fires
        ));
    }
    // Two posted back to back (both armed: they run one after the other on the armed
    // stream), then four batches in one post (one armed launch, a run of blocks each).
    rt.copy_htod(&a.slice(), &pattern(len, 90))?;
    rt.memset(&b.slice(), 0)?;
    let quarter = (len / 4) as u64;
    let pair = |g: u64| {
        vec![
            CopySeg { src: a.ptr() + g * quarter, dst: b.ptr() + g * quarter + 8, len: quarter - 4096 },
            CopySeg { src: a.ptr() + g * quarter + quarter - 64, dst: b.ptr() + g * quarter + quarter - 32, len: 16 },
        ]
    };
    let s1 = mori_gpu::submit_stats();
    let groups: Vec<Vec<CopySeg>> = vec![pair(2), pair(3)];
    let refs: Vec<&[CopySeg]> = groups.iter().map(|g| g.as_slice()).collect();
    // SAFETY: inside `a` and `b`, which outlive the wait.
    unsafe { ordered_all_wait(&pool, what, vec![pair(0), pair(1)]) }?;
    // The completion step arms again after its callbacks ran (on whichever thread ran it).
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(100) {
        pool.progress();
        std::thread::yield_now();
    }
    // SAFETY: as above.
    unsafe { groups_wait(&pool, what, &refs) }?;
    let st = mori_gpu::submit_stats().since(&s1);
    let mut back = vec![0u8; len];
    rt.copy_dtoh(&mut back, &b.slice())?;
    let mut covered = vec![false; len];
    for g in 0..4u64 {
        for sg in pair(g) {
            let (so, d) = ((sg.src - a.ptr()) as usize, (sg.dst - b.ptr()) as usize);
            check(&format!("{what}: batch {g}, segment at {d}"), &back[d..d + sg.len as usize], |i| pat(i + so, 90))?;
            covered[d..d + sg.len as usize].iter_mut().for_each(|c| *c = true);
        }
    }
    if back.iter().zip(&covered).any(|(&x, &c)| !c && x != 0) {
        return fail(format!("{what}: bytes written outside the four batches"));
    }
    if (st.ordered_launches, st.armed_fires) != (0, 3) {
        return fail(format!(
            "{what}: {} launches and {} armed fires for 2 posts and a post of 2 batches, expected 0 and 3",
            st.ordered_launches, st.armed_fires
        ));
    }
    // Disarmed, the pool leaves nothing waiting on the device: memory can be freed while it
    // lives (the fake driver aborts a free while a stream waits on the host; a GPU would
    // block), and the next batch is launched when posted.
    let t = Instant::now();
    pool.disarm()?;
    let disarm_took = t.elapsed();
    drop(spare);
    rt.copy_htod(&a.slice(), &pattern(len, 91))?;
    rt.memset(&b.slice(), 0)?;
    // The first batch after it is launched; that post arms again, so the next one fires.
    for (g, name, want) in [(1u64, "the batch after disarm", (1, 0)), (2, "the second batch after disarm", (0, 1))] {
        let s2 = mori_gpu::submit_stats();
        // SAFETY: inside `a` and `b`, which outlive the wait.
        unsafe { ordered_wait(&pool, what, pair(g)) }?;
        let st = mori_gpu::submit_stats().since(&s2);
        rt.copy_dtoh(&mut back, &b.slice())?;
        for sg in pair(g) {
            let (so, d) = ((sg.src - a.ptr()) as usize, (sg.dst - b.ptr()) as usize);
            check(&format!("{what}: {name}, segment at {d}"), &back[d..d + sg.len as usize], |i| pat(i + so, 91))?;
        }
        if (st.ordered_launches, st.armed_fires) != want {
            return fail(format!(
                "{what}: {name}: {} launches and {} armed fires, expected {} and {}",
                st.ordered_launches, st.armed_fires, want.0, want.1
            ));
        }
    }
    let t = Instant::now();
    drop(pool);
    let took = t.elapsed();
    if took > Duration::from_secs(2) || disarm_took > Duration::from_secs(2) {
        return fail(format!("{what}: disarming took {disarm_took:?}, dropping the pool {took:?}"));
    }
    println!(
        "{what}: 20 batches (1 launch, 19 armed fires), 2 back to back and 2 in one post (3 armed fires) checked byte for byte; disarmed in {disarm_took:?}, a buffer freed, the next batch launched (1 launch, 0 fires), the one after fired (armed again), both checked; the pool dropped in {took:?}"
    );
    Ok(())
}

/// Two ordered batches posted together (`copy_groups_in_order_with`: one launch, a run of
/// blocks each), each an 8 MiB segment then an 8-byte word into mapped pinned host memory,
/// while a host thread polls both words: once it sees a batch's word, that batch's whole
/// segment must be there. Three rounds, a new pattern and word each.
fn grouped_probe(kernel: Option<bool>, armed_depth: usize) -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg};
    use std::sync::atomic::{AtomicU64, Ordering};
    let rt = rt()?;
    // The depth in effect (`MORI_GPU_POOL_ARMED` overrides the one asked for).
    let what = format!("grouped probe (kernel {kernel:?}, armed {})", mori_gpu::armed_depth(armed_depth).unwrap_or(armed_depth));
    let seg = 8usize << 20;
    let stride = seg + 64;
    let src = rt.alloc(DEV, 2 * stride)?;
    let mut host = rt.alloc_mapped(DEV, 2 * stride)?;
    // Made after the buffers, so dropped before them (see ordered_probe).
    let cfg = CopyPoolConfig { num_events: 4, ordered_kernel: kernel, armed_depth, ..CopyPoolConfig::default() };
    let pool = CopyPool::new(rt.clone(), cfg, "test-grouped-probe")?;
    let Some(hdev) = host.device_ptr() else { return fail(format!("{what}: the mapped buffer has no device address")) };
    for k in 1..=3u64 {
        let mut bytes = Vec::with_capacity(2 * stride);
        for g in 0..2u64 {
            let mut part = pattern(seg, (k * 2 + g) as u8);
            part.extend_from_slice(&(k * 10 + g).to_le_bytes());
            part.resize(stride, 0);
            bytes.extend_from_slice(&part);
        }
        rt.copy_htod(&src.slice(), &bytes)?;
        host.as_mut_slice().fill(0);
        std::sync::atomic::fence(Ordering::SeqCst);
        let hp = host.ptr() as usize;
        let groups: Vec<Vec<CopySeg>> = (0..2u64)
            .map(|g| {
                let at = g * stride as u64;
                vec![
                    CopySeg { src: src.ptr() + at, dst: hdev + at, len: seg as u64 },
                    CopySeg { src: src.ptr() + at + seg as u64, dst: hdev + at + seg as u64, len: 8 },
                ]
            })
            .collect();
        let seen = std::thread::scope(|sc| -> Result<Result<[usize; 2], String>, Fail> {
            let probe = sc.spawn(move || -> Result<[usize; 2], String> {
                let mut bad = [usize::MAX; 2];
                let t = Instant::now();
                while bad.contains(&usize::MAX) {
                    for (g, bad_g) in bad.iter_mut().enumerate() {
                        if *bad_g != usize::MAX {
                            continue;
                        }
                        // SAFETY: the word lies inside the mapped buffer (alive for the whole
                        // scope), 8-aligned; only the device writes it.
                        let word = unsafe { AtomicU64::from_ptr((hp + g * stride + seg) as *mut u64) };
                        if word.load(Ordering::Acquire) != k * 10 + g as u64 {
                            continue;
                        }
                        // The word is seen: every byte of its segment must be there now.
                        // SAFETY: the segment lies inside the mapped buffer, alive for the scope.
                        *bad_g = unsafe { words_not_there(hp + g * stride, seg, (k * 2 + g as u64) as u8) };
                    }
                    if t.elapsed() > WAIT_TIMEOUT {
                        return Err(format!("the words of round {k} not both seen after {WAIT_TIMEOUT:?}"));
                    }
                    std::hint::spin_loop();
                }
                Ok(bad)
            });
            let refs: Vec<&[CopySeg]> = groups.iter().map(|g| g.as_slice()).collect();
            // SAFETY: every range lies inside `src` and the mapped buffer, alive until the
            // wait ends.
            unsafe { groups_wait(&pool, &what, &refs) }?;
            Ok(probe.join().unwrap_or_else(|_| Err("the probe thread panicked".into())))
        })?;
        match seen {
            Ok([0, 0]) => {}
            Ok(bad) => return fail(format!("{what}: round {k}: words landed with {bad:?} 8-byte words of their segments not yet there")),
            Err(e) => return fail(format!("{what}: {e}")),
        }
    }
    println!("{what}: 3 rounds of 2 batches (8 MiB + 8 B each) in one launch into mapped host memory, each segment whole whenever its word was seen");
    Ok(())
}

/// Four ordered batches of a 16 MiB segment then an 8-byte word, both into mapped pinned host
/// memory, while a host thread polls the word: once it sees a batch's word, the whole segment
/// must already be there (the thread reads all of it at once). A new pattern and word each.
fn ordered_probe(kernel: Option<bool>, armed_depth: usize) -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg};
    use std::sync::atomic::{AtomicU64, Ordering};
    let rt = rt()?;
    // The depth in effect (`MORI_GPU_POOL_ARMED` overrides the one asked for).
    let what = format!("ordered probe (kernel {kernel:?}, armed {})", mori_gpu::armed_depth(armed_depth).unwrap_or(armed_depth));
    let big = 16usize << 20;
    let src = rt.alloc(DEV, big + 64)?;
    let mut host = rt.alloc_mapped(DEV, big + 64)?;
    // Made after the buffers, so dropped before them: freeing memory while launches are armed
    // would wait for the armed stream.
    let cfg = CopyPoolConfig { num_events: 4, ordered_kernel: kernel, armed_depth, ..CopyPoolConfig::default() };
    let pool = CopyPool::new(rt.clone(), cfg, "test-ordered-probe")?;
    let Some(hdev) = host.device_ptr() else { return fail(format!("{what}: the mapped buffer has no device address")) };
    for k in 1..=4u64 {
        let mut bytes = pattern(big, k as u8);
        bytes.extend_from_slice(&k.to_le_bytes());
        bytes.resize(big + 64, 0);
        rt.copy_htod(&src.slice(), &bytes)?;
        host.as_mut_slice().fill(0);
        std::sync::atomic::fence(Ordering::SeqCst);
        let (hp, seed) = (host.ptr() as usize, k as u8);
        let segs = vec![
            CopySeg { src: src.ptr(), dst: hdev, len: big as u64 },
            CopySeg { src: src.ptr() + big as u64, dst: hdev + big as u64, len: 8 },
        ];
        let seen = std::thread::scope(|sc| -> Result<Result<usize, String>, Fail> {
            let probe = sc.spawn(move || -> Result<usize, String> {
                // SAFETY: the word lies inside the mapped buffer (alive for the whole scope),
                // 8-aligned (a page-aligned buffer, 16 MiB in); only the device writes it.
                let word = unsafe { AtomicU64::from_ptr((hp + big) as *mut u64) };
                let t = Instant::now();
                while word.load(Ordering::Acquire) != k {
                    if t.elapsed() > WAIT_TIMEOUT {
                        return Err(format!("the word of batch {k} not seen after {WAIT_TIMEOUT:?}"));
                    }
                    std::hint::spin_loop();
                }
                // The word is seen: every byte of the segment must be there now.
                // SAFETY: the segment lies inside the mapped buffer, alive for the whole scope.
                Ok(unsafe { words_not_there(hp, big, seed) })
            });
            // SAFETY: both ranges lie inside `src` and the mapped buffer, alive until the wait ends.
            unsafe { ordered_wait(&pool, &what, segs) }?;
            Ok(probe.join().unwrap_or_else(|_| Err("the probe thread panicked".into())))
        })?;
        match seen {
            Ok(0) => {}
            Ok(bad) => {
                return fail(format!(
                    "{what}: batch {k}: the word landed with {bad} of {} 8-byte words of the segment not yet there",
                    big / 8
                ))
            }
            Err(e) => return fail(format!("{what}: {e}")),
        }
    }
    println!("{what}: 4 batches of 16 MiB + 8 B into mapped host memory, the segment whole whenever its word was seen");
    Ok(())
}

/// The 8-byte words of the `len` bytes at host address `at` that do not yet hold
/// `pattern(len, seed)`, read once each as device-written memory.
///
/// # Safety
/// `at..at + len` must be mapped, readable and 8-aligned for the whole call.
unsafe fn words_not_there(at: usize, len: usize, seed: u8) -> usize {
    (0..len / 8)
        .filter(|&i| {
            // SAFETY: inside the range (forwarded contract), 8-aligned.
            let v = unsafe { std::ptr::read_volatile((at + i * 8) as *const u64) };
            v.to_le_bytes().iter().enumerate().any(|(j, &b)| b != pat(i * 8 + j, seed))
        })
        .count()
}

/// Queues `segs` as one ordered batch of `pool` on `DEV` and waits for it (see `pool_wait`).
///
/// # Safety
/// Every segment's ranges must be device memory of `DEV` that stays mapped until this returns.
pub(super) unsafe fn ordered_wait(pool: &mori_gpu::CopyPool, what: &str, segs: Vec<mori_gpu::CopySeg>) -> R {
    pool_wait(pool, what, |tx| {
        // SAFETY: forwarded contract; the batch is waited for before returning.
        unsafe {
            pool.copy_in_order_with(DEV, segs, move || {
                move |r| {
                    let _ = tx.send(r);
                }
            })
        }?;
        Ok(())
    })
}

/// Queues `batches` as ordered batches of `pool` on `DEV` back to back (in flight together)
/// and waits for all of them, driving the pool.
///
/// # Safety
/// As `ordered_wait`, for every batch's segments.
pub(super) unsafe fn ordered_all_wait(pool: &mori_gpu::CopyPool, what: &str, batches: Vec<Vec<mori_gpu::CopySeg>>) -> R {
    let n = batches.len();
    let (tx, rx) = std::sync::mpsc::channel();
    for segs in batches {
        let tx = tx.clone();
        // SAFETY: forwarded contract; every batch is waited for before returning.
        unsafe {
            pool.copy_in_order_with(DEV, segs, move || {
                move |r| {
                    let _ = tx.send(r);
                }
            })
        }?;
    }
    let t = Instant::now();
    let mut done = 0;
    while done < n {
        pool.progress();
        if let Ok(r) = rx.try_recv() {
            r.map_err(|e| Fail(format!("{what}: a batch posted back to back: {e}")))?;
            done += 1;
        }
        if t.elapsed() > WAIT_TIMEOUT {
            return fail(format!("{what}: {done} of {n} batches posted back to back done after {WAIT_TIMEOUT:?}"));
        }
        std::thread::yield_now();
    }
    Ok(())
}

/// Queues `groups` as ordered batches of `pool` on `DEV` that go as one submission (packed
/// into one launch: see `copy_groups_in_order_with`) and waits for it (see `pool_wait`).
///
/// # Safety
/// As `ordered_wait`, for every group's segments.
pub(super) unsafe fn groups_wait(pool: &mori_gpu::CopyPool, what: &str, groups: &[&[mori_gpu::CopySeg]]) -> R {
    pool_wait(pool, what, |tx| {
        // SAFETY: forwarded contract; the batches are waited for before returning.
        unsafe {
            pool.copy_groups_in_order_with(DEV, groups, |_| {
                let tx = tx.clone();
                move |r| {
                    let _ = tx.send(r);
                }
            })
        }
        .map_err(|(i, e)| Fail(format!("{what}: groups {i}.. not queued: {e}")))
    })
}
