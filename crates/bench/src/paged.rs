//! `bench_engine --paged` (a mori-rs addition), the pure part: the shape, the buffer layout,
//! the block tables and the offsets every check reads.
//!
//! Each rank's buffer is one KV pool laid out `[layer][half][pool block][block bytes]`
//! (`PagedLayout::pool` from offset 0), followed by a contiguous area of the transfer's size
//! that the same-run contiguous baseline moves (so the baseline never touches the pool, and
//! the pool's untouched blocks can be checked after both timed loops). Block tables: one pair
//! per point (rank 0's and rank 1's), drawn from `--seed` without replacement (distinct blocks
//! on each side), the same on both ranks; every iteration of the point posts the same paged
//! batch.

use mori_io::{PagedBatch, PagedLayout};

/// The shape of a paged point (`--block-size`, `--num-blocks`, `--layers`, `--halves`,
/// `--pool-blocks`, `--seed`), checked by `Args::validate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Bytes per block.
    pub block_size: u64,
    /// Block table entries per side (N).
    pub blocks: u32,
    /// Layers (L).
    pub layers: u32,
    /// Halves per layer (2: K and V; 1: one, as MLA's latent cache).
    pub halves: u32,
    /// Blocks per (layer, half) in each rank's pool (P >= N).
    pub pool_blocks: u32,
    /// Seed of the block tables.
    pub seed: u64,
}

/// Where one paged entry lies: its layer, half, table entry and the block on each rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryAt {
    /// Layer.
    pub layer: u32,
    /// Half.
    pub half: u32,
    /// Block table entry.
    pub entry: u32,
    /// Rank 0's block.
    pub block0: u32,
    /// Rank 1's block.
    pub block1: u32,
}

impl Shape {
    /// Blocks one transfer moves: `layers * halves * blocks`.
    pub fn entries(&self) -> u64 {
        u64::from(self.layers) * u64::from(self.halves) * u64::from(self.blocks)
    }

    /// Bytes one transfer moves; `None` on overflow.
    pub fn total_bytes(&self) -> Option<u64> {
        self.entries().checked_mul(self.block_size)
    }

    /// Bytes of one rank's pool; `None` on overflow.
    pub fn pool_bytes(&self) -> Option<u64> {
        (u64::from(self.layers) * u64::from(self.halves)).checked_mul(u64::from(self.pool_blocks))?.checked_mul(self.block_size)
    }

    /// Bytes of one rank's buffer: the pool, then the contiguous baseline's area. Errors name
    /// the flags when it does not fit in memory's address space.
    pub fn buffer_bytes(&self) -> Result<u64, String> {
        self.pool_bytes()
            .zip(self.total_bytes())
            .and_then(|(p, t)| p.checked_add(t))
            .filter(|&n| n < u64::MAX / 2 && usize::try_from(n).is_ok())
            .ok_or_else(|| {
                format!(
                    "--paged: --layers {} x --halves {} x --pool-blocks {} x --block-size {} (plus the contiguous baseline's area) does not fit in memory",
                    self.layers, self.halves, self.pool_blocks, self.block_size
                )
            })
    }

    /// Offset of the contiguous baseline's area (the pool's end) in each rank's buffer.
    pub fn contiguous_offset(&self) -> u64 {
        self.pool_bytes().unwrap_or(0)
    }

    /// Both ranks' layout (the same pool shape on each).
    pub fn layout(&self) -> PagedLayout {
        PagedLayout::pool(0, self.block_size, u64::from(self.pool_blocks), self.halves)
    }

    /// The block tables of rank 0 and rank 1 (`blocks` distinct blocks of `0..pool_blocks`
    /// each, independent streams of `--seed`).
    pub fn tables(&self) -> (Vec<u32>, Vec<u32>) {
        (block_table(self.blocks, self.pool_blocks, self.seed, 0), block_table(self.blocks, self.pool_blocks, self.seed, 1))
    }

    /// The batch rank 0 posts: `local` is rank 0's table, `remote` rank 1's.
    pub fn batch<'a>(&self, local: &'a [u32], remote: &'a [u32]) -> PagedBatch<'a> {
        PagedBatch {
            local_blocks: local,
            remote_blocks: remote,
            block_size: self.block_size,
            layers: self.layers,
            halves: self.halves,
            local: self.layout(),
            remote: self.layout(),
        }
    }

