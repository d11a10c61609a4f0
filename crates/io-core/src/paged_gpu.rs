//! A paged plan as the GPU paged-copy kernel takes it (`mori_gpu::CopyPool::copy_paged`), for
//! the GPU backends (xgmi, fabric). Built with the `gpu` feature.

use crate::backend::Op;
use crate::paged::{BlockRun, PagedLayout, PagedPlan};
use mori_gpu::{PagedCopy, PagedRun, PagedSide};

/// The GPU paged copy of `plan` between the local region at device address `laddr` and the
/// remote region at device address `rbase` (side A = local, B = remote; a write copies A to
/// B), and its runs as the kernel reads them (no copy of the table).
pub fn paged_job(plan: &PagedPlan, op: Op, laddr: u64, rbase: u64) -> (PagedCopy, &[PagedRun]) {
    let side = |addr: u64, l: &PagedLayout| PagedSide {
        base: addr + l.base,
        layer_stride: l.layer_stride,
        half_stride: l.half_stride,
        block_stride: l.block_stride,
    };
    let job = PagedCopy {
        a: side(laddr, &plan.local),
        b: side(rbase, &plan.remote),
        block_bytes: plan.block_size,
        layers: plan.layers,
        halves: plan.halves,
        a_to_b: op == Op::Write,
    };
    (job, runs_for_gpu(&plan.runs))
}

/// `BlockRun { local, remote, count }` is laid out as `PagedRun { a_block, b_block, count }`
/// (both `repr(C)`, three `u32`).
fn runs_for_gpu(runs: &[BlockRun]) -> &[PagedRun] {
    const _: () = assert!(std::mem::size_of::<BlockRun>() == 12 && std::mem::size_of::<PagedRun>() == 12);
    const _: () = assert!(std::mem::align_of::<BlockRun>() == std::mem::align_of::<PagedRun>());
    // SAFETY: same size, alignment and field order (three u32, repr(C)); any bit pattern is
    // valid for both.
    unsafe { std::slice::from_raw_parts(runs.as_ptr() as *const PagedRun, runs.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_and_runs_map_field_for_field() {
        let plan = PagedPlan {
            block_size: 64,
            layers: 3,
            halves: 2,
            local: PagedLayout { base: 8, layer_stride: 1000, half_stride: 500, block_stride: 64 },
            remote: PagedLayout { base: 16, layer_stride: 2000, half_stride: 900, block_stride: 80 },
            blocks: 3,
            runs: vec![BlockRun { local: 1, remote: 2, count: 2 }, BlockRun { local: 7, remote: 9, count: 1 }],
        };
        let (job, runs) = paged_job(&plan, Op::Read, 1 << 40, 1 << 41);
        assert_eq!((job.a.base, job.a.layer_stride, job.a.half_stride, job.a.block_stride), ((1 << 40) + 8, 1000, 500, 64));
        assert_eq!((job.b.base, job.b.layer_stride, job.b.half_stride, job.b.block_stride), ((1 << 41) + 16, 2000, 900, 80));
        assert_eq!((job.block_bytes, job.layers, job.halves, job.a_to_b), (64, 3, 2, false));
        assert!(paged_job(&plan, Op::Write, 0, 0).0.a_to_b);
        let got: Vec<(u32, u32, u32)> = runs.iter().map(|r| (r.a_block, r.b_block, r.count)).collect();
        assert_eq!(got, vec![(1, 2, 2), (7, 9, 1)]);
    }
}
