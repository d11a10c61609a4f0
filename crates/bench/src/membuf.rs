//! The benchmark's buffer: host memory, or GPU memory with a host shadow for filling and
//! checking (the timed loop never touches the shadow).

use crate::validate::{checksums, fill};
use mori_gpu::{DeviceBuffer, DeviceSlice, Runtime};
use mori_io::{FabricMemory, HandleType, MemLoc};
use std::sync::Arc;

/// Device memory of a buffer: a plain allocation, or fabric-exportable VMM memory
/// (`--backend fabric`, rounded up to the VMM granularity; only the asked length is used).
pub enum DevMem {
    /// `cuMemAlloc` / `hipMalloc`.
    Plain(DeviceBuffer),
    /// `FabricMemory::alloc` (POSIX-FD exportable).
    Fabric(FabricMemory),
}

impl DevMem {
    /// The whole allocation.
    pub fn slice(&self) -> DeviceSlice<'_> {
        match self {
            DevMem::Plain(b) => b.slice(),
            DevMem::Fabric(m) => m.slice(),
        }
    }
}

/// A registered buffer of one rank.
pub enum Buffer {
    /// Host memory.
    Host(Vec<u8>),
    /// Device memory on `dev.device()`, plus a host copy used to fill and check it.
    Gpu {
        /// The runtime that owns `dev`.
        rt: Arc<dyn Runtime>,
        /// The device allocation.
        dev: DevMem,
        /// Host staging for pattern fills and checksums (outside the timed loop).
        shadow: Vec<u8>,
    },
}

impl Buffer {
    /// `len` zeroed bytes of host memory.
    pub fn host(len: usize) -> Buffer {
        Buffer::Host(vec![0u8; len])
    }

    /// `len` bytes on GPU `device` (zeroed). Errors name the runtime problem or the device.
    pub fn gpu(device: u32, len: usize) -> Result<Buffer, String> {
        Self::device(device, len, |rt| rt.alloc(mori_gpu::Device(device), len.max(1)).map(DevMem::Plain).map_err(|e| e.to_string()))
    }

    /// `len` bytes of fabric-exportable (POSIX-FD) memory on GPU `device` (zeroed), for
    /// `--backend fabric`. Errors name the runtime problem, the device or the handle type.
    pub fn fabric(device: u32, len: usize) -> Result<Buffer, String> {
        Self::device(device, len, |rt| {
            FabricMemory::alloc(rt, device, len.max(1), HandleType::PosixFd).map(DevMem::Fabric).map_err(|e| e.to_string())
        })
    }

    fn device(device: u32, len: usize, alloc: impl FnOnce(&Arc<dyn Runtime>) -> Result<DevMem, String>) -> Result<Buffer, String> {
        let rt = mori_gpu::detect().map_err(|e| format!("--mem-type gpu: {e}"))?;
        let n = rt.device_count().map_err(|e| format!("--mem-type gpu: {e}"))?;
        if device >= n {
            return Err(format!("GPU {device} does not exist (this machine has {n})"));
        }
        let dev = alloc(&rt).map_err(|e| format!("allocate {len} bytes on GPU {device}: {e}"))?;
        rt.memset(&dev.slice(), 0).map_err(|e| format!("clear GPU buffer: {e}"))?;
        Ok(Buffer::Gpu { rt, dev, shadow: vec![0u8; len.max(1)] })
    }

    /// Address to register and its location.
    pub fn region(&mut self) -> (*mut u8, usize, MemLoc) {
        match self {
            Buffer::Host(v) => (v.as_mut_ptr(), v.len(), MemLoc::Host { numa: None }),
            Buffer::Gpu { dev, shadow, .. } => {
                let s = dev.slice();
                (s.ptr() as *mut u8, shadow.len(), MemLoc::Gpu { device: s.device().0 })
            }
        }
    }

    /// End of the furthest slot (offsets need not be sorted: a paged batch's are not).
    fn extent(offs: &[u64], len: u64) -> usize {
        offs.iter().max().map(|&o| (o + len) as usize).unwrap_or(0)
    }

    /// Fills every slot with the pattern of (`rank`, `point`) (see `validate::fill`).
    pub fn fill(&mut self, offs: &[u64], len: u64, rank: u64, point: u64) -> Result<(), String> {
        match self {
            Buffer::Host(v) => fill(v, offs, len, rank, point),
            Buffer::Gpu { rt, dev, shadow } => {
                fill(shadow, offs, len, rank, point);
                let n = Self::extent(offs, len);
                let dst = dev.slice().sub(0, n).map_err(|e| e.to_string())?;
                rt.copy_htod(&dst, &shadow[..n]).map_err(|e| format!("upload pattern: {e}"))?;
            }
        }
        Ok(())
    }

    /// One xxh3 per slot, of what the buffer holds now.
    pub fn checksums(&mut self, offs: &[u64], len: u64) -> Result<Vec<u64>, String> {
        match self {
            Buffer::Host(v) => Ok(checksums(v, offs, len)),
            Buffer::Gpu { rt, dev, shadow } => {
                let n = Self::extent(offs, len);
                let src = dev.slice().sub(0, n).map_err(|e| e.to_string())?;
                rt.copy_dtoh(&mut shadow[..n], &src).map_err(|e| format!("download for checksums: {e}"))?;
                Ok(checksums(shadow, offs, len))
            }
        }
    }

    /// Flips the byte at `off` (test-only fault injection).
    pub fn flip(&mut self, off: u64) -> Result<(), String> {
        match self {
            Buffer::Host(v) => {
                v[off as usize] ^= 0xff;
                Ok(())
            }
            Buffer::Gpu { rt, dev, .. } => {
                let s = dev.slice().sub(off as usize, 1).map_err(|e| e.to_string())?;
                let mut b = [0u8];
                rt.copy_dtoh(&mut b, &s).map_err(|e| e.to_string())?;
                b[0] ^= 0xff;
                rt.copy_htod(&s, &b).map_err(|e| e.to_string())
            }
        }
    }
}
