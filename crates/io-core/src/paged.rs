//! Paged batches: a KV cache's fixed-size blocks named by block tables, as inference servers
//! keep them (vLLM's and SGLang's paged KV pools), checked once and kept as merged runs.
//!
//! A paged batch moves, for every layer `l < layers`, every half `h < halves` (K and V, or 1
//! for a cache with one half such as MLA's) and every block table entry `i`, `block_size`
//! bytes from local offset `local.offset(l, h, local_blocks[i])` to remote offset
//! `remote.offset(l, h, remote_blocks[i])` (reads the other way). Its entries, in stream order,
//! are numbered `(l * halves + h) * blocks + i`, each `block_size` bytes.
//!
//! [`check_paged`] costs O(table length) whatever the layer count: it checks the largest block
//! of each side (offsets grow with every index, so the largest index of the last layer and
//! half is the furthest range) and merges table entries consecutive on both sides into runs
//! (when both sides' blocks are back to back). Backends either take the plan as is (the GPU
//! backends hand the runs to a kernel) or expand it into [`Seg`]s with [`PagedPlan::segs`]
//! (one allocation for the whole batch, none per block).

use crate::error::{IoError, IoResult};
use crate::plan::{EntryMap, Seg};
use crate::registry::check_range;

/// Where one side's blocks lie in its registered region, in bytes: block `b` of layer `l`,
/// half `h` starts at `base + l * layer_stride + h * half_stride + b * block_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PagedLayout {
    /// Offset of layer 0, half 0, block 0 in the region, bytes.
    pub base: u64,
    /// Bytes from one layer to the next.
    pub layer_stride: u64,
    /// Bytes from the K half to the V half of a layer (unused with one half).
    pub half_stride: u64,
    /// Bytes from one block to the next (usually the block size).
    pub block_stride: u64,
}

impl PagedLayout {
    /// The layout `[layer][half][pool block][block_size bytes]` from offset `base`: a pool
    /// of `pool_blocks` blocks per (layer, half), back to back.
    pub fn pool(base: u64, block_size: u64, pool_blocks: u64, halves: u32) -> Self {
        let half = block_size.saturating_mul(pool_blocks);
        PagedLayout { base, layer_stride: half.saturating_mul(u64::from(halves)), half_stride: half, block_stride: block_size }
    }

    /// Offset of block `b` of layer `l`, half `h`; `None` on u64 overflow.
    pub fn offset(&self, l: u32, h: u32, b: u32) -> Option<u64> {
        self.base
            .checked_add(u64::from(l).checked_mul(self.layer_stride)?)?
            .checked_add(u64::from(h).checked_mul(self.half_stride)?)?
            .checked_add(u64::from(b).checked_mul(self.block_stride)?)
    }
}

/// A paged batch as the caller gives it (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct PagedBatch<'a> {
    /// Local block index of each table entry.
    pub local_blocks: &'a [u32],
    /// Remote block index of each table entry (same length).
    pub remote_blocks: &'a [u32],
    /// Bytes per block, at least 1.
    pub block_size: u64,
    /// Layers, at least 1.
    pub layers: u32,
    /// Halves per layer (2 for K and V, 1 for one), at least 1.
    pub halves: u32,
    /// The local side's layout.
    pub local: PagedLayout,
    /// The remote side's layout.
    pub remote: PagedLayout,
}

/// `count` table entries consecutive on both sides, from local block `local` and remote block
/// `remote`: one contiguous range of `count * block_size` bytes per (layer, half) on each
/// side. Laid out as the GPU paged-copy kernel's 12-byte run (kernels/README.md).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRun {
    /// First local block.
    pub local: u32,
    /// First remote block.
    pub remote: u32,
    /// Blocks in the run, at least 1.
    pub count: u32,
}

/// A checked paged batch: its shape, both layouts and the table merged into runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagedPlan {
    /// Bytes per block.
    pub block_size: u64,
    /// Layers.
    pub layers: u32,
    /// Halves per layer.
    pub halves: u32,
    /// The local side's layout.
    pub local: PagedLayout,
    /// The remote side's layout.
    pub remote: PagedLayout,
    /// Table entries per (layer, half).
    pub blocks: u32,
    /// The table as runs, in table order.
    pub runs: Vec<BlockRun>,
}

impl PagedPlan {
    /// Entries of the batch: `layers * halves * blocks` (at most `u32::MAX`, checked).
    pub fn entries(&self) -> u32 {
        self.layers * self.halves * self.blocks
    }

