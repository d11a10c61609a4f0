//! Test support: host memory standing in for device memory, and kernels/*.cu built with
//! `MORI_HOST_EMU` (kernels/README.md) and launched on CPU threads.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// 64-byte aligned zeroed host memory standing in for device and mapped memory.
pub(crate) struct Region {
    pub(crate) ptr: *mut u8,
    layout: Layout,
}

// SAFETY: plain heap memory, shared through atomics or after the emulated launch returned.
unsafe impl Send for Region {}
// SAFETY: as for Send.
unsafe impl Sync for Region {}

impl Region {
    pub(crate) fn new(bytes: usize) -> Self {
        let layout = Layout::from_size_align(bytes.max(64), 64).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Self { ptr, layout }
    }
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: allocated and zeroed for layout.size() bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.layout.size());
        // SAFETY: aligned and inside the region.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off) as *mut u64) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

type EmuLaunch = unsafe extern "C" fn(u32, u32, *const c_void) -> i32;

/// The emulation library of kernels/`kernel`.cu, built once per test process with the host
/// C++ compiler (`$CXX`, else `c++`; the machine image ships g++).
fn emu_lib(kernel: &str) -> &'static libloading::Library {
    static LIBS: Mutex<BTreeMap<String, &'static libloading::Library>> = Mutex::new(BTreeMap::new());
    let mut libs = LIBS.lock().unwrap();
    let lib: &mut &'static libloading::Library = libs.entry(kernel.to_string()).or_insert_with(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../kernels/{kernel}.cu"));
        let dir = std::env::temp_dir().join(format!("mori-ep-emu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let so = dir.join(format!("lib{kernel}_emu.so"));
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let out = std::process::Command::new(&cxx)
            .args([
                "-x",
                "c++",
                "-std=c++20",
                "-O1",
                "-pthread",
                "-shared",
                "-fPIC",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-DMORI_HOST_EMU",
                "-o",
            ])
            .arg(&so)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("the host C++ compiler {cxx} is needed to emulate kernels/{kernel}.cu: {e}"));
        assert!(out.status.success(), "building the emulation of {}:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
        // SAFETY: a library this test just built from our kernel source (no initializers beyond
        // the C++ runtime's); it stays loaded for the process (leaked).
        let lib = unsafe { libloading::Library::new(&so) }.unwrap_or_else(|e| panic!("loading {}: {e}", so.display()));
        Box::leak(Box::new(lib))
    });
    lib
}

/// Runs kernel `name` of kernels/`kernel`.cu over `grid` x `block` emulated threads with
/// by-value parameter `p`.
pub(crate) fn launch<P>(kernel: &str, name: &str, grid: u32, block: u32, p: &P) {
    let sym = format!("mori_emu_{name}");
    // SAFETY: MORI_EMU_EXPORT defines the symbol as int(uint32_t, uint32_t, const void*).
    let f = unsafe { emu_lib(kernel).get::<EmuLaunch>(sym.as_bytes()) }.unwrap_or_else(|e| panic!("no symbol {sym}: {e}"));
    // SAFETY: `p` is laid out as the kernel's parameter (the ABI structs mirrored in Rust) and
    // every address in it points into memory that outlives the call.
    let rc = unsafe { f(grid, block, p as *const P as *const c_void) };
    assert_eq!(rc, 0, "mori_emu_{name}: bad launch shape");
}
