//! The silent-fallback detector: peer-copy bandwidth per ordered GPU pair, cross-checked
//! against the pair's topology class.
//!
//! The measurements come from this machine (`mori peer-bw` with a GPU runtime: see
//! [`crate::gpu::measure`]) or from elsewhere (`mori peer-bw --measurements`). A pair may be
//! a device to itself (class `self`: a plain device-to-device copy, the roofline the other
//! pairs are read against). Rules, on each pair's largest message size (small ones measure
//! latency, not the path):
//! - any wrong byte: `corrupt` (a fast wrong answer is the worst outcome);
//! - class `direct-link` but bandwidth at or below the PCIe ceiling: `staged-on-direct` —
//!   the number says "through PCIe or the host" while the topology says direct: the silent
//!   fallback;
//! - class `pcie-*`/`cross-socket` but bandwidth above the PCIe ceiling: `direct-on-pcie` —
//!   the reverse: a link the topology does not show (stale capture, renumbered devices; sysfs
//!   shows no NVLink/xGMI at all);
//! - class `direct-link` and the peer-access flag false: `no-peer-access` (the runtime itself
//!   says the copy will stage);
//! - within one class of at least [`MIN_PAIRS_FOR_MEDIAN`] pairs, a pair below
//!   `outlier_fraction` of the class median: `slow-outlier`.

use crate::class::{LinkClass, TopoMatrix};
use crate::error::{CliError, CliResult};
use serde::{Deserialize, Serialize};

/// Fewest pairs of one class for its median to judge outliers.
pub const MIN_PAIRS_FOR_MEDIAN: usize = 3;

/// One measured copy: `src` to `dst`, `bytes` per copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Source GPU index.
    pub src: usize,
    /// Destination GPU index.
    pub dst: usize,
    /// Bytes per copy.
    pub bytes: u64,
    /// Unidirectional bandwidth, GB/s (1e9).
    pub gbps: f64,
    /// What `cudaDeviceCanAccessPeer` / `hipDeviceCanAccessPeer` said for the pair.
    pub peer_access: bool,
    /// Bytes that differed from the source after the copy.
    #[serde(default)]
    pub wrong_bytes: u64,
}

/// The measurement file: `{"measurements": [...]}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasurementFile {
    /// Every (pair, size) measured.
    pub measurements: Vec<Measurement>,
}

/// Thresholds of the detector.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Thresholds {
    /// Most a copy through PCIe (or staged through the host) can reach, GB/s per direction.
    pub pcie_ceiling_gbs: f64,
    /// A pair below this fraction of its class median is an outlier.
    pub outlier_fraction: f64,
}

/// One ordered pair at its largest size, with its class and flags.
#[derive(Debug, Clone, Serialize)]
pub struct PairVerdict {
    /// Source GPU.
    pub src: usize,
    /// Destination GPU.
    pub dst: usize,
    /// Class of the pair.
    pub class: LinkClass,
    /// Largest size measured, bytes.
    pub bytes: u64,
    /// Bandwidth at that size, GB/s.
    pub gbps: f64,
    /// Peer-access flag.
    pub peer_access: bool,
    /// Wrong bytes over every size of the pair.
    pub wrong_bytes: u64,
    /// `corrupt`, `staged-on-direct`, `direct-on-pcie`, `no-peer-access`, `slow-outlier`.
    pub flags: Vec<&'static str>,
    /// One sentence per flag.
    pub reasons: Vec<String>,
}

