//! Paged batches ([`PagedBatch`]: block tables and layouts, see `mori_io_core::paged`) on the
//! engine and on sessions, and the one batch form both check before choosing how to post.

use crate::engine::IoEngine;
use crate::session::Session;
use mori_io_core::paged::check_paged;
use mori_io_core::plan::check_batch_mapped;
use mori_io_core::{EntryMap, IoResult, MemoryDesc, Op, PagedBatch, PagedPlan, Seg, TransferId, TransferStatus};
use std::sync::Arc;

/// A batch as a caller gives it: three offset arrays, or a paged batch.
#[derive(Clone, Copy)]
pub(crate) enum Batch<'a> {
    /// Local offsets, remote offsets, sizes (rules of `mori_io_core::plan::check_batch`).
    Ranges(&'a [u64], &'a [u64], &'a [u64]),
    /// Block tables and layouts (rules of `mori_io_core::paged::check_paged`).
    Paged(&'a PagedBatch<'a>),
}

/// A batch checked against both regions, before a backend is chosen.
pub(crate) enum Checked {
    Ranges(Vec<Seg>, EntryMap),
    Paged(Arc<PagedPlan>),
}

impl Batch<'_> {
    /// Checks the batch against `local` and `remote` ((id, registered length) each).
    pub(crate) fn check(&self, local: (u64, u64), remote: (u64, u64)) -> IoResult<Checked> {
        match *self {
            Batch::Ranges(lo, ro, sizes) => check_batch_mapped(local, remote, lo, ro, sizes).map(|(s, m)| Checked::Ranges(s, m)),
            Batch::Paged(b) => check_paged(local, remote, b).map(|p| Checked::Paged(Arc::new(p))),
        }
    }
}

impl Checked {
    /// What a request carries: segments and entry map, and the plan itself for a backend that
    /// takes paged batches (`takes_paged`; its segments are then left empty).
    pub(crate) fn for_backend(self, takes_paged: bool) -> (Vec<Seg>, EntryMap, Option<Arc<PagedPlan>>) {
        match self {
            Checked::Ranges(s, m) => (s, m, None),
            Checked::Paged(p) if takes_paged => (Vec::new(), p.entry_map(), Some(p)),
            Checked::Paged(p) => (p.expand(), p.entry_map(), None),
        }
    }
}

impl IoEngine {
    /// Paged read: every (layer, half, block table entry) of `batch` moves `block_size` bytes
    /// from its remote block to its local block. Bounds are checked once for the whole batch
    /// (the furthest block of each side), tables consecutive on both sides merge into runs,
    /// and the backend gets the plan itself where it can (xgmi, fabric: one kernel launch
    /// reading the runs) or its segments (rdma, tcp). Errors (through the returned status):
    /// see `mori_io_core::paged::check_paged` for the batch rules, else as
    /// [`IoEngine::batch_read`]; a failed entry is numbered `(layer * halves + half) *
    /// blocks + table entry`.
    pub fn batch_read_paged(&self, local: &MemoryDesc, remote: &MemoryDesc, batch: &PagedBatch<'_>, id: TransferId) -> TransferStatus {
        self.post_batch(Op::Read, local, remote, Batch::Paged(batch), id)
    }

    /// Paged write: local blocks to remote blocks; as [`IoEngine::batch_read_paged`].
    pub fn batch_write_paged(&self, local: &MemoryDesc, remote: &MemoryDesc, batch: &PagedBatch<'_>, id: TransferId) -> TransferStatus {
        self.post_batch(Op::Write, local, remote, Batch::Paged(batch), id)
    }
}

impl Session {
    /// Paged read over this session; see [`IoEngine::batch_read_paged`].
    pub fn batch_read_paged(&self, batch: &PagedBatch<'_>, id: TransferId) -> TransferStatus {
        self.post_batch(Op::Read, Batch::Paged(batch), id)
    }

    /// Paged write over this session; see [`IoEngine::batch_read_paged`].
    pub fn batch_write_paged(&self, batch: &PagedBatch<'_>, id: TransferId) -> TransferStatus {
        self.post_batch(Op::Write, Batch::Paged(batch), id)
    }
}
