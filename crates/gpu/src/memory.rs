//! Device memory: borrowed views ([`DeviceSlice`]) and the owners that free on drop
//! ([`DeviceBuffer`], [`IpcMapping`], [`VmmAllocation`]); pinned host memory ([`PinnedBuffer`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::error::{GpuError, Result};
use crate::handles::HandleKinds;
use crate::types::Device;
use crate::Runtime;

/// A range of device memory on one device, borrowed from its owner for `'a`.
///
/// The host never dereferences it; it is handed to copies, exports and kernels.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DeviceSlice<'a> {
    ptr: u64,
    len: usize,
    device: Device,
    _owner: PhantomData<&'a ()>,
}

impl fmt::Debug for DeviceSlice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceSlice({:#x}+{} on {})", self.ptr, self.len, self.device)
    }
}

impl<'a> DeviceSlice<'a> {
    /// A view of memory this crate does not own (allocated by a kernel library, a framework ...).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be device memory of `device` in this process (or mapped into it) and
    /// stay allocated for `'a`.
    pub unsafe fn from_raw(ptr: u64, len: usize, device: Device) -> Self {
        DeviceSlice { ptr, len, device, _owner: PhantomData }
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The sub-range `offset..offset+len`, bounds-checked.
    pub fn sub(&self, offset: usize, len: usize) -> Result<DeviceSlice<'a>> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(GpuError::invalid(format!("sub-range {offset}+{len} outside a slice of {} bytes", self.len)));
        }
        Ok(DeviceSlice { ptr: self.ptr + offset as u64, len, device: self.device, _owner: PhantomData })
    }
}

/// Device memory from `cuMemAlloc` / `hipMalloc`, freed on drop.
pub struct DeviceBuffer {
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) device: Device,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({:#x}+{} on {} via {})", self.ptr, self.len, self.device, self.rt.kind())
    }
}

impl DeviceBuffer {
    /// The whole buffer.
    pub fn slice(&self) -> DeviceSlice<'_> {
        // SAFETY: the buffer owns ptr..ptr+len on `device` for as long as it is borrowed.
        unsafe { DeviceSlice::from_raw(self.ptr, self.len, self.device) }
    }

    /// `offset..offset+len` of the buffer, bounds-checked.
    pub fn sub(&self, offset: usize, len: usize) -> Result<DeviceSlice<'_>> {
        self.slice().sub(offset, len)
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: allocations of 0 bytes are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device.
    pub fn device(&self) -> Device {
        self.device
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from mem_alloc on this runtime and device and is freed exactly once.
        if let Err(e) = unsafe { self.rt.raw().mem_free(self.device, self.ptr) } {
            tracing::warn!(ptr = self.ptr, device = self.device.0, "freeing a device buffer failed: {e}");
        }
    }
}

/// Page-locked (pinned) host memory from [`Runtime::alloc_pinned`] or, mapped into the device
/// address space as well, from [`Runtime::alloc_mapped`]; freed on drop.
///
/// The host reads and writes it as a byte slice; async copies (and, for a mapped buffer,
/// kernels) read or write it in stream order, so it must not be touched through the slices
/// while queued work that uses it has not yet run.
pub struct PinnedBuffer {
    pub(crate) rt: Arc<dyn Runtime>,
    /// The device whose context allocated it (and frees it).
    pub(crate) device: Device,
    /// Host address.
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    /// Device address of a mapped buffer (`alloc_mapped`); `None` for `alloc_pinned`.
    pub(crate) device_ptr: Option<u64>,
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedBuffer({:#x}+{} via {} of {}", self.ptr, self.len, self.rt.kind(), self.device)?;
        match self.device_ptr {
            Some(d) => write!(f, ", mapped at device address {d:#x})"),
            None => f.write_str(")"),
        }
    }
}

impl PinnedBuffer {
    /// The bytes (zeroed at allocation).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the buffer owns ptr..ptr+len of host memory, initialized (zeroed) at
        // allocation, for as long as it lives; `&self` keeps it from being written meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr as usize as *const u8, self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as usize as *mut u8, self.len) }
    }

    /// Host address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: allocations of 0 bytes are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device whose context allocated it (any device's copies may use it).
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device address of the first byte for a buffer from [`Runtime::alloc_mapped`]: the
    /// address kernels, copies and stream memory operations use to reach this host memory
    /// (over PCIe or the host link). On CUDA with unified addressing it equals [`Self::ptr`].
    /// `None` for a buffer from [`Runtime::alloc_pinned`], which is not mapped.
    pub fn device_ptr(&self) -> Option<u64> {
        self.device_ptr
    }

