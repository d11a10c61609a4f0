//! CUDA implementation of [`crate::Runtime`] over the driver API (libcuda opened by `cudarc`).
//!
//! Context handling: the runtime retains each device's primary context the first time the
//! device is used (released when the runtime is dropped) and makes it current on the calling
//! thread before every call that needs one (`cuCtxGetCurrent`, then `cuCtxSetCurrent` if it
//! differs).

mod ffi;
mod memops;
mod ops;

use std::borrow::Cow;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::sys as cu;

use crate::error::{cuda_error_name, GpuError, Result};
use crate::runtime::{sealed, RawDriver};
use crate::types::{numa_node_from_sysfs, Capabilities, Device, DeviceProperties, PciBusId, RuntimeKind};
use crate::Runtime;
use ffi::{CuResult, CudaApi};

static API: OnceLock<std::result::Result<CudaApi, (&'static str, String)>> = OnceLock::new();

/// The CUDA driver runtime.
pub struct CudaRuntime {
    api: &'static CudaApi,
    me: Weak<CudaRuntime>,
    library: String,
    device_count: u32,
    /// Per device ordinal: the `CUdevice` and its retained primary context (as an integer),
    /// set once; read without a lock by every call (the hot path of copies and event queries
    /// from several threads).
    contexts: Vec<OnceLock<(cu::CUdevice, u64)>>,
    /// Serializes the first retain of a device's primary context.
    retain: Mutex<()>,
}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaRuntime({}, {} devices)", self.library, self.device_count)
    }
}

impl sealed::Sealed for CudaRuntime {}

impl Runtime for CudaRuntime {
    fn raw(&self) -> &dyn RawDriver {
        self
    }

    fn shared(&self) -> Result<Arc<dyn Runtime>> {
        match self.me.upgrade() {
            Some(rt) => Ok(rt),
            None => Err(GpuError::invalid("the CUDA runtime is being dropped")),
        }
    }
}

/// Name of a CUDA code: the bindings' table, else the driver's `cuGetErrorName`.
fn code_name(api: Option<&CudaApi>, code: CuResult) -> Cow<'static, str> {
    if let Some(n) = cuda_error_name(code) {
        return Cow::Borrowed(n);
    }
    if let Some(api) = api {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName takes any code and writes a pointer to a static string or
        // returns an error (leaving p null) for codes it does not know.
        if unsafe { (api.cuGetErrorName)(code, &mut p) } == 0 && !p.is_null() {
            // SAFETY: p points to a NUL-terminated static string owned by the driver.
            return Cow::Owned(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
        }
    }
    Cow::Borrowed("CUDA_ERROR_UNRECOGNIZED")
}

/// A failed CUDA call as an error (used by tests through the crate's error formatting).
pub(crate) fn call_error(api: Option<&CudaApi>, call: &'static str, code: CuResult, hint: Option<Cow<'static, str>>) -> GpuError {
    GpuError::Call { runtime: RuntimeKind::Cuda, call, code, name: code_name(api, code), hint }
}

fn cstr_buf(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn library_path(api: &CudaApi) -> String {
    // SAFETY: Dl_info is plain data; dladdr only reads the address and fills the struct.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(api.cuInit as *const libc::c_void, &mut info) != 0 && !info.dli_fname.is_null() {
            return CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned();
        }
    }
    "libcuda".to_string()
}

impl CudaRuntime {
    /// Opens libcuda (through `cudarc`), resolves the entry points, runs `cuInit` and counts
    /// devices. Errors (never panics) when the library is missing, too old, or has no device.
    pub fn load() -> Result<Arc<CudaRuntime>> {
        // SAFETY: only tries to dlopen the candidate names; no other precondition.
        if !unsafe { cu::is_culib_present() } {
            return Err(GpuError::LibraryNotFound {
                runtime: RuntimeKind::Cuda,
                library: "libcuda",
                searched: {
                    let mut names = cudarc::get_lib_name_candidates("cuda");
                    let mut seen = std::collections::HashSet::new();
                    names.retain(|n| seen.insert(n.clone()));
                    names.join(", ")
                },
            });
        }
        // SAFETY: is_culib_present just opened the library, so culib() finds it and does not panic.
        let lib = unsafe { cu::culib() };
        let api = match API.get_or_init(|| CudaApi::load(lib)) {
            Ok(api) => api,
            Err((symbol, reason)) => {
                return Err(GpuError::MissingSymbol {
                    runtime: RuntimeKind::Cuda,
                    library: "libcuda".into(),
                    symbol,
                    reason: reason.clone(),
                })
            }
        };
        // SAFETY: cuInit has no pointer arguments.
        let code = unsafe { (api.cuInit)(0) };
        if code != 0 {
            let hint = match code {
                100 => Some("no CUDA device is visible (driver not loaded, or CUDA_VISIBLE_DEVICES hides them)".into()),
                34 => Some("the toolkit's stub libcuda was loaded instead of the driver's".into()),
                _ => None,
            };
            return Err(call_error(Some(api), "cuInit", code, hint));
        }
        let mut n: c_int = 0;
        // SAFETY: n is a valid out-pointer.
        let code = unsafe { (api.cuDeviceGetCount)(&mut n) };
        if code != 0 {
            return Err(call_error(Some(api), "cuDeviceGetCount", code, None));
        }
        let device_count = u32::try_from(n).unwrap_or(0);
        Ok(Arc::new_cyclic(|me| CudaRuntime {
            api,
            me: me.clone(),
            library: library_path(api),
            device_count,
            contexts: (0..device_count).map(|_| OnceLock::new()).collect(),
            retain: Mutex::new(()),
        }))
    }

