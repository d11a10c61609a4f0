//! The GPU runtime as `mori check` and `mori peer-bw` use it (through `mori-gpu`, which opens
//! libcuda or libamdhip64 at run time: the binary starts, and says so, where neither exists).
//!
//! - [`inspect`]: runtime, driver, every device (name, bus id, NUMA, memory, compute
//!   capability, SMs, capability flags), a live FABRIC probe per device and peer access for
//!   every ordered pair.
//! - [`measure`]: peer-copy bandwidth for every ordered pair (including a device to itself),
//!   each copy verified byte for byte.
//! - Pure pieces with their own tests: [`fabric_verdict`], [`driver_version_text`],
//!   [`parse_sizes`], [`align_topology`], [`fill_pattern`] / [`count_wrong`].

use crate::class::{LinkClass, TopoMatrix};
use crate::error::{CliError, CliResult};
use crate::peer_bw::Measurement;
use mori_gpu::{Device, GpuError, HandleKinds, PciBusId, Runtime, RuntimeKind, ShareableKind, VmmOptions};
use serde::Serialize;
use std::sync::Arc;

/// `mori_gpu::detect()`, its error as one line (it names libcuda and libamdhip64 and why each
/// was refused).
pub fn detect() -> Result<Arc<dyn Runtime>, String> {
    mori_gpu::detect().map_err(|e| one_line(&e.to_string()))
}

/// `s` with line breaks turned into spaces (every error of this command is one line).
pub fn one_line(s: &str) -> String {
    s.split(['\n', '\r']).map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// The driver version as the vendor writes it: CUDA `1000 * major + 10 * minor` (`13.0`),
/// HIP `10_000_000 * major + 100_000 * minor + patch` (`6.4.43483`).
pub fn driver_version_text(kind: RuntimeKind, v: u32) -> String {
    match kind {
        RuntimeKind::Cuda => format!("{}.{}", v / 1000, (v % 1000) / 10),
        RuntimeKind::Hip => format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000),
    }
}

/// Bytes as `1 MiB`, `1.5 GiB`, `4096 B`.
pub fn bytes_text(b: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (u, name) in UNITS {
        if b >= u {
            return if b.is_multiple_of(u) { format!("{} {name}", b / u) } else { format!("{:.1} {name}", b as f64 / u as f64) };
        }
    }
    format!("{b} B")
}

/// Capability flags of one device. IPC memory handles exist on every CUDA and HIP device;
/// the others are the device's attributes.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct DeviceCaps {
    /// IPC memory handles (cuIpcGetMemHandle / hipIpcGetMemHandle): always with CUDA/HIP.
    pub ipc: bool,
    /// Virtual memory management (cuMemCreate / hipMemCreate).
    pub vmm: bool,
    /// VMM allocations exportable as POSIX file descriptors.
    pub posix_fd: bool,
    /// The device attribute for FABRIC handles (creating one still needs an IMEX channel:
    /// see the live probe).
    pub fabric: bool,
    /// dmabuf export of device memory.
    pub dma_buf: bool,
    /// GPUDirect RDMA.
    pub gpu_direct_rdma: bool,
    /// GPUDirect RDMA on VMM allocations.
    pub gpu_direct_rdma_vmm: bool,
    /// Unified virtual addressing.
    pub unified_addressing: bool,
}

impl From<&mori_gpu::Capabilities> for DeviceCaps {
    fn from(c: &mori_gpu::Capabilities) -> Self {
        DeviceCaps {
            ipc: true,
            vmm: c.vmm,
            posix_fd: c.posix_fd_handles,
            fabric: c.fabric_handles,
            dma_buf: c.dmabuf,
            gpu_direct_rdma: c.gpu_direct_rdma,
            gpu_direct_rdma_vmm: c.gpu_direct_rdma_vmm,
            unified_addressing: c.unified_addressing,
        }
    }
}

/// What a live attempt to create (and export) a FABRIC-shareable VMM allocation gave.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FabricProbe {
    /// Whether an allocation was attempted (not without VMM support).
    pub attempted: bool,
    /// Whether a FABRIC handle was created and exported.
    pub available: bool,
    /// `available`, `not available (no IMEX channel)`, `not available (...)`.
    pub status: String,
    /// The driver's error, verbatim.
    pub error: Option<String>,
}

