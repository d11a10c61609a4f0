//! Several requests posted together ([`mori_io_core::Backend::post_many`]): the ordered ones
//! on one device share ordered-copy kernel launches
//! ([`mori_gpu::CopyPool::copy_groups_in_order_with`]), one group per request; the others are
//! posted one by one. Ordered batches over sessions' routes ([`Inner::post_routed`]) share
//! launches the same way, with their regions resolved when the session was made.
//!
//! Why: the inter-node EP proxy posts one ordered batch per peer in a burst (a segment and the
//! counter pair behind it), and under load each launch waits for the other threads' driver
//! calls (docs/PERFORMANCE.md), so a burst to four peers cost four such waits.
//!
//! Routed batches with tail words ([`RoutedBatch::words`]) go another way: their segments as
//! copy-engine copies, then every word and the completion flag in one stream memory-operation
//! batch ([`mori_gpu::CopyPool::copy_then_write`]), one submission per device. A segment and
//! its counter pair then cost two driver calls and the copy engine's latency, where the
//! ordered-copy kernel's launch waits several µs longer for the pair to land (the second call
//! cost more than that under the inter-node EP: docs/PERFORMANCE.md, "Counter pairs as tail
//! words").

use super::{copy_seg, Done, Inner, Keep, XgmiRoute};
use mori_gpu::{CopySeg, Device, StreamWrite};
use mori_io_core::plan::{check_segs, check_segs_mapped, check_tail_words};
use mori_io_core::status::Completion;
use mori_io_core::{IoError, IoResult, Op, RoutedBatch, TransferRequest, TransferStatus};
use std::sync::Arc;

/// A batch's copies and the tail words behind them.
type Worded = (Vec<CopySeg>, Vec<StreamWrite>);

/// A routed batch resolved: its device, copies, holds, peer and tail words as stream writes
/// into the remote region (`None` for a batch without words).
struct Routed {
    dev: Device,
    segs: Vec<CopySeg>,
    keep: Keep,
    peer: Arc<mori_io_core::EngineDesc>,
    words: Option<Vec<StreamWrite>>,
}

/// Hands `items` to `queue` one device at a time (the first item's device first), each
/// device's items in their order.
fn per_device<T>(mut items: Vec<(Device, T, Done)>, mut queue: impl FnMut(Device, Vec<(Device, T, Done)>)) {
    while let Some(dev) = items.first().map(|r| r.0) {
        let (mine, rest): (Vec<_>, Vec<_>) = items.into_iter().partition(|r| r.0 == dev);
        items = rest;
        queue(dev, mine);
    }
}

