//! `mori check`: runtimes and devices present, the backend verdicts of the engine, and the
//! environment in effect.

use crate::gpu::{self, RuntimeInfo};
use crate::probe::{self, BackendVerdict, Library};
use mori_gpu::Runtime;
use mori_topo::{PciLink, PortState, Topology};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;

/// Environment variables the workspace reads, with what reads them.
pub const KNOWN_ENV: [(&str, &str); 30] = [
    ("MORI_GPU_RUNTIME", "GPU runtime to load: cuda, hip or auto (mori-gpu)"),
    ("MORI_RDMA_DEVICES", "RDMA devices the rdma backend may use: a,b or ^a,b (mori-topo, mori-io-rdma)"),
    ("MORI_IB_GID_INDEX", "GID index override (mori-io-rdma)"),
    ("MORI_IO_NUM_NICS_PER_TRANSFER", "NICs striped per host-memory transfer (mori-io-rdma)"),
    ("MORI_IO_QP_MAX_SEND_WR", "send-queue depth (mori-io-rdma)"),
    ("MORI_IO_QP_MAX_CQE", "completion-queue entries (mori-io-rdma)"),
    ("MORI_IO_QP_MAX_MSG_SGE", "SGEs per work request (mori-io-rdma)"),
    ("MORI_IO_TC", "traffic class (mori-io-rdma)"),
    ("MORI_IO_SL", "service level (mori-io-rdma)"),
    ("MORI_IO_MR_BUDGET_BYTES", "registration-cache budget (mori-io-rdma)"),
    ("MORI_IO_SQ_BACKOFF_TIMEOUT_US", "send-queue admission deadline (mori-io-rdma)"),
    ("MORI_IO_POLL_SPIN_US", "completion-thread spin after the last completion, polling mode (mori-io-rdma)"),
    ("MORI_IO_CALLER_PROGRESS", "waiters poll completions themselves: 1 (default) or 0 (mori-io-core; xgmi, fabric, rdma)"),
    ("MORI_IO_FABRIC_HANDLE", "fabric handle type: posix-fd or fabric (mori-io-fabric)"),
    ("MORI_IO_FABRIC_TIMEOUT_MS", "fabric handle-exchange deadline (mori-io-fabric)"),
    ("MORI_FABRIC_DOMAIN", "FABRIC domain <cluster uuid>:<clique id> (mori-io-fabric)"),
    ("MORI_IO_CONTROL_TIMEOUT_MS", "control-plane deadline (mori-io, mori-io-tcp)"),
    ("MORI_IO_TCP_TIMEOUT_MS", "TCP data deadline (mori-io-tcp)"),
    ("MORI_IO_AUTH", "connections must present the engine's secret: on (default) or off, for benchmarks (mori-io)"),
    ("MORI_IO_MAX_INBOUND", "most inbound connections an engine serves at once (mori-io)"),
    ("MORI_IO_IDLE_TIMEOUT_MS", "inbound connections idle this long are closed (mori-io)"),
    ("MORI_MASTER_ADDR", "bootstrap rendezvous address (mori-bootstrap)"),
    ("MORI_MASTER_PORT", "bootstrap rendezvous port (mori-bootstrap)"),
    ("MORI_RANK", "bootstrap rank (mori-bootstrap)"),
    ("MORI_WORLD_SIZE", "bootstrap world size (mori-bootstrap)"),
    ("MORI_SOCKET_IFNAME", "bootstrap interface (mori-bootstrap)"),
    ("MORI_BOOTSTRAP_TIMEOUT", "bootstrap deadline (mori-bootstrap)"),
    ("MORI_BOOTSTRAP_OP_TIMEOUT", "bootstrap per-operation deadline (mori-bootstrap)"),
    ("MORI_LOG", "log filter of bench_engine (mori-bench)"),
    ("MORI_BENCH_SPLIT", "bench_engine --copy-baseline: also print where each side's time goes (mori-bench)"),
];

