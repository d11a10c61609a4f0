//! Analytic models (not measurements): the staged-versus-direct copy cost of the interconnect
//! primer's section 2.3 and the injection ceiling of its section 3.6.
//!
//! Staged path (nothing arranged): GPU -> host buffer (PCIe), host -> NIC (PCIe), the wire,
//! NIC -> host (PCIe), host -> GPU (PCIe): four PCIe crossings, two per side, and 4m bytes
//! through host memory. Direct path (GPUDirect RDMA / peer DMA): the NIC reads the GPU
//! (PCIe), the wire, the remote NIC writes the GPU (PCIe). Serial cost is the sum of the
//! segments; the pipelined bound is the busiest single resource (one side's PCIe carries
//! 2m when staged, m when direct; the wire carries m).

use crate::error::{in_range, CliError, CliResult};

/// Bandwidths the models accept, GB/s: 1 KB/s to 1 PB/s (bounds keep every result finite).
pub const BW_MIN: f64 = 1e-6;
/// See [`BW_MIN`].
pub const BW_MAX: f64 = 1e6;
use serde::Serialize;

/// Banner every model output carries.
pub const MODEL_BANNER: &str = "MODEL, not a measurement: analytic bounds from the inputs given";

/// Serial and pipelined cost of one path, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PathCost {
    /// Sum of the segments, each waiting for the previous one (no pipelining).
    pub serial_s: f64,
    /// Perfect pipelining: the busiest single resource.
    pub pipelined_s: f64,
    /// That resource: `pcie` or `network`.
    pub bottleneck: &'static str,
    /// Bytes through host memory (staged: 4m; direct: 0).
    pub host_memory_bytes: f64,
}

/// Staged-versus-direct comparison for one message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Staging {
    /// Message size, bytes.
    pub bytes: f64,
    /// PCIe bandwidth per side, GB/s.
    pub pcie_gbs: f64,
    /// Network bandwidth, GB/s.
    pub net_gbs: f64,
    /// Staged through host memory.
    pub staged: PathCost,
    /// Direct (GPUDirect RDMA / peer DMA).
    pub direct: PathCost,
    /// staged / direct, serial.
    pub serial_ratio: f64,
    /// staged / direct, pipelined.
    pub pipelined_ratio: f64,
    /// PCIe bandwidth (GB/s) below which the staged path is bandwidth-limited (its PCIe side,
    /// carrying 2m, becomes busier than the wire): 2 x net.
    pub staged_crossover_pcie_gbs: f64,
    /// Same for the direct path: 1 x net.
    pub direct_crossover_pcie_gbs: f64,
}

/// Staged and direct cost of moving `bytes` with `pcie_gbs` per PCIe side and `net_gbs` on
/// the wire (GB = 1e9). Errors: an input outside its range (the error names the flag and range).
pub fn staging(bytes: f64, pcie_gbs: f64, net_gbs: f64) -> CliResult<Staging> {
    let m = in_range("--bytes", bytes, 1.0, 1e18, "bytes")?;
    let pcie = in_range("--pcie-gbs", pcie_gbs, BW_MIN, BW_MAX, "GB/s")? * 1e9;
    let net = in_range("--net-gbs", net_gbs, BW_MIN, BW_MAX, "GB/s")? * 1e9;
    let (p, w) = (m / pcie, m / net);
    let pick = |pcie_busy: f64| if pcie_busy > w { ("pcie", pcie_busy) } else { ("network", w) };
    let (sb, sp) = pick(2.0 * p);
    let (db, dp) = pick(p);
    let staged = PathCost { serial_s: 4.0 * p + w, pipelined_s: sp, bottleneck: sb, host_memory_bytes: 4.0 * m };
    let direct = PathCost { serial_s: 2.0 * p + w, pipelined_s: dp, bottleneck: db, host_memory_bytes: 0.0 };
    Ok(Staging {
        bytes: m,
        pcie_gbs,
        net_gbs,
        serial_ratio: staged.serial_s / direct.serial_s,
        pipelined_ratio: staged.pipelined_s / direct.pipelined_s,
        staged,
        direct,
        staged_crossover_pcie_gbs: 2.0 * net_gbs,
        direct_crossover_pcie_gbs: net_gbs,
    })
}

