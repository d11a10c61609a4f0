//! [`FabricMemory`]: GPU memory allocated exportable (VMM with a shareable handle type), and
//! the process-wide table the backend adopts registrations from.

use crate::domain::HandleType;
use mori_gpu::{Device, DeviceSlice, HandleKinds, Runtime, ShareableHandle, VmmAllocation, VmmOptions};
use mori_io_core::{IoError, IoResult};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

pub(crate) struct Exported {
    pub(crate) alloc: VmmAllocation,
    pub(crate) handle: ShareableHandle,
    pub(crate) kind: HandleType,
}

/// Every live [`FabricMemory`] of this process (weak: dropping the memory removes it).
static TABLE: Mutex<Vec<Weak<Exported>>> = Mutex::new(Vec::new());

/// GPU memory exportable as one handle type: `cuMemCreate`/`hipMemCreate` with that shareable
/// type, mapped read-write on its device, exported once. Register (a range of) it with an
/// engine that has the fabric backend and peers in the same fabric domain can map it.
/// Freed when this value and every registration of it are gone.
#[derive(Clone)]
pub struct FabricMemory {
    inner: Arc<Exported>,
}

impl std::fmt::Debug for FabricMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FabricMemory({:?}, {})", self.inner.alloc, self.inner.kind)
    }
}

/// `GpuOp` error naming what was done.
/// Explains a failed FABRIC allocation: CUDA's NOT_PERMITTED (800) means no IMEX channel.
pub fn fabric_diagnosis(e: &mori_gpu::GpuError) -> String {
    match e.code() {
        Some(mori_gpu::CUDA_ERROR_NOT_PERMITTED) => format!(
            "FABRIC handles are not permitted here ({e}): this machine has no IMEX channel (/dev/nvidia-caps-imex-channels; \
             FABRIC needs a multi-node NVLink domain with IMEX running). Within one node use POSIX-FD handles (MORI_IO_FABRIC_HANDLE=posix-fd)"
        ),
        Some(mori_gpu::CUDA_ERROR_NOT_SUPPORTED) => {
            format!("FABRIC handles are not supported by this device or driver ({e}); within one node use POSIX-FD handles")
        }
        _ => format!("FABRIC handle allocation failed: {e}"),
    }
}

impl FabricMemory {
    /// Allocates at least `len` bytes (rounded up to the VMM granularity, typically 2 MiB) on
    /// GPU `device`, exportable as `kind`, and exports it.
    /// Errors: `InvalidArgs` for `len == 0` or a device that does not exist; `NotSupported`
    /// when the device lacks VMM or the handle type (for FABRIC with the IMEX diagnosis);
    /// `GpuOp` for other driver failures.
    pub fn alloc(rt: &Arc<dyn Runtime>, device: u32, len: usize, kind: HandleType) -> IoResult<Self> {
        if len == 0 {
            return Err(IoError::invalid("fabric memory of 0 bytes"));
        }
        let n = rt.device_count().map_err(|e| IoError::gpu("count GPUs", e))?;
        if device >= n {
            return Err(IoError::invalid(format!("GPU {device} does not exist (this machine has {n})")));
        }
        let dev = Device(device);
        let caps = rt.device_properties(dev).map_err(|e| IoError::gpu(&format!("properties of GPU {device}"), e))?.capabilities;
        let (supported, what) = match kind {
            HandleType::PosixFd => (caps.posix_fd_handles, "POSIX-FD"),
            HandleType::Fabric => (caps.fabric_handles, "FABRIC"),
        };
        if !caps.vmm || !supported {
            return Err(IoError::not_supported(format!(
                "GPU {device} cannot export VMM memory as {what} handles (VMM {}, {what} {})",
                caps.vmm, supported
            )));
        }
        let opts = VmmOptions { kinds: HandleKinds::from(kind.shareable()), gpu_direct_rdma: false };
        let on_fail = |e: mori_gpu::GpuError| match kind {
            HandleType::Fabric => IoError::not_supported(fabric_diagnosis(&e)),
            HandleType::PosixFd => IoError::gpu(&format!("allocate {len} bytes of POSIX-FD exportable memory on GPU {device}"), e),
        };
        let alloc = rt.vmm_alloc(dev, len, &opts).map_err(on_fail)?;
        let handle = rt.vmm_export(&alloc, kind.shareable()).map_err(on_fail)?;
        let inner = Arc::new(Exported { alloc, handle, kind });
        let mut t = TABLE.lock();
        t.retain(|w| w.strong_count() > 0);
        t.push(Arc::downgrade(&inner));
        Ok(FabricMemory { inner })
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.inner.alloc.ptr()
    }

    /// Usable length: the requested length rounded up to the granularity, bytes.
    pub fn len(&self) -> usize {
        self.inner.alloc.size()
    }

    /// Never true (allocations of 0 bytes are refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// GPU ordinal.
    pub fn device(&self) -> u32 {
        self.inner.alloc.device().0
    }

    /// The handle type it is exportable as.
    pub fn handle_type(&self) -> HandleType {
        self.inner.kind
    }

    /// The whole mapped range.
    pub fn slice(&self) -> DeviceSlice<'_> {
        self.inner.alloc.slice()
    }
}

/// The live fabric allocation on `device` containing `addr..addr+len`, and `addr`'s offset in it.
pub(crate) fn find(device: u32, addr: u64, len: u64) -> Option<(Arc<Exported>, u64)> {
    let t = TABLE.lock();
    t.iter().filter_map(Weak::upgrade).find_map(|e| {
        let base = e.alloc.ptr();
        let end = base.checked_add(e.alloc.size() as u64)?;
        let inside = e.alloc.device().0 == device && addr >= base && addr.checked_add(len).is_some_and(|x| x <= end);
        inside.then(|| (e.clone(), addr - base))
    })
}