/// Extra non-MORI variables shown when set.
const OTHER_ENV: [(&str, &str); 3] = [
    ("CUDA_VISIBLE_DEVICES", "GPU visibility for CUDA (read by libcuda)"),
    ("HIP_VISIBLE_DEVICES", "GPU visibility for HIP (read by libamdhip64)"),
    ("ROCR_VISIBLE_DEVICES", "GPU visibility for ROCr (read by the ROCm runtime under libamdhip64)"),
];

/// A PCIe link, current against maximum.
#[derive(Debug, Clone, Serialize)]
pub struct Link {
    /// e.g. `Gen5 x16` (current).
    pub current: String,
    /// e.g. `Gen5 x16` (maximum).
    pub max: String,
    /// What is below maximum, if anything.
    pub below_max: Option<String>,
}

fn gen(mts: Option<u32>) -> String {
    match mts {
        Some(2500) => "Gen1".into(),
        Some(5000) => "Gen2".into(),
        Some(8000) => "Gen3".into(),
        Some(16000) => "Gen4".into(),
        Some(32000) => "Gen5".into(),
        Some(64000) => "Gen6".into(),
        Some(v) => format!("{:.1} GT/s", f64::from(v) / 1000.0),
        None => "?".into(),
    }
}

/// Current against maximum, with the gap named (a slower speed on an idle GPU is power
/// saving; a narrower width is not).
pub fn link(l: &PciLink) -> Link {
    let w = |x: Option<u32>| x.map_or("x?".to_string(), |w| format!("x{w}"));
    let mut gaps = Vec::new();
    if let (Some(c), Some(m)) = (l.width, l.max_width) {
        if c < m {
            gaps.push(format!("width x{c} of x{m} (bandwidth lost; check the slot, riser, bifurcation)"));
        }
    }
    if let (Some(c), Some(m)) = (l.speed_mts, l.max_speed_mts) {
        if c < m {
            gaps.push(format!("speed {} of {} (idle GPUs lower their link speed: check under load)", gen(Some(c)), gen(Some(m))));
        }
    }
    Link {
        current: format!("{} {}", gen(l.speed_mts), w(l.width)),
        max: format!("{} {}", gen(l.max_speed_mts), w(l.max_width)),
        below_max: (!gaps.is_empty()).then(|| gaps.join("; ")),
    }
}

/// A GPU seen in sysfs.
#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    /// PCI address.
    pub bdf: String,
    /// `NVIDIA`, `AMD`, or the vendor id.
    pub vendor: String,
    /// NUMA node.
    pub numa: Option<u32>,
    /// PCIe link.
    pub link: Link,
}

/// An RDMA device seen in sysfs.
#[derive(Debug, Clone, Serialize)]
pub struct NicInfo {
    /// Device name.
    pub name: String,
    /// NUMA node.
    pub numa: Option<u32>,
    /// Ports as `1: ACTIVE 400 Gb/s Ethernet`.
    pub ports: Vec<String>,
    /// Active ports.
    pub active_ports: usize,
    /// PCIe link (software devices have none).
    pub link: Option<Link>,
}

/// A NUMA node.
#[derive(Debug, Clone, Serialize)]
pub struct NumaInfo {
    /// Node id.
    pub id: u32,
    /// CPUs on it.
    pub cpus: usize,
}

