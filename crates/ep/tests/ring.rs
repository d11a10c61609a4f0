//! The proxy's command ring (`mori_ep::ring`) with host threads as producers, and the ring
//! proxy (`mori_ep::proxy::RingProxy`) carrying its commands as MORI-IO signalled writes over
//! tcp: every command arrives exactly once, each producer's in its order, never past a full
//! ring; every counter the target sees covers bytes that are already there.

use mori_ep::proxy::{PeerWindow, RingProxy, RingProxyOptions};
use mori_ep::ring::CmdOp;
use mori_ep::ring::{RingCmd, RingConsumer, RingError, RingLayout, RingMem, RingProducer};
use mori_io::{BackendConfig, EngineConfig, IoEngine, MemLoc, TcpConfig};
use proptest::prelude::*;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 64-byte aligned zeroed host memory, freed on drop.
struct Region {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the region is plain heap memory; the tests share it between threads only through the
// ring protocol (atomics) or after joins.
unsafe impl Send for Region {}
// SAFETY: as for Send.
unsafe impl Sync for Region {}

impl Region {
    fn new(bytes: usize) -> Self {
        let layout = Layout::from_size_align(bytes.max(64), 64).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Self { ptr, layout }
    }

    fn ring(&self, lay: RingLayout) -> RingMem {
        assert!(self.layout.size() >= lay.bytes());
        // SAFETY: 64-aligned, zeroed, lives for the test; only ring code touches it.
        unsafe { RingMem::new(self.ptr, lay).unwrap() }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: allocated and zeroed for layout.size() bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.layout.size());
        // SAFETY: aligned and inside the region.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off) as *mut u64) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// Spawns `producers` threads into `sc`, producer `p` pushing `cmd(p, k)` for k in 0..per into
/// the ring (30 s deadline per push).
fn spawn_producers<'scope, 'env, F>(
    sc: &'scope std::thread::Scope<'scope, 'env>,
    mem: RingMem,
    head: &'env AtomicU64,
    producers: usize,
    per: usize,
    cmd: &'env F,
) where
    F: Fn(usize, usize) -> RingCmd + Sync,
{
    for p in 0..producers {
        sc.spawn(move || {
            let prod = RingProducer::new(mem, head);
            for k in 0..per {
                prod.push(&cmd(p, k), Instant::now() + Duration::from_secs(30)).unwrap();
            }
        });
    }
}

/// Producer `p`'s command `i` (its fields encode both, so the consumer can check order).
fn cmd(p: u32, i: u64) -> RingCmd {
    RingCmd {
        dst: p,
        local_off: i,
        remote_off: i * 3 + p as u64,
        len: i % 7,
        counter: 8 * p as u64,
        op: if i.is_multiple_of(2) { CmdOp::Add(i + 1) } else { CmdOp::Set(i) },
    }
}

/// Runs `per[p]` pushes per producer thread against one consumer taking bursts of at most
/// `burst`; returns what the consumer got.
fn run_ring(slots: usize, per: &[u64], burst: usize, seed: u64) -> Vec<RingCmd> {
    let lay = RingLayout::new(slots).unwrap();
    let region = Region::new(lay.bytes());
    let mem = region.ring(lay);
    let head = AtomicU64::new(0);
    let total: u64 = per.iter().sum();
    let mut got = Vec::new();
    std::thread::scope(|s| {
        for (p, &n) in per.iter().enumerate() {
            let head = &head;
            s.spawn(move || {
                let prod = RingProducer::new(mem, head);
                for i in 0..n {
                    prod.push(&cmd(p as u32, i), Instant::now() + Duration::from_secs(20)).unwrap();
                }
            });
        }
        let mut cons = RingConsumer::new(mem);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut x = seed | 1;
        while (got.len() as u64) < total {
            assert!(Instant::now() < deadline, "consumer got {} of {total}", got.len());
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cons.poll(&mut got, 1 + (x as usize % burst)).unwrap();
            if x.is_multiple_of(5) {
                std::thread::yield_now();
            }
        }
        assert_eq!(cons.consumed(), total);
    });
    got
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Oracle: each producer's commands, in its order; nothing else, nothing twice.
    #[test]
    fn every_command_once_in_producer_order(
        slots_log in 1u32..7,
        per in proptest::collection::vec(0u64..300, 1..5),
        burst in 1usize..40,
        seed in any::<u64>(),
    ) {
        let slots = 1usize << slots_log;
        let got = run_ring(slots, &per, burst, seed);
        let mut next = vec![0u64; per.len()];
        for c in &got {
            let p = c.dst as usize;
            prop_assert!(p < per.len(), "unknown producer {p}");
            prop_assert_eq!(*c, cmd(p as u32, next[p]));
            next[p] += 1;
        }
        prop_assert_eq!(next, per);
    }
}

#[test]
fn a_full_ring_refuses_after_the_deadline_and_names_the_ticket() {
    let lay = RingLayout::new(2).unwrap();
    let region = Region::new(lay.bytes());
    let mem = region.ring(lay);
    let head = AtomicU64::new(0);
    let prod = RingProducer::new(mem, &head);
    let soon = || Instant::now() + Duration::from_millis(20);
    assert_eq!(prod.push(&cmd(0, 0), soon()), Ok(0));
    assert_eq!(prod.push(&cmd(0, 1), soon()), Ok(1));
    let e = prod.push(&cmd(0, 2), soon()).unwrap_err();
    assert_eq!(e, RingError::Full { slots: 2, ticket: 2, tail: 0 });
    assert_eq!(e.to_string(), "the proxy's command ring stayed full (2 slots, ticket 2, consumer at 0) until the deadline");
    // The consumer frees both slots; ticket 2 is reserved and never written, so it never shows.
    let mut cons = RingConsumer::new(mem);
    let mut got = Vec::new();
    assert_eq!(cons.poll(&mut got, 10), Ok(2));
    assert_eq!(got, vec![cmd(0, 0), cmd(0, 1)]);
    assert_eq!(cons.poll(&mut got, 10), Ok(0));
    assert_eq!(prod.push(&cmd(0, 3), soon()), Ok(3));
    assert_eq!(cons.poll(&mut got, 10), Ok(0), "ticket 3 waits behind the abandoned ticket 2");
}

#[test]
fn a_malformed_command_is_reported_and_the_rest_delivered() {
    let lay = RingLayout::new(4).unwrap();
    let region = Region::new(lay.bytes());
    let mem = region.ring(lay);
    let head = AtomicU64::new(0);
    let prod = RingProducer::new(mem, &head);
    let far = Instant::now() + Duration::from_secs(5);
    for i in 0..3 {
        prod.push(&cmd(1, i), far).unwrap();
    }
    // Corrupt ticket 1's op code (slot bytes 12..16).
    let off = lay.slot_offset(1) + 12;
    // SAFETY: inside the region; no thread is using the ring meanwhile.
    unsafe { std::ptr::write_unaligned(region.ptr.add(off) as *mut u32, 9) };
    let mut got = Vec::new();
    let mut cons = RingConsumer::new(mem);
    assert_eq!(cons.poll(&mut got, 10), Err(RingError::BadOp { ticket: 1, code: 9 }));
    assert_eq!(got, vec![cmd(1, 0), cmd(1, 2)]);
    assert_eq!(cons.consumed(), 3);
}

fn tcp_engine(key: &str, lanes: usize) -> Arc<IoEngine> {
    let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    e.create_backend(BackendConfig::Tcp(TcpConfig { lanes, min_lane_bytes: 64, ..TcpConfig::default() })).unwrap();
    Arc::new(e)
}

/// 4 producer threads push 2 000 commands each through a 64-slot ring; the proxy writes each
/// 1..4 KiB chunk over 4 tcp lanes and adds 1 to the producer's counter at the target, whose
/// checker verifies, every time a counter moves, every byte of every chunk it covers.
#[test]
fn ring_proxy_over_tcp_counters_never_run_ahead_of_the_data() {
    const PRODUCERS: usize = 4;
    const PER: u64 = 2000;
    const CHUNK: usize = 4096;
    let (src_eng, dst_eng) = (tcp_engine("ring-src", 4), tcp_engine("ring-dst", 4));
    src_eng.register_remote_engine(dst_eng.desc().clone()).unwrap();
    dst_eng.register_remote_engine(src_eng.desc().clone()).unwrap();
    let data_bytes = PRODUCERS * PER as usize * CHUNK;
    let src = Region::new(data_bytes);
    let dst = Region::new(data_bytes);
    let counters = Region::new(PRODUCERS * 8);
    // Source pattern: byte i of chunk (p, k) is a hash of (p, k, i).
    let pat = |p: usize, k: u64, i: usize| ((p as u64 * 131 + k * 31 + i as u64 * 7) % 251) as u8 + 1;
    // SAFETY: nothing else uses src yet.
    let s = unsafe { std::slice::from_raw_parts_mut(src.ptr, data_bytes) };
    for p in 0..PRODUCERS {
        for k in 0..PER {
            let base = (p * PER as usize + k as usize) * CHUNK;
            for i in 0..CHUNK {
                s[base + i] = pat(p, k, i);
            }
        }
    }
    let len_of = |k: u64| 1024 + (k as usize * 977) % (CHUNK - 1024);
    // SAFETY: the regions outlive the engines' use of them (deregistered below, before drop).
    let (src_m, dst_m, ctr_m) = unsafe {
        (
            src_eng.register_memory(src.ptr, data_bytes, MemLoc::Host { numa: None }).unwrap(),
            dst_eng.register_memory(dst.ptr, data_bytes, MemLoc::Host { numa: None }).unwrap(),
            dst_eng.register_memory(counters.ptr, PRODUCERS * 8, MemLoc::Host { numa: None }).unwrap(),
        )
    };
    let lay = RingLayout::new(64).unwrap();
    let ring_region = Region::new(lay.bytes());
    let mem = ring_region.ring(lay);
    let peers = vec![Some(PeerWindow { data: dst_m.clone(), counters: ctr_m.clone() })];
    let proxy = RingProxy::start("test", src_eng.clone(), src_m.clone(), peers, mem, RingProxyOptions::SHORT_SPIN).unwrap();
    let head = AtomicU64::new(0);
    let mut checks = 0u64;
    let cmd = |p: usize, k: usize| {
        let off = ((p * PER as usize + k) * CHUNK) as u64;
        RingCmd { dst: 0, local_off: off, remote_off: off, len: len_of(k as u64) as u64, counter: 8 * p as u64, op: CmdOp::Add(1) }
    };
    std::thread::scope(|sc| {
        spawn_producers(sc, mem, &head, PRODUCERS, PER as usize, &cmd);
        // The target's checker: when producer p's counter reads n, chunks 0..n of p are there.
        let mut seen = [0u64; PRODUCERS];
        let deadline = Instant::now() + Duration::from_secs(120);
        while seen.iter().any(|&n| n < PER) {
            assert!(Instant::now() < deadline, "counters at {seen:?} of {PER}; proxy: {:?} {:?}", proxy.stats(), proxy.failure());
            #[allow(clippy::needless_range_loop)] // p names the producer in the messages
            for p in 0..PRODUCERS {
                let n = counters.u64_at(8 * p).load(Ordering::Acquire);
                assert!(n <= PER, "counter {p} ran past {PER}: {n}");
                for k in seen[p]..n {
                    let base = (p * PER as usize + k as usize) * CHUNK;
                    let d = &dst.bytes()[base..base + len_of(k)];
                    assert!(
                        d.iter().enumerate().all(|(i, &b)| b == pat(p, k, i)),
                        "producer {p} chunk {k}: counter {n} ran ahead of its bytes"
                    );
                    checks += 1;
                }
                seen[p] = n;
            }
            std::thread::yield_now();
        }
    });
    assert_eq!(checks, PRODUCERS as u64 * PER);
    let stats = proxy.stop().unwrap();
    assert_eq!(stats.commands, PRODUCERS as u64 * PER);
    let want_bytes: u64 = (0..PER).map(|k| len_of(k) as u64).sum::<u64>() * PRODUCERS as u64;
    assert_eq!(stats.bytes, want_bytes);
    assert!(stats.batches >= 1 && stats.batches <= stats.commands);
    // Bytes past each chunk's length were never written.
    for p in 0..PRODUCERS {
        for k in 0..PER {
            let base = (p * PER as usize + k as usize) * CHUNK;
            assert!(dst.bytes()[base + len_of(k)..base + CHUNK].iter().all(|&b| b == 0));
        }
    }
    for (e, m) in [(&src_eng, &src_m), (&dst_eng, &dst_m), (&dst_eng, &ctr_m)] {
        e.deregister_memory(m).unwrap();
    }
}

/// Tail writes (`CmdOp::Tail`, the GPU AsyncLL path's completion pairs): 2 producers push 60
/// commands each, a 256 KiB..1 MiB chunk plus a 16-byte pair written into the target's window
/// once the chunk landed; over 8 tcp lanes, whose stripes land in any order. The target's
/// checker verifies, for every pair it sees, that the pair is the one sent and that every byte
/// of its chunk is already there; then that every pair arrived.
#[test]
fn ring_proxy_tail_writes_never_run_ahead_of_the_data() {
    const PRODUCERS: usize = 2;
    const PER: usize = 60;
    const CHUNK: usize = 1 << 20;
    let (src_eng, dst_eng) = (tcp_engine("tail-src", 8), tcp_engine("tail-dst", 8));
    src_eng.register_remote_engine(dst_eng.desc().clone()).unwrap();
    let n = PRODUCERS * PER;
    let pairs_at = n * CHUNK;
    let bytes = pairs_at + n * 16;
    let (src, dst) = (Region::new(bytes), Region::new(bytes));
    let pat = |c: usize, i: usize| ((c * 37 + i * 11) % 253) as u8 + 1;
    let len_of = |c: usize| (256 << 10) + (c * 7919) % (768 << 10);
    // SAFETY: nothing else uses src yet.
    let s = unsafe { std::slice::from_raw_parts_mut(src.ptr, bytes) };
    for c in 0..n {
        for i in 0..CHUNK {
            s[c * CHUNK + i] = pat(c, i);
        }
        s[pairs_at + c * 16..pairs_at + c * 16 + 8].copy_from_slice(&(c as u64 + 1).to_le_bytes());
        s[pairs_at + c * 16 + 8..pairs_at + c * 16 + 16].copy_from_slice(&(c as u64 + 2).to_le_bytes());
    }
    // SAFETY: the regions outlive the registrations (deregistered below).
    let (src_m, dst_m) = unsafe {
        (
            src_eng.register_memory(src.ptr, bytes, MemLoc::Host { numa: None }).unwrap(),
            dst_eng.register_memory(dst.ptr, bytes, MemLoc::Host { numa: None }).unwrap(),
        )
    };
    let lay = RingLayout::new(32).unwrap();
    let ring_region = Region::new(lay.bytes());
    let mem = ring_region.ring(lay);
    let proxy = RingProxy::start(
        "tail",
        src_eng.clone(),
        src_m.clone(),
        vec![Some(PeerWindow::single(dst_m.clone()))],
        mem,
        RingProxyOptions::SHORT_SPIN,
    )
    .unwrap();
    let head = AtomicU64::new(0);
    let cmd = |p: usize, k: usize| {
        let c = p * PER + k;
        RingCmd {
            dst: 0,
            local_off: (c * CHUNK) as u64,
            remote_off: (c * CHUNK) as u64,
            len: len_of(c) as u64,
            counter: (pairs_at + c * 16) as u64,
            op: CmdOp::Tail { src: (pairs_at + c * 16) as u64, total: None },
        }
    };
    std::thread::scope(|sc| {
        spawn_producers(sc, mem, &head, PRODUCERS, PER, &cmd);
        let mut done = vec![false; n];
        let mut left = n;
        let deadline = Instant::now() + Duration::from_secs(120);
        while left > 0 {
            assert!(Instant::now() < deadline, "{left} pairs missing; proxy: {:?} {:?}", proxy.stats(), proxy.failure());
            for (c, done_c) in done.iter_mut().enumerate() {
                if *done_c {
                    continue;
                }
                let total = dst.u64_at(pairs_at + c * 16 + 8).load(Ordering::Acquire);
                let arrived = dst.u64_at(pairs_at + c * 16).load(Ordering::Acquire);
                if total == 0 && arrived == 0 {
                    continue;
                }
                // The pair may show one word first; either word visible means the chunk is.
                assert!(arrived == 0 || arrived == c as u64 + 1, "command {c}: arrived word {arrived}");
                assert!(total == 0 || total == c as u64 + 2, "command {c}: total word {total}");
                let d = &dst.bytes()[c * CHUNK..c * CHUNK + len_of(c)];
                assert!(d.iter().enumerate().all(|(i, &b)| b == pat(c, i)), "command {c}: its pair landed before its bytes");
                if arrived != 0 && total != 0 {
                    *done_c = true;
                    left -= 1;
                }
            }
            std::thread::yield_now();
        }
    });
    let stats = proxy.stop().unwrap();
    assert_eq!(stats.commands, n as u64);
    assert_eq!(stats.data_batches, stats.batches, "every batch carried data");
    // tcp lanes do not keep a batch's order: each batch is its data write, then, once the
    // bytes landed, one tail write.
    assert_eq!(stats.ordered_batches, 0, "{stats:?}");
    assert_eq!(stats.post_calls, 2 * stats.batches, "{stats:?}");
    assert!(stats.post_call_ns > 0 && stats.data_ns > 0 && stats.done_ns >= stats.data_ns, "{stats:?}");
    for (e, m) in [(&src_eng, &src_m), (&dst_eng, &dst_m)] {
        e.deregister_memory(m).unwrap();
    }
}

/// A command for a rank the proxy has no window of fails the proxy, naming the rank.
#[test]
fn ring_proxy_names_an_unknown_destination() {
    let eng = tcp_engine("ring-lonely", 1);
    let src = Region::new(4096);
    // SAFETY: src outlives the registration (deregistered below).
    let m = unsafe { eng.register_memory(src.ptr, 4096, MemLoc::Host { numa: None }).unwrap() };
    let lay = RingLayout::new(4).unwrap();
    let ring_region = Region::new(lay.bytes());
    let mem = ring_region.ring(lay);
    let proxy = RingProxy::start("lonely", eng.clone(), m.clone(), vec![None, None], mem, RingProxyOptions::SHORT_SPIN).unwrap();
    let head = AtomicU64::new(0);
    RingProducer::new(mem, &head)
        .push(
            &RingCmd { dst: 1, local_off: 0, remote_off: 0, len: 8, counter: 0, op: CmdOp::Add(1) },
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.failure().is_none() {
        assert!(Instant::now() < deadline, "no failure reported");
        std::thread::sleep(Duration::from_millis(1));
    }
    let e = proxy.stop().unwrap_err();
    assert!(e.contains("rank 1 has no window registered"), "{e}");
    eng.deregister_memory(&m).unwrap();
}
