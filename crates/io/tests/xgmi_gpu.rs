//! GPU tests of the xgmi backend through `IoEngine`: they need a CUDA (or HIP) device and are
//! ignored elsewhere. The project's GPU machine has ONE GPU, so everything runs on device 0:
//! two engines in one process (same address space: the backend uses the pointers directly)
//! and two processes on the same GPU (real IPC: the child exports, the parent maps).
//!
//! ```text
//! cargo test -p mori-io --test xgmi_gpu --no-run         # build here
//! cargo test -p mori-io --test xgmi_gpu -- --ignored --nocapture --test-threads=1
//! ```
//!
//! Every test prints what it measured (stderr) and asserts real values. The two-process test
//! re-executes this test binary as the child (`--exact xgmi_child_target --ignored`) with
//! `MORI_XGMI_TEST_CHILD=target`; run without that variable, the child entry only checks the
//! line protocol. The child is killed and reaped by a guard; every wait has a deadline.

use mori_gpu::{Device, DeviceBuffer, IpcHandle, ModuleImage, Runtime, RuntimeKind};
use mori_io::{
    BackendConfig, BackendKind, EngineConfig, EngineDesc, ErrorCode, IoEngine, IoError, MemLoc, MemoryDesc, TcpConfig, TransferStatus,
    XgmiConfig,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const DEV: Device = Device(0);
const GPU0: MemLoc = MemLoc::Gpu { device: 0 };
const MIB: usize = 1 << 20;
/// Deadline of every transfer wait.
const T: Duration = Duration::from_secs(30);
/// Deadline of waiting for an inbound notification to be poppable.
const INBOUND_WAIT: Duration = Duration::from_secs(10);

// The scatter/gather kernel images the backend loads (crates/io-xgmi/src/backend.rs), loaded
// here too to prove that the kernel path is really available on this machine.
static SG_CUBIN: &[u8] = include_bytes!("../../../kernels/prebuilt/scatter_gather_copy.sm_90.cubin");
static SG_PTX: &str = include_str!("../../../kernels/prebuilt/scatter_gather_copy.sm_90.ptx");
static SG_GFX942: &[u8] = include_bytes!("../../../kernels/prebuilt/scatter_gather_copy.gfx942.hsaco");
const SG_NAME: &str = "mori_scatter_gather_copy";

#[path = "xgmi_gpu/incarnation.rs"]
mod incarnation;
#[path = "xgmi_gpu/ordered_multi.rs"]
mod ordered_multi;
#[path = "xgmi_gpu/ordered_sessions.rs"]
mod ordered_sessions;
#[path = "xgmi_gpu/outcomes.rs"]
mod outcomes;
#[path = "xgmi_gpu/paged.rs"]
mod paged;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn rt() -> Arc<dyn Runtime> {
    let rt = mori_gpu::detect().unwrap_or_else(|e| panic!("no GPU runtime: {e}"));
    let p = rt.device_properties(DEV).unwrap_or_else(|e| panic!("properties of GPU 0: {e}"));
    eprintln!(
        "runtime {} from {}; GPU 0: {} ({}, {} SMs, cc {}.{})",
        rt.kind(),
        rt.library(),
        p.name,
        p.pci_bus_id,
        p.multiprocessors,
        p.compute_capability.0,
        p.compute_capability.1
    );
    rt
}

fn xgmi(kernel_threshold: usize) -> BackendConfig {
    BackendConfig::Xgmi(XgmiConfig { num_streams: 16, num_events: 64, kernel_threshold, ..XgmiConfig::default() })
}

/// Byte `i` of a pattern: not periodic over any small stride, so a copy landing at a wrong
/// offset (an IPC offset ignored, a descriptor off by a few bytes) shows.
fn pattern(seed: u8, i: usize) -> u8 {
    let x = ((i as u64) ^ ((seed as u64) << 48)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((x >> 56) as u8) ^ seed
}

fn patterned(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(seed, i)).collect()
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, continued from `h` (start with [`FNV0`]).
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Panics naming the first differing byte and the number of differing bytes.
fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        let n = got.iter().zip(want).filter(|(a, b)| a != b).count();
        panic!("{what}: {n} of {} bytes differ, the first at {first}: got {:#04x}, want {:#04x}", got.len(), got[first], want[first]);
    }
}

/// `dst[doffs[i]..+sizes[i]] = src[soffs[i]..+sizes[i]]` for every entry, in order.
fn apply(dst: &mut [u8], doffs: &[u64], src: &[u8], soffs: &[u64], sizes: &[u64]) {
    for ((&d, &s), &n) in doffs.iter().zip(soffs).zip(sizes) {
        let (d, s, n) = (d as usize, s as usize, n as usize);
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
    }
}

fn snapshot(rt: &Arc<dyn Runtime>, buf: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; buf.len()];
    rt.copy_dtoh(&mut v, &buf.slice()).unwrap_or_else(|e| panic!("copy_dtoh of {} bytes: {e}", buf.len()));
    v
}

