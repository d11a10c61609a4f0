//! Ordered batches in one launch ([`super::CopyPool::copy_in_order_with`]): the segment table,
//! the slot's arrival word and its completion flag go in the parameters of
//! `mori_ordered_copy` (kernels/scatter_gather_copy.cu), so a batch such as a segment and the
//! counter pair that tells its peer it landed costs one driver call instead of one copy per
//! segment and a flag write. The whole grid copies the first segment; the block that arrives
//! last copies the others one after the other, then writes the flag. Several ordered batches
//! posted together ([`super::CopyPool::copy_groups_in_order_with`]) share a launch: the grid
//! is then one run of blocks per batch (a group), each run with its own arrival word, and the
//! last group to finish writes the flag.
//!
//! Why: under the inter-node EP load (8 proxies posting at once, docs/PERFORMANCE.md) each
//! driver call that queues work waits for the others' (40-77 µs to queue the two copies of
//! such a batch, against 10-13 µs for a whole write in bench_engine), so the number of calls
//! per batch is what a post costs.

use bytemuck::{Pod, Zeroable};
use std::sync::Arc;

use super::config::env_switch;
use super::{CopyPool, CopySeg};
use crate::error::{GpuError, Result};
use crate::memory::DeviceBuffer;
use crate::types::Device;
use crate::Runtime;

/// Most segments of an ordered batch that goes through the kernel (its table's capacity).
pub const ORDERED_SEGS: usize = 8;

/// Most bytes after the first segment of an ordered batch that goes through the kernel: one
/// block copies them (counter pairs and signals: 16 bytes each). Larger batches are queued as
/// one async copy per segment.
pub const ORDERED_REST_MAX: u64 = 64 << 10;

/// The environment variable that overrides [`super::CopyPoolConfig::ordered_kernel`].
pub const ORDERED_ENV: &str = "MORI_GPU_POOL_ORDERED_KERNEL";

/// Bytes of a slot's arrival words: a `u32` per group and one for the launch
/// ([`ORDERED_SEGS`] + 1 at most), padded.
pub(super) const ARRIVAL_BYTES: u64 = 64;

/// `mori_ordered_copy`'s parameter (kernels/README.md): 232 bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(super) struct OrderedCopy {
    segs: [CopySeg; ORDERED_SEGS],
    /// Device address of the slot's arrival words (0 between launches).
    arrivals: u64,
    /// Device address of the completion flag, or 0.
    flag: u64,
    n: u32,
    flag_value: u32,
    /// Groups (0: one group of `n` segments).
    groups: u32,
    /// Each group's first segment.
    first: [u8; ORDERED_SEGS],
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<OrderedCopy>() == 232);

impl OrderedCopy {
    /// The table for `segs` (non-empty ones only), if the kernel takes them: 1 to
    /// [`ORDERED_SEGS`] segments with at most [`ORDERED_REST_MAX`] bytes after the first.
    /// Returns the table and the first segment's length (it sizes the grid).
    pub(super) fn table<I: Iterator<Item = CopySeg>>(segs: I) -> Option<(OrderedCopy, u64)> {
        let mut buf = [CopySeg::zeroed(); ORDERED_SEGS];
        let mut n = 0;
        for s in segs {
            *buf.get_mut(n)? = s;
            n += 1;
        }
        // One group: `groups` stays 0, the kernel's one-group form.
        let (mut t, _, first) = Self::grouped(std::iter::once(&buf[..n]))?;
        t.groups = 0;
        Some((t, first))
    }

    /// The table for several ordered batches in one launch, one group each (non-empty
    /// segments only; empty groups are left out), if the kernel takes them: at most
    /// [`ORDERED_SEGS`] segments in all, each group with at most [`ORDERED_REST_MAX`] bytes
    /// after its first. Returns the table, its group count (at least 1) and the longest first
    /// segment.
    pub(super) fn grouped<'a, I: Iterator<Item = &'a [CopySeg]>>(groups: I) -> Option<(OrderedCopy, u32, u64)> {
        let mut t = OrderedCopy::zeroed();
        let (mut n, mut g, mut longest) = (0usize, 0usize, 0u64);
        for group in groups {
            let mut rest = 0u64;
            let start = n;
            for s in group.iter().filter(|s| s.len > 0) {
                if n >= ORDERED_SEGS {
                    return None;
                }
                if n > start {
                    rest = rest.saturating_add(s.len);
                } else {
                    longest = longest.max(s.len);
                }
                t.segs[n] = *s;
                n += 1;
            }
            if rest > ORDERED_REST_MAX {
                return None;
            }
            if n > start {
                t.first[g] = start as u8;
                g += 1;
            }
        }
        if n == 0 {
            return None;
        }
        t.n = n as u32;
        t.groups = g as u32;
        Some((t, g as u32, longest))
    }

