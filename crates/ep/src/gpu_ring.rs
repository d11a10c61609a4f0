//! The proxy's command ring with GPU warps as producers: the host side of
//! `kernels/ep_proxy.cu` (`mori_ring_push` and the two kernels that drive it).
//!
//! A [`DeviceRing`] keeps the head (the next ticket) in device memory, so the producers'
//! atomics stay on the GPU, and the ring region ([`crate::ring`]'s layout) in pinned host
//! memory mapped into the device: warps write commands across the host link, the proxy thread
//! ([`crate::proxy::RingProxy`]) reads them from host memory. [`RingKernels`] launches
//! `mori_ep_ring_roundtrip` (one command, then a spin on the destination's counter, timed per
//! round trip on the GPU clock) and `mori_ep_ring_flood` (every warp stages chunks into the
//! source window and pushes one command each).

use crate::gpu::{EpGpuError, GpuResult};
use crate::ring::{RingLayout, RingMem};
use crate::EpError;
use mori_gpu::{
    Device, DeviceBuffer, DeviceSlice, Function, KernelArgs, KernelImages, LaunchConfig, Module, PinnedBuffer, Runtime, Stream,
};
use std::time::Duration;

static CUBIN: &[u8] = include_bytes!("../../../kernels/prebuilt/ep_proxy.sm_90.cubin");
static PTX: &str = include_str!("../../../kernels/prebuilt/ep_proxy.sm_90.ptx");
static GFX942: &[u8] = include_bytes!("../../../kernels/prebuilt/ep_proxy.gfx942.hsaco");

/// `RingDev` of the kernel ABI.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingDev {
    pub(crate) head: u64,
    pub(crate) region: u64,
    pub(crate) slots: u32,
    pub(crate) pad: u32,
}

/// A command ring whose producers are GPU warps of one device.
pub struct DeviceRing {
    head: DeviceBuffer,
    region: PinnedBuffer,
    layout: RingLayout,
    mem: RingMem,
}

impl std::fmt::Debug for DeviceRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceRing({} slots, region {:?})", self.layout.slots(), self.region)
    }
}

impl DeviceRing {
    /// A zeroed ring of `slots` slots (a power of two, 2..=2^20) for kernels on `dev`.
    /// Errors: `InvalidConfig` for `slots`; the runtime's allocation errors.
    pub fn new(rt: &dyn Runtime, dev: Device, slots: usize) -> GpuResult<Self> {
        let layout = RingLayout::new(slots)?;
        let head = rt.alloc(dev, 8)?;
        rt.memset(&head.slice(), 0)?;
        let region = rt.alloc_mapped(dev, layout.bytes())?;
        if !region.ptr().is_multiple_of(64) {
            return Err(EpGpuError::Ep(EpError::InvalidConfig {
                field: "ring region address",
                value: format!("{:#x}", region.ptr()),
                reason: "the runtime returned pinned memory that is not 64-byte aligned".into(),
            }));
        }
        // SAFETY: the region is 64-aligned (checked), zeroed at allocation, `layout.bytes()`
        // long, and lives as long as `self`; `mem`'s users (the consumer) are bounded by it.
        let mem = unsafe { RingMem::new(region.ptr() as usize as *mut u8, layout)? };
        Ok(Self { head, region, layout, mem })
    }

    /// The host view of the region, for the consumer (valid while `self` lives).
    pub fn mem(&self) -> RingMem {
        self.mem
    }

    /// The layout.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// The kernel ABI's view (head and the region's device address).
    pub(crate) fn dev_args(&self) -> GpuResult<RingDev> {
        self.dev()
    }

    fn dev(&self) -> GpuResult<RingDev> {
        let region = self.region.device_ptr().ok_or_else(|| {
            EpGpuError::Ep(EpError::InvalidConfig { field: "ring region", value: "pinned".into(), reason: "not device-mapped".into() })
        })?;
        Ok(RingDev { head: self.head.ptr(), region, slots: self.layout.slots() as u32, pad: 0 })
    }
}

/// A window the proxy reads from or writes into: GPU memory (the xgmi leg) or pinned host
/// memory mapped into the device (the tcp leg: kernels stage into host memory).
pub enum Window {
    /// Device memory.
    Gpu(DeviceBuffer),
    /// Pinned host memory with a device mapping.
    Host(PinnedBuffer),
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Window::Gpu(b) => write!(f, "Window::Gpu({:#x}+{})", b.ptr(), b.len()),
            Window::Host(b) => write!(f, "Window::Host({b:?})"),
        }
    }
}

