//! The `Runtime` trait (safe, object-safe, sealed) over a per-vendor raw layer, and detection.

use std::ffi::{c_void, CStr};
use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::error::{Attempt, GpuError, Result};
use crate::handles::{dmabuf_window, DmabufFd, HandleKinds, IpcHandle, ShareableHandle, ShareableKind, ShareableValue, VmmOptions};
use crate::memory::{DeviceBuffer, DeviceSlice, IpcMapping, PinnedBuffer, VmmAllocation};
use crate::module::{Function, Module, ModuleImage, ModuleInner};
use crate::stream::{Event, Stream};
use crate::types::{round_up, Device, DeviceProperties, LaunchConfig, MemInfo, RuntimeChoice, RuntimeKind, StreamWrite, WaitCondition};

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// An exported VMM handle as the raw layer returns it.
pub enum RawExport {
    /// POSIX file descriptor.
    Fd(OwnedFd),
    /// FABRIC handle bytes.
    Fabric([u8; 64]),
}

/// A shareable handle as the raw layer imports it.
pub enum RawImport<'a> {
    /// POSIX file descriptor (still owned by the caller).
    Fd(BorrowedFd<'a>),
    /// FABRIC handle bytes.
    Fabric(&'a [u8; 64]),
}

/// The vendor layer: thin, checked calls on raw handles (pointers and handles as integers).
/// Methods taking handles are `unsafe`: the handle must be live and belong to this runtime.
/// Every method that takes a device makes that device current on the calling thread first.
#[doc(hidden)]
#[allow(missing_docs, clippy::missing_safety_doc, clippy::too_many_arguments)]
pub trait RawDriver: Send + Sync {
    fn kind(&self) -> RuntimeKind;
    fn library(&self) -> &str;
    fn driver_version(&self) -> Result<u32>;
    fn device_count(&self) -> Result<u32>;
    fn bind(&self, dev: Device) -> Result<()>;
    fn properties(&self, dev: Device) -> Result<DeviceProperties>;
    fn mem_info(&self, dev: Device) -> Result<MemInfo>;
    fn can_access_peer(&self, dev: Device, peer: Device) -> Result<bool>;
    fn enable_peer_access(&self, dev: Device, peer: Device) -> Result<()>;

    fn mem_alloc(&self, dev: Device, len: usize) -> Result<u64>;
    unsafe fn mem_free(&self, dev: Device, ptr: u64) -> Result<()>;
    /// Page-locked host memory, portable (usable by copies on every device); its host address.
    /// `mapped`: also mapped into the device address space (CUDA `CU_MEMHOSTALLOC_DEVICEMAP`,
    /// HIP `hipHostMallocMapped`), so that [`RawDriver::host_device_ptr`] may be asked for it.
    fn host_alloc(&self, dev: Device, len: usize, mapped: bool) -> Result<u64>;
    /// The device address of `host`, a byte of a block from `host_alloc(.., mapped: true)`.
    unsafe fn host_device_ptr(&self, dev: Device, host: u64) -> Result<u64>;
    unsafe fn host_free(&self, dev: Device, ptr: u64) -> Result<()>;
    unsafe fn address_range(&self, dev: Device, ptr: u64) -> Result<(u64, u64)>;
    unsafe fn copy_htod(&self, dev: Device, dst: u64, src: *const u8, len: usize, stream: Option<u64>) -> Result<()>;
    unsafe fn copy_dtoh(&self, dev: Device, dst: *mut u8, src: u64, len: usize, stream: Option<u64>) -> Result<()>;
    unsafe fn copy_dtod(
        &self,
        dst_dev: Device,
        dst: u64,
        src_dev: Device,
        src: u64,
        len: usize,
        stream: Option<(Device, u64)>,
    ) -> Result<()>;
    unsafe fn memset(&self, dev: Device, dst: u64, byte: u8, len: usize, stream: Option<u64>) -> Result<()>;

    fn stream_create(&self, dev: Device) -> Result<u64>;
    unsafe fn stream_destroy(&self, dev: Device, s: u64) -> Result<()>;
    unsafe fn stream_synchronize(&self, dev: Device, s: u64) -> Result<()>;
    unsafe fn stream_query(&self, dev: Device, s: u64) -> Result<bool>;
    unsafe fn stream_wait_event(&self, dev: Device, s: u64, e: u64) -> Result<()>;
    unsafe fn stream_write_value32(&self, dev: Device, s: u64, addr: u64, value: u32) -> Result<()>;
    unsafe fn stream_wait_value32(&self, dev: Device, s: u64, addr: u64, value: u32, cond: WaitCondition) -> Result<()>;
    /// 1 to [`crate::STREAM_WRITES_MAX`] aligned words, in order (CUDA: one batch call).
    unsafe fn stream_write_values(&self, dev: Device, s: u64, writes: &[StreamWrite]) -> Result<()>;
    fn event_create(&self, dev: Device, timing: bool) -> Result<u64>;
    unsafe fn event_destroy(&self, dev: Device, e: u64) -> Result<()>;
    unsafe fn event_record(&self, dev: Device, e: u64, s: u64) -> Result<()>;
    unsafe fn event_synchronize(&self, dev: Device, e: u64) -> Result<()>;
    unsafe fn event_query(&self, dev: Device, e: u64) -> Result<bool>;
    unsafe fn event_elapsed_ms(&self, dev: Device, start: u64, end: u64) -> Result<f32>;

    unsafe fn ipc_get_handle(&self, dev: Device, base: u64) -> Result<[u8; 64]>;
    fn ipc_open(&self, dev: Device, handle: &[u8; 64], exporter_pid: u32) -> Result<u64>;
    unsafe fn ipc_close(&self, dev: Device, ptr: u64) -> Result<()>;

    fn vmm_granularity(&self, dev: Device, kinds: HandleKinds) -> Result<usize>;
    fn vmm_create(&self, dev: Device, size: usize, kinds: HandleKinds, gpu_direct_rdma: bool) -> Result<u64>;
    unsafe fn vmm_release(&self, dev: Device, handle: u64) -> Result<()>;
    fn vmm_reserve(&self, dev: Device, size: usize, align: usize) -> Result<u64>;
    unsafe fn vmm_free_va(&self, dev: Device, va: u64, size: usize) -> Result<()>;
    unsafe fn vmm_map(&self, dev: Device, va: u64, size: usize, handle: u64) -> Result<()>;
    unsafe fn vmm_unmap(&self, dev: Device, va: u64, size: usize) -> Result<()>;
    unsafe fn vmm_set_access(&self, dev: Device, va: u64, size: usize) -> Result<()>;
    unsafe fn vmm_export(&self, dev: Device, handle: u64, kind: ShareableKind) -> Result<RawExport>;
    fn vmm_import(&self, dev: Device, handle: RawImport<'_>) -> Result<u64>;

    unsafe fn dmabuf_export(&self, dev: Device, start: u64, len: u64) -> Result<OwnedFd>;

    fn module_load(&self, dev: Device, image: &ModuleImage<'_>) -> Result<u64>;
    unsafe fn module_unload(&self, dev: Device, module: u64) -> Result<()>;
    unsafe fn module_function(&self, dev: Device, module: u64, name: &CStr) -> Result<u64>;
    unsafe fn function_set_max_dynamic_shared(&self, dev: Device, func: u64, bytes: u32) -> Result<()>;
    unsafe fn function_set_shared_carveout(&self, dev: Device, func: u64, percent: i32) -> Result<()>;
    unsafe fn launch(&self, dev: Device, func: u64, cfg: &LaunchConfig, stream: u64, params: *mut *mut c_void) -> Result<()>;
}

fn same_device(what: &str, a: Device, b: Device) -> Result<()> {
    if a != b {
        return Err(GpuError::invalid(format!("{what}: memory on {a} but stream on {b}")));
    }
    Ok(())
}

fn host_page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

/// One GPU runtime (CUDA or HIP), chosen at run time by [`detect`].
///
/// Object-safe and sealed: the implementations are [`crate::cuda::CudaRuntime`] and
/// [`crate::hip::HipRuntime`]. Objects it hands out (buffers, streams, mappings ...) keep the
/// runtime alive and release their resource on drop. Every driver return code is checked.
pub trait Runtime: sealed::Sealed + Send + Sync + fmt::Debug {
    /// The vendor layer (internal).
    #[doc(hidden)]
    fn raw(&self) -> &dyn RawDriver;

    /// A shared handle to this runtime, stored in the objects it hands out (internal).
    #[doc(hidden)]
    fn shared(&self) -> Result<Arc<dyn Runtime>>;

    /// CUDA or HIP.
    fn kind(&self) -> RuntimeKind {
        self.raw().kind()
    }

    /// The library that was loaded.
    fn library(&self) -> String {
        self.raw().library().to_string()
    }

    /// Driver version as the vendor encodes it (CUDA: 1000 * major + 10 * minor).
    fn driver_version(&self) -> Result<u32> {
        self.raw().driver_version()
    }

    /// Number of visible devices.
    fn device_count(&self) -> Result<u32> {
        self.raw().device_count()
    }

    /// Name, PCI bus id, NUMA node, memory, capabilities of a device.
    fn device_properties(&self, dev: Device) -> Result<DeviceProperties> {
        self.raw().properties(dev)
    }

    /// Makes `dev` current on the calling thread (CUDA: retains the device's primary context
    /// once per runtime and sets it current; HIP: `hipSetDevice`). Every call that takes a
    /// device or device object does this itself; call it before launching foreign kernels.
    fn bind(&self, dev: Device) -> Result<()> {
        self.raw().bind(dev)
    }

    /// Free and total memory of a device.
    fn mem_info(&self, dev: Device) -> Result<MemInfo> {
        self.raw().mem_info(dev)
    }

    /// Whether `dev` can map memory of `peer` (true for `dev == peer`).
    fn can_access_peer(&self, dev: Device, peer: Device) -> Result<bool> {
        if dev == peer {
            return Ok(true);
        }
        self.raw().can_access_peer(dev, peer)
    }

    /// Lets `dev` access all memory of `peer`; idempotent, a no-op for `dev == peer`.
    fn enable_peer_access(&self, dev: Device, peer: Device) -> Result<()> {
        if dev == peer {
            return Ok(());
        }
        self.raw().enable_peer_access(dev, peer)
    }

    /// Allocates `len > 0` bytes of device memory.
    fn alloc(&self, dev: Device, len: usize) -> Result<DeviceBuffer> {
        if len == 0 {
            return Err(GpuError::invalid("allocation of 0 bytes"));
        }
        let rt = self.shared()?;
        let ptr = self.raw().mem_alloc(dev, len)?;
        Ok(DeviceBuffer { rt, device: dev, ptr, len })
    }

    /// Allocates `len > 0` bytes of page-locked (pinned) host memory, zeroed, through `dev`'s
    /// context (CUDA: `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`; HIP: `hipHostMalloc`
    /// with `hipHostMallocPortable`), so copies on any device's streams may read or write it.
    /// An async copy from or to it is truly stream-ordered (the driver reads it when the
    /// stream gets there), unlike one from pageable memory, which the driver stages first.
    /// Its [`PinnedBuffer::device_ptr`] is `None`; see [`Runtime::alloc_mapped`] for memory
    /// kernels address directly.
    ///
    /// # Errors
    /// [`GpuError::InvalidArgument`] for `len == 0`; the driver's error (out of memory ...).
    fn alloc_pinned(&self, dev: Device, len: usize) -> Result<PinnedBuffer> {
        alloc_host(self.shared()?, dev, len, false)
    }

    /// Allocates `len > 0` bytes of page-locked host memory, zeroed, that is also mapped into
    /// the device address space: CUDA `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE |
    /// CU_MEMHOSTALLOC_DEVICEMAP` and its device address from `cuMemHostGetDevicePointer_v2`;
    /// HIP `hipHostMalloc` with `hipHostMallocPortable | hipHostMallocMapped` and
    /// `hipHostGetDevicePointer`.
    ///
    /// [`PinnedBuffer::device_ptr`] (or [`PinnedBuffer::device_slice`]) is the address kernels,
    /// copies and stream memory operations use to reach it; [`PinnedBuffer::ptr`] is the host's.
    /// On CUDA with unified addressing ([`crate::Capabilities::unified_addressing`]: 64-bit
    /// Linux) the two are equal; on HIP they usually are, but device code must use `device_ptr`.
    /// The memory stays in host RAM: kernels' loads and stores to it travel over PCIe (or the
    /// host link: NVLink-C2C, Infinity Fabric), so it suits rings of commands a kernel writes
    /// for a host proxy and counters the host writes and a kernel polls, not bulk data. While
    /// a kernel may write it, the host reads it through `ptr()` with volatile or atomic loads,
    /// not through [`PinnedBuffer::as_slice`].
    ///
    /// # Errors
    /// [`GpuError::InvalidArgument`] for `len == 0`; the driver's error (out of memory, or
    /// mapping unsupported: a device without `canMapHostMemory`).
    fn alloc_mapped(&self, dev: Device, len: usize) -> Result<PinnedBuffer> {
        alloc_host(self.shared()?, dev, len, true)
    }

    /// Sets every byte of `dst` to `byte` (synchronous).
    fn memset(&self, dst: &DeviceSlice<'_>, byte: u8) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: dst is a live device range of its device.
        unsafe { self.raw().memset(dst.device(), dst.ptr(), byte, dst.len(), None) }
    }

    /// Host to device, synchronous; `src.len()` must equal `dst.len()`.
    fn copy_htod(&self, dst: &DeviceSlice<'_>, src: &[u8]) -> Result<()> {
        check_len("copy_htod", dst.len(), src.len())?;
        // SAFETY: src is a live host slice of len bytes; dst a live device range of len bytes;
        // the call returns after the copy.
        unsafe { self.raw().copy_htod(dst.device(), dst.ptr(), src.as_ptr(), src.len(), None) }
    }

    /// Device to host, synchronous; lengths must match.
    fn copy_dtoh(&self, dst: &mut [u8], src: &DeviceSlice<'_>) -> Result<()> {
        check_len("copy_dtoh", src.len(), dst.len())?;
        // SAFETY: as in copy_htod, with the directions swapped.
        unsafe { self.raw().copy_dtoh(src.device(), dst.as_mut_ptr(), src.ptr(), dst.len(), None) }
    }

    /// Device to device (same or another device), synchronous; lengths must match.
    fn copy_dtod(&self, dst: &DeviceSlice<'_>, src: &DeviceSlice<'_>) -> Result<()> {
        check_len("copy_dtod", dst.len(), src.len())?;
        // SAFETY: both are live device ranges of len bytes.
        unsafe { self.raw().copy_dtod(dst.device(), dst.ptr(), src.device(), src.ptr(), src.len(), None) }
    }

    /// Device to device queued on `stream` (whose device must hold `dst` or `src`). The memory
    /// must stay allocated until the stream has run the copy.
    fn copy_dtod_async(&self, dst: &DeviceSlice<'_>, src: &DeviceSlice<'_>, stream: &Stream) -> Result<()> {
        check_len("copy_dtod_async", dst.len(), src.len())?;
        if dst.device() != stream.device() && src.device() != stream.device() {
            return Err(GpuError::invalid(format!(
                "copy_dtod_async: neither {} nor {} is the stream's {}",
                dst.device(),
                src.device(),
                stream.device()
            )));
        }
        // SAFETY: both are live device ranges; the stream is live.
        unsafe { self.raw().copy_dtod(dst.device(), dst.ptr(), src.device(), src.ptr(), src.len(), Some((stream.device(), stream.raw()))) }
    }

    /// Host to device queued on `stream`.
    ///
    /// # Safety
    /// `src` must stay valid and unmodified until the stream has run the copy (pinned host
    /// memory is read asynchronously).
    unsafe fn copy_htod_async(&self, dst: &DeviceSlice<'_>, src: &[u8], stream: &Stream) -> Result<()> {
        check_len("copy_htod_async", dst.len(), src.len())?;
        same_device("copy_htod_async", dst.device(), stream.device())?;
        // SAFETY: forwarded contract.
        unsafe { self.raw().copy_htod(dst.device(), dst.ptr(), src.as_ptr(), src.len(), Some(stream.raw())) }
    }

    /// Device to host queued on `stream`.
    ///
    /// # Safety
    /// `dst` must stay valid and must not be read or written until the stream has run the copy.
    unsafe fn copy_dtoh_async(&self, dst: &mut [u8], src: &DeviceSlice<'_>, stream: &Stream) -> Result<()> {
        check_len("copy_dtoh_async", src.len(), dst.len())?;
        same_device("copy_dtoh_async", src.device(), stream.device())?;
        // SAFETY: forwarded contract.
        unsafe { self.raw().copy_dtoh(src.device(), dst.as_mut_ptr(), src.ptr(), dst.len(), Some(stream.raw())) }
    }

    /// A non-blocking stream on `dev`.
    fn stream(&self, dev: Device) -> Result<Stream> {
        let rt = self.shared()?;
        let raw = self.raw().stream_create(dev)?;
        Ok(Stream { rt, device: dev, raw, owned: true })
    }

    /// An event on `dev`; `timing` enables [`Event::elapsed_ms`].
    fn event(&self, dev: Device, timing: bool) -> Result<Event> {
        let rt = self.shared()?;
        let raw = self.raw().event_create(dev, timing)?;
        Ok(Event { rt, device: dev, raw, timing })
    }

    /// Exports `src` for another process: the IPC handle of its containing allocation plus the
    /// offset of `src` inside it. The allocation must come from `alloc` (not VMM).
    fn ipc_export(&self, src: &DeviceSlice<'_>) -> Result<IpcHandle> {
        if src.is_empty() {
            return Err(GpuError::invalid("IPC export of an empty range"));
        }
        // SAFETY: src is a live device range of its device.
        let (base, base_len) = unsafe { self.raw().address_range(src.device(), src.ptr())? };
        let offset = src.ptr().checked_sub(base).ok_or_else(|| GpuError::invalid("pointer below its allocation"))?;
        if offset + src.len() as u64 > base_len {
            return Err(GpuError::invalid(format!("range {:#x}+{} runs past its allocation {base:#x}+{base_len}", src.ptr(), src.len())));
        }
        // SAFETY: base is the start of a live allocation (just queried).
        let raw = unsafe { self.raw().ipc_get_handle(src.device(), base)? };
        Ok(IpcHandle::new(self.kind(), raw, offset, src.len() as u64, std::process::id()))
    }

    /// Maps memory another process exported with [`Runtime::ipc_export`] on `dev`; the mapping's
    /// slice starts at the exported range (the base mapping plus the handle's offset).
    fn ipc_import(&self, dev: Device, handle: &IpcHandle) -> Result<IpcMapping> {
        if handle.runtime() != self.kind() {
            return Err(GpuError::RuntimeMismatch { what: "IPC handle", expected: self.kind(), found: handle.runtime() });
        }
        let len = usize::try_from(handle.len()).map_err(|_| GpuError::invalid("IPC range longer than usize"))?;
        let end = handle.offset().checked_add(handle.len()).ok_or_else(|| GpuError::invalid("IPC offset + len overflows"))?;
        let rt = self.shared()?;
        let base = self.raw().ipc_open(dev, handle.raw(), handle.exporter_pid())?;
        let mapping = IpcMapping { rt, device: dev, base, offset: handle.offset(), len };
        // The mapping covers the exporter's whole allocation: check the range against it where the
        // driver reports the mapping's extent (dropping `mapping` on error closes it).
        // SAFETY: base is the live mapping just opened.
        match unsafe { self.raw().address_range(dev, base) } {
            Ok((mbase, mlen)) if mbase == base && end > mlen => Err(GpuError::invalid(format!(
                "IPC range offset {} + len {} exceeds the mapped allocation ({mlen} bytes at {mbase:#x})",
                handle.offset(),
                handle.len()
            ))),
            Ok(_) => Ok(mapping),
            Err(e) => {
                tracing::debug!("no extent for an IPC mapping, trusting the handle's range: {e}");
                Ok(mapping)
            }
        }
    }

    /// Granularity VMM sizes are rounded to, for allocations exportable as `kinds`.
    fn vmm_granularity(&self, dev: Device, kinds: HandleKinds) -> Result<usize> {
        self.raw().vmm_granularity(dev, kinds)
    }

    /// A VMM allocation of at least `len` bytes (rounded up to the granularity), mapped
    /// read-write on `dev`, exportable as `opts.kinds`.
    fn vmm_alloc(&self, dev: Device, len: usize, opts: &VmmOptions) -> Result<VmmAllocation> {
        if len == 0 {
            return Err(GpuError::invalid("VMM allocation of 0 bytes"));
        }
        let gran = self.raw().vmm_granularity(dev, opts.kinds)?;
        let size = round_up(len, gran).ok_or_else(|| GpuError::invalid(format!("size {len} overflows when rounded to {gran}")))?;
        let rt = self.shared()?;
        let handle = self.raw().vmm_create(dev, size, opts.kinds, opts.gpu_direct_rdma)?;
        map_vmm(rt, self.raw(), dev, handle, size, gran, opts.kinds, false)
    }

    /// Exports a VMM allocation made here as a shareable handle of `kind` (it must have been
    /// created with that kind).
    fn vmm_export(&self, alloc: &VmmAllocation, kind: ShareableKind) -> Result<ShareableHandle> {
        if alloc.is_imported() {
            return Err(GpuError::invalid("re-exporting an imported VMM allocation"));
        }
        if !alloc.kinds().contains(kind) {
            return Err(GpuError::invalid(format!(
                "the allocation was not created exportable as {kind} (VmmOptions::kinds = {:?})",
                alloc.kinds()
            )));
        }
        // SAFETY: the allocation's handle is live while `alloc` is.
        let value = match unsafe { self.raw().vmm_export(alloc.device(), alloc.handle, kind)? } {
            RawExport::Fd(fd) => ShareableValue::PosixFd(fd),
            RawExport::Fabric(b) => ShareableValue::Fabric(b),
        };
        Ok(ShareableHandle { runtime: self.kind(), size: alloc.size() as u64, value })
    }

    /// Imports a shareable handle from another process and maps it read-write on `dev`.
    fn vmm_import(&self, dev: Device, handle: &ShareableHandle) -> Result<VmmAllocation> {
        if handle.runtime() != self.kind() {
            return Err(GpuError::RuntimeMismatch { what: "shareable handle", expected: self.kind(), found: handle.runtime() });
        }
        let size = usize::try_from(handle.size()).map_err(|_| GpuError::invalid("handle size exceeds usize"))?;
        let gran = self.raw().vmm_granularity(dev, HandleKinds::from(handle.kind()))?;
        if size == 0 || size % gran != 0 {
            return Err(GpuError::invalid(format!("shared allocation size {size} is not a multiple of the granularity {gran}")));
        }
        let raw = match &handle.value {
            ShareableValue::PosixFd(fd) => RawImport::Fd(std::os::fd::AsFd::as_fd(fd)),
            ShareableValue::Fabric(b) => RawImport::Fabric(b),
        };
        let rt = self.shared()?;
        let h = self.raw().vmm_import(dev, raw)?;
        map_vmm(rt, self.raw(), dev, h, size, gran, HandleKinds::NONE, true)
    }

    /// A dmabuf file descriptor covering `src` widened to host pages, with the offset of `src`
    /// inside it (for `ibv_reg_dmabuf_mr`).
    fn dmabuf_export(&self, src: &DeviceSlice<'_>) -> Result<DmabufFd> {
        // SAFETY: src is a live device range of its device.
        let (base, base_len) = unsafe { self.raw().address_range(src.device(), src.ptr())? };
        let (start, len, offset) = dmabuf_window(src.ptr(), src.len() as u64, base, base_len, host_page_size())?;
        // SAFETY: start..start+len lies inside the live allocation (checked by dmabuf_window).
        let fd = unsafe { self.raw().dmabuf_export(src.device(), start, len)? };
        Ok(DmabufFd { fd, offset, len, start })
    }

    /// Loads a module on `dev` (PTX is JIT-compiled; a compile error carries the JIT log).
    fn load_module(&self, dev: Device, image: ModuleImage<'_>) -> Result<Module> {
        image.validate(self.kind())?;
        let rt = self.shared()?;
        let raw = self.raw().module_load(dev, &image)?;
        Ok(Module { inner: Arc::new(ModuleInner { rt, device: dev, raw }) })
    }

    /// Launches `func` on `stream` with one pointer per kernel parameter (see
    /// [`crate::KernelArgs`]).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list in number, size and meaning, each pointer
    /// must be valid for the launch call, and every device address the kernel touches must
    /// stay allocated until it has run.
    unsafe fn launch(&self, func: &Function, stream: &Stream, cfg: &LaunchConfig, params: &[*mut c_void]) -> Result<()> {
        cfg.validate()?;
        same_device("launch", func.device(), stream.device())?;
        // SAFETY: forwarded contract; the driver only reads the pointer array.
        unsafe { self.raw().launch(func.device(), func.raw, cfg, stream.raw(), params.as_ptr() as *mut *mut c_void) }
    }
}

/// `alloc_pinned` (`mapped == false`) and `alloc_mapped`: allocate, look up the device address
/// of a mapped block, zero.
fn alloc_host(rt: Arc<dyn Runtime>, dev: Device, len: usize, mapped: bool) -> Result<PinnedBuffer> {
    let what = if mapped { "mapped" } else { "pinned" };
    if len == 0 {
        return Err(GpuError::invalid(format!("{what} host allocation of 0 bytes")));
    }
    let ptr = rt.raw().host_alloc(dev, len, mapped)?;
    if ptr == 0 {
        return Err(GpuError::invalid(format!("{what} host allocation of {len} bytes returned a null pointer")));
    }
    // From here the buffer frees ptr on drop, also when the device address cannot be had.
    let mut buf = PinnedBuffer { rt, device: dev, ptr, len, device_ptr: None };
    if mapped {
        // SAFETY: ptr is the first byte of a live block that host_alloc just mapped on this
        // runtime and device.
        let dptr = unsafe { buf.rt.raw().host_device_ptr(dev, ptr)? };
        if dptr == 0 {
            return Err(GpuError::invalid(format!("mapped host allocation of {len} bytes has a null device address")));
        }
        buf.device_ptr = Some(dptr);
    }
    // SAFETY: ptr..ptr+len is host memory just allocated for this buffer, writable, and not
    // yet shared with any stream or kernel.
    unsafe { std::ptr::write_bytes(ptr as usize as *mut u8, 0, len) };
    Ok(buf)
}

fn check_len(what: &str, device_len: usize, host_len: usize) -> Result<()> {
    if device_len != host_len {
        return Err(GpuError::invalid(format!("{what}: lengths differ ({device_len} vs {host_len})")));
    }
    Ok(())
}

/// Reserves a range, maps `handle` into it and grants `dev` read-write access; on failure undoes
/// what was done and releases `handle`.
#[allow(clippy::too_many_arguments)]
fn map_vmm(
    rt: Arc<dyn Runtime>,
    raw: &dyn RawDriver,
    dev: Device,
    handle: u64,
    size: usize,
    gran: usize,
    kinds: HandleKinds,
    imported: bool,
) -> Result<VmmAllocation> {
    let release = |e: GpuError| {
        // SAFETY: handle is live and owned here; released once on this error path.
        if let Err(e2) = unsafe { raw.vmm_release(dev, handle) } {
            tracing::warn!("releasing a VMM handle after an error failed: {e2}");
        }
        e
    };
    let va = raw.vmm_reserve(dev, size, gran).map_err(release)?;
    // SAFETY: va..va+size was just reserved; handle covers size bytes.
    if let Err(e) = unsafe { raw.vmm_map(dev, va, size, handle) } {
        // SAFETY: undo the reservation made above.
        let _ = unsafe { raw.vmm_free_va(dev, va, size) };
        return Err(release(e));
    }
    // From here the allocation owns va, the mapping and the handle; its drop undoes them.
    let alloc = VmmAllocation { rt, device: dev, handle, va, size, kinds, imported };
    // SAFETY: va..va+size is mapped.
    unsafe { raw.vmm_set_access(dev, va, size)? };
    Ok(alloc)
}

/// Picks the runtime per `MORI_GPU_RUNTIME` (`cuda`, `hip`, `auto` or unset: CUDA first, then HIP).
pub fn detect() -> Result<Arc<dyn Runtime>> {
    detect_with(RuntimeChoice::from_env()?)
}

/// Picks a runtime as `choice` allows. With none usable, the error names every library tried
/// and why it failed.
pub fn detect_with(choice: RuntimeChoice) -> Result<Arc<dyn Runtime>> {
    let mut attempts = Vec::new();
    if choice.allows(RuntimeKind::Cuda) {
        match crate::cuda::CudaRuntime::load() {
            Ok(rt) => {
                tracing::info!(library = rt.raw().library(), "GPU runtime: CUDA");
                return Ok(rt);
            }
            Err(e) => attempts.push(Attempt { runtime: RuntimeKind::Cuda, reason: e.to_string() }),
        }
    }
    if choice.allows(RuntimeKind::Hip) {
        match crate::hip::HipRuntime::load() {
            Ok(rt) => {
                tracing::info!(library = rt.raw().library(), "GPU runtime: HIP");
                return Ok(rt);
            }
            Err(e) => attempts.push(Attempt { runtime: RuntimeKind::Hip, reason: e.to_string() }),
        }
    }
    Err(GpuError::NoRuntime { forced: choice.forced(), attempts })
}

impl dyn Runtime {
    /// Same as [`detect`]: `<dyn Runtime>::detect()`.
    pub fn detect() -> Result<Arc<dyn Runtime>> {
        detect()
    }
}
