//! Node topology for MORI: GPUs, RDMA NICs, NUMA nodes and the PCIe tree, read from sysfs,
//! and the NIC choice that follows from them.
//!
//! - [`scan`] reads a sysfs tree under a root directory (`/` on a real node; tests build
//!   fixture trees in a temp directory). Odd contents (missing files, garbage) never panic:
//!   the value becomes `None` or the device is skipped, with a note in
//!   [`Topology::warnings`].
//! - [`gpu_nics`] gives each GPU its closest active NIC (GPU memory stays on one NIC, as the
//!   MORI-IO guide advises: it is PCIe-bound); [`host_nics`] gives host memory its NUMA-local
//!   NICs (for `MORI_IO_NUM_NICS_PER_TRANSFER` striping).
//! - [`DeviceFilter`] parses `MORI_RDMA_DEVICES` (`a,b` keeps only those, `^a,b` drops them).

mod filter;
mod select;
mod sysfs;

#[cfg(test)]
mod fixture;
#[cfg(test)]
mod tests;

pub use filter::{allowed_nics, DeviceFilter, RDMA_DEVICES_ENV};
pub use select::{affinity, gpu_nics, host_nics, Affinity, HostNics, NicChoice};
pub use sysfs::scan;

/// PCI class codes (upper 16 bits of the 24-bit class) that count as GPUs: VGA controller
/// (0x0300), 3D controller (0x0302, NVIDIA data-center GPUs), processing accelerator (0x1200,
/// AMD Instinct).
pub const GPU_CLASSES: [u32; 3] = [0x0300, 0x0302, 0x1200];

/// PCI vendors whose display controllers are board-management consoles, not GPUs
/// (ASPEED 0x1a03, Matrox 0x102b: the BMC VGA of most servers).
pub const BMC_VENDORS: [u16; 2] = [0x1a03, 0x102b];

/// Where a device sits in the PCIe tree: its host bridge and the chain of PCI functions
/// from the root port down to the device itself (from the device's resolved sysfs path,
/// e.g. `/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPath {
    /// Host bridge (root complex) directory name, e.g. `pci0000:00`.
    pub host_bridge: String,
    /// Bus/device/function addresses from the root port to the device, e.g.
    /// `["0000:00:01.0", "0000:01:00.0"]`; the last one is the device.
    pub chain: Vec<String>,
}

/// PCIe link of a device (sysfs `current_link_*` / `max_link_*`); `None` when absent or
/// unparsable (e.g. "Unknown").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PciLink {
    /// Current speed per lane, MT/s (e.g. 32000 for "32.0 GT/s PCIe").
    pub speed_mts: Option<u32>,
    /// Current width, lanes.
    pub width: Option<u32>,
    /// Maximum speed per lane, MT/s.
    pub max_speed_mts: Option<u32>,
    /// Maximum width, lanes.
    pub max_width: Option<u32>,
}

/// A GPU: a PCI function whose class is in [`GPU_CLASSES`] (BMC consoles excluded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// PCI address, e.g. `0000:19:00.0`.
    pub bdf: String,
    /// PCI vendor id (0x10de NVIDIA, 0x1002 AMD).
    pub vendor: Option<u16>,
    /// 24-bit PCI class code, e.g. 0x030200.
    pub class: u32,
    /// NUMA node (`numa_node`; `None` for -1 or missing).
    pub numa: Option<u32>,
    /// Place in the PCIe tree (`None` when the sysfs path does not resolve to one).
    pub path: Option<PciPath>,
    /// PCIe link.
    pub link: PciLink,
}

/// State of an RDMA port (`ports/N/state`, "4: ACTIVE").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortState {
    /// 1: DOWN.
    Down,
    /// 2: INIT.
    Init,
    /// 3: ARMED.
    Armed,
    /// 4: ACTIVE: the only state that carries traffic.
    Active,
    /// 5: ACTIVE_DEFER.
    ActiveDefer,
    /// Anything else, as read.
    Unknown(String),
}

/// One port of an RDMA device (`/sys/class/infiniband/<dev>/ports/<num>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Port number (from 1).
    pub num: u32,
    /// Port state.
    pub state: PortState,
    /// Rate, Mb/s (`rate` "400 Gb/sec (4X NDR)" -> 400000); `None` when unparsable.
    pub rate_mbps: Option<u64>,
    /// "InfiniBand" or "Ethernet" (RoCE), as read.
    pub link_layer: Option<String>,
}

/// An RDMA NIC (`/sys/class/infiniband/<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    /// Device name, e.g. `mlx5_0`, `bnxt_re0`, `rxe0`.
    pub name: String,
    /// PCI address of its `device` (`None` for software devices such as rxe).
    pub bdf: Option<String>,
    /// NUMA node of its PCI function.
    pub numa: Option<u32>,
    /// Place in the PCIe tree.
    pub path: Option<PciPath>,
    /// PCIe link of its PCI function.
    pub link: PciLink,
    /// Ports, by number.
    pub ports: Vec<Port>,
}

impl Nic {
    /// Whether some port is [`PortState::Active`].
    pub fn is_active(&self) -> bool {
        self.ports.iter().any(|p| p.state == PortState::Active)
    }

    /// Best rate over active ports, Mb/s (0 when none is known).
    pub fn rate_mbps(&self) -> u64 {
        let active = self.ports.iter().filter(|p| p.state == PortState::Active);
        active.filter_map(|p| p.rate_mbps).max().unwrap_or(0)
    }
}

/// A NUMA node (`/sys/devices/system/node/node<id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    /// Node id.
    pub id: u32,
    /// CPUs of the node (`cpulist`), ascending; empty for a CPU-less node.
    pub cpus: Vec<u32>,
}

/// What [`scan`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    /// GPUs in PCI address order (domain, bus, device, function).
    pub gpus: Vec<Gpu>,
    /// RDMA NICs in name order.
    pub nics: Vec<Nic>,
    /// NUMA nodes by id.
    pub numa_nodes: Vec<NumaNode>,
    /// What was skipped or unreadable, one line each.
    pub warnings: Vec<String>,
}

impl Topology {
    /// Index of the GPU at PCI address `bdf` (case-insensitive).
    pub fn gpu_index(&self, bdf: &str) -> Option<usize> {
        self.gpus.iter().position(|g| g.bdf.eq_ignore_ascii_case(bdf))
    }

    /// Index of the NIC named `name`.
    pub fn nic_index(&self, name: &str) -> Option<usize> {
        self.nics.iter().position(|n| n.name == name)
    }
}

/// Errors of topology discovery and NIC selection.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// The root has no readable `sys` directory.
    #[error("no sysfs under {root}: {source}")]
    NoSysfs {
        /// The root given to [`scan`].
        root: std::path::PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// `MORI_RDMA_DEVICES` does not parse.
    #[error("{RDMA_DEVICES_ENV}={value:?}: {why}")]
    BadDeviceList {
        /// The value given.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// `MORI_RDMA_DEVICES` keeps a device this node does not have.
    #[error("{RDMA_DEVICES_ENV} names {name}, which is not an RDMA device of this node (present: {present})")]
    UnknownDevice {
        /// The missing device.
        name: String,
        /// The devices found, comma-separated ("none" when there are none).
        present: String,
    },
}