/// Injection ceiling of a node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Injection {
    /// GPUs per node.
    pub gpus: u32,
    /// Network adapters per node.
    pub nics: u32,
    /// Bandwidth per adapter, GB/s.
    pub nic_gbs: f64,
    /// Scale-up bandwidth per GPU, GB/s (the comparison point).
    pub scaleup_gbs: f64,
    /// Node injection bandwidth `nics x nic_gbs`, GB/s.
    pub node_gbs: f64,
    /// Per-GPU share `nics x nic_gbs / gpus`, GB/s.
    pub per_gpu_gbs: f64,
    /// `per_gpu_gbs / scaleup_gbs`.
    pub ratio_to_scaleup: f64,
    /// Target ratio asked for, if any.
    pub target_ratio: Option<f64>,
    /// Fewest adapters reaching the target ratio, if one was asked for.
    pub min_nics_for_target: Option<u64>,
}

/// Per-GPU injection share: `n_nic x nic_gbs / n_gpu`. Errors: zero adapters (no scale-out
/// path: a defined error, not a zero), zero GPUs, a rate outside its range.
pub fn per_gpu_injection(n_nic: u32, nic_gbs: f64, n_gpu: u32) -> CliResult<f64> {
    if n_nic == 0 {
        return Err(CliError::input("--nics-per-node is 0: a node without adapters has no injection bandwidth"));
    }
    if n_gpu == 0 {
        return Err(CliError::input("--gpus-per-node must be at least 1"));
    }
    Ok(f64::from(n_nic) * in_range("--nic-gbs", nic_gbs, BW_MIN, BW_MAX, "GB/s")? / f64::from(n_gpu))
}

/// Fewest adapters whose per-GPU share reaches `target x scaleup_gbs`:
/// `ceil(target x scaleup x n_gpu / nic_gbs)` (at least 1). Errors: inputs outside their ranges.
pub fn min_nics_for_ratio(target: f64, scaleup_gbs: f64, n_gpu: u32, nic_gbs: f64) -> CliResult<u64> {
    let need = in_range("--target-ratio", target, 1e-6, 1e6, "")?
        * in_range("--scaleup-gbs", scaleup_gbs, BW_MIN, BW_MAX, "GB/s")?
        * f64::from(n_gpu)
        / in_range("--nic-gbs", nic_gbs, BW_MIN, BW_MAX, "GB/s")?;
    // A hair of tolerance so that exact ratios (8 x 25 / 8 / 400 = 0.0625) are not rounded up.
    let n = (need * (1.0 - 1e-12)).ceil().max(1.0);
    if n > 1e12 {
        return Err(CliError::input(format!("--target-ratio {target}: needs more than 1e12 adapters")));
    }
    Ok(n as u64)
}