/// Polls `pop_inbound_status` until it answers or `within` passes (`None` then).
fn pop_inbound(eng: &IoEngine, from: &str, id: u64, within: Duration) -> Option<Result<(), IoError>> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(r) = eng.pop_inbound_status(from, id) {
            return Some(r);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits for a status and returns how long it took; panics with `what` on error.
fn wait(what: &str, st: TransferStatus) -> Duration {
    let t0 = Instant::now();
    st.wait_for(T).unwrap_or_else(|e| panic!("{what}: {e}"));
    t0.elapsed()
}

/// Asserts `r` is an `InvalidArgs` error (containing `words`) and returns its message.
fn expect_invalid(what: &str, r: Result<(), IoError>, words: &[&str]) -> String {
    expect_code(what, r, ErrorCode::InvalidArgs, words)
}

/// Asserts `r` is an error of `code` (containing `words`) and returns its message.
fn expect_code(what: &str, r: Result<(), IoError>, code: ErrorCode, words: &[&str]) -> String {
    let e = match r {
        Ok(()) => panic!("{what}: succeeded, expected {code:?}"),
        Err(e) => e,
    };
    assert_eq!(e.code, code, "{what}: {e}");
    for w in words {
        assert!(e.msg.contains(w), "{what}: message lacks {w:?}: {e}");
    }
    e.msg
}

/// An engine with a GPU allocation of which `[reg_off, reg_off + reg_len)` is registered.
/// Fields drop in declaration order: the engine before the memory it registered.
struct GpuSide {
    eng: IoEngine,
    mem: MemoryDesc,
    /// What the whole allocation held when it was registered.
    init: Vec<u8>,
    reg_off: usize,
    buf: DeviceBuffer,
}

impl GpuSide {
    fn key(&self) -> &str {
        &self.eng.desc().key
    }
}

fn gpu_side(rt: &Arc<dyn Runtime>, key: &str, cfgs: Vec<BackendConfig>, alloc: usize, reg: (usize, usize), seed: u8) -> GpuSide {
    let (reg_off, reg_len) = reg;
    assert!(reg_off + reg_len <= alloc);
    let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    for c in cfgs {
        eng.create_backend(c).unwrap_or_else(|e| panic!("engine {key}: create backend: {e}"));
    }
    let buf = rt.alloc(DEV, alloc).unwrap_or_else(|e| panic!("alloc {alloc} bytes on GPU 0: {e}"));
    let init = patterned(seed, alloc);
    rt.copy_htod(&buf.slice(), &init).unwrap();
    // SAFETY: the range lies inside `buf`, a live device allocation of GPU 0 that is freed only
    // after the engine (declared before it in GpuSide) dropped; every transfer is waited for.
    let mem = unsafe { eng.register_memory((buf.ptr() as usize + reg_off) as *mut u8, reg_len, GPU0) }
        .unwrap_or_else(|e| panic!("engine {key}: register GPU memory: {e}"));
    assert_eq!((mem.len, mem.loc), (reg_len as u64, GPU0));
    assert!(mem.handle(BackendKind::Xgmi).is_some(), "registration carries an xgmi IPC handle");
    GpuSide { eng, mem, init, reg_off, buf }
}

fn connect(a: &GpuSide, b: &GpuSide) {
    a.eng.register_remote_engine(b.eng.desc().clone()).unwrap();
    b.eng.register_remote_engine(a.eng.desc().clone()).unwrap();
}

/// Deterministic SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// A scattered batch: `n` entries of `min..=max` bytes, with gaps of at least one byte on
/// both sides (so the engine merges nothing) and the remote side in a shuffled order.
struct Scattered {
    lo: Vec<u64>,
    ro: Vec<u64>,
    sz: Vec<u64>,
    /// One past the last local / remote byte used.
    local_end: u64,
    remote_end: u64,
}

fn scattered(n: usize, min: u64, max: u64, seed: u64, local_start: u64, remote_start: u64) -> Scattered {
    let mut rng = Rng(seed);
    let sz: Vec<u64> = (0..n).map(|_| rng.range(min, max)).collect();
    let mut lo = Vec::with_capacity(n);
    let mut cur = local_start + rng.range(0, 15);
    for &s in &sz {
        lo.push(cur);
        cur += s + rng.range(1, 17);
    }
    let local_end = cur;
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.range(0, i as u64) as usize);
    }
    let mut ro = vec![0u64; n];
    let mut cur = remote_start + rng.range(0, 15);
    for &i in &order {
        ro[i] = cur;
        cur += sz[i] + rng.range(1, 23);
    }
    Scattered { lo, ro, sz, local_end, remote_end: cur }
}

/// Loads the scatter/gather kernel as the backend does; the image that worked.
fn kernel_image(rt: &Arc<dyn Runtime>) -> Result<&'static str, String> {
    let images: &[(&'static str, ModuleImage<'static>)] = match rt.kind() {
        RuntimeKind::Cuda => &[("sm_90 cubin", ModuleImage::Cubin(SG_CUBIN)), ("sm_90 PTX", ModuleImage::Ptx(SG_PTX))],
        RuntimeKind::Hip => &[("gfx942 code object", ModuleImage::HipCodeObject(SG_GFX942))],
    };
    let mut errs = Vec::new();
    for (name, img) in images {
        match rt.load_module(DEV, *img).and_then(|m| m.function(SG_NAME)) {
            Ok(_) => return Ok(name),
            Err(e) => errs.push(format!("{name}: {e}")),
        }
    }
    Err(errs.join("; "))
}

