//! `mori topo`: a [`TopoMatrix`] from sysfs (through `mori-topo`) or from a captured vendor
//! matrix, with the vendor detected from the text.

use crate::class::{LinkClass, TopoMatrix};
use crate::error::{CliError, CliResult};
use crate::{parse_nvidia, parse_rocm};
use mori_topo::{affinity, Affinity, Topology};

/// Which parser reads a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Vendor {
    /// Detect from the text.
    Auto,
    /// `nvidia-smi topo -m`.
    Nvidia,
    /// `rocm-smi --showtopo`.
    Amd,
}

/// Parses a captured matrix. Errors (one line): the text is neither vendor's output (auto),
/// or does not parse as the vendor given.
pub fn parse_capture(text: &str, vendor: Vendor) -> CliResult<TopoMatrix> {
    match vendor {
        Vendor::Nvidia => parse_nvidia::parse(text),
        Vendor::Amd => parse_rocm::parse(text),
        Vendor::Auto if parse_rocm::looks_like(text) => parse_rocm::parse(text),
        Vendor::Auto if parse_nvidia::looks_like(text) => parse_nvidia::parse(text),
        Vendor::Auto => Err(CliError::input("not a captured `nvidia-smi topo -m` or `rocm-smi --showtopo` output (no GPU matrix found)")),
    }
}

/// The class of a sysfs [`Affinity`]: PCIe only (sysfs does not show NVLink or xGMI).
pub fn affinity_class(a: Affinity) -> LinkClass {
    match a {
        Affinity::SamePciSwitch => LinkClass::PcieSwitch,
        Affinity::SameHostBridge | Affinity::SameNuma => LinkClass::PcieHost,
        Affinity::CrossNuma => LinkClass::CrossSocket,
        Affinity::UnknownNuma => LinkClass::Unknown,
    }
}

/// Classes from a sysfs scan: GPU pairs and GPU-NIC pairs by PCIe place and NUMA node.
/// Errors: the scan found no GPU.
pub fn from_sysfs(t: &Topology) -> CliResult<TopoMatrix> {
    let n = t.gpus.len();
    if n == 0 {
        return Err(CliError::Unavailable(
            "sysfs shows no GPU (PCI class 0x0300/0x0302/0x1200, BMC consoles excluded); pass a captured matrix with --input".into(),
        ));
    }
    let mut m = TopoMatrix {
        source: "sysfs".into(),
        gpus: t.gpus.iter().map(|g| g.bdf.clone()).collect(),
        nics: t.nics.iter().map(|x| x.name.clone()).collect(),
        gpu_gpu: vec![vec![LinkClass::SelfLink; n]; n],
        gpu_gpu_raw: vec![vec!["self".to_string(); n]; n],
        gpu_nic: vec![Vec::new(); n],
        gpu_nic_raw: vec![Vec::new(); n],
        gpu_numa: t.gpus.iter().map(|g| g.numa).collect(),
        notes: vec!["sysfs shows PCIe paths only: NVLink/xGMI links are not visible here, so no pair reads direct-link; pass a captured `nvidia-smi topo -m` or `rocm-smi --showtopo` with --input".into()],
    };
    for (i, a) in t.gpus.iter().enumerate() {
        for (j, b) in t.gpus.iter().enumerate() {
            if i != j {
                let (aff, hops) = affinity((a.path.as_ref(), a.numa), (b.path.as_ref(), b.numa));
                m.gpu_gpu[i][j] = affinity_class(aff);
                m.gpu_gpu_raw[i][j] = format!("{aff:?}/{hops}");
            }
        }
        for x in &t.nics {
            let (aff, hops) = affinity((a.path.as_ref(), a.numa), (x.path.as_ref(), x.numa));
            m.gpu_nic[i].push(affinity_class(aff));
            m.gpu_nic_raw[i].push(format!("{aff:?}/{hops}"));
        }
    }
    m.validate()?;
    Ok(m)
}