/// GPU runtime: the one `mori-gpu` loaded (CUDA or HIP) and what it says, or why none could
/// be loaded.
#[derive(Debug, Clone, Serialize)]
pub struct GpuRuntime {
    /// Whether this build has a GPU runtime layer (mori-gpu): always true now; whether one is
    /// usable on this machine is `available`.
    pub in_build: bool,
    /// Whether a runtime was loaded.
    pub available: bool,
    /// The plain statement.
    pub note: String,
    /// Why no runtime could be loaded (names libcuda and libamdhip64 and each one's reason).
    pub error: Option<String>,
    /// `CUDA` or `HIP`.
    pub kind: Option<String>,
    /// The library loaded.
    pub library: Option<String>,
    /// Driver version, `13.0`.
    pub driver_version: Option<String>,
    /// Driver version as the vendor encodes it.
    pub driver_version_raw: Option<u32>,
    /// Devices the runtime sees (0 without a runtime).
    pub device_count: u32,
    /// Each device: name, bus id, NUMA, memory, compute capability, SMs, capabilities and the
    /// live FABRIC probe.
    pub devices: Vec<gpu::GpuDevice>,
    /// Peer access for every ordered pair of distinct devices.
    pub peer_access: Vec<gpu::PeerAccess>,
    /// Runtime calls that failed, one line each.
    pub runtime_errors: Vec<String>,
    /// libcuda as the loader sees it.
    pub cuda_driver: Library,
    /// libamdhip64 as the loader sees it.
    pub hip_runtime: Library,
    /// Driver files present under the root (`/proc/driver/nvidia/version`, `/dev/kfd`, ...).
    pub driver_files: Vec<String>,
    /// IPC memory handles: available with any CUDA/HIP runtime.
    pub ipc: String,
    /// VMM over all devices.
    pub vmm: String,
    /// FABRIC over all devices, from the live probe (`not available (no IMEX channel)`).
    pub fabric: String,
}

fn all_devices(info: &RuntimeInfo, what: &str, f: impl Fn(&gpu::GpuDevice) -> bool) -> String {
    let yes: Vec<String> = info.devices.iter().filter(|d| f(d)).map(|d| format!("GPU{}", d.index)).collect();
    match (yes.len(), info.devices.len()) {
        (_, 0) => "no device".into(),
        (y, n) if y == n => format!("{what} on every device ({n})"),
        (0, _) => format!("no {what} on any device"),
        (_, n) => format!("{what} on {} of {n} devices ({})", yes.len(), yes.join(", ")),
    }
}

/// The GPU runtime section: `runtime` is what `mori_gpu::detect()` gave (the error as one
/// line); `root` is where driver files are looked for.
pub fn gpu_runtime(runtime: Result<&Arc<dyn Runtime>, &str>, root: &Path) -> GpuRuntime {
    let files = ["proc/driver/nvidia/version", "dev/nvidiactl", "dev/nvidia0", "dev/kfd", "sys/module/amdgpu"];
    let mut g = GpuRuntime {
        in_build: true,
        available: false,
        note: String::new(),
        error: None,
        kind: None,
        library: None,
        driver_version: None,
        driver_version_raw: None,
        device_count: 0,
        devices: Vec::new(),
        peer_access: Vec::new(),
        runtime_errors: Vec::new(),
        cuda_driver: probe::library("libcuda.so.1"),
        hip_runtime: probe::any_library(&["libamdhip64.so.6", "libamdhip64.so"]),
        driver_files: files.iter().filter(|f| root.join(f).exists()).map(|f| format!("/{f}")).collect(),
        ipc: "not queried: needs the GPU runtime".into(),
        vmm: "not queried: needs the GPU runtime".into(),
        fabric: "not queried: needs the GPU runtime".into(),
    };
    match runtime {
        Err(e) => {
            g.note = "no GPU runtime on this machine: GPU devices are not enumerated through a runtime, and the engine cannot register GPU memory".into();
            g.error = Some(e.to_string());
        }
        Ok(rt) => {
            let info = gpu::inspect(rt);
            g.available = true;
            g.note = format!(
                "{} runtime loaded from {}{}; {} device(s)",
                info.kind,
                info.library,
                info.driver_version.as_ref().map_or(String::new(), |v| format!(", driver {v}")),
                info.device_count
            );
            g.ipc = format!("available ({} IPC memory handles)", info.kind);
            g.vmm = all_devices(&info, "VMM", |d| d.capabilities.vmm);
            g.fabric = info.fabric.clone();
            g.kind = Some(info.kind);
            g.library = Some(info.library);
            g.driver_version = info.driver_version;
            g.driver_version_raw = info.driver_version_raw;
            g.device_count = info.device_count;
            g.devices = info.devices;
            g.peer_access = info.peer_access;
            g.runtime_errors = info.errors;
        }
    }
    g
}

