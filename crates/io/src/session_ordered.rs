//! Ordered batches over sessions ([`Session::post_ordered_many`]): each batch's entries land in
//! order (every byte of one visible at the target before any byte of the next is written), as
//! with `IoEngine::post_ordered`, but through the routes the sessions prepared, so a post makes
//! none of the one-shot lookups (peer, backend choice, registry, the remote mapping).
//!
//! Why: the inter-node EP proxy posts one ordered batch per destination (a segment and the
//! counter pair behind it) for every command it takes; on xgmi the one-shot path's lookups and
//! copies of both descriptors were a third of its posting call (docs/PERFORMANCE.md).

use crate::paged::Batch;
use crate::session::Session;
use mori_io_core::plan::unmerged_segments;
use mori_io_core::status::Completion;
use mori_io_core::{Backend, IoError, Op, RoutedBatch, TransferId, TransferStatus};
use std::sync::Arc;

/// One ordered batch over a session: parallel arrays of local offsets, remote offsets and
/// sizes (bytes; the rules of `mori_io_core::plan::check_batch`), and its transfer id.
pub struct SessionBatch<'a> {
    /// The session (local region, remote region, backend).
    pub session: &'a Session,
    /// Offsets into the session's local region (bytes).
    pub local_offs: &'a [u64],
    /// Offsets into the session's remote region (bytes).
    pub remote_offs: &'a [u64],
    /// Entry lengths (bytes); empty entries are skipped.
    pub sizes: &'a [u64],
    /// The transfer id (unique among this engine's unfinished transfers to that peer).
    pub id: TransferId,
}

impl Session {
    /// Whether [`Session::post_ordered_many`] takes this session's batches: its backend
    /// prepared a route and keeps a batch's order (xgmi). Otherwise use
    /// `IoEngine::post_ordered`.
    pub fn posts_ordered(&self) -> bool {
        self.route.is_some() && self.backend.orders_segments()
    }

    /// One ordered batch ([`Session::post_ordered_many`] with one batch).
    pub fn post_ordered(&self, op: Op, local_offs: &[u64], remote_offs: &[u64], sizes: &[u64], id: TransferId) -> TransferStatus {
        let b = SessionBatch { session: self, local_offs, remote_offs, sizes, id };
        Self::post_ordered_many(op, &[b]).pop().unwrap_or_else(|| TransferStatus::failed(IoError::bad_state("no status")))
    }

    /// Posts ordered batches in direction `op`, each over its own session (of any engine),
    /// made together: one status per batch, in order. Batches whose sessions share a backend
    /// go to it in one call, which may queue them with fewer device calls (xgmi: up to 8
    /// segments of several batches in one kernel launch). Each batch is checked on its own:
    /// `BadState` / `RemoteDisconnect` as the session's other calls, `InvalidArgs` for entries
    /// outside either region or an id still in flight, `NotSupported` when the session's
    /// backend does not post ordered batches over a route ([`Session::posts_ordered`] is false;
    /// nothing is posted for it). A device failure fails every batch that shares the failed
    /// launch and, on xgmi, the batches after it, which are then not queued.
    pub fn post_ordered_many(op: Op, batches: &[SessionBatch<'_>]) -> Vec<TransferStatus> {
        let mut out = Vec::with_capacity(batches.len());
        let mut groups: Vec<(Arc<dyn Backend>, Vec<RoutedBatch>)> = Vec::new();
        for b in batches {
            let st = match b.session.routed(b) {
                Err(st) => {
                    out.push(st);
                    continue;
                }
                Ok(rb) => rb,
            };
            out.push(st.status.clone());
            let be = &b.session.backend;
            match groups.iter_mut().find(|(g, _)| Arc::ptr_eq(g, be)) {
                Some((_, v)) => v.push(st),
                None => groups.push((be.clone(), vec![st])),
            }
        }
        for (be, v) in groups {
            be.post_ordered_routes(op, v);
        }
        out
    }

    /// The checks of one batch over this session, and its id taken: the batch for the
    /// backend, or the failed status (nothing posted).
    fn routed(&self, b: &SessionBatch<'_>) -> Result<RoutedBatch, TransferStatus> {
        if let Some(gone) = self.engine_gone() {
            return Err(gone);
        }
        let route = match (&self.route, self.backend.orders_segments()) {
            (Some(r), true) => r.clone(),
            _ => {
                return Err(TransferStatus::failed(IoError::not_supported(format!(
                    "an ordered batch over the session of memory {} -> engine {:?} memory {}: its {} backend does not post one over a session (use IoEngine::post_ordered)",
                    self.local.id,
                    self.peer.key,
                    self.remote.id,
                    self.backend.kind()
                ))))
            }
        };
        let batch = Batch::Ranges(b.local_offs, b.remote_offs, b.sizes);
        if let Err(e) = batch.check((self.local.id, self.local.len), (self.remote.id, self.remote.len)) {
            return Err(TransferStatus::failed(e));
        }
        let slot = self.engine.inflight.reserve(self.peer.epoch, &self.peer.key, b.id).map_err(TransferStatus::failed)?;
        let status = TransferStatus::new(1);
        self.engine.inflight.fill(slot, &status);
        Ok(RoutedBatch { route, id: b.id, segs: unmerged_segments(b.local_offs, b.remote_offs, b.sizes), status })
    }
}