impl Window {
    /// `len > 0` zeroed bytes on `dev`: device memory when `on_gpu`, else mapped pinned host
    /// memory. Errors: the runtime's allocation errors.
    pub fn new(rt: &dyn Runtime, dev: Device, on_gpu: bool, len: usize) -> GpuResult<Self> {
        Ok(if on_gpu {
            let b = rt.alloc(dev, len)?;
            rt.memset(&b.slice(), 0)?;
            Window::Gpu(b)
        } else {
            Window::Host(rt.alloc_mapped(dev, len)?)
        })
    }

    /// The address this process registers with MORI-IO.
    pub fn host_ptr(&self) -> u64 {
        match self {
            Window::Gpu(b) => b.ptr(),
            Window::Host(b) => b.ptr(),
        }
    }

    /// The address kernels use.
    pub fn dev_ptr(&self) -> u64 {
        match self {
            Window::Gpu(b) => b.ptr(),
            Window::Host(b) => b.device_ptr().unwrap_or(0),
        }
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        match self {
            Window::Gpu(b) => b.len(),
            Window::Host(b) => b.len(),
        }
    }

    /// Whether it has no bytes (never: allocations of 0 bytes are refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where MORI-IO should think it is (`dev` for GPU memory).
    pub fn loc(&self, dev: Device) -> mori_io::MemLoc {
        match self {
            Window::Gpu(_) => mori_io::MemLoc::Gpu { device: dev.0 },
            Window::Host(_) => mori_io::MemLoc::Host { numa: None },
        }
    }

    /// `InvalidConfig` (naming `what`) unless `len` bytes at `off` lie inside the window.
    fn check_range(&self, what: &'static str, off: usize, len: usize) -> GpuResult<()> {
        if off.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(EpGpuError::Ep(EpError::InvalidConfig {
                field: what,
                value: format!("{len} bytes at {off}"),
                reason: format!("the window holds {} bytes", self.len()),
            }));
        }
        Ok(())
    }

    /// Copies `bytes` to byte `off` (synchronous). Errors: a range outside the window
    /// (`InvalidConfig`), the runtime's copy errors.
    pub fn write(&mut self, rt: &dyn Runtime, off: usize, bytes: &[u8]) -> GpuResult<()> {
        self.check_range("window write", off, bytes.len())?;
        match self {
            Window::Gpu(b) => Ok(rt.copy_htod(&b.sub(off, bytes.len())?, bytes)?),
            Window::Host(b) => {
                b.as_mut_slice()[off..off + bytes.len()].copy_from_slice(bytes);
                Ok(())
            }
        }
    }

    /// Copies `out.len()` bytes from byte `off` (synchronous). Errors: a range outside the
    /// window (`InvalidConfig`), the runtime's copy errors.
    pub fn read(&self, rt: &dyn Runtime, off: usize, out: &mut [u8]) -> GpuResult<()> {
        self.check_range("window read", off, out.len())?;
        match self {
            Window::Gpu(b) => Ok(rt.copy_dtoh(out, &b.sub(off, out.len())?)?),
            Window::Host(b) => {
                out.copy_from_slice(&b.as_slice()[off..off + out.len()]);
                Ok(())
            }
        }
    }
}

/// `RoundtripParams` of the kernel ABI.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RoundtripParams {
    ring: RingDev,
    counter: u64,
    times: u64,
    status: u64,
    local_off: u64,
    remote_off: u64,
    len: u64,
    counter_off: u64,
    base: u64,
    timeout_ns: u64,
    dst: u32,
    iters: u32,
}

/// `FloodParams` of the kernel ABI.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct FloodParams {
    ring: RingDev,
    src: u64,
    status: u64,
    chunk: u64,
    len: u64,
    timeout_ns: u64,
    counter_base: u64,
    dst: u32,
    per_warp: u32,
    counters: u32,
    pad: u32,
}

/// One round-trip run: `iters` times one command (`len` bytes from `local_off` of the
/// producer's window to `remote_off` of rank `dst`'s, then Add 1 on the u64 at `counter_off`
/// of its counter region) and a spin until the counter, at device address `counter_ptr`,
/// reaches `base + i + 1`.
#[derive(Debug, Clone, Copy)]
pub struct RoundtripSpec {
    /// Destination rank (the proxy's peer index).
    pub dst: u32,
    /// Source byte offset.
    pub local_off: u64,
    /// Destination byte offset.
    pub remote_off: u64,
    /// Bytes per command.
    pub len: u64,
    /// Byte offset of the counter in the destination's counter region.
    pub counter_off: u64,
    /// The counter as the device addresses it (a device mapping of the host counter).
    pub counter_ptr: u64,
    /// The counter's value before the run.
    pub base: u64,
    /// Round trips.
    pub iters: u32,
    /// Deadline of each round trip.
    pub timeout: Duration,
}

