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
    let (tx, rx) = std::sync::mpsc::channel();
    for g in 0..2u64 {
        let tx = tx.clone();
        // SAFETY: inside `a` and `b`, which outlive the waits below.
        unsafe {
            pool.copy_in_order_with(DEV, pair(g), move || {
                move |r| {
                    let _ = tx.send(r);
                }
            })
        }?;
    }
    let groups: Vec<Vec<CopySeg>> = vec![pair(2), pair(3)];
    let refs: Vec<&[CopySeg]> = groups.iter().map(|g| g.as_slice()).collect();
    let mut done = 0;
    let t = Instant::now();
    while done < 2 {
        pool.progress();
        if let Ok(r) = rx.try_recv() {
            r.map_err(|e| Fail(format!("{what}: a batch posted back to back: {e}")))?;
            done += 1;
        }
        if t.elapsed() > WAIT_TIMEOUT {
            return fail(format!("{what}: {done} of 2 batches posted back to back done after {WAIT_TIMEOUT:?}"));
        }
        std::thread::yield_now();
    }
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
unsafe fn ordered_wait(pool: &mori_gpu::CopyPool, what: &str, segs: Vec<mori_gpu::CopySeg>) -> R {
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

/// Queues `groups` as ordered batches of `pool` on `DEV` that go as one submission (packed
/// into one launch: see `copy_groups_in_order_with`) and waits for it (see `pool_wait`).
///
/// # Safety
/// As `ordered_wait`, for every group's segments.
unsafe fn groups_wait(pool: &mori_gpu::CopyPool, what: &str, groups: &[&[mori_gpu::CopySeg]]) -> R {
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
    let (tx, rx) = std::sync::mpsc::channel();
    for g in 0..4u64 {
        let tx = tx.clone();
        // SAFETY: inside `a` and `b`, which outlive the waits below.
        unsafe {
            pool.copy_in_order_with(DEV, pair(g), move || {
                move |r| {
                    let _ = tx.send(r);
                }
            })
        }?;
    }
    let t = Instant::now();
    let mut done = 0;
    while done < 4 {
        pool.progress();
        if let Ok(r) = rx.try_recv() {
            r.map_err(|e| Fail(format!("{what}: a batch posted back to back: {e}")))?;
            done += 1;
        }
        if t.elapsed() > WAIT_TIMEOUT {
            return fail(format!("{what}: {done} of 4 batches posted back to back done after {WAIT_TIMEOUT:?}"));
        }
        std::thread::yield_now();
    }
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
