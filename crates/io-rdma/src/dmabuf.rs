//! GPU memory over RDMA: the range is exported as a dmabuf by the GPU runtime and registered
//! with `ibv_reg_dmabuf_mr`, its iova being the range's GPU virtual address (so a peer adds
//! its offsets to the address in the `RdmaMemHandle`, as for host memory).
//!
//! The arithmetic ([`dmabuf_mr_args`]) and the errno classification ([`reg_dmabuf_error`])
//! are sans-IO and unit-tested here; the calls live in the registrar (engine.rs).
//!
//! No machine of this project has a GPU and an RDMA device together: the path up to
//! `ibv_reg_dmabuf_mr` runs in the SoftRoCE guest with a memfd standing in for the dmabuf
//! (rdma_rxe refuses dmabuf MRs: the `NotSupported` error is what is tested there), and the
//! GPU runtime's export runs on the GPU machine; the whole path together has not run.

use mori_gpu::{DmabufFd, GpuError, Runtime};
use mori_io_core::{ErrorCode, IoError, IoResult};
use std::sync::{Arc, OnceLock};

/// Where the dmabuf of a GPU range comes from. The default ([`RuntimeDmabuf`]) asks the GPU
/// runtime (CUDA `cuMemGetHandleForAddressRange` / HIP `hipMemGetHandleForAddressRange`);
/// tests plug in other exporters through [`crate::RdmaConfig::dmabuf`].
pub trait DmabufExporter: Send + Sync {
    /// A dmabuf covering `len` bytes at device address `addr` of GPU `device` (widened to
    /// whole host pages as exporters require), with the offset of `addr` inside it.
    ///
    /// Errors: `NotSupported` when no GPU runtime is present or it cannot export dmabufs
    /// (naming what is missing); `InvalidArgs` for a range outside its allocation; `GpuOp`
    /// for a failing runtime call.
    fn export(&self, device: u32, addr: u64, len: u64) -> IoResult<DmabufFd>;
}

/// A shareable [`DmabufExporter`] (what [`crate::RdmaConfig::dmabuf`] holds).
#[derive(Clone)]
pub struct DmabufSource(pub Arc<dyn DmabufExporter>);

impl std::fmt::Debug for DmabufSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DmabufSource(..)")
    }
}

/// The default exporter: the GPU runtime (CUDA first, then HIP, per `MORI_GPU_RUNTIME`),
/// loaded at the first GPU registration, so that host-only use never loads a GPU library.
#[derive(Default)]
pub struct RuntimeDmabuf {
    rt: OnceLock<Result<Arc<dyn Runtime>, String>>,
}

impl RuntimeDmabuf {
    /// An exporter that loads the runtime on first use.
    pub fn new() -> Self {
        Self::default()
    }
}

impl DmabufExporter for RuntimeDmabuf {
    fn export(&self, device: u32, addr: u64, len: u64) -> IoResult<DmabufFd> {
        let rt = self.rt.get_or_init(|| mori_gpu::detect().map_err(|e| e.to_string()));
        let rt = rt.as_ref().map_err(|e| {
            IoError::not_supported(format!(
                "rdma: GPU {device} memory is registered through a dmabuf exported by the GPU runtime (CUDA or HIP), \
                 and no GPU runtime could be loaded: {e}"
            ))
        })?;
        let len_us = usize::try_from(len).map_err(|_| IoError::invalid(format!("rdma: GPU range length {len} exceeds usize")))?;
        // SAFETY: the engine's caller promised `addr..addr+len` is live memory of GPU `device`
        // until deregistration; the slice is only used for this export.
        let slice = unsafe { mori_gpu::DeviceSlice::from_raw(addr, len_us, mori_gpu::Device(device)) };
        rt.dmabuf_export(&slice).map_err(|e| gpu_error(device, addr, len, e))
    }
}

/// Maps a GPU runtime error of the export to an engine error with context.
fn gpu_error(device: u32, addr: u64, len: u64, e: GpuError) -> IoError {
    let code = match &e {
        GpuError::Unsupported { .. } | GpuError::NoRuntime { .. } | GpuError::LibraryNotFound { .. } => ErrorCode::NotSupported,
        GpuError::InvalidArgument(_) => ErrorCode::InvalidArgs,
        _ => ErrorCode::GpuOp,
    };
    IoError::new(code, format!("rdma: dmabuf export of {len} bytes at {addr:#x} of GPU {device}: {e}"))
}

