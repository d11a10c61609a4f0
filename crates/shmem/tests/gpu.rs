//! Symmetric-heap operations on a real GPU (ignored here: run by scripts/gpu-machine.sh with
//! `--ignored`). Two PEs share GPU 0 in this process.

use mori_gpu::{Device, Runtime};
use mori_shmem::{ShmemError, SymmetricHeap};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn runtime() -> Arc<dyn Runtime> {
    match mori_gpu::detect() {
        Ok(rt) => rt,
        Err(e) => panic!("this test needs a GPU runtime: {e}"),
    }
}

fn read(rt: &dyn Runtime, heap: &SymmetricHeap, pe: usize, off: usize, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    rt.copy_dtoh(&mut b, &heap.slice(pe, off, len).unwrap()).unwrap();
    b
}

#[test]
#[ignore = "needs a GPU (run on the GPU machine)"]
fn gpu_put_signal_atomic_wait_and_bounds() {
    let rt = runtime();
    let dev = Device(0);
    let bytes = 1 << 20;
    let heap = SymmetricHeap::in_process(rt.clone(), &[dev, dev], bytes).unwrap();
    assert_eq!((heap.world(), heap.bytes(), heap.local_pes()), (2, bytes, vec![0, 1]));
    assert_ne!(heap.addr(0).unwrap(), heap.addr(1).unwrap());
    // The device peer table holds both heap addresses.
    let mut t = [0u8; 16];
    rt.copy_dtoh(&mut t, &heap.peer_table(dev).unwrap()).unwrap();
    assert_eq!(u64::from_le_bytes(t[..8].try_into().unwrap()), heap.addr(0).unwrap());
    assert_eq!(u64::from_le_bytes(t[8..].try_into().unwrap()), heap.addr(1).unwrap());
    // Heaps start zeroed.
    assert!(read(rt.as_ref(), &heap, 1, 0, 4096).iter().all(|&b| b == 0));

    let s = rt.stream(dev).unwrap();
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let src = rt.alloc(dev, pattern.len()).unwrap();
    rt.copy_htod(&src.slice(), &pattern).unwrap();
    heap.put_with_signal(&s, 1, 512, &src.slice(), 8192, 7).unwrap();
    let t0 = Instant::now();
    assert_eq!(heap.wait_until(1, 8192, 7, Duration::from_secs(5)).unwrap(), 7);
    println!("put_with_signal seen by wait_until after {:?}", t0.elapsed());
    assert_eq!(read(rt.as_ref(), &heap, 1, 512, 4096), pattern, "the data precedes its signal");
    assert!(read(rt.as_ref(), &heap, 0, 512, 4096).iter().all(|&b| b == 0), "PE 0 untouched");

    // Atomic adds from "both PEs" (two streams) onto PE 0's word; old values returned.
    let old = rt.alloc(dev, 16).unwrap();
    let s2 = rt.stream(dev).unwrap();
    heap.atomic_add(&s, 0, 16384, 5, Some(&old.sub(0, 8).unwrap())).unwrap();
    s.synchronize().unwrap();
    heap.atomic_add(&s2, 0, 16384, 1 << 40, Some(&old.sub(8, 8).unwrap())).unwrap();
    s2.synchronize().unwrap();
    let w = read(rt.as_ref(), &heap, 0, 16384, 8);
    assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), 5 + (1 << 40));
    let mut o = [0u8; 16];
    rt.copy_dtoh(&mut o, &old.slice()).unwrap();
    assert_eq!(u64::from_le_bytes(o[..8].try_into().unwrap()), 0);
    assert_eq!(u64::from_le_bytes(o[8..].try_into().unwrap()), 5);

    // Bounds and arguments: refused before anything is queued.
    let e = heap.put(&s, 1, bytes - 100, &src.slice()).unwrap_err().to_string();
    assert!(e.contains("leaves PE 1's heap of 1048576 bytes"), "{e}");
    let e = heap.put(&s, 2, 0, &src.slice()).unwrap_err().to_string();
    assert!(e.contains("PE 2 is not below world = 2"), "{e}");
    let e = heap.atomic_add(&s, 0, 12, 1, None).unwrap_err().to_string();
    assert!(e.contains("not 8-byte aligned"), "{e}");
    // A wait that cannot be met ends at its deadline with the last value.
    let t0 = Instant::now();
    match heap.wait_until(1, 8192, 8, Duration::from_millis(200)) {
        Err(ShmemError::Timeout { last, want, .. }) => assert_eq!((last, want), (7, 8)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(2));
}

/// PE `rank` of a two-process heap on GPU 0 (process 0 roots the bootstrap at `master`).
fn two_process_heap(rank: usize, master: std::net::SocketAddr) -> (Arc<dyn Runtime>, mori_bootstrap::SocketBootstrap, SymmetricHeap) {
    let rt = runtime();
    let cfg = mori_bootstrap::SocketBootstrapConfig::new(rank, 2, master).with_timeouts(Duration::from_secs(30), Duration::from_secs(30));
    let boot = mori_bootstrap::SocketBootstrap::new(cfg).unwrap();
    let heap = SymmetricHeap::with_bootstrap(rt.clone(), &boot, &[(rank, Device(0))], 2, 1 << 20).unwrap();
    (rt, boot, heap)
}

#[test]
#[ignore = "needs a GPU (run on the GPU machine)"]
fn gpu_two_processes_over_ipc() {
    use mori_bootstrap::Bootstrap;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let master: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "gpu_ipc_child", "--nocapture", "--test-threads=1"])
        .env("MORI_SHMEM_CHILD_MASTER", master.to_string())
        .spawn()
        .unwrap();
    let (rt, boot, heap) = two_process_heap(0, master);
    assert!(heap.is_local(0) && !heap.is_local(1));
    let s = rt.stream(Device(0)).unwrap();
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 13 + 1) as u8).collect();
    let src = rt.alloc(Device(0), pattern.len()).unwrap();
    rt.copy_htod(&src.slice(), &pattern).unwrap();
    // Into the other process's heap through its IPC handle, then its signal.
    heap.put_with_signal(&s, 1, 4096, &src.slice(), 0, 1).unwrap();
    s.synchronize().unwrap();
    // The child checks the bytes and answers with an atomic add on our word at 8192.
    let v = heap.wait_until(0, 8192, 42, Duration::from_secs(20)).unwrap();
    assert_eq!(v, 42);
    boot.barrier().unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "child failed: {st}");
}

#[test]
#[ignore = "needs a GPU (run on the GPU machine)"]
fn gpu_ipc_child() {
    let Ok(master) = std::env::var("MORI_SHMEM_CHILD_MASTER") else {
        println!("gpu_ipc_child: run by gpu_two_processes_over_ipc only");
        return;
    };
    use mori_bootstrap::Bootstrap;
    let (rt, boot, heap) = two_process_heap(1, master.parse().unwrap());
    assert!(heap.is_local(1) && !heap.is_local(0));
    heap.wait_until(1, 0, 1, Duration::from_secs(20)).unwrap();
    let mut b = vec![0u8; 65536];
    rt.copy_dtoh(&mut b, &heap.slice(1, 4096, 65536).unwrap()).unwrap();
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 13 + 1) as u8).collect();
    assert_eq!(b, pattern, "bytes put by the other process");
    let s = rt.stream(Device(0)).unwrap();
    heap.atomic_add(&s, 0, 8192, 42, None).unwrap();
    s.synchronize().unwrap();
    boot.barrier().unwrap();
}
