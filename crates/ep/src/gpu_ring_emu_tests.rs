//! kernels/ep_proxy.cu run on CPU threads (`mori_gpu.h`'s `MORI_HOST_EMU`: every GPU thread
//! an OS thread, device memory = host memory), producing into a ring that a real
//! [`RingProxy`] carries over MORI-IO tcp: the kernel source's producer (`mori_ring_push`),
//! staging and fault words are checked without a GPU, with the kernel ABI structs of this
//! module.

use super::*;
use crate::emu_support::{launch, Region};
use crate::proxy::{PeerWindow, RingProxy, RingProxyOptions};
use crate::ring::CmdOp;
use crate::ring::{RingConsumer, RingLayout, RingMem};
use mori_io::{BackendConfig, EngineConfig, IoEngine, MemLoc, TcpConfig};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

fn tcp_engine(key: &str) -> Arc<IoEngine> {
    let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 4, min_lane_bytes: 64, ..TcpConfig::default() })).unwrap();
    Arc::new(e)
}

fn status(r: &Region) -> [u32; 4] {
    let b = r.bytes();
    std::array::from_fn(|i| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]))
}

/// The flood kernel's warps (2 blocks x 2 warps, 16 chunks each) push 64 commands through an
/// 8-slot ring (full, each warp waiting for room, for 300 ms before the proxy starts) while a proxy carries them over 4
/// tcp lanes; then the round-trip kernel does 20
/// round trips of 3000 B. Every destination byte and counter is checked.
#[test]
fn ring_kernels_emulated_on_cpu_threads_through_a_tcp_proxy() {
    let (src_eng, dst_eng) = (tcp_engine("emu-src"), tcp_engine("emu-dst"));
    src_eng.register_remote_engine(dst_eng.desc().clone()).unwrap();
    dst_eng.register_remote_engine(src_eng.desc().clone()).unwrap();
    let (chunk, len, warps, blocks, per_warp, counters) = (4160u64, 4096u64, 2u32, 2u32, 16u32, 16u32);
    let chunks = (blocks * warps * per_warp) as u64;
    let bytes = (chunks * chunk) as usize;
    let (src, dst, ctr) = (Region::new(bytes), Region::new(bytes), Region::new(4096));
    // SAFETY: the regions outlive their registrations (deregistered at the end).
    let (src_m, dst_m, ctr_m) = unsafe {
        (
            src_eng.register_memory(src.ptr, bytes, MemLoc::Host { numa: None }).unwrap(),
            dst_eng.register_memory(dst.ptr, bytes, MemLoc::Host { numa: None }).unwrap(),
            dst_eng.register_memory(ctr.ptr, 4096, MemLoc::Host { numa: None }).unwrap(),
        )
    };
    let lay = RingLayout::new(8).unwrap();
    let ring_region = Region::new(lay.bytes());
    // SAFETY: 64-aligned, zeroed, outlives the proxy (stopped below).
    let mem = unsafe { RingMem::new(ring_region.ptr, lay).unwrap() };
    let head = Region::new(64);
    let peers = vec![Some(PeerWindow { data: dst_m.clone(), counters: ctr_m.clone() })];
    let ring = RingDev { head: head.addr(), region: ring_region.addr(), slots: 8, pad: 0 };
    let st = Region::new(64);
    let p = FloodParams {
        ring,
        src: src.addr(),
        status: st.addr(),
        chunk,
        len,
        timeout_ns: 30_000_000_000,
        counter_base: 64,
        dst: 0,
        per_warp,
        counters,
        pad: 0,
    };
    // The proxy starts only once the warps have filled the ring and wait for room.
    let proxy = std::thread::scope(|s| {
        let k = s.spawn(|| launch("ep_proxy", "mori_ep_ring_flood", blocks, warps * 32, &p));
        // Every slot taken, then no ticket beyond one waiting push per warp.
        let until = Instant::now() + Duration::from_secs(20);
        while head.u64_at(0).load(Ordering::Acquire) < 8 {
            assert!(Instant::now() < until, "the warps never filled the ring");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(300));
        let taken = head.u64_at(0).load(Ordering::Acquire);
        assert!(taken <= 8 + (blocks * warps) as u64, "{taken} tickets taken with 8 slots and no consumer: a push did not wait for room");
        let proxy = RingProxy::start("emu", src_eng.clone(), src_m.clone(), peers, mem, RingProxyOptions::SHORT_SPIN).unwrap();
        k.join().unwrap();
        proxy
    });
    assert_eq!(status(&st), [0; 4], "flood fault words");
    let deadline = Instant::now() + Duration::from_secs(20);
    let per_counter = chunks / counters as u64;
    while (0..counters as usize).any(|c| ctr.u64_at(64 + 8 * c).load(Ordering::Acquire) < per_counter) {
        assert!(Instant::now() < deadline, "counters stuck; proxy {:?} {:?}", proxy.stats(), proxy.failure());
        std::thread::sleep(Duration::from_millis(1));
    }
    for c in 0..chunks {
        let d = &dst.bytes()[(c * chunk) as usize..(c * chunk + chunk) as usize];
        for w in 0..(len / 4) as usize {
            let got = u32::from_le_bytes([d[4 * w], d[4 * w + 1], d[4 * w + 2], d[4 * w + 3]]);
            assert_eq!(got, flood_word(c as u32, w as u32), "chunk {c} word {w}");
        }
        assert!(d[len as usize..].iter().all(|&b| b == 0), "chunk {c}: bytes past its length written");
    }
    for c in 0..counters as usize {
        assert_eq!(ctr.u64_at(64 + 8 * c).load(Ordering::Acquire), per_counter, "counter {c}");
    }
    // Round trips: 3000 B from offset 0 to offset 8192, Add 1 on counter 0 each time.
    let times = Region::new(20 * 8);
    let st2 = Region::new(64);
    let rt = RoundtripParams {
        ring,
        counter: ctr.addr(),
        times: times.addr(),
        status: st2.addr(),
        local_off: 0,
        remote_off: 8192,
        len: 3000,
        counter_off: 0,
        base: 0,
        timeout_ns: 30_000_000_000,
        dst: 0,
        iters: 20,
    };
    launch("ep_proxy", "mori_ep_ring_roundtrip", 1, 32, &rt);
    assert_eq!(status(&st2), [0; 4], "round-trip fault words");
    assert_eq!(ctr.u64_at(0).load(Ordering::Acquire), 20);
    let t = times.bytes();
    for i in 0..20 {
        let ns = u64::from_le_bytes(t[8 * i..8 * i + 8].try_into().unwrap());
        assert!(ns > 0 && ns < 30_000_000_000, "round trip {i}: {ns} ns");
    }
    assert_eq!(&dst.bytes()[8192..8192 + 3000], &src.bytes()[..3000]);
    let stats = proxy.stop().unwrap();
    assert_eq!(stats.commands, chunks + 20);
    assert_eq!(stats.bytes, chunks * len + 20 * 3000);
    for (e, m) in [(&src_eng, &src_m), (&dst_eng, &dst_m), (&dst_eng, &ctr_m)] {
        e.deregister_memory(m).unwrap();
    }
}

