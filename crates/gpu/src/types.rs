//! Plain value types: runtimes, devices, properties, bus ids, launch shapes. No FFI here.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::error::{GpuError, Result};

/// The vendor runtime behind a [`crate::Runtime`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuntimeKind {
    /// NVIDIA CUDA driver API (libcuda), through `cudarc`.
    Cuda,
    /// AMD HIP runtime (libamdhip64).
    Hip,
}

impl RuntimeKind {
    /// The library this runtime is loaded from.
    pub fn library(self) -> &'static str {
        match self {
            RuntimeKind::Cuda => "libcuda",
            RuntimeKind::Hip => "libamdhip64",
        }
    }

    pub(crate) fn tag(self) -> u8 {
        match self {
            RuntimeKind::Cuda => 1,
            RuntimeKind::Hip => 2,
        }
    }

    pub(crate) fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            1 => Some(RuntimeKind::Cuda),
            2 => Some(RuntimeKind::Hip),
            _ => None,
        }
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuntimeKind::Cuda => "CUDA",
            RuntimeKind::Hip => "HIP",
        })
    }
}

/// Which runtime [`crate::detect`] may pick (`MORI_GPU_RUNTIME=cuda|hip|auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuntimeChoice {
    /// CUDA first, then HIP.
    #[default]
    Auto,
    /// Only CUDA.
    Cuda,
    /// Only HIP.
    Hip,
}

impl RuntimeChoice {
    /// Name of the environment variable that forces a runtime.
    pub const ENV: &'static str = "MORI_GPU_RUNTIME";

    /// Parses the value of `MORI_GPU_RUNTIME`; unset or empty means `Auto`.
    pub fn from_env_value(value: Option<&str>) -> Result<Self> {
        match value.map(|v| v.trim().to_ascii_lowercase()) {
            None => Ok(RuntimeChoice::Auto),
            Some(v) if v.is_empty() || v == "auto" => Ok(RuntimeChoice::Auto),
            Some(v) if v == "cuda" => Ok(RuntimeChoice::Cuda),
            Some(v) if v == "hip" => Ok(RuntimeChoice::Hip),
            Some(_) => Err(GpuError::BadRuntimeChoice { value: value.unwrap_or_default().to_string() }),
        }
    }

    /// Reads `MORI_GPU_RUNTIME` from the environment.
    pub fn from_env() -> Result<Self> {
        match std::env::var(Self::ENV) {
            Ok(v) => Self::from_env_value(Some(&v)),
            Err(std::env::VarError::NotPresent) => Ok(RuntimeChoice::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(GpuError::BadRuntimeChoice { value: v.to_string_lossy().into_owned() }),
        }
    }

    /// The runtime this choice forces, if any.
    pub fn forced(self) -> Option<RuntimeKind> {
        match self {
            RuntimeChoice::Auto => None,
            RuntimeChoice::Cuda => Some(RuntimeKind::Cuda),
            RuntimeChoice::Hip => Some(RuntimeKind::Hip),
        }
    }

    /// Whether `kind` may be tried under this choice.
    pub fn allows(self, kind: RuntimeKind) -> bool {
        self.forced().is_none_or(|k| k == kind)
    }
}

/// A device ordinal as the runtime numbers devices (after `CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device(pub u32);

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}", self.0)
    }
}

/// A PCI address `domain:bus:device.function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciBusId {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number (0..=31).
    pub device: u8,
    /// Function number (0..=7).
    pub function: u8,
}

impl FromStr for PciBusId {
    type Err = GpuError;

    /// Accepts `0000:1b:00.0`, `00000000:1B:00.0` (nvidia-smi) and `1b:00.0` (domain 0).
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| GpuError::Decode { what: "PCI bus id", why: format!("{s:?}: {why}") };
        let s_trim = s.trim().trim_end_matches('\0');
        let (head, function) = s_trim.rsplit_once('.').ok_or_else(|| bad("no '.function'"))?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (*d, *b, *dev),
            [b, dev] => ("0", *b, *dev),
            _ => return Err(bad("expected domain:bus:device.function")),
        };
        let hex = |t: &str, max_len: usize| -> Result<u32> {
            if t.is_empty() || t.len() > max_len || !t.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad("not a hex field of the right width"));
            }
            u32::from_str_radix(t, 16).map_err(|_| bad("not hex"))
        };
        let domain = hex(domain, 8)?;
        let bus = hex(bus, 2)? as u8;
        let device = hex(device, 2)?;
        let function = hex(function, 1)?;
        if device > 0x1f {
            return Err(bad("device number above 0x1f"));
        }
        if function > 7 {
            return Err(bad("function number above 7"));
        }
        Ok(PciBusId { domain, bus, device: device as u8, function: function as u8 })
    }
}