/// One flood run: `blocks` x `warps` warps, each staging `per_warp` chunks of `len` bytes
/// (`chunk` bytes apart, chunk `c` at `c * chunk` of the source window at device address
/// `src_ptr`, word `w` = [`flood_word`]`(c, w)`) and pushing one command per chunk to rank
/// `dst` (same offset there, Add 1 on counter `c % counters`: the u64 at byte
/// `counter_base + 8 * (c % counters)` of its counter region).
#[derive(Debug, Clone, Copy)]
pub struct FloodSpec {
    /// Destination rank.
    pub dst: u32,
    /// The source window as the device addresses it.
    pub src_ptr: u64,
    /// Bytes between chunks.
    pub chunk: u64,
    /// Bytes per chunk (a multiple of 4, at most `chunk`).
    pub len: u64,
    /// Chunks per warp.
    pub per_warp: u32,
    /// Counters the commands spread over.
    pub counters: u32,
    /// Byte offset of the first counter in the destination's counter region (8-aligned).
    pub counter_base: u64,
    /// Blocks.
    pub blocks: u32,
    /// Warps per block (1..=16).
    pub warps: u32,
    /// Deadline for the whole run's pushes.
    pub timeout: Duration,
}

impl FloodSpec {
    /// Chunks in all.
    pub fn chunks(&self) -> u64 {
        self.blocks as u64 * self.warps as u64 * self.per_warp as u64
    }
}

/// Word `w` of flood chunk `c`, as `mori_ep_ring_flood` writes it (`ep_flood_word`).
pub fn flood_word(c: u32, w: u32) -> u32 {
    let mut x = c.wrapping_mul(2_654_435_761) ^ w.wrapping_add(1).wrapping_mul(40_503);
    x ^= x >> 15;
    x = x.wrapping_mul(2_246_822_519);
    x ^ (x >> 13)
}

/// What a ring kernel's status words say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingKernelFault {
    /// The ring stayed full until the deadline (warp or iteration, chunk).
    RingFull(u32, u32),
    /// The destination's counter did not arrive before the deadline (iteration).
    CounterTimeout(u32),
    /// An unknown code.
    Other(u32),
}

impl RingKernelFault {
    /// The fault in status words `s` (`[code, a, b, _]`), `None` when the code is 0.
    pub fn from_status(s: [u32; 4]) -> Option<Self> {
        match s[0] {
            0 => None,
            1 => Some(Self::RingFull(s[1], s[2])),
            2 => Some(Self::CounterTimeout(s[1])),
            c => Some(Self::Other(c)),
        }
    }
}

/// The loaded ring kernels of one device.
pub struct RingKernels {
    _module: Module,
    roundtrip: Function,
    flood: Function,
}

