//! Normalized link classes between GPUs (and between a GPU and a NIC), the topology matrix
//! every source (sysfs, `nvidia-smi topo -m`, `rocm-smi --showtopo`) is turned into, and the
//! worst class inside a proposed parallel group.

use crate::error::{CliError, CliResult};
use serde::Serialize;

/// How two devices are connected, best first (`Ord` follows this order, so the maximum of a
/// set of classes is the worst one). `Unknown` sorts last: a launcher cannot vouch for a pair
/// it knows nothing about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkClass {
    /// The device itself (the matrix diagonal).
    #[serde(rename = "self")]
    SelfLink,
    /// A scale-up link: NVLink (through NVSwitch or a bridge) or xGMI; peer memory is
    /// addressable at hundreds of GB/s.
    DirectLink,
    /// PCIe below a shared switch (nvidia-smi PIX/PXB, sysfs: same root port): never crosses
    /// the host bridge.
    PcieSwitch,
    /// PCIe through a host bridge on one socket (nvidia-smi PHB/NODE; sysfs: same NUMA node).
    PcieHost,
    /// PCIe plus the inter-socket link (nvidia-smi SYS; different NUMA nodes).
    CrossSocket,
    /// Not known (an unrecognized code, or not enough information).
    Unknown,
}

impl LinkClass {
    /// Every class, best first.
    pub const ALL: [LinkClass; 6] = [
        LinkClass::SelfLink,
        LinkClass::DirectLink,
        LinkClass::PcieSwitch,
        LinkClass::PcieHost,
        LinkClass::CrossSocket,
        LinkClass::Unknown,
    ];

    /// The name used in output and on the command line (`direct-link`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::SelfLink => "self",
            LinkClass::DirectLink => "direct-link",
            LinkClass::PcieSwitch => "pcie-switch",
            LinkClass::PcieHost => "pcie-host",
            LinkClass::CrossSocket => "cross-socket",
            LinkClass::Unknown => "unknown",
        }
    }

    /// Two-letter code for matrix cells.
    pub fn code(self) -> &'static str {
        match self {
            LinkClass::SelfLink => "X",
            LinkClass::DirectLink => "DL",
            LinkClass::PcieSwitch => "SW",
            LinkClass::PcieHost => "HB",
            LinkClass::CrossSocket => "XS",
            LinkClass::Unknown => "?",
        }
    }

    /// Parses a class name as [`LinkClass::name`] writes it.
    pub fn parse(s: &str) -> CliResult<LinkClass> {
        let names: Vec<&str> = Self::ALL.iter().map(|c| c.name()).collect();
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s.trim())
            .ok_or_else(|| CliError::input(format!("unknown link class {s:?} (one of {})", names.join(", "))))
    }

    /// Whether traffic between the pair goes through PCIe or the host (the classes a
    /// host-staged copy lives in).
    pub fn is_pcie_or_host(self) -> bool {
        matches!(self, LinkClass::PcieSwitch | LinkClass::PcieHost | LinkClass::CrossSocket)
    }
}

/// A normalized topology: GPU-GPU and GPU-NIC classes, with the vendor codes they came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopoMatrix {
    /// Where it came from: `sysfs`, `nvidia-smi topo -m` or `rocm-smi --showtopo`.
    pub source: String,
    /// GPU names in index order (`GPU0`, ... or PCI addresses for sysfs).
    pub gpus: Vec<String>,
    /// NIC names (RDMA device names where known, e.g. `mlx5_0`).
    pub nics: Vec<String>,
    /// `gpu_gpu[i][j]`: class between GPU i and GPU j.
    pub gpu_gpu: Vec<Vec<LinkClass>>,
    /// The source's code for each GPU pair (`NV18`, `XGMI`, `PIX`, `SamePciSwitch`).
    pub gpu_gpu_raw: Vec<Vec<String>>,
    /// `gpu_nic[i][k]`: class between GPU i and NIC k.
    pub gpu_nic: Vec<Vec<LinkClass>>,
    /// The source's code for each GPU-NIC pair.
    pub gpu_nic_raw: Vec<Vec<String>>,
    /// NUMA node of each GPU, where the source tells.
    pub gpu_numa: Vec<Option<u32>>,
    /// What the source could not tell, one line each.
    pub notes: Vec<String>,
}