/// Judges the result of the FABRIC attempt: CUDA's NOT_PERMITTED (800) is the missing IMEX
/// channel; NOT_SUPPORTED (801) a device or driver without FABRIC handles.
pub fn fabric_verdict(r: Result<(), &GpuError>) -> FabricProbe {
    let e = match r {
        Ok(()) => {
            return FabricProbe { attempted: true, available: true, status: "available".into(), error: None };
        }
        Err(e) => e,
    };
    let status = match e {
        GpuError::Call { runtime: RuntimeKind::Cuda, code: mori_gpu::CUDA_ERROR_NOT_PERMITTED, .. } => {
            "not available (no IMEX channel)".to_string()
        }
        GpuError::Call { code: mori_gpu::CUDA_ERROR_NOT_SUPPORTED, .. } | GpuError::Unsupported { .. } => {
            "not available (not supported by this device or driver)".to_string()
        }
        GpuError::Call { call, name, .. } => format!("not available ({call}: {name})"),
        other => format!("not available ({})", one_line(&other.to_string())),
    };
    FabricProbe { attempted: true, available: false, status, error: Some(one_line(&e.to_string())) }
}

/// Creates a small FABRIC-exportable VMM allocation on `dev` and exports it (released at once).
pub fn probe_fabric(rt: &Arc<dyn Runtime>, dev: Device, caps: &DeviceCaps) -> FabricProbe {
    if !caps.vmm {
        return FabricProbe {
            attempted: false,
            available: false,
            status: "not available (the device has no VMM support)".into(),
            error: None,
        };
    }
    let opts = VmmOptions { kinds: HandleKinds::FABRIC, gpu_direct_rdma: false };
    let r = rt.vmm_alloc(dev, 1 << 20, &opts).and_then(|a| rt.vmm_export(&a, ShareableKind::Fabric).map(|_| ()));
    fabric_verdict(r.as_ref().map(|_| ()))
}

/// One device as the runtime describes it.
#[derive(Debug, Clone, Serialize)]
pub struct GpuDevice {
    /// Runtime ordinal (after CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES).
    pub index: u32,
    /// Marketing name.
    pub name: String,
    /// PCI address, `0000:1b:00.0`.
    pub pci_bus_id: String,
    /// NUMA node, where the platform tells.
    pub numa_node: Option<u32>,
    /// Device memory, bytes.
    pub total_memory_bytes: u64,
    /// Device memory, e.g. `139.8 GiB`.
    pub total_memory: String,
    /// Compute capability (or the HIP equivalent), `9.0`.
    pub compute_capability: String,
    /// Streaming multiprocessors / compute units.
    pub multiprocessors: u32,
    /// Capability flags.
    pub capabilities: DeviceCaps,
    /// The live FABRIC probe.
    pub fabric: FabricProbe,
}

/// Peer access of one ordered pair.
#[derive(Debug, Clone, Serialize)]
pub struct PeerAccess {
    /// Device that would access.
    pub src: u32,
    /// Device whose memory would be accessed.
    pub dst: u32,
    /// What the runtime said (`false` when the query failed).
    pub can_access: bool,
    /// The query's error, if it failed.
    pub error: Option<String>,
}

/// Everything [`inspect`] learned from a runtime.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeInfo {
    /// `CUDA` or `HIP`.
    pub kind: String,
    /// The library that was loaded.
    pub library: String,
    /// Driver version, `13.0`.
    pub driver_version: Option<String>,
    /// Driver version as the vendor encodes it.
    pub driver_version_raw: Option<u32>,
    /// Visible devices.
    pub device_count: u32,
    /// Every device whose properties could be read.
    pub devices: Vec<GpuDevice>,
    /// Every ordered pair of distinct devices.
    pub peer_access: Vec<PeerAccess>,
    /// FABRIC over all devices, one phrase (`not available (no IMEX channel)`).
    pub fabric: String,
    /// Calls that failed (device count, properties), one line each.
    pub errors: Vec<String>,
}

