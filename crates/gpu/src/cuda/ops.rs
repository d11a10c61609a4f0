//! `RawDriver` for CUDA: each method binds the device's context, makes one or a few driver
//! calls and checks every return code.

use std::borrow::Cow;
use std::ffi::{c_int, c_uint, c_void, CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cudarc::driver::sys as cu;

use super::ffi::Dptr;
use super::CudaRuntime;
use crate::error::{GpuError, Result, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED};
use crate::handles::{HandleKinds, ShareableKind};
use crate::module::ModuleImage;
use crate::runtime::{RawDriver, RawExport, RawImport};
use crate::types::{Device, DeviceProperties, LaunchConfig, MemInfo, RuntimeKind, StreamWrite, WaitCondition};

fn ptr<T>(h: u64) -> *mut T {
    h as usize as *mut T
}

fn int<T>(p: *mut T) -> u64 {
    p as usize as u64
}

const NOT_READY: c_uint = 600;
const PEER_ACCESS_ALREADY_ENABLED: c_uint = 704;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the allocating one.
const MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: also mapped into the device address space.
const MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;

fn imex_hint(code: c_uint) -> Option<Cow<'static, str>> {
    match code {
        CUDA_ERROR_NOT_PERMITTED => Some(
            "FABRIC handles need an IMEX channel (the nvidia-imex service running and \
             /dev/nvidia-caps-imex-channels/channel0 accessible to this process); within one node use POSIX_FD"
                .into(),
        ),
        CUDA_ERROR_NOT_SUPPORTED | 1 => Some("FABRIC handles are not supported by this device or driver".into()),
        _ => None,
    }
}

fn cuda_prop(d: cu::CUdevice, kinds: HandleKinds, gpu_direct_rdma: bool) -> cu::CUmemAllocationProp {
    cu::CUmemAllocationProp {
        type_: cu::CUmemAllocationType_enum::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: cu::CUmemAllocationHandleType_enum(kinds.mask()),
        location: cu::CUmemLocation { type_: cu::CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE, id: d },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: u8::from(gpu_direct_rdma),
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// A copy of a binary image in 8-byte aligned storage (the driver reads fatbins as words).
fn aligned_copy(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8) + 1];
    // SAFETY: v has at least bytes.len() bytes of storage; the regions do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len()) };
    v
}