/// The arguments of `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmabufMrArgs {
    /// Offset of the range's first byte inside the dmabuf, bytes.
    pub offset: u64,
    /// Registered length, bytes: exactly the requested range (a peer's rkey reaches nothing
    /// of the page-widened window outside it).
    pub len: usize,
    /// The MR's I/O virtual address: the range's GPU virtual address.
    pub iova: u64,
}

/// The registration of `len` bytes at GPU address `addr` inside a dmabuf that starts at GPU
/// address `start`, is `window` bytes long, and holds `addr` at `offset` (what
/// [`DmabufExporter::export`] answered). Checks the exporter's answer against the request.
///
/// Errors: `InvalidArgs` for an empty or wrapping range, a length over `usize`, or a window that does not
/// put `addr` at `start + offset` or does not hold the whole range (each message names the
/// values).
pub fn dmabuf_mr_args(addr: u64, len: u64, start: u64, window: u64, offset: u64) -> IoResult<DmabufMrArgs> {
    if len == 0 {
        return Err(IoError::invalid(format!("rdma: dmabuf registration of 0 bytes at {addr:#x}")));
    }
    if addr.checked_add(len).is_none() {
        return Err(IoError::invalid(format!("rdma: dmabuf registration {addr:#x}+{len} overflows the address space")));
    }
    if start.checked_add(offset) != Some(addr) {
        return Err(IoError::invalid(format!(
            "rdma: the dmabuf for {addr:#x}+{len} starts at {start:#x} with the range at offset {offset}, \
             which is not the range's address"
        )));
    }
    let end = offset.checked_add(len).filter(|&e| e <= window).ok_or_else(|| {
        IoError::invalid(format!("rdma: the range {addr:#x}+{len} at offset {offset} does not fit in its dmabuf of {window} bytes"))
    })?;
    debug_assert!(end <= window);
    let len = usize::try_from(len).map_err(|_| IoError::invalid(format!("rdma: dmabuf registration length {len} exceeds usize")))?;
    Ok(DmabufMrArgs { offset, len, iova: addr })
}