    /// Bytes the batch moves.
    pub fn total_bytes(&self) -> u64 {
        u64::from(self.entries()) * self.block_size
    }

    /// Where each entry lies in the byte stream (all entries are `block_size` bytes).
    pub fn entry_map(&self) -> EntryMap {
        EntryMap::uniform(self.entries(), self.block_size)
    }

    /// The batch's segments in stream order: per (layer, half), one per run. Offsets cannot
    /// overflow (checked by [`check_paged`]).
    pub fn segs(&self) -> impl Iterator<Item = Seg> + Clone + '_ {
        (0..self.layers).flat_map(move |l| {
            (0..self.halves).flat_map(move |h| {
                self.runs.iter().map(move |r| Seg {
                    local_off: self.local.offset(l, h, r.local).unwrap_or(u64::MAX),
                    remote_off: self.remote.offset(l, h, r.remote).unwrap_or(u64::MAX),
                    len: u64::from(r.count) * self.block_size,
                })
            })
        })
    }

    /// [`PagedPlan::segs`] collected, adjacent segments contiguous on both sides merged (one
    /// allocation), for backends that move segment lists (tcp, rdma).
    pub fn expand(&self) -> Vec<Seg> {
        let n = self.runs.len().saturating_mul(self.layers as usize * self.halves as usize);
        let mut out: Vec<Seg> = Vec::with_capacity(n);
        for s in self.segs() {
            match out.last_mut() {
                Some(last) if last.local_off + last.len == s.local_off && last.remote_off + last.len == s.remote_off => last.len += s.len,
                _ => out.push(s),
            }
        }
        out
    }

    /// Words naming entry `k` (`layer 3, half 1, block table entry 17`), for errors.
    pub fn describe_entry(&self, k: u32) -> String {
        let blocks = self.blocks.max(1);
        let (lh, i) = (k / blocks, k % blocks);
        let (l, h) = (lh / self.halves.max(1), lh % self.halves.max(1));
        format!("paged batch entry {k} (layer {l}, half {h}, block table entry {i})")
    }
}

/// Checks a paged batch against both regions ((id, registered length) each) and merges its
/// table. Errors, all `InvalidArgs` naming the input and the limit: tables of different
/// lengths or empty; a zero block size, layer count or half count; more than `u32::MAX`
/// entries in all; a block whose range (of some layer and half) falls outside its region,
/// naming the side, the block, its table entry, the layer and half, the range and the region
/// size (the furthest block of each side is checked: offsets grow with every index).
pub fn check_paged(local: (u64, u64), remote: (u64, u64), b: &PagedBatch<'_>) -> IoResult<PagedPlan> {
    let n = b.local_blocks.len();
    if n != b.remote_blocks.len() {
        return Err(IoError::invalid(format!(
            "paged batch: block tables differ in length: {} local blocks, {} remote blocks",
            n,
            b.remote_blocks.len()
        )));
    }
    if n == 0 {
        return Err(IoError::invalid("paged batch: empty block tables"));
    }
    for (what, v) in [("block_size", b.block_size), ("layers", u64::from(b.layers)), ("halves", u64::from(b.halves))] {
        if v == 0 {
            return Err(IoError::invalid(format!("paged batch: {what} is 0; it must be at least 1")));
        }
    }
    let entries = (n as u64) * u64::from(b.layers) * u64::from(b.halves);
    if entries > u64::from(u32::MAX) {
        return Err(IoError::invalid(format!(
            "paged batch of {n} blocks x {} layers x {} halves = {entries} entries exceeds {} entries",
            b.layers,
            b.halves,
            u32::MAX
        )));
    }
    let mergeable = b.local.block_stride == b.block_size && b.remote.block_stride == b.block_size;
    let mut runs: Vec<BlockRun> = Vec::with_capacity(if mergeable { 16 } else { n });
    for (&lb, &rb) in b.local_blocks.iter().zip(b.remote_blocks) {
        match runs.last_mut() {
            Some(r) if mergeable && r.local.checked_add(r.count) == Some(lb) && r.remote.checked_add(r.count) == Some(rb) => r.count += 1,
            _ => runs.push(BlockRun { local: lb, remote: rb, count: 1 }),
        }
    }
    let plan = PagedPlan {
        block_size: b.block_size,
        layers: b.layers,
        halves: b.halves,
        local: b.local,
        remote: b.remote,
        blocks: n as u32,
        runs,
    };
    plan.check_regions(local, remote)?;
    Ok(plan)
}

