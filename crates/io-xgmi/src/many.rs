//! Several requests posted together ([`mori_io_core::Backend::post_many`]): the ordered ones
//! on one device share ordered-copy kernel launches
//! ([`mori_gpu::CopyPool::copy_jobs_in_order`]), one group per request, with those other
//! threads queue on the same pool meanwhile; the others are posted one by one.
//!
//! Why: the inter-node EP proxy posts one ordered batch per peer in a burst (a segment and the
//! counter pair behind it), and under load each launch waits for the other threads' driver
//! calls (docs/PERFORMANCE.md), so a burst to four peers cost four such waits.

use super::{copy_seg, Done, Inner, Keep};
use mori_gpu::{CopySeg, Device, JobDone, OrderedJob};
use mori_io_core::plan::check_segs_mapped;
use mori_io_core::status::Completion;
use mori_io_core::{IoResult, TransferRequest, TransferStatus};

impl Inner {
    /// Posts `jobs`: ordered requests of plain segments grouped per device (in order), the
    /// rest one by one. Every status is completed, with its own error where its checks fail.
    pub(super) fn post_many(&self, jobs: Vec<(TransferRequest, TransferStatus)>) {
        let mut ready: Vec<(Device, Vec<CopySeg>, Done)> = Vec::with_capacity(jobs.len());
        for (req, st) in jobs {
            if !req.ordered || req.paged.is_some() {
                if let Err(e) = self.post(&req, &st) {
                    st.complete_piece(Err(e));
                }
                continue;
            }
            match self.ordered_segs(&req) {
                Ok((dev, segs, keep)) => ready.push((dev, segs, Done { status: st, peer: req.peer.clone(), id: req.id, keep })),
                Err(e) => st.complete_piece(Err(e)),
            }
        }
        while let Some(dev) = ready.first().map(|r| r.0) {
            let (mine, rest): (Vec<_>, Vec<_>) = ready.into_iter().partition(|r| r.0 == dev);
            ready = rest;
            self.queue_groups(dev, mine);
        }
    }

    /// The request's device and copies (every segment checked against the local registration
    /// and the remote region's owner-confirmed length) and its holds.
    fn ordered_segs(&self, req: &TransferRequest) -> IoResult<(Device, Vec<CopySeg>, Keep)> {
        let (at, keep, _) = self.resolve(&req.local, &req.remote, &req.peer, Some(req.local_region.clone()))?;
        check_segs_mapped((req.local.id, at.llen), (req.remote.id, at.rlen), &req.segs, &req.entries)?;
        Ok((at.dev, req.segs.iter().map(|s| copy_seg(req.op, &at, s)).collect(), keep))
    }

    /// Queues one device's requests as ordered jobs of the pool (launched with whatever other
    /// threads queue meanwhile).
    fn queue_groups(&self, dev: Device, mine: Vec<(Device, Vec<CopySeg>, Done)>) {
        let jobs = mine
            .into_iter()
            .map(|(_, segs, d)| {
                let notifier = self.notifier.clone();
                let done: JobDone = Box::new(move |r: &mori_gpu::Result<()>| d.finish(r, &notifier));
                OrderedJob { segs, done }
            })
            .collect();
        // SAFETY: every segment lies inside its request's local registration and remote region
        // (checked above), both mapped for as long as its completion lives (it holds the remote
        // mapping, and the registry handle that deregistration waits for).
        unsafe { self.pool.copy_jobs_in_order(dev, jobs) };
    }
}
