//! Code modules (PTX, cubin, fatbin, AMD code objects), their functions, and kernel arguments.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use crate::error::{GpuError, Result};
use crate::memory::DeviceSlice;
use crate::stream::Stream;
use crate::types::{Device, LaunchConfig, RuntimeKind};
use crate::Runtime;

/// Code to load into a module. Images are checked before the driver sees them: the driver reads
/// as many bytes as the image's own headers say, so a truncated image is refused here.
#[derive(Debug, Clone, Copy)]
pub enum ModuleImage<'a> {
    /// PTX text (CUDA; JIT-compiled by the driver).
    Ptx(&'a str),
    /// A CUDA ELF cubin.
    Cubin(&'a [u8]),
    /// A CUDA fat binary.
    Fatbin(&'a [u8]),
    /// An AMD GPU code object: ELF, or a clang offload bundle (HIP).
    HipCodeObject(&'a [u8]),
}

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";

fn le_u16(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 2).map(|s| u64::from(u16::from_le_bytes([s[0], s[1]])))
}

fn le_u32(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 4).map(|s| u64::from(u32::from_le_bytes([s[0], s[1], s[2], s[3]])))
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

fn within(len: usize, off: u64, size: u64) -> bool {
    off.checked_add(size).is_some_and(|end| end <= len as u64)
}

/// Checks that a 64-bit little-endian ELF image and all its tables and sections fit in `b`.
fn check_elf(b: &[u8]) -> std::result::Result<(), String> {
    if b.len() < 64 || &b[0..4] != ELF_MAGIC {
        return Err("not an ELF image".into());
    }
    if b[4] != 2 || b[5] != 1 {
        return Err("not a 64-bit little-endian ELF".into());
    }
    let field = |at| le_u64(b, at).ok_or("truncated ELF header");
    let half = |at| le_u16(b, at).ok_or("truncated ELF header");
    let (phoff, shoff) = (field(0x20)?, field(0x28)?);
    let (phentsize, phnum, shentsize, shnum) = (half(0x36)?, half(0x38)?, half(0x3A)?, half(0x3C)?);
    if phnum > 0 && !within(b.len(), phoff, phentsize * phnum) {
        return Err("program headers past the end of the image (truncated?)".into());
    }
    if shnum > 0 {
        if shentsize < 64 || !within(b.len(), shoff, shentsize * shnum) {
            return Err("section headers past the end of the image (truncated?)".into());
        }
        for i in 0..shnum {
            let sh = (shoff + i * shentsize) as usize;
            let kind = le_u32(b, sh + 4).ok_or("truncated section header")?;
            let (off, size) = (le_u64(b, sh + 0x18).ok_or("truncated")?, le_u64(b, sh + 0x20).ok_or("truncated")?);
            const SHT_NOBITS: u64 = 8;
            if kind != SHT_NOBITS && !within(b.len(), off, size) {
                return Err(format!("section {i} ends past the end of the image (truncated?)"));
            }
        }
    }
    Ok(())
}

fn check_fatbin(b: &[u8]) -> std::result::Result<(), String> {
    if le_u32(b, 0) != Some(u64::from(FATBIN_MAGIC)) {
        return Err("not a CUDA fatbin (magic 0xBA55ED50)".into());
    }
    let header = le_u16(b, 6).ok_or("truncated fatbin header")?;
    let body = le_u64(b, 8).ok_or("truncated fatbin header")?;
    if header < 16 || !within(b.len(), header, body) {
        return Err("fatbin body past the end of the image (truncated?)".into());
    }
    Ok(())
}

fn check_bundle(b: &[u8]) -> std::result::Result<(), String> {
    let n = le_u64(b, BUNDLE_MAGIC.len()).ok_or("truncated offload bundle")?;
    let mut at = BUNDLE_MAGIC.len() + 8;
    for i in 0..n {
        let (off, size, tlen) = (
            le_u64(b, at).ok_or("truncated bundle entry")?,
            le_u64(b, at + 8).ok_or("truncated bundle entry")?,
            le_u64(b, at + 16).ok_or("truncated bundle entry")?,
        );
        if !within(b.len(), off, size) {
            return Err(format!("bundle entry {i} past the end of the image (truncated?)"));
        }
        at = at
            .checked_add(24)
            .and_then(|a| a.checked_add(usize::try_from(tlen).ok()?))
            .filter(|&a| a <= b.len())
            .ok_or("bundle entry triple past the end")?;
    }
    Ok(())
}

impl ModuleImage<'_> {
    /// Checks the image against the runtime that will load it.
    pub fn validate(&self, runtime: RuntimeKind) -> Result<()> {
        let unsupported =
            |what: &'static str| GpuError::Unsupported { runtime, what, why: "load a code object built for this vendor".into() };
        let bad = |why: String| GpuError::Decode { what: "module image", why };
        match (self, runtime) {
            (ModuleImage::Ptx(text), RuntimeKind::Cuda) => {
                if text.trim().is_empty() {
                    return Err(bad("empty PTX".into()));
                }
                if text.contains('\0') {
                    return Err(bad("PTX text contains a NUL byte".into()));
                }
                Ok(())
            }
            (ModuleImage::Cubin(b), RuntimeKind::Cuda) => check_elf(b).map_err(bad),
            (ModuleImage::Fatbin(b), RuntimeKind::Cuda) => check_fatbin(b).map_err(bad),
            (ModuleImage::HipCodeObject(b), RuntimeKind::Hip) => {
                if b.starts_with(BUNDLE_MAGIC) {
                    check_bundle(b).map_err(bad)
                } else {
                    check_elf(b).map_err(bad)
                }
            }
            (ModuleImage::Ptx(_), RuntimeKind::Hip) => Err(unsupported("loading PTX")),
            (ModuleImage::Cubin(_) | ModuleImage::Fatbin(_), RuntimeKind::Hip) => Err(unsupported("loading CUDA binaries")),
            (ModuleImage::HipCodeObject(_), RuntimeKind::Cuda) => Err(unsupported("loading AMD code objects")),
        }
    }
}

pub(crate) struct ModuleInner {
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) device: Device,
    pub(crate) raw: u64,
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: raw came from module_load and is unloaded exactly once, after every Function
        // (which holds this Arc) is gone.
        if let Err(e) = unsafe { self.rt.raw().module_unload(self.device, self.raw) } {
            tracing::warn!(device = self.device.0, "unloading a module failed: {e}");
        }
    }
}

