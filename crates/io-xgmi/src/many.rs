//! Several requests posted together ([`mori_io_core::Backend::post_many`]): the ordered ones
//! on one device share ordered-copy kernel launches
//! ([`mori_gpu::CopyPool::copy_groups_in_order_with`]), one group per request; the others are
//! posted one by one. Ordered batches over sessions' routes ([`Inner::post_routed`]) share
//! launches the same way, with their regions resolved when the session was made.
//!
//! Why: the inter-node EP proxy posts one ordered batch per peer in a burst (a segment and the
//! counter pair behind it), and under load each launch waits for the other threads' driver
//! calls (docs/PERFORMANCE.md), so a burst to four peers cost four such waits.

use super::{copy_seg, Done, Inner, Keep, XgmiRoute};
use mori_gpu::{CopySeg, Device};
use mori_io_core::plan::{check_segs, check_segs_mapped};
use mori_io_core::status::Completion;
use mori_io_core::{IoError, IoResult, Op, RoutedBatch, TransferRequest, TransferStatus};
use std::sync::Arc;

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

    /// Posts ordered batches over routes (this backend's, made by sessions): grouped per
    /// device, in order, as [`Inner::post_many`]'s ordered requests. A batch whose route is
    /// another backend's or another xgmi backend's, whose regions went away, or whose segments
    /// leave the mapped regions fails on its own; nothing of it is queued.
    pub(super) fn post_routed(self: &Arc<Self>, op: Op, batches: Vec<RoutedBatch>) {
        let mut ready: Vec<(Device, Vec<CopySeg>, Done)> = Vec::with_capacity(batches.len());
        for b in batches {
            match self.routed_segs(op, &b) {
                Ok((dev, segs, keep, peer)) => ready.push((dev, segs, Done { status: b.status, peer, id: b.id, keep })),
                Err(e) => b.status.complete_piece(Err(e)),
            }
        }
        while let Some(dev) = ready.first().map(|r| r.0) {
            let (mine, rest): (Vec<_>, Vec<_>) = ready.into_iter().partition(|r| r.0 == dev);
            ready = rest;
            self.queue_groups(dev, mine);
        }
    }

    /// A routed batch's device and copies (every segment checked against the regions as
    /// resolved for its route), its holds and its peer.
    fn routed_segs(self: &Arc<Self>, op: Op, b: &RoutedBatch) -> IoResult<(Device, Vec<CopySeg>, Keep, Arc<mori_io_core::EngineDesc>)> {
        let r =
            b.route.as_any().downcast_ref::<XgmiRoute>().filter(|r| Arc::ptr_eq(&r.inner, self)).ok_or_else(|| {
                IoError::invalid(format!("ordered batch {}: its session's route was not made by this xgmi backend", b.id))
            })?;
        let keep = r.keep()?;
        check_segs((r.ids.0, r.at.llen), (r.ids.1, r.at.rlen), &b.segs)?;
        Ok((r.at.dev, b.segs.iter().map(|s| copy_seg(op, &r.at, s)).collect(), keep, r.peer.clone()))
    }

    /// The request's device and copies (every segment checked against the local registration
    /// and the remote region's owner-confirmed length) and its holds.
    fn ordered_segs(&self, req: &TransferRequest) -> IoResult<(Device, Vec<CopySeg>, Keep)> {
        let (at, keep, _) = self.resolve(&req.local, &req.remote, &req.peer, Some(req.local_region.clone()))?;
        check_segs_mapped((req.local.id, at.llen), (req.remote.id, at.rlen), &req.segs, &req.entries)?;
        Ok((at.dev, req.segs.iter().map(|s| copy_seg(req.op, &at, s)).collect(), keep))
    }

    /// Queues one device's requests as groups of one grouped ordered submission.
    fn queue_groups(&self, dev: Device, mine: Vec<(Device, Vec<CopySeg>, Done)>) {
        let (segs, dones): (Vec<Vec<CopySeg>>, Vec<Done>) = mine.into_iter().map(|(_, s, d)| (s, d)).unzip();
        let groups: Vec<&[CopySeg]> = segs.iter().map(|s| s.as_slice()).collect();
        let mut dones: Vec<Option<Done>> = dones.into_iter().map(Some).collect();
        let notifier = self.notifier.clone();
        // SAFETY: every segment lies inside its request's local registration and remote region
        // (checked above), both mapped for as long as its completion lives (it holds the remote
        // mapping, and the registry handle that deregistration waits for).
        let r = unsafe {
            self.pool.copy_groups_in_order_with(dev, &groups, |range| {
                let these: Vec<Done> = dones[range].iter_mut().filter_map(Option::take).collect();
                let notifier = notifier.clone();
                move |r: mori_gpu::Result<()>| {
                    for d in these {
                        d.finish(&r, &notifier);
                    }
                }
            })
        };
        if let Err((i, e)) = r {
            for d in dones[i..].iter_mut().filter_map(Option::take) {
                d.status.complete_piece(Err(IoError::gpu("queue xgmi transfer", &e)));
            }
        }
    }
}
