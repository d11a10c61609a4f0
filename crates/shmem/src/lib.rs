//! mori-shmem: a symmetric heap over GPU peer-to-peer memory (NVLink / XGMI, or one GPU).
//!
//! Every PE (processing element = rank) allocates one heap of the same size `bytes` on its
//! GPU; an object lives at the same byte offset in every PE's heap. [`SymmetricHeap`] maps
//! every PE's heap into this process — PEs of this process by their device pointer, PEs of
//! other processes through CUDA/HIP IPC handles exchanged over a [`mori_bootstrap::Bootstrap`]
//! — and hands device code a table of those addresses ([`SymmetricHeap::peer_table`]).
//!
//! Host-side one-sided operations, queued on a stream (in order with the caller's kernels):
//! [`SymmetricHeap::put`] (copy into a PE's heap), [`SymmetricHeap::put_with_signal`] (copy,
//! then a 32-bit signal store that lands after the data), [`SymmetricHeap::atomic_add`]
//! (system-scope 64-bit atomic add on any PE's heap) and [`SymmetricHeap::wait_until`]
//! (host poll of a local 32-bit word with a deadline). Every offset and length is checked
//! against the heap size before anything is queued.
//!
//! Two ways to build one: [`SymmetricHeap::in_process`] (all PEs in this process, e.g. 8 EP
//! ranks sharing one GPU) and [`SymmetricHeap::with_bootstrap`] (one or more PEs per process,
//! handles exchanged through the bootstrap).

#![warn(missing_docs)]

use mori_bootstrap::Bootstrap;
use mori_gpu::{
    Device, DeviceBuffer, DeviceSlice, Function, GpuError, IpcHandle, IpcMapping, KernelArgs, KernelImages, LaunchConfig, Module, Runtime,
    Stream,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

static CUBIN: &[u8] = include_bytes!("../../../kernels/prebuilt/shmem.sm_90.cubin");
static PTX: &str = include_str!("../../../kernels/prebuilt/shmem.sm_90.ptx");
static GFX942: &[u8] = include_bytes!("../../../kernels/prebuilt/shmem.gfx942.hsaco");

/// Errors of the symmetric heap.
#[derive(Debug, thiserror::Error)]
pub enum ShmemError {
    /// A GPU runtime call failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The bootstrap exchange failed.
    #[error("symmetric heap: bootstrap exchange failed: {0}")]
    Bootstrap(String),
    /// An argument is outside what the heap allows; the message names it and the limit.
    #[error("symmetric heap: {0}")]
    Invalid(String),
    /// A wait passed its deadline.
    #[error("symmetric heap: wait_until on PE {pe} offset {offset}: value {last} still below {want} after {waited:?}")]
    Timeout {
        /// PE whose word was polled.
        pe: usize,
        /// Byte offset of the word.
        offset: usize,
        /// Last value read.
        last: u32,
        /// Value waited for.
        want: u32,
        /// Time waited.
        waited: Duration,
    },
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, ShmemError>;

fn invalid(msg: impl Into<String>) -> ShmemError {
    ShmemError::Invalid(msg.into())
}

/// How a PE's heap is reached from this process.
enum Mapping {
    /// A PE of this process: the index into `local`.
    Local(usize),
    /// A PE of another process, mapped through its IPC handle.
    Ipc(IpcMapping),
}

/// One PE of this process.
struct LocalPe {
    pe: usize,
    buf: DeviceBuffer,
}

/// Per local device: the peer table and the helper kernel.
struct DeviceState {
    device: Device,
    table: DeviceBuffer,
    _module: Module,
    atomic_add: Function,
}

/// The symmetric heap of `world` PEs, each `bytes` long, as seen from this process.
pub struct SymmetricHeap {
    rt: Arc<dyn Runtime>,
    bytes: usize,
    local: Vec<LocalPe>,
    maps: Vec<Mapping>,
    addrs: Vec<u64>,
    devices: Vec<DeviceState>,
}

impl std::fmt::Debug for SymmetricHeap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricHeap")
            .field("world", &self.maps.len())
            .field("bytes", &self.bytes)
            .field("local_pes", &self.local_pes())
            .finish()
    }
}

/// What one process publishes about each of its PEs: PE index, pid, device pointer, IPC handle.
fn encode_record(pe: usize, ptr: u64, handle: &IpcHandle) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + IpcHandle::ENCODED_LEN);
    v.extend_from_slice(&(pe as u64).to_le_bytes());
    v.extend_from_slice(&ptr.to_le_bytes());
    v.extend_from_slice(&handle.to_bytes());
    v
}