    /// Offset of block `b` of layer `l`, half `h` in a rank's buffer.
    pub fn offset(&self, l: u32, h: u32, b: u32) -> u64 {
        self.layout().offset(l, h, b).unwrap_or(u64::MAX)
    }

    /// The offset of every entry of the batch on the rank whose table is `table`, in the
    /// batch's stream order (`(layer * halves + half) * blocks + table entry`).
    pub fn entry_offsets(&self, table: &[u32]) -> Vec<u64> {
        let mut v = Vec::with_capacity(self.entries() as usize);
        for l in 0..self.layers {
            for h in 0..self.halves {
                v.extend(table.iter().map(|&b| self.offset(l, h, b)));
            }
        }
        v
    }

    /// The offset of every pool block in no entry of `table` (layer by layer, half by half,
    /// block by block): what a transfer must leave untouched.
    pub fn untouched_offsets(&self, table: &[u32]) -> Vec<u64> {
        let used = in_table(table, self.pool_blocks);
        let mut v = Vec::new();
        for l in 0..self.layers {
            for h in 0..self.halves {
                v.extend((0..self.pool_blocks).filter(|&b| !used[b as usize]).map(|b| self.offset(l, h, b)));
            }
        }
        v
    }

    /// Entry `k` of the stream, named (for a failed check).
    pub fn entry_at(&self, k: u64, t0: &[u32], t1: &[u32]) -> EntryAt {
        let n = u64::from(self.blocks.max(1));
        let (lh, i) = (k / n, (k % n) as usize);
        let halves = u64::from(self.halves.max(1));
        EntryAt {
            layer: (lh / halves) as u32,
            half: (lh % halves) as u32,
            entry: i as u32,
            block0: t0.get(i).copied().unwrap_or(0),
            block1: t1.get(i).copied().unwrap_or(0),
        }
    }

    /// Untouched block `k` of [`Shape::untouched_offsets`] of `table`, as (layer, half, block).
    pub fn untouched_at(&self, k: usize, table: &[u32]) -> (u32, u32, u32) {
        let off = self.untouched_offsets(table).get(k).copied().unwrap_or(0);
        let (bs, pool) = (self.block_size.max(1), u64::from(self.pool_blocks.max(1)));
        let blk = off / bs;
        let (lh, b) = (blk / pool, blk % pool);
        ((lh / u64::from(self.halves.max(1))) as u32, (lh % u64::from(self.halves.max(1))) as u32, b as u32)
    }
}

/// `used[b]`: block `b` of `0..pool` is in `table`.
fn in_table(table: &[u32], pool: u32) -> Vec<bool> {
    let mut used = vec![false; pool as usize];
    for &b in table {
        if let Some(u) = used.get_mut(b as usize) {
            *u = true;
        }
    }
    used
}

/// splitmix64 step: a small deterministic generator (the same numbers on every platform).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` distinct blocks of `0..pool` in a random order: the first `n` places of a partial
/// Fisher-Yates shuffle driven by stream `side` of `seed`. Deterministic; `n` is clamped to
/// `pool`.
pub fn block_table(n: u32, pool: u32, seed: u64, side: u64) -> Vec<u32> {
    let n = n.min(pool) as usize;
    let mut p: Vec<u32> = (0..pool).collect();
    let mut s = seed ^ side.wrapping_add(1).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    for i in 0..n {
        let left = (p.len() - i) as u64;
        p.swap(i, i + (splitmix(&mut s) % left) as usize);
    }
    p.truncate(n);
    p
}

/// Index of the first entry of `before` that differs in `after` (checksums of the untouched
/// blocks before and after the transfers), `None` when all match.
pub fn first_changed(before: &[u64], after: &[u64]) -> Option<usize> {
    crate::validate::first_mismatch(before, after)
}

/// One timed side of a paged point: the whole loop of `iters` transfers of `bytes` each.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Timed {
    /// Microseconds per transfer (whole loop / iterations).
    pub us_per_transfer: f64,
    /// `bytes * iters / 1e9 / seconds` (GB = 1e9).
    pub gbps: f64,
}

