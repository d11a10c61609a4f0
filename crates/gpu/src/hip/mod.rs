//! HIP implementation of [`crate::Runtime`] (libamdhip64 opened at run time).
//!
//! Compile-checked only: no machine of this project has an AMD GPU, so nothing here has run.
//! Device handling: HIP has no explicit contexts in this API; every call that needs a device
//! makes it current on the calling thread with `hipSetDevice` (after `hipGetDevice` says it is
//! not already).

mod ffi;
mod ops;

use std::borrow::Cow;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::path::Path;
use std::sync::{Arc, OnceLock, Weak};

use crate::error::{hip_error_name, GpuError, Result};
use crate::runtime::{sealed, RawDriver};
use crate::types::{numa_node_from_sysfs, Capabilities, Device, DeviceProperties, PciBusId, RuntimeKind};
use crate::Runtime;
use cubecl_hip_sys as h;
use ffi::{HipApi, HipResult};

struct Loaded {
    api: HipApi,
    path: String,
}

static LOADED: OnceLock<std::result::Result<Loaded, LoadFailure>> = OnceLock::new();

/// A load failure kept in the `OnceLock` (re-created as a `GpuError` on each call).
#[derive(Clone)]
enum LoadFailure {
    NotFound(String),
    Symbol(String, &'static str, String),
}

/// The HIP runtime.
pub struct HipRuntime {
    api: &'static HipApi,
    me: Weak<HipRuntime>,
    library: String,
    device_count: u32,
}

impl std::fmt::Debug for HipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipRuntime({}, {} devices)", self.library, self.device_count)
    }
}

impl sealed::Sealed for HipRuntime {}

impl Runtime for HipRuntime {
    fn raw(&self) -> &dyn RawDriver {
        self
    }

    fn shared(&self) -> Result<Arc<dyn Runtime>> {
        match self.me.upgrade() {
            Some(rt) => Ok(rt),
            None => Err(GpuError::invalid("the HIP runtime is being dropped")),
        }
    }
}

/// Library names and paths tried, in order: `$ROCM_PATH/lib`, `$HIP_PATH/lib`, the loader
/// path, ROCm's default prefix.
fn candidates() -> Vec<String> {
    let mut v = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Some(dir) = std::env::var_os(var) {
            v.push(Path::new(&dir).join("lib").join("libamdhip64.so").to_string_lossy().into_owned());
        }
    }
    for name in ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"] {
        v.push(name.to_string());
    }
    v.push("/opt/rocm/lib/libamdhip64.so".to_string());
    v
}

fn open() -> std::result::Result<Loaded, LoadFailure> {
    let names = candidates();
    for name in &names {
        // SAFETY: opening the vendor runtime library runs its initializers, which is what every
        // HIP program does; no other precondition.
        if let Ok(lib) = unsafe { libloading::Library::new(name) } {
            let lib: &'static libloading::Library = Box::leak(Box::new(lib));
            return match HipApi::load(lib) {
                Ok(api) => Ok(Loaded { api, path: name.clone() }),
                Err((sym, reason)) => Err(LoadFailure::Symbol(name.clone(), sym, reason)),
            };
        }
    }
    Err(LoadFailure::NotFound(names.join(", ")))
}

fn code_name(api: Option<&HipApi>, code: HipResult) -> Cow<'static, str> {
    if let Some(n) = hip_error_name(code) {
        return Cow::Borrowed(n);
    }
    if let Some(f) = api.and_then(|a| a.hipGetErrorName) {
        // SAFETY: hipGetErrorName takes any code and returns a static string (or null).
        let p = unsafe { f(code) };
        if !p.is_null() {
            // SAFETY: p points to a NUL-terminated static string owned by the runtime.
            return Cow::Owned(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
        }
    }
    Cow::Borrowed("hipErrorUnrecognized")
}

pub(crate) fn call_error(api: Option<&HipApi>, call: &'static str, code: HipResult, hint: Option<Cow<'static, str>>) -> GpuError {
    GpuError::Call { runtime: RuntimeKind::Hip, call, code, name: code_name(api, code), hint }
}

