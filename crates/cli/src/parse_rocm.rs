//! Parser for a captured `rocm-smi --showtopo`: the "Weight", "Hops" and "Link Type between
//! two GPUs" matrices and the "Numa Nodes" lines.
//!
//! Classes: the diagonal is self; `XGMI` is direct-link; `PCIE` is cross-socket when the two
//! GPUs are on different NUMA nodes, pcie-host when on the same one (rocm-smi does not show
//! PCIe switches, so a switch-local pair also reads pcie-host), unknown when a NUMA node is
//! missing; anything else is unknown. rocm-smi lists no NICs.

use crate::class::{LinkClass, TopoMatrix};
use crate::error::{CliError, CliResult};

/// The source name in [`TopoMatrix::source`].
pub const SOURCE: &str = "rocm-smi --showtopo";

/// Whether `text` looks like `rocm-smi --showtopo` output.
pub fn looks_like(text: &str) -> bool {
    text.contains("ROCm System Management Interface")
        || text.contains("Link Type between two GPUs")
        || text.contains("Weight between two GPUs")
}

/// A `GPU<n>` matrix under one `=== title ===` banner: (column count, rows of cells).
fn section(lines: &[&str], title: &str) -> CliResult<Option<Vec<Vec<String>>>> {
    let Some(start) = lines.iter().position(|l| l.contains('=') && l.contains(title)) else {
        return Ok(None);
    };
    let bad = |m: String| CliError::input(format!("not a usable `{SOURCE}` capture: section {title:?}: {m}"));
    let mut it = lines[start + 1..].iter().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = it.next().ok_or_else(|| bad("empty".into()))?;
    let cols: Vec<&str> = header.split_whitespace().collect();
    if cols.is_empty() || cols.iter().enumerate().any(|(i, c)| *c != format!("GPU{i}")) {
        return Err(bad(format!("header {:?} is not GPU0 GPU1 ...", header.trim())));
    }
    let mut rows = Vec::new();
    for (k, line) in it {
        if line.trim_start().starts_with('=') {
            break;
        }
        let toks: Vec<&str> = line.split_whitespace().collect();
        let want = format!("GPU{}", rows.len());
        if toks.first() != Some(&want.as_str()) || toks.len() != cols.len() + 1 {
            return Err(bad(format!("line {}: expected {want} and {} values, got {:?}", start + k + 2, cols.len(), line.trim())));
        }
        rows.push(toks[1..].iter().map(|s| s.to_string()).collect::<Vec<_>>());
        if rows.len() == cols.len() {
            break;
        }
    }
    if rows.len() != cols.len() {
        return Err(bad(format!("{} rows for {} GPUs", rows.len(), cols.len())));
    }
    Ok(Some(rows))
}

/// NUMA node per GPU from `GPU[i] : (Topology) Numa Node: n` lines (`-1` means none).
fn numa_nodes(lines: &[&str], n: usize) -> Vec<Option<u32>> {
    let mut out = vec![None; n];
    for l in lines {
        let Some(rest) = l.trim().strip_prefix("GPU[") else { continue };
        let Some((idx, tail)) = rest.split_once(']') else { continue };
        let Some(v) = tail.split("Numa Node:").nth(1) else { continue };
        if let (Ok(i), Ok(node)) = (idx.parse::<usize>(), v.trim().parse::<i64>()) {
            if i < n {
                out[i] = u32::try_from(node).ok();
            }
        }
    }
    out
}

/// Parses a capture into a [`TopoMatrix`]. Errors (one line): no "Link Type" matrix, or a
/// malformed one; "Hops" and "Weight" are used for notes when present.
pub fn parse(text: &str) -> CliResult<TopoMatrix> {
    let text = crate::parse_nvidia::strip_ansi(text);
    let lines: Vec<&str> = text.lines().collect();
    let links = section(&lines, "Link Type between two GPUs")?
        .ok_or_else(|| CliError::input(format!("not a usable `{SOURCE}` capture: no \"Link Type between two GPUs\" matrix")))?;
    let hops = section(&lines, "Hops between two GPUs")?;
    let n = links.len();
    // Both are square (see `section`); of another size, hops would be read out of bounds
    // (found by the topo_capture fuzz target).
    if let Some(h) = hops.as_ref().filter(|h| h.len() != n) {
        return Err(CliError::input(format!(
            "not a usable `{SOURCE}` capture: the \"Hops between two GPUs\" matrix has {} GPUs, the \"Link Type\" matrix {n}",
            h.len()
        )));
    }
    let numa = numa_nodes(&lines, n);
    let mut m = TopoMatrix {
        source: SOURCE.to_string(),
        gpus: (0..n).map(|i| format!("GPU{i}")).collect(),
        nics: Vec::new(),
        gpu_gpu: vec![vec![LinkClass::Unknown; n]; n],
        gpu_gpu_raw: vec![vec![String::new(); n]; n],
        gpu_nic: vec![Vec::new(); n],
        gpu_nic_raw: vec![Vec::new(); n],
        gpu_numa: numa.clone(),
        notes: vec!["rocm-smi --showtopo lists no NICs; GPU-NIC classes come from sysfs (`mori topo` without --input)".into()],
    };
    if numa.iter().all(Option::is_none) {
        m.notes.push("no NUMA node per GPU in the capture: PCIE pairs are unknown".into());
    } else {
        m.notes.push("rocm-smi shows no PCIe switches: a PCIE pair on one NUMA node reads pcie-host".into());
    }
    for i in 0..n {
        for j in 0..n {
            let raw = links[i][j].clone();
            let hop = hops.as_ref().map(|h| h[i][j].clone());
            m.gpu_gpu[i][j] = if i == j {
                LinkClass::SelfLink
            } else {
                match raw.to_ascii_uppercase().as_str() {
                    "XGMI" => LinkClass::DirectLink,
                    "PCIE" => match (numa[i], numa[j]) {
                        (Some(a), Some(b)) if a == b => LinkClass::PcieHost,
                        (Some(_), Some(_)) => LinkClass::CrossSocket,
                        _ => LinkClass::Unknown,
                    },
                    other => {
                        m.notes.push(format!("GPU{i} / GPU{j}: link type {other:?} not recognized, class unknown"));
                        LinkClass::Unknown
                    }
                }
            };
            if let (LinkClass::DirectLink, Some(h)) = (m.gpu_gpu[i][j], &hop) {
                if h != "1" {
                    m.notes.push(format!("GPU{i} / GPU{j}: XGMI over {h} hops (not a single direct link)"));
                }
            }
            m.gpu_gpu_raw[i][j] = match hop {
                Some(h) if i != j => format!("{raw}/{h}"),
                _ => raw,
            };
        }
    }
    m.validate()?;
    Ok(m)
}
