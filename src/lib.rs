//! mori: MORI in Rust, one crate an embedder depends on. Each layer of mori-rs is a module
//! behind a cargo feature of the same name; the default features are the host-only layers
//! (`bootstrap`, `io` with the `tcp` backend, `mr`, `topo`), which build with no vendor SDK,
//! no cmake and no libclang.
//!
//! ```toml
//! mori = { version = "0.1", features = ["xgmi", "ep"] }
//! ```
//!
//! | feature | module | what it adds | builds |
//! |---|---|---|---|
//! | `bootstrap` | [`bootstrap`] | out-of-band rendezvous of ranks (socket, in-process) | host only |
//! | `io` | [`io`], [`io_core`] | the MORI-IO transfer engine, with the tcp backend | host only |
//! | `tcp` | [`tcp`] | the tcp backend's own items (`TcpConfig`, ...) | host only |
//! | `rdma` | [`rdma`] | RC queue pairs over ibverbs (`sideway`, loaded at run time) | needs cmake + libclang |
//! | `xgmi` | [`xgmi`] | same-node GPU P2P over CUDA/HIP IPC | cudarc, cubecl-hip-sys (no SDK) |
//! | `fabric` | [`fabric`] | GPU memory through VMM shareable handles | cudarc, cubecl-hip-sys (no SDK) |
//! | `mr` | [`mr`] | the memory-registration cache (sans-IO) | host only |
//! | `topo` | [`topo`] | GPUs, NICs, NUMA and the PCIe tree from sysfs; NIC choice | host only |
//! | `gpu` | [`gpu`] | the CUDA/HIP runtime layer, loaded at run time | cudarc, cubecl-hip-sys (no SDK) |
//! | `shmem` | [`shmem`] | a symmetric heap over GPU peer-to-peer memory | as `gpu` |
//! | `ep` | [`ep`] | MORI-EP dispatch/combine: config, layout, host reference, GPU kernels' host side | as `gpu` |
//! | `full` | all of the above | | as `rdma` |
//!
//! A backend feature also turns on that backend inside [`io`]: with `xgmi`,
//! `io::BackendConfig::Xgmi` exists and the engine can choose it.

/// Out-of-band rendezvous of ranks: [`bootstrap::SocketBootstrap`] (MORI's socket
/// bootstrap) and [`bootstrap::LocalBootstrap`] (ranks as threads of one process).
///
/// ```
/// use mori::bootstrap::{Bootstrap, LocalBootstrap};
/// use std::time::Duration;
/// let ranks = LocalBootstrap::new_group(2, Duration::from_secs(5));
/// let got: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
///     let hs: Vec<_> = ranks.iter().map(|b| s.spawn(move || b.allgather(&[b.rank() as u8]).unwrap())).collect();
///     hs.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// assert_eq!(got[1], vec![vec![0u8], vec![1u8]]);
/// ```
#[cfg(feature = "bootstrap")]
pub mod bootstrap {
    pub use mori_bootstrap::*;
}

/// The MORI-IO transfer engine ([`io::IoEngine`]) with the tcp backend, and every backend
/// whose feature is on. Two engines of one process exchange descriptors as bytes, as two
/// servers would over their own channel, then one writes into the other's memory:
///
/// ```
/// use mori::io::{BackendConfig, EngineConfig, EngineDesc, IoEngine, MemLoc, MemoryDesc, TcpConfig};
/// use std::time::Duration;
/// let a = IoEngine::new("prefill-0", EngineConfig::new("127.0.0.1", 0)?)?;
/// let b = IoEngine::new("decode-0", EngineConfig::new("127.0.0.1", 0)?)?;
/// for e in [&a, &b] {
///     e.create_backend(BackendConfig::Tcp(TcpConfig::from_env()?))?;
/// }
/// let mut src = vec![7u8; 4096];
/// let mut dst = vec![0u8; 4096];
/// // SAFETY: both buffers outlive their registrations (deregistered below).
/// let src_mem = unsafe { a.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None })? };
/// let dst_mem = unsafe { b.register_memory(dst.as_mut_ptr(), dst.len(), MemLoc::Host { numa: None })? };
/// a.register_remote_engine(EngineDesc::unpack(&b.desc().pack())?)?;
/// let remote = MemoryDesc::unpack(&dst_mem.pack())?;
/// let id = a.allocate_transfer_uid();
/// a.write(&src_mem, 0, &remote, 1024, 2048, id).wait_for(Duration::from_secs(10))?;
/// b.deregister_memory(&dst_mem)?;
/// a.deregister_memory(&src_mem)?;
/// assert!(dst[1024..3072].iter().all(|&x| x == 7) && dst[..1024].iter().all(|&x| x == 0));
/// # Ok::<(), mori::io::IoError>(())
/// ```
#[cfg(feature = "io")]
pub mod io {
    pub use mori_io::*;
}

