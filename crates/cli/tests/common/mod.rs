//! Helpers of the `mori` integration tests: run the binary, read fixtures, build a fake sysfs.

#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What one run of `mori` gave back.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// stdout as JSON (panics with the output when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }

    /// Asserts a one-line error with exit status `code`, no panic or backtrace.
    pub fn assert_one_line_error(&self, code: i32, contains: &str) {
        assert_eq!(self.code, code, "stdout: {}\nstderr: {}", self.stdout, self.stderr);
        assert_eq!(self.stderr.lines().count(), 1, "{}", self.stderr);
        assert!(self.stderr.contains(contains), "{}", self.stderr);
        assert!(!self.stderr.contains("panicked") && !self.stderr.contains("backtrace"), "{}", self.stderr);
        assert!(self.stdout.is_empty(), "{}", self.stdout);
    }
}

/// The `mori` binary: `$MORI_BIN` when set (a test binary carried to another machine, where
/// the build directory of this one does not exist), else the one cargo built with this test.
pub fn mori_bin() -> PathBuf {
    std::env::var_os("MORI_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mori")))
}

/// Whether a GPU runtime (libcuda or libamdhip64) loads on this machine: the checks that
/// assert the no-runtime report only hold without one.
pub fn gpu_runtime_present() -> bool {
    mori_gpu::detect().is_ok()
}

/// Runs `mori args...` with extra environment variables (and every `MORI_*` of the test's
/// own environment removed, so results do not depend on the caller's shell).
pub fn mori_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = Command::new(mori_bin());
    c.args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("MORI_") && k != "MORI_BIN") {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run mori");
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs `mori args...`.
pub fn mori(args: &[&str]) -> Run {
    mori_env(args, &[])
}

/// Path of a file under `tests/data`.
pub fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name).display().to_string()
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("mori-cli-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    pub fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn write(p: &Path, s: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, s).unwrap();
}

/// A PCI function at `sys/devices/<hb>/<chain...>` with the given files, linked from
/// `sys/bus/pci/devices/<last>`; returns its directory.
fn pci(root: &Path, hb: &str, chain: &[&str], files: &[(&str, &str)]) -> PathBuf {
    let mut dir = root.join("sys/devices").join(hb);
    for c in chain {
        dir = dir.join(c);
    }
    for (f, v) in files {
        write(&dir.join(f), &format!("{v}\n"));
    }
    let bus = root.join("sys/bus/pci/devices");
    fs::create_dir_all(&bus).unwrap();
    symlink(&dir, bus.join(chain[chain.len() - 1])).unwrap();
    dir
}

fn gpu_files<'a>(numa: &'a str, width: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("class", "0x030200"),
        ("vendor", "0x10de"),
        ("numa_node", numa),
        ("current_link_speed", "32.0 GT/s PCIe"),
        ("current_link_width", width),
        ("max_link_speed", "32.0 GT/s PCIe"),
        ("max_link_width", "16"),
    ]
}

fn nic(root: &Path, name: &str, dev: &Path, state: &str) {
    let d = root.join("sys/class/infiniband").join(name);
    fs::create_dir_all(&d).unwrap();
    symlink(dev, d.join("device")).unwrap();
    write(&d.join("ports/1/state"), state);
    write(&d.join("ports/1/rate"), "400 Gb/sec (4X NDR)");
    write(&d.join("ports/1/link_layer"), "Ethernet");
}

/// Two sockets. Socket 0 (host bridge pci0000:00): GPU 0000:03:00.0 and NIC mlx5_0 (ACTIVE)
/// under one PCIe switch, GPU 0000:05:00.0 on another root port. Socket 1 (pci0000:80): GPU
/// 0000:81:00.0 trained to x8 of x16, NIC mlx5_1 (DOWN) on another root port. Plus an ASPEED
/// BMC console (not a GPU), NUMA nodes 0 and 1, and NVIDIA driver files.
pub fn two_socket_sysfs(root: &Path) {
    let sw = ["0000:00:01.0", "0000:01:00.0"];
    pci(root, "pci0000:00", &[sw[0], sw[1], "0000:02:00.0", "0000:03:00.0"], &gpu_files("0", "16"));
    let n0 = pci(
        root,
        "pci0000:00",
        &[sw[0], sw[1], "0000:02:01.0", "0000:04:00.0"],
        &[("class", "0x020000"), ("vendor", "0x15b3"), ("numa_node", "0")],
    );
    pci(root, "pci0000:00", &["0000:00:02.0", "0000:05:00.0"], &gpu_files("0", "16"));
    pci(root, "pci0000:00", &["0000:00:1c.0", "0000:06:00.0"], &[("class", "0x030000"), ("vendor", "0x1a03")]);
    pci(root, "pci0000:80", &["0000:80:01.0", "0000:81:00.0"], &gpu_files("1", "8"));
    let n1 = pci(root, "pci0000:80", &["0000:80:02.0", "0000:82:00.0"], &[("class", "0x020000"), ("vendor", "0x15b3"), ("numa_node", "1")]);
    nic(root, "mlx5_0", &n0, "4: ACTIVE");
    nic(root, "mlx5_1", &n1, "1: DOWN");
    write(&root.join("sys/devices/system/node/node0/cpulist"), "0-15,32-47");
    write(&root.join("sys/devices/system/node/node1/cpulist"), "16-31,48-63");
    write(&root.join("proc/driver/nvidia/version"), "NVRM version: fixture");
    write(&root.join("dev/nvidiactl"), "");
}
