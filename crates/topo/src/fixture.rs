//! Test-only builder of sysfs trees in a temp directory, laid out as Linux does: PCI functions
//! under `sys/devices/pci<dom>:<bus>/...`, `sys/bus/pci/devices/<bdf>` links to them, RDMA
//! devices under their PCI function with `sys/class/infiniband/<name>` links and a `device`
//! link back.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A sysfs tree under a fresh temp directory, removed on drop.
pub struct Fixture {
    pub root: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// Mellanox/NVIDIA networking vendor id.
pub const MLX: u16 = 0x15b3;
/// PCIe switch (bridge) vendor used for bridges (Broadcom/PLX).
const PLX: u16 = 0x10b5;

impl Fixture {
    pub fn new(tag: &str) -> Fixture {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("mori-topo-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("sys/devices")).unwrap();
        Fixture { root }
    }

    pub fn write(&self, rel: &str, content: impl AsRef<[u8]>) {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    pub fn link(&self, rel: &str, target: &str) {
        let p = self.root.join(rel);
        if fs::symlink_metadata(&p).is_ok() {
            return; // shared bridges are declared once per child
        }
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        symlink(target, p).unwrap();
    }

    /// A PCI function at `path` (below `sys/devices`, e.g.
    /// `pci0000:00/0000:00:01.0/0000:01:00.0`) with its class, vendor, NUMA node and link.
    pub fn pci(&self, path: &str, class: u32, vendor: u16, numa: i32, speed: &str, width: u32) {
        let dir = format!("sys/devices/{path}");
        self.write(&format!("{dir}/class"), format!("0x{class:06x}\n"));
        self.write(&format!("{dir}/vendor"), format!("0x{vendor:04x}\n"));
        self.write(&format!("{dir}/numa_node"), format!("{numa}\n"));
        for (f, v) in [("current_link_speed", speed), ("max_link_speed", speed)] {
            self.write(&format!("{dir}/{f}"), format!("{v}\n"));
        }
        for f in ["current_link_width", "max_link_width"] {
            self.write(&format!("{dir}/{f}"), format!("{width}\n"));
        }
        let bdf = Path::new(path).file_name().unwrap().to_string_lossy().into_owned();
        self.link(&format!("sys/bus/pci/devices/{bdf}"), &format!("../../../devices/{path}"));
    }

    /// PCIe bridges (root ports, switch ports) for every prefix of `path` below the host bridge.
    pub fn bridges(&self, path: &str, numa: i32) {
        let parts: Vec<&str> = path.split('/').collect();
        for k in 2..=parts.len() {
            self.pci(&parts[..k].join("/"), 0x060400, PLX, numa, "32.0 GT/s PCIe", 16);
        }
    }

    /// An RDMA device `name` on the PCI function at `dev` (`None`: a software device under
    /// `sys/devices/virtual`), with ports given as (state, rate, link layer).
    pub fn ib(&self, name: &str, dev: Option<&str>, ports: &[(&str, &str, &str)]) {
        let dir = match dev {
            Some(d) => format!("devices/{d}/infiniband/{name}"),
            None => format!("devices/virtual/infiniband/{name}"),
        };
        fs::create_dir_all(self.root.join("sys").join(&dir)).unwrap();
        if let Some(d) = dev {
            let bdf = Path::new(d).file_name().unwrap().to_string_lossy().into_owned();
            self.link(&format!("sys/{dir}/device"), &format!("../../../{bdf}"));
        }
        for (i, (state, rate, ll)) in ports.iter().enumerate() {
            let p = format!("sys/{dir}/ports/{}", i + 1);
            self.write(&format!("{p}/state"), format!("{state}\n"));
            self.write(&format!("{p}/rate"), format!("{rate}\n"));
            self.write(&format!("{p}/link_layer"), format!("{ll}\n"));
        }
        self.link(&format!("sys/class/infiniband/{name}"), &format!("../../{dir}"));
    }

    pub fn numa(&self, id: u32, cpulist: &str) {
        self.write(&format!("sys/devices/system/node/node{id}/cpulist"), format!("{cpulist}\n"));
    }
}

pub const NDR: (&str, &str, &str) = ("4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand");

/// Two sockets, 8 GPUs and 8 rail NICs (400G NDR): GPU i and mlx5_i under one PCIe switch on
/// their own host bridge, GPUs 0-3 on NUMA 0; plus a 200G RoCE front-end NIC (mlx5_8) on a
/// root port of socket 0 and the BMC's VGA console.
pub fn node_8x8() -> Fixture {
    let f = Fixture::new("8x8");
    f.numa(0, "0-47,96-143");
    f.numa(1, "48-95,144-191");
    for i in 0..8u32 {
        let (b, numa) = (0x10 + 0x20 * i, (i / 4) as i32);
        let up = format!("pci0000:{b:02x}/0000:{b:02x}:01.0/0000:{:02x}:00.0", b + 1);
        let (dg, dn) = (format!("{up}/0000:{:02x}:00.0", b + 2), format!("{up}/0000:{:02x}:01.0", b + 2));
        f.bridges(&dg, numa);
        f.bridges(&dn, numa);
        f.pci(&format!("{dg}/0000:{:02x}:00.0", b + 3), 0x030200, 0x10de, numa, "32.0 GT/s PCIe", 16);
        let nic = format!("{dn}/0000:{:02x}:00.0", b + 4);
        f.pci(&nic, 0x020700, MLX, numa, "32.0 GT/s PCIe", 16);
        f.ib(&format!("mlx5_{i}"), Some(&nic), &[NDR]);
    }
    f.bridges("pci0000:00/0000:00:03.0", 0);
    f.pci("pci0000:00/0000:00:03.0/0000:05:00.0", 0x020000, MLX, 0, "16.0 GT/s PCIe", 16);
    f.ib("mlx5_8", Some("pci0000:00/0000:00:03.0/0000:05:00.0"), &[("4: ACTIVE", "200 Gb/sec (4X HDR)", "Ethernet")]);
    f.bridges("pci0000:00/0000:00:1c.0/0000:02:00.0", 0);
    f.pci("pci0000:00/0000:00:1c.0/0000:02:00.0/0000:03:00.0", 0x030000, 0x1a03, 0, "2.5 GT/s PCIe", 1);
    f
}

/// Two sockets, 8 GPUs (each on its own host bridge) and 4 NICs on root ports: mlx5_0 and
/// mlx5_1 on socket 0, mlx5_2 (active) and mlx5_3 (port down) on socket 1.
pub fn node_fewer_nics() -> Fixture {
    let f = Fixture::new("fewer");
    f.numa(0, "0-31");
    f.numa(1, "32-63");
    for i in 0..8u32 {
        let (b, numa) = (0x10 + 0x20 * i, (i / 4) as i32);
        let rp = format!("pci0000:{b:02x}/0000:{b:02x}:01.0");
        f.bridges(&rp, numa);
        f.pci(&format!("{rp}/0000:{:02x}:00.0", b + 1), 0x030200, 0x10de, numa, "32.0 GT/s PCIe", 16);
    }
    let nics = [("mlx5_0", 0x00, 2, 0), ("mlx5_1", 0x00, 3, 0), ("mlx5_2", 0x80, 2, 1), ("mlx5_3", 0x80, 3, 1)];
    for (name, hb, port, numa) in nics {
        let rp = format!("pci0000:{hb:02x}/0000:{hb:02x}:{port:02x}.0");
        f.bridges(&rp, numa);
        let dev = format!("{rp}/0000:{:02x}:00.0", hb + port);
        f.pci(&dev, 0x020700, MLX, numa, "32.0 GT/s PCIe", 16);
        let state = if name == "mlx5_3" { "1: DOWN" } else { "4: ACTIVE" };
        f.ib(name, Some(&dev), &[(state, "400 Gb/sec (4X NDR)", "InfiniBand")]);
    }
    f
}

/// One socket, 4 AMD Instinct GPUs (class 0x1200) behind PCIe switches, no RDMA device at all.
pub fn node_no_nic() -> Fixture {
    let f = Fixture::new("nonic");
    f.numa(0, "0-63");
    for i in 0..4u32 {
        let b = 0x20 + 0x20 * i;
        let dn = format!("pci0000:{b:02x}/0000:{b:02x}:01.1/0000:{:02x}:00.0/0000:{:02x}:00.0", b + 1, b + 2);
        f.bridges(&dn, 0);
        f.pci(&format!("{dn}/0000:{:02x}:00.0", b + 3), 0x120000, 0x1002, 0, "32.0 GT/s PCIe", 16);
    }
    f
}