/// A loaded module; unloaded when it and all its functions are dropped.
#[derive(Clone)]
pub struct Module {
    pub(crate) inner: Arc<ModuleInner>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Module({:#x} on {})", self.inner.raw, self.inner.device)
    }
}

impl Module {
    /// Device it was loaded on.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Looks up an `extern "C"` kernel by name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let cname = std::ffi::CString::new(name).map_err(|_| GpuError::invalid(format!("kernel name {name:?} contains a NUL byte")))?;
        // SAFETY: the module handle is live (we hold its Arc); cname is NUL-terminated.
        let raw = unsafe { self.inner.rt.raw().module_function(self.inner.device, self.inner.raw, &cname)? };
        Ok(Function { module: self.inner.clone(), raw, name: name.to_string() })
    }
}

/// A kernel of a loaded module (keeps the module loaded).
pub struct Function {
    pub(crate) module: Arc<ModuleInner>,
    pub(crate) raw: u64,
    pub(crate) name: String,
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Function({} on {})", self.name, self.module.device)
    }
}

impl Function {
    /// Kernel name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Device of its module.
    pub fn device(&self) -> Device {
        self.module.device
    }

    /// Allows launches with up to `bytes` of dynamic shared memory per block.
    pub fn set_max_dynamic_shared_mem(&self, bytes: u32) -> Result<()> {
        // SAFETY: the function handle is live while its module is (we hold the module's Arc).
        unsafe { self.module.rt.raw().function_set_max_dynamic_shared(self.module.device, self.raw, bytes) }
    }