/// `b`'s tail words as stream writes into the remote region of route `r`: a write's, each
/// inside the region as the route resolved it and at an 8-aligned device address (the session
/// checked them against the descriptor; the route's length and base are what the copies use).
fn tail_writes(op: Op, b: &RoutedBatch, r: &XgmiRoute) -> IoResult<Vec<StreamWrite>> {
    if op != Op::Write {
        return Err(IoError::invalid(format!("ordered batch {}: tail words go with writes only", b.id)));
    }
    check_tail_words((r.ids.1, r.at.rlen), &b.words)?;
    if let Some(w) = b.words.iter().find(|w| !(r.at.rbase + w.offset).is_multiple_of(8)) {
        return Err(IoError::invalid(format!(
            "ordered batch {}: tail word at offset {} of remote memory {} is at device address {:#x}, not 8-aligned (the region starts at {:#x})",
            b.id,
            w.offset,
            r.ids.1,
            r.at.rbase + w.offset,
            r.at.rbase
        )));
    }
    Ok(b.words.iter().map(|w| StreamWrite::U64 { addr: r.at.rbase + w.offset, value: w.value }).collect())
}

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
        per_device(ready, |dev, mine| self.queue_groups(dev, mine));
    }

    /// Posts ordered batches over routes (this backend's, made by sessions): those with tail
    /// words first, in `copy_then_write` submissions per device (`queue_worded`), then the
    /// others grouped per device, in order, as [`Inner::post_many`]'s ordered requests. A batch whose route is
    /// another backend's or another xgmi backend's, whose regions went away, or whose segments
    /// leave the mapped regions fails on its own; nothing of it is queued.
    pub(super) fn post_routed(self: &Arc<Self>, op: Op, batches: Vec<RoutedBatch>) {
        let mut ready: Vec<(Device, Vec<CopySeg>, Done)> = Vec::with_capacity(batches.len());
        let mut worded: Vec<(Device, Worded, Done)> = Vec::new();
        for b in batches {
            match self.routed_segs(op, &b) {
                Ok(Routed { dev, segs, keep, peer, words }) => {
                    let done = Done { status: b.status, peer, id: b.id, keep };
                    match words {
                        Some(w) => worded.push((dev, (segs, w), done)),
                        None => ready.push((dev, segs, done)),
                    }
                }
                Err(e) => b.status.complete_piece(Err(e)),
            }
        }
        per_device(worded, |dev, mine| self.queue_worded(dev, mine));
        per_device(ready, |dev, mine| self.queue_groups(dev, mine));
    }

    /// Queues one device's batches with tail words: their copies, then their words and the
    /// completion flag in one stream batch (`copy_then_write`), as few submissions as keep
    /// each within the batch's word limit (a failed submission fails the batches it carries).
    fn queue_worded(&self, dev: Device, mut mine: Vec<(Device, Worded, Done)>) {
        let cap = mori_gpu::STREAM_WRITES_MAX - 1;
        while !mine.is_empty() {
            let (mut n, mut words) = (0, 0);
            while n < mine.len() && (n == 0 || words + mine[n].1 .1.len() <= cap) {
                words += mine[n].1 .1.len();
                n += 1;
            }
            let rest = mine.split_off(n);
            self.queue_worded_one(dev, mine);
            mine = rest;
        }
    }

    /// One `copy_then_write` submission of `mine`.
    fn queue_worded_one(&self, dev: Device, mine: Vec<(Device, Worded, Done)>) {
        let (work, dones): (Vec<Worded>, Vec<Done>) = mine.into_iter().map(|(_, w, d)| (w, d)).unzip();
        let groups: Vec<(&[CopySeg], &[StreamWrite])> = work.iter().map(|(s, w)| (s.as_slice(), w.as_slice())).collect();
        let mut dones = Some(dones);
        let notifier = self.notifier.clone();
        // SAFETY: every segment lies inside its batch's local registration and remote region,
        // and every word inside the remote region (checked by the session and in routed_segs),
        // all mapped for as long as the completion lives (it holds the remote mapping and the
        // registry handle that deregistration waits for).
        let r = unsafe {
            self.pool.copy_then_write(dev, &groups, || {
                let these = dones.take().unwrap_or_default();
                move |r: mori_gpu::Result<()>| {
                    for d in these {
                        d.finish(&r, &notifier);
                    }
                }
            })
        };
        if let Err(e) = r {
            for d in dones.take().unwrap_or_default() {
                d.status.complete_piece(Err(IoError::gpu("queue xgmi transfer with tail words", &e)));
            }
        }
    }

    /// A routed batch resolved (every segment checked against the regions as resolved for its
    /// route, every tail word by `tail_writes`).
    fn routed_segs(self: &Arc<Self>, op: Op, b: &RoutedBatch) -> IoResult<Routed> {
        let r =
            b.route.as_any().downcast_ref::<XgmiRoute>().filter(|r| Arc::ptr_eq(&r.inner, self)).ok_or_else(|| {
                IoError::invalid(format!("ordered batch {}: its session's route was not made by this xgmi backend", b.id))
            })?;
        let keep = r.keep()?;
        check_segs((r.ids.0, r.at.llen), (r.ids.1, r.at.rlen), &b.segs)?;
        let words = (!b.words.is_empty()).then(|| tail_writes(op, b, r)).transpose()?;
        Ok(Routed { dev: r.at.dev, segs: b.segs.iter().map(|s| copy_seg(op, &r.at, s)).collect(), keep, peer: r.peer.clone(), words })
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