/// Runtime, driver, devices, live FABRIC probe, peer access.
pub fn inspect(rt: &Arc<dyn Runtime>) -> RuntimeInfo {
    let kind = rt.kind();
    let mut errors = Vec::new();
    let raw = rt.driver_version().map_err(|e| errors.push(format!("driver version: {}", one_line(&e.to_string())))).ok();
    let device_count = rt.device_count().map_err(|e| errors.push(format!("device count: {}", one_line(&e.to_string())))).unwrap_or(0);
    let mut devices = Vec::new();
    for i in 0..device_count {
        match rt.device_properties(Device(i)) {
            Ok(p) => {
                let caps = DeviceCaps::from(&p.capabilities);
                devices.push(GpuDevice {
                    index: i,
                    name: p.name.clone(),
                    pci_bus_id: p.pci_bus_id.to_string(),
                    numa_node: p.numa_node,
                    total_memory_bytes: p.total_memory,
                    total_memory: bytes_text(p.total_memory),
                    compute_capability: format!("{}.{}", p.compute_capability.0, p.compute_capability.1),
                    multiprocessors: p.multiprocessors,
                    capabilities: caps,
                    fabric: probe_fabric(rt, Device(i), &caps),
                });
            }
            Err(e) => errors.push(format!("properties of GPU {i}: {}", one_line(&e.to_string()))),
        }
    }
    let mut peer_access = Vec::new();
    for a in 0..device_count {
        for b in (0..device_count).filter(|&b| b != a) {
            let r = rt.can_access_peer(Device(a), Device(b));
            peer_access.push(PeerAccess {
                src: a,
                dst: b,
                can_access: *r.as_ref().unwrap_or(&false),
                error: r.err().map(|e| one_line(&e.to_string())),
            });
        }
    }
    let mut statuses: Vec<&str> = devices.iter().map(|d| d.fabric.status.as_str()).collect();
    statuses.dedup();
    let fabric = match statuses.as_slice() {
        [] => "not probed (no device)".to_string(),
        [one] => one.to_string(),
        _ => devices.iter().map(|d| format!("GPU{}: {}", d.index, d.fabric.status)).collect::<Vec<_>>().join("; "),
    };
    RuntimeInfo {
        kind: kind.to_string(),
        library: rt.library(),
        driver_version: raw.map(|v| driver_version_text(kind, v)),
        driver_version_raw: raw,
        device_count,
        devices,
        peer_access,
        fabric,
        errors,
    }
}

// ---------------------------------------------------------------------------------------------
// peer-bw: measuring
// ---------------------------------------------------------------------------------------------

/// Parses one size: a whole number with an optional unit, `B`, `K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB` (binary) or `KB`/`MB`/`GB` (decimal); case-insensitive.
pub fn parse_size(s: &str) -> CliResult<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = |why: &str| CliError::input(format!("--sizes: {s:?}: {why}"));
    let n: u64 = num.parse().map_err(|_| bad("expected a whole number with an optional unit (1MiB, 16MiB, 4096)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(bad("unknown unit (B, KiB, MiB, GiB, KB, MB, GB)")),
    };
    let v = n.checked_mul(mult).ok_or_else(|| bad("too large"))?;
    if v == 0 {
        return Err(bad("a size must be at least 1 byte"));
    }
    Ok(v)
}

