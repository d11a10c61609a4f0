//! Reading sysfs: every file is optional, every value is parsed defensively.

use crate::{Gpu, Nic, NumaNode, PciLink, PciPath, Port, PortState, TopoError, Topology, BMC_VENDORS, GPU_CLASSES};
use std::fs;
use std::path::{Path, PathBuf};

/// Most CPUs a `cpulist` may expand to; longer (garbage) lists are cut there.
const MAX_CPUS: usize = 1 << 16;

/// Reads GPUs (`sys/bus/pci/devices/*` by class), RDMA NICs (`sys/class/infiniband/*`) and
/// NUMA nodes (`sys/devices/system/node/node*`) under `root` (`/` on a real node).
///
/// Errors: [`TopoError::NoSysfs`] when `root/sys` cannot be read. Missing subtrees mean
/// "none of those" (a node with no NIC has no `sys/class/infiniband`); unreadable or
/// unparsable entries are skipped or left `None`, with a line in `warnings`.
pub fn scan(root: &Path) -> Result<Topology, TopoError> {
    let sys = root.join("sys");
    fs::read_dir(&sys).map_err(|source| TopoError::NoSysfs { root: root.to_path_buf(), source })?;
    let devices = fs::canonicalize(sys.join("devices")).unwrap_or_else(|_| sys.join("devices"));
    let mut t = Topology::default();
    let mut gpus = Vec::new();
    for (bdf, dir) in list(&sys.join("bus/pci/devices")) {
        let Some(class_text) = read(&dir.join("class")) else {
            t.warnings.push(format!("PCI {bdf}: no readable class file, skipped"));
            continue;
        };
        let Some(class) = hex(&class_text) else {
            t.warnings.push(format!("PCI {bdf}: class {class_text:?} is not hex, skipped"));
            continue;
        };
        let vendor = read(&dir.join("vendor")).and_then(|v| hex(&v)).and_then(|v| u16::try_from(v).ok());
        if !GPU_CLASSES.contains(&(class >> 8)) || vendor.is_some_and(|v| BMC_VENDORS.contains(&v)) {
            continue;
        }
        let path = pci_path(&dir, &devices);
        gpus.push((bdf_key(&bdf), Gpu { bdf, vendor, class, numa: numa(&dir), path, link: link(&dir) }));
    }
    gpus.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.bdf.cmp(&b.1.bdf)));
    t.gpus = gpus.into_iter().map(|(_, g)| g).collect();
    for (name, dir) in list(&sys.join("class/infiniband")) {
        let dev = dir.join("device");
        let has_dev = fs::metadata(&dev).is_ok();
        let path = if has_dev { pci_path(&dev, &devices) } else { None };
        let mut ports = Vec::new();
        for (num, pdir) in list(&dir.join("ports")) {
            let Ok(num) = num.parse::<u32>() else {
                t.warnings.push(format!("RDMA {name}: port directory {num:?} is not a number, skipped"));
                continue;
            };
            let state = read(&pdir.join("state")).map_or(PortState::Unknown(String::new()), |s| port_state(&s));
            let rate_mbps = read(&pdir.join("rate")).and_then(|r| rate(&r));
            ports.push(Port { num, state, rate_mbps, link_layer: read(&pdir.join("link_layer")) });
        }
        ports.sort_by_key(|p| p.num);
        if ports.is_empty() {
            t.warnings.push(format!("RDMA {name}: no readable port"));
        }
        let bdf = path.as_ref().and_then(|p| p.chain.last().cloned());
        let (numa, link) = if has_dev { (numa(&dev), link(&dev)) } else { (None, PciLink::default()) };
        t.nics.push(Nic { name, bdf, numa, path, link, ports });
    }
    for (name, dir) in list(&sys.join("devices/system/node")) {
        let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else { continue };
        let cpus = match read(&dir.join("cpulist")) {
            Some(s) => cpulist(&s).unwrap_or_else(|| {
                t.warnings.push(format!("NUMA node {id}: cpulist {s:?} does not parse"));
                Vec::new()
            }),
            None => Vec::new(),
        };
        t.numa_nodes.push(NumaNode { id, cpus });
    }
    t.numa_nodes.sort_by_key(|n| n.id);
    Ok(t)
}

