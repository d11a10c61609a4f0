//! What `mori check` asks the machine: shared libraries the loader can find, driver files,
//! and the transfer engine itself (which backends it creates, and which one it picks for a
//! pair of host regions and for GPU memory).

use mori_gpu::{Device, Runtime};
use mori_io::{BackendConfig, BackendKind, EngineConfig, IoEngine, MemLoc, RdmaConfig, TcpConfig};
use serde::Serialize;
use std::ffi::{CStr, CString};
use std::sync::Arc;

/// Whether the dynamic loader finds a library.
#[derive(Debug, Clone, Serialize)]
pub struct Library {
    /// Soname asked for.
    pub name: String,
    /// Whether `dlopen` succeeded.
    pub loadable: bool,
    /// `dlerror` text when it did not.
    pub error: Option<String>,
}

/// Asks the loader for `soname` (`dlopen` with lazy binding, closed again at once). Nothing
/// in the library is called beyond its load-time initializers.
pub fn library(soname: &str) -> Library {
    let Ok(c) = CString::new(soname) else {
        return Library { name: soname.into(), loadable: false, error: Some("name contains NUL".into()) };
    };
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call; the handle is
    // only passed to dlclose, and dlerror's string is copied before any other dl* call.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            let e = libc::dlerror();
            let msg = if e.is_null() { "not found".to_string() } else { CStr::from_ptr(e).to_string_lossy().into_owned() };
            return Library { name: soname.into(), loadable: false, error: Some(msg) };
        }
        libc::dlclose(h);
    }
    Library { name: soname.into(), loadable: true, error: None }
}

/// The first of `sonames` the loader finds, or the last failure.
pub fn any_library(sonames: &[&str]) -> Library {
    let mut last = library(sonames[0]);
    for s in sonames {
        last = library(s);
        if last.loadable {
            break;
        }
    }
    last
}

/// What the engine says about one backend for one kind of memory.
#[derive(Debug, Clone, Serialize)]
pub struct BackendVerdict {
    /// `xgmi`, `fabric`, `rdma`, `tcp`.
    pub backend: String,
    /// `host` or `gpu`.
    pub memory: String,
    /// Whether it would serve a transfer between two regions of that kind.
    pub serves: bool,
    /// Why (the engine's own words when it refused).
    pub reason: String,
}

fn config(kind: BackendKind) -> Result<BackendConfig, String> {
    Ok(match kind {
        BackendKind::Xgmi => BackendConfig::Xgmi(mori_io::XgmiConfig::default()),
        BackendKind::Fabric => BackendConfig::Fabric(mori_io::FabricConfig::from_env().map_err(|e| e.to_string())?),
        BackendKind::Rdma => BackendConfig::Rdma(RdmaConfig::from_env().map_err(|e| e.to_string())?),
        BackendKind::Tcp => BackendConfig::Tcp(TcpConfig::from_env().map_err(|e| e.to_string())?),
    })
}

fn engine(name: &str, kind: BackendKind) -> Result<IoEngine, String> {
    let cfg = EngineConfig::new("127.0.0.1", 0).map_err(|e| e.to_string())?;
    let e = IoEngine::new(&format!("mori-check-{kind}-{name}"), cfg).map_err(|e| e.to_string())?;
    e.create_backend(config(kind)?).map_err(|e| e.to_string())?;
    Ok(e)
}

/// Host memory: two in-process engines on loopback with only `kind`, a 4 KiB region on each,
/// and the engine's backend choice for the pair.
fn host_verdict(kind: BackendKind) -> (bool, String) {
    let mut bufs = [vec![0u8; 4096], vec![0u8; 4096]];
    let (a, b) = match (engine("a", kind), engine("b", kind)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return (false, e),
    };
    let [ba, bb] = &mut bufs;
    // SAFETY: both buffers outlive the registrations: they are deregistered below before the
    // buffers go out of scope, and no transfer is started on them.
    let regs = unsafe {
        (
            a.register_memory(ba.as_mut_ptr(), ba.len(), MemLoc::Host { numa: None }),
            b.register_memory(bb.as_mut_ptr(), bb.len(), MemLoc::Host { numa: None }),
        )
    };
    let verdict = match &regs {
        (Ok(la), Ok(rb)) => match a.register_remote_engine(b.desc().clone()).and_then(|_| a.backend_for(la, rb)) {
            Ok(k) if k == kind => (true, format!("the engine chose {k} for a host -> host pair")),
            Ok(k) => (false, format!("the engine chose {k} instead")),
            Err(e) => (false, e.to_string()),
        },
        (Err(e), _) | (_, Err(e)) => (false, e.to_string()),
    };
    if let Ok(d) = &regs.0 {
        let _ = a.deregister_memory(d);
    }
    if let Ok(d) = &regs.1 {
        let _ = b.deregister_memory(d);
    }
    verdict
}

