//! Ordered batches in one launch ([`super::CopyPool::copy_in_order_with`]): the segment table,
//! the slot's arrival word and its completion flag go in the parameters of
//! `mori_ordered_copy` (kernels/scatter_gather_copy.cu), so a batch such as a segment and the
//! counter pair that tells its peer it landed costs one driver call instead of one copy per
//! segment and a flag write. The whole grid copies the first segment; the block that arrives
//! last copies the others one after the other, then writes the flag.
//!
//! Why: under the inter-node EP load (8 proxies posting at once, docs/PERFORMANCE.md) each
//! driver call that queues work waits for the others' (40-77 µs to queue the two copies of
//! such a batch, against 10-13 µs for a whole write in bench_engine), so the number of calls
//! per batch is what a post costs.

use bytemuck::{Pod, Zeroable};
use std::sync::Arc;

use super::config::env_switch;
use super::CopySeg;
use crate::error::Result;
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

/// `mori_ordered_copy`'s parameter (kernels/README.md): 216 bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(super) struct OrderedCopy {
    segs: [CopySeg; ORDERED_SEGS],
    /// Device address of the slot's arrival word (0 between launches).
    arrivals: u64,
    /// Device address of the completion flag, or 0.
    flag: u64,
    n: u32,
    flag_value: u32,
}
const _: () = assert!(std::mem::size_of::<OrderedCopy>() == 216);

impl OrderedCopy {
    /// The table for `segs` (non-empty ones only), if the kernel takes them: 1 to
    /// [`ORDERED_SEGS`] segments with at most [`ORDERED_REST_MAX`] bytes after the first.
    /// Returns the table and the first segment's length (it sizes the grid).
    pub(super) fn table<I: Iterator<Item = CopySeg>>(segs: I) -> Option<(OrderedCopy, u64)> {
        let mut t = OrderedCopy::zeroed();
        let mut rest = 0u64;
        for (i, s) in segs.enumerate() {
            if i >= ORDERED_SEGS {
                return None;
            }
            if i > 0 {
                rest = rest.saturating_add(s.len);
            }
            t.segs[i] = s;
            t.n = i as u32 + 1;
        }
        (t.n > 0 && rest <= ORDERED_REST_MAX).then_some((t, t.segs[0].len))
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

/// The grid of one launch: a block per 16 KiB of the first segment, at least 1, at most 128
/// per multiprocessor (the scatter/gather kernel's shape).
pub(super) fn grid(first_len: u64, sms: u32) -> u32 {
    (128 * sms as u64).min(first_len.div_ceil(16 << 10)).max(1) as u32
}

/// The slots' arrival words on `dev`: one zeroed `u32` per slot in one device buffer (each
/// slot holds a reference, leaked with the slot's buffers when its last launch may still run).
pub(super) fn alloc_arrivals(rt: &Arc<dyn Runtime>, dev: Device, n: usize) -> Result<Arc<DeviceBuffer>> {
    let buf = rt.alloc(dev, (n * 4).max(4))?;
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
        assert_eq!(b.len(), 216);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!((u64_at(0), u64_at(8), u64_at(16)), (0x1000, 0x9000, 100));
        assert_eq!(u64_at(24 + 16), 16);
        assert_eq!((u64_at(192), u64_at(200), u32_at(208), u32_at(212)), (0xA0, 0xF0, 2, 7));
        let t0 = OrderedCopy::table(std::iter::once(seg(1))).unwrap().0.finish(0xB0, None);
        assert_eq!(u64::from_le_bytes(bytemuck::bytes_of(&t0)[200..208].try_into().unwrap()), 0, "no flag: 0");
    }

    #[test]
    fn the_grid_is_a_block_per_16_kib_capped_at_128_per_multiprocessor() {
        assert_eq!(grid(0, 132), 1);
        assert_eq!(grid(16, 132), 1);
        assert_eq!(grid(1_835_008, 132), 112);
        assert_eq!(grid(1 << 40, 132), 128 * 132);
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
