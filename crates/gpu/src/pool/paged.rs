//! Paged KV-cache copies ([`CopyPool::copy_paged`]): a [`PagedCopy`] (the layout of both
//! sides and the block size) and a table of [`PagedRun`]s, copied by `mori_paged_copy`
//! (kernels/scatter_gather_copy.cu), which computes every address on the device, so the host
//! writes 12 bytes per run instead of a 24-byte descriptor per block and layer. Tables of at
//! most [`PAGED_INLINE_RUNS`] runs travel in the parameters of `mori_paged_copy_inline`
//! (nothing to upload: on the H200 the upload was ~2–3 µs of a 14–25 µs small transfer);
//! larger ones are uploaded from pinned memory on the submission's stream. Where the kernel
//! is not loaded, one async copy per range instead (reported once).
//!
//! The pure pieces (validation, unit numbering, grid size) are functions here, tested
//! against oracles below.

use std::sync::atomic::Ordering;

use bytemuck::{Pod, Zeroable};

use super::{CopyPool, CopySeg, Lane};
use crate::error::{GpuError, Result};
use crate::memory::DeviceSlice;
use crate::module::KernelArgs;
use crate::types::{Device, LaunchConfig};

/// `count` consecutive blocks starting at block `a_block` of side A and block `b_block` of
/// side B (block indices, not bytes). Laid out as the kernel's 12-byte `PagedRun`
/// (kernels/README.md). A run of more than one block is one contiguous byte range per side,
/// so it is allowed only where both sides' `block_stride` equal `block_bytes`
/// ([`PagedCopy::runs`] merges blocks only then).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Pod, Zeroable)]
pub struct PagedRun {
    /// First block on side A (index).
    pub a_block: u32,
    /// First block on side B (index).
    pub b_block: u32,
    /// Blocks in the run (at least 1).
    pub count: u32,
}

/// Where one side's blocks live: block `k` of layer `l`, half `h` (K or V) starts at device
/// address `base + l * layer_stride + h * half_stride + k * block_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PagedSide {
    /// Device address of block 0 of layer 0, half 0.
    pub base: u64,
    /// Bytes from one layer to the next.
    pub layer_stride: u64,
    /// Bytes from one half (K, V) of a layer to the next.
    pub half_stride: u64,
    /// Bytes from one block to the next.
    pub block_stride: u64,
}

impl PagedSide {
    /// Device address of `block` of `layer`, `half`; `None` when it overflows `u64`.
    pub fn block_addr(&self, layer: u32, half: u32, block: u32) -> Option<u64> {
        let l = u64::from(layer).checked_mul(self.layer_stride)?;
        let h = u64::from(half).checked_mul(self.half_stride)?;
        let k = u64::from(block).checked_mul(self.block_stride)?;
        self.base.checked_add(l)?.checked_add(h)?.checked_add(k)
    }
}

/// A paged copy between two KV caches: for every layer in `0..layers`, every half in
/// `0..halves` and every run, `count * block_bytes` bytes from side A to side B
/// (`a_to_b`) or from B to A.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PagedCopy {
    /// Side A's layout (device addresses, bytes).
    pub a: PagedSide,
    /// Side B's layout (device addresses, bytes).
    pub b: PagedSide,
    /// Bytes per block (at least 1).
    pub block_bytes: u64,
    /// Layers (at least 1).
    pub layers: u32,
    /// Halves per layer: 2 for separate K and V, 1 otherwise (at least 1).
    pub halves: u32,
    /// true: copy A to B; false: copy B to A.
    pub a_to_b: bool,
}

impl PagedCopy {
    /// Whether runs of several blocks are allowed: blocks are contiguous on both sides.
    pub fn merges_blocks(&self) -> bool {
        self.a.block_stride == self.block_bytes && self.b.block_stride == self.block_bytes
    }