/// The worst class inside a group and the pairs that have it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupVerdict {
    /// GPU indices of the group, as given.
    pub group: Vec<usize>,
    /// Worst class over all distinct pairs (`self` for a one-GPU group).
    pub worst: LinkClass,
    /// The pairs (i < j, as GPU indices) whose class is `worst`.
    pub worst_pairs: Vec<(usize, usize)>,
}

impl TopoMatrix {
    /// Checks the shape invariants (square GPU matrix, one NIC row per GPU); parsers call it.
    pub fn validate(&self) -> CliResult<()> {
        let n = self.gpus.len();
        let square = self.gpu_gpu.len() == n && self.gpu_gpu.iter().all(|r| r.len() == n);
        let nic_ok = self.gpu_nic.len() == n && self.gpu_nic.iter().all(|r| r.len() == self.nics.len());
        if n == 0 || !square || !nic_ok || self.gpu_numa.len() != n {
            return Err(CliError::input(format!("{}: inconsistent matrix ({n} GPUs)", self.source)));
        }
        Ok(())
    }

    /// Worst class over every pair of distinct GPUs in `group` (indices into [`Self::gpus`]).
    /// Errors: an empty group, an index out of range or a repeated index.
    pub fn worst_class_in_group(&self, group: &[usize]) -> CliResult<GroupVerdict> {
        if group.is_empty() {
            return Err(CliError::input("--group is empty"));
        }
        for (k, &g) in group.iter().enumerate() {
            if g >= self.gpus.len() {
                return Err(CliError::input(format!("--group: GPU {g} does not exist (the topology has GPUs 0..{})", self.gpus.len() - 1)));
            }
            if group[..k].contains(&g) {
                return Err(CliError::input(format!("--group: GPU {g} is listed twice")));
            }
        }
        let mut worst = LinkClass::SelfLink;
        let mut pairs = Vec::new();
        for (k, &a) in group.iter().enumerate() {
            for &b in &group[k + 1..] {
                let c = self.gpu_gpu[a][b].max(self.gpu_gpu[b][a]);
                let (lo, hi) = (a.min(b), a.max(b));
                if c > worst {
                    worst = c;
                    pairs.clear();
                }
                if c == worst {
                    pairs.push((lo, hi));
                }
            }
        }
        if worst == LinkClass::SelfLink {
            pairs.clear();
        }
        Ok(GroupVerdict { group: group.to_vec(), worst, worst_pairs: pairs })
    }

    /// Counts of each class over GPU pairs i < j.
    pub fn pair_counts(&self) -> Vec<(LinkClass, usize)> {
        let mut out: Vec<(LinkClass, usize)> = Vec::new();
        for i in 0..self.gpus.len() {
            for j in i + 1..self.gpus.len() {
                let c = self.gpu_gpu[i][j];
                match out.iter_mut().find(|(k, _)| *k == c) {
                    Some((_, n)) => *n += 1,
                    None => out.push((c, 1)),
                }
            }
        }
        out.sort();
        out
    }

