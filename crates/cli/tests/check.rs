//! `mori check` on a fake two-socket sysfs tree, with the live engine probes of this machine.

mod common;
use common::*;
use serde_json::Value;

fn verdict<'a>(v: &'a Value, backend: &str, memory: &str) -> &'a Value {
    v["backends"].as_array().unwrap().iter().find(|b| b["backend"] == backend && b["memory"] == memory).unwrap()
}

#[test]
fn devices_links_numa_env() {
    let s = Scratch::new("check");
    two_socket_sysfs(&s.0);
    let env = [("MORI_RDMA_DEVICES", "^mlx5_1"), ("MORI_IO_TCP_TIMEOUT_MS", "5000"), ("MORI_RDMA_DEVICE", "mlx5_0")];
    let r = mori_env(&["check", "--sysfs-root", &s.path(""), "--json"], &env);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = r.json();
    // RDMA devices from sysfs: one active port out of two devices.
    assert_eq!(v["rdma_devices"][0]["name"], "mlx5_0");
    assert_eq!(v["rdma_devices"][0]["ports"][0], "1: ACTIVE 400 Gb/s Ethernet");
    assert_eq!(v["rdma_devices"][1]["ports"][0], "1: DOWN 400 Gb/s Ethernet");
    assert_eq!(v["rdma_devices"][1]["numa"], 1);
    assert_eq!(v["active_rdma_ports"], 1);
    assert_eq!(v["libibverbs"]["name"], "libibverbs.so.1");
    // GPUs: PCIe link against maximum; the x8 one is named.
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 3, "the ASPEED console is not a GPU");
    assert_eq!(gpus[0]["vendor"], "NVIDIA");
    assert_eq!(gpus[0]["link"]["current"], "Gen5 x16");
    assert_eq!(gpus[0]["link"]["below_max"], Value::Null);
    assert_eq!(gpus[2]["numa"], 1);
    assert_eq!(gpus[2]["link"]["current"], "Gen5 x8");
    assert_eq!(gpus[2]["link"]["max"], "Gen5 x16");
    assert!(gpus[2]["link"]["below_max"].as_str().unwrap().starts_with("width x8 of x16"));
    assert_eq!(v["numa_nodes"], serde_json::json!([{"id": 0, "cpus": 32}, {"id": 1, "cpus": 32}]));
    // GPU runtime: said plainly, not faked (this test runs without a GPU in CI; on a machine
    // with one, tests/gpu.rs checks the runtime's report).
    let g = &v["gpu_runtime"];
    assert_eq!(g["in_build"], true);
    assert_eq!(g["driver_files"], serde_json::json!(["/proc/driver/nvidia/version", "/dev/nvidiactl"]));
    if gpu_runtime_present() {
        assert_eq!(g["available"], true, "{g}");
    } else {
        assert_eq!(g["available"], false, "{g}");
        let note = g["note"].as_str().unwrap();
        assert!(note.starts_with("no GPU runtime on this machine"), "{note}");
        let err = g["error"].as_str().unwrap();
        assert!(err.starts_with("no GPU runtime") && err.contains("libcuda") && err.contains("libamdhip64"), "{err}");
        assert_eq!(g["ipc"], "not queried: needs the GPU runtime");
        assert_eq!(g["fabric"], "not queried: needs the GPU runtime");
        assert_eq!((g["device_count"].as_u64(), g["devices"].as_array().map(Vec::len)), (Some(0), Some(0)));
        let text = mori(&["check", "--sysfs-root", &s.path("")]);
        assert!(text.stdout.contains("GPU runtime\n  no GPU runtime on this machine"), "{}", text.stdout);
    }
    // Environment in effect, typo flagged.
    let env: Vec<(String, String)> = v["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["note"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(env.len(), 3, "{env:?}");
    assert_eq!(env[0].0, "MORI_IO_TCP_TIMEOUT_MS");
    assert_eq!((env[1].0.as_str(), env[1].1.as_str()), ("MORI_RDMA_DEVICE", "not read by any mori-rs crate (typo?)"));
    assert!(env[2].1.contains("mori-topo"), "{env:?}");
}