impl Timed {
    /// From a whole-loop duration.
    pub fn new(bytes: u64, iters: u64, total: std::time::Duration) -> Timed {
        let s = total.as_secs_f64();
        Timed { us_per_transfer: s * 1e6 / iters.max(1) as f64, gbps: (bytes as f64 * iters as f64) / 1e9 / s }
    }
}

/// What a paged point reports beside its table row (also in `--json` as `paged`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PagedReport {
    /// Bytes per block.
    pub block_size: u64,
    /// Blocks moved per transfer (`layers * halves * table entries`).
    pub blocks_moved: u64,
    /// Layers.
    pub layers: u32,
    /// Halves per layer.
    pub halves: u32,
    /// Block table entries per side.
    pub table_entries: u32,
    /// Pool blocks per (layer, half).
    pub pool_blocks: u32,
    /// Runs of the table after merging (entries consecutive on both sides).
    pub runs: u64,
    /// Bytes per transfer.
    pub bytes_per_transfer: u64,
    /// The paged batch.
    pub paged: Timed,
    /// The same bytes as one contiguous entry, same engine path, same run.
    pub contiguous: Timed,
    /// With `--copy-baseline` (xgmi): one bare device copy of the same bytes, same run.
    pub copy: Option<Timed>,
}

impl PagedReport {
    /// The lines printed after the table (see `bench_engine --help`, `--paged`).
    pub fn lines(&self) -> String {
        let mut s = format!(
            "paged: {} blocks ({} layers x {} halves x {} table entries; {} runs after merging) of {} B = {} B per transfer: {:.3} GB/s, {:.1} us per transfer\n",
            self.blocks_moved,
            self.layers,
            self.halves,
            self.table_entries,
            self.runs,
            self.block_size,
            self.bytes_per_transfer,
            self.paged.gbps,
            self.paged.us_per_transfer
        );
        s += &format!(
            "contiguous: 1 entry of {} B per transfer: {:.3} GB/s, {:.1} us per transfer\n",
            self.bytes_per_transfer, self.contiguous.gbps, self.contiguous.us_per_transfer
        );
        s += &format!("paged/contiguous: {:.3}", self.paged.gbps / self.contiguous.gbps);
        if let Some(c) = self.copy {
            s += &format!(
                "\nbare copy: 1 device copy of {} B per transfer: {:.3} GB/s, {:.1} us per transfer\npaged/copy: {:.3}",
                self.bytes_per_transfer,
                c.gbps,
                c.us_per_transfer,
                self.paged.gbps / c.gbps
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(block_size: u64, blocks: u32, layers: u32, halves: u32, pool_blocks: u32, seed: u64) -> Shape {
        Shape { block_size, blocks, layers, halves, pool_blocks, seed }
    }

    #[test]
    fn tables_are_distinct_deterministic_and_seeded() {
        let a = block_table(300, 512, 7, 0);
        assert_eq!(a.len(), 300);
        let mut s = a.clone();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 300, "distinct blocks");
        assert!(a.iter().all(|&b| b < 512));
        assert_eq!(a, block_table(300, 512, 7, 0), "same seed, same table");
        assert_ne!(a, block_table(300, 512, 8, 0), "another seed, another table");
        assert_ne!(a, block_table(300, 512, 7, 1), "the two ranks' streams differ");
        // A prefix property: a longer table of the same stream starts the same way.
        assert_eq!(&block_table(400, 512, 7, 0)[..300], &a[..]);
        // The whole pool: a permutation.
        let mut p = block_table(64, 64, 3, 1);
        p.sort_unstable();
        assert_eq!(p, (0..64).collect::<Vec<u32>>());
        // Fixed values (splitmix64 and the partial shuffle, recomputed outside Rust): the
        // generator must not change silently (two builds' ranks must agree, published tables
        // must be reproducible).
        assert_eq!(block_table(6, 1000, 1, 0), vec![39, 249, 660, 386, 225, 756]);
        assert_eq!(block_table(4, 1000, 1, 1), vec![920, 819, 750, 985]);
    }

    #[test]
    fn sizes_and_offsets() {
        let s = shape(4096, 3, 2, 2, 8, 1);
        assert_eq!((s.entries(), s.total_bytes(), s.pool_bytes()), (12, Some(12 * 4096), Some(2 * 2 * 8 * 4096)));
        assert_eq!(s.buffer_bytes(), Ok(32 * 4096 + 12 * 4096));
        assert_eq!(s.contiguous_offset(), 32 * 4096);
        // Layer 1, half 1, block 5: (1*16 + 8 + 5) blocks in.
        assert_eq!(s.offset(1, 1, 5), 29 * 4096);
        let t = [5u32, 0, 7];
        let offs = s.entry_offsets(&t);
        assert_eq!(offs.len(), 12);
        assert_eq!(&offs[..3], &[5 * 4096, 0, 7 * 4096]);
        assert_eq!(&offs[9..], &[(24 + 5) * 4096, 24 * 4096, (24 + 7) * 4096]);
        let un = s.untouched_offsets(&t);
        assert_eq!(un.len(), 4 * 5, "5 untouched blocks per (layer, half)");
        assert_eq!(&un[..5], &[4096, 2 * 4096, 3 * 4096, 4 * 4096, 6 * 4096]);
        assert_eq!(s.untouched_at(6, &t), (0, 1, 2));
        assert_eq!(s.entry_at(10, &t, &[1, 2, 3]), EntryAt { layer: 1, half: 1, entry: 1, block0: 0, block1: 2 });
        // Every entry offset and every untouched offset: each pool block exactly once.
        let mut all: Vec<u64> = offs.iter().chain(&un).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..32).map(|b| b * 4096).collect::<Vec<u64>>());
        // One half.
        let s1 = shape(16, 2, 3, 1, 4, 1);
        assert_eq!((s1.entries(), s1.pool_bytes(), s1.offset(2, 0, 3)), (6, Some(3 * 4 * 16), 11 * 16));
        assert!(shape(u64::MAX / 4, 4, 4, 2, 8, 1).buffer_bytes().unwrap_err().contains("--pool-blocks 8 x --block-size"));
    }