/// An environment variable in effect.
#[derive(Debug, Clone, Serialize)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
    /// What reads it, or a warning.
    pub note: String,
}

/// The requested backend's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Requested {
    /// Backend name.
    pub backend: String,
    /// `host` or `gpu`.
    pub memory: String,
    /// Whether it can work.
    pub ok: bool,
    /// Why.
    pub reason: String,
}

/// Everything `mori check` found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// libibverbs as the loader sees it.
    pub libibverbs: Library,
    /// RDMA devices (sysfs).
    pub rdma_devices: Vec<NicInfo>,
    /// Active ports over all devices.
    pub active_rdma_ports: usize,
    /// The GID index in effect (`MORI_IB_GID_INDEX`, or auto).
    pub rdma_gid_index: GidIndex,
    /// GPU runtimes.
    pub gpu_runtime: GpuRuntime,
    /// GPUs (sysfs).
    pub gpus: Vec<GpuInfo>,
    /// NUMA nodes.
    pub numa_nodes: Vec<NumaInfo>,
    /// Engine verdicts, preference order, host then GPU memory.
    pub backends: Vec<BackendVerdict>,
    /// Whether engines check connection secrets (`MORI_IO_AUTH`), in words.
    pub io_auth: String,
    /// Environment in effect.
    pub env: Vec<EnvVar>,
    /// The `--backend` verdict, if one was asked for.
    pub requested: Option<Requested>,
    /// Scan notes.
    pub warnings: Vec<String>,
}

fn vendor(v: Option<u16>) -> String {
    match v {
        Some(0x10de) => "NVIDIA".into(),
        Some(0x1002) => "AMD".into(),
        Some(x) => format!("{x:#06x}"),
        None => "?".into(),
    }
}

/// Name of the GID index override the rdma backend reads (mori-io-rdma's `RdmaConfig::from_env`).
pub const GID_INDEX_ENV: &str = "MORI_IB_GID_INDEX";

/// Largest `MORI_IB_GID_INDEX`, mori-io-rdma's own limit (the GRH's `sgid_index` is 8 bits).
pub const MAX_GID_INDEX: u64 = mori_io::MAX_GID_INDEX as u64;

/// The GID index the rdma backend is to use, as `MORI_IB_GID_INDEX` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum GidIndex {
    /// Unset: the backend picks (a RoCEv2 IPv4-mapped GID first, then RoCEv2, then any).
    Auto,
    /// This index (it must also be a non-empty entry of the port's GID table).
    Fixed {
        /// The index.
        index: u8,
    },
    /// A value the backend refuses or cannot use.
    Invalid {
        /// Why, naming the variable and the range.
        why: String,
    },
}

impl GidIndex {
    /// What `value` (the variable's value, `None` when unset) means.
    pub fn from_value(value: Option<&str>) -> GidIndex {
        let Some(value) = value else { return GidIndex::Auto };
        match check_value(GID_INDEX_ENV, value) {
            Ok(_) => match value.trim().parse::<u8>() {
                Ok(index) => GidIndex::Fixed { index },
                Err(_) => GidIndex::Invalid { why: format!("{GID_INDEX_ENV}={value:?} is not an index in 0..={MAX_GID_INDEX}") },
            },
            Err(why) => GidIndex::Invalid { why: format!("{GID_INDEX_ENV}: {why}") },
        }
    }