/// Parses a comma-separated list of sizes (sorted, duplicates removed).
pub fn parse_sizes(list: &str) -> CliResult<Vec<u64>> {
    let mut v: Vec<u64> = list.split(',').filter(|x| !x.trim().is_empty()).map(parse_size).collect::<CliResult<_>>()?;
    if v.is_empty() {
        return Err(CliError::input("--sizes: no size given"));
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Fills `buf` with a pattern that is not periodic over any small stride (a copy landing at
/// a wrong offset shows), different for every `seed`.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let s = splitmix(seed);
    let mut chunks = buf.chunks_exact_mut(8);
    for (k, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&splitmix(s ^ k as u64).to_le_bytes());
    }
    let rem = chunks.into_remainder();
    let last = splitmix(s ^ u64::MAX).to_le_bytes();
    rem.copy_from_slice(&last[..rem.len()]);
}

/// Bytes that differ between `got` and `want` (equal lengths).
pub fn count_wrong(got: &[u8], want: &[u8]) -> u64 {
    if got == want {
        return 0;
    }
    got.iter().zip(want).filter(|(a, b)| a != b).count() as u64 + got.len().abs_diff(want.len()) as u64
}

/// How `mori peer-bw` measures.
#[derive(Debug, Clone, Serialize)]
pub struct MeasureConfig {
    /// Bytes per copy, each measured for every pair.
    pub sizes: Vec<u64>,
    /// Timed copies per (pair, size).
    pub iterations: u32,
    /// Untimed copies before them.
    pub warmup: u32,
}

/// One (pair, size) measured here: the detector's [`Measurement`] plus how it was taken.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// What the detector reads (`src`, `dst`, `bytes`, `gbps`, `peer_access`, `wrong_bytes`).
    #[serde(flatten)]
    pub m: Measurement,
    /// `self` (a device to itself) or `peer`.
    pub label: &'static str,
    /// Every byte of the destination matched the source after the timed copies.
    pub verified: bool,
    /// Timed copies.
    pub iterations: u32,
    /// Time of the timed copies, ms (timing events on the source device's stream).
    pub elapsed_ms: f64,
}

/// Host buffers reused over every (pair, size): the pattern and the read-back copy.
struct HostBufs {
    want: Vec<u8>,
    got: Vec<u8>,
}

fn gpu_step(what: impl FnOnce() -> String) -> impl FnOnce(GpuError) -> CliError {
    move |e| CliError::Unavailable(format!("{}: {}", what(), one_line(&e.to_string())))
}

/// Copies `bytes` from device `src` to device `dst`: pattern in (on the source's stream),
/// destination filled with another byte, `warmup` untimed copies, `iterations` copies between
/// two timing events on a stream of the source device, read back and compared.
fn measure_one(
    rt: &Arc<dyn Runtime>,
    (src, dst): (u32, u32),
    bytes: usize,
    seed: u64,
    cfg: &MeasureConfig,
    peer_access: bool,
    host: &mut HostBufs,
) -> CliResult<Measured> {
    let at = || format!("GPU{src} -> GPU{dst}, {}", bytes_text(bytes as u64));
    let (s, d) = (Device(src), Device(dst));
    let sbuf = rt.alloc(s, bytes).map_err(gpu_step(|| format!("{}: allocating the source", at())))?;
    let dbuf = rt.alloc(d, bytes).map_err(gpu_step(|| format!("{}: allocating the destination", at())))?;
    let stream = rt.stream(s).map_err(gpu_step(|| format!("{}: creating a stream", at())))?;
    let want = &mut host.want[..bytes];
    fill_pattern(want, seed);
    // SAFETY: `want` is neither moved nor touched until the stream is synchronized below.
    unsafe { rt.copy_htod_async(&sbuf.slice(), want, &stream) }
        .and_then(|()| stream.synchronize())
        .map_err(gpu_step(|| format!("{}: filling the source", at())))?;
    // Any byte other than the pattern's first: an untouched destination cannot pass for a copy.
    let fill = !want[0];
    rt.memset(&dbuf.slice(), fill).map_err(gpu_step(|| format!("{}: clearing the destination", at())))?;
    let copy =
        |what: &str| rt.copy_dtod_async(&dbuf.slice(), &sbuf.slice(), &stream).map_err(gpu_step(|| format!("{}: {what} copy", at())));
    for _ in 0..cfg.warmup {
        copy("warm-up")?;
    }
    stream.synchronize().map_err(gpu_step(|| format!("{}: warm-up", at())))?;
    let ev = |what: &str| rt.event(s, true).map_err(gpu_step(|| format!("{}: creating the {what} event", at())));
    let (start, end) = (ev("start")?, ev("end")?);
    start.record(&stream).map_err(gpu_step(|| format!("{}: recording the start event", at())))?;
    for _ in 0..cfg.iterations {
        copy("timed")?;
    }
    end.record(&stream).map_err(gpu_step(|| format!("{}: recording the end event", at())))?;
    end.synchronize().map_err(gpu_step(|| format!("{}: waiting for the timed copies", at())))?;
    stream.synchronize().map_err(gpu_step(|| format!("{}: waiting for the stream", at())))?;
    let ms = f64::from(start.elapsed_ms(&end).map_err(gpu_step(|| format!("{}: elapsed time", at())))?);
    let got = &mut host.got[..bytes];
    rt.copy_dtoh(got, &dbuf.slice()).map_err(gpu_step(|| format!("{}: reading the destination back", at())))?;
    let wrong = count_wrong(got, &host.want[..bytes]);
    if !(ms.is_finite() && ms > 0.0) {
        return Err(CliError::Unavailable(format!(
            "{}: the timing events report {ms} ms for {} copies: no bandwidth can be computed",
            at(),
            cfg.iterations
        )));
    }
    let gbps = (bytes as f64 * f64::from(cfg.iterations)) / (ms / 1e3) / 1e9;
    Ok(Measured {
        m: Measurement { src: src as usize, dst: dst as usize, bytes: bytes as u64, gbps, peer_access, wrong_bytes: wrong },
        label: if src == dst { "self" } else { "peer" },
        verified: wrong == 0,
        iterations: cfg.iterations,
        elapsed_ms: ms,
    })
}

