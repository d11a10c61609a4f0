//! `RawDriver` for HIP: each method makes the device current, makes one or a few runtime calls
//! and checks every return code. Compile-checked only (no AMD GPU here).

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cubecl_hip_sys as h;

use super::HipRuntime;
use crate::error::{GpuError, Result};
use crate::handles::{HandleKinds, ShareableKind};
use crate::module::ModuleImage;
use crate::runtime::{RawDriver, RawExport, RawImport};
use crate::types::{Device, DeviceProperties, LaunchConfig, MemInfo, RuntimeKind, StreamWrite, WaitCondition};

fn ptr<T>(v: u64) -> *mut T {
    v as usize as *mut T
}

fn int<T>(p: *mut T) -> u64 {
    p as usize as u64
}

const NOT_READY: c_uint = 600;
const PEER_ACCESS_ALREADY_ENABLED: c_uint = 704;
/// `hipHostMallocPortable`: pinned for every device, not only the current one.
const HOST_MALLOC_PORTABLE: c_uint = 0x1;
/// `hipHostMallocMapped`: also mapped into the device address space.
const HOST_MALLOC_MAPPED: c_uint = 0x2;
const H2D: c_uint = 1;
const D2H: c_uint = 2;
const D2D: c_uint = 3;
/// Largest LDS allocation per workgroup on current AMD GPUs; needs no opt-in.
const AMD_LDS_BYTES: u32 = 64 * 1024;

fn hip_prop(d: c_int, kinds: HandleKinds, gpu_direct_rdma: bool) -> h::hipMemAllocationProp {
    // SAFETY: the struct is plain integers, a union of integers and a pointer: all-zero is valid.
    let mut p: h::hipMemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = h::hipMemAllocationType_hipMemAllocationTypePinned;
    p.__bindgen_anon_1.requestedHandleTypes = kinds.mask();
    p.location.type_ = h::hipMemLocationType_hipMemLocationTypeDevice;
    p.location.id = d;
    p.allocFlags.gpuDirectRDMACapable = u8::from(gpu_direct_rdma);
    p
}

fn aligned_copy(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8) + 1];
    // SAFETY: v has at least bytes.len() bytes of storage; the regions do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len()) };
    v
}

