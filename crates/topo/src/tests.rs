//! Scans of fixture sysfs trees (see `fixture`) and the NIC choices that follow.

use crate::fixture::{node_8x8, node_fewer_nics, node_no_nic, Fixture, NDR};
use crate::sysfs::{bdf_key, cpulist, hex, link_speed, port_state, rate};
use crate::*;

fn picks(t: &Topology, filter: Option<&str>) -> Vec<(String, Option<Affinity>)> {
    let f = filter.map(|s| DeviceFilter::parse(s).unwrap().unwrap());
    let allowed = allowed_nics(t, f.as_ref()).unwrap();
    let choice = |c: Option<NicChoice>| c.map_or(("-".to_string(), None), |c| (t.nics[c.nic].name.clone(), Some(c.affinity)));
    gpu_nics(t, &allowed).into_iter().map(choice).collect()
}

fn names(t: &Topology, idx: &[usize]) -> Vec<String> {
    idx.iter().map(|&i| t.nics[i].name.clone()).collect()
}

fn mlx(range: impl Iterator<Item = u32>) -> Vec<String> {
    range.map(|i| format!("mlx5_{i}")).collect()
}

#[test]
fn eight_gpus_eight_nics_two_sockets() {
    let f = node_8x8();
    let t = scan(&f.root).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!(t.gpus.len(), 8, "the BMC console is not a GPU");
    let g = &t.gpus[0];
    assert_eq!((g.bdf.as_str(), g.class, g.vendor, g.numa), ("0000:13:00.0", 0x030200, Some(0x10de), Some(0)));
    let chain = ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"];
    assert_eq!(g.path, Some(PciPath { host_bridge: "pci0000:10".into(), chain: chain.map(String::from).to_vec() }));
    assert_eq!((g.link.speed_mts, g.link.width, g.link.max_width), (Some(32000), Some(16), Some(16)));
    assert_eq!(t.gpus[7].numa, Some(1));
    assert_eq!(t.nics.len(), 9);
    let n = &t.nics[0];
    assert_eq!((n.bdf.as_deref(), n.numa, n.rate_mbps(), n.is_active()), (Some("0000:14:00.0"), Some(0), 400_000, true));
    assert_eq!(n.ports[0].link_layer.as_deref(), Some("InfiniBand"));
    assert_eq!(t.numa_nodes.iter().map(|n| (n.id, n.cpus.len())).collect::<Vec<_>>(), vec![(0, 96), (1, 96)]);
    // GPU memory: each GPU its rail NIC under the same switch (2 + 2 PCI hops).
    let p = picks(&t, None);
    assert_eq!(p.iter().map(|x| x.0.clone()).collect::<Vec<_>>(), mlx(0..8));
    let allowed = allowed_nics(&t, None).unwrap();
    assert!(gpu_nics(&t, &allowed).iter().all(|c| c.is_some_and(|c| c.affinity == Affinity::SamePciSwitch && c.hops == 4)));
    // Without its rail NIC, GPU 0 takes a 400G NIC of its socket, not the closer 200G one.
    assert_eq!(picks(&t, Some("^mlx5_0"))[0], ("mlx5_1".into(), Some(Affinity::SameNuma)));
    // Host memory: NUMA-local NICs, fastest first.
    let h0 = host_nics(&t, Some(0), &allowed);
    assert!(h0.numa_local);
    assert_eq!(names(&t, &h0.nics), [mlx(0..4), vec!["mlx5_8".into()]].concat());
    assert_eq!(names(&t, &host_nics(&t, Some(1), &allowed).nics), mlx(4..8));
    assert_eq!(t.gpu_index("0000:F3:00.0"), Some(7));
}

