//! Handles that cross process boundaries: IPC memory handles (with the offset of a
//! sub-allocation), VMM shareable handles (POSIX FD, FABRIC) and dmabuf file descriptors.
//! Their byte encodings are fixed, little-endian and versioned.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::error::{GpuError, Result};
use crate::types::RuntimeKind;

/// Size of the opaque handle bytes (`CUipcMemHandle`, `hipIpcMemHandle_t`, `CUmemFabricHandle`).
pub const RAW_HANDLE_LEN: usize = 64;

fn decode_err(what: &'static str, why: impl Into<String>) -> GpuError {
    GpuError::Decode { what, why: why.into() }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// An exported range of device memory: the vendor IPC handle of the allocation that contains
/// it, plus the range's offset inside that allocation and its length.
///
/// The vendor handle always names the *base* allocation (CUDA hands out the base's handle for
/// any interior pointer and maps the base on import); the importer adds `offset` itself.
#[derive(Clone, PartialEq, Eq)]
pub struct IpcHandle {
    pub(crate) runtime: RuntimeKind,
    pub(crate) raw: [u8; RAW_HANDLE_LEN],
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) exporter_pid: u32,
}

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcHandle")
            .field("runtime", &self.runtime)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("exporter_pid", &self.exporter_pid)
            .finish_non_exhaustive()
    }
}

impl IpcHandle {
    /// Encoded size of [`IpcHandle::to_bytes`].
    pub const ENCODED_LEN: usize = 96;
    const MAGIC: [u8; 4] = *b"MGPI";
    const VERSION: u8 = 1;

    /// Builds a handle from its parts (the runtime's export fills these).
    pub fn new(runtime: RuntimeKind, raw: [u8; RAW_HANDLE_LEN], offset: u64, len: u64, exporter_pid: u32) -> Self {
        IpcHandle { runtime, raw, offset, len, exporter_pid }
    }

    /// Runtime that exported it.
    pub fn runtime(&self) -> RuntimeKind {
        self.runtime
    }

    /// Opaque vendor handle of the base allocation.
    pub fn raw(&self) -> &[u8; RAW_HANDLE_LEN] {
        &self.raw
    }

    /// Offset of the exported range inside the base allocation.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length of the exported range.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the exported range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Process id of the exporter (a handle cannot be opened in the process that exported it).
    pub fn exporter_pid(&self) -> u32 {
        self.exporter_pid
    }

    /// Fixed 96-byte encoding: magic `MGPI`, version, runtime, pid, offset, len, raw handle.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        b[0..4].copy_from_slice(&Self::MAGIC);
        b[4] = Self::VERSION;
        b[5] = self.runtime.tag();
        b[8..12].copy_from_slice(&self.exporter_pid.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..96].copy_from_slice(&self.raw);
        b
    }

    /// Decodes [`IpcHandle::to_bytes`]; refuses a wrong length, magic, version or runtime tag.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        const WHAT: &str = "IPC handle";
        if b.len() != Self::ENCODED_LEN {
            return Err(decode_err(WHAT, format!("{} bytes, expected {}", b.len(), Self::ENCODED_LEN)));
        }
        if b[0..4] != Self::MAGIC {
            return Err(decode_err(WHAT, "bad magic"));
        }
        if b[4] != Self::VERSION {
            return Err(decode_err(WHAT, format!("version {} (this build reads {})", b[4], Self::VERSION)));
        }
        let runtime = RuntimeKind::from_tag(b[5]).ok_or_else(|| decode_err(WHAT, format!("runtime tag {}", b[5])))?;
        let offset = u64_at(b, 16);
        let len = u64_at(b, 24);
        if offset.checked_add(len).is_none() {
            return Err(decode_err(WHAT, "offset + len overflows"));
        }
        let mut raw = [0u8; RAW_HANDLE_LEN];
        raw.copy_from_slice(&b[32..96]);
        Ok(IpcHandle { runtime, raw, offset, len, exporter_pid: u32_at(b, 8) })
    }
}

/// A set of shareable-handle types a VMM allocation may be exported as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HandleKinds {
    /// POSIX file descriptor (same node, passed with SCM_RIGHTS).
    pub posix_fd: bool,
    /// FABRIC handle (64 bytes; across a scale-up domain; CUDA needs an IMEX channel).
    pub fabric: bool,
}