    /// One line for the text report.
    pub fn describe(&self) -> String {
        match self {
            GidIndex::Auto => format!("auto ({GID_INDEX_ENV} unset: a RoCEv2 IPv4-mapped GID first)"),
            GidIndex::Fixed { index } => format!("{index} ({GID_INDEX_ENV}; must be a non-empty GID of the port)"),
            GidIndex::Invalid { why } => format!("INVALID: {why}"),
        }
    }
}

/// Whole-number variables and the values their readers accept (inclusive; the limits are the
/// readers' own where they export them).
const NUMERIC_ENV: [(&str, u64, u64); 15] = [
    (GID_INDEX_ENV, 0, MAX_GID_INDEX),
    ("MORI_IO_NUM_NICS_PER_TRANSFER", 1, 1),
    ("MORI_IO_QP_MAX_SEND_WR", 2, u32::MAX as u64),
    ("MORI_IO_QP_MAX_CQE", 16, u32::MAX as u64),
    ("MORI_IO_QP_MAX_MSG_SGE", 1, u32::MAX as u64),
    ("MORI_IO_TC", 0, u8::MAX as u64),
    ("MORI_IO_SL", 0, mori_io::MAX_SERVICE_LEVEL as u64),
    ("MORI_IO_MR_BUDGET_BYTES", 1, u64::MAX),
    ("MORI_IO_SQ_BACKOFF_TIMEOUT_US", 1, u64::MAX),
    ("MORI_IO_POLL_SPIN_US", 0, mori_io::MAX_POLL_SPIN_US),
    ("MORI_IO_CONTROL_TIMEOUT_MS", 1, u64::MAX),
    ("MORI_IO_TCP_TIMEOUT_MS", 1, u64::MAX),
    ("MORI_IO_FABRIC_TIMEOUT_MS", 1, u64::MAX),
    ("MORI_IO_MAX_INBOUND", 1, mori_io::MAX_INBOUND_LIMIT as u64),
    ("MORI_IO_IDLE_TIMEOUT_MS", 1, u64::MAX),
];

/// What its reader makes of a known variable's value: `Err` with why it would be refused, or
/// `Ok` with a note on the value in effect.
fn check_value(name: &str, value: &str) -> Result<Option<String>, String> {
    if let Some(&(_, lo, hi)) = NUMERIC_ENV.iter().find(|(k, _, _)| *k == name) {
        return match value.trim().parse::<u64>() {
            Ok(v) if (lo..=hi).contains(&v) => Ok(None),
            Ok(v) => Err(format!("{v} is outside {lo}..={hi}")),
            Err(_) => Err(format!("{value:?} is not a non-negative integer")),
        };
    }
    match name {
        mori_bootstrap::ENV_TIMEOUT | mori_bootstrap::ENV_OP_TIMEOUT => {
            mori_bootstrap::parse_secs(name, value).map(|_| None).map_err(|e| e.to_string())
        }
        mori_topo::RDMA_DEVICES_ENV => mori_topo::DeviceFilter::parse(value).map(|_| None).map_err(|e| e.to_string()),
        mori_io_fabric::HANDLE_ENV => mori_io_fabric::HandleType::parse(value).map(|_| None).map_err(|e| e.msg),
        mori_io_core::CALLER_PROGRESS_ENV | crate::check_io::AUTH_ENV => match mori_io_core::status::parse_switch(value) {
            Some(on) => Ok(Some(format!("{} here", if on { "on" } else { "off" }))),
            None => Err(format!("{value:?} is not one of {}", mori_io_core::status::SWITCH_VALUES)),
        },
        mori_io_fabric::DOMAIN_ENV => mori_io_fabric::FabricDomain::parse_fabric(value).map(|_| None).map_err(|e| e.msg),
        _ => Ok(None),
    }
}

