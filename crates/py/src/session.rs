//! `IOEngineSession`: MORI's session class over [`mori_io::Session`].

use crate::desc::BackendType;
use crate::engine::Shared;
use crate::engine::{notif_bytes, OneArgs, DETACH_ABOVE};
use crate::errors::u64_arg;
use crate::offsets::u64s;
use crate::status::PyStatus;
use mori_io::{Op, Session};
use pyo3::prelude::*;
use std::sync::Arc;

/// Transfers between one local and one remote region over a backend chosen once
/// (`IOEngine.create_session`). Offsets and sizes: lists of ints or 1-D numpy int64/uint64
/// arrays; every call returns a `TransferStatus`. A session keeps its engine alive.
#[pyclass(frozen, module = "mori_rs.io", name = "IOEngineSession")]
pub struct PySession {
    eng: Arc<Shared>,
    sess: Session,
}

impl PySession {
    pub(crate) fn new(eng: Arc<Shared>, sess: Session) -> Self {
        PySession { eng, sess }
    }

    #[allow(clippy::too_many_arguments)]
    fn batch(
        &self,
        py: Python<'_>,
        op: Op,
        local_offsets: &Bound<'_, PyAny>,
        remote_offsets: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        transfer_uid: u64,
        notif_msg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStatus> {
        let n = notif_bytes(notif_msg)?;
        let (lo, ro, sz) = (u64s(local_offsets, "local_offsets")?, u64s(remote_offsets, "remote_offsets")?, u64s(sizes, "sizes")?);
        let (lo, ro, sz) = (lo.as_slice(), ro.as_slice(), sz.as_slice());
        let post = || self.sess.post(op, lo, ro, sz, transfer_uid, n.as_deref());
        Ok(PyStatus::new(if sz.len() > DETACH_ABOVE { py.detach(post) } else { post() }))
    }
}

#[pymethods]
impl PySession {
    /// A fresh transfer id (of the session's engine).
    fn allocate_transfer_uid(&self) -> u64 {
        self.eng.allocate_transfer_uid()
    }

    /// Whether calls can still succeed (false once the peer was deregistered or replaced).
    fn alive(&self) -> bool {
        self.sess.alive()
    }

    /// The backend serving this session.
    fn backend(&self) -> BackendType {
        self.sess.backend().into()
    }

    /// Reads `size` bytes at `remote_offset` into `local_offset`.
    #[pyo3(signature = (local_offset, remote_offset, size, transfer_uid, notif_msg = None))]
    fn read(
        &self,
        local_offset: &Bound<'_, PyAny>,
        remote_offset: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        transfer_uid: &Bound<'_, PyAny>,
        notif_msg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStatus> {
        let a = OneArgs::parse(local_offset, remote_offset, size, transfer_uid, notif_msg)?;
        Ok(PyStatus::new(match a.notif {
            None => self.sess.read(a.lo, a.ro, a.size, a.uid),
            Some(m) => self.sess.post(Op::Read, &[a.lo], &[a.ro], &[a.size], a.uid, Some(&m)),
        }))
    }

    /// Writes `size` bytes at `local_offset` to `remote_offset`.
    #[pyo3(signature = (local_offset, remote_offset, size, transfer_uid, notif_msg = None))]
    fn write(
        &self,
        local_offset: &Bound<'_, PyAny>,
        remote_offset: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        transfer_uid: &Bound<'_, PyAny>,
        notif_msg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStatus> {
        let a = OneArgs::parse(local_offset, remote_offset, size, transfer_uid, notif_msg)?;
        Ok(PyStatus::new(match a.notif {
            None => self.sess.write(a.lo, a.ro, a.size, a.uid),
            Some(m) => self.sess.post(Op::Write, &[a.lo], &[a.ro], &[a.size], a.uid, Some(&m)),
        }))
    }

    /// Batch read: entry `i` moves `sizes[i]` bytes from `remote_offsets[i]` to `local_offsets[i]`.
    #[pyo3(signature = (local_offsets, remote_offsets, sizes, transfer_uid, notif_msg = None))]
    fn batch_read(
        &self,
        py: Python<'_>,
        local_offsets: &Bound<'_, PyAny>,
        remote_offsets: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        transfer_uid: &Bound<'_, PyAny>,
        notif_msg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStatus> {
        let transfer_uid = u64_arg(transfer_uid, "transfer_uid")?;
        self.batch(py, Op::Read, local_offsets, remote_offsets, sizes, transfer_uid, notif_msg)
    }

    /// Batch write: entry `i` moves `sizes[i]` bytes from `local_offsets[i]` to `remote_offsets[i]`.
    #[pyo3(signature = (local_offsets, remote_offsets, sizes, transfer_uid, notif_msg = None))]
    fn batch_write(
        &self,
        py: Python<'_>,
        local_offsets: &Bound<'_, PyAny>,
        remote_offsets: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        transfer_uid: &Bound<'_, PyAny>,
        notif_msg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStatus> {
        let transfer_uid = u64_arg(transfer_uid, "transfer_uid")?;
        self.batch(py, Op::Write, local_offsets, remote_offsets, sizes, transfer_uid, notif_msg)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySession>()?;
    Ok(())
}