impl PagedPlan {
    /// Checks every block of the plan lies inside both regions ((id, length) each), as a
    /// backend does again against the owner-confirmed lengths before queuing anything (a
    /// descriptor's own length could be forged). O(runs): offsets grow with every index, so
    /// the furthest range of a side is its largest block in the last layer and half. Errors:
    /// `InvalidArgs` naming the side, the block, its block table entry, the layer and half,
    /// the range, the region and the layout.
    pub fn check_regions(&self, local: (u64, u64), remote: (u64, u64)) -> IoResult<()> {
        self.check_side("local", local, &self.local, |r| r.local)?;
        self.check_side("remote", remote, &self.remote, |r| r.remote)
    }

    fn check_side(&self, side: &str, (id, len): (u64, u64), lay: &PagedLayout, first: impl Fn(&BlockRun) -> u32) -> IoResult<()> {
        // The largest block (the first entry holding it, for the message): the last of a run.
        let (mut at, mut max, mut entry) = (0u32, 0u32, 0u32);
        for r in &self.runs {
            let last = first(r).saturating_add(r.count - 1);
            if last > max || entry == 0 {
                (at, max) = (entry + r.count - 1, last);
            }
            entry += r.count;
        }
        let (l, h) = (self.layers - 1, self.halves - 1);
        let err = |range: String| {
            IoError::invalid(format!(
                "paged batch: {side} block {max} (block table entry {at}) at layer {l}, half {h}: {range}; \
                 {side} layout base {} + layer stride {} + half stride {} + block stride {}",
                lay.base, lay.layer_stride, lay.half_stride, lay.block_stride
            ))
        };
        match lay.offset(l, h, max) {
            None => Err(err(format!("its offset overflows 64 bits (region {id} of {len} bytes)"))),
            Some(off) => check_range(id, len, off, self.block_size).map_err(|e| err(e.msg)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::check_batch_mapped;
    use proptest::prelude::*;

    /// The oracle: the batch as three offset arrays, entry by entry in stream order.
    fn naive(b: &PagedBatch<'_>) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let (mut lo, mut ro, mut sz) = (Vec::new(), Vec::new(), Vec::new());
        for l in 0..b.layers {
            for h in 0..b.halves {
                for (&x, &y) in b.local_blocks.iter().zip(b.remote_blocks) {
                    lo.push(b.local.offset(l, h, x).unwrap());
                    ro.push(b.remote.offset(l, h, y).unwrap());
                    sz.push(b.block_size);
                }
            }
        }
        (lo, ro, sz)
    }

    fn batch<'a>(lb: &'a [u32], rb: &'a [u32], bs: u64, layers: u32, halves: u32, pool: u64) -> PagedBatch<'a> {
        PagedBatch {
            local_blocks: lb,
            remote_blocks: rb,
            block_size: bs,
            layers,
            halves,
            local: PagedLayout::pool(0, bs, pool, halves),
            remote: PagedLayout::pool(64, bs, pool, halves),
        }
    }

    #[test]
    fn errors_name_the_input_and_the_limit() {
        let b = batch(&[0, 1], &[0], 16, 1, 2, 4);
        let e = check_paged((1, 1 << 20), (2, 1 << 20), &b).unwrap_err();
        assert!(e.msg.contains("2 local blocks, 1 remote blocks"), "{e}");
        let e = check_paged((1, 1 << 20), (2, 1 << 20), &batch(&[], &[], 16, 1, 2, 4)).unwrap_err();
        assert!(e.msg.contains("empty block tables"), "{e}");
        let e = check_paged((1, 1 << 20), (2, 1 << 20), &batch(&[0], &[0], 0, 1, 2, 4)).unwrap_err();
        assert!(e.msg.contains("block_size is 0"), "{e}");
        let e = check_paged((1, 1 << 20), (2, 1 << 20), &batch(&[0], &[0], 16, 0, 2, 4)).unwrap_err();
        assert!(e.msg.contains("layers is 0"), "{e}");
        // Remote pool: 2 layers x 2 halves x 4 blocks x 16 B from offset 64, ending at 320.
        // Block 4 lies past it: in layer 1, half 1 it starts at 64 + 128 + 64 + 4 * 16 = 320.
        let b = batch(&[0, 1, 2], &[3, 4, 1], 16, 2, 2, 4);
        let e = check_paged((1, 1 << 20), (2, 320), &b).unwrap_err();
        assert!(
            e.msg.starts_with("paged batch: remote block 4 (block table entry 1) at layer 1, half 1: range offset 320 + length 16 exceeds region 2 of 320 bytes"),
            "{e}"
        );
        check_paged((1, 1 << 20), (2, 320), &batch(&[0, 1, 2], &[3, 0, 1], 16, 2, 2, 4)).unwrap();
        let b = PagedBatch {
            local: PagedLayout { base: 0, layer_stride: u64::MAX, half_stride: 0, block_stride: 1 },
            ..batch(&[0], &[0], 1, 3, 1, 1)
        };
        let e = check_paged((1, 1 << 20), (2, 1 << 20), &b).unwrap_err();
        assert!(e.msg.contains("local block 0") && e.msg.contains("overflows 64 bits"), "{e}");
        let many = vec![0u32; 1 << 16];
        let e = check_paged((1, u64::MAX), (2, u64::MAX), &batch(&many, &many, 1, 1 << 15, 2, 1)).unwrap_err();
        assert!(e.msg.contains("exceeds 4294967295 entries"), "{e}");
    }

    #[test]
    fn consecutive_blocks_merge_into_runs() {
        let p = check_paged((1, 1 << 20), (2, 1 << 20), &batch(&[4, 5, 6, 9, 10, 2], &[0, 1, 2, 3, 7, 8], 16, 2, 2, 16)).unwrap();
        assert_eq!(
            p.runs,
            vec![
                BlockRun { local: 4, remote: 0, count: 3 },
                BlockRun { local: 9, remote: 3, count: 1 },
                BlockRun { local: 10, remote: 7, count: 1 },
                BlockRun { local: 2, remote: 8, count: 1 }
            ]
        );
        assert_eq!((p.entries(), p.total_bytes()), (24, 24 * 16));
        assert_eq!(p.describe_entry(13), "paged batch entry 13 (layer 1, half 0, block table entry 1)");
        // A stride other than the block size never merges.
        let mut b = batch(&[4, 5], &[0, 1], 16, 1, 1, 16);
        b.local.block_stride = 32;
        assert_eq!(check_paged((1, 1 << 20), (2, 1 << 20), &b).unwrap().runs.len(), 2);
    }

    proptest! {
        /// Against the oracle: the same verdict as the three-array check, the same bytes in the
        /// same stream order, and entry names that agree.
        #[test]
        fn plan_equals_the_expanded_batch(
            table in proptest::collection::vec((0u32..12, 0u32..12), 1..24),
            bs in 1u64..40, layers in 1u32..4, halves in 1u32..3, pool in 1u64..14,
            llen_cut in 0u64..200, rlen_cut in 0u64..200, stride_pad in 0u64..3,
        ) {
            let (lb, rb): (Vec<u32>, Vec<u32>) = table.into_iter().unzip();
            let mut b = batch(&lb, &rb, bs, layers, halves, pool);
            b.remote.block_stride += stride_pad;
            b.remote.half_stride = (bs + stride_pad) * pool;
            b.remote.layer_stride = b.remote.half_stride * u64::from(halves);
            let full = |lay: &PagedLayout| lay.base + u64::from(layers) * lay.layer_stride;
            let (llen, rlen) = (full(&b.local).saturating_sub(llen_cut), full(&b.remote).saturating_sub(rlen_cut));
            let (lo, ro, sz) = naive(&b);
            let oracle = check_batch_mapped((1, llen), (2, rlen), &lo, &ro, &sz);
            match check_paged((1, llen), (2, rlen), &b) {
                Err(e) => {
                    prop_assert!(oracle.is_err(), "paged refused a batch the oracle takes: {}", e);
                    prop_assert!(e.msg.starts_with("paged batch: "), "{}", e);
                }
                Ok(p) => {
                    let (segs, map) = oracle.unwrap();
                    prop_assert_eq!(p.expand(), segs);
                    let streamed: u64 = p.segs().map(|s| s.len).sum();
                    prop_assert_eq!(streamed, p.total_bytes());
                    let um = p.entry_map();
                    prop_assert_eq!(um.entries(), map.entries());
                    for k in [0u64, bs / 2, bs, 3 * bs + 1] {
                        prop_assert_eq!(um.of_bytes(k..k + bs), map.of_bytes(k..k + bs));
                    }
                }
            }
        }
    }
}