/// Entries of a directory as (name, path), sorted by name; empty when unreadable.
fn list(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<(String, PathBuf)> = rd.flatten().map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())).collect();
    v.sort();
    v
}

/// A small sysfs file, trimmed; `None` when unreadable. Non-UTF-8 bytes become U+FFFD.
fn read(p: &Path) -> Option<String> {
    let bytes = fs::read(p).ok()?;
    Some(String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]).trim().to_string())
}

/// "0x030200" (or without the prefix) -> 0x030200.
pub(crate) fn hex(s: &str) -> Option<u32> {
    let s = s.trim();
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    u32::from_str_radix(digits, 16).ok()
}

fn numa(dir: &Path) -> Option<u32> {
    read(&dir.join("numa_node")).and_then(|s| s.parse::<i64>().ok()).and_then(|n| u32::try_from(n).ok())
}

fn link(dir: &Path) -> PciLink {
    let width = |f: &str| read(&dir.join(f)).and_then(|s| s.parse::<u32>().ok()).filter(|&w| w > 0);
    PciLink {
        speed_mts: read(&dir.join("current_link_speed")).and_then(|s| link_speed(&s)),
        width: width("current_link_width"),
        max_speed_mts: read(&dir.join("max_link_speed")).and_then(|s| link_speed(&s)),
        max_width: width("max_link_width"),
    }
}

/// "32.0 GT/s PCIe" / "8 GT/s" -> MT/s; "Unknown" -> None.
pub(crate) fn link_speed(s: &str) -> Option<u32> {
    let mut it = s.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let ok = it.next()?.starts_with("GT/s") && v.is_finite() && v > 0.0 && v < 1e6;
    ok.then(|| (v * 1000.0).round() as u32)
}

/// "400 Gb/sec (4X NDR)" -> 400000 Mb/s.
pub(crate) fn rate(s: &str) -> Option<u64> {
    let mut it = s.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let ok = it.next()?.starts_with("Gb/s") && (0.0..1e9).contains(&v);
    ok.then(|| (v * 1000.0).round() as u64)
}

/// "4: ACTIVE" -> Active (by the number; the text is kept when the number is unknown).
pub(crate) fn port_state(s: &str) -> PortState {
    match s.split(':').next().map(str::trim) {
        Some("1") => PortState::Down,
        Some("2") => PortState::Init,
        Some("3") => PortState::Armed,
        Some("4") => PortState::Active,
        Some("5") => PortState::ActiveDefer,
        _ => PortState::Unknown(s.to_string()),
    }
}

/// "0-47,96-143" -> [0..=47, 96..=143]; `None` on garbage; at most [`MAX_CPUS`] entries.
pub(crate) fn cpulist(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
            None => {
                let a = part.parse::<u32>().ok()?;
                (a, a)
            }
        };
        if a > b {
            return None;
        }
        out.extend((a..=b).take(MAX_CPUS - out.len().min(MAX_CPUS)));
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// (domain, bus, device, function) of "dddd:bb:dd.f" (domain of 4 or more hex digits).
pub(crate) fn bdf_key(s: &str) -> Option<(u32, u32, u32, u32)> {
    let mut it = s.split(':');
    let (d, b, rest) = (it.next()?, it.next()?, it.next()?);
    let (dev, func) = rest.split_once('.')?;
    if it.next().is_some() || d.len() < 4 || b.len() != 2 || dev.len() != 2 || func.len() != 1 {
        return None;
    }
    let h = |x: &str| u32::from_str_radix(x, 16).ok();
    Some((h(d)?, h(b)?, h(dev)?, h(func)?))
}

/// The PCIe place of a device directory (or symlink to it): resolved under `devices`
/// (`sys/devices`, canonical), the first `pci<domain>:<bus>` component is the host bridge and
/// the PCI addresses after it the chain.
fn pci_path(dev: &Path, devices: &Path) -> Option<PciPath> {
    let real = fs::canonicalize(dev).ok()?;
    let rel = real.strip_prefix(devices).ok()?;
    let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let hb = parts.iter().position(|p| p.starts_with("pci") && p.contains(':'))?;
    let chain: Vec<String> = parts[hb + 1..].iter().take_while(|p| bdf_key(p).is_some()).cloned().collect();
    if chain.is_empty() {
        return None;
    }
    Some(PciPath { host_bridge: parts[hb].clone(), chain })
}