/// The whole injection report. Errors as [`per_gpu_injection`] and [`min_nics_for_ratio`].
pub fn injection(gpus: u32, nics: u32, nic_gbs: f64, scaleup_gbs: f64, target: Option<f64>) -> CliResult<Injection> {
    let per_gpu = per_gpu_injection(nics, nic_gbs, gpus)?;
    let scaleup = in_range("--scaleup-gbs", scaleup_gbs, BW_MIN, BW_MAX, "GB/s")?;
    let min = target.map(|t| min_nics_for_ratio(t, scaleup, gpus, nic_gbs)).transpose()?;
    Ok(Injection {
        gpus,
        nics,
        nic_gbs,
        scaleup_gbs,
        node_gbs: f64::from(nics) * nic_gbs,
        per_gpu_gbs: per_gpu,
        ratio_to_scaleup: per_gpu / scaleup,
        target_ratio: target,
        min_nics_for_target: min,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12 * b.abs().max(1.0)
    }

    /// Primer section 2.3: m = 1 GB, PCIe 20 GB/s, network 10 GB/s.
    #[test]
    fn staging_seed_round_numbers() {
        let s = staging(1e9, 20.0, 10.0).unwrap();
        assert!(close(s.staged.serial_s, 0.30), "{}", s.staged.serial_s);
        assert!(close(s.direct.serial_s, 0.20), "{}", s.direct.serial_s);
        assert!(close(s.serial_ratio, 1.5));
        // Pipelined: staged PCIe side carries 2m/20 = 0.1 s, the wire 0.1 s: a tie.
        assert!(close(s.staged.pipelined_s, 0.10) && close(s.direct.pipelined_s, 0.10));
        assert!(close(s.pipelined_ratio, 1.0));
        assert_eq!(s.staged_crossover_pcie_gbs, 20.0);
        assert_eq!(s.direct_crossover_pcie_gbs, 10.0);
        assert_eq!(s.staged.host_memory_bytes, 4e9);
        // Below the crossover the staged path is PCIe-bound; above it, network-bound.
        let narrow = staging(1e9, 16.0, 10.0).unwrap();
        assert_eq!((narrow.staged.bottleneck, narrow.direct.bottleneck), ("pcie", "network"));
        assert!(close(narrow.staged.pipelined_s, 0.125) && close(narrow.direct.pipelined_s, 0.1));
        let wide = staging(1e9, 64.0, 10.0).unwrap();
        assert_eq!(wide.staged.bottleneck, "network");
        assert!(close(wide.pipelined_ratio, 1.0));
    }

    #[test]
    fn staging_rejects_non_positive() {
        for (b, p, n) in [(0.0, 20.0, 10.0), (1e9, -1.0, 10.0), (1e9, 20.0, 0.0), (f64::NAN, 1.0, 1.0)] {
            assert!(staging(b, p, n).is_err(), "{b} {p} {n}");
        }
    }

    #[test]
    fn inputs_that_would_overflow_are_refused_and_the_extremes_stay_finite() {
        let e = staging(1e308, 1e-300, 1.0).unwrap_err().to_string();
        assert!(e.contains("--bytes must be in 1e0..=1e18 bytes, got 1e308"), "{e}");
        let e = injection(8, 8, 1e308, 1.0, None).unwrap_err().to_string();
        assert!(e.contains("--nic-gbs must be in 1e-6..=1e6 GB/s"), "{e}");
        let e = injection(8, 8, 1.0, 1e-308, None).unwrap_err().to_string();
        assert!(e.contains("--scaleup-gbs"), "{e}");
        // The corners of the accepted ranges give finite figures everywhere.
        for (b, p, n) in [(1.0, BW_MIN, BW_MAX), (1e18, BW_MIN, BW_MIN), (1e18, BW_MAX, BW_MIN)] {
            let m = staging(b, p, n).unwrap();
            for v in [m.serial_ratio, m.pipelined_ratio, m.staged.serial_s, m.staged.pipelined_s, m.direct.serial_s] {
                assert!(v.is_finite(), "{b} {p} {n}: {v}");
            }
        }
        for (nic, up, target) in [(BW_MAX, BW_MIN, Some(1e6)), (BW_MIN, BW_MAX, None)] {
            let m = injection(u32::MAX, u32::MAX, nic, up, target).unwrap();
            assert!(m.per_gpu_gbs.is_finite() && m.ratio_to_scaleup.is_finite() && m.node_gbs.is_finite(), "{m:?}");
        }
        // A target no adapter count can reach is a defined error, not a huge number.
        let e = injection(u32::MAX, 1, BW_MIN, BW_MAX, Some(1e6)).unwrap_err().to_string();
        assert!(e.contains("needs more than 1e12 adapters"), "{e}");
    }

    /// Every corner of the accepted ranges, each input at its lower or upper limit: every
    /// figure finite, or (for targets no adapter count reaches) the defined error.
    #[test]
    fn every_corner_of_the_ranges_is_finite() {
        for b in [1.0, 1e18] {
            for p in [BW_MIN, BW_MAX] {
                for n in [BW_MIN, BW_MAX] {
                    let m = staging(b, p, n).unwrap();
                    let v = [
                        m.serial_ratio,
                        m.pipelined_ratio,
                        m.staged.serial_s,
                        m.staged.pipelined_s,
                        m.direct.serial_s,
                        m.direct.pipelined_s,
                    ];
                    assert!(v.iter().all(|x| x.is_finite() && *x > 0.0), "{b} {p} {n}: {v:?}");
                    assert!(m.staged.host_memory_bytes.is_finite() && m.staged_crossover_pcie_gbs.is_finite());
                }
            }
        }
        let mut refused = 0;
        for g in [1, u32::MAX] {
            for k in [1, u32::MAX] {
                for nic in [BW_MIN, BW_MAX] {
                    for up in [BW_MIN, BW_MAX] {
                        for t in [None, Some(1e-6), Some(1e6)] {
                            match injection(g, k, nic, up, t) {
                                Ok(m) => {
                                    let v = [m.node_gbs, m.per_gpu_gbs, m.ratio_to_scaleup];
                                    assert!(v.iter().all(|x| x.is_finite() && *x > 0.0), "{g} {k} {nic} {up} {t:?}: {v:?}");
                                    assert!(m.min_nics_for_target.is_some() == t.is_some());
                                }
                                Err(e) => {
                                    assert!(e.to_string().contains("needs more than 1e12 adapters"), "{e}");
                                    refused += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        // Only a target of 1e6 with a slow adapter and a fast scale-up, or many GPUs, is out of reach.
        assert!((1..32).contains(&refused), "{refused}");
    }

    /// Primer Lab 4: 8 GPUs, 25 GB/s adapters, 400 GB/s scale-up; 1 adapter then 8.
    #[test]
    fn injection_seed_round_numbers() {
        let one = injection(8, 1, 25.0, 400.0, None).unwrap();
        assert_eq!((one.node_gbs, one.per_gpu_gbs), (25.0, 3.125));
        assert_eq!(one.ratio_to_scaleup, 0.0078125); // 1/128: two orders of magnitude down
        let eight = injection(8, 8, 25.0, 400.0, Some(0.0625)).unwrap();
        assert_eq!((eight.node_gbs, eight.per_gpu_gbs, eight.ratio_to_scaleup), (200.0, 25.0, 0.0625));
        assert_eq!(eight.min_nics_for_target, Some(8));
        assert_eq!(min_nics_for_ratio(0.01, 400.0, 8, 25.0).unwrap(), 2); // 1.28 -> 2
        assert_eq!(min_nics_for_ratio(0.0078125, 400.0, 8, 25.0).unwrap(), 1);
    }

    #[test]
    fn injection_shape() {
        // Linear in n_nic.
        let base = per_gpu_injection(1, 25.0, 8).unwrap();
        for k in 1..=16 {
            assert!(close(per_gpu_injection(k, 25.0, 8).unwrap(), base * f64::from(k)));
        }
        // Doubling GPUs halves the share.
        assert!(close(per_gpu_injection(2, 25.0, 16).unwrap(), per_gpu_injection(2, 25.0, 8).unwrap() / 2.0));
        // n_nic = n_gpu: the share is one adapter whatever the GPU count.
        for g in [1, 2, 4, 8, 72] {
            assert_eq!(per_gpu_injection(g, 25.0, g).unwrap(), 25.0);
        }
        assert!(per_gpu_injection(0, 25.0, 8).is_err());
        assert!(per_gpu_injection(1, 25.0, 0).is_err());
        assert!(per_gpu_injection(1, 0.0, 8).is_err());
        assert!(injection(8, 1, 25.0, -400.0, None).is_err());
        assert!(min_nics_for_ratio(0.0, 400.0, 8, 25.0).is_err());
    }
}