    #[test]
    fn batch_checks_and_merges_as_the_engine_does() {
        let s = shape(64, 32, 4, 2, 64, 5);
        let (t0, t1) = s.tables();
        let b = s.batch(&t0, &t1);
        let len = s.buffer_bytes().unwrap();
        let plan = mori_io_core::paged::check_paged((1, len), (2, len), &b).unwrap();
        assert_eq!(plan.total_bytes(), s.total_bytes().unwrap());
        assert_eq!(plan.entries() as u64, s.entries());
        // The expanded segments are exactly the entry offsets, in stream order.
        let lo: Vec<u64> = plan.segs().flat_map(|g| (0..g.len / 64).map(move |k| g.local_off + k * 64)).collect();
        assert_eq!(lo, s.entry_offsets(&t0));
        let ro: Vec<u64> = plan.segs().flat_map(|g| (0..g.len / 64).map(move |k| g.remote_off + k * 64)).collect();
        assert_eq!(ro, s.entry_offsets(&t1));
    }

    #[test]
    fn report_lines() {
        let r = PagedReport {
            block_size: 32768,
            blocks_moved: 4096,
            layers: 8,
            halves: 2,
            table_entries: 256,
            pool_blocks: 512,
            runs: 256,
            bytes_per_transfer: 134217728,
            paged: Timed::new(134217728, 10, std::time::Duration::from_millis(500)),
            contiguous: Timed::new(134217728, 10, std::time::Duration::from_millis(400)),
            copy: None,
        };
        assert!((r.paged.gbps - 2.68435456).abs() < 1e-9 && (r.paged.us_per_transfer - 50_000.0).abs() < 1e-6);
        let l = r.lines();
        assert_eq!(
            l,
            "paged: 4096 blocks (8 layers x 2 halves x 256 table entries; 256 runs after merging) of 32768 B = 134217728 B per transfer: 2.684 GB/s, 50000.0 us per transfer\n\
             contiguous: 1 entry of 134217728 B per transfer: 3.355 GB/s, 40000.0 us per transfer\n\
             paged/contiguous: 0.800"
        );
        assert_eq!(first_changed(&[1, 2, 3], &[1, 2, 4]), Some(2));
        assert_eq!(first_changed(&[1, 2], &[1, 2]), None);
    }
}
