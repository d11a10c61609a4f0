use std::collections::HashMap;
use std::time::Duration;

use super::*;

fn parse(pairs: &[(&str, &str)]) -> Result<BootstrapEnv, BootstrapError> {
    let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    BootstrapEnv::parse(&|k: &str| m.get(k).cloned())
}

fn err(pairs: &[(&str, &str)]) -> String {
    parse(pairs).unwrap_err().to_string()
}

#[test]
fn mori_vars_win() {
    let e = parse(&[
        ("MORI_RANK", "3"),
        ("MORI_WORLD_SIZE", "8"),
        ("MORI_MASTER_ADDR", "10.0.0.1"),
        ("MORI_MASTER_PORT", "20000"),
        ("RANK", "5"),
        ("WORLD_SIZE", "6"),
        ("MASTER_ADDR", "10.9.9.9"),
        ("MORI_BOOTSTRAP_TIMEOUT", "30"),
        ("MORI_SOCKET_IFNAME", "ens14np0"),
    ])
    .unwrap();
    assert_eq!(e.launcher, Launcher::Mori);
    assert_eq!((e.rank, e.world_size), (3, 8));
    assert_eq!((e.master_host.as_str(), e.master_port, e.master_var), ("10.0.0.1", 20000, "MORI_MASTER_ADDR"));
    assert_eq!((e.timeout, e.op_timeout), (Duration::from_secs(30), Duration::from_secs(30)));
    assert_eq!(e.ifname.as_deref(), Some("ens14np0"));
    assert_eq!(e.master_addr().unwrap(), "10.0.0.1:20000".parse().unwrap());
}

#[test]
fn mori_defaults_and_fallbacks() {
    let e = parse(&[("MORI_RANK", "0"), ("MORI_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")]).unwrap();
    assert_eq!((e.master_port, e.timeout), (DEFAULT_PORT, Duration::from_secs(300)));
    assert_eq!(e.master_var, "MASTER_ADDR");
    let m = err(&[("MORI_RANK", "0"), ("MORI_MASTER_ADDR", "h")]);
    assert!(m.contains("MORI_WORLD_SIZE is not set"), "{m}");
    let m = err(&[("MORI_RANK", "x1"), ("MORI_WORLD_SIZE", "2"), ("MORI_MASTER_ADDR", "h")]);
    assert!(m.contains("MORI_RANK=\"x1\""), "{m}");
    let m = err(&[("MORI_RANK", "0"), ("MORI_WORLD_SIZE", "2")]);
    assert!(m.contains("MORI_MASTER_ADDR"), "{m}");
    let m = err(&[("MORI_RANK", "2"), ("MORI_WORLD_SIZE", "2"), ("MORI_MASTER_ADDR", "h")]);
    assert!(m.contains("rank 2") && m.contains("world size 2"), "{m}");
    let m = err(&[("MORI_RANK", "0"), ("MORI_WORLD_SIZE", "2"), ("MORI_MASTER_ADDR", "h"), ("MORI_MASTER_PORT", "70000")]);
    assert!(m.contains("MORI_MASTER_PORT=\"70000\""), "{m}");
    let m = err(&[("MORI_RANK", "0"), ("MORI_WORLD_SIZE", "2"), ("MORI_MASTER_ADDR", "h"), ("MORI_BOOTSTRAP_TIMEOUT", "x")]);
    assert!(m.contains("MORI_BOOTSTRAP_TIMEOUT=\"x\""), "{m}");
}

#[test]
fn torchrun() {
    let base = [("RANK", "1"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "[::1]"), ("MASTER_PORT", "29500")];
    let e = parse(&base).unwrap();
    assert_eq!(e.launcher, Launcher::Torchrun);
    assert_eq!((e.rank, e.world_size, e.master_host.as_str(), e.master_port), (1, 4, "::1", 29500));
    assert_eq!(e.master_addr().unwrap(), "[::1]:29500".parse().unwrap());
    // torchrun's agent store holds MASTER_PORT: the bootstrap moves one up, unless told.
    let mut agent = base.to_vec();
    agent.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
    assert_eq!(parse(&agent).unwrap().master_port, 29501);
    agent.push(("MORI_MASTER_PORT", "18515"));
    assert_eq!(parse(&agent).unwrap().master_port, 18515);
    let m = err(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("MASTER_PORT", "29500")]);
    assert!(m.contains("MASTER_ADDR is not set"), "{m}");
    let m = err(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "abc")]);
    assert!(m.contains("MASTER_PORT=\"abc\""), "{m}");
}