impl HandleKinds {
    /// Not exportable.
    pub const NONE: HandleKinds = HandleKinds { posix_fd: false, fabric: false };
    /// POSIX FD only.
    pub const POSIX_FD: HandleKinds = HandleKinds { posix_fd: true, fabric: false };
    /// FABRIC only.
    pub const FABRIC: HandleKinds = HandleKinds { posix_fd: false, fabric: true };

    /// Whether `kind` is in the set.
    pub fn contains(self, kind: ShareableKind) -> bool {
        match kind {
            ShareableKind::PosixFd => self.posix_fd,
            ShareableKind::Fabric => self.fabric,
        }
    }

    /// The vendor bit mask (identical for CUDA and HIP: POSIX FD = 1, FABRIC = 8).
    pub(crate) fn mask(self) -> u32 {
        (if self.posix_fd { 1 } else { 0 }) | (if self.fabric { 8 } else { 0 })
    }
}

impl From<ShareableKind> for HandleKinds {
    fn from(k: ShareableKind) -> Self {
        match k {
            ShareableKind::PosixFd => HandleKinds::POSIX_FD,
            ShareableKind::Fabric => HandleKinds::FABRIC,
        }
    }
}

/// One shareable-handle type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShareableKind {
    /// POSIX file descriptor.
    PosixFd,
    /// FABRIC handle.
    Fabric,
}

impl ShareableKind {
    fn tag(self) -> u8 {
        match self {
            ShareableKind::PosixFd => 1,
            ShareableKind::Fabric => 2,
        }
    }

    /// The vendor value (identical for CUDA and HIP).
    pub(crate) fn vendor_value(self) -> u32 {
        HandleKinds::from(self).mask()
    }
}

impl fmt::Display for ShareableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShareableKind::PosixFd => "POSIX_FD",
            ShareableKind::Fabric => "FABRIC",
        })
    }
}

/// Options of [`crate::Runtime::vmm_alloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VmmOptions {
    /// Shareable-handle types the allocation must be exportable as.
    pub kinds: HandleKinds,
    /// Ask for GPUDirect RDMA capable memory (only where the device reports support).
    pub gpu_direct_rdma: bool,
}

pub(crate) enum ShareableValue {
    PosixFd(OwnedFd),
    Fabric([u8; RAW_HANDLE_LEN]),
}

/// An exported VMM allocation: a POSIX file descriptor or a FABRIC handle, with the allocation
/// size the importer must map.
pub struct ShareableHandle {
    pub(crate) runtime: RuntimeKind,
    pub(crate) size: u64,
    pub(crate) value: ShareableValue,
}

impl fmt::Debug for ShareableHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match &self.value {
            ShareableValue::PosixFd(fd) => format!("fd {fd:?}"),
            ShareableValue::Fabric(_) => "fabric".to_string(),
        };
        write!(f, "ShareableHandle({} {v}, {} bytes)", self.runtime, self.size)
    }
}

impl ShareableHandle {
    /// Encoded size of [`ShareableHandle::descriptor`].
    pub const DESCRIPTOR_LEN: usize = 80;
    const MAGIC: [u8; 4] = *b"MGPS";
    const VERSION: u8 = 1;

    /// A handle received from another process: a POSIX file descriptor and the allocation size.
    pub fn from_posix_fd(runtime: RuntimeKind, fd: OwnedFd, size: u64) -> Self {
        ShareableHandle { runtime, size, value: ShareableValue::PosixFd(fd) }
    }

    /// A handle received from another process: FABRIC handle bytes and the allocation size.
    pub fn from_fabric(runtime: RuntimeKind, raw: [u8; RAW_HANDLE_LEN], size: u64) -> Self {
        ShareableHandle { runtime, size, value: ShareableValue::Fabric(raw) }
    }

    /// Its type.
    pub fn kind(&self) -> ShareableKind {
        match self.value {
            ShareableValue::PosixFd(_) => ShareableKind::PosixFd,
            ShareableValue::Fabric(_) => ShareableKind::Fabric,
        }
    }

    /// Runtime that exported it.
    pub fn runtime(&self) -> RuntimeKind {
        self.runtime
    }