// ---------------------------------------------------------------------------------------------
// 1. Same process: scattered batch write and read
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn same_process_batch_write_and_read() {
    let rt = rt();
    let len = 4 * MIB;
    let a = gpu_side(&rt, "xgmi-t1-a", vec![xgmi(32)], len, (0, len), 0x11);
    let b = gpu_side(&rt, "xgmi-t1-b", vec![xgmi(32)], len, (0, len), 0x5c);
    connect(&a, &b);
    assert_eq!(a.eng.backend_for(&a.mem, &b.mem).unwrap(), BackendKind::Xgmi);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    assert_eq!(sess.backend(), BackendKind::Xgmi);

    // Write: 4 KiB, 1 byte, 2.5 MB misaligned on both sides; nothing contiguous.
    let (lo, ro, sz) = ([0u64, 5000, 100_003], [700_000u64, 10, 1_300_001], [4096u64, 1, 2_500_000]);
    let id = a.eng.allocate_transfer_uid();
    let t_write = wait("batch write", sess.batch_write(&lo, &ro, &sz, id));
    let mut want_b = b.init.clone();
    apply(&mut want_b, &ro, &a.init, &lo, &sz);
    let got_b = snapshot(&rt, &b.buf);
    assert_bytes("target after the batch write", &got_b, &want_b);
    assert_eq!(got_b[9], b.init[9], "byte before the 1-byte entry untouched");
    assert_eq!(got_b[11], b.init[11], "byte after the 1-byte entry untouched");
    assert_eq!(got_b[1_300_000], b.init[1_300_000], "byte before the large entry untouched");
    assert_eq!(got_b[3_800_001], b.init[3_800_001], "byte after the large entry untouched");
    assert_eq!(snapshot(&rt, &a.buf), a.init, "the source of a write is unchanged");

    // The target learns of it through a control-plane notification, once.
    let t0 = Instant::now();
    let st = pop_inbound(&b.eng, a.key(), id, INBOUND_WAIT);
    let t_notify = t0.elapsed();
    assert_eq!(st, Some(Ok(())), "inbound status of transfer {id} on the target within {INBOUND_WAIT:?}");
    assert_eq!(b.eng.pop_inbound_status(a.key(), id), None, "an inbound status is popped once");

    // Read the three target ranges back into other places of the initiator (one-shot API).
    let lo2 = [704_000u64, 4_194_000, 1_600_007];
    let id2 = a.eng.allocate_transfer_uid();
    let t_read = wait("batch read", a.eng.batch_read(&a.mem, &lo2, &b.mem, &ro, &sz, id2));
    let mut want_a = a.init.clone();
    apply(&mut want_a, &lo2, &want_b, &ro, &sz);
    assert_bytes("initiator after the batch read", &snapshot(&rt, &a.buf), &want_a);
    assert_bytes("target unchanged by the read", &snapshot(&rt, &b.buf), &want_b);
    eprintln!(
        "same process: batch write of 3 entries ({} bytes) {t_write:?}, target notified {t_notify:?} after the wait, \
         batch read back {t_read:?}; every byte of both 4 MiB buffers checked",
        sz.iter().sum::<u64>()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Many small descriptors: kernel path and per-descriptor copies give the same bytes
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn many_descriptors_use_the_kernel_and_are_exact() {
    let rt = rt();
    let n = 20_000;
    let s = scattered(n, 8, 300, 0x5eed_0002, 3, 5);
    assert!(s.sz.contains(&8) && s.sz.contains(&300), "lengths span 8..=300");
    let mut mis: Vec<(u64, u64)> = s.lo.iter().zip(&s.ro).map(|(l, r)| (l % 16, r % 16)).collect();
    mis.sort_unstable();
    mis.dedup();
    assert!(mis.len() >= 200, "only {} (local, remote) alignment classes mod 16", mis.len());
    let total: u64 = s.sz.iter().sum();
    let (llen, rlen) = (s.local_end as usize + 4096, s.remote_end as usize + 4096);
    eprintln!("{n} descriptors of 8..=300 bytes, {total} bytes, {} alignment classes mod 16; regions {llen} / {rlen} bytes", mis.len());

    let kernel = kernel_image(&rt);
    eprintln!("scatter/gather kernel: {kernel:?}");
    let kernel = kernel.unwrap_or_else(|e| panic!("the scatter/gather kernel does not load here, so threshold 32 would not use it: {e}"));

    let mut digests = Vec::new();
    for threshold in [32usize, 0] {
        let a = gpu_side(&rt, &format!("xgmi-t2-{threshold}-a"), vec![xgmi(threshold)], llen, (0, llen), 0x21);
        let b = gpu_side(&rt, &format!("xgmi-t2-{threshold}-b"), vec![xgmi(threshold)], rlen, (0, rlen), 0x42);
        connect(&a, &b);
        let how = if threshold > 0 { format!("kernel ({kernel})") } else { "one copy per descriptor".to_string() };

        // Write every descriptor, then check every byte of the target (gaps included).
        let id = a.eng.allocate_transfer_uid();
        let t_w = wait(&format!("batch write, {how}"), a.eng.batch_write(&a.mem, &s.lo, &b.mem, &s.ro, &s.sz, id));
        let mut want_b = b.init.clone();
        apply(&mut want_b, &s.ro, &a.init, &s.lo, &s.sz);
        let got_b = snapshot(&rt, &b.buf);
        assert_bytes(&format!("target after {n} descriptors, {how}"), &got_b, &want_b);
        assert_eq!(pop_inbound(&b.eng, a.key(), id, INBOUND_WAIT), Some(Ok(())), "inbound status, {how}");

        // Read them back into a freshly patterned initiator.
        let fresh = patterned(0x77, llen);
        rt.copy_htod(&a.buf.slice(), &fresh).unwrap();
        let t_r = wait(&format!("batch read, {how}"), a.eng.batch_read(&a.mem, &s.lo, &b.mem, &s.ro, &s.sz, a.eng.allocate_transfer_uid()));
        let mut want_a = fresh;
        apply(&mut want_a, &s.lo, &want_b, &s.ro, &s.sz);
        let got_a = snapshot(&rt, &a.buf);
        assert_bytes(&format!("initiator after reading {n} descriptors, {how}"), &got_a, &want_a);
        eprintln!(
            "threshold {threshold:>2} ({how}): write {t_w:?} ({:.3} GB/s), read {t_r:?} ({:.3} GB/s); every byte checked",
            total as f64 / 1e9 / t_w.as_secs_f64(),
            total as f64 / 1e9 / t_r.as_secs_f64()
        );
        digests.push((fnv(FNV0, &got_b), fnv(FNV0, &got_a)));
    }
    assert_eq!(digests[0], digests[1], "kernel path and per-descriptor copies produce the same bytes");
}

// ---------------------------------------------------------------------------------------------
// 2b. A session's prepared route: batch-1 transfers, then the regions going away
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn session_route_moves_bytes_and_notices_deregistration() {
    let rt = rt();
    let len = MIB;
    let a = gpu_side(&rt, "xgmi-t2b-a", vec![xgmi(32)], len, (0, len), 0x2b);
    let b = gpu_side(&rt, "xgmi-t2b-b", vec![xgmi(32)], len, (0, len), 0xb2);
    connect(&a, &b);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    // Many single transfers through the route (the batch-1 path), alternating direction.
    let mut want_a = a.init.clone();
    let mut want_b = b.init.clone();
    for k in 0..64u64 {
        let (lo, ro, n) = (k * 4099 % 900_000, (k * 7919 + 13) % 900_000, 1 + k * 37);
        let id = a.eng.allocate_transfer_uid();
        if k % 2 == 0 {
            sess.write(lo, ro, n, id).spin_for(T).unwrap_or_else(|e| panic!("route write {k}: {e}"));
            apply(&mut want_b, &[ro], &want_a, &[lo], &[n]);
        } else {
            sess.read(lo, ro, n, id).spin_for(T).unwrap_or_else(|e| panic!("route read {k}: {e}"));
            apply(&mut want_a, &[lo], &want_b, &[ro], &[n]);
        }
        assert_eq!(pop_inbound(&b.eng, a.key(), id, INBOUND_WAIT), Some(Ok(())), "inbound status of transfer {k}");
    }
    assert_bytes("initiator after 32 route reads", &snapshot(&rt, &a.buf), &want_a);
    assert_bytes("target after 32 route writes", &snapshot(&rt, &b.buf), &want_b);
    // Past the end: refused before anything is queued, naming the entry.
    let r = sess.write(len as u64 - 10, 0, 20, a.eng.allocate_transfer_uid()).spin_for(T);
    expect_invalid("route write past the local end", r, &["entry 0: local range offset"]);

    // The owner deregisters its region: it tells the engines that looked it up (Forget,
    // asynchronous), after which the session and the one-shot calls fail with NotFound.
    let c = gpu_side(&rt, "xgmi-t2b-c", vec![xgmi(32)], len, (0, len), 0xc2);
    connect(&a, &c);
    let sess_c = a.eng.create_session(&a.mem, &c.mem).unwrap();
    sess_c.write(0, 0, 4096, a.eng.allocate_transfer_uid()).spin_for(T).unwrap();
    c.eng.deregister_memory(&c.mem).unwrap();
    let t0 = Instant::now();
    let e = loop {
        match sess_c.write(0, 0, 4096, a.eng.allocate_transfer_uid()).spin_for(T) {
            Err(e) => break e,
            Ok(()) => assert!(t0.elapsed() < INBOUND_WAIT, "session still writes {INBOUND_WAIT:?} after the owner deregistered"),
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let t_forget = t0.elapsed();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    assert!(e.msg.contains("is gone from this engine"), "{e}");
    let e1 = a.eng.write(&a.mem, 0, &c.mem, 0, 4096, a.eng.allocate_transfer_uid()).spin_for(T).unwrap_err();
    assert_eq!(e1.code, ErrorCode::NotFound, "one-shot after the owner deregistered: {e1}");

    // The peer deregistered here: the session fails (RemoteDisconnect, naming it), the
    // one-shot calls too (the engine is unknown).
    a.eng.deregister_remote_engine(b.key());
    let e2 = sess.write(0, 0, 4096, a.eng.allocate_transfer_uid()).spin_for(T).unwrap_err();
    assert_eq!(e2.code, ErrorCode::RemoteDisconnect, "{e2}");
    assert!(e2.msg.contains("was deregistered here"), "{e2}");
    // Registered again: a new session works.
    connect(&a, &b);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    sess.write(0, 0, 4096, a.eng.allocate_transfer_uid()).spin_for(T).unwrap();
    apply(&mut want_b, &[0], &want_a, &[0], &[4096]);

    // The local region deregistered: the route notices and the transfer fails as NotFound,
    // with nothing written.
    a.eng.deregister_memory(&a.mem).unwrap();
    let e3 = sess.write(0, 0, 4096, a.eng.allocate_transfer_uid()).spin_for(T).unwrap_err();
    assert_eq!(e3.code, ErrorCode::NotFound, "{e3}");
    assert!(e3.msg.contains("not xgmi-registered"), "{e3}");
    assert_bytes("target after the deregistrations", &snapshot(&rt, &b.buf), &want_b);
    eprintln!(
        "session route: 64 single transfers exact, bounds refused; owner deregistration seen after {t_forget:?}: {e}; \
         peer deregistered: {e2}; local deregistration: {e3}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Bounds and errors
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn bounds_and_errors() {
    let rt = rt();
    let alen = MIB;
    // The target registers the middle MiB of 3 MiB: a copy past either end of the registration
    // lands in guard bytes of the same allocation (detected, and no device fault).
    let (balloc, boff, blen) = (3 * MIB, MIB, MIB);
    let tcp = || BackendConfig::Tcp(TcpConfig::default());
    let a = gpu_side(&rt, "xgmi-t3-a", vec![xgmi(32), tcp()], alen, (0, alen), 0x31);
    let b = gpu_side(&rt, "xgmi-t3-b", vec![xgmi(32), tcp()], balloc, (boff, blen), 0x62);
    assert_eq!(b.reg_off, boff);
    connect(&a, &b);
    let (aid, bid) = (a.mem.id, b.mem.id);

    // Out of range remote offset: refused by the engine, naming the entry, range and region.
    let off = blen as u64 - 100;
    let r = a.eng.write(&a.mem, 0, &b.mem, off, 200, a.eng.allocate_transfer_uid()).wait_for(T);
    let m = expect_invalid(
        "remote offset out of range",
        r,
        &[&format!("entry 0: remote range offset {off} + length 200 exceeds region {bid} of {blen} bytes")],
    );
    eprintln!("out of range: {m}");
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    assert_eq!(sess.backend(), BackendKind::Xgmi);
    let loff = alen as u64 - 10;
    let r = sess.batch_write(&[0, loff], &[0, 64], &[16, 20], a.eng.allocate_transfer_uid()).wait_for(T);
    expect_invalid(
        "local offset out of range",
        r,
        &[&format!("entry 1: local range offset {loff} + length 20 exceeds region {aid} of {alen} bytes")],
    );
    let r = sess.read(0, u64::MAX - 2, 8, a.eng.allocate_transfer_uid()).wait_for(T);
    expect_invalid("offset + length overflows", r, &["entry 0: remote range"]);

    // After the refusals the pair still works, and writes only where asked.
    wait("write after refusals", sess.write(100, 0, 64, a.eng.allocate_transfer_uid()));
    wait("write at the last bytes", sess.write(200, blen as u64 - 8, 8, a.eng.allocate_transfer_uid()));
    let mut want_b = b.init.clone();
    want_b[boff..boff + 64].copy_from_slice(&a.init[100..164]);
    want_b[boff + blen - 8..boff + blen].copy_from_slice(&a.init[200..208]);
    assert_bytes("target allocation after two good writes", &snapshot(&rt, &b.buf), &want_b);

    // Host memory registers alongside GPU memory; host <-> host goes over tcp.
    let hlen = 64 << 10;
    let mut ahost = patterned(0x13, hlen);
    let mut bhost = patterned(0x14, hlen);
    // SAFETY: the vectors are never resized; they are deregistered at the end of the test,
    // before they drop, and every transfer that touches them is waited for.
    let ah = unsafe { a.eng.register_memory(ahost.as_mut_ptr(), hlen, MemLoc::Host { numa: None }) }.unwrap();
    // SAFETY: as above.
    let bh = unsafe { b.eng.register_memory(bhost.as_mut_ptr(), hlen, MemLoc::Host { numa: None }) }.unwrap();
    assert!(ah.handle(BackendKind::Xgmi).is_none(), "no IPC handle for host memory");
    let hs = a.eng.create_session(&ah, &bh).unwrap();
    assert_eq!(hs.backend(), BackendKind::Tcp);
    wait("host to host write", hs.write(0, 0, hlen as u64, a.eng.allocate_transfer_uid()));
    assert_bytes("host target after the tcp write", &bhost, &ahost);

    // GPU <-> host: no backend serves it, and the error carries xgmi's reason.
    for (what, l, r) in [("GPU -> host", &a.mem, &bh), ("host -> GPU", &ah, &b.mem)] {
        let e = a.eng.write(l, 0, r, 0, 64, a.eng.allocate_transfer_uid()).wait_for(T).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported, "{what}: {e}");
        assert!(e.msg.contains("xgmi moves GPU memory to GPU memory"), "{what}: {e}");
        assert!(e.msg.contains("tcp"), "{what}: the tcp refusal is listed too: {e}");
        let e2 = a.eng.create_session(l, r).err().expect("session for a GPU <-> host pair");
        assert_eq!(e2.code, ErrorCode::NotSupported, "{what}: {e2}");
        eprintln!("{what}: {e}");
    }
    assert_bytes("target GPU allocation untouched by the host tests", &snapshot(&rt, &b.buf), &want_b);
    a.eng.deregister_memory(&ah).unwrap();
    b.eng.deregister_memory(&bh).unwrap();

    // Last (its failure must not hide the checks above): a forged descriptor claiming twice
    // the registered length.
    let mut forged = b.mem.clone();
    forged.len = 2 * blen as u64;
    let e = a.eng.create_session(&a.mem, &forged).err().expect("session with a forged descriptor");
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    assert!(e.msg.contains(&format!("registered as {blen} bytes")), "{e}");
    eprintln!("forged descriptor, session: {e}");
    // One-shot calls do no lookup: the backend itself must refuse before copying.
    let past = blen as u64 - 64; // 64 bytes inside the registration, 64 bytes past its end
    let rw = a.eng.write(&a.mem, 0, &forged, past, 128, a.eng.allocate_transfer_uid()).wait_for(T);
    let rr = a.eng.read(&a.mem, 4096, &forged, past, 128, a.eng.allocate_transfer_uid()).wait_for(T);
    let got_b = snapshot(&rt, &b.buf);
    let got_a = snapshot(&rt, &a.buf);
    let b_beyond = got_b[boff + blen..] != want_b[boff + blen..];
    eprintln!("forged descriptor, one-shot write: {rw:?}; read: {rr:?}; guard bytes after the registration changed: {b_beyond}");
    let hint = "the xgmi backend must check remote ranges against what the owner registered, not against the descriptor's len";
    expect_invalid(&format!("one-shot write through a forged descriptor ({hint}; guard changed: {b_beyond})"), rw, &[]);
    expect_invalid(&format!("one-shot read through a forged descriptor ({hint})"), rr, &[]);
    assert_bytes("target allocation after the refused requests", &got_b, &want_b);
    assert_bytes("initiator after the refused requests", &got_a, &a.init);
}

// ---------------------------------------------------------------------------------------------
// 4. Two processes on one GPU: real IPC, with a sub-allocation offset
// ---------------------------------------------------------------------------------------------

/// Environment variable selecting the child role; unset in a normal run.
const ROLE_VAR: &str = "MORI_XGMI_TEST_CHILD";
/// Pid of the parent, so an orphaned child can tell before it armed the death signal.
const PARENT_VAR: &str = "MORI_XGMI_TEST_PARENT";
/// Name of the child-entry test (must match the function below).
const CHILD_ENTRY: &str = "xgmi_child_target";

/// The child test's path inside the test binary: `xgmi_child_target` when this file is the test
/// crate, `xgmi_tests::xgmi_child_target` when tests/xgmi_fake_driver.rs includes it.
fn child_entry_path() -> String {
    match module_path!().split_once("::") {
        Some((_, rest)) => format!("{rest}::{CHILD_ENTRY}"),
        None => CHILD_ENTRY.to_string(),
    }
}
const CHILD_LIFETIME: Duration = Duration::from_secs(180);
const CHILD_REPLY: Duration = Duration::from_secs(30);
const CHILD_SEED: u8 = 0xc3;
/// The child allocates this much and registers `[CHILD_OFF, CHILD_OFF + CHILD_LEN)`.
const CHILD_ALLOC: usize = 8 * MIB;
const CHILD_OFF: usize = MIB + 4352;
const CHILD_LEN: usize = 2 * MIB;

const READY: &str = "MORI_XGMI_READY";
const SUM: &str = "MORI_XGMI_SUM";
const INBOUND: &str = "MORI_XGMI_INBOUND";
const CHILD_ERR: &str = "MORI_XGMI_ERR";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

fn ready_line(d: &EngineDesc, m: &MemoryDesc) -> String {
    format!("{READY} {} {}", hex(&d.pack()), hex(&m.pack()))
}

/// The text after `prefix` on a line (the harness may print `test ... ` before it).
fn after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let at = line.find(prefix)?;
    Some(line[at + prefix.len()..].trim())
}

fn parse_ready(line: &str) -> Option<(EngineDesc, MemoryDesc)> {
    let mut it = after(line, READY)?.split(' ');
    let d = EngineDesc::unpack(&unhex(it.next()?)?).ok()?;
    let m = MemoryDesc::unpack(&unhex(it.next()?)?).ok()?;
    it.next().is_none().then_some((d, m))
}

/// (hash of the registered region, hash of the rest of the allocation) of the child's memory.
fn child_sums(alloc: &[u8]) -> (u64, u64) {
    let region = fnv(FNV0, &alloc[CHILD_OFF..CHILD_OFF + CHILD_LEN]);
    let outside = fnv(fnv(FNV0, &alloc[..CHILD_OFF]), &alloc[CHILD_OFF + CHILD_LEN..]);
    (region, outside)
}

/// Child-process entry point, not a test of its own: with `MORI_XGMI_TEST_CHILD=target` it
/// becomes the target engine and never returns. Otherwise it checks the line protocol.
#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn xgmi_child_target() {
    match std::env::var(ROLE_VAR).ok().as_deref() {
        Some("target") => serve_as_child(),
        Some(other) => panic!("{ROLE_VAR}={other:?} is not a known child role"),
        None => {
            let d = EngineDesc {
                key: "k".into(),
                node_id: "n".into(),
                hostname: "h".into(),
                host: "127.0.0.1".into(),
                port: 1,
                pid: 2,
                epoch: 9,
                secret: mori_io::Secret(77),
            };
            let m =
                MemoryDesc { engine_key: "k".into(), engine_epoch: 9, id: 3, addr: 4, len: 5, loc: GPU0, bus_id: None, handles: vec![] };
            let line = format!("test {CHILD_ENTRY} ... {}", ready_line(&d, &m));
            assert_eq!(parse_ready(&line), Some((d, m)));
            assert_eq!(parse_ready("running 1 test"), None);
            assert_eq!(after("test x ... MORI_XGMI_SUM 1 2", SUM), Some("1 2"));
        }
    }
}

/// Body of the child: an engine with an xgmi backend and a GPU region at a sub-allocation
/// offset; answers `sum` and `inbound <key> <id> <wait_ms>` on stdin until it closes.
fn serve_as_child() -> ! {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    let parent: Option<i32> = std::env::var(PARENT_VAR).ok().and_then(|v| v.parse().ok());
    // SAFETY: getppid has no preconditions.
    if parent.is_some_and(|p| p != unsafe { libc::getppid() }) {
        std::process::exit(3);
    }
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        eprintln!("xgmi child: lifetime of {CHILD_LIFETIME:?} over, exiting");
        std::process::exit(4);
    });
    let rt = mori_gpu::detect().expect("child: GPU runtime");
    let buf = rt.alloc(DEV, CHILD_ALLOC).expect("child: alloc");
    rt.copy_htod(&buf.slice(), &patterned(CHILD_SEED, CHILD_ALLOC)).expect("child: fill");
    let key = format!("xgmi-child-{}", std::process::id());
    let eng = IoEngine::new(&key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.create_backend(xgmi(32)).expect("child: xgmi backend");
    // SAFETY: the range lies inside `buf`, which is never freed: this function ends the process
    // with `exit`, so the memory stays valid while the engine's threads run.
    let mem = unsafe { eng.register_memory((buf.ptr() as usize + CHILD_OFF) as *mut u8, CHILD_LEN, GPU0) }.expect("child: register");
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", ready_line(eng.desc(), &mem)).unwrap();
        out.flush().unwrap();
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["sum"] => {
                let mut all = vec![0u8; CHILD_ALLOC];
                match rt.copy_dtoh(&mut all, &buf.slice()) {
                    Ok(()) => {
                        let (r, o) = child_sums(&all);
                        format!("{SUM} {r:016x} {o:016x}")
                    }
                    Err(e) => format!("{CHILD_ERR} copy_dtoh: {e}"),
                }
            }
            ["inbound", from, id, wait_ms] => match (id.parse::<u64>(), wait_ms.parse::<u64>()) {
                (Ok(id), Ok(ms)) => match pop_inbound(&eng, from, id, Duration::from_millis(ms)) {
                    Some(Ok(())) => format!("{INBOUND} {id} ok"),
                    Some(Err(e)) => format!("{INBOUND} {id} err {e}"),
                    None => format!("{INBOUND} {id} none"),
                },
                _ => format!("{CHILD_ERR} bad numbers in {line:?}"),
            },
            _ => format!("{CHILD_ERR} unknown command {line:?}"),
        };
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{reply}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
    std::process::exit(0)
}

/// The child process. Dropping it closes its stdin, waits briefly, then kills and reaps it.
struct ChildEngine {
    child: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl ChildEngine {
    fn spawn() -> (ChildEngine, EngineDesc, MemoryDesc) {
        let exe = std::env::current_exe().expect("path of the test binary");
        let mut child = Command::new(exe)
            .args(["--exact", &child_entry_path(), "--ignored", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, "target")
            .env(PARENT_VAR, std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child engine");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // From here on a panic kills and reaps the child through Drop.
        let mut g = ChildEngine { child, stdin, lines: rx };
        let line = g.expect_line(READY, Duration::from_secs(60));
        let (d, m) = parse_ready(&line).unwrap_or_else(|| panic!("malformed ready line {line:?}"));
        (g, d, m)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line containing `prefix` (others are echoed), within `within`.
    fn expect_line(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(prefix) => return l,
                Ok(l) if l.contains(CHILD_ERR) => panic!("child {} reported: {l}", self.pid()),
                Ok(l) => eprintln!("    [child {}] {l}", self.pid()),
                Err(e) => panic!(
                    "no {prefix} line from child {} within {within:?} ({e:?}; exit status so far: {:?})",
                    self.pid(),
                    self.child.try_wait()
                ),
            }
        }
    }

    /// Sends one command line and returns the text after `prefix` in the reply.
    fn ask(&mut self, cmd: &str, prefix: &str) -> String {
        let stdin = self.stdin.as_mut().expect("child stdin open");
        writeln!(stdin, "{cmd}").and_then(|_| stdin.flush()).unwrap_or_else(|e| panic!("send {cmd:?} to the child: {e}"));
        let line = self.expect_line(prefix, CHILD_REPLY);
        after(&line, prefix).unwrap_or_default().to_string()
    }

    /// The child's (region, outside) hashes.
    fn sums(&mut self) -> (u64, u64) {
        let r = self.ask("sum", SUM);
        let mut it = r.split(' ').map(|w| u64::from_str_radix(w, 16));
        match (it.next(), it.next()) {
            (Some(Ok(a)), Some(Ok(b))) => (a, b),
            _ => panic!("malformed sum reply {r:?}"),
        }
    }

    /// The child's `pop_inbound_status(from, id)`, waiting up to `wait`: "ok", "none", "err ...".
    fn inbound(&mut self, from: &str, id: u64, wait: Duration) -> String {
        let r = self.ask(&format!("inbound {from} {id} {}", wait.as_millis()), INBOUND);
        r.strip_prefix(&format!("{id} ")).unwrap_or_else(|| panic!("inbound reply for another id: {r:?}")).to_string()
    }
}

impl Drop for ChildEngine {
    fn drop(&mut self) {
        self.stdin.take(); // end of file: the child exits by itself
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn two_process_ipc() {
    let rt = rt();
    let (mut child, cdesc, cmem) = ChildEngine::spawn();
    let llen = 8 * MIB;
    let half = (4 * MIB) as u64; // local [0, 4 MiB): sources; [4 MiB, 8 MiB): read-backs
    let local = gpu_side(&rt, &format!("xgmi-parent-{}", std::process::id()), vec![xgmi(32)], llen, (0, llen), 0x2d);
    let me = local.key().to_string();

    // The child's descriptors: its process, its GPU region, the IPC handle with the offset.
    assert_eq!(cdesc.pid, child.pid(), "the target engine runs in the child");
    assert_eq!(cdesc.node_id, local.eng.desc().node_id, "same node");
    assert_eq!((cmem.len, cmem.loc), (CHILD_LEN as u64, GPU0));
    let h = IpcHandle::from_bytes(cmem.handle(BackendKind::Xgmi).expect("child region carries an IPC handle"))
        .unwrap_or_else(|e| panic!("child's IPC handle: {e}"));
    eprintln!("child {} registered {} bytes at {:#x}: {h:?}", child.pid(), cmem.len, cmem.addr);
    assert_eq!((h.offset(), h.len(), h.exporter_pid()), (CHILD_OFF as u64, CHILD_LEN as u64, child.pid()));

    let child_init = patterned(CHILD_SEED, CHILD_ALLOC);
    let mut alloc_model = child_init.clone(); // what the child's whole allocation should hold
    let outside0 = child_sums(&child_init).1;
    assert_eq!(child.sums(), child_sums(&alloc_model), "child memory before any transfer");

    local.eng.register_remote_engine(cdesc.clone()).unwrap();
    let t0 = Instant::now();
    let sess = local.eng.create_session(&local.mem, &cmem).unwrap();
    assert_eq!(sess.backend(), BackendKind::Xgmi);

    // Read the whole region first: the IPC offset must be honoured (the pattern is aperiodic).
    let t_read = wait("read of the whole child region", sess.read(half, 0, CHILD_LEN as u64, local.eng.allocate_transfer_uid()));
    let got = snapshot(&rt, &local.buf);
    assert_bytes(
        "child region read over IPC",
        &got[half as usize..half as usize + CHILD_LEN],
        &child_init[CHILD_OFF..CHILD_OFF + CHILD_LEN],
    );
    eprintln!("session (IPC import) + first 2 MiB read: {:?} (read {t_read:?})", t0.elapsed());

    // Writes of several sizes, each read back and reported to the child's inbound table.
    let cases: [(u64, u64, u64); 5] = [
        (1, 3, 8),
        (12_293, 2_000_000, 4099),
        (77, 1_000_001, 65_553),
        (500_000, 1_048_575, 1_048_577), // ends exactly at the end of the region
        (123, 0, CHILD_LEN as u64),
    ];
    for (k, &(lo, ro, n)) in cases.iter().enumerate() {
        let id = local.eng.allocate_transfer_uid();
        let t_w = wait(&format!("write {n} B"), sess.write(lo, ro, n, id));
        let (ro_a, lo_u, n_u) = (CHILD_OFF + ro as usize, lo as usize, n as usize);
        alloc_model[ro_a..ro_a + n_u].copy_from_slice(&local.init[lo_u..lo_u + n_u]);
        let rb = half + 4099 + k as u64; // read back to a misaligned place
        let t_r = wait(&format!("read back {n} B"), sess.read(rb, ro, n, local.eng.allocate_transfer_uid()));
        let mut back = vec![0u8; n_u];
        rt.copy_dtoh(&mut back, &local.buf.sub(rb as usize, n_u).unwrap()).unwrap();
        assert_bytes(&format!("{n} B written at {ro} and read back"), &back, &alloc_model[ro_a..ro_a + n_u]);
        assert_eq!(child.inbound(&me, id, INBOUND_WAIT), "ok", "child's inbound status of the {n} B write");
        if k == 0 {
            assert_eq!(child.inbound(&me, id, Duration::ZERO), "none", "popped once");
        }
        assert_eq!(child.sums(), child_sums(&alloc_model), "child memory after the {n} B write");
        eprintln!("IPC write {n:>8} B: {t_w:?}, read back {t_r:?}");
    }

    // A scattered batch over the IPC mapping (kernel path: 500 >= 32 descriptors).
    let s = scattered(500, 1, 3000, 0x5eed_0004, 5, 7);
    assert!(s.local_end <= half && s.remote_end <= CHILD_LEN as u64);
    let id = local.eng.allocate_transfer_uid();
    let t_bw = wait("scattered batch write over IPC", sess.batch_write(&s.lo, &s.ro, &s.sz, id));
    let ro_abs: Vec<u64> = s.ro.iter().map(|&r| r + CHILD_OFF as u64).collect();
    apply(&mut alloc_model, &ro_abs, &local.init, &s.lo, &s.sz);
    assert_eq!(child.inbound(&me, id, INBOUND_WAIT), "ok", "child's inbound status of the batch");
    assert_eq!(child.sums(), child_sums(&alloc_model), "child memory after the scattered batch");
    let lo_rb: Vec<u64> = s.lo.iter().map(|&l| l + half).collect();
    rt.copy_htod(&local.buf.sub(half as usize, half as usize).unwrap(), &vec![0u8; half as usize]).unwrap();
    let t_br = wait("scattered batch read over IPC", sess.batch_read(&lo_rb, &s.ro, &s.sz, local.eng.allocate_transfer_uid()));
    let mut want = local.init.clone();
    want[half as usize..].fill(0);
    apply(&mut want, &lo_rb, &alloc_model, &ro_abs, &s.sz);
    assert_bytes("initiator after the scattered batch read", &snapshot(&rt, &local.buf), &want);
    eprintln!("IPC scattered batch of 500 descriptors ({} B): write {t_bw:?}, read {t_br:?}", s.sz.iter().sum::<u64>());

    // Bounds over IPC: the engine refuses a range past the region; a forged longer descriptor
    // (one-shot: no lookup) must be refused by the backend: the bytes after the region belong
    // to the child's allocation, not to what it registered.
    let r = sess.write(0, CHILD_LEN as u64 - 4, 8, local.eng.allocate_transfer_uid()).wait_for(T);
    expect_invalid("IPC write past the region", r, &["exceeds region"]);
    let mut forged = cmem.clone();
    forged.len = (CHILD_LEN + MIB) as u64;
    let rw = local.eng.write(&local.mem, 0, &forged, CHILD_LEN as u64 - 64, 128, local.eng.allocate_transfer_uid()).wait_for(T);
    let (region, outside) = child.sums();
    eprintln!("IPC forged descriptor, one-shot write: {rw:?}; child memory outside the region unchanged: {}", outside == outside0);
    expect_invalid(
        &format!(
            "one-shot IPC write through a forged descriptor (outside of the region changed: {}); \
             the backend must check against the exporter's registration (the IPC handle's len), not the descriptor's len",
            outside != outside0
        ),
        rw,
        &[],
    );
    assert_eq!((region, outside), child_sums(&alloc_model), "child memory after the refused requests");
    assert_eq!(outside, outside0, "nothing outside the child's region ever changed");
    drop(sess);
}

// ---------------------------------------------------------------------------------------------
// 5. Timing (printed, not asserted)
// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn timing_64mib_same_process_write() {
    let rt = rt();
    let len = 64 * MIB;
    let a = gpu_side(&rt, "xgmi-t5-a", vec![xgmi(32)], len, (0, len), 0x51);
    let b = gpu_side(&rt, "xgmi-t5-b", vec![xgmi(32)], len, (0, len), 0x52);
    connect(&a, &b);
    let sess = a.eng.create_session(&a.mem, &b.mem).unwrap();
    let (warm, iters) = (3u32, 20u32);
    for _ in 0..warm {
        wait("warm-up write", sess.write(0, 0, len as u64, a.eng.allocate_transfer_uid()));
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        sess.write(0, 0, len as u64, a.eng.allocate_transfer_uid()).spin_for(T).unwrap_or_else(|e| panic!("64 MiB write: {e}"));
    }
    let xgmi_s = t0.elapsed().as_secs_f64();
    // The same copy without the engine: the async device-to-device copy the backend queues,
    // on a stream of its own, each one waited for (stop-and-wait, as above).
    let stream = rt.stream(DEV).unwrap();
    let copy = || {
        rt.copy_dtod_async(&b.buf.slice(), &a.buf.slice(), &stream).unwrap();
        stream.synchronize().unwrap();
    };
    for _ in 0..warm {
        copy();
    }
    let t1 = Instant::now();
    for _ in 0..iters {
        copy();
    }
    let plain_s = t1.elapsed().as_secs_f64();
    assert_bytes("target after the timed writes", &snapshot(&rt, &b.buf), &a.init);
    let gbps = |s: f64| (iters as f64 * len as f64) / 1e9 / s;
    eprintln!(
        "64 MiB same-process write, {iters} iterations stop-and-wait after {warm} warm-up: engine {:.1} GB/s \
         ({:.1} us each), plain copy_dtod_async + synchronize {:.1} GB/s ({:.1} us each), ratio {:.2} (GB = 1e9; not asserted)",
        gbps(xgmi_s),
        xgmi_s * 1e6 / iters as f64,
        gbps(plain_s),
        plain_s * 1e6 / iters as f64,
        gbps(xgmi_s) / gbps(plain_s)
    );
}
