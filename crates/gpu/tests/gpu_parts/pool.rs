//! The copy pool's GPU tests: copies with a panicking callback, copies then stream writes,
//! paged copies and staged descriptor tables.

use super::*;

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_copies_and_survives_a_panicking_callback() -> R {
    // Completion told by events, then by the slots' flags in mapped host memory.
    copy_pool_twelve_copies(false)?;
    copy_pool_twelve_copies(true)
}

fn copy_pool_twelve_copies(host_flags: bool) -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg};
    let rt = rt()?;
    // Two slots, so the twelve copies below also pass through admission (waiting for slots).
    let cfg =
        CopyPoolConfig { num_streams: 3, num_events: 2, kernel_threshold: 0, host_flags: Some(host_flags), ..CopyPoolConfig::default() };
    let pool = CopyPool::new(rt.clone(), cfg, "test-copy-pool")?;
    let stats0 = mori_gpu::submit_stats();
    let len = 12 * 4096;
    let a = rt.alloc(DEV, len)?;
    let b = rt.alloc(DEV, len)?;
    rt.copy_htod(&a.slice(), &pattern(len, 0x33))?;
    rt.memset(&b.slice(), 0)?;
    let (src, dst) = (a.slice().ptr(), b.slice().ptr());
    // A callback that panics must not take the completion path down with it.
    let seg0 = [CopySeg { src, dst, len: 4096 }];
    // SAFETY: both ranges lie inside `a` and `b`, which outlive the pool's work (the pool is
    // dropped, and every copy waited for, before them).
    unsafe { pool.copy(DEV, &seg0, |_| panic!("test: a panicking completion callback")) }?;
    let (tx, rx) = std::sync::mpsc::channel();
    for k in 1..12u64 {
        let tx = tx.clone();
        let seg = [CopySeg { src: src + k * 4096, dst: dst + k * 4096, len: 4096 }];
        // SAFETY: as above.
        unsafe {
            pool.copy(DEV, &seg, move |r| {
                let _ = tx.send((k, r.is_ok()));
            })
        }?;
    }
    // This thread drives completion itself (as a spinning waiter does).
    let t = Instant::now();
    let mut got = Vec::new();
    while got.len() < 11 {
        pool.progress();
        got.extend(rx.try_iter());
        if t.elapsed() > WAIT_TIMEOUT {
            return fail(format!("copy pool: {} of 11 callbacks after {WAIT_TIMEOUT:?}", got.len()));
        }
    }
    if let Some((k, _)) = got.iter().find(|(_, ok)| !ok) {
        return fail(format!("copy pool: copy {k} failed"));
    }
    let mut back = vec![0u8; len];
    rt.copy_dtoh(&mut back, &b.slice())?;
    check("copy pool: 12 copies of 4 KiB", &back, |i| pat(i, 0x33))?;
    let st = mori_gpu::submit_stats().since(&stats0);
    // Each completion told by its event takes at least one query; flags take none unless a
    // copy is still running a millisecond after a look (the error check), and no flag is
    // missed. The variable, when set, overrides `host_flags` for both halves.
    let queries_ok = match std::env::var_os(mori_gpu::FLAGS_ENV) {
        Some(_) => true,
        None if host_flags => st.event_queries < 12 && st.flag_misses == 0,
        None => st.event_queries >= 12,
    };
    if !queries_ok || st.submissions < 12 {
        return fail(format!(
            "copy pool (host_flags {host_flags}): {} submissions, {} event queries, {} flags missed",
            st.submissions, st.event_queries, st.flag_misses
        ));
    }
    println!(
        "copy pool (host_flags {host_flags}): 12 copies through 2 slots, a panicking callback survived, {:?}; {} event queries",
        t.elapsed(),
        st.event_queries
    );
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_copies_then_stream_writes() -> R {
    // Completion told by the flag in the same batch as the words, then by events alone.
    copy_then_write(true)?;
    copy_then_write(false)
}