#[test]
fn open_mpi() {
    let e = parse(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3"), ("MASTER_ADDR", "localhost"), ("SLURM_PROCID", "0")])
        .unwrap();
    assert_eq!(e.launcher, Launcher::OpenMpi);
    assert_eq!((e.rank, e.world_size, e.master_port), (2, 3, DEFAULT_PORT));
    assert!(e.master_addr().unwrap().ip().is_loopback());
    let m = err(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3")]);
    assert!(m.contains("MASTER_ADDR"), "{m}");
    let m = err(&[("OMPI_COMM_WORLD_RANK", "2"), ("MASTER_ADDR", "h")]);
    assert!(m.contains("OMPI_COMM_WORLD_SIZE is not set"), "{m}");
}

#[test]
fn slurm() {
    let e = parse(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_JOB_NODELIST", "gpu-[01-04,07],login1")]).unwrap();
    assert_eq!(e.launcher, Launcher::Slurm);
    assert_eq!((e.rank, e.world_size), (5, 8));
    assert_eq!((e.master_host.as_str(), e.master_port, e.master_var), ("gpu-01", DEFAULT_PORT, "SLURM_JOB_NODELIST"));
    let e = parse(&[("SLURM_PROCID", "0"), ("SLURM_NPROCS", "2"), ("SLURM_NODELIST", "n7"), ("MASTER_PORT", "1234")]).unwrap();
    assert_eq!((e.world_size, e.master_host.as_str(), e.master_port), (2, "n7", 1234));
    let e = parse(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NODELIST", "n[1-2]"), ("MASTER_ADDR", "10.1.1.1")]).unwrap();
    assert_eq!(e.master_host, "10.1.1.1");
    let m = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NODELIST", "gpu-[01-")]);
    assert!(m.contains("SLURM_JOB_NODELIST=\"gpu-[01-\""), "{m}");
    let m = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]);
    assert!(m.contains("SLURM_NODELIST is not set"), "{m}");
    let m = err(&[("SLURM_PROCID", "0"), ("SLURM_JOB_NODELIST", "a")]);
    assert!(m.contains("SLURM_NPROCS is not set"), "{m}");
}

#[test]
fn nothing_set() {
    let m = err(&[]);
    assert!(m.contains("no launcher found"), "{m}");
    // Empty values count as unset.
    let m = err(&[("MORI_RANK", ""), ("RANK", " ")]);
    assert!(m.contains("no launcher found"), "{m}");
}

#[test]
fn unresolvable_host_names_the_variable() {
    // A label over 63 bytes is rejected by the resolver itself, without any DNS traffic.
    let host = format!("{}.invalid", "x".repeat(300));
    let e = parse(&[("MORI_RANK", "0"), ("MORI_WORLD_SIZE", "2"), ("MORI_MASTER_ADDR", &host)]).unwrap();
    let m = e.master_addr().unwrap_err().to_string();
    assert!(m.starts_with("invalid bootstrap configuration: MORI_MASTER_ADDR=\"xxx"), "{m}");
}

#[test]
fn brackets_around_nothing_are_no_host() {
    // Found by the env_strings fuzz target: `[` alone used to give an empty master host.
    for h in ["[", "[]", "[ ]", "]]"] {
        let m = err(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2"), ("MASTER_ADDR", h)]);
        assert!(m.contains(&format!("MASTER_ADDR={h:?} names no host")), "{m}");
    }
    let e = parse(&[("MORI_RANK", "0"), ("MORI_WORLD_SIZE", "1"), ("MORI_MASTER_ADDR", "[::1]")]).unwrap();
    assert_eq!(e.master_host, "::1");
}