impl fmt::Display for PciBusId {
    /// The sysfs spelling: `0000:1b:00.0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

/// NUMA node of a PCI device from `<sysfs>/bus/pci/devices/<bus id>/numa_node`; `None` when the
/// file is missing, unreadable or says -1 (no NUMA affinity).
pub fn numa_node_from_sysfs(sysfs_root: &Path, bus_id: &PciBusId) -> Option<u32> {
    let path = sysfs_root.join("bus/pci/devices").join(bus_id.to_string()).join("numa_node");
    let text = std::fs::read_to_string(path).ok()?;
    let v: i64 = text.trim().parse().ok()?;
    u32::try_from(v).ok()
}

/// What a device can do, from its attributes (`false` when the runtime has no such attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Unified virtual addressing.
    pub unified_addressing: bool,
    /// Virtual memory management (cuMemCreate / hipMemCreate).
    pub vmm: bool,
    /// VMM allocations exportable as POSIX file descriptors.
    pub posix_fd_handles: bool,
    /// VMM allocations exportable as FABRIC handles (an IMEX channel is still needed to create them).
    pub fabric_handles: bool,
    /// Device ranges exportable as dmabuf file descriptors.
    pub dmabuf: bool,
    /// GPUDirect RDMA.
    pub gpu_direct_rdma: bool,
    /// GPUDirect RDMA on VMM allocations.
    pub gpu_direct_rdma_vmm: bool,
    /// Stream wait/write value operations.
    pub stream_mem_ops: bool,
}

/// Device description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProperties {
    /// Ordinal.
    pub device: Device,
    /// Marketing name.
    pub name: String,
    /// PCI address.
    pub pci_bus_id: PciBusId,
    /// NUMA node of the host memory closest to the device, if the platform says.
    pub numa_node: Option<u32>,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Compute capability (CUDA) or the HIP equivalent major/minor.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors / compute units.
    pub multiprocessors: u32,
    /// Largest dynamic shared memory per block a kernel may opt into.
    pub max_shared_memory_per_block_optin: u32,
    /// Capability flags.
    pub capabilities: Capabilities,
}

/// Free and total device memory, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

/// Grid and block shape of a kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks per grid (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch covering `n` elements with `block` threads per block (at least one block).
    pub fn for_elements(n: u64, block: u32) -> Result<Self> {
        if block == 0 {
            return Err(GpuError::invalid("block size 0"));
        }
        let blocks = n.div_ceil(u64::from(block)).max(1);
        let blocks = u32::try_from(blocks)
            .map_err(|_| GpuError::invalid(format!("{n} elements need {blocks} blocks of {block}: more than u32::MAX")))?;
        Ok(LaunchConfig { grid: (blocks, 1, 1), block: (block, 1, 1), shared_mem_bytes: 0 })
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let (g, b) = (self.grid, self.block);
        if g.0 == 0 || g.1 == 0 || g.2 == 0 || b.0 == 0 || b.1 == 0 || b.2 == 0 {
            return Err(GpuError::invalid(format!("launch with a zero dimension: grid {g:?} block {b:?}")));
        }
        Ok(())
    }
}

/// How `Stream::wait_value32` compares the word in memory with the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitCondition {
    /// `(int32)(*addr - value) >= 0` (cyclic greater-or-equal).
    Geq,
    /// `*addr == value`.
    Eq,
    /// `(*addr & value) != 0`.
    And,
    /// `!(*addr | value) != 0`.
    Nor,
}

impl WaitCondition {
    /// The flag value shared by CUDA (`CU_STREAM_WAIT_VALUE_*`) and HIP (`hipStreamWaitValue*`).
    pub(crate) fn flag(self) -> u32 {
        match self {
            WaitCondition::Geq => 0,
            WaitCondition::Eq => 1,
            WaitCondition::And => 2,
            WaitCondition::Nor => 3,
        }
    }
}

/// Most stream writes queued by one call (one `cuStreamBatchMemOp` takes fewer than 256
/// operations); [`crate::CopyPool::copy_then_write`] keeps one of them for its completion flag.
pub const STREAM_WRITES_MAX: usize = 255;

/// Errors: `InvalidArgument` unless 1 to [`STREAM_WRITES_MAX`] stream writes.
pub(crate) fn check_write_count(n: usize) -> crate::error::Result<()> {
    if !(1..=STREAM_WRITES_MAX).contains(&n) {
        return Err(crate::error::GpuError::invalid(format!("{n} stream writes in one call: 1 to {STREAM_WRITES_MAX}")));
    }
    Ok(())
}

/// One store queued on a stream ([`crate::CopyPool::copy_then_write`]): a word written at a
/// device address (device memory, or mapped host memory through its device address) once the
/// stream's earlier work finished. On CUDA a memory fence orders that work's writes before it
/// (a stream memory operation with flags 0); HIP's `hipStreamWriteValue*` documents no such
/// fence, so a reader there must not take the word as proof that earlier writes landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamWrite {
    /// A `u32` at a 4-byte aligned address.
    U32 {
        /// Device address.
        addr: u64,
        /// The value.
        value: u32,
    },
    /// A `u64` at an 8-byte aligned address.
    U64 {
        /// Device address.
        addr: u64,
        /// The value.
        value: u64,
    },
}

impl StreamWrite {
    /// The word's device address.
    pub fn addr(&self) -> u64 {
        match *self {
            StreamWrite::U32 { addr, .. } | StreamWrite::U64 { addr, .. } => addr,
        }
    }

    /// The word's bytes (4 or 8).
    pub fn bytes(&self) -> u64 {
        match self {
            StreamWrite::U32 { .. } => 4,
            StreamWrite::U64 { .. } => 8,
        }
    }
}

/// `x` rounded up to a multiple of `align` (a power of two or any non-zero value).
pub(crate) fn round_up(x: usize, align: usize) -> Option<usize> {
    if align == 0 {
        return None;
    }
    x.checked_add(align - 1).map(|v| v / align * align)
}