impl std::fmt::Debug for RingKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingKernels({:?})", self.roundtrip)
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl RingKernels {
    /// Loads kernels/ep_proxy's image for `rt` on `dev`. Errors: the runtime's load errors.
    pub fn load(rt: &dyn Runtime, dev: Device) -> GpuResult<Self> {
        let module = KernelImages { cubin: CUBIN, ptx: PTX, hsaco: GFX942 }.load(rt, dev)?;
        let roundtrip = module.function("mori_ep_ring_roundtrip")?;
        let flood = module.function("mori_ep_ring_flood")?;
        Ok(Self { _module: module, roundtrip, flood })
    }

    /// Queues a round-trip run on `stream`: `times` receives `spec.iters` u64 nanoseconds,
    /// `status` (16 bytes, zeroed by the caller) the fault words.
    /// Errors: `InvalidConfig` for buffers too small; launch errors.
    pub fn roundtrip(
        &self,
        stream: &Stream,
        ring: &DeviceRing,
        spec: &RoundtripSpec,
        times: &DeviceSlice<'_>,
        status: &DeviceSlice<'_>,
    ) -> GpuResult<()> {
        check_len("round-trip times", times.len(), spec.iters as usize * 8)?;
        check_len("status words", status.len(), 16)?;
        let p = RoundtripParams {
            ring: ring.dev()?,
            counter: spec.counter_ptr,
            times: times.ptr(),
            status: status.ptr(),
            local_off: spec.local_off,
            remote_off: spec.remote_off,
            len: spec.len,
            counter_off: spec.counter_off,
            base: spec.base,
            timeout_ns: ns(spec.timeout),
            dst: spec.dst,
            iters: spec.iters,
        };
        let cfg = LaunchConfig { grid: (1, 1, 1), block: (32, 1, 1), shared_mem_bytes: 0 };
        let mut args = KernelArgs::new();
        args.push(p);
        // SAFETY: one by-value RoundtripParams, laid out as the kernel's; every address in it
        // (head, ring region, counter, times, status) stays allocated until the caller
        // synchronizes the stream (documented contract of the spec's owners).
        unsafe { self.roundtrip.launch(stream, &cfg, &args.params())? };
        Ok(())
    }

    /// Queues a flood run on `stream` (`status`: 16 bytes, zeroed by the caller).
    /// Errors: `InvalidConfig` for a zero or oversized field; launch errors.
    pub fn flood(&self, stream: &Stream, ring: &DeviceRing, spec: &FloodSpec, status: &DeviceSlice<'_>) -> GpuResult<()> {
        check_len("status words", status.len(), 16)?;
        if spec.len == 0
            || !spec.len.is_multiple_of(4)
            || spec.len > spec.chunk
            || spec.counters == 0
            || !(1..=16).contains(&spec.warps)
            || spec.blocks == 0
        {
            return Err(EpGpuError::Ep(EpError::InvalidConfig {
                field: "flood spec",
                value: format!("{spec:?}"),
                reason: "len a non-zero multiple of 4 and <= chunk, counters >= 1, counter_base 8-aligned, 1..=16 warps, blocks >= 1"
                    .into(),
            }));
        }
        let p = FloodParams {
            ring: ring.dev()?,
            src: spec.src_ptr,
            status: status.ptr(),
            chunk: spec.chunk,
            len: spec.len,
            timeout_ns: ns(spec.timeout),
            counter_base: spec.counter_base,
            dst: spec.dst,
            per_warp: spec.per_warp,
            counters: spec.counters,
            pad: 0,
        };
        let cfg = LaunchConfig { grid: (spec.blocks, 1, 1), block: (spec.warps * 32, 1, 1), shared_mem_bytes: 0 };
        let mut args = KernelArgs::new();
        args.push(p);
        // SAFETY: one by-value FloodParams, laid out as the kernel's; the source window holds
        // chunks() * chunk bytes (the caller's contract) and stays allocated, as do the ring
        // and status, until the stream is synchronized.
        unsafe { self.flood.launch(stream, &cfg, &args.params())? };
        Ok(())
    }
}

fn check_len(what: &'static str, got: usize, want: usize) -> GpuResult<()> {
    if got < want {
        return Err(EpGpuError::Ep(EpError::InvalidConfig {
            field: what,
            value: format!("{got} bytes"),
            reason: format!("needs at least {want} bytes"),
        }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_sizes() {
        assert_eq!(std::mem::size_of::<RingDev>(), 24);
        assert_eq!(std::mem::size_of::<RoundtripParams>(), 24 + 9 * 8 + 8);
        assert_eq!(std::mem::size_of::<FloodParams>(), 24 + 6 * 8 + 16);
    }

    #[test]
    fn kernel_source_matches_the_host_mirror() {
        let src = include_str!("../../../kernels/ep_proxy.cu");
        let ring = include_str!("../../../kernels/mori_ring.h");
        for needle in ["#define RING_TAIL_BYTES 64", "#define RING_SLOT_BYTES 64", "#define RING_OP_ADD 1u", "#define RING_OP_SET 2u"] {
            assert!(ring.contains(needle), "mori_ring.h lost {needle}");
        }
        assert_eq!((crate::ring::TAIL_BYTES, crate::ring::SLOT_BYTES, crate::ring::OP_ADD, crate::ring::OP_SET), (64, 64, 1, 2));
        // ep_flood_word's constants and shifts.
        assert!(src.contains("c * 2654435761u ^ (w + 1) * 40503u") && src.contains("x *= 2246822519u"));
        assert_eq!(flood_word(0, 0), {
            let mut x: u32 = 40503;
            x ^= x >> 15;
            x = x.wrapping_mul(2_246_822_519);
            x ^ (x >> 13)
        });
    }
}

#[cfg(test)]
#[path = "gpu_ring_emu_tests.rs"]
mod emu_tests;
