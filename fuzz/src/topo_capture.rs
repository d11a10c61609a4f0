//! `topo_capture`: `mori topo --input FILE` and `mori peer-bw --topo FILE`: a captured
//! `nvidia-smi topo -m` or `rocm-smi --showtopo` matrix ([`parse_capture`], the vendor's
//! parser), then what the commands do with it (render, JSON, worst class in a group).
//!
//! Input: `[vendor] [group] text...` (the text read lossily as UTF-8, as any bytes may be in
//! a file). Asserted for a matrix that parses: its shape invariants hold
//! ([`TopoMatrix::validate`]); it renders and serializes; the pair counts cover the
//! `n(n-1)/2` GPU pairs; the worst class of the whole group, and of the group the second
//! byte picks, is found, named by pairs inside the group; and auto-detection gives what the
//! detected vendor's parser gives.

use mori_cli::class::TopoMatrix;
use mori_cli::topo::{parse_capture, Vendor};
use mori_cli::{parse_nvidia, parse_rocm};

fn group_check(m: &TopoMatrix, group: &[usize]) {
    let v = m.worst_class_in_group(group).expect("a group of distinct GPUs in range has a verdict");
    for &(a, b) in &v.worst_pairs {
        assert!(a < b && group.contains(&a) && group.contains(&b), "pair ({a}, {b}) is not in the group {group:?}");
        assert_eq!(m.gpu_gpu[a][b].max(m.gpu_gpu[b][a]), v.worst, "pair ({a}, {b}) is not of the worst class");
    }
}

/// One input.
pub fn run(data: &[u8]) {
    let mut c = crate::Cursor::new(data);
    let (vendor, group) = (c.u8(), c.u8());
    let text = String::from_utf8_lossy(c.rest());
    let vendor = [Vendor::Auto, Vendor::Nvidia, Vendor::Amd][usize::from(vendor % 3)];
    let r = parse_capture(&text, vendor);
    if vendor == Vendor::Auto {
        let detected = if parse_rocm::looks_like(&text) {
            Some(Vendor::Amd)
        } else if parse_nvidia::looks_like(&text) {
            Some(Vendor::Nvidia)
        } else {
            None
        };
        match detected {
            Some(v) => {
                let explicit = parse_capture(&text, v);
                assert_eq!(r.as_ref().ok(), explicit.as_ref().ok(), "auto-detection parses differently from {v:?}");
            }
            None => assert!(r.is_err(), "auto-detection parsed a capture of no vendor"),
        }
    }
    let Ok(m) = r else { return };
    m.validate().expect("a parsed matrix keeps its shape invariants");
    let n = m.gpus.len();
    let _ = m.render();
    serde_json::to_string(&m).expect("a parsed matrix serializes");
    let pairs: usize = m.pair_counts().iter().map(|(_, k)| k).sum();
    assert_eq!(pairs, n * (n - 1) / 2, "pair counts of {n} GPUs");
    group_check(&m, &(0..n).collect::<Vec<_>>());
    let some: Vec<usize> = (0..n).filter(|i| group >> (i % 8) & 1 == 1).collect();
    if !some.is_empty() {
        group_check(&m, &some);
    }
}

/// The captures of crates/cli/tests/data (built in, so the binaries write them anywhere).
pub fn seeds() -> Vec<Vec<u8>> {
    let caps: [(u8, &str); 7] = [
        (0, include_str!("../../crates/cli/tests/data/nvidia_1gpu_h200_captured.txt")),
        (1, include_str!("../../crates/cli/tests/data/nvidia_2socket_nics.txt")),
        (0, include_str!("../../crates/cli/tests/data/nvidia_4gpu_pcie.txt")),
        (0, include_str!("../../crates/cli/tests/data/nvidia_8gpu_nvswitch.txt")),
        (2, include_str!("../../crates/cli/tests/data/rocm_4gpu_pcie_2socket.txt")),
        (0, include_str!("../../crates/cli/tests/data/rocm_8gpu_xgmi.txt")),
        (1, "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\tPIX\t0-7\t0\nGPU1\tNV4\t X \tSYS\t8-15\t1\nNIC0\tPIX\tSYS\t X\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"),
    ];
    caps.iter().map(|(v, t)| [&[*v, 0b0101][..], t.as_bytes()].concat()).collect()
}

/// Words of the two vendors' outputs.
pub fn dict() -> Vec<&'static str> {
    vec![
        "GPU0",
        "GPU1",
        "GPU7",
        "NIC0",
        "NIC1",
        " X ",
        "NV18",
        "NV4",
        "NV1",
        "PIX",
        "PXB",
        "PHB",
        "NODE",
        "SYS",
        "SOC",
        "N/A",
        "CPU Affinity",
        "NUMA Affinity",
        "GPU NUMA ID",
        "Legend:",
        "NIC Legend:",
        "  NIC0: mlx5_0",
        "\x1b[4m",
        "\x1b[0m",
        "\t",
        "================",
        "ROCm System Management Interface",
        "(Topology) Numa Node: ",
        "(Topology) Numa Affinity: ",
        "Link Type between two GPUs",
        "Hops between two GPUs",
        "Weight between two GPUs",
        "Numa Node:",
        "Numa Affinity:",
        "GPU[0]",
        "GPU[1]",
        " : ",
        "XGMI",
        "PCIE",
        "0",
        "1",
        "15",
        "72",
    ]
}