    /// Whether the kernel takes this table on a grid of `grid` blocks (its own checks, which
    /// copy nothing and write no flag when they fail: a table the host built wrong would
    /// otherwise look like a completed copy).
    pub(super) fn takes(&self, grid: u32) -> bool {
        let n = self.n as usize;
        let g = self.groups.max(1) as usize;
        (1..=ORDERED_SEGS).contains(&n)
            && g <= n
            && grid.is_multiple_of(g as u32)
            && self.first[0] == 0
            && self.first[..g].windows(2).all(|w| w[0] < w[1])
            && (self.first[g - 1] as usize) < n
    }

    /// Sets where the kernel counts arrivals and what it writes once done.
    pub(super) fn finish(mut self, arrivals: u64, flag: Option<(u64, u32)>) -> OrderedCopy {
        self.arrivals = arrivals;
        if let Some((addr, value)) = flag {
            self.flag = addr;
            self.flag_value = value;
        }
        self
    }
}

impl CopyPool {
    /// Several ordered batches (groups) on `dev`, each as [`CopyPool::copy_in_order_with`]
    /// (its segments land in order; groups are not ordered among themselves), in as few
    /// submissions as the ordered-copy kernel takes: consecutive groups are packed into one
    /// launch while they hold at most [`ORDERED_SEGS`] non-empty segments in all and each has
    /// at most [`ORDERED_REST_MAX`] bytes after its first. A group the kernel does not take (or
    /// every group, with the kernel off) is a submission of its own. `make_done(range)` is
    /// called once per submission, after it is queued, with the groups it carries; their
    /// completion is that submission's.
    ///
    /// Why: a post of several batches (a proxy's burst to several peers) then costs one driver
    /// call, where each call waits for the other threads' under load (docs/PERFORMANCE.md).
    ///
    /// Errors: `(i, e)`: groups `..i` are queued (their completions made); groups `i..` have
    /// no completion made, and `e` is the error of the submission that carried group `i`. Its
    /// copies were not queued, except when the pool could not record the submission's event
    /// after queueing it (a driver failure that retires the slot): then they may still run,
    /// as with [`CopyPool::copy`].
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for every group's segments.
    pub unsafe fn copy_groups_in_order_with<M, D>(
        &self,
        dev: Device,
        groups: &[&[CopySeg]],
        mut make_done: M,
    ) -> std::result::Result<(), (usize, GpuError)>
    where
        M: FnMut(std::ops::Range<usize>) -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let dp = self.shared.dev_pool(dev).map_err(|e| (0, e))?;
        let mut i = 0;
        while i < groups.len() {
            // The longest run of groups from i that one launch takes.
            let mut packed = None;
            let mut j = i;
            if dp.ordered.is_some() {
                while j < groups.len() {
                    match OrderedCopy::grouped(groups[i..=j].iter().copied()) {
                        Some(t) => {
                            packed = Some(t);
                            j += 1;
                        }
                        None => break,
                    }
                }
            }
            match (dp.ordered.as_ref(), packed) {
                (Some(f), Some((table, n, longest))) => {
                    let range = i..j;
                    // SAFETY: forwarded contract.
                    unsafe { self.copy_ordered(dp, f, table, n, longest, || make_done(range)) }.map_err(|e| (i, e))?;
                    i = j;
                }
                _ => {
                    let range = i..i + 1;
                    // SAFETY: forwarded contract.
                    unsafe { self.copy_in_order_with(dev, groups[i].iter().copied(), || make_done(range)) }.map_err(|e| (i, e))?;
                    i += 1;
                }
            }
        }
        Ok(())
    }
}