fn decode_records(b: &[u8]) -> Result<Vec<(usize, u64, IpcHandle)>> {
    let rec = 16 + IpcHandle::ENCODED_LEN;
    if !b.len().is_multiple_of(rec) {
        return Err(invalid(format!("a peer's PE list is {} bytes, not a multiple of {rec}", b.len())));
    }
    b.chunks(rec)
        .map(|c| {
            let pe = u64::from_le_bytes(c[0..8].try_into().unwrap_or_default()) as usize;
            let ptr = u64::from_le_bytes(c[8..16].try_into().unwrap_or_default());
            Ok((pe, ptr, IpcHandle::from_bytes(&c[16..])?))
        })
        .collect()
}

impl SymmetricHeap {
    /// All `devices.len()` PEs in this process: PE `i` gets a `bytes`-long heap on
    /// `devices[i]` (devices may repeat: several PEs sharing one GPU). Heaps are zeroed.
    /// Peer access is enabled between the distinct devices.
    ///
    /// Errors: [`ShmemError::Invalid`] for no PEs, more than 64, or `bytes == 0`;
    /// [`ShmemError::Gpu`] for allocation or peer-access failures (e.g. two devices that
    /// cannot reach each other).
    pub fn in_process(rt: Arc<dyn Runtime>, devices: &[Device], bytes: usize) -> Result<Self> {
        let local: Vec<(usize, Device)> = devices.iter().copied().enumerate().collect();
        let world = local.len();
        Self::build(rt, &local, world, bytes, None)
    }

    /// PEs spread over the processes of `boot`: this process hosts `local` (PE index, device)
    /// pairs; together the processes must host every PE `0..world` exactly once. IPC handles
    /// travel through `boot.allgather`; PEs of this process are reached directly.
    ///
    /// Errors: [`ShmemError::Invalid`] when the PE sets do not partition `0..world` (names the
    /// PE), `world` is 0 or above 64, or `bytes == 0`; [`ShmemError::Bootstrap`];
    /// [`ShmemError::Gpu`] (IPC open failures name the call and code).
    pub fn with_bootstrap(
        rt: Arc<dyn Runtime>,
        boot: &dyn Bootstrap,
        local: &[(usize, Device)],
        world: usize,
        bytes: usize,
    ) -> Result<Self> {
        Self::build(rt, local, world, bytes, Some(boot))
    }

    fn build(rt: Arc<dyn Runtime>, local: &[(usize, Device)], world: usize, bytes: usize, boot: Option<&dyn Bootstrap>) -> Result<Self> {
        if world == 0 || world > 64 {
            return Err(invalid(format!("world = {world} PEs; supported: 1..=64")));
        }
        if bytes == 0 {
            return Err(invalid("heap size 0 bytes; must be at least 1"));
        }
        if let Some(&(pe, _)) = local.iter().find(|(pe, _)| *pe >= world) {
            return Err(invalid(format!("local PE {pe} is not below world = {world}")));
        }
        let mut devs: Vec<Device> = local.iter().map(|&(_, d)| d).collect();
        devs.sort_by_key(|d| d.0);
        devs.dedup();
        for &a in &devs {
            for &b in &devs {
                rt.enable_peer_access(a, b)?;
            }
        }
        let mut pes = Vec::with_capacity(local.len());
        for &(pe, dev) in local {
            let buf = rt.alloc(dev, bytes)?;
            rt.memset(&buf.slice(), 0)?;
            pes.push(LocalPe { pe, buf });
        }
        let mut maps: Vec<Option<Mapping>> = (0..world).map(|_| None).collect();
        for (i, p) in pes.iter().enumerate() {
            if maps[p.pe].is_some() {
                return Err(invalid(format!("PE {} is listed twice in this process", p.pe)));
            }
            maps[p.pe] = Some(Mapping::Local(i));
        }
        if let Some(boot) = boot {
            if devs.len() > 1 && boot.world_size() > 1 {
                // IPC mappings are opened once per process, on one device; kernels on this
                // process's other devices could not reach them (no peer access to a mapping).
                return Err(invalid(format!(
                    "this process hosts PEs on {} devices and shares the heap with other processes over IPC: \
                     use one device per process, or one process for all PEs",
                    devs.len()
                )));
            }
            let mut mine = Vec::new();
            for p in &pes {
                mine.extend(encode_record(p.pe, p.buf.ptr(), &rt.ipc_export(&p.buf.slice())?));
            }
            let all = boot.allgather(&mine).map_err(|e| ShmemError::Bootstrap(e.to_string()))?;
            let import_dev = devs.first().copied().unwrap_or(Device(0));
            for (proc_rank, b) in all.iter().enumerate() {
                if proc_rank == boot.rank() {
                    continue;
                }
                for (pe, _ptr, handle) in decode_records(b)? {
                    match maps.get(pe) {
                        None => return Err(invalid(format!("process {proc_rank} hosts PE {pe}, not below world = {world}"))),
                        Some(Some(_)) => return Err(invalid(format!("PE {pe} is hosted by two processes"))),
                        Some(None) => {}
                    }
                    if handle.len() < bytes as u64 {
                        return Err(invalid(format!("PE {pe}'s heap is {} bytes, smaller than this process's {bytes}", handle.len())));
                    }
                    maps[pe] = Some(Mapping::Ipc(rt.ipc_import(import_dev, &handle)?));
                }
            }
        }
        let maps: Vec<Mapping> = maps
            .into_iter()
            .enumerate()
            .map(|(pe, m)| m.ok_or_else(|| invalid(format!("no process hosts PE {pe} of world {world}"))))
            .collect::<Result<_>>()?;
        let addrs: Vec<u64> = maps
            .iter()
            .map(|m| match m {
                Mapping::Local(i) => pes[*i].buf.ptr(),
                Mapping::Ipc(map) => map.slice().ptr(),
            })
            .collect();
        let table_bytes: Vec<u8> = addrs.iter().flat_map(|a| a.to_le_bytes()).collect();
        let mut devices = Vec::with_capacity(devs.len());
        for dev in devs {
            let table = rt.alloc(dev, table_bytes.len())?;
            rt.copy_htod(&table.slice(), &table_bytes)?;
            let module = load_module(rt.as_ref(), dev)?;
            let atomic_add = module.function("mori_shmem_atomic_add_u64")?;
            devices.push(DeviceState { device: dev, table, _module: module, atomic_add });
        }
        Ok(SymmetricHeap { rt, bytes, local: pes, maps, addrs, devices })
    }