    /// Prefers `percent` (0 to 100) of the largest shared-memory configuration for the
    /// multiprocessors this kernel's blocks run on, or -1 for the driver's choice
    /// (`CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`; a hint; nothing on HIP, whose
    /// shared memory is apart from the L1 cache). A multiprocessor changes its split only when
    /// it is empty, so a grid that stays on the device keeps its split for every block beside
    /// it. Errors: a percent outside -1 to 100, the driver's.
    pub fn set_shared_carveout(&self, percent: i32) -> Result<()> {
        if !(-1..=100).contains(&percent) {
            return Err(GpuError::invalid(format!("a shared-memory carveout of {percent}%: -1 (the driver's choice) or 0 to 100")));
        }
        // SAFETY: the function handle is live while its module is (we hold the module's Arc).
        unsafe { self.module.rt.raw().function_set_shared_carveout(self.module.device, self.raw, percent) }
    }

    /// Launches the kernel; see [`Runtime::launch`].
    ///
    /// # Safety
    /// As [`Runtime::launch`].
    pub unsafe fn launch(&self, stream: &Stream, cfg: &LaunchConfig, params: &[*mut c_void]) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.module.rt.launch(self, stream, cfg, params) }
    }
}

/// Owned storage for kernel arguments, each in its own 16-byte aligned slot, and the pointer
/// array the launch takes.
#[derive(Default)]
pub struct KernelArgs {
    slots: Vec<Box<[u128]>>,
}

impl fmt::Debug for KernelArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelArgs({} args)", self.slots.len())
    }
}

impl KernelArgs {
    /// No arguments yet.
    pub fn new() -> Self {
        KernelArgs::default()
    }

    /// Appends a by-value argument (an integer, a float, a `#[repr(C)]` struct ...).
    pub fn push<T: Copy + 'static>(&mut self, value: T) -> &mut Self {
        const { assert!(std::mem::align_of::<T>() <= 16, "kernel argument aligned above 16 bytes") };
        let words = std::mem::size_of::<T>().div_ceil(16).max(1);
        let mut slot = vec![0u128; words].into_boxed_slice();
        // SAFETY: the slot is at least size_of::<T>() bytes and 16-byte aligned (>= align_of::<T>()).
        unsafe { slot.as_mut_ptr().cast::<T>().write(value) };
        self.slots.push(slot);
        self
    }

    /// Appends a device pointer argument (`T*` in the kernel).
    pub fn push_ptr(&mut self, slice: &DeviceSlice<'_>) -> &mut Self {
        self.push(slice.ptr())
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The `void*` array for the launch; valid while `self` is neither moved-from nor mutated.
    pub fn params(&self) -> Vec<*mut c_void> {
        self.slots.iter().map(|s| s.as_ptr() as *mut c_void).collect()
    }
}

/// The prebuilt images of one kernel source (kernels/prebuilt): sm_90 cubin and PTX for CUDA,
/// a gfx942 code object for HIP.
#[derive(Debug, Clone, Copy)]
pub struct KernelImages<'a> {
    /// `<name>.sm_90.cubin`.
    pub cubin: &'a [u8],
    /// `<name>.sm_90.ptx` (JIT-compiled when the cubin does not load).
    pub ptx: &'a str,
    /// `<name>.gfx942.hsaco`.
    pub hsaco: &'a [u8],
}

impl KernelImages<'_> {
    /// Loads the images of `rt`'s kind on `dev`, first that loads wins (CUDA: cubin, then PTX).
    /// Errors: the last load error (which names the image and the driver's code).
    pub fn load(&self, rt: &dyn crate::Runtime, dev: Device) -> Result<Module> {
        let images: &[ModuleImage<'_>] = match rt.kind() {
            RuntimeKind::Cuda => &[ModuleImage::Cubin(self.cubin), ModuleImage::Ptx(self.ptx)],
            RuntimeKind::Hip => &[ModuleImage::HipCodeObject(self.hsaco)],
        };
        let mut last = None;
        for img in images {
            match rt.load_module(dev, *img) {
                Ok(m) => return Ok(m),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| GpuError::invalid("no kernel image for this runtime")))
    }
}
