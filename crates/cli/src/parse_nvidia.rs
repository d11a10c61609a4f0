//! Parser for a captured `nvidia-smi topo -m`: the device header (GPUs, then NICs), one row
//! per device with the pair codes, the CPU/NUMA affinity columns and the `NIC Legend`.
//!
//! Codes map to classes: `X` self; `NV#` direct-link; `PIX`/`PXB` pcie-switch; `PHB`/`NODE`
//! pcie-host; `SYS` (and the older `SOC`) cross-socket; anything else unknown (with a note).
//! Cells are tab-separated in real captures; a capture whose tabs became blanks is read by
//! whitespace (device cells come first, so they stay aligned). Terminal escapes (the header
//! is underlined) are stripped.

use crate::class::{LinkClass, TopoMatrix};
use crate::error::{CliError, CliResult};

/// The source name in [`TopoMatrix::source`].
pub const SOURCE: &str = "nvidia-smi topo -m";

/// Removes ANSI escape sequences (`ESC [ ... letter`) and a stray `ESC`.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if it.peek() == Some(&'[') {
            it.next();
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        }
    }
    out
}

/// The class of one `nvidia-smi topo -m` code, or `None` when unrecognized.
pub fn code_class(code: &str) -> Option<LinkClass> {
    let c = code.trim();
    match c {
        "X" => Some(LinkClass::SelfLink),
        "PIX" | "PXB" => Some(LinkClass::PcieSwitch),
        "PHB" | "NODE" => Some(LinkClass::PcieHost),
        "SYS" | "SOC" => Some(LinkClass::CrossSocket),
        _ => {
            let n = c.strip_prefix("NV")?;
            (!n.is_empty() && n.chars().all(|d| d.is_ascii_digit())).then_some(LinkClass::DirectLink)
        }
    }
}

fn is_gpu(tok: &str) -> bool {
    tok.strip_prefix("GPU").is_some_and(|n| !n.is_empty() && n.chars().all(|d| d.is_ascii_digit()))
}

