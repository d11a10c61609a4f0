//! NIC choice: pure functions of a [`Topology`] and the allowed NICs.

use crate::{PciPath, Topology};
use std::cmp::Reverse;

/// How close a NIC is to a device, best first (compare with `<`). Same idea as the
/// PIX/PXB/PHB/NODE/SYS ladder of NCCL's topology code; our own names and rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Affinity {
    /// Below the same PCIe root port (usually the same PCIe switch): traffic never crosses
    /// the root complex. This is a GPU's "rail" NIC.
    SamePciSwitch,
    /// Same host bridge (root complex), different root ports.
    SameHostBridge,
    /// Different host bridges on the same NUMA node.
    SameNuma,
    /// NUMA node of either side unknown (e.g. software RDMA devices, single-node VMs).
    UnknownNuma,
    /// Different NUMA nodes: traffic crosses the inter-socket link.
    CrossNuma,
}

/// Affinity and PCI hops between two devices given their PCIe paths and NUMA nodes.
///
/// Hops count the PCI functions between the two devices below their common ancestor
/// (both sides); they are 0 unless the devices share a host bridge.
pub fn affinity(a: (Option<&PciPath>, Option<u32>), b: (Option<&PciPath>, Option<u32>)) -> (Affinity, u32) {
    if let (Some(pa), Some(pb)) = (a.0, b.0) {
        if pa.host_bridge == pb.host_bridge {
            let common = pa.chain.iter().zip(&pb.chain).take_while(|(x, y)| x == y).count();
            let hops = (pa.chain.len() - common + pb.chain.len() - common) as u32;
            let tier = if common > 0 { Affinity::SamePciSwitch } else { Affinity::SameHostBridge };
            return (tier, hops);
        }
    }
    let tier = match (a.1, b.1) {
        (Some(x), Some(y)) if x == y => Affinity::SameNuma,
        (Some(_), Some(_)) => Affinity::CrossNuma,
        _ => Affinity::UnknownNuma,
    };
    (tier, 0)
}

/// The NIC chosen for one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicChoice {
    /// Index into [`Topology::nics`].
    pub nic: usize,
    /// How close it is.
    pub affinity: Affinity,
    /// PCI hops to it (see [`affinity`]).
    pub hops: u32,
}

/// The closest allowed NIC of every GPU, in [`Topology::gpus`] order (`None` when no NIC is
/// allowed, e.g. a node with no NIC).
///
/// `allowed` lists indices into [`Topology::nics`] (see [`crate::allowed_nics`]: active NICs
/// passing `MORI_RDMA_DEVICES`). Rules, in order: best [`Affinity`]; then higher port rate
/// (Mb/s); then fewer PCI hops; then the NIC fewer GPUs already got (GPUs are taken in PCI
/// order, so GPUs sharing a socket with fewer NICs spread over them); then name.
pub fn gpu_nics(topo: &Topology, allowed: &[usize]) -> Vec<Option<NicChoice>> {
    let mut load = vec![0usize; topo.nics.len()];
    let mut out = Vec::with_capacity(topo.gpus.len());
    for g in &topo.gpus {
        let best = allowed
            .iter()
            .filter_map(|&i| topo.nics.get(i).map(|n| (i, n)))
            .map(|(i, n)| {
                let (aff, hops) = affinity((g.path.as_ref(), g.numa), (n.path.as_ref(), n.numa));
                ((aff, Reverse(n.rate_mbps()), hops, load[i], n.name.as_str()), NicChoice { nic: i, affinity: aff, hops })
            })
            .min_by(|x, y| x.0.cmp(&y.0))
            .map(|(_, c)| c);
        if let Some(c) = best {
            load[c.nic] += 1;
        }
        out.push(best);
    }
    out
}

/// NICs for host memory on NUMA node `numa`, best first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNics {
    /// Indices into [`Topology::nics`]; take the first `MORI_IO_NUM_NICS_PER_TRANSFER`.
    pub nics: Vec<usize>,
    /// Whether they are on `numa`; `false` when the node has no allowed NIC (or `numa` is
    /// unknown) and every allowed NIC is listed instead.
    pub numa_local: bool,
}

/// NUMA-local allowed NICs for host memory on node `numa` (higher rate first, then name);
/// when there is none, every allowed NIC in the same order, flagged not local.
pub fn host_nics(topo: &Topology, numa: Option<u32>, allowed: &[usize]) -> HostNics {
    let mut all: Vec<usize> = allowed.iter().copied().filter(|&i| i < topo.nics.len()).collect();
    all.sort_by_key(|&i| (Reverse(topo.nics[i].rate_mbps()), topo.nics[i].name.clone()));
    all.dedup();
    let local: Vec<usize> = all.iter().copied().filter(|&i| numa.is_some() && topo.nics[i].numa == numa).collect();
    if local.is_empty() {
        HostNics { nics: all, numa_local: false }
    } else {
        HostNics { nics: local, numa_local: true }
    }
}