    /// Number of PEs.
    pub fn world(&self) -> usize {
        self.maps.len()
    }

    /// Bytes of every PE's heap.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The PEs this process hosts, in the order given at construction.
    pub fn local_pes(&self) -> Vec<usize> {
        self.local.iter().map(|p| p.pe).collect()
    }

    /// The runtime the heap was built on.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.rt
    }

    /// Device address of PE `pe`'s heap as mapped in this process (for kernel arguments).
    /// Errors: [`ShmemError::Invalid`] for `pe >= world`.
    pub fn addr(&self, pe: usize) -> Result<u64> {
        self.addrs.get(pe).copied().ok_or_else(|| invalid(format!("PE {pe} is not below world = {}", self.world())))
    }

    /// Device addresses of every PE's heap as mapped in this process, indexed by PE.
    pub fn addrs(&self) -> &[u64] {
        &self.addrs
    }

    /// Whether PE `pe` lives in this process.
    pub fn is_local(&self, pe: usize) -> bool {
        matches!(self.maps.get(pe), Some(Mapping::Local(_)))
    }

    /// `[offset, offset + len)` of PE `pe`'s heap as a device slice (any PE: local or mapped).
    /// Errors: [`ShmemError::Invalid`] when the range leaves the heap.
    pub fn slice(&self, pe: usize, offset: usize, len: usize) -> Result<DeviceSlice<'_>> {
        self.check_range(pe, offset, len)?;
        let (base, dev) = match &self.maps[pe] {
            Mapping::Local(i) => (self.local[*i].buf.ptr(), self.local[*i].buf.device()),
            Mapping::Ipc(m) => (m.slice().ptr(), m.slice().device()),
        };
        // SAFETY: the range lies inside a heap this object keeps allocated or mapped.
        Ok(unsafe { DeviceSlice::from_raw(base + offset as u64, len, dev) })
    }

    /// The device table of heap addresses (`u64[world]`, indexed by PE) on `dev`, for kernels.
    /// Errors: [`ShmemError::Invalid`] when no local PE lives on `dev`.
    pub fn peer_table(&self, dev: Device) -> Result<DeviceSlice<'_>> {
        self.device_state(dev).map(|d| d.table.slice())
    }

    fn device_state(&self, dev: Device) -> Result<&DeviceState> {
        self.devices.iter().find(|d| d.device == dev).ok_or_else(|| invalid(format!("no PE of this process lives on {dev}")))
    }

    fn check_range(&self, pe: usize, offset: usize, len: usize) -> Result<()> {
        if pe >= self.world() {
            return Err(invalid(format!("PE {pe} is not below world = {}", self.world())));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(invalid(format!("range offset {offset} + {len} bytes leaves PE {pe}'s heap of {} bytes", self.bytes))),
        }
    }

    /// Queues a copy of `src` into PE `pe`'s heap at `offset` on `stream`.
    /// Errors: [`ShmemError::Invalid`] when the destination leaves the heap; GPU errors.
    pub fn put(&self, stream: &Stream, pe: usize, offset: usize, src: &DeviceSlice<'_>) -> Result<()> {
        let dst = self.slice(pe, offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.rt.copy_dtod_async(&dst, src, stream)?;
        Ok(())
    }

    /// [`put`](Self::put), then stores the 32-bit `value` at `signal_offset` (4-aligned) of the
    /// same PE's heap, on the same stream: a reader that sees the signal sees the data.
    /// Errors: as `put`, and a signal offset that is misaligned or leaves the heap.
    pub fn put_with_signal(
        &self,
        stream: &Stream,
        pe: usize,
        offset: usize,
        src: &DeviceSlice<'_>,
        signal_offset: usize,
        value: u32,
    ) -> Result<()> {
        if !signal_offset.is_multiple_of(4) {
            return Err(invalid(format!("signal offset {signal_offset} is not 4-byte aligned")));
        }
        let sig = self.slice(pe, signal_offset, 4)?;
        self.put(stream, pe, offset, src)?;
        stream.write_value32(&sig, value)?;
        Ok(())
    }

    /// Queues a system-scope atomic add of `value` to the 64-bit word at `offset` (8-aligned)
    /// of PE `pe`'s heap, on `stream` (whose device must host a local PE). When `old` is given
    /// (8 bytes of device memory), the value before the add is written there.
    /// Errors: [`ShmemError::Invalid`] for a misaligned or out-of-heap offset or a stream on a
    /// device without a local PE; GPU errors.
    pub fn atomic_add(&self, stream: &Stream, pe: usize, offset: usize, value: u64, old: Option<&DeviceSlice<'_>>) -> Result<()> {
        if !offset.is_multiple_of(8) {
            return Err(invalid(format!("atomic_add offset {offset} is not 8-byte aligned")));
        }
        let target = self.slice(pe, offset, 8)?;
        if let Some(o) = old {
            if o.len() < 8 {
                return Err(invalid(format!("atomic_add old-value buffer is {} bytes; needs 8", o.len())));
            }
        }
        let st = self.device_state(stream.device())?;
        let mut args = KernelArgs::new();
        args.push(target.ptr()).push(value).push(old.map_or(0, |o| o.ptr()));
        let cfg = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernel takes (u64*, u64, u64*) as pushed; target is inside a live heap
        // and `old` a live device buffer of >= 8 bytes (or 0).
        unsafe { st.atomic_add.launch(stream, &cfg, &args.params())? };
        Ok(())
    }

    /// Polls the 32-bit word at `offset` of local PE `pe` from the host until it is at least
    /// `want`, or `timeout` passes. Returns the value seen.
    /// Errors: [`ShmemError::Timeout`] with the last value; [`ShmemError::Invalid`] for a PE
    /// of another process or a bad offset.
    pub fn wait_until(&self, pe: usize, offset: usize, want: u32, timeout: Duration) -> Result<u32> {
        if !self.is_local(pe) {
            return Err(invalid(format!("wait_until: PE {pe} is not hosted by this process")));
        }
        if !offset.is_multiple_of(4) {
            return Err(invalid(format!("wait_until offset {offset} is not 4-byte aligned")));
        }
        let word = self.slice(pe, offset, 4)?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(1);
        loop {
            let mut b = [0u8; 4];
            self.rt.copy_dtoh(&mut b, &word)?;
            let v = u32::from_le_bytes(b);
            if v >= want {
                return Ok(v);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(ShmemError::Timeout { pe, offset, last: v, want, waited });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(200));
        }
    }
}

fn load_module(rt: &dyn Runtime, dev: Device) -> Result<Module> {
    Ok(KernelImages { cubin: CUBIN, ptx: PTX, hsaco: GFX942 }.load(rt, dev)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_ragged_input() {
        let h = IpcHandle::new(mori_gpu::RuntimeKind::Cuda, [7u8; 64], 4096, 1 << 20, 1234);
        let mut b = encode_record(3, 0xdead_0000, &h);
        b.extend(encode_record(5, 0xbeef_0000, &h));
        let recs = decode_records(&b).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!((recs[0].0, recs[0].1), (3, 0xdead_0000));
        assert_eq!((recs[1].0, recs[1].1), (5, 0xbeef_0000));
        assert_eq!(recs[1].2.offset(), 4096);
        assert_eq!(recs[1].2.len(), 1 << 20);
        let err = decode_records(&b[..b.len() - 1]).unwrap_err().to_string();
        assert!(err.contains("not a multiple"), "{err}");
    }
}
