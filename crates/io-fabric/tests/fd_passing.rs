//! The POSIX-FD handle exchange of the fabric backend, for real between two processes on the
//! CPU: the owner serves a memfd (standing in for a `cuMemCreate` POSIX FD, which needs a GPU)
//! on its abstract Unix socket; a child process fetches it with `SCM_RIGHTS`, rebuilds the
//! shareable handle from the grant, reads the owner's bytes through it and writes back.
//! The real GPU handles go through the same code in `crates/io/tests/fabric_gpu.rs`.

use mori_gpu::{RuntimeKind, ShareableHandle, ShareableKind};
use mori_io_core::{ErrorCode, IoError, Secret};
use mori_io_fabric::uds::{fetch, FdServer};
use mori_io_fabric::Grant;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "MORI_FABRIC_TEST_SOCKET";
const SIZE: u64 = 1 << 20;
const OFF: u64 = 4096;
const LEN: u64 = 8192;
/// The owner engine's secret in these tests.
const SECRET: Secret = Secret(0x00c0_ffee_5ec2_e7aa_0102_0304_0506_0708);

fn memfd() -> File {
    // SAFETY: the name is NUL-terminated; the returned descriptor is owned by the File below.
    let fd = unsafe { libc::memfd_create(c"mori-fabric-standin".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(SIZE).unwrap();
    f
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 8)) as u8
}

fn gpu_note() -> String {
    match mori_gpu::detect() {
        Ok(rt) => format!("a GPU runtime is present ({}); real POSIX-FD handles: crates/io/tests/fabric_gpu.rs", rt.library()),
        Err(_) => "no GPU runtime here".to_string(),
    }
}

#[test]
fn fd_passing_between_processes() {
    println!("fd passing path: memfd stand-ins between two processes ({})", gpu_note());
    let file = memfd();
    let bytes: Vec<u8> = (0..SIZE).map(pattern).collect();
    file.write_all_at(&bytes, 0).unwrap();
    let owned: OwnedFd = file.as_fd().try_clone_to_owned().unwrap();
    let handle = Arc::new(ShareableHandle::from_posix_fd(RuntimeKind::Cuda, owned, SIZE));
    let h2 = handle.clone();
    let server = FdServer::start(
        "fd-test",
        Duration::from_secs(5),
        SECRET,
        Arc::new(move |from: &str, id: u64| {
            if id != 7 {
                return Err(IoError::not_found(format!("memory {id} is not registered (asked by {from})")));
            }
            let fd = h2.posix_fd().unwrap().try_clone_to_owned().map_err(|e| IoError::from_io("dup", &e))?;
            Ok((Grant { offset: OFF, len: LEN, descriptor: h2.descriptor().to_vec() }, fd))
        }),
    )
    .unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_side", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, server.name())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("child did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(status.success() && text.contains("CHILD-OK pid"), "child failed:\n{text}");
    let child_pid: u32 = text.split("CHILD-OK pid ").nth(1).and_then(|s| s.split_whitespace().next()).unwrap().parse().unwrap();
    assert_ne!(child_pid, std::process::id(), "the child ran in this process");
    let mut back = [0u8; 11];
    file.read_exact_at(&mut back, OFF).unwrap();
    assert_eq!(&back, b"CHILD-WROTE", "the child's write through the passed descriptor is not visible here");
    let mut after = [0u8; 1];
    file.read_exact_at(&mut after, OFF + 11).unwrap();
    assert_eq!(after[0], pattern(OFF + 11));
}