fn cstr_buf(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl HipRuntime {
    /// Opens libamdhip64, resolves the entry points, runs `hipInit` and counts devices. Errors
    /// (never panics) when the library is missing, too old, or has no device.
    pub fn load() -> Result<Arc<HipRuntime>> {
        let loaded = match LOADED.get_or_init(open) {
            Ok(l) => l,
            Err(LoadFailure::NotFound(searched)) => {
                return Err(GpuError::LibraryNotFound { runtime: RuntimeKind::Hip, library: "libamdhip64", searched: searched.clone() })
            }
            Err(LoadFailure::Symbol(lib, symbol, reason)) => {
                return Err(GpuError::MissingSymbol { runtime: RuntimeKind::Hip, library: lib.clone(), symbol, reason: reason.clone() })
            }
        };
        let api = &loaded.api;
        // SAFETY: hipInit has no pointer arguments.
        let code = unsafe { (api.hipInit)(0) };
        if code != 0 {
            let hint = (code == 100).then(|| "no AMD GPU is visible (amdgpu driver, /dev/kfd permissions, HIP_VISIBLE_DEVICES)".into());
            return Err(call_error(Some(api), "hipInit", code, hint));
        }
        let mut n: c_int = 0;
        // SAFETY: n is a valid out-pointer.
        let code = unsafe { (api.hipGetDeviceCount)(&mut n) };
        if code != 0 {
            return Err(call_error(Some(api), "hipGetDeviceCount", code, None));
        }
        Ok(Arc::new_cyclic(|me| HipRuntime {
            api,
            me: me.clone(),
            library: loaded.path.clone(),
            device_count: u32::try_from(n).unwrap_or(0),
        }))
    }

    fn check(&self, call: &'static str, code: HipResult) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(call_error(Some(self.api), call, code, None))
        }
    }

    fn check_hint(&self, call: &'static str, code: HipResult, hint: impl FnOnce(HipResult) -> Option<Cow<'static, str>>) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(call_error(Some(self.api), call, code, hint(code)))
        }
    }

    fn ordinal(&self, dev: Device) -> Result<c_int> {
        if dev.0 >= self.device_count {
            return Err(GpuError::invalid(format!("{dev} does not exist: {} HIP devices visible", self.device_count)));
        }
        Ok(dev.0 as c_int)
    }

    /// Makes `dev` current on this thread; returns its ordinal.
    fn set(&self, dev: Device) -> Result<c_int> {
        let d = self.ordinal(dev)?;
        let mut cur: c_int = -1;
        // SAFETY: cur is a valid out-pointer.
        self.check("hipGetDevice", unsafe { (self.api.hipGetDevice)(&mut cur) })?;
        if cur != d {
            // SAFETY: d is a valid ordinal.
            self.check("hipSetDevice", unsafe { (self.api.hipSetDevice)(d) })?;
        }
        Ok(d)
    }

    fn attr(&self, d: c_int, a: c_uint) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: v is a valid out-pointer.
        self.check("hipDeviceGetAttribute", unsafe { (self.api.hipDeviceGetAttribute)(&mut v, a, d) })?;
        Ok(v)
    }

    fn props(&self, dev: Device) -> Result<DeviceProperties> {
        let d = self.ordinal(dev)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 chars and its length is passed.
        self.check("hipDeviceGetName", unsafe { (self.api.hipDeviceGetName)(name.as_mut_ptr(), 256, d) })?;
        let mut bus = [0 as c_char; 64];
        // SAFETY: as above, 64 chars.
        self.check("hipDeviceGetPCIBusId", unsafe { (self.api.hipDeviceGetPCIBusId)(bus.as_mut_ptr(), 64, d) })?;
        let pci_bus_id: PciBusId = cstr_buf(&bus).parse()?;
        let mut total: usize = 0;
        // SAFETY: total is a valid out-pointer.
        self.check("hipDeviceTotalMem", unsafe { (self.api.hipDeviceTotalMem)(&mut total, d) })?;
        let opt = |a: c_uint| self.attr(d, a).unwrap_or(0);
        let vmm = opt(h::hipDeviceAttribute_t_hipDeviceAttributeVirtualMemoryManagementSupported) != 0;
        let numa_node = numa_node_from_sysfs(Path::new("/sys"), &pci_bus_id)
            .or_else(|| self.attr(d, h::hipDeviceAttribute_t_hipDeviceAttributeHostNumaId).ok().and_then(|v| u32::try_from(v).ok()));
        Ok(DeviceProperties {
            device: dev,
            name: cstr_buf(&name),
            pci_bus_id,
            numa_node,
            total_memory: total as u64,
            compute_capability: (
                self.attr(d, h::hipDeviceAttribute_t_hipDeviceAttributeComputeCapabilityMajor)? as u32,
                self.attr(d, h::hipDeviceAttribute_t_hipDeviceAttributeComputeCapabilityMinor)? as u32,
            ),
            multiprocessors: self.attr(d, h::hipDeviceAttribute_t_hipDeviceAttributeMultiprocessorCount)? as u32,
            max_shared_memory_per_block_optin: opt(h::hipDeviceAttribute_t_hipDeviceAttributeSharedMemPerBlockOptin) as u32,
            capabilities: Capabilities {
                unified_addressing: opt(h::hipDeviceAttribute_t_hipDeviceAttributeUnifiedAddressing) != 0,
                vmm,
                // HIP on Linux exports VMM allocations as POSIX FDs wherever it has VMM.
                posix_fd_handles: vmm,
                // No HIP attribute reports FABRIC support.
                fabric_handles: false,
                dmabuf: self.api.hipMemGetHandleForAddressRange.is_some(),
                // No HIP attribute reports GPUDirect RDMA.
                gpu_direct_rdma: false,
                gpu_direct_rdma_vmm: false,
                stream_mem_ops: opt(h::hipDeviceAttribute_t_hipDeviceAttributeCanUseStreamWaitValue) != 0,
            },
        })
    }
}