/// GPU memory without a GPU runtime: whether the engine accepts a GPU registration at all (it
/// refuses before any backend is asked, and the xgmi backend cannot even be created).
fn gpu_verdict_no_runtime(kind: BackendKind) -> (bool, String) {
    let a = match engine("g", kind) {
        Ok(a) => a,
        Err(e) => return (false, e),
    };
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is valid for reads and writes and outlives the call; a registration that
    // succeeds is deregistered at once, and no transfer touches it.
    let r = unsafe { a.register_memory(buf.as_mut_ptr(), buf.len(), MemLoc::Gpu { device: 0 }) };
    match r {
        Err(e) => (false, format!("register_memory(GPU): {e}")),
        Ok(d) => {
            let _ = a.deregister_memory(&d);
            (false, "the engine accepts GPU registrations, but this check cannot allocate GPU memory to test a pair".into())
        }
    }
}

/// GPU memory with a runtime: two in-process engines with only `kind`, 4 KiB of device memory
/// each (GPU 0 for the first engine, GPU 1 for the second where there is one, else GPU 0
/// again), and the engine's backend choice for the pair.
fn gpu_verdict(kind: BackendKind, rt: &Arc<dyn Runtime>) -> (bool, String) {
    let n = match rt.device_count() {
        Ok(n) => n,
        Err(e) => return (false, format!("the GPU runtime cannot count devices: {e}")),
    };
    if n == 0 {
        return (false, "the GPU runtime sees no device".into());
    }
    let (ld, rd) = (Device(0), Device(if n > 1 { 1 } else { 0 }));
    const LEN: usize = 4096;
    // Declared before the engines: dropped (freed) after them.
    let bufs = match (rt.alloc(ld, LEN), rt.alloc(rd, LEN)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return (false, format!("allocating GPU memory for the check: {e}")),
    };
    let (a, b) = match (engine("ga", kind), engine("gb", kind)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return (false, e),
    };
    // SAFETY: both buffers are live device allocations of LEN bytes on their devices and
    // outlive the registrations: they are deregistered below, before the engines and then the
    // buffers are dropped, and no transfer is started on them.
    let regs = unsafe {
        (
            a.register_memory(bufs.0.ptr() as usize as *mut u8, LEN, MemLoc::Gpu { device: ld.0 }),
            b.register_memory(bufs.1.ptr() as usize as *mut u8, LEN, MemLoc::Gpu { device: rd.0 }),
        )
    };
    let pair = format!("a GPU {} -> GPU {} pair{}", ld.0, rd.0, if n == 1 { " (one device)" } else { "" });
    let verdict = match &regs {
        (Ok(la), Ok(rb)) => match a.register_remote_engine(b.desc().clone()).and_then(|_| a.backend_for(la, rb)) {
            Ok(k) if k == kind => (true, format!("the engine chose {k} for {pair}")),
            Ok(k) => (false, format!("the engine chose {k} instead for {pair}")),
            Err(e) => (false, format!("{pair}: {e}")),
        },
        (Err(e), _) | (_, Err(e)) => (false, format!("register_memory(GPU): {e}")),
    };
    if let Ok(d) = &regs.0 {
        let _ = a.deregister_memory(d);
    }
    if let Ok(d) = &regs.1 {
        let _ = b.deregister_memory(d);
    }
    drop((a, b));
    drop(bufs);
    verdict
}

/// Every backend in the engine's preference order, for host and for GPU memory (real device
/// memory when `runtime` is given).
pub fn backends(runtime: Option<&Arc<dyn Runtime>>) -> Vec<BackendVerdict> {
    let mut out = Vec::new();
    for kind in [BackendKind::Xgmi, BackendKind::Fabric, BackendKind::Rdma, BackendKind::Tcp] {
        let gpu = match runtime {
            Some(rt) => gpu_verdict(kind, rt),
            None => gpu_verdict_no_runtime(kind),
        };
        for (memory, (serves, reason)) in [("host", host_verdict(kind)), ("gpu", gpu)] {
            out.push(BackendVerdict { backend: kind.name().into(), memory: memory.into(), serves, reason });
        }
    }
    out
}