/// A device column name: `GPU<n>`, `NIC<n>` or an RDMA device name (`mlx5_0`, older drivers).
fn is_device(tok: &str) -> bool {
    let b = tok.as_bytes();
    is_gpu(tok)
        || (b.len() >= 2
            && b[0].is_ascii_lowercase()
            && b[b.len() - 1].is_ascii_digit()
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_'))
        || tok.strip_prefix("NIC").is_some_and(|n| !n.is_empty() && n.chars().all(|d| d.is_ascii_digit()))
}

/// Cells of a row: tab-separated when the line has tabs, else blank-separated.
fn cells(line: &str) -> Vec<String> {
    if line.contains('\t') {
        line.split('\t').map(|c| c.trim().to_string()).collect()
    } else {
        line.split_whitespace().map(str::to_string).collect()
    }
}

/// Whether `text` looks like `nvidia-smi topo -m` output (a header naming GPU0).
pub fn looks_like(text: &str) -> bool {
    find_header(&strip_ansi(text)).is_some()
}

/// (line index, device columns) of the header: the first line whose first token is `GPU0`
/// and whose second token is not a code (a data row has `X` there).
fn find_header(text: &str) -> Option<(usize, Vec<String>)> {
    for (i, line) in text.lines().enumerate() {
        let toks: Vec<&str> = line.split_whitespace().collect();
        if toks.first() == Some(&"GPU0") && toks.get(1).is_none_or(|t| code_class(t).is_none()) {
            let devs: Vec<String> = toks.iter().take_while(|t| is_device(t)).map(|t| t.to_string()).collect();
            return Some((i, devs));
        }
    }
    None
}

/// Parses a capture into a [`TopoMatrix`]. Errors (one line): no header naming GPU0, a GPU
/// without a row, a row with fewer cells than the header has devices.
pub fn parse(text: &str) -> CliResult<TopoMatrix> {
    let text = strip_ansi(text);
    let bad = |m: String| CliError::input(format!("not a usable `{SOURCE}` capture: {m}"));
    let (hline, devs) = find_header(&text).ok_or_else(|| bad("no header line naming GPU0".into()))?;
    let gpus: Vec<String> = devs.iter().filter(|d| is_gpu(d)).cloned().collect();
    for (i, g) in gpus.iter().enumerate() {
        if *g != format!("GPU{i}") || devs[i] != *g {
            return Err(bad(format!("header lists {g} out of order (expected GPU{i})")));
        }
    }
    let nic_cols: Vec<String> = devs[gpus.len()..].to_vec();
    let lines: Vec<&str> = text.lines().collect();
    let mut rows: Vec<Option<(usize, Vec<String>)>> = vec![None; gpus.len()];
    for (ln, line) in lines.iter().enumerate().skip(hline + 1) {
        let c = cells(line);
        let Some(name) = c.first() else { continue };
        let Some(gi) = gpus.iter().position(|g| g == name) else { continue };
        if c.len() < devs.len() + 1 {
            return Err(bad(format!("line {}: row {name} has {} cells, the header lists {} devices", ln + 1, c.len() - 1, devs.len())));
        }
        rows[gi] = Some((ln + 1, c));
    }
    let mut notes = Vec::new();
    let mut legend: Vec<(String, String)> = Vec::new();
    for line in &lines {
        let t = line.trim();
        if let Some((k, v)) = t.split_once(':') {
            let (k, v) = (k.trim(), v.trim());
            if k.starts_with("NIC") && is_device(k) && !v.is_empty() && !v.contains(' ') {
                legend.push((k.to_string(), v.to_string()));
            }
        }
    }
    let nics: Vec<String> =
        nic_cols.iter().map(|c| legend.iter().find(|(k, _)| k == c).map_or_else(|| c.clone(), |(_, v)| v.clone())).collect();
    let n = gpus.len();
    let mut m = TopoMatrix {
        source: SOURCE.to_string(),
        gpus: gpus.clone(),
        nics,
        gpu_gpu: vec![vec![LinkClass::Unknown; n]; n],
        gpu_gpu_raw: vec![vec![String::new(); n]; n],
        gpu_nic: vec![vec![LinkClass::Unknown; nic_cols.len()]; n],
        gpu_nic_raw: vec![vec![String::new(); nic_cols.len()]; n],
        gpu_numa: vec![None; n],
        notes: Vec::new(),
    };
    for (i, row) in rows.iter().enumerate() {
        let Some((ln, c)) = row else {
            return Err(bad(format!("no row for {} (header lists it)", gpus[i])));
        };
        for (j, dev) in devs.iter().enumerate() {
            let raw = c[j + 1].clone();
            let class = code_class(&raw).unwrap_or_else(|| {
                notes.push(format!("line {ln}: {} / {dev}: code {raw:?} not recognized, class unknown", gpus[i]));
                LinkClass::Unknown
            });
            if j < n {
                m.gpu_gpu[i][j] = class;
                m.gpu_gpu_raw[i][j] = raw;
            } else {
                m.gpu_nic[i][j - n] = class;
                m.gpu_nic_raw[i][j - n] = raw;
            }
        }
        // After the device cells: CPU Affinity, NUMA Affinity (tab-separated captures keep
        // empty cells in place; blank-separated ones only when the NUMA cell is a number).
        m.gpu_numa[i] = c.get(devs.len() + 2).and_then(|s| s.trim().parse::<u32>().ok());
        if m.gpu_gpu[i][i] != LinkClass::SelfLink {
            notes.push(format!("line {ln}: {} / {}: diagonal is not X", gpus[i], gpus[i]));
        }
    }
    if nic_cols.is_empty() {
        notes.push("the capture lists no NICs".to_string());
    }
    m.notes = notes;
    m.validate()?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_escapes() {
        assert_eq!(strip_ansi("\t\u{1b}[4mGPU0\tGPU1\u{1b}[0m"), "\tGPU0\tGPU1");
        for (c, k) in [
            (" X ", LinkClass::SelfLink),
            ("NV18", LinkClass::DirectLink),
            ("NV4", LinkClass::DirectLink),
            ("PIX", LinkClass::PcieSwitch),
            ("PXB", LinkClass::PcieSwitch),
            ("PHB", LinkClass::PcieHost),
            ("NODE", LinkClass::PcieHost),
            ("SYS", LinkClass::CrossSocket),
            ("SOC", LinkClass::CrossSocket),
        ] {
            assert_eq!(code_class(c), Some(k), "{c}");
        }
        assert_eq!(code_class("NV"), None);
        assert_eq!(code_class("N/A"), None);
    }

    #[test]
    fn single_gpu_and_unknown_codes() {
        let m = parse("\tGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPHB\t0-7\t0\nNIC0\tPHB\t X\n\nNIC Legend:\n\n  NIC0: rxe0\n")
            .unwrap();
        assert_eq!((m.gpus.len(), m.nics.clone()), (1, vec!["rxe0".to_string()]));
        assert_eq!((m.gpu_nic[0][0], m.gpu_numa[0]), (LinkClass::PcieHost, Some(0)));
        let m = parse("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n").unwrap();
        assert_eq!(m.gpu_gpu[0][1], LinkClass::Unknown);
        assert!(m.notes.iter().any(|n| n.contains("\"FOO\" not recognized")), "{:?}", m.notes);
        assert!(parse("\tGPU1\tGPU0\nGPU1\t X \tNV1\nGPU0\tNV1\t X\n").is_err());
    }
}
