//! The ring proxy over MORI-IO xgmi with host producers (no EP kernel): a burst of tail
//! commands to one rank, each carrying its counter pair's total, lands every segment and every
//! pair under each `RingProxyOptions::tail_words` setting; a burst with more pairs for one rank
//! than a batch's tail words (32 pairs) copies its pairs instead of failing. Ignored: needs a
//! GPU, or the stand-in libcuda (`proxy_xgmi_fake.rs` runs it on the CPU in CI, also with the
//! copy pool's resident copier). A replaced peer (window or engine) fails the proxy with the
//! rank named and receives nothing.

use mori_ep::proxy::{PeerWindow, RingProxy, RingProxyOptions, TailWords};
use mori_ep::ring::{CmdOp, RingCmd, RingLayout, RingMem, RingProducer};
use mori_io::{BackendConfig, EngineConfig, IoEngine, MemLoc, XgmiConfig};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEN: usize = 1 << 20;
/// Where command k's pair lies in the producer's window, and where it lands in the peer's.
const PAIR_SRC: u64 = 600 << 10;
const PAIR_DST: u64 = 512 << 10;

fn engine(key: &str) -> Arc<IoEngine> {
    let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    e.create_backend(BackendConfig::Xgmi(XgmiConfig::default())).unwrap();
    Arc::new(e)
}

/// Two engines on GPU 0 with a window each (the producer's holding `src`, the peer's zeroed),
/// registered with each other, and a 64-slot ring in host memory (freed when dropped: drop it
/// after the proxy stopped).
struct Rig {
    rt: Arc<dyn mori_gpu::Runtime>,
    ea: Arc<IoEngine>,
    eb: Arc<IoEngine>,
    bb: mori_gpu::DeviceBuffer,
    ma: mori_io::MemoryDesc,
    mb: mori_io::MemoryDesc,
    ring: *mut u8,
    ring_layout: Layout,
    mem: RingMem,
    head: AtomicU64,
    // The producer's buffer, registered as `ma` (dropped last).
    _ba: mori_gpu::DeviceBuffer,
}

impl Rig {
    fn new(tag: &str, src: &[u8]) -> Rig {
        let rt = mori_gpu::detect().expect("a CUDA runtime (or the stand-in)");
        let dev = mori_gpu::Device(0);
        eprintln!("device: {}", rt.device_properties(dev).unwrap().name);
        let (ea, eb) = (engine(&format!("pxa-{tag}")), engine(&format!("pxb-{tag}")));
        ea.register_remote_engine(eb.desc().clone()).unwrap();
        eb.register_remote_engine(ea.desc().clone()).unwrap();
        let (ba, bb) = (rt.alloc(dev, LEN).unwrap(), rt.alloc(dev, LEN).unwrap());
        rt.copy_htod(&ba.slice(), src).unwrap();
        rt.copy_htod(&bb.slice(), &vec![0u8; LEN]).unwrap();
        // SAFETY: both buffers are live device memory of LEN bytes, owned by the rig, which
        // outlives the registrations (the tests deregister before it drops).
        let (ma, mb) = unsafe {
            (
                ea.register_memory(ba.ptr() as usize as *mut u8, LEN, LOC).unwrap(),
                eb.register_memory(bb.ptr() as usize as *mut u8, LEN, LOC).unwrap(),
            )
        };
        let lay = RingLayout::new(64).unwrap();
        let ring_layout = Layout::from_size_align(lay.bytes(), 64).unwrap();
        // SAFETY: a non-zero size; freed in Drop.
        let ring = unsafe { alloc_zeroed(ring_layout) };
        // SAFETY: 64-aligned, zeroed, lay.bytes() long, used by the test's producer and proxy only.
        let mem = unsafe { RingMem::new(ring, lay).unwrap() };
        Rig { rt, ea, eb, bb, ma, mb, ring, ring_layout, mem, head: AtomicU64::new(0), _ba: ba }
    }

    /// The peer's window as the proxy's only destination (rank 0).
    fn peers(&self) -> Vec<Option<PeerWindow>> {
        vec![Some(PeerWindow { data: self.mb.clone(), counters: self.mb.clone() })]
    }