#[test]
fn fewer_nics_than_gpus() {
    let f = node_fewer_nics();
    let t = scan(&f.root).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!((t.gpus.len(), t.nics.len()), (8, 4));
    assert!(!t.nics[3].is_active(), "mlx5_3 is down");
    // Socket 0 GPUs spread over its two NICs; socket 1 GPUs share the one active NIC.
    let p = picks(&t, None);
    let want = ["mlx5_0", "mlx5_1", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_2", "mlx5_2"];
    assert_eq!(p.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(), want);
    assert!(p.iter().all(|x| x.1 == Some(Affinity::SameNuma)));
    // Pinning: the pinned NIC even across sockets; a pinned NIC that is down gives none.
    let pinned = picks(&t, Some("mlx5_2"));
    assert!(pinned.iter().all(|x| x.0 == "mlx5_2"));
    assert_eq!((pinned[0].1, pinned[7].1), (Some(Affinity::CrossNuma), Some(Affinity::SameNuma)));
    assert!(picks(&t, Some("mlx5_3")).iter().all(|x| x.0 == "-"));
    let e = allowed_nics(&t, DeviceFilter::parse("mlx5_0,mlx5_7").unwrap().as_ref()).unwrap_err();
    assert!(e.to_string().contains("names mlx5_7") && e.to_string().contains("present: mlx5_0, mlx5_1, mlx5_2, mlx5_3"), "{e}");
    let all = allowed_nics(&t, None).unwrap();
    assert_eq!(host_nics(&t, Some(0), &all), HostNics { nics: vec![0, 1], numa_local: true });
    assert_eq!(host_nics(&t, Some(1), &all), HostNics { nics: vec![2], numa_local: true });
    let no2 = allowed_nics(&t, DeviceFilter::parse("^mlx5_2").unwrap().as_ref()).unwrap();
    assert_eq!(host_nics(&t, Some(1), &no2), HostNics { nics: vec![0, 1], numa_local: false });
    assert_eq!(host_nics(&t, None, &all), HostNics { nics: vec![0, 1, 2], numa_local: false });
}

#[test]
fn node_without_nic() {
    let f = node_no_nic();
    let t = scan(&f.root).unwrap();
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    assert_eq!(t.gpus.len(), 4);
    assert!(t.gpus.iter().all(|g| g.class >> 8 == 0x1200 && g.vendor == Some(0x1002)));
    assert!(t.nics.is_empty());
    assert_eq!(picks(&t, None), vec![("-".to_string(), None); 4]);
    assert_eq!(host_nics(&t, Some(0), &[]), HostNics { nics: vec![], numa_local: false });
    let e = allowed_nics(&t, DeviceFilter::parse("mlx5_0").unwrap().as_ref()).unwrap_err();
    assert!(e.to_string().contains("present: none"), "{e}");
}

#[test]
fn odd_sysfs_contents_do_not_panic() {
    let f = Fixture::new("odd");
    let gpu = "pci0000:00/0000:00:01.0/0000:01:00.0";
    f.pci(gpu, 0x030200, 0x10de, -1, "Unknown", 16);
    f.write(&format!("sys/devices/{gpu}/current_link_width"), "garbage");
    std::fs::remove_file(f.root.join(format!("sys/devices/{gpu}/max_link_speed"))).unwrap();
    f.pci("pci0000:00/0000:00:02.0", 0x060400, 0x8086, 0, "8 GT/s", 4);
    f.write("sys/devices/pci0000:00/0000:00:02.0/class", "garbage");
    f.pci("pci0000:00/0000:00:04.0", 0x030200, 0x10de, 0, "8 GT/s", 4);
    f.write("sys/devices/pci0000:00/0000:00:04.0/class", [0xffu8, 0xfe, 0]);
    f.link("sys/bus/pci/devices/0000:00:05.0", "../../../devices/nowhere");
    let nic = "pci0000:00/0000:00:06.0/0000:06:00.0";
    f.pci(nic, 0x020000, 0x15b3, 0, "16.0 GT/s PCIe", 8);
    f.ib("mlx5_9", Some(nic), &[NDR]);
    f.write("sys/class/infiniband/mlx5_9/ports/x/state", "4: ACTIVE");
    f.ib("rxe0", None, &[("weird", "fast", "Ethernet")]);
    f.link("sys/class/infiniband/bnxt_re0", "../../devices/gone");
    f.numa(0, "5-2");
    f.write("sys/devices/system/node/possible", "0");
    let t = scan(&f.root).unwrap();
    let w = t.warnings.join("\n");
    for part in [
        "0000:00:02.0: class \"garbage\" is not hex",
        "0000:00:04.0: class",
        "0000:00:05.0: no readable class",
        "bnxt_re0: no readable port",
        "mlx5_9: port directory \"x\"",
        "NUMA node 0: cpulist \"5-2\"",
    ] {
        assert!(w.contains(part), "{part:?} not in:\n{w}");
    }
    assert_eq!(t.gpus.len(), 1);
    let l = t.gpus[0].link;
    assert_eq!((t.gpus[0].numa, l.speed_mts, l.width, l.max_speed_mts, l.max_width), (None, None, None, None, Some(16)));
    assert_eq!(t.nics.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["bnxt_re0", "mlx5_9", "rxe0"]);
    let rxe = &t.nics[2];
    assert_eq!((rxe.path.as_ref(), rxe.bdf.as_ref(), rxe.is_active()), (None, None, false));
    assert_eq!((rxe.ports[0].state.clone(), rxe.ports[0].rate_mbps), (PortState::Unknown("weird".into()), None));
    assert_eq!(t.numa_nodes, vec![NumaNode { id: 0, cpus: vec![] }]);
    let allowed = allowed_nics(&t, None).unwrap();
    let c = gpu_nics(&t, &allowed)[0].unwrap();
    assert_eq!((c.nic, c.affinity, c.hops), (1, Affinity::SameHostBridge, 4));
    let missing = f.root.join("nope");
    assert!(scan(&missing).unwrap_err().to_string().contains("no sysfs under"));
}

#[test]
fn parsers() {
    assert_eq!([link_speed("32.0 GT/s PCIe"), link_speed("2.5 GT/s"), link_speed("Unknown")], [Some(32000), Some(2500), None]);
    assert_eq!(
        [rate("400 Gb/sec (4X NDR)"), rate("2.5 Gb/sec (1X SDR)"), rate("NaN Gb/sec"), rate("")],
        [Some(400_000), Some(2500), None, None]
    );
    assert_eq!([port_state("4: ACTIVE"), port_state("1: DOWN")], [PortState::Active, PortState::Down]);
    assert_eq!(cpulist("0-47,96-143").map(|v| v.len()), Some(96));
    assert_eq!(cpulist("0-4294967295").map(|v| v.len()), Some(1 << 16));
    assert_eq!([cpulist("1,x"), cpulist("")], [None, Some(vec![])]);
    assert_eq!([bdf_key("10000:e1:00.0"), bdf_key("0000:e1:00"), bdf_key("pci0000:00")], [Some((0x10000, 0xe1, 0, 0)), None, None]);
    assert_eq!([hex("0x030200"), hex("1200"), hex("0xzz")], [Some(0x030200), Some(0x1200), None]);
}

#[test]
fn rdma_devices_env_syntax() {
    let p = |s: &str| DeviceFilter::parse(s);
    assert_eq!(p(" ").unwrap(), None);
    let inc = p("mlx5_0, mlx5_1,mlx5_0").unwrap().unwrap();
    assert_eq!(inc, DeviceFilter::Include(vec!["mlx5_0".into(), "mlx5_1".into()]));
    assert!(inc.allows("mlx5_1") && !inc.allows("mlx5_2"));
    let exc = p("^mlx5_0").unwrap().unwrap();
    assert!(!exc.allows("mlx5_0") && exc.allows("mlx5_1"));
    for (bad, why) in [
        ("mlx5_0,,mlx5_1", "device name 2 is empty"),
        ("^", "device name 1 is empty"),
        ("mlx5_0:1", "port suffixes"),
        ("mlx5 0", "is not a device name"),
        ("a,^b", "is not a device name"),
    ] {
        let e = p(bad).unwrap_err().to_string();
        assert!(e.contains(why) && e.contains(&format!("MORI_RDMA_DEVICES={bad:?}")), "{bad}: {e}");
    }
}
