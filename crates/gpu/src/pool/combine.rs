//! Ordered batches from several threads in shared launches ([`CopyPool::copy_jobs_in_order`]).
//! A call queues its batches on the device's pool, then launches everything queued unless
//! another thread is launching already: that thread takes the queue again once its launch
//! returned, and the call returns at once. So while one thread is inside the driver, the
//! batches other threads queue meanwhile go out together in its next launch of the
//! ordered-copy kernel (up to [`super::ORDERED_SEGS`] segments), instead of one launch per
//! call, each waiting for the others' driver calls.
//!
//! Why: under the inter-node EP load on one GPU (8 proxies posting at once,
//! docs/PERFORMANCE.md) a posting call took 32-41 µs, of which 17.6 µs queueing one launch,
//! against 11 µs for a whole batch-1 xgmi write in bench_engine: the driver calls of the
//! other threads are what a post waits for.

use std::ops::Range;
use std::sync::atomic::Ordering;

use super::ordered::OrderedCopy;
use super::{stats, CopyPool, CopySeg, DevPool};
use crate::error::Result;
use crate::types::Device;

/// Called once with the outcome of an [`OrderedJob`] (shared by the jobs of one submission).
pub type JobDone = Box<dyn FnOnce(&Result<()>) + Send>;

/// One ordered batch ([`CopyPool::copy_in_order_with`]'s): `segs` land in order; `done` is
/// called once, with the outcome of the submission that carried them.
pub struct OrderedJob {
    /// The copies, in the order their bytes must land (empty ones are skipped).
    pub segs: Vec<CopySeg>,
    /// Called exactly once: `Ok` once every segment landed, or the error that stopped it.
    pub done: JobDone,
}

/// A queued job and the posting call that queued it.
pub(super) struct Queued {
    call: u64,
    job: OrderedJob,
}

/// How a run of queued jobs goes out: `(range, true)` packs jobs `range` into one launch of the
/// ordered-copy kernel (the longest run from its start that one table takes:
/// [`OrderedCopy::grouped`]); `(i..i + 1, false)` is job `i` on its own, as copies (the kernel
/// off, or a job it does not take). The ranges cover `0..jobs.len()` in order.
pub(super) fn plan(jobs: &[&[CopySeg]], kernel: bool) -> Vec<(Range<usize>, bool)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < jobs.len() {
        let mut j = i;
        while kernel && j < jobs.len() && OrderedCopy::grouped(jobs[i..=j].iter().copied()).is_some() {
            j += 1;
        }
        if j > i {
            out.push((i..j, true));
            i = j;
        } else {
            out.push((i..i + 1, false));
            i += 1;
        }
    }
    out
}

impl CopyPool {
    /// Ordered batches on `dev` ([`OrderedJob`]: each as [`CopyPool::copy_in_order_with`], its
    /// segments landing in order; batches are not ordered among themselves), queued on the
    /// device's pool and launched by this call or, when another thread is launching on the
    /// device at the moment, by that thread as soon as its launch returned. Queued batches go
    /// out in as few submissions as the ordered-copy kernel takes ([`plan`]: consecutive
    /// batches in one launch while they hold at most [`super::ORDERED_SEGS`] non-empty
    /// segments in all, each with at most [`super::ORDERED_REST_MAX`] bytes after its first);
    /// a batch the kernel does not take (or every batch, with the kernel off) is a submission
    /// of its own. So this call may return before its batches are queued on a stream.
    ///
    /// Every job's `done` is called exactly once: with the outcome of the submission that
    /// carried it, or with the error that kept it from being queued (the device's pool could
    /// not be set up, no slot came within the admission timeout, the driver refused the
    /// launch), possibly from this thread before this call returns.
    ///
    /// Why: see the module docs (driver calls under load are what a post costs).
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for every job's segments, until that job's `done` was called.
    pub unsafe fn copy_jobs_in_order(&self, dev: Device, jobs: Vec<OrderedJob>) {
        if jobs.is_empty() {
            return;
        }
        let dp = match self.shared.dev_pool(dev) {
            Ok(dp) => dp,
            Err(e) => {
                let e = Err(e);
                for j in jobs {
                    (j.done)(&e);
                }
                return;
            }
        };
        let call = dp.calls.fetch_add(1, Ordering::Relaxed);
        dp.queued.lock().extend(jobs.into_iter().map(|job| Queued { call, job }));
        // SAFETY: forwarded contract.
        unsafe { self.drain_queued(dp, call) };
    }