/// Measures every ordered pair of the runtime's devices (`i -> i` included) at every size.
/// Peer access is enabled where the runtime allows it (the copy still runs where it does not:
/// the driver stages it, which is what the detector is for). `progress` sees each result.
/// Errors: a GPU call failed (one line naming the pair, the size and the call).
pub fn measure(rt: &Arc<dyn Runtime>, cfg: &MeasureConfig, mut progress: impl FnMut(&Measured)) -> CliResult<Vec<Measured>> {
    let n = rt.device_count().map_err(gpu_step(|| "device count".to_string()))?;
    if n == 0 {
        return Err(CliError::Unavailable("the GPU runtime sees no device: nothing was measured".into()));
    }
    if cfg.iterations == 0 {
        return Err(CliError::input("--iters must be at least 1"));
    }
    let max = cfg.sizes.iter().copied().max().unwrap_or(0);
    let max = usize::try_from(max).map_err(|_| CliError::input("--sizes: a size exceeds the address space"))?;
    let mut host = HostBufs { want: vec![0u8; max], got: vec![0u8; max] };
    let mut out = Vec::new();
    for src in 0..n {
        for dst in 0..n {
            let peer =
                rt.can_access_peer(Device(src), Device(dst)).map_err(gpu_step(|| format!("GPU{src} -> GPU{dst}: peer-access query")))?;
            if peer && src != dst {
                rt.enable_peer_access(Device(src), Device(dst))
                    .map_err(gpu_step(|| format!("GPU{src} -> GPU{dst}: enabling peer access")))?;
            }
            for (k, &b) in cfg.sizes.iter().enumerate() {
                let seed = (u64::from(src) << 40) ^ (u64::from(dst) << 20) ^ k as u64;
                let m = measure_one(rt, (src, dst), b as usize, seed, cfg, peer, &mut host)?;
                progress(&m);
                out.push(m);
            }
        }
    }
    Ok(out)
}