/// The child half of `fd_passing_between_processes` (does nothing when run on its own).
#[test]
fn child_side() {
    let Ok(name) = std::env::var(CHILD_ENV) else { return };
    let e = fetch(&name, "child-engine", 7, &Secret(SECRET.0 ^ 1), Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Refused, "{e}");
    assert!(e.msg.contains("does not carry the owner engine's secret"), "{e}");
    let (g, fd) = fetch(&name, "child-engine", 7, &SECRET, Duration::from_secs(5)).unwrap();
    assert_eq!((g.offset, g.len), (OFF, LEN));
    let h = ShareableHandle::from_descriptor(&g.descriptor, Some(fd)).unwrap();
    assert_eq!((h.kind(), h.size(), h.runtime()), (ShareableKind::PosixFd, SIZE, RuntimeKind::Cuda));
    g.check_inside(h.size()).unwrap();
    let f = File::from(h.posix_fd().unwrap().try_clone_to_owned().unwrap());
    let mut got = vec![0u8; LEN as usize];
    f.read_exact_at(&mut got, g.offset).unwrap();
    for (i, b) in got.iter().enumerate() {
        assert_eq!(*b, pattern(g.offset + i as u64), "byte {i} of the granted range");
    }
    f.write_all_at(b"CHILD-WROTE", g.offset).unwrap();
    let e = fetch(&name, "child-engine", 8, &SECRET, Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    assert!(e.msg.contains("owner of memory 8: memory 8 is not registered (asked by child-engine)"), "{e}");
    println!("CHILD-OK pid {} read {} bytes at offset {}", std::process::id(), got.len(), g.offset);
}

#[test]
fn a_silent_owner_times_out_and_a_missing_one_is_named() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("mori-fabric-test-silent.{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let l = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let keep = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        drop(s);
    });
    let t0 = Instant::now();
    let e = fetch(&name, "me", 1, &SECRET, Duration::from_millis(300)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_millis(1200), "took {:?}", t0.elapsed());
    assert_eq!(e.code, ErrorCode::Timeout, "{e}");
    assert!(e.msg.contains("no answer within 300ms"), "{e}");
    keep.join().unwrap();
    let e = fetch("mori-fabric-test-nobody-listens", "me", 1, &SECRET, Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Transport, "{e}");
    assert!(e.msg.contains("@mori-fabric-test-nobody-listens") && e.msg.contains("on this node"), "{e}");
}

#[test]
fn malformed_requests_are_refused_with_a_reason() {
    let server =
        FdServer::start("bad", Duration::from_secs(2), SECRET, Arc::new(|_: &str, _: u64| Err(IoError::bad_state("unused")))).unwrap();
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(server.name().as_bytes()).unwrap();
    let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"XXXX0123456789abcdef0123456789").unwrap();
    let mut h = [0u8; 8];
    let fd = mori_gpu::fdpass::recv_with_fd(&s, &mut h).unwrap();
    assert!(fd.is_none());
    assert_eq!(u32::from_le_bytes(h[..4].try_into().unwrap()), ErrorCode::InvalidArgs.as_u32());
    let n = u32::from_le_bytes(h[4..].try_into().unwrap()) as usize;
    let mut body = vec![0u8; n];
    std::io::Read::read_exact(&mut s, &mut body).unwrap();
    assert_eq!(String::from_utf8_lossy(&body), "fabric handle request: bad magic");
}

#[test]
fn a_flood_of_silent_connections_is_capped() {
    use mori_io_fabric::uds::MAX_CONCURRENT_REQUESTS;
    use std::io::Read;
    use std::os::linux::net::SocketAddrExt;
    let server =
        FdServer::start("flood", Duration::from_secs(3), SECRET, Arc::new(|_: &str, _: u64| Err(IoError::bad_state("unused")))).unwrap();
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(server.name().as_bytes()).unwrap();
    // MAX_CONCURRENT_REQUESTS silent requesters occupy every request thread (each waits for a
    // request that never comes, until its deadline)...
    let held: Vec<_> = (0..MAX_CONCURRENT_REQUESTS).map(|_| std::os::unix::net::UnixStream::connect_addr(&addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    // ...so one more connection is closed at once, unanswered, instead of a new thread.
    let mut extra = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 1];
    let n = extra.read(&mut b).unwrap_or(usize::MAX);
    assert_eq!(n, 0, "the extra connection is closed (EOF), not served");
    assert!(t0.elapsed() < Duration::from_secs(1), "closed at once, took {:?}", t0.elapsed());
    drop(held);
}