/// Threads of a block of `mori_ordered_copy`: a block copies 16 KiB of a first segment, 64
/// bytes a thread, four 16-byte vectors (when source and destination share 16-byte alignment)
/// in two rounds of two loads in flight. With 64 threads a block (the scatter/gather kernel's
/// shape) each thread made eight such rounds, one HBM latency each, for any first segment of
/// 16 KiB or more.
pub(super) const ORDERED_BLOCK: u32 = 256;

/// The grid of one launch of `groups` groups: per group, a block of [`ORDERED_BLOCK`] threads
/// per 16 KiB of the longest first segment, at least 1, at most 32 per multiprocessor over all
/// groups (the grid's threads at most 8 192 times the multiprocessors).
pub(super) fn grid(first_len: u64, groups: u32, sms: u32) -> u32 {
    let groups = groups.max(1) as u64;
    let per = (32 * sms as u64 / groups).min(first_len.div_ceil(16 << 10)).max(1);
    (per * groups) as u32
}

/// The slots' arrival words on `dev`: [`ARRIVAL_BYTES`] zeroed per slot in one device buffer
/// (each slot holds a reference, leaked with the slot's buffers when its last launch may still
/// run).
pub(super) fn alloc_arrivals(rt: &Arc<dyn Runtime>, dev: Device, n: usize) -> Result<Arc<DeviceBuffer>> {
    let buf = rt.alloc(dev, (n.max(1) as u64 * ARRIVAL_BYTES) as usize)?;
    rt.memset(&buf.slice(), 0)?;
    Ok(Arc::new(buf))
}

