//! GPU tests of mori-gpu: they need a CUDA device (the project's GPU machine: one H200, driver
//! 580 / CUDA 13.0) and are ignored elsewhere. Build here, run there:
//!
//! ```text
//! cargo test -p mori-gpu --test gpu --no-run          # prints the test binary's path
//! <that binary> --ignored --nocapture --test-threads=1
//! ```
//!
//! Every test prints what it measured. Two-process tests re-execute the test binary as the child
//! (`--exact <child test>`), passing what it needs in `MORI_GPU_TEST_*` variables; run without
//! those variables, the child tests return at once. Every wait has a deadline.
//!
//! The copy pool's tests live in tests/gpu_parts/ (`pool`, `ordered`, `resident`), modules of
//! this file, which keeps the harness (two-process children, patterns, deadlines).
//!
//! tests/fake_driver.rs runs this file on the CPU against a stand-in libcuda
//! (tests/fake_cuda/fake_cuda.c), so its logic and every CUDA call path are exercised in CI.

use std::fmt;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mori_gpu::{
    detect, fdpass, Device, DeviceProperties, Event, HandleKinds, IpcHandle, KernelArgs, LaunchConfig, ModuleImage, PciBusId, Runtime,
    RuntimeKind, ShareableHandle, ShareableKind, VmmOptions, WaitCondition,
};

const DEV: Device = Device(0);
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);
const WAIT_TIMEOUT: Duration = Duration::from_secs(30);
const PTX: &str = include_str!("fixtures/mori_test_fill.ptx");
const CUBIN_SM90: &[u8] = include_bytes!("fixtures/mori_test_fill.sm_90.cubin");

/// A test failure that prints as the error's text.
struct Fail(String);

impl fmt::Debug for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: fmt::Display> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(e.to_string())
    }
}

type R = Result<(), Fail>;

fn fail<T>(msg: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(msg.into()))
}

fn rt() -> Result<Arc<dyn Runtime>, Fail> {
    let rt = detect()?;
    println!("runtime: {} from {}", rt.kind(), rt.library());
    Ok(rt)
}

/// A byte that depends on the index (including its high bits) and a seed.
fn pat(i: usize, seed: u8) -> u8 {
    (i.wrapping_mul(131).wrapping_add((i >> 8).wrapping_mul(7)).wrapping_add(i >> 16) as u8) ^ seed
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| pat(i, seed)).collect()
}