    /// The runs of two block tables (block `a_blocks[i]` of A pairs with `b_blocks[i]` of
    /// B), consecutive pairs merged into one run where [`PagedCopy::merges_blocks`], else one
    /// run per block. Errors: `InvalidArgument` when the tables differ in length.
    pub fn runs(&self, a_blocks: &[u32], b_blocks: &[u32]) -> Result<Vec<PagedRun>> {
        if a_blocks.len() != b_blocks.len() {
            return Err(GpuError::invalid(format!(
                "paged copy: block tables of {} (side A) and {} (side B) blocks",
                a_blocks.len(),
                b_blocks.len()
            )));
        }
        let merge = self.merges_blocks();
        let mut out: Vec<PagedRun> = Vec::with_capacity(if merge { 16 } else { a_blocks.len() });
        for (&a, &b) in a_blocks.iter().zip(b_blocks) {
            if merge {
                if let Some(last) = out.last_mut() {
                    let next = |x: u32| x.checked_add(last.count);
                    if last.count < u32::MAX && next(last.a_block) == Some(a) && next(last.b_block) == Some(b) {
                        last.count += 1;
                        continue;
                    }
                }
            }
            out.push(PagedRun { a_block: a, b_block: b, count: 1 });
        }
        Ok(out)
    }
}

/// The kernel's by-value parameter (kernels/README.md: 88 bytes, 8-aligned, no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PagedParams {
    a_base: u64,
    a_layer_stride: u64,
    a_half_stride: u64,
    a_block_stride: u64,
    b_base: u64,
    b_layer_stride: u64,
    b_half_stride: u64,
    b_block_stride: u64,
    block_bytes: u64,
    layers: u32,
    halves: u32,
    n_runs: u32,
    a_to_b: u32,
}

const _: () = assert!(std::mem::size_of::<PagedParams>() == 88 && std::mem::align_of::<PagedParams>() == 8);

/// Most runs a table may have to be passed in the parameters of `mori_paged_copy_inline`
/// (kernels/scatter_gather_copy.cu: 88 + 12 x 320 = 3928 bytes, under CUDA's 4 KiB of
/// parameters; HIP adds 256 hidden bytes, so the pool does not use it there); the default of
/// [`super::CopyPoolConfig::paged_inline_runs`].
pub const PAGED_INLINE_RUNS: usize = 320;

/// The environment variable that overrides [`super::CopyPoolConfig::paged_inline_runs`].
pub(crate) const INLINE_ENV: &str = "MORI_GPU_PAGED_INLINE_RUNS";

/// `mori_paged_copy_inline`'s by-value parameter: the params and the table (unused entries
/// zero).
#[repr(C)]
#[derive(Clone, Copy)]
struct PagedInline {
    p: PagedParams,
    runs: [PagedRun; PAGED_INLINE_RUNS],
}

const _: () = assert!(std::mem::size_of::<PagedInline>() == 3928 && std::mem::align_of::<PagedInline>() == 8);

/// The two paged-copy kernels of one module: the run table read from device memory, and
/// the run table in the parameters.
pub(crate) struct PagedKernels {
    pub(crate) table: crate::module::Function,
    pub(crate) inline: crate::module::Function,
}

/// The inline-table limit to use: `env` (the value of [`INLINE_ENV`]) when set, else
/// `configured`. Errors: `InvalidArgument` naming the variable or field when the value is
/// not a number from 0 to [`PAGED_INLINE_RUNS`].
pub(crate) fn inline_runs(configured: usize, env: Option<&str>) -> Result<usize> {
    let (what, n) = match env {
        Some(v) => (
            INLINE_ENV,
            v.trim().parse::<usize>().map_err(|_| GpuError::invalid(format!("copy pool: {INLINE_ENV}={v:?} is not a number of runs")))?,
        ),
        None => ("paged_inline_runs", configured),
    };
    if n > PAGED_INLINE_RUNS {
        return Err(GpuError::invalid(format!(
            "copy pool: {what} is {n}: at most {PAGED_INLINE_RUNS} runs fit in the kernel's parameters"
        )));
    }
    Ok(n)
}
const _: () = assert!(std::mem::size_of::<PagedRun>() == 12 && std::mem::align_of::<PagedRun>() == 4);

