//! GPU tests of the fabric backend through `IoEngine` (ignored without a GPU; run on the GPU
//! machine by `scripts/gpu-parts/fabric.sh`). The machine has one GPU: two processes share it
//! through POSIX-FD handles (the child owns and exports, the parent imports and copies), and
//! the FABRIC handle type shows its diagnosis (on the H200 here: no IMEX channel).
//!
//! ```text
//! cargo test -p mori-io --test fabric_gpu -- --ignored --nocapture --test-threads=1
//! ```
//!
//! The child is this binary re-executed (`--exact fabric_gpu_child --ignored`) with
//! `MORI_FABRIC_GPU_CHILD=1`; it speaks one line per request on stdin/stdout, is killed and
//! reaped by a guard, and every wait has a deadline.

use mori_io::{
    BackendConfig, BackendKind, EngineConfig, EngineDesc, ErrorCode, FabricConfig, FabricMemory, HandleType, IoEngine, MemLoc, MemoryDesc,
};
use mori_io_fabric::{FabricDomain, FabricHandle};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "MORI_FABRIC_GPU_CHILD";
const GPU0: MemLoc = MemLoc::Gpu { device: 0 };
const T: Duration = Duration::from_secs(30);
/// Child region: `[CHILD_OFF, CHILD_OFF + CHILD_LEN)` of its 4 MiB fabric allocation.
const CHILD_OFF: usize = 4096 + 7;
const CHILD_LEN: usize = 3 << 20;
const PARENT_OFF: usize = 1 << 20;
const PARENT_LEN: usize = 2 << 20;

fn pattern(seed: u8, i: usize) -> u8 {
    let x = ((i as u64) ^ ((seed as u64) << 48)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((x >> 56) as u8) ^ seed
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn engine(key: &str, handle: HandleType) -> IoEngine {
    let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    let cfg = FabricConfig { handle, num_streams: 8, num_events: 64, ..FabricConfig::default() };
    e.create_backend(BackendConfig::Fabric(cfg)).unwrap_or_else(|e| panic!("{key}: create fabric backend: {e}"));
    e
}

/// A fabric allocation of `alloc` bytes filled with `pattern(seed, ..)`, `[off, off+len)` registered.
fn side(eng: &IoEngine, alloc: usize, off: usize, len: usize, seed: u8) -> (FabricMemory, MemoryDesc) {
    let rt = mori_gpu::detect().unwrap();
    let mem = FabricMemory::alloc(&rt, 0, alloc, HandleType::PosixFd).unwrap_or_else(|e| panic!("FabricMemory::alloc: {e}"));
    let init: Vec<u8> = (0..mem.len()).map(|i| pattern(seed, i)).collect();
    rt.copy_htod(&mem.slice(), &init).unwrap();
    // SAFETY: the range lies inside `mem`, which the test keeps alive until after deregistration.
    let d = unsafe { eng.register_memory((mem.ptr() as usize + off) as *mut u8, len, GPU0) }.unwrap();
    assert!(d.handle(BackendKind::Fabric).is_some(), "registration carries a fabric handle");
    (mem, d)
}

fn download(mem: &FabricMemory) -> Vec<u8> {
    let rt = mori_gpu::detect().unwrap();
    let mut v = vec![0u8; mem.len()];
    rt.copy_dtoh(&mut v, &mem.slice()).unwrap();
    v
}

/// Child: owns a fabric region and answers `SUM <parent key> <id>` (waits for the inbound
/// notification, then the FNV of its region) and `QUIT`.
#[test]
#[ignore = "needs a GPU: the child half of fabric_gpu_two_processes_posix_fd"]
fn fabric_gpu_child() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let eng = engine("fabric-child", HandleType::PosixFd);
    let (mem, d) = side(&eng, 4 << 20, CHILD_OFF, CHILD_LEN, 2);
    println!("READY {} {}", hex(&eng.desc().pack()), hex(&d.pack()));
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["SUM", from, id] => {
                let id: u64 = id.parse().unwrap();
                let t0 = Instant::now();
                let r = loop {
                    if let Some(r) = eng.pop_inbound_status(from, id) {
                        break Some(r);
                    }
                    if t0.elapsed() > T {
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                };
                let all = download(&mem);
                println!("SUM {} {:?}", fnv(&all[CHILD_OFF..CHILD_OFF + CHILD_LEN]), r.map(|x| x.is_ok()));
            }
            ["QUIT"] => break,
            other => panic!("child: unknown request {other:?}"),
        }
        std::io::stdout().flush().unwrap();
    }
    eng.deregister_memory(&d).unwrap();
    println!("CHILD-OK");
}

struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-parts/fabric.sh"]
fn fabric_gpu_two_processes_posix_fd() {
    let mut child = Guard(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "fabric_gpu_child", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let out = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let next = |prefix: &str| -> String {
        let t0 = Instant::now();
        loop {
            let left = T.checked_sub(t0.elapsed()).unwrap_or_else(|| panic!("no {prefix} line from the child within {T:?}"));
            let l = rx.recv_timeout(left).unwrap_or_else(|_| panic!("no {prefix} line from the child within {T:?}"));
            // libtest may print "test fabric_gpu_child ... " before the child's first line.
            if let Some(at) = l.find(prefix) {
                return l[at + prefix.len()..].trim().to_string();
            }
        }
    };
    let ready = next("READY ");
    let (cd, cm) = ready.split_once(' ').unwrap();
    let (cdesc, cmem) = (EngineDesc::unpack(&unhex(cd)).unwrap(), MemoryDesc::unpack(&unhex(cm)).unwrap());
    assert_ne!(cdesc.pid, std::process::id());

    let eng = engine("fabric-parent", HandleType::PosixFd);
    let (mem, local) = side(&eng, 4 << 20, PARENT_OFF, PARENT_LEN, 1);
    eng.register_remote_engine(cdesc.clone()).unwrap();
    let sess = eng.create_session(&local, &cmem).unwrap_or_else(|e| panic!("create_session: {e}"));
    assert_eq!(eng.backend_for(&local, &cmem).unwrap(), BackendKind::Fabric);

    // Write three segments (one unaligned, one 1 MiB, one 1 byte at the region's last byte).
    let lo = [3u64, 65536, 12345];
    let ro = [5u64, 1 << 20, (CHILD_LEN - 1) as u64];
    let sz = [777u64, 1 << 20, 1];
    let t0 = Instant::now();
    sess.batch_write(&lo, &ro, &sz, 11).wait_for(T).unwrap_or_else(|e| panic!("batch_write: {e}"));
    eprintln!("write of 3 segments ({} bytes): {:?}", sz.iter().sum::<u64>(), t0.elapsed());
    let mut want: Vec<u8> = (0..CHILD_OFF + CHILD_LEN).map(|i| pattern(2, i)).collect();
    let src: Vec<u8> = (0..PARENT_OFF + PARENT_LEN).map(|i| pattern(1, i)).collect();
    for i in 0..3 {
        let (d, s, n) = (CHILD_OFF + ro[i] as usize, PARENT_OFF + lo[i] as usize, sz[i] as usize);
        want[d..d + n].copy_from_slice(&src[s..s + n]);
    }
    writeln!(stdin, "SUM fabric-parent 11").unwrap();
    let sum = next("SUM ");
    assert_eq!(sum, format!("{} Some(true)", fnv(&want[CHILD_OFF..])), "the child's region after the write (FNV, inbound)");

    // Read two segments back into zeroed local memory, every byte checked.
    let rt = mori_gpu::detect().unwrap();
    rt.memset(&mem.slice(), 0).unwrap();
    let (rlo, rro, rsz) = ([0u64, 4096], [5u64, 2 << 20], [777u64, 65536 + 3]);
    sess.batch_read(&rlo, &rro, &rsz, 12).wait_for(T).unwrap_or_else(|e| panic!("batch_read: {e}"));
    let got = download(&mem);
    for i in 0..2 {
        let (l, r, n) = (PARENT_OFF + rlo[i] as usize, CHILD_OFF + rro[i] as usize, rsz[i] as usize);
        assert!(got[l..l + n] == want[r..r + n], "read segment {i}: bytes differ");
    }
    assert!(got[PARENT_OFF + 777..PARENT_OFF + 4096].iter().all(|&b| b == 0), "read wrote outside its segments");

    // Bounds: past the remote region (engine check) and a forged longer descriptor (grant check).
    let e = sess.write(0, (CHILD_LEN - 10) as u64, 20, 13).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    let mut forged = cmem.clone();
    forged.len += 1 << 20;
    let e = eng.write(&local, 0, &forged, CHILD_LEN as u64, 4096, 14).wait_for(T).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    assert!(e.msg.contains("remote"), "the owner's grant bounds the forged descriptor: {e}");
    eprintln!("forged descriptor refused: {e}");

    // Another domain: the same region claimed from another node is refused at session creation.
    let mut other = cmem.clone();
    let mut h = FabricHandle::from_bytes(other.handle(BackendKind::Fabric).unwrap()).unwrap();
    if let FabricDomain::Node { boot_id, .. } = &mut h.domain {
        *boot_id = "00000000-0000-0000-0000-000000000000".into();
    }
    other.handles.retain(|x| x.backend != BackendKind::Fabric);
    other.handles.push(mori_io_core::BackendHandle { backend: BackendKind::Fabric, bytes: h.to_bytes() });
    drop(sess);
    eng.deregister_remote_engine(&cdesc.key); // forget the cached backend choice for the pair
    eng.register_remote_engine(cdesc.clone()).unwrap();
    let e = eng.create_session(&local, &other).err().expect("a session across nodes must fail");
    assert_eq!(e.code, ErrorCode::NotSupported, "{e}");
    assert!(e.msg.contains("another node"), "{e}");
    eprintln!("other domain refused: {e}");

    eng.deregister_memory(&local).unwrap();
    writeln!(stdin, "QUIT").unwrap();
    next("CHILD-OK");
    drop(mem);
}

#[test]
#[ignore = "needs a GPU: run by scripts/gpu-parts/fabric.sh"]
fn fabric_gpu_fabric_handle_diagnosis() {
    let rt = mori_gpu::detect().unwrap();
    let caps = rt.device_properties(mori_gpu::Device(0)).unwrap().capabilities;
    let e = IoEngine::new("fabric-diag", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    let cfg = FabricConfig { handle: HandleType::Fabric, ..FabricConfig::default() };
    match e.create_backend(BackendConfig::Fabric(cfg)) {
        Err(err) => {
            eprintln!("FABRIC handles (device attribute {}): {err}", caps.fabric_handles);
            assert_eq!(err.code, ErrorCode::NotSupported, "{err}");
            assert!(err.msg.contains("FABRIC"), "{err}");
            if err.msg.contains("(800)") {
                assert!(err.msg.contains("IMEX"), "NOT_PERMITTED must name the missing IMEX channel: {err}");
            }
        }
        Ok(()) => {
            // A machine with an IMEX channel and MORI_FABRIC_DOMAIN set: the backend exists.
            eprintln!("FABRIC handles available here ({})", std::env::var(mori_io_fabric::DOMAIN_ENV).unwrap_or_default());
        }
    }
    // POSIX FD still works on the same engine: no fallback happened, nothing was half-created.
    e.create_backend(BackendConfig::Fabric(FabricConfig::default())).unwrap();
}