    /// Text rendering: the GPU matrix and the GPU-NIC matrix in two-letter codes, a legend
    /// and the notes.
    pub fn render(&self) -> String {
        let mut s = format!("topology from {} ({} GPUs, {} NICs)\n\n", self.source, self.gpus.len(), self.nics.len());
        let w = 6;
        s += &format!("{:<w$}", "");
        for j in 0..self.gpus.len() {
            s += &format!("{:>w$}", format!("GPU{j}"));
        }
        for k in 0..self.nics.len() {
            s += &format!("{:>w$}", format!("NIC{k}"));
        }
        s += "  NUMA\n";
        for i in 0..self.gpus.len() {
            s += &format!("{:<w$}", format!("GPU{i}"));
            for c in &self.gpu_gpu[i] {
                s += &format!("{:>w$}", c.code());
            }
            for c in &self.gpu_nic[i] {
                s += &format!("{:>w$}", c.code());
            }
            s += &format!("  {}\n", self.gpu_numa[i].map_or("-".to_string(), |n| n.to_string()));
        }
        s += "\nLegend: X self, DL direct-link (NVLink/xGMI), SW pcie-switch, HB pcie-host, XS cross-socket, ? unknown\n";
        let renamed = self.gpus.iter().enumerate().any(|(i, g)| *g != format!("GPU{i}"));
        if renamed || !self.nics.is_empty() {
            s += "Devices:";
            for (i, g) in self.gpus.iter().enumerate().filter(|_| renamed) {
                s += &format!(" GPU{i}={g}");
            }
            for (k, n) in self.nics.iter().enumerate() {
                s += &format!(" NIC{k}={n}");
            }
            s += "\n";
        }
        let counts: Vec<String> = self.pair_counts().iter().map(|(c, n)| format!("{} {n}", c.name())).collect();
        s += &format!("GPU pairs: {}\n", counts.join(", "));
        for n in &self.notes {
            s += &format!("note: {n}\n");
        }
        s
    }
}

/// Parses `0,1,2,3` (blanks allowed) into GPU indices.
pub fn parse_group(s: &str) -> CliResult<Vec<usize>> {
    s.split(',')
        .map(|p| {
            let p = p.trim();
            p.parse::<usize>().map_err(|_| CliError::input(format!("--group {s:?}: {p:?} is not a GPU index")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use LinkClass::*;

    fn m(classes: Vec<Vec<LinkClass>>) -> TopoMatrix {
        let n = classes.len();
        TopoMatrix {
            source: "test".into(),
            gpus: (0..n).map(|i| format!("GPU{i}")).collect(),
            nics: vec![],
            gpu_gpu_raw: vec![vec![String::new(); n]; n],
            gpu_gpu: classes,
            gpu_nic: vec![vec![]; n],
            gpu_nic_raw: vec![vec![]; n],
            gpu_numa: vec![None; n],
            notes: vec![],
        }
    }

    #[test]
    fn order_is_best_to_worst() {
        assert!(SelfLink < DirectLink && DirectLink < PcieSwitch && PcieSwitch < PcieHost);
        assert!(PcieHost < CrossSocket && CrossSocket < Unknown);
        for c in LinkClass::ALL {
            assert_eq!(LinkClass::parse(c.name()).unwrap(), c);
        }
        assert!(LinkClass::parse("nvlink").is_err());
    }

    #[test]
    fn worst_in_group() {
        let t =
            m(vec![vec![SelfLink, DirectLink, CrossSocket], vec![DirectLink, SelfLink, PcieHost], vec![CrossSocket, PcieHost, SelfLink]]);
        let v = t.worst_class_in_group(&[0, 1]).unwrap();
        assert_eq!((v.worst, v.worst_pairs), (DirectLink, vec![(0, 1)]));
        let v = t.worst_class_in_group(&[2, 1, 0]).unwrap();
        assert_eq!((v.worst, v.worst_pairs), (CrossSocket, vec![(0, 2)]));
        assert_eq!(t.worst_class_in_group(&[1]).unwrap().worst, SelfLink);
        assert!(t.worst_class_in_group(&[0, 3]).is_err());
        assert!(t.worst_class_in_group(&[0, 0]).is_err());
        assert!(t.worst_class_in_group(&[]).is_err());
        assert_eq!(parse_group(" 0, 2 ").unwrap(), vec![0, 2]);
        assert!(parse_group("0,x").is_err());
    }
}