/// The engine core every backend shares: descriptors, statuses, errors, the [`io_core::Backend`]
/// trait and the sans-IO planners (for backend implementors and tools).
///
/// ```
/// use mori::io_core::{plan::check_batch, ErrorCode};
/// // Regions (id, length): local 1 of 4096 bytes, remote 2 of 1024 bytes. The second entry
/// // ends past the remote region and is refused, naming it.
/// let err = check_batch((1, 4096), (2, 1024), &[0, 512], &[0, 512], &[512, 1024]).unwrap_err();
/// assert_eq!(err.code, ErrorCode::InvalidArgs);
/// // Two entries contiguous on both sides merge into one segment.
/// assert_eq!(check_batch((1, 4096), (2, 1024), &[0, 256], &[0, 256], &[256, 256])?.len(), 1);
/// # Ok::<(), mori::io_core::IoError>(())
/// ```
#[cfg(feature = "io")]
pub mod io_core {
    pub use mori_io_core::*;
}

/// The tcp backend: any host, host memory, `lanes` connections per peer.
///
/// ```
/// let cfg = mori::tcp::TcpConfig { lanes: 2, ..Default::default() };
/// assert_eq!(cfg.lanes, 2);
/// ```
#[cfg(feature = "tcp")]
pub mod tcp {
    pub use mori_io_tcp::*;
}

/// The rdma backend: RC queue pairs over ibverbs (libibverbs opened at run time).
///
/// ```no_run
/// use mori::io::{BackendConfig, EngineConfig, IoEngine};
/// let eng = IoEngine::new("prefill-0", EngineConfig::new("10.0.0.1", 18516)?)?;
/// // NotSupported, naming what is missing, on a host without an active RDMA port:
/// eng.create_backend(BackendConfig::Rdma(mori::rdma::RdmaConfig::from_env()?))?;
/// # Ok::<(), mori::io::IoError>(())
/// ```
#[cfg(feature = "rdma")]
pub mod rdma {
    pub use mori_io_rdma::*;
}

/// The xgmi backend: GPU memory between GPUs of one node through CUDA/HIP IPC.
///
/// ```no_run
/// use mori::io::{BackendConfig, EngineConfig, IoEngine, MemLoc};
/// let eng = IoEngine::new("decode-0", EngineConfig::new("127.0.0.1", 0)?)?;
/// eng.create_backend(BackendConfig::Xgmi(mori::xgmi::XgmiConfig::default()))?;
/// let (ptr, len): (*mut u8, usize) = (std::ptr::null_mut(), 0); // a cudaMalloc'd buffer
/// let mem = unsafe { eng.register_memory(ptr, len, MemLoc::Gpu { device: 0 })? };
/// # let _ = mem;
/// # Ok::<(), mori::io::IoError>(())
/// ```
#[cfg(feature = "xgmi")]
pub mod xgmi {
    pub use mori_io_xgmi::*;
}

/// The fabric backend: GPU memory allocated exportable ([`fabric::FabricMemory`]) and shared
/// as POSIX FDs within a node or FABRIC handles across an NVLink domain.
///
/// ```no_run
/// use mori::fabric::{FabricConfig, HandleType};
/// use mori::io::{BackendConfig, EngineConfig, IoEngine};
/// let eng = IoEngine::new("decode-0", EngineConfig::new("127.0.0.1", 0)?)?;
/// eng.create_backend(BackendConfig::Fabric(FabricConfig { handle: HandleType::PosixFd, ..Default::default() }))?;
/// # Ok::<(), mori::io::IoError>(())
/// ```
#[cfg(feature = "fabric")]
pub mod fabric {
    pub use mori_io_fabric::*;
}