/// No consumer: the flood's pushes find the 4-slot ring full, and the kernel records
/// RING_ERR_FULL with the warp and chunk before its deadline; the round trip, with a consumer
/// that never signals, records the counter timeout of iteration 0.
#[test]
fn ring_kernel_faults_land_in_the_status_words() {
    let lay = RingLayout::new(4).unwrap();
    let ring_region = Region::new(lay.bytes());
    let head = Region::new(64);
    let ring = RingDev { head: head.addr(), region: ring_region.addr(), slots: 4, pad: 0 };
    let (src, st) = (Region::new(16 * 256), Region::new(64));
    let p = FloodParams {
        ring,
        src: src.addr(),
        status: st.addr(),
        chunk: 256,
        len: 256,
        timeout_ns: 50_000_000,
        counter_base: 0,
        dst: 0,
        per_warp: 8,
        counters: 1,
        pad: 0,
    };
    let t0 = Instant::now();
    launch("ep_proxy", "mori_ep_ring_flood", 1, 64, &p);
    assert!(t0.elapsed() < Duration::from_secs(20), "the full ring's wait is bounded by the deadline");
    let s = status(&st);
    assert_eq!(RingKernelFault::from_status(s).map(|f| matches!(f, RingKernelFault::RingFull(..))), Some(true), "{s:?}");
    assert!(s[1] < 2 && s[2] < 16, "warp {} chunk {} out of range", s[1], s[2]);
    // Exactly the 4 slots' commands were written, in ticket order, each naming its chunk.
    // SAFETY: 64-aligned and zeroed; the launch has returned.
    let mut cons = RingConsumer::new(unsafe { RingMem::new(ring_region.ptr, lay).unwrap() });
    let mut got = Vec::new();
    cons.poll(&mut got, 16).unwrap();
    assert_eq!(got.len(), 4);
    for c in &got {
        assert_eq!((c.dst, c.len, c.counter, c.op), (0, 256, 0, CmdOp::Add(1)));
        assert!(c.local_off.is_multiple_of(256) && c.local_off == c.remote_off);
    }
    // Round trip: the counter never moves.
    let (ctr, times, st2) = (Region::new(64), Region::new(8), Region::new(64));
    let ring2_region = Region::new(RingLayout::new(4).unwrap().bytes());
    let head2 = Region::new(64);
    let rt = RoundtripParams {
        ring: RingDev { head: head2.addr(), region: ring2_region.addr(), slots: 4, pad: 0 },
        counter: ctr.addr(),
        times: times.addr(),
        status: st2.addr(),
        local_off: 0,
        remote_off: 0,
        len: 8,
        counter_off: 0,
        base: 0,
        timeout_ns: 50_000_000,
        dst: 0,
        iters: 1,
    };
    launch("ep_proxy", "mori_ep_ring_roundtrip", 1, 32, &rt);
    assert_eq!(RingKernelFault::from_status(status(&st2)), Some(RingKernelFault::CounterTimeout(0)));
}