/// Ten submissions of two groups (a 1 MiB segment at odd offsets with a counter pair behind
/// it, a 4 KiB segment with one word), every byte and word checked once done; then the
/// checks that refuse a submission before queueing anything.
fn copy_then_write(host_flags: bool) -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg, StreamWrite};
    let rt = rt()?;
    let cfg = CopyPoolConfig { num_events: 4, host_flags: Some(host_flags), ..CopyPoolConfig::default() };
    let (big, len) = (1usize << 20, 2usize << 20);
    let a = rt.alloc(DEV, len)?;
    let b = rt.alloc(DEV, len)?;
    let pool = CopyPool::new(rt.clone(), cfg, "test-words")?;
    let what = format!("copies then stream writes (host_flags {host_flags})");
    let (src, dst) = (a.ptr(), b.ptr());
    for k in 0..10u8 {
        rt.copy_htod(&a.slice(), &pattern(len, k))?;
        rt.memset(&b.slice(), 0)?;
        let first = [CopySeg { src: src + 3, dst: dst + 5, len: big as u64 }];
        let pair = [
            StreamWrite::U64 { addr: dst + 1_600_000, value: 100 + k as u64 },
            StreamWrite::U64 { addr: dst + 1_600_008, value: 101 + k as u64 },
        ];
        let second = [CopySeg { src: src + 1_700_000, dst: dst + 1_800_000, len: 4096 }];
        let one = [StreamWrite::U64 { addr: dst + 1_900_000, value: u64::MAX - k as u64 }];
        pool_wait(&pool, &what, |tx| {
            // SAFETY: every range and word lies inside `a` or `b`, which outlive the wait.
            unsafe {
                pool.copy_then_write(DEV, &[(&first, &pair), (&second, &one)], move || {
                    move |r| {
                        let _ = tx.send(r);
                    }
                })
            }?;
            Ok(())
        })?;
        let mut back = vec![0u8; len];
        rt.copy_dtoh(&mut back, &b.slice())?;
        check(&format!("{what}: submission {k}, segment 1"), &back[5..5 + big], |i| pat(i + 3, k))?;
        check(&format!("{what}: submission {k}, segment 2"), &back[1_800_000..1_804_096], |i| pat(i + 1_700_000, k))?;
        let word = |o: usize| u64::from_le_bytes(back[o..o + 8].try_into().unwrap());
        let got = (word(1_600_000), word(1_600_008), word(1_900_000));
        if got != (100 + k as u64, 101 + k as u64, u64::MAX - k as u64) {
            return fail(format!("{what}: submission {k}: words {got:?}"));
        }
        let outside = back[..5].iter().chain(&back[5 + big..1_600_000]).chain(&back[1_600_016..1_800_000]);
        if outside.chain(&back[1_804_096..1_900_000]).chain(&back[1_900_008..]).any(|&x| x != 0) {
            return fail(format!("{what}: submission {k} wrote outside its segments and words"));
        }
    }
    let seg = [CopySeg { src, dst, len: 64 }];
    for (words, want) in [
        (vec![StreamWrite::U64 { addr: dst + 4, value: 1 }], "8-byte stream write"),
        (vec![StreamWrite::U64 { addr: dst, value: 1 }; mori_gpu::STREAM_WRITES_MAX], "at most 254"),
    ] {
        rt.memset(&b.slice(), 0)?;
        // SAFETY: as above; the submission is refused before anything is queued.
        let r = unsafe { pool.copy_then_write(DEV, &[(&seg, &words)], || |_| {}) };
        match r {
            Err(e) if e.to_string().contains(want) => {}
            other => return fail(format!("{what}: {want}: {other:?}")),
        }
        let mut back = vec![0u8; 64];
        rt.copy_dtoh(&mut back, &b.sub(0, 64)?)?;
        if back.iter().any(|&x| x != 0) {
            return fail(format!("{what}: a refused submission ({want}) wrote"));
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn copy_pool_paged_copies_and_staged_tables() -> R {
    use mori_gpu::{CopyPool, CopyPoolConfig, CopySeg, GpuError, PagedCopy, PagedSide};
    let rt = rt()?;
    // Side A: [layer][half][block] of 4 KiB blocks (runs merge); side B: [block][layer][half]
    // of 4100-byte blocks 4 bytes apart (no merging), both with 16 blocks.
    let (layers, halves, nb) = (3u32, 2u32, 16u32);
    let lh = u64::from(layers * halves);
    let a_len = (lh * u64::from(nb) * 4096) as usize;
    let a = rt.alloc(DEV, a_len)?;
    let a_side =
        PagedSide { base: a.ptr(), layer_stride: u64::from(halves * nb) * 4096, half_stride: u64::from(nb) * 4096, block_stride: 4096 };
    let contiguous = PagedCopy { a: a_side, b: a_side, block_bytes: 4096, layers, halves, a_to_b: true };
    let a_blocks = [3u32, 4, 5, 9, 0, 1, 15];
    let b_blocks = [7u32, 8, 9, 2, 11, 12, 0];
    let runs = contiguous.runs(&a_blocks, &b_blocks)?;
    if runs.len() != 4 {
        return fail(format!("expected 4 merged runs, got {runs:?}"));
    }
    // A -> C (same layout as A), through the kernel: runs of several blocks.
    let c = rt.alloc(DEV, a_len)?;
    rt.copy_htod(&a.slice(), &pattern(a_len, 0x21))?;
    rt.memset(&c.slice(), 0)?;
    let pool = CopyPool::new(rt.clone(), CopyPoolConfig { num_streams: 2, num_events: 2, ..CopyPoolConfig::default() }, "test-paged")?;
    let job = PagedCopy { b: PagedSide { base: c.ptr(), ..a_side }, ..contiguous };
    // SAFETY: every range lies inside `a` and `c` (16 blocks per layer-half), which outlive
    // the pool's work (each copy is waited for).
    pool_wait(&pool, "paged A -> C (kernel)", |tx| Ok(unsafe { pool.copy_paged(DEV, &job, &runs, move || move |r| drop(tx.send(r))) }?))?;
    let mut back = vec![0u8; a_len];
    rt.copy_dtoh(&mut back, &c.slice())?;
    let blk = |i: usize| (i / 4096) % nb as usize;
    let want_c = |i: usize| {
        let base = i - i % (nb as usize * 4096);
        match b_blocks.iter().position(|&b| b as usize == blk(i)) {
            Some(k) => pat(base + a_blocks[k] as usize * 4096 + i % 4096, 0x21),
            None => 0,
        }
    };
    check("paged A -> C", &back, want_c)?;
    // D -> A' (B->A direction), D strided [block][layer][half], 4100-byte blocks, one run per block.
    let (bb, pad) = (4100u64, 4u64);
    let d_block = lh * bb + pad;
    let d_len = (u64::from(nb) * d_block) as usize;
    let d = rt.alloc(DEV, d_len)?;
    rt.copy_htod(&d.slice(), &pattern(d_len, 0x5c))?;
    let e_len = (lh * u64::from(nb) * bb) as usize;
    let e = rt.alloc(DEV, e_len)?;
    rt.memset(&e.slice(), 0)?;
    let e_side = PagedSide { base: e.ptr(), layer_stride: u64::from(halves * nb) * bb, half_stride: u64::from(nb) * bb, block_stride: bb };
    let d_side = PagedSide { base: d.ptr(), layer_stride: u64::from(halves) * bb, half_stride: bb, block_stride: d_block };
    let strided = PagedCopy { a: e_side, b: d_side, block_bytes: bb, layers, halves, a_to_b: false };
    let runs2 = strided.runs(&a_blocks, &b_blocks)?;
    if runs2.len() != a_blocks.len() {
        return fail("strided layout: blocks were merged");
    }
    let want_e = |i: usize| {
        let (lhi, rest) = (i / (nb as usize * bb as usize), i % (nb as usize * bb as usize));
        let (eb, off) = (rest / bb as usize, rest % bb as usize);
        match a_blocks.iter().position(|&x| x as usize == eb) {
            Some(k) => pat(b_blocks[k] as usize * d_block as usize + lhi * bb as usize + off, 0x5c),
            None => 0,
        }
    };
    // SAFETY: as above, inside `d` and `e`.
    pool_wait(&pool, "paged D -> E (kernel)", |tx| {
        Ok(unsafe { pool.copy_paged(DEV, &strided, &runs2, move || move |r| drop(tx.send(r))) }?)
    })?;
    let mut back_e = vec![0u8; e_len];
    rt.copy_dtoh(&mut back_e, &e.slice())?;
    check("paged D -> E", &back_e, want_e)?;
    // 40 small segments through the scatter/gather kernel (its table staged the same way).
    rt.memset(&c.slice(), 0)?;
    let segs: Vec<CopySeg> = (0..40u64).map(|k| CopySeg { src: a.ptr() + k * 1000 + 3, dst: c.ptr() + k * 1024, len: 999 }).collect();
    // SAFETY: inside `a` and `c`.
    pool_wait(&pool, "40 segments (kernel)", |tx| Ok(unsafe { pool.copy(DEV, &segs, move |r| drop(tx.send(r))) }?))?;
    rt.copy_dtoh(&mut back, &c.slice())?;
    check("40 segments", &back, |i| if i < 40 * 1024 && i % 1024 < 999 { pat((i / 1024) * 1000 + 3 + i % 1024, 0x21) } else { 0 })?;
    // Without the kernel (one copy per range), and with the table uploaded from pinned memory
    // instead of passed in the parameters: the same bytes.
    let slow = CopyPool::new(rt.clone(), CopyPoolConfig { kernel_threshold: 0, ..CopyPoolConfig::default() }, "test-paged-ranges")?;
    let upload = CopyPool::new(rt.clone(), CopyPoolConfig { paged_inline_runs: 0, ..CopyPoolConfig::default() }, "test-paged-upload")?;
    for (p, what) in [(&slow, "paged D -> E (ranges)"), (&upload, "paged D -> E (uploaded table)")] {
        rt.memset(&e.slice(), 0)?;
        // SAFETY: as above.
        pool_wait(p, what, |tx| Ok(unsafe { p.copy_paged(DEV, &strided, &runs2, move || move |r| drop(tx.send(r))) }?))?;
        rt.copy_dtoh(&mut back_e, &e.slice())?;
        check(what, &back_e, want_e)?;
    }
    // 512 runs, more than the parameters hold (320): the default pool uploads this table.
    // 64-byte blocks: even blocks of A to odd blocks of C in reverse order.
    let small = PagedSide { base: a.ptr(), layer_stride: 1024 * 64, half_stride: 1024 * 64, block_stride: 64 };
    let many = PagedCopy { a: small, b: PagedSide { base: c.ptr(), ..small }, block_bytes: 64, layers: 1, halves: 1, a_to_b: true };
    let (ma, mb): (Vec<u32>, Vec<u32>) = (0..512u32).map(|k| (2 * k, 1023 - 2 * k)).unzip();
    let runs3 = many.runs(&ma, &mb)?;
    if runs3.len() != 512 {
        return fail(format!("expected 512 runs, got {}", runs3.len()));
    }
    rt.memset(&c.slice(), 0)?;
    // SAFETY: blocks 0..1024 of 64 bytes lie inside `a` and `c` (64 KiB of 384 KiB).
    pool_wait(&pool, "512 runs (uploaded table)", |tx| {
        Ok(unsafe { pool.copy_paged(DEV, &many, &runs3, move || move |r| drop(tx.send(r))) }?)
    })?;
    rt.copy_dtoh(&mut back, &c.slice())?;
    check("512 runs", &back, |i| {
        let b = i / 64;
        if i < 1024 * 64 && b % 2 == 1 {
            pat((1023 - b) * 64 + i % 64, 0x21)
        } else {
            0
        }
    })?;
    // Refused before anything is queued; make_done is not called.
    let zero = PagedCopy { layers: 0, ..strided };
    // SAFETY: nothing is queued (the job is refused).
    match unsafe { pool.copy_paged(DEV, &zero, &runs2, || -> fn(mori_gpu::Result<()>) { panic!("make_done called on a refused job") }) } {
        Err(GpuError::InvalidArgument(m)) if m.contains("layers is 0") => {}
        other => return fail(format!("zero layers: {other:?}")),
    }
    println!("copy pool: paged copies (merged and strided, both directions, inline and uploaded run tables, 512 runs, per range) and a staged descriptor table");
    Ok(())
}