/// A validated paged copy: work units (layers x halves x runs) and payload bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PagedPlan {
    pub(crate) units: u32,
    pub(crate) total_bytes: u64,
    pub(crate) params: PagedParams,
}

/// Threads per block of `mori_paged_copy` (measured on the H200: kernels/README.md).
pub(crate) const PAGED_BLOCK_THREADS: u32 = 64;
/// Grid cap, blocks per multiprocessor.
pub(crate) const PAGED_GRID_PER_SM: u32 = 128;
/// The grid has at least one block per this many payload bytes.
pub(crate) const PAGED_CHUNK_BYTES: u64 = 4096;

fn bad(msg: String) -> GpuError {
    GpuError::invalid(format!("paged copy: {msg}"))
}

/// Checks `job` and `runs` (every field non-zero, merged runs only on contiguous blocks, at
/// most `u32::MAX` units, no address or byte count overflowing `u64`) and returns the plan.
pub(crate) fn plan(job: &PagedCopy, runs: &[PagedRun]) -> Result<PagedPlan> {
    if job.layers == 0 {
        return Err(bad("layers is 0".into()));
    }
    if job.halves == 0 {
        return Err(bad("halves is 0".into()));
    }
    if job.block_bytes == 0 {
        return Err(bad("block_bytes is 0".into()));
    }
    if runs.is_empty() {
        return Err(bad("runs is empty (no blocks to copy)".into()));
    }
    let units = u64::from(job.layers) * u64::from(job.halves) * runs.len() as u64;
    let units = u32::try_from(units).map_err(|_| {
        bad(format!("{} layers x {} halves x {} runs = {units} units: at most {}", job.layers, job.halves, runs.len(), u32::MAX))
    })?;
    let merges = job.merges_blocks();
    let (mut blocks, mut a_extent, mut b_extent) = (0u64, 0u64, 0u64);
    for (i, r) in runs.iter().enumerate() {
        if r.count == 0 {
            return Err(bad(format!("runs[{i}].count is 0")));
        }
        if r.count > 1 && !merges {
            return Err(bad(format!(
                "runs[{i}].count is {} but blocks are not contiguous (block_stride A {}, B {}, block_bytes {}): \
                 runs of several blocks need block_stride == block_bytes on both sides",
                r.count, job.a.block_stride, job.b.block_stride, job.block_bytes
            )));
        }
        blocks += u64::from(r.count);
        // The end of the run's range within one (layer, half), relative to that layer-half.
        let extent = |block: u32, stride: u64| {
            u64::from(block).checked_mul(stride).and_then(|o| o.checked_add(u64::from(r.count).checked_mul(job.block_bytes)?))
        };
        let ea = extent(r.a_block, job.a.block_stride).ok_or_else(|| bad(format!("runs[{i}] on side A overflows u64")))?;
        let eb = extent(r.b_block, job.b.block_stride).ok_or_else(|| bad(format!("runs[{i}] on side B overflows u64")))?;
        a_extent = a_extent.max(ea);
        b_extent = b_extent.max(eb);
    }
    for (name, side, extent) in [("A", &job.a, a_extent), ("B", &job.b, b_extent)] {
        side.block_addr(job.layers - 1, job.halves - 1, 0)
            .and_then(|last| last.checked_add(extent))
            .ok_or_else(|| bad(format!("side {name}'s addresses overflow u64 ({side:?})")))?;
    }
    let total_bytes = blocks
        .checked_mul(u64::from(job.layers) * u64::from(job.halves))
        .and_then(|b| b.checked_mul(job.block_bytes))
        .ok_or_else(|| bad("the byte count overflows u64".into()))?;
    let params = PagedParams {
        a_base: job.a.base,
        a_layer_stride: job.a.layer_stride,
        a_half_stride: job.a.half_stride,
        a_block_stride: job.a.block_stride,
        b_base: job.b.base,
        b_layer_stride: job.b.layer_stride,
        b_half_stride: job.b.half_stride,
        b_block_stride: job.b.block_stride,
        block_bytes: job.block_bytes,
        layers: job.layers,
        halves: job.halves,
        n_runs: runs.len() as u32,
        a_to_b: u32::from(job.a_to_b),
    };
    Ok(PagedPlan { units, total_bytes, params })
}