    /// Launches what is queued on `dp` unless another thread holds the launcher. Whoever holds
    /// it takes the queue again after each launch and once more after letting go, so a job
    /// queued while it held it is never left behind.
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for every queued job's segments (its queuer's contract).
    unsafe fn drain_queued(&self, dp: &DevPool, call: u64) {
        while let Some(launching) = dp.launcher.try_lock() {
            loop {
                let batch = std::mem::take(&mut *dp.queued.lock());
                if batch.is_empty() {
                    break;
                }
                // SAFETY: forwarded contract.
                unsafe { self.launch_queued(dp, call, batch) };
            }
            drop(launching);
            if dp.queued.lock().is_empty() {
                break;
            }
        }
    }

    /// Runs `f` while holding `dev`'s launcher, as a thread inside a launch would, then
    /// launches whatever was queued meanwhile: so calls of [`CopyPool::copy_jobs_in_order`]
    /// made inside `f` (from any thread) return without launching, and their batches go out
    /// together afterwards. For tests of the combining; errors as [`CopyPool::submit`]'s
    /// device setup.
    #[doc(hidden)]
    pub fn with_launcher_held_for_tests<T>(&self, dev: Device, f: impl FnOnce() -> T) -> Result<T> {
        let dp = self.shared.dev_pool(dev)?;
        let out = {
            let _held = dp.launcher.lock();
            f()
        };
        let call = dp.calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: only jobs queued through copy_jobs_in_order are in the queue, each under
        // its caller's contract.
        unsafe { self.drain_queued(dp, call) };
        Ok(out)
    }

    /// Submits `batch` as [`plan`] says, from the call numbered `call`.
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for every job's segments.
    unsafe fn launch_queued(&self, dp: &DevPool, call: u64, batch: Vec<Queued>) {
        let refs: Vec<&[CopySeg]> = batch.iter().map(|q| q.job.segs.as_slice()).collect();
        let parts = plan(&refs, dp.ordered.is_some());
        let mut calls: Vec<u64> = batch.iter().map(|q| q.call).collect();
        let mut dones: Vec<Option<JobDone>> = Vec::with_capacity(batch.len());
        let mut segs: Vec<Vec<CopySeg>> = Vec::with_capacity(batch.len());
        for q in batch {
            segs.push(q.job.segs);
            dones.push(Some(q.job.done));
        }
        for (range, kernel) in parts {
            let mut these: Vec<JobDone> = dones[range.clone()].iter_mut().filter_map(Option::take).collect();
            let mut made = false;
            let mut make_done = || {
                made = true;
                let mine = std::mem::take(&mut these);
                move |r: Result<()>| {
                    for d in mine {
                        d(&r);
                    }
                }
            };
            let packed =
                if kernel { dp.ordered.as_ref().zip(OrderedCopy::grouped(segs[range.clone()].iter().map(|v| v.as_slice()))) } else { None };
            let r = match packed {
                // SAFETY: forwarded contract.
                Some((f, (table, n, longest))) => unsafe { self.copy_ordered(dp, f, table, n, longest, &mut make_done) },
                // SAFETY: forwarded contract.
                None => unsafe { self.copy_in_order_with(dp.device, segs[range.start].iter().copied(), &mut make_done) },
            };
            let r = r.map(|()| {
                let from: &mut [u64] = &mut calls[range.clone()];
                let handed = from.iter().filter(|&&c| c != call).count();
                from.sort_unstable();
                let mut distinct = from.to_vec();
                distinct.dedup();
                stats::count_combined(distinct.len(), handed);
            });
            if let Err(e) = r {
                // Nothing of this submission is pending: its jobs learn why here.
                if !made {
                    let e = Err(e);
                    for d in these.drain(..) {
                        d(&e);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ORDERED_REST_MAX, ORDERED_SEGS};
    use super::*;
    use proptest::prelude::*;

    fn seg(len: u64) -> CopySeg {
        CopySeg { src: 0x1000, dst: 0x9000, len }
    }

    #[test]
    fn eight_proxies_bursts_go_out_in_one_launch() {
        // 8 proxies x 4 peers: a segment and its counter pair each.
        let jobs: Vec<Vec<CopySeg>> = (0..32).map(|i| vec![seg(1_200_000 + i), seg(16)]).collect();
        let refs: Vec<&[CopySeg]> = jobs.iter().map(|v| v.as_slice()).collect();
        assert_eq!(plan(&refs, true), vec![(0..32, true)]);
        assert_eq!(plan(&refs, false).len(), 32, "kernel off: one submission per batch");
        // One more batch: a second launch.
        let mut more = jobs.clone();
        more.push(vec![seg(5), seg(16)]);
        let refs: Vec<&[CopySeg]> = more.iter().map(|v| v.as_slice()).collect();
        assert_eq!(plan(&refs, true), vec![(0..32, true), (32..33, true)]);
    }

    #[test]
    fn a_batch_the_kernel_refuses_goes_alone_between_packed_runs() {
        let big_rest = vec![seg(1), seg(ORDERED_REST_MAX + 1)];
        let jobs = [vec![seg(10), seg(16)], big_rest, vec![seg(20)], vec![seg(30), seg(16)]];
        let refs: Vec<&[CopySeg]> = jobs.iter().map(|v| v.as_slice()).collect();
        assert_eq!(plan(&refs, true), vec![(0..1, true), (1..2, false), (2..4, true)]);
        assert_eq!(plan(&[], true), vec![]);
    }

    proptest! {
        /// Against the oracle: the ranges cover every job once, in order; a packed range is a
        /// table the kernel takes and does not take the next job too; a job alone is one the
        /// kernel does not take by itself.
        #[test]
        fn plan_covers_every_job_in_order_and_packs_maximal_runs(
            jobs in proptest::collection::vec(proptest::collection::vec(0u64..100_000, 0..12), 0..40),
            kernel in any::<bool>(),
        ) {
            let jobs: Vec<Vec<CopySeg>> = jobs.iter().map(|v| v.iter().map(|&l| seg(l)).collect()).collect();
            let refs: Vec<&[CopySeg]> = jobs.iter().map(|v| v.as_slice()).collect();
            let parts = plan(&refs, kernel);
            let mut next = 0;
            for (r, k) in &parts {
                prop_assert_eq!(r.start, next);
                prop_assert!(r.end > r.start);
                next = r.end;
                let takes = |rr: Range<usize>| OrderedCopy::grouped(refs[rr].iter().copied()).is_some();
                if *k {
                    prop_assert!(kernel && takes(r.clone()));
                    let n: usize = refs[r.clone()].iter().map(|g| g.iter().filter(|s| s.len > 0).count()).sum();
                    prop_assert!(n <= ORDERED_SEGS);
                    if r.end < refs.len() {
                        prop_assert!(!takes(r.start..r.end + 1));
                    }
                } else {
                    prop_assert_eq!(r.len(), 1);
                    prop_assert!(!kernel || !takes(r.clone()));
                }
            }
            prop_assert_eq!(next, refs.len());
        }
    }
}