    /// The peer's window, read back.
    fn peer_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; LEN];
        self.rt.copy_dtoh(&mut out, &self.bb.slice()).unwrap();
        out
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`; the tests stop their proxy first.
        unsafe { dealloc(self.ring, self.ring_layout) };
    }
}

/// Where the rig's windows live.
const LOC: MemLoc = MemLoc::Gpu { device: 0 };

/// `n` commands to rank 0 (1 KiB of data each, then pair `(k + 4, k + 5)`, also staged in the
/// producer's window as the kernels stage it) pushed before the proxy starts, so they form one
/// burst; checks every byte and pair at the peer; returns the proxy's tail-word batches.
fn burst(n: u64, mode: Option<TailWords>) -> u64 {
    let tag = format!("{n}-{mode:?}");
    let mut src: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    for k in 0..n {
        let at = (PAIR_SRC + 16 * k) as usize;
        src[at..at + 8].copy_from_slice(&(k + 4).to_le_bytes());
        src[at + 8..at + 16].copy_from_slice(&(k + 5).to_le_bytes());
    }
    let rig = Rig::new(&tag, &src);
    let prod = RingProducer::new(rig.mem, &rig.head);
    for k in 0..n {
        let cmd = RingCmd {
            dst: 0,
            local_off: k * 1024,
            remote_off: k * 1024,
            len: 1024,
            counter: PAIR_DST + 16 * k,
            op: CmdOp::Tail { src: PAIR_SRC + 16 * k, total: Some(k + 5) },
        };
        prod.push(&cmd, Instant::now() + Duration::from_secs(5)).unwrap();
    }
    let opts = RingProxyOptions { tail_words: mode, ..RingProxyOptions::SHORT_SPIN };
    let proxy = RingProxy::start(&tag, rig.ea.clone(), rig.ma.clone(), rig.peers(), rig.mem, opts).unwrap();
    let t0 = Instant::now();
    while proxy.stats().bytes < n * 1024 && proxy.failure().is_none() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(proxy.failure(), None, "{tag}: the proxy failed");
    let stats = proxy.stop().unwrap_or_else(|e| panic!("{tag}: {e}"));
    let out = rig.peer_bytes();
    assert_eq!(&out[..(n * 1024) as usize], &src[..(n * 1024) as usize], "{tag}: the segments");
    for k in 0..n {
        let at = (PAIR_DST + 16 * k) as usize;
        let pair = [0, 8].map(|o| u64::from_le_bytes(out[at + o..at + o + 8].try_into().unwrap()));
        assert_eq!(pair, [k + 4, k + 5], "{tag}: pair {k}");
    }
    assert_eq!((stats.commands, stats.bytes), (n, n * 1024), "{tag}: {stats:?}");
    rig.ea.deregister_memory(&rig.ma).unwrap();
    rig.eb.deregister_memory(&rig.mb).unwrap();
    stats.word_batches
}

#[test]
#[ignore = "needs a GPU (or the stand-in libcuda: proxy_xgmi_fake.rs)"]
fn a_burst_lands_its_segments_and_pairs_with_or_without_tail_words() {
    assert_eq!(burst(20, None), 0, "off by default");
    assert_eq!(burst(20, Some(TailWords::Off)), 0);
    assert_eq!(burst(20, Some(TailWords::Single)), 1, "one batch for the one rank, its 20 pairs as 40 words");
    assert_eq!(burst(20, Some(TailWords::All)), 1);
    // 40 pairs are 80 words, over a batch's 64: copied from the window, not refused.
    assert_eq!(burst(40, Some(TailWords::Single)), 0);
    assert_eq!(burst(40, Some(TailWords::All)), 0);
    // A burst of 3 (6 segments: within one ordered-copy table) goes as one ordered batch: a
    // launch, or with MORI_GPU_POOL_RESIDENT set a post to the resident copier.
    let before = mori_gpu::submit_stats();
    assert_eq!(burst(3, Some(TailWords::Off)), 0);
    let st = mori_gpu::submit_stats().since(&before);
    println!("copy pool: {} ordered launches, {} resident posts", st.ordered_launches, st.resident_posts);
}

/// The peer replaced after two commands landed over the proxy's session: its window
/// deregistered and registered again (`engine_too` false), or its engine replaced by a new one of
/// the same key holding the same memory (`engine_too` true). The proxy still holds the old window,
/// so the next command fails the proxy with an error naming the rank, and nothing lands in the
/// new registration. A replaced window fails the session's post (the route finds the window
/// gone); a replaced engine kills the session, which the proxy makes again from the old
/// window: refused, as is the engine's one-shot call it then falls back to.
fn replaced(engine_too: bool) {
    let tag = if engine_too { "engine" } else { "window" };
    let src: Vec<u8> = (0..LEN).map(|i| (i % 241) as u8).collect();
    let rig = Rig::new(&format!("replaced-{tag}"), &src);
    let (ea, eb, ma, mb) = (&rig.ea, &rig.eb, &rig.ma, &rig.mb);
    let prod = RingProducer::new(rig.mem, &rig.head);
    let cmd = |k: u64| RingCmd {
        dst: 0,
        local_off: k * 1024,
        remote_off: k * 1024,
        len: 1024,
        counter: PAIR_DST + 16 * k,
        op: CmdOp::Tail { src: PAIR_SRC + 16 * k, total: None },
    };
    let proxy =
        RingProxy::start(&format!("replaced-{tag}"), ea.clone(), ma.clone(), rig.peers(), rig.mem, RingProxyOptions::SHORT_SPIN).unwrap();
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let t0 = Instant::now();
        while !done() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(done(), "{what}: not after 20 s; stats {:?}, failure {:?}", proxy.stats(), proxy.failure());
    };
    for k in 0..2 {
        prod.push(&cmd(k), Instant::now() + Duration::from_secs(5)).unwrap();
    }
    wait("the first two commands", &|| proxy.stats().bytes == 2048);
    assert_eq!(proxy.failure(), None);
    assert_eq!(&rig.peer_bytes()[..2048], &src[..2048], "the commands before the replacement");
    rig.rt.copy_htod(&rig.bb.slice(), &vec![0u8; LEN]).unwrap();
    // What stays registered at the end, and the engine that holds it.
    let (owner, mb2) = if engine_too {
        // A new engine of the same key (a restarted peer) with the same memory; this engine
        // drops what it knew of the old one when told of the new one (synchronously).
        let e2 = Arc::new(IoEngine::new(&format!("pxb-replaced-{tag}"), EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap());
        e2.create_backend(BackendConfig::Xgmi(XgmiConfig::default())).unwrap();
        ea.register_remote_engine(e2.desc().clone()).unwrap();
        // SAFETY: as above.
        let m = unsafe { e2.register_memory(rig.bb.ptr() as usize as *mut u8, LEN, LOC).unwrap() };
        (e2, m)
    } else {
        // The same memory registered again, under a new descriptor. The owner's
        // deregistration reaches this engine as a message (asynchronously, as with any
        // transfer engine: a job quiesces its writers before it deregisters), so the command
        // is pushed once a probe write of this engine to the old window's last 16 bytes fails.
        let probe = ea.create_session(ma, mb).unwrap();
        let tail = (LEN - 16) as u64;
        eb.deregister_memory(mb).unwrap();
        // SAFETY: as above.
        let m = unsafe { eb.register_memory(rig.bb.ptr() as usize as *mut u8, LEN, LOC).unwrap() };
        wait("this engine told of the deregistration", &|| {
            probe.write(tail, tail, 16, ea.allocate_transfer_uid()).wait_for(Duration::from_secs(5)).is_err()
        });
        (eb.clone(), m)
    };
    prod.push(&cmd(2), Instant::now() + Duration::from_secs(5)).unwrap();
    wait("the failure after the replacement", &|| proxy.failure().is_some());
    let failure = proxy.failure().unwrap();
    assert!(failure.contains("rank 0"), "the failure names the destination rank: {failure}");
    let stats = proxy.stop();
    assert!(stats.is_err(), "stop reports the failure");
    let out = rig.peer_bytes();
    assert!(out[..LEN - 16].iter().all(|&b| b == 0), "nothing landed in the replaced window (but the probe's bytes)");
    println!("replaced peer {tag}: the proxy failed with: {failure}");
    ea.deregister_memory(ma).unwrap();
    owner.deregister_memory(&mb2).unwrap();
    if engine_too {
        eb.deregister_memory(mb).unwrap();
    }
}

#[test]
#[ignore = "needs a GPU (or the stand-in libcuda: proxy_xgmi_fake.rs)"]
fn a_replaced_peer_window_fails_the_proxy_and_receives_nothing() {
    replaced(false);
}

#[test]
#[ignore = "needs a GPU (or the stand-in libcuda: proxy_xgmi_fake.rs)"]
fn a_replaced_peer_engine_fails_the_proxy_and_receives_nothing() {
    replaced(true);
}