/// The error of a failed `ibv_reg_dmabuf_mr` on device `dev` with `errno` (None: unknown).
/// `EOPNOTSUPP`, `ENOTSUP`, `ENOSYS`, `EPROTONOSUPPORT` and `EINVAL` (what providers and
/// kernels without dmabuf MRs answer) become `NotSupported` naming the device and saying that
/// dmabuf MRs are unsupported there; other values `Transport` naming the call and the range.
pub fn reg_dmabuf_error(dev: &str, device: u32, addr: u64, a: &DmabufMrArgs, errno: Option<i32>, err: &str) -> IoError {
    let unsupported = matches!(errno, Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT | libc::EINVAL));
    let errno_s = errno.map(|e| format!(", errno {e}")).unwrap_or_default();
    if unsupported {
        IoError::not_supported(format!(
            "RDMA device {dev} does not support dmabuf memory regions (ibv_reg_dmabuf_mr: {err}{errno_s}): \
             GPU {device} memory at {addr:#x} cannot be registered for RDMA on this device, driver or kernel; \
             it is not staged through host memory either (use a NIC and kernel with dmabuf MR support, or host memory)"
        ))
    } else {
        IoError::transport(format!(
            "{dev}: ibv_reg_dmabuf_mr of {} bytes of GPU {device} memory at {addr:#x} (dmabuf offset {}): {err}{errno_s}",
            a.len, a.offset
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    /// The window mori-gpu's `dmabuf_window` computes, for building test inputs.
    fn window(addr: u64, len: u64) -> (u64, u64, u64) {
        let start = addr & !(PAGE - 1);
        let end = (addr + len).div_ceil(PAGE) * PAGE;
        (start, end - start, addr - start)
    }

    #[test]
    fn unaligned_range_keeps_its_offset_length_and_address() {
        let (addr, len) = (0x7f00_0000_1234, 10_000);
        let (start, w, off) = window(addr, len);
        assert_eq!((start, w, off), (0x7f00_0000_1000, 12288, 0x234));
        let a = dmabuf_mr_args(addr, len, start, w, off).unwrap();
        assert_eq!(a, DmabufMrArgs { offset: 0x234, len: 10_000, iova: 0x7f00_0000_1234 });
        // A peer's remote offset o lands on iova + o = addr + o: the same byte as on host MRs.
        assert_eq!(a.iova + 9_999 - start, a.offset + 9_999, "last byte inside the window");
    }

    #[test]
    fn aligned_range_starts_at_offset_zero() {
        let (addr, len) = (0x2_0000_0000, 2 << 20);
        let (start, w, off) = window(addr, len);
        assert_eq!(dmabuf_mr_args(addr, len, start, w, off).unwrap(), DmabufMrArgs { offset: 0, len: 2 << 20, iova: addr });
    }

    #[test]
    fn range_ending_on_the_window_edge_fits_and_one_byte_more_does_not() {
        let (addr, start) = (0x10_0ff0, 0x10_0000);
        assert_eq!(dmabuf_mr_args(addr, 16, start, PAGE, 0xff0).unwrap().len, 16);
        let e = dmabuf_mr_args(addr, 17, start, PAGE, 0xff0).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgs);
        assert!(e.msg.contains("0x100ff0+17 at offset 4080 does not fit in its dmabuf of 4096 bytes"), "{e}");
    }

    #[test]
    fn inconsistent_exporter_answers_and_empty_ranges_are_refused() {
        let e = dmabuf_mr_args(0x5000, 8, 0x4000, 8192, 0x800).unwrap_err();
        assert!(e.msg.contains("starts at 0x4000 with the range at offset 2048"), "{e}");
        let e = dmabuf_mr_args(0x5000, 0, 0x5000, 4096, 0).unwrap_err();
        assert!(e.msg.contains("0 bytes at 0x5000"), "{e}");
        let e = dmabuf_mr_args(u64::MAX, 2, u64::MAX - 1, 4096, 1).unwrap_err();
        assert!(e.msg.contains("0xffffffffffffffff+2 overflows the address space"), "{e}");
        assert!(dmabuf_mr_args(10, 1, u64::MAX, 4096, 11).is_err(), "start + offset overflows");
    }

    #[test]
    fn unsupported_errnos_say_so_and_name_the_device() {
        let a = DmabufMrArgs { offset: 0x234, len: 4096, iova: 0x1234 };
        for errno in [libc::EOPNOTSUPP, libc::EINVAL, libc::ENOSYS, libc::EPROTONOSUPPORT] {
            let e = reg_dmabuf_error("rxe0", 1, 0x1234, &a, Some(errno), "Operation not supported");
            assert_eq!(e.code, ErrorCode::NotSupported, "errno {errno}");
            assert!(e.msg.contains("RDMA device rxe0 does not support dmabuf memory regions"), "{e}");
            assert!(e.msg.contains(&format!("errno {errno}")) && e.msg.contains("GPU 1 memory at 0x1234"), "{e}");
            assert!(e.msg.contains("not staged through host memory"), "{e}");
        }
        let e = reg_dmabuf_error("mlx5_0", 0, 0x1234, &a, Some(libc::ENOMEM), "Cannot allocate memory");
        assert_eq!(e.code, ErrorCode::Transport);
        assert!(e.msg.contains("mlx5_0: ibv_reg_dmabuf_mr of 4096 bytes of GPU 0 memory at 0x1234 (dmabuf offset 564)"), "{e}");
    }

    #[test]
    fn no_gpu_runtime_is_named() {
        if mori_gpu::detect().is_ok() {
            return; // a GPU runtime is present: the export path is the GPU machine's to test
        }
        let x = RuntimeDmabuf::new();
        let e = x.export(0, 0x10000, 4096).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported);
        assert!(e.msg.contains("GPU 0 memory is registered through a dmabuf"), "{e}");
        assert!(e.msg.contains("no GPU runtime could be loaded: no GPU runtime"), "{e}");
        // The second call answers from the cached load result, identically.
        assert!(x.rt.get().is_some_and(|r| r.is_err()));
        assert_eq!(x.export(0, 0x10000, 4096).unwrap_err(), e);
    }
}