#[test]
fn backend_verdicts_and_exit_status() {
    let s = Scratch::new("check-backends");
    two_socket_sysfs(&s.0);
    let root = s.path("");
    let v = mori(&["check", "--sysfs-root", &root, "--json"]).json();
    let names: Vec<(&str, &str)> =
        v["backends"].as_array().unwrap().iter().map(|b| (b["backend"].as_str().unwrap(), b["memory"].as_str().unwrap())).collect();
    assert_eq!(names[..4], [("xgmi", "host"), ("xgmi", "gpu"), ("fabric", "host"), ("fabric", "gpu")]);
    assert_eq!(verdict(&v, "tcp", "host")["serves"], true);
    assert_eq!(verdict(&v, "tcp", "host")["reason"], "the engine chose tcp for a host -> host pair");
    let gpu = verdict(&v, "tcp", "gpu");
    assert_eq!(gpu["serves"], false);
    assert!(gpu["reason"].as_str().unwrap().contains("needs a GPU backend"), "{gpu}");
    let gpu_here = gpu_runtime_present();
    for m in ["host", "gpu"] {
        if !gpu_here {
            // No GPU runtime on this machine (or CI): the GPU backends cannot even be created,
            // and say why.
            for b in ["xgmi", "fabric"] {
                assert_eq!(verdict(&v, b, m)["serves"], false);
                let reason = verdict(&v, b, m)["reason"].as_str().unwrap();
                assert!(reason.contains("no GPU runtime") && reason.contains("libcuda"), "{b}: {reason}");
            }
        }
    }
    // fabric never serves host memory.
    assert_eq!(verdict(&v, "fabric", "host")["serves"], false);
    // xgmi never serves host memory; with a runtime it says why in its own words.
    assert_eq!(verdict(&v, "xgmi", "host")["serves"], false);
    // Exit status follows the requested backend.
    let ok = mori(&["check", "--sysfs-root", &root, "--backend", "tcp"]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(ok.stdout.contains("requested: tcp for host memory: CAN work"), "{}", ok.stdout);
    let no = mori(&["check", "--sysfs-root", &root, "--backend", "xgmi", "--json"]);
    assert_eq!(no.code, 1);
    assert_eq!(no.json()["requested"]["ok"], false);
    assert_eq!(mori(&["check", "--sysfs-root", &root, "--backend", "tcp", "--memory", "gpu"]).code, 1);
    // rdma depends on this machine (libibverbs, an active port): the exit status must agree
    // with the verdict either way.
    let rd = mori(&["check", "--sysfs-root", &root, "--backend", "rdma", "--json"]);
    let serves = verdict(&rd.json(), "rdma", "host")["serves"].as_bool().unwrap();
    assert_eq!(rd.code, if serves { 0 } else { 1 });
    // A bad MORI_RDMA_DEVICES is reported, and the rdma backend refuses with the same reason.
    let bad = mori_env(&["check", "--sysfs-root", &root, "--json"], &[("MORI_RDMA_DEVICES", "mlx5_0,,x")]);
    let bv = bad.json();
    assert!(bv["env"][0]["note"].as_str().unwrap().starts_with("INVALID: MORI_RDMA_DEVICES"));
    assert_eq!(verdict(&bv, "rdma", "host")["serves"], false);
    assert!(verdict(&bv, "rdma", "host")["reason"].as_str().unwrap().contains("device name 2 is empty"));
    mori(&["check", "--sysfs-root", "/nonexistent-root-for-mori-test"]).assert_one_line_error(2, "no sysfs under");
}

#[test]
fn env_values_are_checked_against_what_their_readers_accept() {
    let vars = [
        ("MORI_IB_GID_INDEX", "abc"),
        ("MORI_IO_SL", "20"),
        ("MORI_IO_TC", "106"),
        ("MORI_IO_FABRIC_HANDLE", "bogus"),
        ("MORI_FABRIC_DOMAIN", "nocolon"),
        ("MORI_FABRIC_DOMAIN_TYPO", "x"),
        ("MORI_IO_POLL_SPIN_US", "100"),
        ("MORI_RDMA_DEVICES", "^mlx5_0,mlx5_1"),
        ("MORI_IO_CALLER_PROGRESS", "maybe"),
        ("HOME", "/root"),
    ];
    let env = mori_cli::check::env_in_effect(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let note = |name: &str| env.iter().find(|e| e.name == name).map(|e| e.note.clone()).unwrap_or_default();
    assert_eq!(note("MORI_IB_GID_INDEX"), "INVALID: \"abc\" is not a non-negative integer");
    assert_eq!(note("MORI_IO_SL"), "INVALID: 20 is outside 0..=15");
    assert!(!note("MORI_IO_TC").starts_with("INVALID"), "{}", note("MORI_IO_TC"));
    assert!(note("MORI_IO_FABRIC_HANDLE").contains("INVALID") && note("MORI_IO_FABRIC_HANDLE").contains("posix-fd or fabric"));
    assert!(note("MORI_FABRIC_DOMAIN").contains("INVALID") && note("MORI_FABRIC_DOMAIN").contains("<cluster uuid>:<clique id>"));
    assert_eq!(note("MORI_FABRIC_DOMAIN_TYPO"), "not read by any mori-rs crate (typo?)");
    assert!(note("MORI_IO_POLL_SPIN_US").contains("mori-io-rdma"));
    assert!(!note("MORI_RDMA_DEVICES").starts_with("INVALID"));
    assert_eq!(note("MORI_IO_CALLER_PROGRESS"), "INVALID: \"maybe\" is not one of 1, 0, true, false, on, off, yes, no");
    let ok = mori_cli::check::env_in_effect(std::iter::once(("MORI_IO_CALLER_PROGRESS".to_string(), "0".to_string())));
    assert!(ok[0].note.contains("waiters poll completions themselves") && ok[0].note.ends_with("off here"), "{}", ok[0].note);
    assert!(env.iter().all(|e| e.name != "HOME"));
    // The limits are the readers' own: the bootstrap takes decimal seconds up to 1e9, the rdma
    // backend a spin of at most 10 s.
    let more = [
        ("MORI_BOOTSTRAP_TIMEOUT", "2.5"),
        ("MORI_BOOTSTRAP_OP_TIMEOUT", "1e10"),
        ("MORI_IO_POLL_SPIN_US", "10000001"),
        ("MORI_BENCH_SPLIT", "1"),
    ];
    let env = mori_cli::check::env_in_effect(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let note = |name: &str| env.iter().find(|e| e.name == name).map(|e| e.note.clone()).unwrap_or_default();
    assert!(!note("MORI_BOOTSTRAP_TIMEOUT").starts_with("INVALID"), "{}", note("MORI_BOOTSTRAP_TIMEOUT"));
    assert!(
        note("MORI_BOOTSTRAP_OP_TIMEOUT").starts_with("INVALID")
            && note("MORI_BOOTSTRAP_OP_TIMEOUT").contains("not a number of seconds from 0.000001 to 1e9")
    );
    assert_eq!(note("MORI_IO_POLL_SPIN_US"), "INVALID: 10000001 is outside 0..=10000000");
    assert!(note("MORI_BENCH_SPLIT").contains("mori-bench"), "{}", note("MORI_BENCH_SPLIT"));
}

#[test]
fn gid_index_is_checked() {
    let s = Scratch::new("check-gid");
    two_socket_sysfs(&s.0);
    let root = s.path("");
    let run = |env: &[(&str, &str)]| mori_env(&["check", "--sysfs-root", &root, "--json"], env);
    let unset = run(&[]);
    assert_eq!(unset.code, 0, "{}", unset.stderr);
    assert_eq!(unset.json()["rdma_gid_index"], serde_json::json!({"mode": "auto"}));
    let good = run(&[("MORI_IB_GID_INDEX", "3")]).json();
    assert_eq!(good["rdma_gid_index"], serde_json::json!({"mode": "fixed", "index": 3}));
    assert_eq!(good["env"][0]["note"], "GID index override (mori-io-rdma)");
    for (v, why) in [("256", "256 is outside 0..=255"), ("x1", "\"x1\" is not a non-negative integer")] {
        let bad = run(&[("MORI_IB_GID_INDEX", v)]).json();
        assert_eq!(bad["env"][0]["note"], format!("INVALID: {why}"), "{v}");
        assert_eq!(bad["rdma_gid_index"], serde_json::json!({"mode": "invalid", "why": format!("MORI_IB_GID_INDEX: {why}")}));
    }
    let text = mori_env(&["check", "--sysfs-root", &root], &[("MORI_IB_GID_INDEX", "256")]);
    assert!(text.stdout.contains("  GID index: INVALID: MORI_IB_GID_INDEX: 256 is outside 0..=255\n"), "{}", text.stdout);
    assert!(text.stdout.contains("  MORI_IB_GID_INDEX=256  (INVALID: 256 is outside 0..=255)\n"), "{}", text.stdout);
}
