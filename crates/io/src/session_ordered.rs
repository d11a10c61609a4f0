//! Ordered batches over sessions ([`Session::post_ordered_many`]): each batch's entries land in
//! order (every byte of one visible at the target before any byte of the next is written), as
//! with `IoEngine::post_ordered`, but through the routes the sessions prepared, so a post makes
//! none of the one-shot lookups (peer, backend choice, registry, the remote mapping).
//!
//! Why: the inter-node EP proxy posts one ordered batch per destination (a segment and the
//! counter pair behind it) for every command it takes; on xgmi the one-shot path's lookups and
//! copies of both descriptors were a third of its posting call (docs/PERFORMANCE.md).

use crate::session::Session;
use mori_io_core::plan::{check_ordered_batch, check_tail_words};
use mori_io_core::status::Completion;
use mori_io_core::{Backend, IoError, Op, RoutedBatch, TailWord, TransferId, TransferStatus};
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
    /// Words stored into the remote region after every entry landed, in order (writes only;
    /// empty for none; at most [`crate::MAX_TAIL_WORDS`]; a batch of words alone still needs
    /// one entry, which may be empty): a completion counter the peer polls costs no source
    /// bytes and, on xgmi, no copy of its own ([`Session::posts_tail_words`]; xgmi also
    /// needs each word's device address 8-aligned, so a remote region registered at an
    /// unaligned address takes none).
    pub words: &'a [TailWord],
    /// The transfer id (unique among this engine's unfinished transfers to that peer).
    pub id: TransferId,
}

impl Session {
    /// Whether [`Session::post_ordered_many`] takes this session's batches: its backend
    /// prepared a route, keeps a batch's order and posts ordered batches over routes (xgmi).
    /// Otherwise use `IoEngine::post_ordered`.
    pub fn posts_ordered(&self) -> bool {
        self.route.is_some() && self.backend.orders_segments() && self.backend.posts_ordered_routes()
    }

    /// Whether this session's ordered batches may carry [`SessionBatch::words`]: it posts
    /// ordered batches and its backend stores tail words (xgmi: after the copies, in the same
    /// stream memory-operation batch as the completion flag).
    pub fn posts_tail_words(&self) -> bool {
        self.posts_ordered() && self.backend.posts_tail_words()
    }

    /// One ordered batch ([`Session::post_ordered_many`] with one batch, with its errors).
    pub fn post_ordered(&self, op: Op, local_offs: &[u64], remote_offs: &[u64], sizes: &[u64], id: TransferId) -> TransferStatus {
        let b = SessionBatch { session: self, local_offs, remote_offs, sizes, words: &[], id };
        Self::post_ordered_many(op, &[b])
            .pop()
            .unwrap_or_else(|| TransferStatus::failed(IoError::bad_state("Session::post_ordered: its one batch got no status")))
    }

    /// Posts ordered batches in direction `op`, each over its own session (of any engine),
    /// made together: one status per batch, in order. Batches whose sessions share a backend
    /// go to it in one call, which may queue them with fewer device calls (xgmi: up to 8
    /// segments of several batches in one kernel launch). Each batch is checked on its own,
    /// before anything of it is queued; errors, through its status:
    /// - `BadState` once the session's engine was dropped, `RemoteDisconnect` once its peer was
    ///   deregistered or replaced there;
    /// - `InvalidArgs` for arrays of different lengths, an empty batch, an entry outside
    ///   either region (naming the entry, the side and the range), more than
    ///   `MAX_TAIL_WORDS` tail words, a tail word not 8-aligned (by offset or, on xgmi, by
    ///   address) or outside the remote region (naming the word), tail words on a read, or an
    ///   id still in flight to that peer;
    /// - `NotSupported` when the session's backend does not post ordered batches over a route
    ///   ([`Session::posts_ordered`] is false), or for tail words where
    ///   [`Session::posts_tail_words`] is false;
    /// - `NotFound` once the session's local region was deregistered, or the remote region's
    ///   owner deregistered it (and said so);
    /// - `GpuOp` for a device failure: it fails every batch that shares the failed launch and,
    ///   on xgmi, the batches after it in the same backend call and on the same device, which
    ///   are then not queued (batches with tail words go first, in submissions of their own:
    ///   a failed one fails the batches it carries).
    pub fn post_ordered_many(op: Op, batches: &[SessionBatch<'_>]) -> Vec<TransferStatus> {
        let mut out = Vec::with_capacity(batches.len());
        let mut groups: Vec<(Arc<dyn Backend>, Vec<RoutedBatch>)> = Vec::new();
        for b in batches {
            let st = match b.session.routed(op, b) {
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
    fn routed(&self, op: Op, b: &SessionBatch<'_>) -> Result<RoutedBatch, TransferStatus> {
        if let Some(gone) = self.engine_gone() {
            return Err(gone);
        }
        let route = match &self.route {
            Some(r) if self.posts_ordered() => r.clone(),
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
        let (local, remote) = ((self.local.id, self.local.len), (self.remote.id, self.remote.len));
        let segs = check_ordered_batch(local, remote, b.local_offs, b.remote_offs, b.sizes).map_err(TransferStatus::failed)?;
        if !b.words.is_empty() {
            self.check_words(op, b.words).map_err(TransferStatus::failed)?;
        }
        let slot = self.engine.inflight.reserve(self.peer.epoch, &self.peer.key, b.id).map_err(TransferStatus::failed)?;
        let status = TransferStatus::new(1);
        self.engine.inflight.fill(slot, &status);
        Ok(RoutedBatch { route, id: b.id, segs, words: b.words.to_vec(), status })
    }

    /// Tail words' checks: a write, over a backend that stores them, each inside the remote
    /// region.
    fn check_words(&self, op: Op, words: &[TailWord]) -> mori_io_core::IoResult<()> {
        if !self.backend.posts_tail_words() {
            return Err(IoError::not_supported(format!(
                "an ordered batch with tail words over the session of memory {} -> memory {}: its {} backend does not store them",
                self.local.id,
                self.remote.id,
                self.backend.kind()
            )));
        }
        if op != Op::Write {
            return Err(IoError::invalid(format!("an ordered {op:?} with {} tail words: tail words go with writes only", words.len())));
        }
        check_tail_words((self.remote.id, self.remote.len), words)
    }
}
