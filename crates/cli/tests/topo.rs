//! `mori topo` on captured matrices of four machine shapes (and a fifth, AMD PCIe) and on a
//! fake sysfs tree; unparseable input.

mod common;
use common::*;
use serde_json::Value;

fn classes(v: &Value, key: &str) -> Vec<Vec<String>> {
    v["topology"][key]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect())
        .collect()
}

fn topo_json(file: &str, group: &str) -> Value {
    let r = mori(&["topo", "--input", &data(file), "--group", group, "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.json()
}

#[test]
fn nvidia_8gpu_nvswitch() {
    let v = topo_json("nvidia_8gpu_nvswitch.txt", "0,1,2,3,4,5,6,7");
    assert_eq!(v["topology"]["source"], "nvidia-smi topo -m");
    let g = classes(&v, "gpu_gpu");
    assert_eq!(g.len(), 8);
    for (i, row) in g.iter().enumerate() {
        for (j, c) in row.iter().enumerate() {
            assert_eq!(c, if i == j { "self" } else { "direct-link" }, "GPU{i}-GPU{j}");
        }
    }
    assert_eq!(v["topology"]["gpu_gpu_raw"][0][7], "NV18");
    let nics: Vec<&str> = v["topology"]["nics"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(nics, ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11", "mlx5_1", "mlx5_7"]);
    let n = classes(&v, "gpu_nic");
    assert_eq!(
        n[0],
        [
            "pcie-switch",
            "pcie-host",
            "pcie-host",
            "pcie-host",
            "cross-socket",
            "cross-socket",
            "cross-socket",
            "cross-socket",
            "pcie-host",
            "cross-socket"
        ]
    );
    assert_eq!(n[5][5], "pcie-switch");
    assert_eq!(n[5][9], "pcie-host");
    let numa: Vec<u64> = v["topology"]["gpu_numa"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1]);
    assert_eq!(v["group"]["worst"], "direct-link");
    assert_eq!(v["group"]["worst_pairs"].as_array().unwrap().len(), 28);
}

#[test]
fn rocm_8gpu_xgmi_mesh() {
    let v = topo_json("rocm_8gpu_xgmi.txt", "0,4");
    assert_eq!(v["topology"]["source"], "rocm-smi --showtopo");
    let g = classes(&v, "gpu_gpu");
    assert!(g.iter().enumerate().all(|(i, r)| r.iter().enumerate().all(|(j, c)| c == if i == j { "self" } else { "direct-link" })));
    assert_eq!(v["topology"]["gpu_gpu_raw"][3][6], "XGMI/1");
    assert_eq!(v["topology"]["nics"].as_array().unwrap().len(), 0);
    assert_eq!(v["topology"]["gpu_numa"][4], 1);
    assert_eq!(v["group"]["worst"], "direct-link");
}

#[test]
fn nvidia_pcie_only_4gpu() {
    let v = topo_json("nvidia_4gpu_pcie.txt", "0,1");
    let g = classes(&v, "gpu_gpu");
    assert_eq!(g[0], ["self", "pcie-switch", "pcie-host", "pcie-host"]);
    assert_eq!(g[2][3], "pcie-switch");
    assert_eq!(classes(&v, "gpu_nic"), [["pcie-switch"], ["pcie-switch"], ["pcie-host"], ["pcie-host"]]);
    assert_eq!(v["group"]["worst"], "pcie-switch");
    // The whole node: PHB-class pairs are the worst; a launcher asking for direct links refuses.
    let r = mori(&["topo", "--input", &data("nvidia_4gpu_pcie.txt"), "--group", "0,1,2,3", "--max-class", "direct-link"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.contains("group [0, 1, 2, 3]: worst class pcie-host (GPU0-GPU2, GPU0-GPU3, GPU1-GPU2, GPU1-GPU3)"), "{}", r.stdout);
    assert!(r.stdout.contains("max class direct-link: EXCEEDED"), "{}", r.stdout);
}

#[test]
fn nvidia_two_socket_with_nics_on_both() {
    // Blank-separated capture (copied from a terminal), no GPU NUMA ID column.
    let v = topo_json("nvidia_2socket_nics.txt", "1,2");
    let g = classes(&v, "gpu_gpu");
    assert_eq!(g[0], ["self", "direct-link", "cross-socket", "cross-socket"]);
    assert_eq!(g[3], ["cross-socket", "cross-socket", "direct-link", "self"]);
    assert_eq!(
        classes(&v, "gpu_nic"),
        [
            ["pcie-switch", "cross-socket"],
            ["pcie-switch", "cross-socket"],
            ["cross-socket", "pcie-switch"],
            ["cross-socket", "pcie-switch"]
        ]
    );
    assert_eq!(v["topology"]["gpu_numa"], serde_json::json!([0, 0, 1, 1]));
    assert_eq!(v["group"]["worst"], "cross-socket");
    assert_eq!(v["group"]["worst_pairs"], serde_json::json!([[1, 2]]));
    let ok = mori(&["topo", "--input", &data("nvidia_2socket_nics.txt"), "--group", "2,3", "--max-class", "direct-link"]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
}

#[test]
fn rocm_pcie_two_socket_by_numa() {
    let v = topo_json("rocm_4gpu_pcie_2socket.txt", "0,1,2,3");
    let g = classes(&v, "gpu_gpu");
    assert_eq!(g[0], ["self", "direct-link", "cross-socket", "cross-socket"]);
    assert_eq!(g[2][3], "pcie-host");
    assert_eq!(v["topology"]["gpu_gpu_raw"][0][2], "PCIE/3");
    assert_eq!(v["group"]["worst"], "cross-socket");
    let r = mori(&["topo", "--input", &data("rocm_4gpu_pcie_2socket.txt"), "--vendor", "amd"]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("GPU pairs: direct-link 1, pcie-host 1, cross-socket 4"), "{}", r.stdout);
}

/// A real capture (one H200, driver 580): underlined header, an empty cell between the
/// NUMA Affinity and GPU NUMA ID values, no NIC.
#[test]
fn nvidia_1gpu_real_capture() {
    let v = topo_json("nvidia_1gpu_h200_captured.txt", "0");
    assert_eq!(v["topology"]["gpus"], serde_json::json!(["GPU0"]));
    assert_eq!(classes(&v, "gpu_gpu"), [["self"]]);
    assert_eq!(v["topology"]["gpu_numa"], serde_json::json!([0]));
    assert_eq!(v["topology"]["nics"], serde_json::json!([]));
    assert_eq!(v["group"]["worst"], "self");
}

#[test]
fn sysfs_tree() {
    let s = Scratch::new("topo-sysfs");
    two_socket_sysfs(&s.0);
    let r = mori(&["topo", "--sysfs-root", &s.path(""), "--json", "--group", "0,1"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = r.json();
    assert_eq!(v["topology"]["source"], "sysfs");
    assert_eq!(v["topology"]["gpus"], serde_json::json!(["0000:03:00.0", "0000:05:00.0", "0000:81:00.0"]));
    assert_eq!(classes(&v, "gpu_gpu")[0], ["self", "pcie-host", "cross-socket"]);
    assert_eq!(v["topology"]["nics"], serde_json::json!(["mlx5_0", "mlx5_1"]));
    assert_eq!(classes(&v, "gpu_nic"), [["pcie-switch", "cross-socket"], ["pcie-host", "cross-socket"], ["cross-socket", "pcie-host"]]);
    assert_eq!(v["topology"]["gpu_gpu_raw"][0][1], "SameHostBridge/6");
    assert_eq!(v["group"]["worst"], "pcie-host");
    assert!(v["topology"]["notes"][0].as_str().unwrap().contains("NVLink/xGMI links are not visible"));
    let refuse = mori(&["topo", "--sysfs-root", &s.path(""), "--group", "0,1", "--max-class", "pcie-switch"]);
    assert_eq!(refuse.code, 1);
    let empty = Scratch::new("topo-empty");
    std::fs::create_dir_all(empty.0.join("sys")).unwrap();
    mori(&["topo", "--sysfs-root", &empty.path("")]).assert_one_line_error(1, "sysfs shows no GPU");
}

#[test]
fn unparseable_inputs() {
    let s = Scratch::new("topo-bad");
    let cases = [
        ("garbage.txt", "hello\nworld\n", "no GPU matrix found"),
        ("empty.txt", "", "no GPU matrix found"),
        (
            "short-row.txt",
            "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-7\nGPU1\tNV4\n",
            "row GPU1 has 1 cells, the header lists 2 devices",
        ),
        ("missing-row.txt", "\tGPU0\tGPU1\nGPU0\t X \tNV4\n", "no row for GPU1"),
        (
            "rocm-short.txt",
            "=== Link Type between two GPUs ===\n       GPU0   GPU1\nGPU0   0      XGMI\nGPU1   XGMI\n",
            "expected GPU1 and 2 values",
        ),
        ("rocm-nolinks.txt", "==== ROCm System Management Interface ====\nnothing\n", "no \"Link Type between two GPUs\" matrix"),
        (
            "rocm-hops-size.txt",
            "=== Link Type between two GPUs ===\n  GPU0  GPU1\nGPU0  0  XGMI\nGPU1  XGMI  0\n=== Hops between two GPUs ===\n  GPU0\nGPU0  0\n",
            "the \"Hops between two GPUs\" matrix has 1 GPUs, the \"Link Type\" matrix 2",
        ),
    ];
    for (name, text, msg) in cases {
        std::fs::write(s.0.join(name), text).unwrap();
        mori(&["topo", "--input", &s.path(name)]).assert_one_line_error(2, msg);
    }
    std::fs::write(s.0.join("bin.txt"), [0xff, 0xfe, 0x00]).unwrap();
    mori(&["topo", "--input", &s.path("bin.txt")]).assert_one_line_error(2, "not UTF-8");
    mori(&["topo", "--input", &s.path("absent.txt")]).assert_one_line_error(2, "absent.txt");
    mori(&["topo", "--input", &data("nvidia_4gpu_pcie.txt"), "--vendor", "amd"]).assert_one_line_error(2, "rocm-smi");
    mori(&["topo", "--input", &data("rocm_8gpu_xgmi.txt"), "--vendor", "nvidia"]).assert_one_line_error(2, "nvidia-smi");
    mori(&["topo", "--input", &data("nvidia_4gpu_pcie.txt"), "--group", "0,9"]).assert_one_line_error(2, "GPU 9 does not exist");
    mori(&["topo", "--input", &data("nvidia_4gpu_pcie.txt"), "--group", "0,1", "--max-class", "fast"])
        .assert_one_line_error(2, "unknown link class");
}

#[test]
fn a_reader_that_goes_away_ends_mori_quietly_not_in_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/nvidia_8gpu_nvswitch.txt");
    // A child forked meanwhile by a parallel test can hold the pipe's read end until its exec,
    // letting a write through; so several attempts, of which none may panic and one at least
    // must end by SIGPIPE.
    let mut by_sigpipe = 0;
    for _ in 0..10 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mori"))
            .args(["topo", "--input", fixture, "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before mori writes a byte
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        match out.status.signal() {
            Some(libc::SIGPIPE) => by_sigpipe += 1,
            None => assert!(out.status.success(), "{:?} {err}", out.status),
            Some(sig) => panic!("ended by signal {sig}: {err}"),
        }
    }
    assert!(by_sigpipe > 0, "no attempt ended by SIGPIPE like other tools");
}