    /// The whole mapped buffer as a device range of [`Self::device`] (at [`Self::device_ptr`]),
    /// for copies, stream memory operations and kernel arguments; `None` when not mapped.
    pub fn device_slice(&self) -> Option<DeviceSlice<'_>> {
        // SAFETY: device_ptr..device_ptr+len is this buffer's host memory mapped into the device
        // address space (portable: for every device) and stays allocated while it is borrowed.
        self.device_ptr.map(|d| unsafe { DeviceSlice::from_raw(d, self.len, self.device) })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from host_alloc on this runtime and device and is freed exactly once.
        if let Err(e) = unsafe { self.rt.raw().host_free(self.device, self.ptr) } {
            tracing::warn!(ptr = self.ptr, device = self.device.0, "freeing a pinned host buffer failed: {e}");
        }
    }
}

/// Memory of another process mapped through an IPC handle; closed on drop.
pub struct IpcMapping {
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) device: Device,
    /// The mapped base of the exporter's allocation.
    pub(crate) base: u64,
    /// Offset of the exported range inside that allocation.
    pub(crate) offset: u64,
    pub(crate) len: usize,
}

impl fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcMapping(base {:#x} + offset {} , {} bytes on {})", self.base, self.offset, self.len, self.device)
    }
}

impl IpcMapping {
    /// The exported range (base + offset, len).
    pub fn slice(&self) -> DeviceSlice<'_> {
        // SAFETY: the mapping covers the exporter's whole allocation, of which offset..offset+len
        // was exported; it stays mapped until drop.
        unsafe { DeviceSlice::from_raw(self.base + self.offset, self.len, self.device) }
    }

    /// Where the exporter's allocation is mapped in this process.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Offset of the exported range inside the allocation.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: base came from ipc_open on this runtime and is closed exactly once.
        if let Err(e) = unsafe { self.rt.raw().ipc_close(self.device, self.base) } {
            tracing::warn!(base = self.base, device = self.device.0, "closing an IPC mapping failed: {e}");
        }
    }
}

/// A VMM allocation (physical handle + reserved and mapped address range), made here or imported
/// from a shareable handle; unmapped, its range freed and its handle released on drop.
pub struct VmmAllocation {
    pub(crate) rt: Arc<dyn Runtime>,
    pub(crate) device: Device,
    pub(crate) handle: u64,
    pub(crate) va: u64,
    pub(crate) size: usize,
    pub(crate) kinds: HandleKinds,
    pub(crate) imported: bool,
}

impl fmt::Debug for VmmAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VmmAllocation({:#x}+{} on {}, handles {:?}{})",
            self.va,
            self.size,
            self.device,
            self.kinds,
            if self.imported { ", imported" } else { "" }
        )
    }
}

impl VmmAllocation {
    /// The mapped range.
    pub fn slice(&self) -> DeviceSlice<'_> {
        // SAFETY: va..va+size is mapped read-write on `device` until drop.
        unsafe { DeviceSlice::from_raw(self.va, self.size, self.device) }
    }

    /// Mapped size (a multiple of the allocation granularity).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.va
    }

    /// Device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Handle types it was created exportable as (empty for imported ones).
    pub fn kinds(&self) -> HandleKinds {
        self.kinds
    }

    /// Whether it was imported from another process.
    pub fn is_imported(&self) -> bool {
        self.imported
    }
}

impl Drop for VmmAllocation {
    fn drop(&mut self) {
        let raw = self.rt.raw();
        // SAFETY: va/size/handle were set up together by vmm_alloc or vmm_import on this runtime
        // and are torn down exactly once, in reverse order.
        unsafe {
            if let Err(e) = raw.vmm_unmap(self.device, self.va, self.size) {
                tracing::warn!(va = self.va, "unmapping a VMM range failed: {e}");
            }
            if let Err(e) = raw.vmm_free_va(self.device, self.va, self.size) {
                tracing::warn!(va = self.va, "freeing a VMM address range failed: {e}");
            }
            if let Err(e) = raw.vmm_release(self.device, self.handle) {
                tracing::warn!(va = self.va, "releasing a VMM handle failed: {e}");
            }
        }
    }
}