/// Variables in effect: every `MORI_*` (unknown ones flagged) and the GPU visibility ones.
pub fn env_in_effect(vars: impl Iterator<Item = (String, String)>) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = Vec::new();
    for (name, value) in vars {
        let known = KNOWN_ENV.iter().chain(OTHER_ENV.iter()).find(|(k, _)| *k == name).map(|(_, n)| n.to_string());
        let note = match known {
            Some(n) => match check_value(&name, &value) {
                Ok(Some(extra)) => format!("{n}; {extra}"),
                Ok(None) => n,
                Err(why) => format!("INVALID: {why}"),
            },
            None if name.starts_with("MORI_") => "not read by any mori-rs crate (typo?)".into(),
            None => continue,
        };
        out.push(EnvVar { name, value, note });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Builds the report from a sysfs scan (`root` is `/` on a real node), the GPU runtime (or
/// why there is none, one line) and the live probes.
pub fn report(
    topo: &Topology,
    root: &Path,
    vars: impl Iterator<Item = (String, String)>,
    runtime: Result<&Arc<dyn Runtime>, &str>,
) -> CheckReport {
    let vars: Vec<(String, String)> = vars.collect();
    let gid = vars.iter().find(|(k, _)| k == GID_INDEX_ENV).map(|(_, v)| v.as_str());
    let rdma_devices: Vec<NicInfo> = topo
        .nics
        .iter()
        .map(|n| NicInfo {
            name: n.name.clone(),
            numa: n.numa,
            ports: n
                .ports
                .iter()
                .map(|p| {
                    let st = match &p.state {
                        PortState::Unknown(s) => s.clone(),
                        s => format!("{s:?}").to_uppercase(),
                    };
                    let rate = p.rate_mbps.map_or("rate ?".into(), |r| format!("{} Gb/s", r / 1000));
                    format!("{}: {st} {rate} {}", p.num, p.link_layer.as_deref().unwrap_or("?"))
                })
                .collect(),
            active_ports: n.ports.iter().filter(|p| p.state == PortState::Active).count(),
            link: n.bdf.as_ref().map(|_| link(&n.link)),
        })
        .collect();
    CheckReport {
        libibverbs: probe::library("libibverbs.so.1"),
        active_rdma_ports: rdma_devices.iter().map(|n| n.active_ports).sum(),
        rdma_gid_index: GidIndex::from_value(gid),
        rdma_devices,
        gpu_runtime: gpu_runtime(runtime, root),
        gpus: topo
            .gpus
            .iter()
            .map(|g| GpuInfo { bdf: g.bdf.clone(), vendor: vendor(g.vendor), numa: g.numa, link: link(&g.link) })
            .collect(),
        numa_nodes: topo.numa_nodes.iter().map(|n| NumaInfo { id: n.id, cpus: n.cpus.len() }).collect(),
        backends: probe::backends(runtime.ok()),
        io_auth: crate::check_io::auth_line(vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        env: env_in_effect(vars.into_iter()),
        requested: None,
        warnings: topo.warnings.clone(),
    }
}

fn render_gpu_runtime(g: &GpuRuntime) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let lib = |l: &Library| match &l.error {
        None => format!("{}: found", l.name),
        Some(e) => format!("{}: not found ({e})", l.name),
    };
    let mut s = format!("GPU runtime\n  {}\n", g.note);
    if let Some(e) = &g.error {
        s += &format!("  why: {e}\n");
    }
    for d in &g.devices {
        let numa = d.numa_node.map_or("-".into(), |n| n.to_string());
        let c = &d.capabilities;
        s += &format!(
            "  GPU{} {}  bus {}  numa {numa}  {}  cc {}  {} SMs\n",
            d.index, d.name, d.pci_bus_id, d.total_memory, d.compute_capability, d.multiprocessors
        );
        s += &format!(
            "    IPC {}  VMM {}  POSIX_FD {}  FABRIC attribute {}  DMA_BUF {}  GPUDirect RDMA {} (on VMM {})\n",
            yes(c.ipc),
            yes(c.vmm),
            yes(c.posix_fd),
            yes(c.fabric),
            yes(c.dma_buf),
            yes(c.gpu_direct_rdma),
            yes(c.gpu_direct_rdma_vmm)
        );
        s += &format!("    FABRIC: {}\n", d.fabric.status);
        if let Some(e) = &d.fabric.error {
            s += &format!("      {e}\n");
        }
    }
    if g.available {
        if g.device_count > 1 {
            let pairs: Vec<String> = g
                .peer_access
                .iter()
                .map(|p| match &p.error {
                    None => format!("{}->{} {}", p.src, p.dst, yes(p.can_access)),
                    Some(e) => format!("{}->{} query failed ({e})", p.src, p.dst),
                })
                .collect();
            s += &format!("  peer access: {}\n", pairs.join(", "));
        } else {
            s += "  peer access: one device, no pair\n";
        }
        s += &format!("  IPC: {}\n  VMM: {}\n  FABRIC: {}\n", g.ipc, g.vmm, g.fabric);
        for e in &g.runtime_errors {
            s += &format!("  error: {e}\n");
        }
    }
    s += &format!("  {}\n  {}\n", lib(&g.cuda_driver), lib(&g.hip_runtime));
    s += &format!("  driver files: {}\n", if g.driver_files.is_empty() { "none".into() } else { g.driver_files.join(", ") });
    if !g.available {
        s += &format!("  IPC: {}\n  VMM/FABRIC: {}\n", g.ipc, g.fabric);
    }
    s
}

impl CheckReport {
    /// Sets [`CheckReport::requested`] from the verdicts.
    pub fn request(&mut self, backend: &str, memory: &str) {
        let v = self.backends.iter().find(|v| v.backend == backend && v.memory == memory);
        self.requested = Some(Requested {
            backend: backend.into(),
            memory: memory.into(),
            ok: v.is_some_and(|v| v.serves),
            reason: v.map_or_else(|| "no such backend".into(), |v| v.reason.clone()),
        });
    }

    /// The text report.
    pub fn render(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        let lib = |l: &Library| match &l.error {
            None => format!("{}: found", l.name),
            Some(e) => format!("{}: not found ({e})", l.name),
        };
        let mut s = String::from("RDMA\n");
        s += &format!("  {}\n", lib(&self.libibverbs));
        if self.rdma_devices.is_empty() {
            s += "  no RDMA device in sysfs (/sys/class/infiniband)\n";
        }
        for n in &self.rdma_devices {
            let numa = n.numa.map_or("-".into(), |x| x.to_string());
            let pcie = n.link.as_ref().map_or("software device".into(), |l| format!("PCIe {} (max {})", l.current, l.max));
            s += &format!("  {} numa {numa} {pcie}; ports: {}\n", n.name, n.ports.join(", "));
        }
        s += &format!("  active ports: {}\n", self.active_rdma_ports);
        s += &format!("  GID index: {}\n", self.rdma_gid_index.describe());
        s += &render_gpu_runtime(&self.gpu_runtime);
        s += &format!("GPUs in sysfs: {}\n", self.gpus.len());
        for x in &self.gpus {
            let numa = x.numa.map_or("-".into(), |n| n.to_string());
            let gap = x.link.below_max.as_ref().map_or(String::new(), |b| format!("  BELOW MAX: {b}"));
            s += &format!("  {} {} numa {numa} PCIe {} (max {}){gap}\n", x.bdf, x.vendor, x.link.current, x.link.max);
        }
        let numa: Vec<String> = self.numa_nodes.iter().map(|n| format!("node{} ({} CPUs)", n.id, n.cpus)).collect();
        s += &format!("NUMA: {}\n", if numa.is_empty() { "no NUMA information".into() } else { numa.join(", ") });
        s += "Engine backends (preference order xgmi, fabric, rdma, tcp)\n";
        for v in &self.backends {
            s += &format!("  {:<7} {:<5} {:<3} {}\n", v.backend, v.memory, yes(v.serves), v.reason);
        }
        s += &format!("  connection checks: {}\n", self.io_auth);
        s += "Environment\n";
        if self.env.is_empty() {
            s += "  no MORI_* variable set\n";
        }
        for e in &self.env {
            s += &format!("  {}={}  ({})\n", e.name, e.value, e.note);
        }
        for w in &self.warnings {
            s += &format!("note: {w}\n");
        }
        if let Some(r) = &self.requested {
            s += &format!(
                "requested: {} for {} memory: {} ({})\n",
                r.backend,
                r.memory,
                if r.ok { "CAN work" } else { "CANNOT work" },
                r.reason
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &str, value: &str) -> String {
        env_in_effect(std::iter::once((name.to_string(), value.to_string())))[0].note.clone()
    }

    #[test]
    fn gid_index_unset_is_auto_good_values_fixed_bad_ones_reported() {
        assert_eq!(GidIndex::from_value(None), GidIndex::Auto);
        assert!(GidIndex::Auto.describe().starts_with("auto (MORI_IB_GID_INDEX unset"), "{}", GidIndex::Auto.describe());
        for (v, i) in [("0", 0u8), ("3", 3), (" 7 ", 7), ("255", 255)] {
            assert_eq!(GidIndex::from_value(Some(v)), GidIndex::Fixed { index: i }, "{v:?}");
            assert_eq!(note(GID_INDEX_ENV, v), "GID index override (mori-io-rdma)");
        }
        assert_eq!(GidIndex::Fixed { index: 3 }.describe(), "3 (MORI_IB_GID_INDEX; must be a non-empty GID of the port)");
        for (v, why) in [
            ("256", "256 is outside 0..=255"),
            ("4294967296", "4294967296 is outside 0..=255"),
            ("-1", "\"-1\" is not a non-negative integer"),
            ("", "\"\" is not a non-negative integer"),
            ("auto", "\"auto\" is not a non-negative integer"),
            ("0x3", "\"0x3\" is not a non-negative integer"),
        ] {
            assert_eq!(GidIndex::from_value(Some(v)), GidIndex::Invalid { why: format!("MORI_IB_GID_INDEX: {why}") }, "{v:?}");
            assert_eq!(note(GID_INDEX_ENV, v), format!("INVALID: {why}"));
        }
    }

    #[test]
    fn report_carries_the_gid_index() {
        let topo = Topology::default();
        let root = Path::new("/nonexistent-root-for-mori-test");
        let with = |vars: Vec<(&str, &str)>| {
            report(&topo, root, vars.into_iter().map(|(k, v)| (k.to_string(), v.to_string())), Err("no runtime in this test"))
        };
        let r = with(vec![]);
        assert_eq!(r.rdma_gid_index, GidIndex::Auto);
        assert!(r.render().contains("\n  GID index: auto (MORI_IB_GID_INDEX unset"), "{}", r.render());
        let r = with(vec![("MORI_IB_GID_INDEX", "1")]);
        assert_eq!(r.rdma_gid_index, GidIndex::Fixed { index: 1 });
        assert_eq!(serde_json::to_value(&r.rdma_gid_index).unwrap(), serde_json::json!({"mode": "fixed", "index": 1}));
        let r = with(vec![("MORI_IB_GID_INDEX", "300")]);
        assert!(r.render().contains("\n  GID index: INVALID: MORI_IB_GID_INDEX: 300 is outside 0..=255\n"), "{}", r.render());
        assert_eq!(r.env[0].note, "INVALID: 300 is outside 0..=255");
        assert!(r.render().contains("\n  connection checks: on: every connection must present"), "{}", r.render());
        let r = with(vec![("MORI_IO_AUTH", "off")]);
        assert!(r.render().contains("\n  connection checks: OFF (MORI_IO_AUTH=off)"), "{}", r.render());
        assert_eq!(r.env[0].note.split(';').nth(1), Some(" off here"), "{:?}", r.env);
    }
}