impl RawDriver for HipRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Hip
    }

    fn library(&self) -> &str {
        &self.library
    }

    fn driver_version(&self) -> Result<u32> {
        let mut v: c_int = 0;
        // SAFETY: v is a valid out-pointer.
        self.check("hipDriverGetVersion", unsafe { (self.api.hipDriverGetVersion)(&mut v) })?;
        Ok(v as u32)
    }

    fn device_count(&self) -> Result<u32> {
        Ok(self.device_count)
    }

    fn bind(&self, dev: Device) -> Result<()> {
        self.set(dev).map(|_| ())
    }

    fn properties(&self, dev: Device) -> Result<DeviceProperties> {
        self.props(dev)
    }

    fn mem_info(&self, dev: Device) -> Result<MemInfo> {
        self.set(dev)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        self.check("hipMemGetInfo", unsafe { (self.api.hipMemGetInfo)(&mut free, &mut total) })?;
        Ok(MemInfo { free: free as u64, total: total as u64 })
    }

    fn can_access_peer(&self, dev: Device, peer: Device) -> Result<bool> {
        let (a, b) = (self.ordinal(dev)?, self.ordinal(peer)?);
        let mut v: c_int = 0;
        // SAFETY: v is a valid out-pointer.
        self.check("hipDeviceCanAccessPeer", unsafe { (self.api.hipDeviceCanAccessPeer)(&mut v, a, b) })?;
        Ok(v != 0)
    }

    fn enable_peer_access(&self, dev: Device, peer: Device) -> Result<()> {
        let p = self.ordinal(peer)?;
        self.set(dev)?;
        // SAFETY: p is a valid ordinal; dev is current.
        let code = unsafe { (self.api.hipDeviceEnablePeerAccess)(p, 0) };
        if code == PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        self.check("hipDeviceEnablePeerAccess", code)
    }

    fn mem_alloc(&self, dev: Device, len: usize) -> Result<u64> {
        self.set(dev)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: p is a valid out-pointer.
        self.check("hipMalloc", unsafe { (self.api.hipMalloc)(&mut p, len) })?;
        Ok(int(p))
    }

    unsafe fn mem_free(&self, dev: Device, p: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live allocation, freed once.
        self.check("hipFree", unsafe { (self.api.hipFree)(ptr(p)) })
    }

    fn host_alloc(&self, dev: Device, len: usize, mapped: bool) -> Result<u64> {
        self.set(dev)?;
        let flags = if mapped { HOST_MALLOC_PORTABLE | HOST_MALLOC_MAPPED } else { HOST_MALLOC_PORTABLE };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: p is a valid out-pointer.
        self.check("hipHostMalloc", unsafe { (self.api.hipHostMalloc)(&mut p, len, flags) })?;
        Ok(int(p))
    }

    unsafe fn host_device_ptr(&self, dev: Device, host: u64) -> Result<u64> {
        self.set(dev)?;
        let mut d: *mut c_void = std::ptr::null_mut();
        // SAFETY: d is a valid out-pointer; the runtime validates host (a mapped block of this
        // runtime, by the caller's contract); flags must be 0.
        self.check("hipHostGetDevicePointer", unsafe { (self.api.hipHostGetDevicePointer)(&mut d, ptr(host), 0) })?;
        Ok(int(d))
    }

    unsafe fn host_free(&self, dev: Device, p: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live pinned allocation of this runtime, freed once.
        self.check("hipHostFree", unsafe { (self.api.hipHostFree)(ptr(p)) })
    }

    unsafe fn address_range(&self, dev: Device, p: u64) -> Result<(u64, u64)> {
        self.set(dev)?;
        let (mut base, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: valid out-pointers; the runtime validates p.
        self.check("hipMemGetAddressRange", unsafe { (self.api.hipMemGetAddressRange)(&mut base, &mut size, ptr(p)) })?;
        Ok((int(base), size as u64))
    }

    unsafe fn copy_htod(&self, dev: Device, dst: u64, src: *const u8, len: usize, stream: Option<u64>) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller guarantees both ranges.
        match stream {
            None => self.check("hipMemcpy", unsafe { (self.api.hipMemcpy)(ptr(dst), src.cast(), len, H2D) }),
            Some(s) => self.check("hipMemcpyAsync", unsafe { (self.api.hipMemcpyAsync)(ptr(dst), src.cast(), len, H2D, ptr(s)) }),
        }
    }

    unsafe fn copy_dtoh(&self, dev: Device, dst: *mut u8, src: u64, len: usize, stream: Option<u64>) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller guarantees both ranges.
        match stream {
            None => self.check("hipMemcpy", unsafe { (self.api.hipMemcpy)(dst.cast(), ptr(src), len, D2H) }),
            Some(s) => self.check("hipMemcpyAsync", unsafe { (self.api.hipMemcpyAsync)(dst.cast(), ptr(src), len, D2H, ptr(s)) }),
        }
    }

    unsafe fn copy_dtod(
        &self,
        dst_dev: Device,
        dst: u64,
        src_dev: Device,
        src: u64,
        len: usize,
        stream: Option<(Device, u64)>,
    ) -> Result<()> {
        let a = self.api;
        let (dd, sd) = (self.ordinal(dst_dev)?, self.ordinal(src_dev)?);
        // SAFETY (all calls below): caller guarantees both ranges and the stream are live.
        match stream {
            Some((sdev, s)) => {
                self.set(sdev)?;
                if dst_dev == src_dev {
                    self.check("hipMemcpyAsync", unsafe { (a.hipMemcpyAsync)(ptr(dst), ptr(src), len, D2D, ptr(s)) })
                } else {
                    self.check("hipMemcpyPeerAsync", unsafe { (a.hipMemcpyPeerAsync)(ptr(dst), dd, ptr(src), sd, len, ptr(s)) })
                }
            }
            None => {
                self.set(dst_dev)?;
                if dst_dev == src_dev {
                    self.check("hipMemcpy", unsafe { (a.hipMemcpy)(ptr(dst), ptr(src), len, D2D) })?;
                } else {
                    self.check("hipMemcpyPeer", unsafe { (a.hipMemcpyPeer)(ptr(dst), dd, ptr(src), sd, len) })?;
                }
                self.check("hipStreamSynchronize", unsafe { (a.hipStreamSynchronize)(std::ptr::null_mut()) })
            }
        }
    }

    unsafe fn memset(&self, dev: Device, dst: u64, byte: u8, len: usize, stream: Option<u64>) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller guarantees the range and the stream.
        match stream {
            Some(s) => self.check("hipMemsetD8Async", unsafe { (self.api.hipMemsetD8Async)(ptr(dst), byte, len, ptr(s)) }),
            None => {
                self.check("hipMemsetD8", unsafe { (self.api.hipMemsetD8)(ptr(dst), byte, len) })?;
                self.check("hipStreamSynchronize", unsafe { (self.api.hipStreamSynchronize)(std::ptr::null_mut()) })
            }
        }
    }

    fn stream_create(&self, dev: Device) -> Result<u64> {
        self.set(dev)?;
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: s is a valid out-pointer.
        self.check("hipStreamCreateWithFlags", unsafe { (self.api.hipStreamCreateWithFlags)(&mut s, h::hipStreamNonBlocking) })?;
        Ok(int(s))
    }

    unsafe fn stream_destroy(&self, dev: Device, s: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live stream, destroyed once.
        self.check("hipStreamDestroy", unsafe { (self.api.hipStreamDestroy)(ptr(s)) })
    }

    unsafe fn stream_synchronize(&self, dev: Device, s: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live stream.
        self.check("hipStreamSynchronize", unsafe { (self.api.hipStreamSynchronize)(ptr(s)) })
    }

    unsafe fn stream_query(&self, dev: Device, s: u64) -> Result<bool> {
        self.set(dev)?;
        // SAFETY: caller passes a live stream.
        match unsafe { (self.api.hipStreamQuery)(ptr(s)) } {
            0 => Ok(true),
            NOT_READY => Ok(false),
            code => self.check("hipStreamQuery", code).map(|_| false),
        }
    }

    unsafe fn stream_wait_event(&self, dev: Device, s: u64, e: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live stream and event.
        self.check("hipStreamWaitEvent", unsafe { (self.api.hipStreamWaitEvent)(ptr(s), ptr(e), 0) })
    }

    unsafe fn stream_write_value32(&self, dev: Device, s: u64, addr: u64, value: u32) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live stream and an aligned device word.
        self.check("hipStreamWriteValue32", unsafe { (self.api.hipStreamWriteValue32)(ptr(s), ptr(addr), value, 0) })
    }

    unsafe fn stream_wait_value32(&self, dev: Device, s: u64, addr: u64, value: u32, cond: WaitCondition) -> Result<()> {
        self.set(dev)?;
        // SAFETY: as above; the mask keeps every bit.
        self.check("hipStreamWaitValue32", unsafe { (self.api.hipStreamWaitValue32)(ptr(s), ptr(addr), value, cond.flag(), u32::MAX) })
    }

    unsafe fn stream_write_values(&self, dev: Device, s: u64, writes: &[StreamWrite]) -> Result<()> {
        crate::types::check_write_count(writes.len())?;
        self.set(dev)?;
        // One call per word (hipStreamBatchMemOp is beta; never run on an AMD GPU here).
        for w in writes {
            // SAFETY: caller passes a live stream and aligned device words.
            match *w {
                StreamWrite::U32 { addr, value } => {
                    self.check("hipStreamWriteValue32", unsafe { (self.api.hipStreamWriteValue32)(ptr(s), ptr(addr), value, 0) })?
                }
                StreamWrite::U64 { addr, value } => {
                    self.check("hipStreamWriteValue64", unsafe { (self.api.hipStreamWriteValue64)(ptr(s), ptr(addr), value, 0) })?
                }
            }
        }
        Ok(())
    }

    fn event_create(&self, dev: Device, timing: bool) -> Result<u64> {
        self.set(dev)?;
        let flags = if timing { 0 } else { h::hipEventDisableTiming };
        let mut e: *mut c_void = std::ptr::null_mut();
        // SAFETY: e is a valid out-pointer.
        self.check("hipEventCreateWithFlags", unsafe { (self.api.hipEventCreateWithFlags)(&mut e, flags) })?;
        Ok(int(e))
    }

    unsafe fn event_destroy(&self, dev: Device, e: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live event, destroyed once.
        self.check("hipEventDestroy", unsafe { (self.api.hipEventDestroy)(ptr(e)) })
    }

    unsafe fn event_record(&self, dev: Device, e: u64, s: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live event and stream.
        self.check("hipEventRecord", unsafe { (self.api.hipEventRecord)(ptr(e), ptr(s)) })
    }

    unsafe fn event_synchronize(&self, dev: Device, e: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live event.
        self.check("hipEventSynchronize", unsafe { (self.api.hipEventSynchronize)(ptr(e)) })
    }

    unsafe fn event_query(&self, dev: Device, e: u64) -> Result<bool> {
        self.set(dev)?;
        // SAFETY: caller passes a live event.
        match unsafe { (self.api.hipEventQuery)(ptr(e)) } {
            0 => Ok(true),
            NOT_READY => Ok(false),
            code => self.check("hipEventQuery", code).map(|_| false),
        }
    }

    unsafe fn event_elapsed_ms(&self, dev: Device, start: u64, end: u64) -> Result<f32> {
        self.set(dev)?;
        let mut ms = 0f32;
        // SAFETY: ms is a valid out-pointer; caller passes live events.
        self.check("hipEventElapsedTime", unsafe { (self.api.hipEventElapsedTime)(&mut ms, ptr(start), ptr(end)) })?;
        Ok(ms)
    }

    unsafe fn ipc_get_handle(&self, dev: Device, base: u64) -> Result<[u8; 64]> {
        self.set(dev)?;
        let mut hd = h::hipIpcMemHandle_t { reserved: [0; 64] };
        // SAFETY: hd is a valid out-pointer; caller passes the base of a live hipMalloc allocation.
        self.check("hipIpcGetMemHandle", unsafe { (self.api.hipIpcGetMemHandle)(&mut hd, ptr(base)) })?;
        Ok(hd.reserved.map(|c| c as u8))
    }

    fn ipc_open(&self, dev: Device, handle: &[u8; 64], exporter_pid: u32) -> Result<u64> {
        self.set(dev)?;
        let hd = h::hipIpcMemHandle_t { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: p is a valid out-pointer; the handle is passed by value and validated by the runtime.
        let code = unsafe { (self.api.hipIpcOpenMemHandle)(&mut p, hd, h::hipIpcMemLazyEnablePeerAccess) };
        self.check_hint("hipIpcOpenMemHandle", code, |_| {
            (exporter_pid == std::process::id())
                .then(|| "the handle was exported by this same process; IPC handles open in another process".into())
        })?;
        Ok(int(p))
    }

    unsafe fn ipc_close(&self, dev: Device, p: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a pointer from ipc_open, closed once.
        self.check("hipIpcCloseMemHandle", unsafe { (self.api.hipIpcCloseMemHandle)(ptr(p)) })
    }

    fn vmm_granularity(&self, dev: Device, kinds: HandleKinds) -> Result<usize> {
        let d = self.set(dev)?;
        let prop = hip_prop(d, kinds, false);
        let mut g: usize = 0;
        let opt = h::hipMemAllocationGranularity_flags_hipMemAllocationGranularityMinimum;
        // SAFETY: valid pointers.
        self.check("hipMemGetAllocationGranularity", unsafe { (self.api.hipMemGetAllocationGranularity)(&mut g, &prop, opt) })?;
        if g == 0 {
            return Err(GpuError::invalid("the runtime reported a VMM granularity of 0"));
        }
        Ok(g)
    }

    fn vmm_create(&self, dev: Device, size: usize, kinds: HandleKinds, gpu_direct_rdma: bool) -> Result<u64> {
        let d = self.set(dev)?;
        let prop = hip_prop(d, kinds, gpu_direct_rdma);
        let mut hd: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid pointers.
        self.check("hipMemCreate", unsafe { (self.api.hipMemCreate)(&mut hd, size, &prop, 0) })?;
        Ok(int(hd))
    }

    unsafe fn vmm_release(&self, dev: Device, handle: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live handle, released once.
        self.check("hipMemRelease", unsafe { (self.api.hipMemRelease)(ptr(handle)) })
    }

    fn vmm_reserve(&self, dev: Device, size: usize, align: usize) -> Result<u64> {
        self.set(dev)?;
        let mut va: *mut c_void = std::ptr::null_mut();
        // SAFETY: va is a valid out-pointer.
        self.check("hipMemAddressReserve", unsafe { (self.api.hipMemAddressReserve)(&mut va, size, align, std::ptr::null_mut(), 0) })?;
        Ok(int(va))
    }

    unsafe fn vmm_free_va(&self, dev: Device, va: u64, size: usize) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a reserved range, freed once.
        self.check("hipMemAddressFree", unsafe { (self.api.hipMemAddressFree)(ptr(va), size) })
    }

    unsafe fn vmm_map(&self, dev: Device, va: u64, size: usize, handle: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a reserved range and a live handle.
        self.check("hipMemMap", unsafe { (self.api.hipMemMap)(ptr(va), size, 0, ptr(handle), 0) })
    }

    unsafe fn vmm_unmap(&self, dev: Device, va: u64, size: usize) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a mapped range, unmapped once.
        self.check("hipMemUnmap", unsafe { (self.api.hipMemUnmap)(ptr(va), size) })
    }

    unsafe fn vmm_set_access(&self, dev: Device, va: u64, size: usize) -> Result<()> {
        let d = self.set(dev)?;
        // SAFETY: plain integers: all-zero is valid.
        let mut desc: h::hipMemAccessDesc = unsafe { std::mem::zeroed() };
        desc.location.type_ = h::hipMemLocationType_hipMemLocationTypeDevice;
        desc.location.id = d;
        desc.flags = h::hipMemAccessFlags_hipMemAccessFlagsProtReadWrite;
        // SAFETY: one valid descriptor; caller passes a mapped range.
        self.check("hipMemSetAccess", unsafe { (self.api.hipMemSetAccess)(ptr(va), size, &desc, 1) })
    }

    unsafe fn vmm_export(&self, dev: Device, handle: u64, kind: ShareableKind) -> Result<RawExport> {
        self.set(dev)?;
        let ty = kind.vendor_value();
        match kind {
            ShareableKind::PosixFd => {
                let mut fd: c_int = -1;
                // SAFETY: for POSIX_FD the runtime writes an int through the pointer.
                let code = unsafe { (self.api.hipMemExportToShareableHandle)((&mut fd as *mut c_int).cast(), ptr(handle), ty, 0) };
                self.check("hipMemExportToShareableHandle", code)?;
                if fd < 0 {
                    return Err(GpuError::invalid(format!("hipMemExportToShareableHandle returned fd {fd}")));
                }
                // SAFETY: the runtime created fd for us; nothing else owns it.
                Ok(RawExport::Fd(unsafe { OwnedFd::from_raw_fd(fd) }))
            }
            ShareableKind::Fabric => {
                let mut raw = [0u8; 64];
                // SAFETY: for FABRIC the runtime writes a 64-byte handle through the pointer.
                let code = unsafe { (self.api.hipMemExportToShareableHandle)(raw.as_mut_ptr().cast(), ptr(handle), ty, 0) };
                self.check("hipMemExportToShareableHandle", code)?;
                Ok(RawExport::Fabric(raw))
            }
        }
    }

    fn vmm_import(&self, dev: Device, handle: RawImport<'_>) -> Result<u64> {
        self.set(dev)?;
        let mut hd: *mut c_void = std::ptr::null_mut();
        let code = match handle {
            RawImport::Fd(fd) => {
                // SAFETY: for POSIX_FD the OS handle is the descriptor value itself (as in
                // CUDA); the runtime does not take ownership of it.
                unsafe {
                    (self.api.hipMemImportFromShareableHandle)(
                        &mut hd,
                        fd.as_raw_fd() as usize as *mut c_void,
                        ShareableKind::PosixFd.vendor_value(),
                    )
                }
            }
            RawImport::Fabric(bytes) => {
                let mut raw = *bytes;
                // SAFETY: for FABRIC the OS handle points to the 64 handle bytes.
                unsafe {
                    (self.api.hipMemImportFromShareableHandle)(&mut hd, raw.as_mut_ptr().cast(), ShareableKind::Fabric.vendor_value())
                }
            }
        };
        self.check("hipMemImportFromShareableHandle", code)?;
        Ok(int(hd))
    }

    unsafe fn dmabuf_export(&self, dev: Device, start: u64, len: u64) -> Result<OwnedFd> {
        self.set(dev)?;
        let f = self.api.hipMemGetHandleForAddressRange.ok_or(GpuError::Unsupported {
            runtime: RuntimeKind::Hip,
            what: "dmabuf export",
            why: "this libamdhip64 has no hipMemGetHandleForAddressRange (ROCm too old)".into(),
        })?;
        let mut fd: c_int = -1;
        // SAFETY: for DMA_BUF_FD the runtime writes an int; caller passes a page-aligned range
        // inside a live allocation.
        let code = unsafe {
            f((&mut fd as *mut c_int).cast(), ptr(start), len as usize, h::hipMemRangeHandleType_hipMemRangeHandleTypeDmaBufFd, 0)
        };
        self.check("hipMemGetHandleForAddressRange", code)?;
        if fd < 0 {
            return Err(GpuError::invalid(format!("hipMemGetHandleForAddressRange returned fd {fd}")));
        }
        // SAFETY: the runtime created fd for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn module_load(&self, dev: Device, image: &ModuleImage<'_>) -> Result<u64> {
        self.set(dev)?;
        let ModuleImage::HipCodeObject(bytes) = image else {
            return Err(GpuError::Unsupported { runtime: RuntimeKind::Hip, what: "loading non-AMD code", why: "".into() });
        };
        let bin = aligned_copy(bytes);
        let mut m: *mut c_void = std::ptr::null_mut();
        // SAFETY: bin holds a validated code object that outlives the call.
        self.check("hipModuleLoadData", unsafe { (self.api.hipModuleLoadData)(&mut m, bin.as_ptr().cast()) })?;
        Ok(int(m))
    }

    unsafe fn module_unload(&self, dev: Device, module: u64) -> Result<()> {
        self.set(dev)?;
        // SAFETY: caller passes a live module, unloaded once.
        self.check("hipModuleUnload", unsafe { (self.api.hipModuleUnload)(ptr(module)) })
    }

    unsafe fn module_function(&self, dev: Device, module: u64, name: &CStr) -> Result<u64> {
        self.set(dev)?;
        let mut f: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer, NUL-terminated name, live module.
        let code = unsafe { (self.api.hipModuleGetFunction)(&mut f, ptr(module), name.as_ptr()) };
        self.check_hint("hipModuleGetFunction", code, |c| {
            (c == 500).then(|| format!("no kernel named {:?} in the module (extern \"C\"?)", name).into())
        })?;
        Ok(int(f))
    }

    unsafe fn function_set_max_dynamic_shared(&self, _dev: Device, _func: u64, bytes: u32) -> Result<()> {
        if bytes <= AMD_LDS_BYTES {
            return Ok(());
        }
        Err(GpuError::Unsupported {
            runtime: RuntimeKind::Hip,
            what: "dynamic shared memory above 64 KiB",
            why: format!("{bytes} bytes requested; AMD GPUs have 64 KiB of LDS per workgroup").into(),
        })
    }

    // AMD GPUs keep LDS apart from the L1 cache: there is no split to prefer.
    unsafe fn function_set_shared_carveout(&self, _dev: Device, _func: u64, _percent: i32) -> Result<()> {
        Ok(())
    }

    unsafe fn launch(&self, dev: Device, func: u64, cfg: &LaunchConfig, stream: u64, params: *mut *mut c_void) -> Result<()> {
        self.set(dev)?;
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: caller guarantees params, function and stream.
        let code = unsafe {
            (self.api.hipModuleLaunchKernel)(
                ptr(func),
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                cfg.shared_mem_bytes,
                ptr(stream),
                params,
                std::ptr::null_mut(),
            )
        };
        self.check("hipModuleLaunchKernel", code)
    }
}

#[cfg(test)]
mod tests {
    use super::super::call_error;

    #[test]
    fn hip_codes_format_without_a_runtime() {
        assert_eq!(call_error(None, "hipMalloc", 2, None).to_string(), "hipMalloc failed: hipErrorOutOfMemory (2)");
        assert_eq!(call_error(None, "hipFree", 99_999, None).to_string(), "hipFree failed: hipErrorUnrecognized (99999)");
    }
}