    fn check(&self, call: &'static str, code: CuResult) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(call_error(Some(self.api), call, code, None))
        }
    }

    fn check_hint(&self, call: &'static str, code: CuResult, hint: impl FnOnce(CuResult) -> Option<Cow<'static, str>>) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(call_error(Some(self.api), call, code, hint(code)))
        }
    }

    fn cudev(&self, dev: Device) -> Result<cu::CUdevice> {
        if dev.0 >= self.device_count {
            return Err(GpuError::invalid(format!("{dev} does not exist: {} CUDA devices visible", self.device_count)));
        }
        let mut d: cu::CUdevice = 0;
        // SAFETY: d is a valid out-pointer; the ordinal is in range.
        self.check("cuDeviceGet", unsafe { (self.api.cuDeviceGet)(&mut d, dev.0 as c_int) })?;
        Ok(d)
    }

    /// The retained primary context of `dev` (retained on first use).
    fn context(&self, dev: Device) -> Result<cu::CUcontext> {
        if let Some((_, ctx)) = self.contexts.get(dev.0 as usize).and_then(OnceLock::get) {
            return Ok(*ctx as usize as cu::CUcontext);
        }
        let d = self.cudev(dev)?;
        let _g = self.retain.lock().unwrap_or_else(|p| p.into_inner());
        let slot = self
            .contexts
            .get(dev.0 as usize)
            .ok_or_else(|| GpuError::invalid(format!("{dev} does not exist: {} CUDA devices visible", self.device_count)))?;
        if let Some((_, ctx)) = slot.get() {
            return Ok(*ctx as usize as cu::CUcontext);
        }
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: ctx is a valid out-pointer; d is a valid device.
        self.check("cuDevicePrimaryCtxRetain", unsafe { (self.api.cuDevicePrimaryCtxRetain)(&mut ctx, d) })?;
        let _ = slot.set((d, ctx as usize as u64));
        Ok(ctx)
    }

    fn bind_ctx(&self, dev: Device) -> Result<cu::CUcontext> {
        let ctx = self.context(dev)?;
        let mut cur: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: cur is a valid out-pointer.
        self.check("cuCtxGetCurrent", unsafe { (self.api.cuCtxGetCurrent)(&mut cur) })?;
        if cur != ctx {
            // SAFETY: ctx is a retained primary context, live until this runtime drops.
            self.check("cuCtxSetCurrent", unsafe { (self.api.cuCtxSetCurrent)(ctx) })?;
        }
        Ok(ctx)
    }

    fn attr(&self, d: cu::CUdevice, a: cu::CUdevice_attribute) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: v is a valid out-pointer; the attribute is a value of the 13.0 enum.
        self.check("cuDeviceGetAttribute", unsafe { (self.api.cuDeviceGetAttribute)(&mut v, a as c_uint, d) })?;
        Ok(v)
    }

    /// An attribute an older driver may not know: unknown reads as 0.
    fn attr_or_zero(&self, d: cu::CUdevice, a: cu::CUdevice_attribute) -> Result<i32> {
        match self.attr(d, a) {
            Err(e) if e.code() == Some(1) => Ok(0),
            other => other,
        }
    }

    fn props(&self, dev: Device) -> Result<DeviceProperties> {
        use cu::CUdevice_attribute_enum as A;
        let d = self.cudev(dev)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 chars and its length is passed.
        self.check("cuDeviceGetName", unsafe { (self.api.cuDeviceGetName)(name.as_mut_ptr(), 256, d) })?;
        let mut bus = [0 as c_char; 64];
        // SAFETY: as above, 64 chars.
        self.check("cuDeviceGetPCIBusId", unsafe { (self.api.cuDeviceGetPCIBusId)(bus.as_mut_ptr(), 64, d) })?;
        let pci_bus_id: PciBusId = cstr_buf(&bus).parse()?;
        let mut total: usize = 0;
        // SAFETY: total is a valid out-pointer.
        self.check("cuDeviceTotalMem_v2", unsafe { (self.api.cuDeviceTotalMem_v2)(&mut total, d) })?;
        let flag = |a| -> Result<bool> { Ok(self.attr_or_zero(d, a)? != 0) };
        let numa_node = match numa_node_from_sysfs(Path::new("/sys"), &pci_bus_id) {
            Some(n) => Some(n),
            // -1 (no NUMA affinity) and an older driver without the attribute both mean "unknown".
            None => self.attr(d, A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID).ok().and_then(|v| u32::try_from(v).ok()),
        };
        Ok(DeviceProperties {
            device: dev,
            name: cstr_buf(&name),
            pci_bus_id,
            numa_node,
            total_memory: total as u64,
            compute_capability: (
                self.attr(d, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                self.attr(d, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            multiprocessors: self.attr(d, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            max_shared_memory_per_block_optin: self.attr_or_zero(d, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32,
            capabilities: Capabilities {
                unified_addressing: flag(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)?,
                vmm: flag(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?,
                posix_fd_handles: flag(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)?,
                fabric_handles: flag(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)?,
                dmabuf: flag(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)?,
                gpu_direct_rdma: flag(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)?,
                gpu_direct_rdma_vmm: flag(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)?,
                stream_mem_ops: flag(A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1)?,
            },
        })
    }
}

impl Drop for CudaRuntime {
    fn drop(&mut self) {
        for (d, _) in self.contexts.iter().filter_map(OnceLock::get) {
            // SAFETY: each context was retained once by this runtime; release it once.
            let code = unsafe { (self.api.cuDevicePrimaryCtxRelease_v2)(*d) };
            if code != 0 {
                tracing::warn!(device = d, "{}", call_error(Some(self.api), "cuDevicePrimaryCtxRelease_v2", code, None));
            }
        }
    }
}