impl RawDriver for CudaRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Cuda
    }

    fn library(&self) -> &str {
        &self.library
    }

    fn driver_version(&self) -> Result<u32> {
        let mut v: c_int = 0;
        // SAFETY: v is a valid out-pointer.
        self.check("cuDriverGetVersion", unsafe { (self.api.cuDriverGetVersion)(&mut v) })?;
        Ok(v as u32)
    }

    fn device_count(&self) -> Result<u32> {
        Ok(self.device_count)
    }

    fn bind(&self, dev: Device) -> Result<()> {
        self.bind_ctx(dev).map(|_| ())
    }

    fn properties(&self, dev: Device) -> Result<DeviceProperties> {
        self.props(dev)
    }

    fn mem_info(&self, dev: Device) -> Result<MemInfo> {
        self.bind_ctx(dev)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; a context is current.
        self.check("cuMemGetInfo_v2", unsafe { (self.api.cuMemGetInfo_v2)(&mut free, &mut total) })?;
        Ok(MemInfo { free: free as u64, total: total as u64 })
    }

    fn can_access_peer(&self, dev: Device, peer: Device) -> Result<bool> {
        let (a, b) = (self.cudev(dev)?, self.cudev(peer)?);
        let mut v: c_int = 0;
        // SAFETY: v is a valid out-pointer; both devices exist.
        self.check("cuDeviceCanAccessPeer", unsafe { (self.api.cuDeviceCanAccessPeer)(&mut v, a, b) })?;
        Ok(v != 0)
    }

    fn enable_peer_access(&self, dev: Device, peer: Device) -> Result<()> {
        let peer_ctx = self.context(peer)?;
        self.bind_ctx(dev)?;
        // SAFETY: both contexts are retained; dev's is current.
        let code = unsafe { (self.api.cuCtxEnablePeerAccess)(peer_ctx, 0) };
        if code == PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        self.check_hint("cuCtxEnablePeerAccess", code, |c| (c == 217).then(|| format!("{dev} cannot access {peer} peer-to-peer").into()))
    }

    fn mem_alloc(&self, dev: Device, len: usize) -> Result<u64> {
        self.bind_ctx(dev)?;
        let mut p: Dptr = 0;
        // SAFETY: p is a valid out-pointer; a context is current.
        self.check("cuMemAlloc_v2", unsafe { (self.api.cuMemAlloc_v2)(&mut p, len) })?;
        Ok(p)
    }

    unsafe fn mem_free(&self, dev: Device, p: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live allocation of this runtime.
        self.check("cuMemFree_v2", unsafe { (self.api.cuMemFree_v2)(p) })
    }

    fn host_alloc(&self, dev: Device, len: usize, mapped: bool) -> Result<u64> {
        self.bind_ctx(dev)?;
        let flags = if mapped { MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP } else { MEMHOSTALLOC_PORTABLE };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: p is a valid out-pointer; a context is current.
        self.check("cuMemHostAlloc", unsafe { (self.api.cuMemHostAlloc)(&mut p, len, flags) })?;
        Ok(int(p))
    }

    unsafe fn host_device_ptr(&self, dev: Device, host: u64) -> Result<u64> {
        self.bind_ctx(dev)?;
        let mut d: Dptr = 0;
        // SAFETY: d is a valid out-pointer; the driver validates host (a mapped block of this
        // runtime, by the caller's contract); flags must be 0.
        self.check("cuMemHostGetDevicePointer_v2", unsafe { (self.api.cuMemHostGetDevicePointer_v2)(&mut d, ptr(host), 0) })?;
        Ok(d)
    }

    unsafe fn host_free(&self, dev: Device, p: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live pinned allocation of this runtime, freed once.
        self.check("cuMemFreeHost", unsafe { (self.api.cuMemFreeHost)(ptr(p)) })
    }

    unsafe fn address_range(&self, dev: Device, p: u64) -> Result<(u64, u64)> {
        self.bind_ctx(dev)?;
        let (mut base, mut size): (Dptr, usize) = (0, 0);
        // SAFETY: valid out-pointers; the driver validates p.
        self.check("cuMemGetAddressRange_v2", unsafe { (self.api.cuMemGetAddressRange_v2)(&mut base, &mut size, p) })?;
        Ok((base, size as u64))
    }

    unsafe fn copy_htod(&self, dev: Device, dst: u64, src: *const u8, len: usize, stream: Option<u64>) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller guarantees src..src+len is readable and dst..dst+len is device memory.
        match stream {
            None => self.check("cuMemcpyHtoD_v2", unsafe { (self.api.cuMemcpyHtoD_v2)(dst, src.cast(), len) }),
            Some(s) => self.check("cuMemcpyHtoDAsync_v2", unsafe { (self.api.cuMemcpyHtoDAsync_v2)(dst, src.cast(), len, ptr(s)) }),
        }
    }

    unsafe fn copy_dtoh(&self, dev: Device, dst: *mut u8, src: u64, len: usize, stream: Option<u64>) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller guarantees dst..dst+len is writable and src..src+len is device memory.
        match stream {
            None => self.check("cuMemcpyDtoH_v2", unsafe { (self.api.cuMemcpyDtoH_v2)(dst.cast(), src, len) }),
            Some(s) => self.check("cuMemcpyDtoHAsync_v2", unsafe { (self.api.cuMemcpyDtoHAsync_v2)(dst.cast(), src, len, ptr(s)) }),
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
        let a = &self.api;
        // SAFETY (all calls below): caller guarantees both ranges are device memory of len bytes
        // on their devices and the stream is live; the needed contexts are retained and current.
        match stream {
            Some((sdev, s)) if dst_dev == src_dev => {
                self.bind_ctx(sdev)?;
                self.check("cuMemcpyDtoDAsync_v2", unsafe { (a.cuMemcpyDtoDAsync_v2)(dst, src, len, ptr(s)) })
            }
            Some((sdev, s)) => {
                let (dc, sc) = (self.context(dst_dev)?, self.context(src_dev)?);
                self.bind_ctx(sdev)?;
                self.check("cuMemcpyPeerAsync", unsafe { (a.cuMemcpyPeerAsync)(dst, dc, src, sc, len, ptr(s)) })
            }
            None if dst_dev == src_dev => {
                self.bind_ctx(dst_dev)?;
                self.check("cuMemcpyDtoD_v2", unsafe { (a.cuMemcpyDtoD_v2)(dst, src, len) })?;
                // Device-to-device copies return before completion: wait for the null stream.
                self.check("cuStreamSynchronize", unsafe { (a.cuStreamSynchronize)(std::ptr::null_mut()) })
            }
            None => {
                let (dc, sc) = (self.context(dst_dev)?, self.context(src_dev)?);
                self.bind_ctx(dst_dev)?;
                self.check("cuMemcpyPeer", unsafe { (a.cuMemcpyPeer)(dst, dc, src, sc, len) })?;
                self.check("cuCtxSynchronize", unsafe { (a.cuCtxSynchronize)() })?;
                self.bind_ctx(src_dev)?;
                self.check("cuCtxSynchronize", unsafe { (a.cuCtxSynchronize)() })
            }
        }
    }

    unsafe fn memset(&self, dev: Device, dst: u64, byte: u8, len: usize, stream: Option<u64>) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller guarantees dst..dst+len is device memory; the stream (if any) is live.
        match stream {
            Some(s) => self.check("cuMemsetD8Async", unsafe { (self.api.cuMemsetD8Async)(dst, byte, len, ptr(s)) }),
            None => {
                self.check("cuMemsetD8_v2", unsafe { (self.api.cuMemsetD8_v2)(dst, byte, len) })?;
                // Memset of device memory returns before completion: wait for the null stream.
                self.check("cuStreamSynchronize", unsafe { (self.api.cuStreamSynchronize)(std::ptr::null_mut()) })
            }
        }
    }

    fn stream_create(&self, dev: Device) -> Result<u64> {
        self.bind_ctx(dev)?;
        let mut s: cu::CUstream = std::ptr::null_mut();
        let flags = cu::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as c_uint;
        // SAFETY: s is a valid out-pointer; a context is current.
        self.check("cuStreamCreate", unsafe { (self.api.cuStreamCreate)(&mut s, flags) })?;
        Ok(int(s))
    }

    unsafe fn stream_destroy(&self, dev: Device, s: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live stream, destroyed once.
        self.check("cuStreamDestroy_v2", unsafe { (self.api.cuStreamDestroy_v2)(ptr(s)) })
    }

    unsafe fn stream_synchronize(&self, dev: Device, s: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live stream.
        self.check("cuStreamSynchronize", unsafe { (self.api.cuStreamSynchronize)(ptr(s)) })
    }

    unsafe fn stream_query(&self, dev: Device, s: u64) -> Result<bool> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live stream.
        match unsafe { (self.api.cuStreamQuery)(ptr(s)) } {
            0 => Ok(true),
            NOT_READY => Ok(false),
            code => self.check("cuStreamQuery", code).map(|_| false),
        }
    }

    unsafe fn stream_wait_event(&self, dev: Device, s: u64, e: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live stream and event.
        self.check("cuStreamWaitEvent", unsafe { (self.api.cuStreamWaitEvent)(ptr(s), ptr(e), 0) })
    }

    unsafe fn stream_write_value32(&self, dev: Device, s: u64, addr: u64, value: u32) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live stream and a 4-byte aligned device word.
        self.check("cuStreamWriteValue32_v2", unsafe { (self.api.cuStreamWriteValue32_v2)(ptr(s), addr, value, 0) })
    }

    unsafe fn stream_wait_value32(&self, dev: Device, s: u64, addr: u64, value: u32, cond: WaitCondition) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: as in stream_write_value32.
        self.check("cuStreamWaitValue32_v2", unsafe { (self.api.cuStreamWaitValue32_v2)(ptr(s), addr, value, cond.flag()) })
    }

    unsafe fn stream_write_values(&self, dev: Device, s: u64, writes: &[StreamWrite]) -> Result<()> {
        super::super::types::check_write_count(writes.len())?;
        self.bind_ctx(dev)?;
        let mut ops = super::memops::batch_writes(writes);
        // SAFETY: caller passes a live stream and aligned device words; `ops` holds
        // `writes.len()` (below 256) CUstreamBatchMemOpParams of 48 bytes each.
        self.check("cuStreamBatchMemOp_v2", unsafe {
            (self.api.cuStreamBatchMemOp_v2)(ptr(s), ops.len() as c_uint, ops.as_mut_ptr() as *mut c_void, 0)
        })
    }

    fn event_create(&self, dev: Device, timing: bool) -> Result<u64> {
        self.bind_ctx(dev)?;
        let flags = if timing {
            cu::CUevent_flags_enum::CU_EVENT_DEFAULT as c_uint
        } else {
            cu::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as c_uint
        };
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: e is a valid out-pointer; a context is current.
        self.check("cuEventCreate", unsafe { (self.api.cuEventCreate)(&mut e, flags) })?;
        Ok(int(e))
    }

    unsafe fn event_destroy(&self, dev: Device, e: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live event, destroyed once.
        self.check("cuEventDestroy_v2", unsafe { (self.api.cuEventDestroy_v2)(ptr(e)) })
    }

    unsafe fn event_record(&self, dev: Device, e: u64, s: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live event and stream.
        self.check("cuEventRecord", unsafe { (self.api.cuEventRecord)(ptr(e), ptr(s)) })
    }

    unsafe fn event_synchronize(&self, dev: Device, e: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live event.
        self.check("cuEventSynchronize", unsafe { (self.api.cuEventSynchronize)(ptr(e)) })
    }

    unsafe fn event_query(&self, dev: Device, e: u64) -> Result<bool> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live event.
        match unsafe { (self.api.cuEventQuery)(ptr(e)) } {
            0 => Ok(true),
            NOT_READY => Ok(false),
            code => self.check("cuEventQuery", code).map(|_| false),
        }
    }

    unsafe fn event_elapsed_ms(&self, dev: Device, start: u64, end: u64) -> Result<f32> {
        self.bind_ctx(dev)?;
        let mut ms = 0f32;
        // SAFETY: ms is a valid out-pointer; caller passes live events.
        self.check("cuEventElapsedTime_v2", unsafe { (self.api.cuEventElapsedTime_v2)(&mut ms, ptr(start), ptr(end)) })?;
        Ok(ms)
    }

    unsafe fn ipc_get_handle(&self, dev: Device, base: u64) -> Result<[u8; 64]> {
        self.bind_ctx(dev)?;
        let mut h = cu::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: h is a valid out-pointer; caller passes the base of a live cuMemAlloc allocation.
        self.check_hint("cuIpcGetMemHandle", unsafe { (self.api.cuIpcGetMemHandle)(&mut h, base) }, |c| {
            (c == 1).then(|| "IPC handles exist only for cuMemAlloc memory (not VMM, not host memory)".into())
        })?;
        Ok(h.reserved.map(|c| c as u8))
    }

    fn ipc_open(&self, dev: Device, handle: &[u8; 64], exporter_pid: u32) -> Result<u64> {
        self.bind_ctx(dev)?;
        let h = cu::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let flags = cu::CUipcMem_flags_enum::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
        let mut p: Dptr = 0;
        // SAFETY: p is a valid out-pointer; the handle is passed by value and validated by the driver.
        let code = unsafe { (self.api.cuIpcOpenMemHandle_v2)(&mut p, h, flags) };
        self.check_hint("cuIpcOpenMemHandle_v2", code, |_| {
            (exporter_pid == std::process::id())
                .then(|| "the handle was exported by this same process; CUDA IPC handles open only in another process".into())
        })?;
        Ok(p)
    }

    unsafe fn ipc_close(&self, dev: Device, p: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a pointer returned by ipc_open, closed once.
        self.check("cuIpcCloseMemHandle", unsafe { (self.api.cuIpcCloseMemHandle)(p) })
    }

    fn vmm_granularity(&self, dev: Device, kinds: HandleKinds) -> Result<usize> {
        let d = self.cudev(dev)?;
        self.bind_ctx(dev)?;
        let prop = cuda_prop(d, kinds, false);
        let mut g: usize = 0;
        let opt = cu::CUmemAllocationGranularity_flags_enum::CU_MEM_ALLOC_GRANULARITY_MINIMUM as c_uint;
        // SAFETY: g and prop are valid pointers for the call.
        let code = unsafe { (self.api.cuMemGetAllocationGranularity)(&mut g, &prop, opt) };
        self.check_hint("cuMemGetAllocationGranularity", code, |c| if kinds.fabric { imex_hint(c) } else { None })?;
        if g == 0 {
            return Err(GpuError::invalid("the driver reported a VMM granularity of 0"));
        }
        Ok(g)
    }

    fn vmm_create(&self, dev: Device, size: usize, kinds: HandleKinds, gpu_direct_rdma: bool) -> Result<u64> {
        let d = self.cudev(dev)?;
        self.bind_ctx(dev)?;
        let prop = cuda_prop(d, kinds, gpu_direct_rdma);
        let mut h: u64 = 0;
        // SAFETY: h and prop are valid pointers for the call.
        let code = unsafe { (self.api.cuMemCreate)(&mut h, size, &prop, 0) };
        self.check_hint("cuMemCreate", code, |c| if kinds.fabric { imex_hint(c) } else { None })?;
        Ok(h)
    }

    unsafe fn vmm_release(&self, dev: Device, handle: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live allocation handle, released once.
        self.check("cuMemRelease", unsafe { (self.api.cuMemRelease)(handle) })
    }

    fn vmm_reserve(&self, dev: Device, size: usize, align: usize) -> Result<u64> {
        self.bind_ctx(dev)?;
        let mut va: Dptr = 0;
        // SAFETY: va is a valid out-pointer.
        self.check("cuMemAddressReserve", unsafe { (self.api.cuMemAddressReserve)(&mut va, size, align, 0, 0) })?;
        Ok(va)
    }

    unsafe fn vmm_free_va(&self, dev: Device, va: u64, size: usize) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a range from vmm_reserve, freed once.
        self.check("cuMemAddressFree", unsafe { (self.api.cuMemAddressFree)(va, size) })
    }

    unsafe fn vmm_map(&self, dev: Device, va: u64, size: usize, handle: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a reserved range and a live handle of at least size bytes.
        self.check("cuMemMap", unsafe { (self.api.cuMemMap)(va, size, 0, handle, 0) })
    }

    unsafe fn vmm_unmap(&self, dev: Device, va: u64, size: usize) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a mapped range, unmapped once.
        self.check("cuMemUnmap", unsafe { (self.api.cuMemUnmap)(va, size) })
    }

    unsafe fn vmm_set_access(&self, dev: Device, va: u64, size: usize) -> Result<()> {
        let d = self.cudev(dev)?;
        self.bind_ctx(dev)?;
        let desc = cu::CUmemAccessDesc {
            location: cu::CUmemLocation { type_: cu::CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE, id: d },
            flags: cu::CUmemAccess_flags_enum::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: desc is one valid descriptor; caller passes a mapped range.
        self.check("cuMemSetAccess", unsafe { (self.api.cuMemSetAccess)(va, size, &desc, 1) })
    }

    unsafe fn vmm_export(&self, dev: Device, handle: u64, kind: ShareableKind) -> Result<RawExport> {
        self.bind_ctx(dev)?;
        let ty = kind.vendor_value();
        match kind {
            ShareableKind::PosixFd => {
                let mut fd: c_int = -1;
                // SAFETY: for POSIX_FD the driver writes an int through the pointer.
                let code = unsafe { (self.api.cuMemExportToShareableHandle)((&mut fd as *mut c_int).cast(), handle, ty, 0) };
                self.check("cuMemExportToShareableHandle", code)?;
                if fd < 0 {
                    return Err(GpuError::invalid(format!("cuMemExportToShareableHandle returned fd {fd}")));
                }
                // SAFETY: the driver created fd for us; nothing else owns it.
                Ok(RawExport::Fd(unsafe { OwnedFd::from_raw_fd(fd) }))
            }
            ShareableKind::Fabric => {
                let mut fh = cu::CUmemFabricHandle { data: [0; 64] };
                // SAFETY: for FABRIC the driver writes a CUmemFabricHandle through the pointer.
                let code =
                    unsafe { (self.api.cuMemExportToShareableHandle)((&mut fh as *mut cu::CUmemFabricHandle).cast(), handle, ty, 0) };
                self.check_hint("cuMemExportToShareableHandle", code, imex_hint)?;
                Ok(RawExport::Fabric(fh.data))
            }
        }
    }

    fn vmm_import(&self, dev: Device, handle: RawImport<'_>) -> Result<u64> {
        self.bind_ctx(dev)?;
        let mut h: u64 = 0;
        let fabric = matches!(handle, RawImport::Fabric(_));
        let code = match handle {
            RawImport::Fd(fd) => {
                let os = fd.as_raw_fd() as usize as *mut c_void;
                // SAFETY: for POSIX_FD the OS handle is the descriptor value itself; the driver
                // does not take ownership of it.
                unsafe { (self.api.cuMemImportFromShareableHandle)(&mut h, os, ShareableKind::PosixFd.vendor_value()) }
            }
            RawImport::Fabric(bytes) => {
                let mut fh = cu::CUmemFabricHandle { data: *bytes };
                // SAFETY: for FABRIC the OS handle points to a CUmemFabricHandle.
                unsafe {
                    (self.api.cuMemImportFromShareableHandle)(
                        &mut h,
                        (&mut fh as *mut cu::CUmemFabricHandle).cast(),
                        ShareableKind::Fabric.vendor_value(),
                    )
                }
            }
        };
        self.check_hint("cuMemImportFromShareableHandle", code, |c| if fabric { imex_hint(c) } else { None })?;
        Ok(h)
    }

    unsafe fn dmabuf_export(&self, dev: Device, start: u64, len: u64) -> Result<OwnedFd> {
        self.bind_ctx(dev)?;
        let mut fd: c_int = -1;
        let ty = cu::CUmemRangeHandleType_enum::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD as c_uint;
        // SAFETY: for DMA_BUF_FD the driver writes an int; caller passes a page-aligned range
        // inside a live allocation.
        let code = unsafe { (self.api.cuMemGetHandleForAddressRange)((&mut fd as *mut c_int).cast(), start, len as usize, ty, 0) };
        self.check_hint("cuMemGetHandleForAddressRange", code, |c| {
            (c == CUDA_ERROR_NOT_SUPPORTED)
                .then(|| "dmabuf export needs the NVIDIA open kernel modules and a kernel with dmabuf (see the DMA_BUF capability)".into())
        })?;
        if fd < 0 {
            return Err(GpuError::invalid(format!("cuMemGetHandleForAddressRange returned fd {fd}")));
        }
        // SAFETY: the driver created fd for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn module_load(&self, dev: Device, image: &ModuleImage<'_>) -> Result<u64> {
        self.bind_ctx(dev)?;
        let ptx;
        let bin;
        let data: *const c_void = match image {
            ModuleImage::Ptx(text) => {
                ptx = CString::new(*text).map_err(|_| GpuError::invalid("PTX contains a NUL byte"))?;
                ptx.as_ptr().cast()
            }
            ModuleImage::Cubin(b) | ModuleImage::Fatbin(b) => {
                bin = aligned_copy(b);
                bin.as_ptr().cast()
            }
            ModuleImage::HipCodeObject(_) => {
                return Err(GpuError::Unsupported { runtime: RuntimeKind::Cuda, what: "loading AMD code objects", why: "".into() })
            }
        };
        let mut log = vec![0u8; 16 * 1024];
        let mut opts: [c_uint; 2] =
            [cu::CUjit_option_enum::CU_JIT_ERROR_LOG_BUFFER as c_uint, cu::CUjit_option_enum::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES as c_uint];
        let mut vals: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
        let mut m: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: data points to a NUL-terminated PTX string or a validated, 8-byte aligned
        // binary image that outlives the call; the option arrays hold 2 entries each, the log
        // buffer is as large as announced.
        let code = unsafe { (self.api.cuModuleLoadDataEx)(&mut m, data, 2, opts.as_mut_ptr(), vals.as_mut_ptr()) };
        self.check_hint("cuModuleLoadDataEx", code, |c| {
            let jit = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())]).trim().to_string();
            let what = match c {
                222 => "the PTX ISA version is newer than this driver accepts (build with the pinned nvcc)",
                209 => "no code for this GPU's architecture in the image",
                218 => "PTX JIT compilation failed",
                _ => "",
            };
            match (what.is_empty(), jit.is_empty()) {
                (true, true) => None,
                (false, true) => Some(what.into()),
                (true, false) => Some(format!("JIT log: {jit}").into()),
                (false, false) => Some(format!("{what}; JIT log: {jit}").into()),
            }
        })?;
        Ok(int(m))
    }

    unsafe fn module_unload(&self, dev: Device, module: u64) -> Result<()> {
        self.bind_ctx(dev)?;
        // SAFETY: caller passes a live module, unloaded once.
        self.check("cuModuleUnload", unsafe { (self.api.cuModuleUnload)(ptr(module)) })
    }

    unsafe fn module_function(&self, dev: Device, module: u64, name: &CStr) -> Result<u64> {
        self.bind_ctx(dev)?;
        let mut f: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: f is a valid out-pointer; name is NUL-terminated; caller passes a live module.
        let code = unsafe { (self.api.cuModuleGetFunction)(&mut f, ptr(module), name.as_ptr()) };
        self.check_hint("cuModuleGetFunction", code, |c| {
            (c == 500).then(|| format!("no kernel named {:?} in the module (extern \"C\"?)", name).into())
        })?;
        Ok(int(f))
    }

    unsafe fn function_set_max_dynamic_shared(&self, dev: Device, func: u64, bytes: u32) -> Result<()> {
        self.bind_ctx(dev)?;
        let attr = cu::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as c_uint;
        let v = c_int::try_from(bytes).map_err(|_| GpuError::invalid(format!("{bytes} bytes of shared memory")))?;
        // SAFETY: caller passes a live function.
        self.check("cuFuncSetAttribute", unsafe { (self.api.cuFuncSetAttribute)(ptr(func), attr, v) })
    }

    unsafe fn function_set_shared_carveout(&self, dev: Device, func: u64, percent: i32) -> Result<()> {
        self.bind_ctx(dev)?;
        let attr = cu::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT as c_uint;
        // SAFETY: caller passes a live function.
        self.check("cuFuncSetAttribute", unsafe { (self.api.cuFuncSetAttribute)(ptr(func), attr, percent) })
    }

    unsafe fn launch(&self, dev: Device, func: u64, cfg: &LaunchConfig, stream: u64, params: *mut *mut c_void) -> Result<()> {
        self.bind_ctx(dev)?;
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: caller guarantees params matches the kernel's parameters and that the function
        // and stream are live.
        let code = unsafe {
            (self.api.cuLaunchKernel)(
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
        self.check("cuLaunchKernel", code)
    }
}

#[cfg(test)]
mod tests {
    use super::super::call_error;
    use super::imex_hint;

    #[test]
    fn fabric_not_permitted_names_imex() {
        let e = call_error(None, "cuMemCreate", 800, imex_hint(800)).to_string();
        assert!(e.starts_with("cuMemCreate failed: CUDA_ERROR_NOT_PERMITTED (800): FABRIC handles need an IMEX channel"), "{e}");
        assert!(imex_hint(2).is_none());
    }

    #[test]
    fn unknown_codes_format_without_a_driver() {
        let e = call_error(None, "cuMemAlloc_v2", 123_456, None).to_string();
        assert_eq!(e, "cuMemAlloc_v2 failed: CUDA_ERROR_UNRECOGNIZED (123456)");
        let e = call_error(None, "cuMemAlloc_v2", 2, None).to_string();
        assert_eq!(e, "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)");
    }
}