/// Judges every ordered pair (`src == dst` is class `self`). Errors: an index outside the
/// topology, a non-positive or non-finite bandwidth or size, no measurement at all.
pub fn cross_check(ms: &[Measurement], topo: &TopoMatrix, th: Thresholds) -> CliResult<Vec<PairVerdict>> {
    if ms.is_empty() {
        return Err(CliError::input("no measurements"));
    }
    let n = topo.gpus.len();
    let mut out: Vec<PairVerdict> = Vec::new();
    for m in ms {
        if m.src >= n || m.dst >= n {
            return Err(CliError::input(format!(
                "measurement {} -> {}: not a pair of GPUs of the topology (0..{})",
                m.src,
                m.dst,
                n.saturating_sub(1)
            )));
        }
        if !(m.gbps.is_finite() && m.gbps > 0.0) || m.bytes == 0 {
            return Err(CliError::input(format!("measurement {} -> {}: bandwidth and size must be positive", m.src, m.dst)));
        }
        match out.iter_mut().find(|v| v.src == m.src && v.dst == m.dst) {
            Some(v) => {
                v.wrong_bytes += m.wrong_bytes;
                if m.bytes > v.bytes {
                    (v.bytes, v.gbps, v.peer_access) = (m.bytes, m.gbps, m.peer_access);
                }
            }
            None => out.push(PairVerdict {
                src: m.src,
                dst: m.dst,
                class: if m.src == m.dst { LinkClass::SelfLink } else { topo.gpu_gpu[m.src][m.dst] },
                bytes: m.bytes,
                gbps: m.gbps,
                peer_access: m.peer_access,
                wrong_bytes: m.wrong_bytes,
                flags: Vec::new(),
                reasons: Vec::new(),
            }),
        }
    }
    out.sort_by_key(|v| (v.src, v.dst));
    let medians: Vec<(LinkClass, f64)> = LinkClass::ALL
        .iter()
        .filter_map(|&c| {
            let mut b: Vec<f64> = out.iter().filter(|v| v.class == c).map(|v| v.gbps).collect();
            b.sort_by(f64::total_cmp);
            (b.len() >= MIN_PAIRS_FOR_MEDIAN)
                .then(|| (c, if b.len() % 2 == 1 { b[b.len() / 2] } else { (b[b.len() / 2 - 1] + b[b.len() / 2]) / 2.0 }))
        })
        .collect();
    let ceil = th.pcie_ceiling_gbs;
    for v in &mut out {
        let mut flag = |f: &'static str, why: String| {
            v.flags.push(f);
            v.reasons.push(why);
        };
        let (bw, class) = (v.gbps, v.class.name());
        if v.wrong_bytes > 0 {
            flag("corrupt", format!("{} wrong bytes: the bandwidth of this pair means nothing until the copy is correct", v.wrong_bytes));
        }
        if v.class == LinkClass::DirectLink && bw <= ceil {
            flag(
                "staged-on-direct",
                format!("class {class} but {bw:.1} GB/s is within PCIe/host-staging reach (<= {ceil} GB/s): silent fallback"),
            );
        }
        if v.class.is_pcie_or_host() && bw > ceil {
            flag("direct-on-pcie", format!("class {class} but {bw:.1} GB/s exceeds what PCIe carries (> {ceil} GB/s): a direct link the topology does not show (stale capture or renumbered devices?)"));
        }
        if v.class == LinkClass::DirectLink && !v.peer_access {
            flag("no-peer-access", format!("class {class} but the runtime reports no peer access: copies stage through the host"));
        }
        if let Some(&(_, med)) = medians.iter().find(|(c, _)| *c == v.class) {
            if bw < th.outlier_fraction * med {
                flag("slow-outlier", format!("{bw:.1} GB/s is below {} x the {class} median {med:.1} GB/s", th.outlier_fraction));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::LinkClass::*;

    fn topo() -> TopoMatrix {
        let g = vec![
            vec![SelfLink, DirectLink, CrossSocket, CrossSocket],
            vec![DirectLink, SelfLink, CrossSocket, CrossSocket],
            vec![CrossSocket, CrossSocket, SelfLink, DirectLink],
            vec![CrossSocket, CrossSocket, DirectLink, SelfLink],
        ];
        TopoMatrix {
            source: "test".into(),
            gpus: (0..4).map(|i| format!("GPU{i}")).collect(),
            nics: vec![],
            gpu_gpu_raw: vec![vec![String::new(); 4]; 4],
            gpu_gpu: g,
            gpu_nic: vec![vec![]; 4],
            gpu_nic_raw: vec![vec![]; 4],
            gpu_numa: vec![None; 4],
            notes: vec![],
        }
    }

    fn m(src: usize, dst: usize, bytes: u64, gbps: f64, peer: bool) -> Measurement {
        Measurement { src, dst, bytes, gbps, peer_access: peer, wrong_bytes: 0 }
    }

    const TH: Thresholds = Thresholds { pcie_ceiling_gbs: 64.0, outlier_fraction: 0.5 };

    #[test]
    fn flags_fallback_and_reverse() {
        let ms = vec![
            m(0, 1, 1 << 20, 20.0, true), // small size: ignored in favour of the largest
            m(0, 1, 256 << 20, 180.0, true),
            m(1, 0, 256 << 20, 176.0, true),
            m(2, 3, 256 << 20, 9.8, false), // direct class, staged bandwidth: the silent fallback
            m(3, 2, 256 << 20, 170.0, true),
            m(0, 2, 256 << 20, 18.5, false),
            m(2, 0, 256 << 20, 120.0, true), // cross-socket class, NVLink-like bandwidth
        ];
        let v = cross_check(&ms, &topo(), TH).unwrap();
        let f = |s: usize, d: usize| v.iter().find(|x| x.src == s && x.dst == d).unwrap().flags.clone();
        assert_eq!(v.len(), 6);
        assert_eq!(v[0].bytes, 256 << 20);
        assert!(f(0, 1).is_empty() && f(1, 0).is_empty() && f(3, 2).is_empty());
        assert_eq!(f(2, 3), vec!["staged-on-direct", "no-peer-access", "slow-outlier"]);
        assert_eq!(f(2, 0), vec!["direct-on-pcie"]);
        assert!(f(0, 2).is_empty()); // two cross-socket pairs: too few for a median
    }

    #[test]
    fn corrupt_and_errors() {
        let mut bad = m(0, 1, 1 << 20, 150.0, true);
        bad.wrong_bytes = 12;
        let v = cross_check(&[bad, m(0, 1, 1 << 30, 181.0, true)], &topo(), TH).unwrap();
        assert_eq!((v[0].wrong_bytes, v[0].flags.clone()), (12, vec!["corrupt"]));
        assert!(cross_check(&[], &topo(), TH).is_err());
        // A device to itself is class self, never flagged by class (only by corruption or
        // against the median of other self pairs).
        let own = cross_check(&[m(0, 0, 1 << 20, 1.0, true), m(1, 1, 1 << 20, 900.0, true)], &topo(), TH).unwrap();
        assert_eq!((own[0].class, own[0].flags.len(), own[1].class), (SelfLink, 0, SelfLink));
        assert!(cross_check(&[m(0, 4, 1, 1.0, true)], &topo(), TH).is_err());
        assert!(cross_check(&[m(0, 1, 1, 0.0, true)], &topo(), TH).is_err());
    }
}