fn check(what: &str, got: &[u8], want: impl Fn(usize) -> u8) -> R {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want(i)) {
        return fail(format!("{what}: byte {i} of {} is {:#04x}, expected {:#04x}", got.len(), got[i], want(i)));
    }
    Ok(())
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Polls `ev` until it completes or the deadline passes.
fn wait_event(ev: &Event, what: &str) -> R {
    let t = Instant::now();
    while !ev.query()? {
        if t.elapsed() > WAIT_TIMEOUT {
            return fail(format!("{what}: still pending after {WAIT_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

fn props0(rt: &Arc<dyn Runtime>) -> Result<DeviceProperties, Fail> {
    Ok(rt.device_properties(DEV)?)
}

fn is_cuda(rt: &Arc<dyn Runtime>, what: &str) -> bool {
    if rt.kind() != RuntimeKind::Cuda {
        println!("{what}: CUDA-only test, runtime is {}: skipped", rt.kind());
        return false;
    }
    true
}

struct ChildRun {
    name: &'static str,
    child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    started: Instant,
}

fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Path of this module's tests inside the test binary: empty when this file is the test crate,
/// `gpu_tests::` when tests/fake_driver.rs includes it as a module.
fn test_prefix() -> String {
    match module_path!().split_once("::") {
        Some((_, rest)) => format!("{rest}::"),
        None => String::new(),
    }
}

/// Re-executes this test binary running only the test `name`, with `envs` set.
fn spawn_child(name: &'static str, envs: &[(&str, String)]) -> Result<ChildRun, Fail> {
    let mut cmd = Command::new(std::env::current_exe()?);
    let full = format!("{}{name}", test_prefix());
    cmd.args(["--exact", full.as_str(), "--ignored", "--nocapture", "--test-threads=1"]);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    Ok(ChildRun { name, child, out, err, started: Instant::now() })
}

impl ChildRun {
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits (with a deadline) and returns the child's stdout; fails unless it exited 0 and
    /// printed `CHILD-OK <name>`.
    fn finish(mut self) -> Result<String, Fail> {
        let status = loop {
            if let Some(st) = self.child.try_wait()? {
                break st;
            }
            if self.started.elapsed() > CHILD_TIMEOUT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return fail(format!("child {} killed after {CHILD_TIMEOUT:?}", self.name));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self.out.take().and_then(|h| h.join().ok()).unwrap_or_default();
        let err = self.err.take().and_then(|h| h.join().ok()).unwrap_or_default();
        for line in out.lines().chain(err.lines()).filter(|l| !l.trim().is_empty()) {
            println!("    [child {}] {line}", self.name);
        }
        if !status.success() {
            return fail(format!("child {} failed ({status})", self.name));
        }
        if !out.contains(&format!("CHILD-OK {}", self.name)) {
            return fail(format!("child {} exited 0 without running its body", self.name));
        }
        Ok(out)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, Fail> {
    if !s.len().is_multiple_of(2) {
        return fail("odd hex length");
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(Fail::from)).collect()
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn device_properties_and_peers() -> R {
    let rt = rt()?;
    println!("driver version: {}", rt.driver_version()?);
    let n = rt.device_count()?;
    println!("devices: {n}");
    if n == 0 {
        return fail("no device");
    }
    for d in 0..n {
        let dev = Device(d);
        let p = rt.device_properties(dev)?;
        println!("{p:#?}");
        let m = rt.mem_info(dev)?;
        println!("{dev}: {:.1} GiB free of {:.1} GiB", m.free as f64 / (1u64 << 30) as f64, m.total as f64 / (1u64 << 30) as f64);
        assert!(!p.name.is_empty(), "empty name");
        assert!(p.total_memory > 0 && m.total > 0 && m.free <= m.total);
        assert_eq!(p.pci_bus_id.to_string().parse::<PciBusId>()?, p.pci_bus_id);
        assert!(p.multiprocessors > 0);
        assert!(p.capabilities.unified_addressing, "no unified addressing");
    }
    let caps = props0(&rt)?.capabilities;
    if rt.kind() == RuntimeKind::Cuda {
        // Reported as 1 on the project's H200 (see TOOLCHAINS.md).
        assert!(caps.vmm && caps.posix_fd_handles && caps.dmabuf, "{caps:?}");
    }
    assert!(rt.can_access_peer(DEV, DEV)?);
    rt.enable_peer_access(DEV, DEV)?;
    for a in 0..n {
        for b in 0..n {
            if a != b {
                let can = rt.can_access_peer(Device(a), Device(b))?;
                println!("peer access {a} -> {b}: {can}");
                if can {
                    rt.enable_peer_access(Device(a), Device(b))?;
                    rt.enable_peer_access(Device(a), Device(b))?; // idempotent
                }
            }
        }
    }
    let e = rt.alloc(Device(n), 16).expect_err("device out of range");
    println!("alloc on a missing device: {e}");
    assert!(rt.alloc(DEV, 0).is_err());
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn alloc_and_copy_round_trips() -> R {
    let rt = rt()?;
    for len in [1usize, 4096, 1_000_003, 64 << 20] {
        let a = rt.alloc(DEV, len)?;
        let b = rt.alloc(DEV, len)?;
        let src = pattern(len, 0x11);
        let t = Instant::now();
        rt.copy_htod(&a.slice(), &src)?;
        let h2d = t.elapsed().as_secs_f64();
        rt.memset(&b.slice(), 0xab)?;
        let mut back = vec![0u8; len];
        rt.copy_dtoh(&mut back, &b.slice())?;
        check("memset", &back, |_| 0xab)?;
        rt.copy_dtod(&b.slice(), &a.slice())?;
        let t = Instant::now();
        rt.copy_dtoh(&mut back, &b.slice())?;
        let d2h = t.elapsed().as_secs_f64();
        check("H2D -> D2D -> D2H", &back, |i| pat(i, 0x11))?;
        println!("{len:>9} bytes: H2D {:.2} GB/s, D2H {:.2} GB/s (pageable host memory)", gbps(len, h2d), gbps(len, d2h));
    }

    // Sub-ranges at odd offsets.
    let a = rt.alloc(DEV, 1 << 20)?;
    rt.memset(&a.slice(), 0)?;
    let piece = pattern(5000, 0x22);
    rt.copy_htod(&a.sub(777, 5000)?, &piece)?;
    let mut back = vec![0u8; 1 << 20];
    rt.copy_dtoh(&mut back, &a.slice())?;
    check("sub-range write", &back, |i| if (777..5777).contains(&i) { pat(i - 777, 0x22) } else { 0 })?;
    let b = rt.alloc(DEV, 4096)?;
    rt.copy_dtod(&b.sub(1, 3000)?, &a.sub(1000, 3000)?)?;
    let mut small = vec![0u8; 3000];
    rt.copy_dtoh(&mut small, &b.sub(1, 3000)?)?;
    check("sub-range D2D", &small, |i| back[1000 + i])?;
    assert!(a.sub(1 << 20, 1).is_err() && rt.copy_htod(&a.sub(0, 10)?, &[0u8; 11]).is_err());

    // Asynchronous copies on a stream, timed with events.
    let big = 256usize << 20;
    let x = rt.alloc(DEV, big)?;
    let y = rt.alloc(DEV, big)?;
    rt.memset(&x.slice(), 0x5a)?;
    rt.memset(&y.slice(), 0)?;
    let s = rt.stream(DEV)?;
    let (e0, e1) = (rt.event(DEV, true)?, rt.event(DEV, true)?);
    rt.copy_dtod_async(&y.slice(), &x.slice(), &s)?; // warm-up
    e0.record(&s)?;
    for _ in 0..10 {
        rt.copy_dtod_async(&y.slice(), &x.slice(), &s)?;
    }
    e1.record(&s)?;
    wait_event(&e1, "10 D2D copies")?;
    let ms = e0.elapsed_ms(&e1)? / 10.0;
    println!(
        "D2D 256 MiB: {ms:.3} ms per copy = {:.0} GB/s of payload ({:.0} GB/s read + write)",
        gbps(big, ms as f64 / 1e3),
        gbps(2 * big, ms as f64 / 1e3)
    );
    let mut edge = vec![0u8; 4096];
    rt.copy_dtoh(&mut edge, &y.sub(big - 4096, 4096)?)?;
    check("async D2D tail", &edge, |_| 0x5a)?;

    let host = pattern(1 << 20, 0x33);
    let mut host_back = vec![0u8; 1 << 20];
    let done = rt.event(DEV, false)?;
    // SAFETY: both host buffers outlive the wait on `done` below and are not touched before it.
    unsafe {
        rt.copy_htod_async(&x.sub(0, 1 << 20)?, &host, &s)?;
        rt.copy_dtoh_async(&mut host_back, &x.sub(0, 1 << 20)?, &s)?;
    }
    done.record(&s)?;
    wait_event(&done, "async H2D + D2H")?;
    check("async H2D -> D2H", &host_back, |i| pat(i, 0x33))?;
    s.synchronize()?;
    assert!(s.query()?);
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn streams_events_and_stream_memory_ops() -> R {
    let rt = rt()?;
    let (s1, s2) = (rt.stream(DEV)?, rt.stream(DEV)?);
    let mem = rt.alloc(DEV, 4096)?;
    rt.memset(&mem.slice(), 0)?;
    let (flag, out) = (mem.sub(0, 4)?, mem.sub(64, 4)?);

    // s2 waits on the flag word, then writes 7; nothing may pass the wait before s1 sets it.
    s2.wait_value32(&flag, 1, WaitCondition::Geq)?;
    s2.write_value32(&out, 7)?;
    let done = rt.event(DEV, false)?;
    done.record(&s2)?;
    std::thread::sleep(Duration::from_millis(50));
    let pending = !done.query()? && !s2.query()?;
    println!("s2 blocked on its wait after 50 ms: {pending}");
    assert!(pending, "s2 ran past wait_value32 before the flag was set");
    let t = Instant::now();
    s1.write_value32(&flag, 1)?;
    wait_event(&done, "s2 after the flag")?;
    println!("flag set -> s2 done observed by the host in {:?}", t.elapsed());
    let mut word = [0u8; 4];
    rt.copy_dtoh(&mut word, &out)?;
    assert_eq!(u32::from_le_bytes(word), 7);

    // Event ordering across streams: s2 waits for s1's memset.
    let big = rt.alloc(DEV, 64 << 20)?;
    let ev = rt.event(DEV, false)?;
    rt.memset(&big.slice(), 0)?;
    let fill = rt.alloc(DEV, 64 << 20)?;
    rt.memset(&fill.slice(), 0x77)?;
    rt.copy_dtod_async(&big.slice(), &fill.slice(), &s1)?;
    ev.record(&s1)?;
    s2.wait_event(&ev)?;
    let copy = rt.alloc(DEV, 64 << 20)?;
    rt.copy_dtod_async(&copy.slice(), &big.slice(), &s2)?;
    let fin = rt.event(DEV, false)?;
    fin.record(&s2)?;
    wait_event(&fin, "s2 after s1's event")?;
    let mut tail = vec![0u8; 4096];
    rt.copy_dtoh(&mut tail, &copy.sub((64 << 20) - 4096, 4096)?)?;
    check("copy ordered after the event", &tail, |_| 0x77)?;

    assert!(s1.write_value32(&mem.sub(2, 4)?, 1).is_err(), "misaligned word accepted");
    let untimed = rt.event(DEV, false)?;
    assert!(untimed.elapsed_ms(&fin).is_err());
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn mapped_host_memory_is_device_addressable() -> R {
    let rt = rt()?;
    let p = props0(&rt)?;
    let pinned = rt.alloc_pinned(DEV, 4096)?;
    if pinned.device_ptr().is_some() || pinned.device_slice().is_some() {
        return fail(format!("alloc_pinned buffer has a device address: {pinned:?}"));
    }
    let len = (1 << 20) + 3;
    let mut m = rt.alloc_mapped(DEV, len)?;
    println!("{m:?}");
    let Some(dptr) = m.device_ptr() else { return fail(format!("alloc_mapped buffer has no device address: {m:?}")) };
    if rt.kind() == RuntimeKind::Cuda && p.capabilities.unified_addressing && dptr != m.ptr() {
        return fail(format!("CUDA with unified addressing: device address {dptr:#x} != host address {:#x}", m.ptr()));
    }
    if m.len() != len || m.device() != DEV {
        return fail(format!("mapped buffer of {} bytes on {}, asked for {len} on {DEV}", m.len(), m.device()));
    }
    check("fresh mapped buffer", m.as_slice(), |_| 0)?;

    // Host writes, the device reads it through the device address.
    m.as_mut_slice().copy_from_slice(&pattern(len, 0x44));
    let d = rt.alloc(DEV, len)?;
    rt.memset(&d.slice(), 0)?;
    let Some(ms) = m.device_slice() else { return fail("mapped buffer has no device slice") };
    if ms.ptr() != dptr || ms.len() != len || ms.device() != DEV {
        return fail(format!("device slice {ms:?} of {m:?}"));
    }
    let t = Instant::now();
    rt.copy_dtod(&d.slice(), &ms)?;
    let read = t.elapsed().as_secs_f64();
    let mut back = vec![0u8; len];
    rt.copy_dtoh(&mut back, &d.slice())?;
    check("host pattern -> mapped -> D2D -> D2H", &back, |i| pat(i, 0x44))?;

    // The device writes a sub-range through the device address; the host sees it in place.
    rt.memset(&d.slice(), 0x5c)?;
    rt.copy_dtod(&ms.sub(1001, 5000)?, &d.sub(0, 5000)?)?;
    check("D2D into mapped at offset 1001", m.as_slice(), |i| if (1001..6001).contains(&i) { 0x5c } else { pat(i, 0x44) })?;
    println!("{len} bytes: D2D from mapped host memory at {:.2} GB/s", gbps(len, read));

    // A stream waits on a counter the host writes in mapped memory, then writes a word there.
    m.as_mut_slice()[..8].fill(0);
    let Some(ms) = m.device_slice() else { return fail("mapped buffer has no device slice") };
    let s = rt.stream(DEV)?;
    s.wait_value32(&ms.sub(0, 4)?, 1, WaitCondition::Geq)?;
    s.write_value32(&ms.sub(4, 4)?, 0xfeed)?;
    let done = rt.event(DEV, false)?;
    done.record(&s)?;
    std::thread::sleep(Duration::from_millis(50));
    if done.query()? {
        return fail("the stream ran past wait_value32 on mapped memory before the host set it");
    }
    let base = m.ptr() as usize as *mut u32;
    // SAFETY: base..base+8 lies inside `m` (4-aligned: page-aligned allocation); volatile
    // accesses through the raw pointer, since the device reads and writes these words meanwhile.
    unsafe { base.write_volatile(1) };
    wait_event(&done, "stream after the host's counter")?;
    // SAFETY: as above.
    let word = unsafe { base.add(1).read_volatile() };
    if word != 0xfeed {
        return fail(format!("stream's write to mapped memory: {word:#x}, expected 0xfeed"));
    }

    // A kernel stores to it (CUDA: the PTX fill kernel).
    if is_cuda(&rt, "kernel stores to mapped memory") {
        let n: u32 = 4096;
        let f = rt.load_module(DEV, ModuleImage::Ptx(PTX))?;
        let fill = f.function("mori_test_fill")?;
        let mut args = KernelArgs::new();
        args.push_ptr(&ms.sub(0, n as usize * 4)?).push(n).push(11u32);
        let cfg = LaunchConfig::for_elements(u64::from(n), 256)?;
        // SAFETY: mori_test_fill(u32* out, u32 n, u32 base) writes out[0..n), inside `m`; `args`
        // lives until the launch returns and `m` until the wait below.
        unsafe { fill.launch(&s, &cfg, &args.params())? };
        done.record(&s)?;
        wait_event(&done, "fill kernel into mapped memory")?;
        let got = m.as_slice();
        for i in 0..n as usize {
            let v = u32::from_le_bytes([got[4 * i], got[4 * i + 1], got[4 * i + 2], got[4 * i + 3]]);
            if v != 11u32.wrapping_add(3 * i as u32) {
                return fail(format!("kernel into mapped memory: out[{i}] = {v}"));
            }
        }
    }

    match rt.alloc_mapped(DEV, 0) {
        Err(mori_gpu::GpuError::InvalidArgument(msg)) if msg.contains("0 bytes") => {}
        other => return fail(format!("mapped allocation of 0 bytes: {other:?}")),
    }
    println!(
        "mapped host memory: device address {dptr:#x} (host {:#x}); host, copies, stream memory operations and kernels agree",
        m.ptr()
    );
    Ok(())
}

const IPC_LEN: usize = 4 << 20;
const IPC_OFFSET: usize = (1 << 20) + 4096 + 256;
const IPC_SUB_LEN: usize = 64 << 10;

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn ipc_between_two_processes_honours_the_offset() -> R {
    let rt = rt()?;
    let buf = rt.alloc(DEV, IPC_LEN)?;
    rt.copy_htod(&buf.slice(), &pattern(IPC_LEN, 0x44))?;
    let sub = buf.sub(IPC_OFFSET, IPC_SUB_LEN)?;
    let t = Instant::now();
    let h = rt.ipc_export(&sub)?;
    println!("exported {h:?} in {:?}", t.elapsed());
    assert_eq!((h.offset(), h.len(), h.exporter_pid()), (IPC_OFFSET as u64, IPC_SUB_LEN as u64, std::process::id()));
    assert!(rt.ipc_export(&buf.slice())?.offset() == 0);

    let child = spawn_child("ipc_child", &[("MORI_GPU_TEST_IPC", hex(&h.to_bytes()))])?;
    child.finish()?;

    // The child inverted exactly the exported range.
    let mut back = vec![0u8; IPC_LEN];
    rt.copy_dtoh(&mut back, &buf.slice())?;
    let range = IPC_OFFSET..IPC_OFFSET + IPC_SUB_LEN;
    check("after the child's write", &back, |i| if range.contains(&i) { !pat(i, 0x44) } else { pat(i, 0x44) })?;
    println!("parent sees the child's write in [{}, {}) and nothing else changed", range.start, range.end);
    Ok(())
}

/// Child of `ipc_between_two_processes_honours_the_offset`.
#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn ipc_child() -> R {
    let Ok(text) = std::env::var("MORI_GPU_TEST_IPC") else {
        println!("ipc_child: run by ipc_between_two_processes_honours_the_offset only");
        return Ok(());
    };
    let rt = rt()?;
    let h = IpcHandle::from_bytes(&unhex(&text)?)?;
    let t = Instant::now();
    let m = rt.ipc_import(DEV, &h)?;
    println!("imported {m:?} in {:?}", t.elapsed());
    let s = m.slice();
    assert_eq!((m.offset(), s.len(), s.ptr()), (IPC_OFFSET as u64, IPC_SUB_LEN, m.base() + IPC_OFFSET as u64));
    let mut got = vec![0u8; IPC_SUB_LEN];
    rt.copy_dtoh(&mut got, &s)?;
    check("exported range seen by the child", &got, |i| pat(IPC_OFFSET + i, 0x44))?;
    // Device access to the mapping: D2D through a local buffer.
    let local = rt.alloc(DEV, IPC_SUB_LEN)?;
    rt.copy_dtod(&local.slice(), &s)?;
    let inverted: Vec<u8> = got.iter().map(|b| !b).collect();
    rt.copy_htod(&local.slice(), &inverted)?;
    rt.copy_dtod(&s, &local.slice())?;
    drop(m);
    println!("CHILD-OK ipc_child");
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn vmm_posix_fd_between_two_processes() -> R {
    let rt = rt()?;
    let caps = props0(&rt)?.capabilities;
    println!("VMM {} POSIX_FD {} GPUDirect RDMA on VMM {}", caps.vmm, caps.posix_fd_handles, caps.gpu_direct_rdma_vmm);
    let gran = rt.vmm_granularity(DEV, HandleKinds::POSIX_FD)?;
    println!("granularity: {gran} bytes");
    let opts = VmmOptions { kinds: HandleKinds::POSIX_FD, gpu_direct_rdma: false };
    let t = Instant::now();
    let a = rt.vmm_alloc(DEV, gran + 12_345, &opts)?;
    println!("{a:?} in {:?}", t.elapsed());
    assert_eq!(a.size(), 2 * gran);
    rt.copy_htod(&a.slice(), &pattern(a.size(), 0x55))?;
    let h = rt.vmm_export(&a, ShareableKind::PosixFd)?;
    println!("exported {h:?}");
    assert!(rt.vmm_export(&a, ShareableKind::Fabric).is_err(), "exported a kind it was not created with");

    let sock = std::env::temp_dir().join(format!("mori-gpu-vmm-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock)?;
    listener.set_nonblocking(true)?;
    let mut child = spawn_child("vmm_child", &[("MORI_GPU_TEST_VMM_SOCK", sock.to_string_lossy().into_owned())])?;
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if child.exited() || Instant::now() > deadline {
                    let _ = std::fs::remove_file(&sock);
                    child.finish()?;
                    return fail("the child never connected");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return fail(format!("accept: {e}")),
        }
    };
    conn.set_nonblocking(false)?;
    fdpass::send_with_fd(&conn, &h.descriptor(), h.posix_fd())?;
    let result = child.finish();
    let _ = std::fs::remove_file(&sock);
    result?;

    let mut back = vec![0u8; a.size()];
    rt.copy_dtoh(&mut back, &a.slice())?;
    check("after the child's write through its mapping", &back, |i| !pat(i, 0x55))?;
    println!("parent sees the child's write to all {} bytes", a.size());
    Ok(())
}

/// Child of `vmm_posix_fd_between_two_processes`.
#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn vmm_child() -> R {
    let Ok(path) = std::env::var("MORI_GPU_TEST_VMM_SOCK") else {
        println!("vmm_child: run by vmm_posix_fd_between_two_processes only");
        return Ok(());
    };
    let rt = rt()?;
    let conn = UnixStream::connect(&path)?;
    conn.set_read_timeout(Some(CHILD_TIMEOUT))?;
    let mut d = [0u8; ShareableHandle::DESCRIPTOR_LEN];
    let fd = fdpass::recv_with_fd(&conn, &mut d)?;
    println!("received descriptor and fd {:?}", fd.as_ref().map(|f| f.as_raw_fd()));
    let h = ShareableHandle::from_descriptor(&d, fd)?;
    let t = Instant::now();
    let a = rt.vmm_import(DEV, &h)?;
    println!("imported {a:?} in {:?}", t.elapsed());
    assert_eq!(a.size() as u64, h.size());
    let mut got = vec![0u8; a.size()];
    rt.copy_dtoh(&mut got, &a.slice())?;
    check("parent's data seen by the child", &got, |i| pat(i, 0x55))?;
    let inverted: Vec<u8> = got.iter().map(|b| !b).collect();
    rt.copy_htod(&a.slice(), &inverted)?;
    drop(a);
    println!("CHILD-OK vmm_child");
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn fabric_handle_attempt_reports_imex_clearly() -> R {
    let rt = rt()?;
    if !is_cuda(&rt, "FABRIC") {
        return Ok(());
    }
    println!("FABRIC handle attribute: {}", props0(&rt)?.capabilities.fabric_handles);
    let opts = VmmOptions { kinds: HandleKinds::FABRIC, gpu_direct_rdma: false };
    match rt.vmm_alloc(DEV, 1 << 20, &opts) {
        Ok(a) => {
            println!("FABRIC allocation succeeded (an IMEX channel is available): {a:?}");
            let h = rt.vmm_export(&a, ShareableKind::Fabric)?;
            let back = ShareableHandle::from_descriptor(&h.descriptor(), None)?;
            assert_eq!((back.kind(), back.size(), back.fabric()), (ShareableKind::Fabric, h.size(), h.fabric()));
            println!("exported a FABRIC handle for {} bytes", h.size());
        }
        Err(e) => {
            println!("FABRIC attempt: {e}");
            if e.code() != Some(800) {
                return fail(format!("expected CUDA_ERROR_NOT_PERMITTED (800) without IMEX, got: {e}"));
            }
            let text = e.to_string();
            assert!(text.contains("CUDA_ERROR_NOT_PERMITTED (800)") && text.contains("IMEX"), "{text}");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn dmabuf_export_of_a_range() -> R {
    let rt = rt()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let len = 8usize << 20;
    let buf = rt.alloc(DEV, len)?;
    println!("buffer at {:#x} ({} bytes), host page {page}", buf.ptr(), len);
    for (off, sub_len) in [(0usize, len), (3 * 4096 + 100, 1 << 20), (len - 1, 1)] {
        let want_ptr = buf.ptr() + off as u64;
        let t = Instant::now();
        let d = rt.dmabuf_export(&buf.sub(off, sub_len)?)?;
        let took = t.elapsed();
        let fd = d.fd.as_raw_fd();
        // SAFETY: fd is a live descriptor owned by `d`; lseek only moves its file offset.
        let size = unsafe { libc::lseek(fd, 0, libc::SEEK_END) };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
        let exp = info.lines().filter(|l| l.starts_with("exp_name") || l.starts_with("size")).collect::<Vec<_>>().join(", ");
        println!(
            "range +{off} ({sub_len} bytes): fd {fd}, start {:#x}, offset {}, len {}, lseek size {size}, fdinfo [{exp}], {took:?}",
            d.start, d.offset, d.len
        );
        assert_eq!(d.start + d.offset, want_ptr);
        assert_eq!(d.offset, want_ptr % page);
        assert!(d.start % page == 0 && d.len % page == 0 && d.len >= d.offset + sub_len as u64);
        if size >= 0 {
            assert!(size as u64 >= d.len, "dmabuf of {size} bytes for a {}-byte window", d.len);
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-machine.sh"]
fn module_load_and_launch() -> R {
    let rt = rt()?;
    if !is_cuda(&rt, "PTX module") {
        return Ok(());
    }
    let p = props0(&rt)?;
    let mut images = vec![("PTX", ModuleImage::Ptx(PTX))];
    if p.compute_capability == (9, 0) {
        images.push(("sm_90 cubin", ModuleImage::Cubin(CUBIN_SM90)));
    }
    let n: u32 = 1_000_003;
    let out = rt.alloc(DEV, n as usize * 4)?;
    let s = rt.stream(DEV)?;
    for (what, image) in images {
        let t = Instant::now();
        let m = rt.load_module(DEV, image)?;
        let f = m.function("mori_test_fill")?;
        println!("{what}: loaded {m:?} and {f:?} in {:?}", t.elapsed());
        f.set_max_dynamic_shared_mem(p.max_shared_memory_per_block_optin.min(48 << 10))?;
        rt.memset(&out.slice(), 0xff)?;
        let base = 7u32;
        let mut args = KernelArgs::new();
        args.push_ptr(&out.slice()).push(n).push(base);
        let cfg = LaunchConfig::for_elements(u64::from(n), 256)?;
        let (e0, e1) = (rt.event(DEV, true)?, rt.event(DEV, true)?);
        e0.record(&s)?;
        // SAFETY: mori_test_fill(u32* out, u32 n, u32 base) writes out[0..n), which `out` holds;
        // `args` lives until the launch call returns and `out` until the wait below.
        unsafe { f.launch(&s, &cfg, &args.params())? };
        e1.record(&s)?;
        wait_event(&e1, "kernel")?;
        println!("{what}: kernel over {n} elements in {:.3} ms (grid {:?})", e0.elapsed_ms(&e1)?, cfg.grid);
        let mut back = vec![0u8; n as usize * 4];
        rt.copy_dtoh(&mut back, &out.slice())?;
        for i in 0..n as usize {
            let v = u32::from_le_bytes([back[4 * i], back[4 * i + 1], back[4 * i + 2], back[4 * i + 3]]);
            let want = base.wrapping_add(3u32.wrapping_mul(i as u32));
            if v != want {
                return fail(format!("{what}: out[{i}] = {v}, expected {want}"));
            }
        }
        let e = m.function("no_such_kernel").expect_err("missing kernel found");
        println!("missing kernel: {e}");
        assert_eq!(e.code(), Some(500));
    }
    let bad = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry broken()\n{\n    bogus.instruction;\n}\n";
    let e = rt.load_module(DEV, ModuleImage::Ptx(bad)).expect_err("broken PTX loaded");
    println!("broken PTX: {e}");
    assert_eq!(e.call(), Some("cuModuleLoadDataEx"));
    Ok(())
}

/// Runs `submit` (which queues one pool submission reporting to the sender) and drives the
/// pool until that submission completed; its outcome.
fn pool_wait(pool: &mori_gpu::CopyPool, what: &str, submit: impl FnOnce(std::sync::mpsc::Sender<mori_gpu::Result<()>>) -> R) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    submit(tx)?;
    let t = Instant::now();
    loop {
        pool.progress();
        if let Ok(r) = rx.try_recv() {
            return r.map_err(|e| Fail(format!("{what}: {e}")));
        }
        if t.elapsed() > WAIT_TIMEOUT {
            return fail(format!("{what}: not done after {WAIT_TIMEOUT:?}"));
        }
        std::thread::yield_now();
    }
}

#[path = "gpu_parts/ordered.rs"]
mod ordered;
#[path = "gpu_parts/pool.rs"]
mod pool;
#[path = "gpu_parts/resident.rs"]
mod resident;