    /// Size of the allocation, bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file descriptor of a POSIX FD handle.
    pub fn posix_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.value {
            ShareableValue::PosixFd(fd) => Some(fd.as_fd()),
            ShareableValue::Fabric(_) => None,
        }
    }

    /// The bytes of a FABRIC handle.
    pub fn fabric(&self) -> Option<&[u8; RAW_HANDLE_LEN]> {
        match &self.value {
            ShareableValue::PosixFd(_) => None,
            ShareableValue::Fabric(raw) => Some(raw),
        }
    }

    /// Fixed 80-byte description (magic `MGPS`, version, runtime, kind, size, FABRIC bytes or
    /// zeros). A POSIX FD travels beside it (SCM_RIGHTS, see [`crate::fdpass`]).
    pub fn descriptor(&self) -> [u8; Self::DESCRIPTOR_LEN] {
        let mut b = [0u8; Self::DESCRIPTOR_LEN];
        b[0..4].copy_from_slice(&Self::MAGIC);
        b[4] = Self::VERSION;
        b[5] = self.runtime.tag();
        b[6] = self.kind().tag();
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        if let ShareableValue::Fabric(raw) = &self.value {
            b[16..80].copy_from_slice(raw);
        }
        b
    }

    /// Rebuilds a handle from [`ShareableHandle::descriptor`] and, for a POSIX FD handle, the
    /// received file descriptor (refused if missing; dropped if the handle is FABRIC).
    pub fn from_descriptor(b: &[u8], fd: Option<OwnedFd>) -> Result<Self> {
        const WHAT: &str = "shareable handle descriptor";
        if b.len() != Self::DESCRIPTOR_LEN {
            return Err(decode_err(WHAT, format!("{} bytes, expected {}", b.len(), Self::DESCRIPTOR_LEN)));
        }
        if b[0..4] != Self::MAGIC {
            return Err(decode_err(WHAT, "bad magic"));
        }
        if b[4] != Self::VERSION {
            return Err(decode_err(WHAT, format!("version {} (this build reads {})", b[4], Self::VERSION)));
        }
        let runtime = RuntimeKind::from_tag(b[5]).ok_or_else(|| decode_err(WHAT, format!("runtime tag {}", b[5])))?;
        let size = u64_at(b, 8);
        if size == 0 {
            return Err(decode_err(WHAT, "size 0"));
        }
        match b[6] {
            1 => {
                let fd = fd.ok_or_else(|| decode_err(WHAT, "POSIX_FD handle arrived without a file descriptor"))?;
                Ok(Self::from_posix_fd(runtime, fd, size))
            }
            2 => {
                let mut raw = [0u8; RAW_HANDLE_LEN];
                raw.copy_from_slice(&b[16..80]);
                Ok(Self::from_fabric(runtime, raw, size))
            }
            t => Err(decode_err(WHAT, format!("handle kind tag {t}"))),
        }
    }
}

/// A dmabuf file descriptor for a device range, as an RDMA NIC registers it
/// (`ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access)`).
#[derive(Debug)]
pub struct DmabufFd {
    /// The dmabuf.
    pub fd: OwnedFd,
    /// Offset of the requested range's first byte inside the dmabuf.
    pub offset: u64,
    /// Length of the dmabuf (the requested range widened to host pages).
    pub len: u64,
    /// Device address the dmabuf starts at.
    pub start: u64,
}

/// The host-page window `cuMemGetHandleForAddressRange` / `hipMemGetHandleForAddressRange` need
/// for `ptr..ptr+len`: `(start, window_len, offset_of_ptr)`. Refuses a window that leaves the
/// allocation `base..base+base_len` (it would expose a neighbour's memory).
pub fn dmabuf_window(ptr: u64, len: u64, base: u64, base_len: u64, page: u64) -> Result<(u64, u64, u64)> {
    if len == 0 {
        return Err(GpuError::invalid("dmabuf export of an empty range"));
    }
    if page == 0 || !page.is_power_of_two() {
        return Err(GpuError::invalid(format!("host page size {page} is not a power of two")));
    }
    let end = ptr.checked_add(len).ok_or_else(|| GpuError::invalid("range end overflows"))?;
    let base_end = base.checked_add(base_len).ok_or_else(|| GpuError::invalid("allocation end overflows"))?;
    if ptr < base || end > base_end {
        return Err(GpuError::invalid(format!("range {ptr:#x}+{len} is not inside its allocation {base:#x}+{base_len}")));
    }
    let start = ptr & !(page - 1);
    let wend = end.checked_add(page - 1).ok_or_else(|| GpuError::invalid("range end overflows"))? & !(page - 1);
    if start < base || wend > base_end {
        return Err(GpuError::invalid(format!(
            "range {ptr:#x}+{len} widened to host pages ({start:#x}..{wend:#x}) leaves its allocation \
             {base:#x}+{base_len}; export a page-aligned range or allocate page-aligned sizes"
        )));
    }
    Ok((start, wend - start, ptr - start))
}