/// Whether ordered batches use the kernel: `configured` (`None`: on CUDA, off on HIP, where it
/// never ran), unless [`ORDERED_ENV`] says otherwise.
pub(super) fn enabled(configured: Option<bool>, hip: bool, env: Option<&str>) -> Result<bool> {
    env_switch(ORDERED_ENV, configured.unwrap_or(!hip), env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(len: u64) -> CopySeg {
        CopySeg { src: 0x1000, dst: 0x9000, len }
    }

    #[test]
    fn the_kernel_takes_one_to_eight_segments_with_a_small_rest() {
        let (t, first) = OrderedCopy::table([seg(1 << 20), seg(16)].into_iter()).unwrap();
        assert_eq!((t.n, first, t.segs[1].len), (2, 1 << 20, 16));
        let (t, _) = OrderedCopy::table(std::iter::once(seg(8))).unwrap();
        assert_eq!(t.n, 1);
        assert!(OrderedCopy::table(std::iter::empty()).is_none());
        assert!(OrderedCopy::table((0..9).map(|_| seg(16))).is_none());
        let (t, _) = OrderedCopy::table((0..8).map(|_| seg(16))).unwrap();
        assert_eq!(t.n, 8);
        // The rest is one block's work: 64 KiB after the first segment at most.
        assert!(OrderedCopy::table([seg(16), seg(ORDERED_REST_MAX)].into_iter()).is_some());
        assert!(OrderedCopy::table([seg(16), seg(ORDERED_REST_MAX), seg(1)].into_iter()).is_none());
    }

    #[test]
    fn the_parameter_block_matches_the_kernel_abi() {
        let (t, _) = OrderedCopy::table([seg(100), seg(16)].into_iter()).unwrap();
        let t = t.finish(0xA0, Some((0xF0, 7)));
        let b = bytemuck::bytes_of(&t);
        assert_eq!(b.len(), 232);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!((u64_at(0), u64_at(8), u64_at(16)), (0x1000, 0x9000, 100));
        assert_eq!(u64_at(24 + 16), 16);
        assert_eq!((u64_at(192), u64_at(200), u32_at(208), u32_at(212)), (0xA0, 0xF0, 2, 7));
        assert_eq!((u32_at(216), &b[220..228]), (0, &[0u8; 8][..]), "one group: groups 0");
        let g = [vec![seg(100), seg(16)], vec![seg(50)], vec![seg(70), seg(16), seg(16)]];
        let (t, n, longest) = OrderedCopy::grouped(g.iter().map(|v| v.as_slice())).unwrap();
        let b = bytemuck::bytes_of(&t);
        assert_eq!((n, longest, u32_at_in(b, 208), u32_at_in(b, 216)), (3, 100, 6, 3));
        assert_eq!(&b[220..228], &[0, 2, 3, 0, 0, 0, 0, 0]);
        assert_eq!(u64::from_le_bytes(b[3 * 24 + 16..3 * 24 + 24].try_into().unwrap()), 70, "group 2 starts at segment 3");
        let t0 = OrderedCopy::table(std::iter::once(seg(1))).unwrap().0.finish(0xB0, None);
        assert_eq!(u64::from_le_bytes(bytemuck::bytes_of(&t0)[200..208].try_into().unwrap()), 0, "no flag: 0");
    }

    fn u32_at_in(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }

    #[test]
    fn the_host_checks_a_table_as_the_kernel_does() {
        let g = [vec![seg(100), seg(16)], vec![seg(50)], vec![seg(70), seg(16)]];
        let (t, n, _) = OrderedCopy::grouped(g.iter().map(|v| v.as_slice())).unwrap();
        assert_eq!(n, 3);
        assert!(t.takes(3) && t.takes(99));
        assert!(!t.takes(4), "a grid that is not a multiple of the group count");
        let mut bad = t;
        bad.first[2] = 1;
        assert!(!bad.takes(3), "groups not ascending");
        bad.first[2] = 5;
        assert!(!bad.takes(3), "a group starting past the last segment");
        let (one, _) = OrderedCopy::table([seg(1), seg(2)].into_iter()).unwrap();
        assert!(one.takes(1) && one.takes(7), "one group: any grid");
        assert!(!OrderedCopy::zeroed().takes(1), "no segment");
    }

    #[test]
    fn grouped_tables_hold_eight_segments_in_all_and_a_small_rest_per_group() {
        let groups = |g: &[Vec<CopySeg>]| OrderedCopy::grouped(g.iter().map(|v| v.as_slice())).map(|(t, n, l)| (t.n, n, l));
        // Four posts of a segment and its counter pair: eight segments, one launch.
        let four: Vec<Vec<CopySeg>> = (0..4).map(|i| vec![seg(1000 + i), seg(16)]).collect();
        assert_eq!(groups(&four), Some((8, 4, 1003)));
        let mut five = four.clone();
        five.push(vec![seg(1)]);
        assert_eq!(groups(&five), None, "nine segments");
        // Empty segments and groups are left out.
        assert_eq!(groups(&[vec![], vec![seg(0), seg(5)], vec![seg(0)]]), Some((1, 1, 5)));
        assert_eq!(groups(&[vec![], vec![seg(0)]]), None, "nothing to copy");
        // The rest limit is per group: each group's after-first bytes alone.
        let big = vec![seg(1), seg(ORDERED_REST_MAX)];
        assert_eq!(groups(&[big.clone(), big.clone()]).map(|g| g.1), Some(2));
        assert_eq!(groups(&[vec![seg(1), seg(ORDERED_REST_MAX), seg(1)]]), None);
    }

    #[test]
    fn the_grid_is_a_block_per_16_kib_capped_at_32_per_multiprocessor() {
        assert_eq!(grid(0, 1, 132), 1);
        assert_eq!(grid(16, 1, 132), 1);
        assert_eq!(grid(1_835_008, 1, 132), 112);
        assert_eq!(grid(1 << 40, 1, 132), 32 * 132);
        // Several groups: equal runs, the cap shared out.
        assert_eq!(grid(1_835_008, 4, 132), 4 * 112);
        assert_eq!(grid(0, 3, 132), 3);
        assert_eq!(grid(1 << 40, 3, 132), 3 * (32 * 132 / 3));
        assert_eq!(grid(1 << 40, 0, 132), 32 * 132, "no group counts as one");
        assert_eq!(ORDERED_BLOCK * 32, 8192, "the cap's threads a multiprocessor");
    }

    #[test]
    fn the_kernel_is_on_for_cuda_off_for_hip_unless_told() {
        assert!(enabled(None, false, None).unwrap());
        assert!(!enabled(None, true, None).unwrap());
        assert!(!enabled(Some(true), false, Some("0")).unwrap());
        assert!(enabled(None, true, Some("1")).unwrap());
        assert!(enabled(Some(false), false, Some("2")).unwrap_err().to_string().contains(ORDERED_ENV));
    }
}