/// The topology a measured run is judged against, indexed by runtime ordinal: the class of
/// each pair from `source` (sysfs, matched by PCI bus id; or a capture, whose indices are
/// taken as runtime ordinals), `self` on the diagonal, `unknown` where the source cannot say.
/// `runtime_bus` holds each device's bus id. Errors: a capture with fewer GPUs than the
/// runtime sees.
pub fn align_topology(runtime_bus: &[String], source: Result<TopoMatrix, String>, from_capture: bool) -> CliResult<TopoMatrix> {
    let n = runtime_bus.len();
    let mut notes = Vec::new();
    let (src, map): (Option<TopoMatrix>, Vec<Option<usize>>) = match source {
        Err(e) => {
            notes.push(format!("no topology ({e}): every pair other than a device to itself is class unknown"));
            (None, vec![None; n])
        }
        Ok(m) if from_capture => {
            if m.gpus.len() < n {
                return Err(CliError::input(format!("--topo: the capture shows {} GPUs but the runtime sees {n}", m.gpus.len())));
            }
            notes.push("capture GPU indices are taken as runtime ordinals".into());
            let parsed: Vec<Option<PciBusId>> = runtime_bus.iter().map(|b| b.parse().ok()).collect();
            if parsed.windows(2).any(|w| matches!((w[0], w[1]), (Some(a), Some(b)) if a > b)) {
                notes.push(
                    "the runtime does not number devices in PCI bus order, but nvidia-smi and rocm-smi do: set CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA) so the indices agree".into(),
                );
            }
            (Some(m), (0..n).map(Some).collect())
        }
        Ok(m) => {
            let sys: Vec<Option<PciBusId>> = m.gpus.iter().map(|g| g.parse().ok()).collect();
            let map: Vec<Option<usize>> =
                runtime_bus.iter().map(|b| b.parse::<PciBusId>().ok().and_then(|b| sys.iter().position(|s| *s == Some(b)))).collect();
            for (i, b) in runtime_bus.iter().enumerate().filter(|(i, _)| map[*i].is_none()) {
                notes.push(format!("GPU{i} ({b}) is not among the GPUs in {}: its pairs are class unknown", m.source));
            }
            (Some(m), map)
        }
    };
    let mut out = TopoMatrix {
        source: src.as_ref().map_or_else(|| "none".to_string(), |m| m.source.clone()),
        gpus: runtime_bus.to_vec(),
        nics: Vec::new(),
        gpu_gpu: vec![vec![LinkClass::Unknown; n]; n],
        gpu_gpu_raw: vec![vec![String::new(); n]; n],
        gpu_nic: vec![Vec::new(); n],
        gpu_nic_raw: vec![Vec::new(); n],
        gpu_numa: vec![None; n],
        notes: src.as_ref().map(|m| m.notes.clone()).unwrap_or_default(),
    };
    out.notes.extend(notes);
    for i in 0..n {
        if let (Some(m), Some(a)) = (&src, map[i]) {
            out.gpu_numa[i] = m.gpu_numa.get(a).copied().flatten();
        }
        for j in 0..n {
            if i == j {
                out.gpu_gpu[i][j] = LinkClass::SelfLink;
                out.gpu_gpu_raw[i][j] = "self".into();
            } else if let (Some(m), Some(a), Some(b)) = (&src, map[i], map[j]) {
                out.gpu_gpu[i][j] = m.gpu_gpu[a][b];
                out.gpu_gpu_raw[i][j] = m.gpu_gpu_raw[a][b].clone();
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn call(runtime: RuntimeKind, call: &'static str, code: u32, name: &'static str) -> GpuError {
        GpuError::Call { runtime, call, code, name: Cow::Borrowed(name), hint: Some("FABRIC handles need an IMEX channel".into()) }
    }

    #[test]
    fn fabric_verdicts() {
        assert!(fabric_verdict(Ok(())).available);
        let e = call(RuntimeKind::Cuda, "cuMemCreate", 800, "CUDA_ERROR_NOT_PERMITTED");
        let v = fabric_verdict(Err(&e));
        assert_eq!((v.available, v.status.as_str()), (false, "not available (no IMEX channel)"));
        assert!(v.error.unwrap().contains("CUDA_ERROR_NOT_PERMITTED (800)"));
        let e = call(RuntimeKind::Cuda, "cuMemCreate", 801, "CUDA_ERROR_NOT_SUPPORTED");
        assert_eq!(fabric_verdict(Err(&e)).status, "not available (not supported by this device or driver)");
        let e = call(RuntimeKind::Cuda, "cuMemMap", 2, "CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(fabric_verdict(Err(&e)).status, "not available (cuMemMap: CUDA_ERROR_OUT_OF_MEMORY)");
        // HIP's 800 is not an IMEX matter.
        let e = call(RuntimeKind::Hip, "hipMemCreate", 800, "hipErrorNotPermitted");
        assert!(!fabric_verdict(Err(&e)).status.contains("IMEX"));
    }

    #[test]
    fn versions_and_bytes() {
        assert_eq!(driver_version_text(RuntimeKind::Cuda, 13000), "13.0");
        assert_eq!(driver_version_text(RuntimeKind::Cuda, 12080), "12.8");
        assert_eq!(driver_version_text(RuntimeKind::Hip, 60_443_483), "6.4.43483");
        assert_eq!(bytes_text(1 << 20), "1 MiB");
        assert_eq!(bytes_text(256 << 20), "256 MiB");
        assert_eq!(bytes_text(150_011_101_184), "139.7 GiB");
        assert_eq!(bytes_text(100), "100 B");
        assert_eq!(one_line("a\n  b\r\nc"), "a b c");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_sizes("1MiB,16MiB,256MiB").unwrap(), vec![1 << 20, 16 << 20, 256 << 20]);
        assert_eq!(parse_sizes(" 16M , 1m,4096,1MiB").unwrap(), vec![4096, 1 << 20, 16 << 20]);
        assert_eq!(parse_sizes("2GiB,1KB").unwrap(), vec![1000, 2 << 30]);
        for bad in ["", "0MiB", "1TiB", "MiB", "1.5MiB", "-1"] {
            assert!(parse_sizes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pattern_and_compare() {
        let mut a = vec![0u8; 1027];
        let mut b = vec![0u8; 1027];
        fill_pattern(&mut a, 1);
        fill_pattern(&mut b, 1);
        assert_eq!(count_wrong(&a, &b), 0);
        fill_pattern(&mut b, 2);
        assert!(count_wrong(&a, &b) > 1000, "different seeds give different patterns");
        // Not periodic over small strides: a copy shifted by 1..64 bytes shows.
        for shift in 1..64 {
            assert!(count_wrong(&a[shift..], &a[..a.len() - shift]) > 900, "shift {shift}");
        }
        fill_pattern(&mut b, 1);
        b[5] ^= 1;
        b[1026] ^= 0x80;
        assert_eq!(count_wrong(&b, &a), 2);
    }

    fn matrix(source: &str, gpus: &[&str], classes: Vec<Vec<LinkClass>>) -> TopoMatrix {
        let n = gpus.len();
        TopoMatrix {
            source: source.into(),
            gpus: gpus.iter().map(|s| s.to_string()).collect(),
            nics: vec![],
            gpu_gpu_raw: classes.iter().map(|r| r.iter().map(|c| c.code().to_string()).collect()).collect(),
            gpu_gpu: classes,
            gpu_nic: vec![vec![]; n],
            gpu_nic_raw: vec![vec![]; n],
            gpu_numa: (0..n as u32).map(Some).collect(),
            notes: vec![],
        }
    }

    #[test]
    fn topology_by_bus_id_and_by_index() {
        use LinkClass::*;
        let sys = matrix(
            "sysfs",
            &["0000:03:00.0", "0000:05:00.0", "0000:81:00.0"],
            vec![vec![SelfLink, PcieHost, CrossSocket], vec![PcieHost, SelfLink, CrossSocket], vec![CrossSocket, CrossSocket, SelfLink]],
        );
        // The runtime numbers 0000:81 first and sees a device sysfs does not show.
        let rt = ["0000:81:00.0".to_string(), "0000:03:00.0".into(), "0000:99:00.0".into()];
        let t = align_topology(&rt, Ok(sys.clone()), false).unwrap();
        assert_eq!(t.gpu_gpu[0], vec![SelfLink, CrossSocket, Unknown]);
        assert_eq!(t.gpu_gpu[1], vec![CrossSocket, SelfLink, Unknown]);
        assert_eq!(t.gpu_gpu[2], vec![Unknown, Unknown, SelfLink]);
        assert_eq!(t.gpu_numa, vec![Some(2), Some(0), None]);
        assert!(t.notes.iter().any(|n| n.starts_with("GPU2 (0000:99:00.0) is not among")), "{:?}", t.notes);
        // A capture: indices are ordinals; the out-of-order runtime numbering is named.
        let t = align_topology(&rt[..2], Ok(sys.clone()), true).unwrap();
        assert_eq!(t.gpu_gpu[0], vec![SelfLink, PcieHost]);
        assert!(t.notes.iter().any(|n| n.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID")), "{:?}", t.notes);
        assert!(align_topology(&vec!["a".to_string(); 4], Ok(sys), true).is_err());
        // No topology: self and unknown.
        let t = align_topology(&rt[..2], Err("sysfs shows no GPU".into()), false).unwrap();
        assert_eq!((t.source.as_str(), t.gpu_gpu[0].clone()), ("none", vec![SelfLink, Unknown]));
        assert!(t.notes[0].starts_with("no topology (sysfs shows no GPU)"));
    }
}
