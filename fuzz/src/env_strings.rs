//! `env_strings`: the parsers of user strings from the environment and the command line:
//! launcher variables ([`BootstrapEnv::parse`], Slurm host lists, timeouts), addresses,
//! `MORI_RDMA_DEVICES`, `MORI_FABRIC_DOMAIN` / `MORI_IO_FABRIC_HANDLE`, on/off switches, and
//! the `mori` command's sizes, GPU groups and link classes.
//!
//! Input: `[parser] text...` (lossy UTF-8). Asserted for what parses: a Slurm host is one
//! non-empty name; a timeout is positive and at most 1e9 s; a launcher environment has its
//! rank below its world size and a non-zero port; a device filter allows exactly what it
//! lists (or everything else); an address literal, printed, parses to itself; sizes are
//! positive, sorted and distinct; a link class's name parses back to it; a fabric domain
//! printed as `cluster:clique` parses back to itself.

use mori_bootstrap::{addr, parse_secs, slurm_first_host, BootstrapEnv};
use mori_cli::class::{parse_group, LinkClass};
use mori_cli::gpu::{parse_size, parse_sizes};
use mori_io_fabric::{FabricDomain, HandleType};
use mori_topo::DeviceFilter;

/// One input.
pub fn run(data: &[u8]) {
    let mut c = crate::Cursor::new(data);
    let which = c.u8() % 9;
    let s = String::from_utf8_lossy(c.rest());
    let s = s.as_ref();
    match which {
        0 => {
            if let Ok(h) = slurm_first_host(s) {
                assert!(!h.is_empty() && !h.contains([',', '[', ']']), "first host {h:?} of {s:?}");
            }
        }
        1 => {
            if let Ok(d) = parse_secs("MORI_BOOTSTRAP_TIMEOUT", s) {
                assert!(!d.is_zero() && d.as_secs_f64() <= 1e9 + 1.0, "{s:?} gives {d:?}");
            }
        }
        2 => {
            // KEY=VALUE lines.
            let vars: Vec<(&str, &str)> = s.lines().filter_map(|l| l.split_once('=')).collect();
            let get = |k: &str| vars.iter().rev().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
            if let Ok(e) = BootstrapEnv::parse(&get) {
                assert!(e.rank < e.world_size, "rank {} of {}", e.rank, e.world_size);
                assert!(e.master_port != 0 && !e.master_host.is_empty(), "{e:?}");
            }
        }
        3 => {
            if let Ok(Some(f)) = DeviceFilter::parse(s) {
                let (names, include) = match &f {
                    DeviceFilter::Include(v) => (v, true),
                    DeviceFilter::Exclude(v) => (v, false),
                };
                assert!(!names.is_empty(), "{s:?}: empty filter");
                for n in names {
                    assert!(!n.is_empty() && !n.contains(|c: char| c.is_whitespace() || ":/^,".contains(c)), "device name {n:?}");
                    assert_eq!(f.allows(n), include, "{f:?} on {n:?}");
                }
            }
        }
        4 => {
            let _ = addr::unbracket(s);
            if let Some(ip) = addr::literal(s) {
                assert_eq!(addr::literal(&ip.to_string()), Some(ip), "{s:?} -> {ip}");
                let _ = (addr::is_unspecified(ip), addr::is_loopback(ip));
            }
        }
        5 => {
            if let Ok(v) = parse_size(s) {
                assert!(v >= 1);
            }
            if let Ok(v) = parse_sizes(s) {
                assert!(!v.is_empty() && v.windows(2).all(|w| w[0] < w[1]) && v[0] >= 1, "{s:?} -> {v:?}");
            }
        }
        6 => {
            let _ = parse_group(s);
            if let Ok(c) = LinkClass::parse(s) {
                assert_eq!(LinkClass::parse(c.name()).ok(), Some(c));
            }
        }
        7 => {
            let _ = HandleType::parse(s);
            if let Ok(d) = FabricDomain::parse_fabric(s) {
                let FabricDomain::Fabric { cluster, clique } = &d else { panic!("{d:?} from parse_fabric") };
                assert!(!cluster.is_empty());
                assert_eq!(FabricDomain::parse_fabric(&format!("{cluster}:{clique}")).ok(), Some(d.clone()), "{s:?}");
            }
        }
        _ => {
            let _ = mori_io_core::status::parse_switch(s);
        }
    }
}

/// A valid value for each parser.
pub fn seeds() -> Vec<Vec<u8>> {
    let vals: [(u8, &str); 14] = [
        (0, "gpu-[01-04,07],login1"),
        (0, "r[1-2]-n[3,5]"),
        (1, "2.5"),
        (2, "MORI_RANK=1\nMORI_WORLD_SIZE=4\nMORI_MASTER_ADDR=10.0.0.1\nMORI_MASTER_PORT=18515\n"),
        (2, "SLURM_PROCID=3\nSLURM_NTASKS=8\nSLURM_JOB_NODELIST=node[01-04]\nMORI_BOOTSTRAP_TIMEOUT=30\n"),
        (2, "OMPI_COMM_WORLD_RANK=0\nOMPI_COMM_WORLD_SIZE=2\nMASTER_ADDR=[fe80::1]\nMASTER_PORT=29500\n"),
        (2, "RANK=0\nWORLD_SIZE=2\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\nMORI_SOCKET_IFNAME=eth0\n"),
        (3, "^mlx5_0, mlx5_1"),
        (4, "[::ffff:0.0.0.0]"),
        (5, "4096,1MiB, 2GB,16k"),
        (6, "pcie-switch"),
        (7, "5C1E2B3A-0000-4000-8000-000000000001:7"),
        (7, "posix-fd"),
        (8, " On "),
    ];
    vals.iter().map(|(k, v)| crate::tagged(*k, v.as_bytes())).collect()
}

/// Variable names and value shapes.
pub fn dict() -> Vec<&'static str> {
    vec![
        "MORI_RANK=",
        "MORI_WORLD_SIZE=",
        "MORI_MASTER_ADDR=",
        "MORI_MASTER_PORT=",
        "RANK=",
        "WORLD_SIZE=",
        "LOCAL_RANK=",
        "MASTER_ADDR=",
        "MASTER_PORT=",
        "OMPI_COMM_WORLD_RANK=",
        "OMPI_COMM_WORLD_SIZE=",
        "SLURM_PROCID=",
        "SLURM_NTASKS=",
        "SLURM_NPROCS=",
        "SLURM_JOB_NODELIST=",
        "SLURM_NODELIST=",
        "MORI_BOOTSTRAP_TIMEOUT=",
        "MORI_BOOTSTRAP_OP_TIMEOUT=",
        "MORI_SOCKET_IFNAME=",
        "\n",
        "[",
        "]",
        "-",
        ",",
        ":",
        "::",
        "::ffff:",
        "127.0.0.1",
        "%eth0",
        "^",
        "MiB",
        "GiB",
        "KB",
        "self",
        "direct-link",
        "pcie-host",
        "fabric",
        "posix_fd",
    ]
}