/// (layer, half, run) of work unit `u`, as the kernel numbers them: consecutive units are
/// consecutive runs of one (layer, half).
pub(crate) fn unit_coords(u: u32, n_runs: u32, halves: u32) -> (u32, u32, u32) {
    let lh = u / n_runs;
    (lh / halves, lh % halves, u % n_runs)
}

/// The copy of work unit `u` of a planned job (what the kernel does for it).
pub(crate) fn unit_seg(job: &PagedCopy, runs: &[PagedRun], u: u32) -> CopySeg {
    let (layer, half, r) = unit_coords(u, runs.len() as u32, job.halves);
    let run = runs[r as usize];
    // Cannot overflow: `plan` checked the farthest address of each side.
    let at = |s: &PagedSide, block: u32| {
        s.base + u64::from(layer) * s.layer_stride + u64::from(half) * s.half_stride + u64::from(block) * s.block_stride
    };
    let (a, b) = (at(&job.a, run.a_block), at(&job.b, run.b_block));
    let len = u64::from(run.count) * job.block_bytes;
    if job.a_to_b {
        CopySeg { src: a, dst: b, len }
    } else {
        CopySeg { src: b, dst: a, len }
    }
}

/// Blocks of the paged kernel's grid for `units` work units of `total_bytes` on `sms`
/// multiprocessors: min(128 x sms, max(units, total_bytes / 4 KiB)), at least 1.
pub(crate) fn paged_grid(units: u32, total_bytes: u64, sms: u32) -> u32 {
    let cap = u64::from(PAGED_GRID_PER_SM) * u64::from(sms.max(1));
    let want = u64::from(units).max(total_bytes.div_ceil(PAGED_CHUNK_BYTES));
    cap.min(want).clamp(1, u64::from(u32::MAX)) as u32
}