/// The memory-registration cache: registrations containing a range are shared, LRU eviction
/// under a byte budget (sans-IO: the registrar is plugged in).
///
/// ```
/// use mori::mr::{MemDomain, MrCache, Registrar};
/// struct Count(u32);
/// impl Registrar for Count {
///     type Handle = u32;
///     type Error = std::io::Error;
///     fn register(&mut self, _: MemDomain, _: u64, _: u64) -> Result<u32, std::io::Error> { self.0 += 1; Ok(self.0) }
///     fn deregister(&mut self, _: u32) {}
/// }
/// let mut cache = MrCache::new(Count(0), 1 << 30);
/// let a = cache.acquire(MemDomain::Host, 4096, 8192).unwrap();
/// let b = cache.acquire(MemDomain::Host, 8192, 16).unwrap(); // inside the first: shared
/// assert_eq!(a, b);
/// ```
#[cfg(feature = "mr")]
pub mod mr {
    pub use mori_mr::*;
}

/// Node topology from sysfs: GPUs, RDMA NICs, NUMA nodes, the PCIe tree, and each GPU's NIC.
///
/// ```
/// // This host's topology, read from /sys; a root without sysfs is an error naming it.
/// let t = mori::topo::scan(std::path::Path::new("/"))?;
/// println!("{} GPUs, {} RDMA NICs", t.gpus.len(), t.nics.len());
/// let err = mori::topo::scan(std::path::Path::new("/nonexistent-root")).unwrap_err();
/// assert!(err.to_string().contains("nonexistent-root"));
/// # Ok::<(), mori::topo::TopoError>(())
/// ```
#[cfg(feature = "topo")]
pub mod topo {
    pub use mori_topo::*;
}

/// The GPU runtime layer: CUDA or HIP, chosen and loaded at run time.
///
/// ```
/// // On a host without libcuda or libamdhip64 this is an error naming both libraries.
/// match mori::gpu::detect() {
///     Ok(rt) => println!("GPU runtime with {:?} devices", rt.device_count()),
///     Err(e) => println!("no GPU runtime: {e}"),
/// }
/// ```
#[cfg(feature = "gpu")]
pub mod gpu {
    pub use mori_gpu::*;
}

/// A symmetric heap over GPU peer-to-peer memory: put, put-with-signal, atomic add,
/// wait-until.
///
/// ```no_run
/// use mori::gpu::Device;
/// use mori::shmem::SymmetricHeap;
/// let rt = mori::gpu::detect()?;
/// // 8 PEs sharing GPU 0, 64 MiB each:
/// let heap = SymmetricHeap::in_process(rt, &[Device(0); 8], 64 << 20)?;
/// # let _ = heap;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "shmem")]
pub mod shmem {
    pub use mori_shmem::*;
}

/// MORI-EP: dispatch/combine configuration, layout, the host reference (the oracle of the GPU
/// kernels), DeepEP-compatible accounting, and the intranode kernels' host side.
///
/// ```
/// use mori::ep::{dispatch_layout, Tensor2};
/// // One token whose top-2 experts are 0 (on rank 0) and 3 (on rank 1): 4 experts over
/// // 2 ranks, 2 GPUs per node.
/// let idx = Tensor2::new(1, 2, vec![0i32, 3])?;
/// let layout = dispatch_layout(&idx, 4, 2, 2)?;
/// assert_eq!(layout.tokens_per_rank, vec![1, 1]);
/// assert_eq!(layout.tokens_per_node, vec![1]);
/// # Ok::<(), mori::ep::EpError>(())
/// ```
#[cfg(feature = "ep")]
pub mod ep {
    pub use mori_ep::*;
}

/// README.md's Rust examples, compiled and run as doc-tests (they use the io and tcp
/// features, the defaults).
#[cfg(all(doctest, feature = "io", feature = "tcp"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