impl CopyPool {
    /// Queues the paged copy `job` over `runs` as one submission: one kernel (block 64, grid
    /// min(128 x SMs, max(units, bytes / 4 KiB))) that computes every address on the device.
    /// Units are layers x halves x runs. A table of at most
    /// [`super::CopyPoolConfig::paged_inline_runs`] runs goes in the parameters of
    /// `mori_paged_copy_inline`; a larger one (12 bytes a run) is written into the slot's
    /// pinned staging buffer and uploaded on the submission's stream for `mori_paged_copy`.
    /// Where the kernel is not loaded (`kernel_threshold` 0, or no image loaded) it queues one async copy per (layer, half, run) range instead, and says so
    /// once per pool at info level. `make_done` is called exactly when `Ok` is returned (after
    /// the work and the event are queued); see [`CopyPool::submit`] for slots, admission and
    /// how an enqueue error reaches `done`.
    ///
    /// Errors before anything is queued: `InvalidArgument` when `layers`, `halves` or
    /// `block_bytes` is 0, `runs` is empty, a run's `count` is 0, a run of several blocks is
    /// given where blocks are not contiguous on both sides, there are more than `u32::MAX`
    /// units (layers x halves x runs), or an address or the byte count overflows `u64`.
    ///
    /// # Safety
    /// Every range the job names (for each layer, half and run, `count * block_bytes` bytes at
    /// the address [`PagedSide`] gives, on both sides) must be device memory mapped in this
    /// process and accessible from `dev`, and must stay mapped until `done` has been called.
    /// Destination ranges must not overlap one another nor any source range.
    pub unsafe fn copy_paged<M, D>(&self, dev: Device, job: &PagedCopy, runs: &[PagedRun], make_done: M) -> Result<()>
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let plan = plan(job, runs)?;
        let s = &self.shared;
        let dp = s.dev_pool(dev)?;
        let rt = &s.rt;
        if let Some(k) = dp.paged.as_ref() {
            let grid = paged_grid(plan.units, plan.total_bytes, dp.sms);
            let cfg = LaunchConfig { grid: (grid, 1, 1), block: (PAGED_BLOCK_THREADS, 1, 1), shared_mem_bytes: 0 };
            let inline = runs.len() <= s.cfg.paged_inline_runs;
            let table_bytes: &[u8] = bytemuck::cast_slice(runs);
            let enqueue = |lane: &mut Lane<'_>| -> Result<()> {
                let stream = lane.stream();
                let mut args = KernelArgs::new();
                if inline {
                    let mut t = PagedInline { p: plan.params, runs: [PagedRun::default(); PAGED_INLINE_RUNS] };
                    t.runs[..runs.len()].copy_from_slice(runs);
                    args.push(t);
                    // SAFETY: the kernel's ABI is (PagedInline by value) (the kernel source's
                    // header); runs.len() <= PAGED_INLINE_RUNS; `plan` checked that no address
                    // wraps; every range is mapped device memory (forwarded contract).
                    return unsafe { rt.launch(&k.inline, stream, &cfg, &args.params()) };
                }
                let table = lane.stage(table_bytes.len(), |buf| {
                    buf.copy_from_slice(table_bytes);
                    Ok(())
                })?;
                args.push_ptr(&table).push(plan.params);
                // SAFETY: the kernel's ABI is (const PagedRun*, PagedParams by value) (the
                // kernel source's header); as above.
                unsafe { rt.launch(&k.table, stream, &cfg, &args.params()) }
            };
            // SAFETY: forwarded contract.
            return unsafe { self.submit_on(dp, enqueue, make_done) };
        }
        if !s.paged_fallback_noted.swap(true, Ordering::Relaxed) {
            tracing::info!(
                device = dev.0,
                units = plan.units,
                "copy pool: no paged-copy kernel (kernel_threshold 0 or no image loaded): paged copies use one async copy per \
                 (layer, half, run) range"
            );
        }
        let enqueue = |lane: &mut Lane<'_>| -> Result<()> {
            for u in 0..plan.units {
                let seg = unit_seg(job, runs, u);
                let len = usize::try_from(seg.len).map_err(|_| GpuError::invalid(format!("copy of {} bytes exceeds usize", seg.len)))?;
                // SAFETY: forwarded contract: both ranges are mapped device memory of this process.
                let (d, sr) = unsafe { (DeviceSlice::from_raw(seg.dst, len, dev), DeviceSlice::from_raw(seg.src, len, dev)) };
                rt.copy_dtod_async(&d, &sr, lane.stream())?;
            }
            Ok(())
        };
        // SAFETY: forwarded contract.
        unsafe { self.submit_on(dp, enqueue, make_done) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn side(base: u64, layer_stride: u64, half_stride: u64, block_stride: u64) -> PagedSide {
        PagedSide { base, layer_stride, half_stride, block_stride }
    }

    fn job(layers: u32, halves: u32, bb: u64, contiguous: bool, a_to_b: bool) -> PagedCopy {
        let (nb, pad) = (64u64, if contiguous { 0 } else { 16 });
        let a = side(1 << 40, halves as u64 * nb * (bb + pad), nb * (bb + pad), bb + pad);
        let b = side(3 << 40, bb, layers as u64 * bb, 2 * layers as u64 * bb + pad);
        let b = if contiguous { side(3 << 40, halves as u64 * nb * bb, nb * bb, bb) } else { b };
        PagedCopy { a, b, block_bytes: bb, layers, halves, a_to_b }
    }

    fn err(r: Result<PagedPlan>) -> String {
        match r {
            Err(GpuError::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn params_match_the_kernel_abi() {
        let j = job(3, 2, 4096, true, false);
        let p = plan(&j, &[PagedRun { a_block: 1, b_block: 2, count: 3 }]).unwrap().params;
        // Byte offsets of kernels/README.md's PagedParams.
        let base = &p as *const PagedParams as usize;
        let off = |f: *const u8| f as usize - base;
        assert_eq!(off(&p.a_base as *const u64 as *const u8), 0);
        assert_eq!(off(&p.b_base as *const u64 as *const u8), 32);
        assert_eq!(off(&p.block_bytes as *const u64 as *const u8), 64);
        assert_eq!(off(&p.layers as *const u32 as *const u8), 72);
        assert_eq!(off(&p.n_runs as *const u32 as *const u8), 80);
        assert_eq!(off(&p.a_to_b as *const u32 as *const u8), 84);
        assert_eq!((p.layers, p.halves, p.n_runs, p.a_to_b, p.block_bytes), (3, 2, 1, 0, 4096));
        assert_eq!(bytemuck::bytes_of(&PagedRun { a_block: 1, b_block: 2, count: 3 }), &[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
    }

    #[test]
    fn inline_table_matches_the_kernel_abi() {
        let mut t = PagedInline {
            p: plan(&job(1, 1, 64, true, true), &[PagedRun { a_block: 0, b_block: 0, count: 1 }]).unwrap().params,
            runs: [PagedRun::default(); PAGED_INLINE_RUNS],
        };
        t.runs[PAGED_INLINE_RUNS - 1] = PagedRun { a_block: 7, b_block: 8, count: 9 };
        // SAFETY: PagedInline is repr(C) plain integers with no padding (size asserted above).
        let bytes = unsafe { std::slice::from_raw_parts(&t as *const PagedInline as *const u8, std::mem::size_of::<PagedInline>()) };
        // kernels/README.md: p at 0 (88 bytes), runs at 88, 12 bytes each, 3928 in all.
        assert_eq!(bytes.len(), 3928);
        assert_eq!(&bytes[..8], &t.p.a_base.to_le_bytes());
        assert_eq!(&bytes[64..72], &64u64.to_le_bytes());
        assert_eq!(&bytes[80..84], &1u32.to_le_bytes());
        assert_eq!(&bytes[88 + 12 * 319..], &[7, 0, 0, 0, 8, 0, 0, 0, 9, 0, 0, 0]);
    }

    #[test]
    fn inline_limit_reads_the_field_or_the_environment() {
        assert_eq!(inline_runs(320, None).unwrap(), 320);
        assert_eq!(inline_runs(0, None).unwrap(), 0);
        assert_eq!(inline_runs(320, Some(" 16 ")).unwrap(), 16);
        assert_eq!(inline_runs(5, Some("0")).unwrap(), 0);
        let msg = |r: Result<usize>| match r {
            Err(GpuError::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        };
        let m = msg(inline_runs(321, None));
        assert!(m.contains("paged_inline_runs is 321") && m.contains("at most 320"), "{m}");
        let m = msg(inline_runs(0, Some("400")));
        assert!(m.contains("MORI_GPU_PAGED_INLINE_RUNS is 400") && m.contains("at most 320"), "{m}");
        let m = msg(inline_runs(0, Some("lots")));
        assert!(m.contains("MORI_GPU_PAGED_INLINE_RUNS=\"lots\" is not a number"), "{m}");
    }

    #[test]
    fn invalid_jobs_name_the_field() {
        let r1 = [PagedRun { a_block: 0, b_block: 0, count: 1 }];
        let j = job(2, 2, 4096, true, true);
        assert!(err(plan(&PagedCopy { layers: 0, ..j }, &r1)).contains("layers is 0"));
        assert!(err(plan(&PagedCopy { halves: 0, ..j }, &r1)).contains("halves is 0"));
        assert!(err(plan(&PagedCopy { block_bytes: 0, ..j }, &r1)).contains("block_bytes is 0"));
        assert!(err(plan(&j, &[])).contains("runs is empty"));
        let zero = [r1[0], PagedRun { a_block: 3, b_block: 4, count: 0 }];
        assert!(err(plan(&j, &zero)).contains("runs[1].count is 0"));
        let merged = [PagedRun { a_block: 0, b_block: 0, count: 2 }];
        assert!(plan(&j, &merged).is_ok());
        assert!(err(plan(&job(2, 2, 4096, false, true), &merged)).contains("not contiguous"));
        // Units counted in 32 bits.
        let many = vec![r1[0]; 1 << 16];
        assert!(plan(&PagedCopy { layers: 1 << 15, halves: 2, ..j }, &many).is_err_and(|e| e.to_string().contains("units")));
        assert!(plan(&PagedCopy { layers: (1 << 15) - 1, halves: 2, ..j }, &many).is_ok());
        // Addresses that wrap.
        let far = PagedCopy { a: side(u64::MAX - 8191, 0, 0, 4096), ..j };
        assert!(plan(&PagedCopy { layers: 1, halves: 1, ..far }, &r1).is_ok());
        let r2 = [PagedRun { a_block: 1, b_block: 0, count: 1 }];
        assert!(err(plan(&PagedCopy { layers: 1, halves: 1, ..far }, &r2)).contains("side A"));
        let wide = PagedCopy { b: side(0, u64::MAX / 2, 0, 4096), ..j };
        assert!(err(plan(&PagedCopy { layers: 3, ..wide }, &r1)).contains("side B"));
    }

    #[test]
    fn plan_counts_units_and_bytes() {
        let runs = [PagedRun { a_block: 5, b_block: 9, count: 3 }, PagedRun { a_block: 0, b_block: 1, count: 1 }];
        let p = plan(&job(4, 2, 32 << 10, true, true), &runs).unwrap();
        assert_eq!(p.units, 4 * 2 * 2);
        assert_eq!(p.total_bytes, 4 * 2 * 4 * (32 << 10));
    }

    #[test]
    fn grid_follows_the_rule() {
        // 16384 x 32 KiB on an H200 (132 SMs): capped at 128 per SM.
        assert_eq!(paged_grid(16384, 16384 * 32768, 132), 16896);
        // 4096 x 4 KiB: one block per unit.
        assert_eq!(paged_grid(4096, 4096 * 4096, 132), 4096);
        // 128 x 64 KiB: a block per 4 KiB, so 16 blocks share each unit.
        assert_eq!(paged_grid(128, 128 * 65536, 132), 2048);
        assert_eq!(paged_grid(1, 1, 132), 1);
        assert_eq!(paged_grid(1, 1, 0), 1);
        assert_eq!(paged_grid(u32::MAX, u64::MAX, u32::MAX), u32::MAX);
    }

    #[test]
    fn runs_merge_only_contiguous_blocks() {
        let a = [4, 5, 6, 9, 10, 2, 3];
        let b = [7, 8, 9, 1, 3, 4, 5];
        let runs = job(1, 1, 4096, true, true).runs(&a, &b).unwrap();
        let r = |a_block, b_block, count| PagedRun { a_block, b_block, count };
        assert_eq!(runs, vec![r(4, 7, 3), r(9, 1, 1), r(10, 3, 1), r(2, 4, 2)]);
        let single = job(1, 1, 4096, false, true).runs(&a, &b).unwrap();
        assert_eq!(single.len(), a.len());
        assert!(single.iter().all(|r| r.count == 1));
        assert!(job(1, 1, 4096, true, true).runs(&a, &b[1..]).is_err());
        // No wrap past u32::MAX.
        let top = job(1, 1, 4096, true, true).runs(&[u32::MAX, 0], &[0, 1]).unwrap();
        assert_eq!(top.len(), 2);
    }

    /// Which units block `blk` of a grid of `grid` copies, and its first lane and stride in
    /// threads (as the kernel distributes them).
    fn kernel_units(grid: u32, units: u32, blk: u32, threads: u64) -> (Vec<u32>, u64, u64) {
        let k = if units < grid { grid / units } else { 1 };
        let groups = grid / k;
        let lane = u64::from(blk % k) * threads;
        let mut us = Vec::new();
        let mut u = u64::from(blk / k);
        while u < u64::from(units) {
            us.push(u as u32);
            u += u64::from(groups);
        }
        (us, lane, u64::from(k) * threads)
    }

    proptest! {
        #[test]
        fn unit_numbering_matches_nested_loops(layers in 1u32..6, halves in 1u32..3, n_runs in 1u32..9) {
            let mut u = 0;
            for layer in 0..layers {
                for half in 0..halves {
                    for r in 0..n_runs {
                        prop_assert_eq!(unit_coords(u, n_runs, halves), (layer, half, r));
                        u += 1;
                    }
                }
            }
        }

        #[test]
        fn unit_ranges_match_the_layouts(
            layers in 1u32..5,
            halves in 1u32..3,
            contiguous in any::<bool>(),
            a_to_b in any::<bool>(),
            bb in prop::sample::select(vec![4096u64, 4100, 32768]),
            table in prop::collection::vec((0u32..64, 0u32..64, 1u32..4), 1..12),
        ) {
            let j = job(layers, halves, bb, contiguous, a_to_b);
            let runs: Vec<PagedRun> = table
                .iter()
                .map(|&(a, b, c)| PagedRun { a_block: a, b_block: b, count: if contiguous { c } else { 1 } })
                .collect();
            let p = plan(&j, &runs).unwrap();
            prop_assert_eq!(p.units as usize, layers as usize * halves as usize * runs.len());
            let mut total = 0;
            let mut u = 0;
            for layer in 0..layers {
                for half in 0..halves {
                    for r in &runs {
                        let a = j.a.block_addr(layer, half, r.a_block).unwrap();
                        let b = j.b.block_addr(layer, half, r.b_block).unwrap();
                        let len = u64::from(r.count) * bb;
                        let want = if a_to_b { CopySeg { src: a, dst: b, len } } else { CopySeg { src: b, dst: a, len } };
                        prop_assert_eq!(unit_seg(&j, &runs, u), want);
                        total += len;
                        u += 1;
                    }
                }
            }
            prop_assert_eq!(p.total_bytes, total);
        }

        #[test]
        fn every_unit_is_covered_once_by_its_blocks(units in 1u32..3000, sms in 1u32..140, avg in 1u64..200_000) {
            let grid = paged_grid(units, u64::from(units) * avg, sms);
            prop_assert!(grid >= 1 && grid <= 128 * sms);
            // Every unit gets k blocks whose lanes tile 0..k*threads exactly once.
            let threads = u64::from(PAGED_BLOCK_THREADS);
            let mut lanes: Vec<Vec<u64>> = vec![Vec::new(); units as usize];
            for blk in 0..grid {
                let (us, lane, stride) = kernel_units(grid, units, blk, threads);
                for u in us {
                    lanes[u as usize].push(lane);
                    prop_assert_eq!(stride % threads, 0);
                }
            }
            let k = if units < grid { grid / units } else { 1 };
            for l in &mut lanes {
                l.sort_unstable();
                let want: Vec<u64> = (0..u64::from(k)).map(|i| i * threads).collect();
                prop_assert_eq!(&*l, &want[..]);
            }
        }

        #[test]
        fn runs_expand_back_to_the_tables(
            contiguous in any::<bool>(),
            pairs in prop::collection::vec((0u32..40, 0u32..40), 0..60),
        ) {
            let j = job(1, 1, 4096, contiguous, true);
            let (a, b): (Vec<u32>, Vec<u32>) = pairs.iter().copied().unzip();
            let runs = j.runs(&a, &b).unwrap();
            let expanded: Vec<(u32, u32)> =
                runs.iter().flat_map(|r| (0..r.count).map(move |i| (r.a_block + i, r.b_block + i))).collect();
            prop_assert_eq!(expanded, pairs);
            for w in runs.windows(2) {
                let merge = w[0].a_block + w[0].count == w[1].a_block && w[0].b_block + w[0].count == w[1].b_block;
                prop_assert!(!(contiguous && merge), "mergeable neighbours left: {:?}", w);
            }
            prop_assert!(contiguous || runs.iter().all(|r| r.count == 1));
        }
    }
}
