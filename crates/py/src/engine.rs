//! `IOEngine`: MORI's engine class over [`mori_io::IoEngine`].

use crate::config::{backend_config, PyEngineConfig};
use crate::desc::{BackendType, MemoryLocationType, PyEngineDesc, PyMemoryDesc};
use crate::errors::{to_py, u64_arg, IntoPy};
use crate::offsets::{type_name, u64s};
use crate::session::PySession;
use crate::status::{timeout_of, PyStatus, StatusCode};
use mori_io::{EngineConfig, IoEngine, MemLoc, MemoryDesc, Op, RegionBatch, TransferStatus};
use mori_io_core::status::Completion;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};
use std::collections::HashMap;
use std::sync::Arc;

/// Batches with more entries than this are posted with the GIL released (planning a large
/// batch takes a while); smaller ones keep it (releasing costs more than the post).
pub(crate) const DETACH_ABOVE: usize = 256;

/// A notification message argument: `bytes` or `str` (UTF-8). Errors: `InvalidArgument`.
pub(crate) fn notif_bytes(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<u8>>> {
    let Some(o) = obj else { return Ok(None) };
    if o.is_none() {
        return Ok(None);
    }
    if let Ok(b) = o.cast::<PyBytes>() {
        return Ok(Some(b.as_bytes().to_vec()));
    }
    if let Ok(s) = o.cast::<PyString>() {
        return Ok(Some(s.to_str()?.as_bytes().to_vec()));
    }
    Err(crate::errors::invalid(format!("notif_msg must be bytes or str, got {}", type_name(o))))
}

/// The arguments of a one-entry `read`/`write` (engine and session), checked.
pub(crate) struct OneArgs {
    pub(crate) lo: u64,
    pub(crate) ro: u64,
    pub(crate) size: u64,
    pub(crate) uid: u64,
    pub(crate) notif: Option<Vec<u8>>,
}

impl OneArgs {
    /// Errors: `InvalidArgument` naming an int outside 0..2^64 or a bad `notif_msg`.
    pub(crate) fn parse(
        lo: &Bound<'_, PyAny>,
        ro: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        uid: &Bound<'_, PyAny>,
        notif: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(OneArgs {
            lo: u64_arg(lo, "local_offset")?,
            ro: u64_arg(ro, "remote_offset")?,
            size: u64_arg(size, "size")?,
            uid: u64_arg(uid, "transfer_uid")?,
            notif: notif_bytes(notif)?,
        })
    }
}

/// A `MemoryDesc` argument named `what`. Errors: `InvalidArgument` naming the type given.
pub(crate) fn mem<'a, 'py>(obj: &'a Bound<'py, PyAny>, what: &str) -> PyResult<&'a Bound<'py, PyMemoryDesc>> {
    obj.cast::<PyMemoryDesc>().map_err(|_| crate::errors::invalid(format!("{what}: expected a MemoryDesc, got {}", type_name(obj))))
}

/// The engine and what it registered, shared by the `IOEngine` object and its sessions.
///
/// Dropped with the last of them: first every region still registered is deregistered
/// (which waits for the transfers using it, inbound ones included), then the tensors kept for
/// `register_torch_tensor` are released, then the engine stops. So neither `del engine` nor a
/// garbage-collected session lets a peer's transfer land in memory Python already freed.
pub(crate) struct Shared {
    pub(crate) eng: IoEngine,
    /// Regions registered and not yet deregistered, with the tensor kept alive for each.
    regions: Mutex<HashMap<u64, Registered>>,
}

/// A registered region and the tensor kept alive for it (`register_torch_tensor`).
type Registered = (MemoryDesc, Option<Py<PyAny>>);

impl std::ops::Deref for Shared {
    type Target = IoEngine;
    fn deref(&self) -> &IoEngine {
        &self.eng
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let regions: Vec<Registered> = self.regions.get_mut().drain().map(|(_, v)| v).collect();
        for (d, tensor) in regions {
            // A region still in use after the drain deadline is waited for again (every
            // transfer ends by its own deadlines), so its memory is never released in use.
            for _ in 0..30 {
                match self.eng.deregister_memory(&d) {
                    Err(e) if e.code == mori_io::ErrorCode::Timeout => continue,
                    _ => break,
                }
            }
            drop(tensor);
        }
    }
}

/// MORI's `IOEngine(key, config)`: a transfer engine listening at `config.host:config.port`.
/// Safe to use from several Python threads at once; blocking calls release the GIL. Not
/// usable in a child made by `os.fork()` (its threads are not there): use the `spawn` start
/// method of multiprocessing, as CUDA programs must anyway.
#[pyclass(frozen, module = "mori_rs.io", name = "IOEngine")]
pub struct PyEngine {
    pub(crate) eng: Arc<Shared>,
}

impl PyEngine {
    /// Posts one batch (single pair), GIL released for large ones.
    #[allow(clippy::too_many_arguments)]
    fn post(
        &self,
        py: Python<'_>,
        op: Op,
        local: &MemoryDesc,
        lo: &[u64],
        remote: &MemoryDesc,
        ro: &[u64],
        sz: &[u64],
        id: u64,
        notif: Option<&[u8]>,
    ) -> TransferStatus {
        let b = RegionBatch { local, local_offs: lo, remote, remote_offs: ro, sizes: sz, id };
        if sz.len() > DETACH_ABOVE {
            py.detach(|| self.eng.post(op, &b, notif))
        } else {
            self.eng.post(op, &b, notif)
        }
    }

    /// `batch_read` / `batch_write` in either form.
    #[allow(clippy::too_many_arguments)]
    fn batch<'py>(
        &self,
        py: Python<'py>,
        op: Op,
        local: &Bound<'py, PyAny>,
        local_offsets: &Bound<'py, PyAny>,
        remote: &Bound<'py, PyAny>,
        remote_offsets: &Bound<'py, PyAny>,
        sizes: &Bound<'py, PyAny>,
        transfer_uid: &Bound<'py, PyAny>,
        notif_msg: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let notif = notif_bytes(notif_msg)?;
        if let Ok(l) = local.cast::<PyMemoryDesc>() {
            // Single pair: flat offsets, one uid, one status.
            let r = mem(remote, "remote")?;
            let (lo, ro, sz) = (u64s(local_offsets, "local_offsets")?, u64s(remote_offsets, "remote_offsets")?, u64s(sizes, "sizes")?);
            let id = u64_arg(transfer_uid, "transfer_uid")?;
            let st = self.post(py, op, &l.get().d, lo.as_slice(), &r.get().d, ro.as_slice(), sz.as_slice(), id, notif.as_deref());
            return Ok(Bound::new(py, PyStatus::new(st))?.into_any());
        }
        // Multi-pair (MORI's engine-level form): lists of descriptors, lists of offset lists,
        // one uid per pair; one status per pair.
        let seq = |o: &Bound<'py, PyAny>, what: &str| -> PyResult<Vec<Bound<'py, PyAny>>> {
            o.try_iter()
                .and_then(|it| it.collect::<PyResult<Vec<_>>>())
                .map_err(|_| crate::errors::invalid(format!("{what}: expected a MemoryDesc (one pair) or a list (one entry per pair)")))
        };
        let (ls, los, rs, ros, szs) = (
            seq(local, "local")?,
            seq(local_offsets, "local_offsets")?,
            seq(remote, "remote")?,
            seq(remote_offsets, "remote_offsets")?,
            seq(sizes, "sizes")?,
        );
        let ids: Vec<u64> = seq(transfer_uid, "transfer_uid")?
            .iter()
            .enumerate()
            .map(|(i, u)| u64_arg(u, &format!("transfer_uid[{i}]")))
            .collect::<PyResult<_>>()?;
        let n = ls.len();
        for (what, len) in [
            ("local_offsets", los.len()),
            ("remote", rs.len()),
            ("remote_offsets", ros.len()),
            ("sizes", szs.len()),
            ("transfer_uid", ids.len()),
        ] {
            if len != n {
                return Err(crate::errors::invalid(format!("multi-pair batch: {what} has {len} entries, local has {n}: one per pair")));
            }
        }
        if notif.is_some() && n != 1 {
            return Err(crate::errors::invalid(format!(
                "notif_msg with a multi-pair batch of {n} pairs: a message follows one transfer; give it to one pair's call"
            )));
        }
        let mut parts = Vec::with_capacity(n);
        for i in 0..n {
            parts.push((
                mem(&ls[i], &format!("local[{i}]"))?,
                u64s(&los[i], &format!("local_offsets[{i}]"))?,
                mem(&rs[i], &format!("remote[{i}]"))?,
                u64s(&ros[i], &format!("remote_offsets[{i}]"))?,
                u64s(&szs[i], &format!("sizes[{i}]"))?,
            ));
        }
        let batches: Vec<RegionBatch<'_>> = parts
            .iter()
            .zip(&ids)
            .map(|((l, lo, r, ro, sz), &id)| RegionBatch {
                local: &l.get().d,
                local_offs: lo.as_slice(),
                remote: &r.get().d,
                remote_offs: ro.as_slice(),
                sizes: sz.as_slice(),
                id,
            })
            .collect();
        let total: usize = batches.iter().map(|b| b.sizes.len()).sum();
        let sts = if let Some(m) = notif.as_deref() {
            vec![self.eng.post(op, &batches[0], Some(m))]
        } else if total > DETACH_ABOVE {
            py.detach(|| self.eng.post_multi(op, &batches))
        } else {
            self.eng.post_multi(op, &batches)
        };
        let out = PyList::empty(py);
        for st in sts {
            out.append(Bound::new(py, PyStatus::new(st))?)?;
        }
        Ok(out.into_any())
    }
}

#[pymethods]
impl PyEngine {
    /// Starts an engine named `key` (unique among the engines that talk to each other).
    /// Errors: `InvalidArgument` for an empty key or an unusable host; `BadState` when the
    /// port is taken.
    #[new]
    fn new(py: Python<'_>, key: &str, config: PyRef<'_, PyEngineConfig>) -> PyResult<Self> {
        let host = if config.host.is_empty() { "127.0.0.1".to_string() } else { config.host.clone() };
        let port = config.port;
        let key = key.to_string();
        let eng = py.detach(move || EngineConfig::new(host, port).and_then(|c| IoEngine::new(&key, c))).py()?;
        Ok(PyEngine { eng: Arc::new(Shared { eng, regions: Mutex::new(HashMap::new()) }) })
    }

    /// This engine's key.
    #[getter]
    fn key(&self) -> String {
        self.eng.desc().key.clone()
    }

    /// This engine's descriptor (pack it for peers).
    fn get_engine_desc(&self) -> PyEngineDesc {
        PyEngineDesc { d: self.eng.desc().clone() }
    }

    /// Creates a backend (`BackendType.TCP`, `RDMA`, `XGMI` or `FABRIC`) with its config or
    /// the defaults. Errors: `InvalidArgument` (wrong config class, bad value, backend created
    /// twice); `NotSupported` naming what this host lacks (no RDMA device, no GPU runtime).
    #[pyo3(signature = (backend_type, config = None))]
    fn create_backend(&self, py: Python<'_>, backend_type: BackendType, config: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let c = backend_config(backend_type, config)?;
        let eng = self.eng.clone();
        py.detach(move || eng.create_backend(c)).py()
    }

    /// Makes a peer known from its (unpacked) descriptor.
    fn register_remote_engine(&self, desc: PyRef<'_, PyEngineDesc>) -> PyResult<()> {
        self.eng.register_remote_engine(desc.d.clone()).py()
    }

    /// Forgets a peer (given by its descriptor or its key); its sessions fail from now on.
    fn deregister_remote_engine(&self, py: Python<'_>, desc: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = match desc.cast::<PyEngineDesc>() {
            Ok(d) => d.get().d.key.clone(),
            Err(_) => {
                desc.extract::<String>().map_err(|_| crate::errors::invalid("deregister_remote_engine: expected an EngineDesc or a key"))?
            }
        };
        let eng = self.eng.clone();
        py.detach(move || eng.deregister_remote_engine(&key));
        Ok(())
    }

    /// Registers `size` bytes at address `ptr` (host memory for `MemoryLocationType.CPU`, GPU
    /// `device_id`'s memory for `GPU`). The memory must stay valid until `deregister_memory`
    /// returns. Errors: `InvalidArgument` (null pointer, zero size, negative GPU id);
    /// `NotSupported` for GPU memory without a GPU backend.
    fn register_memory(&self, py: Python<'_>, ptr: u64, size: u64, device_id: i64, mem_loc: MemoryLocationType) -> PyResult<PyMemoryDesc> {
        let loc = match mem_loc {
            MemoryLocationType::CPU => MemLoc::Host { numa: None },
            MemoryLocationType::GPU => MemLoc::Gpu {
                device: u32::try_from(device_id)
                    .map_err(|_| crate::errors::invalid(format!("register_memory: device_id {device_id} is not a GPU ordinal")))?,
            },
            MemoryLocationType::Unknown => return Err(crate::errors::invalid("register_memory: MemoryLocationType.Unknown")),
        };
        let len = usize::try_from(size).map_err(|_| crate::errors::invalid(format!("register_memory: size {size} is too large")))?;
        if len == 0 {
            return Err(crate::errors::invalid("register_memory: size is 0"));
        }
        let eng = self.eng.clone();
        // SAFETY: the caller promises (documented) that `ptr..ptr+size` is memory of that kind,
        // valid until deregistration; the engine checks every access against this range.
        let d = py.detach(move || unsafe { eng.register_memory(ptr as usize as *mut u8, len, loc) }).py()?;
        self.eng.regions.lock().insert(d.id, (d.clone(), None));
        Ok(PyMemoryDesc { d })
    }

    /// Registers a tensor's storage (any object with `data_ptr()`, `numel()`,
    /// `element_size()`, `device` and `is_contiguous()`, as torch tensors; torch is not
    /// imported). The tensor is kept alive until `deregister_memory`. Errors:
    /// `InvalidArgument` for a non-contiguous or empty tensor or an unknown device type.
    fn register_torch_tensor(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<PyMemoryDesc> {
        let bad = |what: &str| crate::errors::invalid(format!("register_torch_tensor: {what} ({})", type_name(tensor)));
        if tensor.hasattr("is_contiguous")? && !tensor.call_method0("is_contiguous")?.extract::<bool>()? {
            return Err(bad("the tensor is not contiguous; register tensor.contiguous() or its base"));
        }
        let ptr: u64 = tensor.call_method0("data_ptr").and_then(|v| v.extract()).map_err(|_| bad("no data_ptr()"))?;
        let numel: u64 = tensor.call_method0("numel").and_then(|v| v.extract()).map_err(|_| bad("no numel()"))?;
        let es: u64 = tensor.call_method0("element_size").and_then(|v| v.extract()).map_err(|_| bad("no element_size()"))?;
        let dev = tensor.getattr("device").map_err(|_| bad("no device"))?;
        let kind: String = dev.getattr("type").and_then(|v| v.extract()).map_err(|_| bad("device has no type"))?;
        let (loc, id) = match kind.as_str() {
            "cpu" => (MemoryLocationType::CPU, -1),
            "cuda" | "hip" => {
                let idx: Option<i64> = dev.getattr("index").and_then(|v| v.extract()).map_err(|_| bad("device has no index"))?;
                (MemoryLocationType::GPU, idx.unwrap_or(0))
            }
            other => return Err(bad(&format!("device type {other:?} is neither cpu nor cuda"))),
        };
        let size = numel.checked_mul(es).ok_or_else(|| bad("numel() * element_size() overflows"))?;
        if size == 0 {
            return Err(bad("the tensor is empty"));
        }
        let d = self.register_memory(py, ptr, size, id, loc)?;
        if let Some(r) = self.eng.regions.lock().get_mut(&d.d.id) {
            r.1 = Some(tensor.clone().unbind());
        }
        Ok(d)
    }

    /// Deregisters memory, waiting (GIL released) for transfers using it. Errors: `NotFound`
    /// for memory not registered here; `Timeout` when transfers still use it after the drain
    /// deadline (call again).
    fn deregister_memory(&self, py: Python<'_>, desc: PyRef<'_, PyMemoryDesc>) -> PyResult<()> {
        let d = desc.d.clone();
        let eng = self.eng.clone();
        py.detach(move || eng.deregister_memory(&d)).py()?;
        // Dropped with the GIL held (the lock is not held meanwhile).
        let t = self.eng.regions.lock().remove(&desc.d.id);
        drop(t);
        Ok(())
    }

    /// A fresh transfer id.
    fn allocate_transfer_uid(&self) -> u64 {
        self.eng.allocate_transfer_uid()
    }

    /// Reads `size` bytes at `remote_offset` of `remote` into `local` at `local_offset`;
    /// with `notif_msg`, the peer receives it once this engine has the data.
    #[pyo3(signature = (local, local_offset, remote, remote_offset, size, transfer_uid, notif_msg = None))]
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        py: Python<'_>,
        local: PyRef<'_, PyMemoryDesc>,
        local_offset: &Bound<'_, PyAny>,
        remote: PyRef<'_, PyMemoryDesc>,
        remote_offset: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        transfer_uid: &Bound<'_, PyAny>,
        notif_msg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStatus> {
        let a = OneArgs::parse(local_offset, remote_offset, size, transfer_uid, notif_msg)?;
        Ok(PyStatus::new(self.post(py, Op::Read, &local.d, &[a.lo], &remote.d, &[a.ro], &[a.size], a.uid, a.notif.as_deref())))
    }

    /// Writes `size` bytes at `local_offset` of `local` to `remote` at `remote_offset`; with
    /// `notif_msg`, the peer receives it once the data is there.
    #[pyo3(signature = (local, local_offset, remote, remote_offset, size, transfer_uid, notif_msg = None))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        local: PyRef<'_, PyMemoryDesc>,
        local_offset: &Bound<'_, PyAny>,
        remote: PyRef<'_, PyMemoryDesc>,
        remote_offset: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        transfer_uid: &Bound<'_, PyAny>,
        notif_msg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStatus> {
        let a = OneArgs::parse(local_offset, remote_offset, size, transfer_uid, notif_msg)?;
        Ok(PyStatus::new(self.post(py, Op::Write, &local.d, &[a.lo], &remote.d, &[a.ro], &[a.size], a.uid, a.notif.as_deref())))
    }

    /// Batch read. One pair: `(local, [offs], remote, [offs], [sizes], uid)` -> one status.
    /// MORI's multi-pair form: `([local...], [[offs]...], [remote...], [[offs]...],
    /// [[sizes]...], [uid...])` -> one status per pair. Offsets and sizes are lists of ints or
    /// 1-D numpy int64/uint64 arrays (read in place).
    #[pyo3(signature = (local, local_offsets, remote, remote_offsets, sizes, transfer_uid, notif_msg = None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_read<'py>(
        &self,
        py: Python<'py>,
        local: &Bound<'py, PyAny>,
        local_offsets: &Bound<'py, PyAny>,
        remote: &Bound<'py, PyAny>,
        remote_offsets: &Bound<'py, PyAny>,
        sizes: &Bound<'py, PyAny>,
        transfer_uid: &Bound<'py, PyAny>,
        notif_msg: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.batch(py, Op::Read, local, local_offsets, remote, remote_offsets, sizes, transfer_uid, notif_msg)
    }

    /// Batch write; the forms of `batch_read`.
    #[pyo3(signature = (local, local_offsets, remote, remote_offsets, sizes, transfer_uid, notif_msg = None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_write<'py>(
        &self,
        py: Python<'py>,
        local: &Bound<'py, PyAny>,
        local_offsets: &Bound<'py, PyAny>,
        remote: &Bound<'py, PyAny>,
        remote_offsets: &Bound<'py, PyAny>,
        sizes: &Bound<'py, PyAny>,
        transfer_uid: &Bound<'py, PyAny>,
        notif_msg: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.batch(py, Op::Write, local, local_offsets, remote, remote_offsets, sizes, transfer_uid, notif_msg)
    }

    /// A session between a local and a remote region (backend chosen, remote region checked,
    /// connections open; GIL released). Errors: `NotFound` (peer or region unknown),
    /// `RemoteDisconnect` (stale descriptor), `NotSupported` (no backend serves the pair).
    fn create_session(&self, py: Python<'_>, local: PyRef<'_, PyMemoryDesc>, remote: PyRef<'_, PyMemoryDesc>) -> PyResult<PySession> {
        let (l, r) = (local.d.clone(), remote.d.clone());
        let eng = self.eng.clone();
        let s = py.detach(move || eng.create_session(&l, &r)).py()?;
        Ok(PySession::new(self.eng.clone(), s))
    }

    /// Which backend serves this pair (`BackendType`).
    fn backend_for(&self, local: PyRef<'_, PyMemoryDesc>, remote: PyRef<'_, PyMemoryDesc>) -> PyResult<BackendType> {
        Ok(self.eng.backend_for(&local.d, &remote.d).py()?.into())
    }

    /// The final status of transfer `transfer_uid` from engine `remote_key` once all its
    /// data landed here; `None` while unknown or incomplete. Each is returned once.
    fn pop_inbound_transfer_status(&self, remote_key: &str, transfer_uid: u64) -> Option<PyStatus> {
        self.eng.pop_inbound_status(remote_key, transfer_uid).map(|r| {
            PyStatus::new(match r {
                Ok(()) => TransferStatus::new(0),
                Err(e) => TransferStatus::failed(e),
            })
        })
    }

    /// `wait_all(statuses, timeout_ms)` (see the module function).
    #[pyo3(signature = (statuses, timeout_ms = -1))]
    fn wait_all(&self, py: Python<'_>, statuses: Vec<PyRef<'_, PyStatus>>, timeout_ms: i64) -> PyResult<StatusCode> {
        crate::status::wait_all(py, statuses, timeout_ms)
    }

    /// Every notification received since the last call: `{sender_key: [bytes, ...]}`, each
    /// sender's in arrival order. Never blocks.
    fn get_new_notifs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, msgs) in self.eng.get_new_notifs() {
            let l = PyList::empty(py);
            for m in msgs {
                l.append(PyBytes::new(py, &m))?;
            }
            d.set_item(k, l)?;
        }
        Ok(d)
    }

    /// The oldest unread notification as `(sender_key, bytes)`, waiting up to `timeout_ms`
    /// (GIL released). Errors: `Timeout` when none came.
    #[pyo3(signature = (timeout_ms = 1000))]
    fn wait_notif<'py>(&self, py: Python<'py>, timeout_ms: i64) -> PyResult<(String, Bound<'py, PyBytes>)> {
        let deadline = std::time::Instant::now().checked_add(timeout_of(timeout_ms));
        loop {
            let left = deadline.map_or(crate::status::SLICE, |d| d.saturating_duration_since(std::time::Instant::now()));
            let slice = left.min(crate::status::SLICE);
            let eng = self.eng.clone();
            match py.detach(move || eng.wait_notif(slice)) {
                Ok((k, m)) => return Ok((k, PyBytes::new(py, &m))),
                // Between slices, Python's signal handlers run (Ctrl-C raises here).
                Err(e) if e.code == mori_io::ErrorCode::Timeout && left > slice => py.check_signals()?,
                Err(e) if e.code == mori_io::ErrorCode::Timeout => {
                    return Err(crate::errors::err(mori_io::ErrorCode::Timeout, format!("no notification arrived within {timeout_ms} ms")));
                }
                Err(e) => return Err(to_py(e)),
            }
        }
    }

    /// Sends `notif_msg` alone to engine `remote_key`; the status ends once the peer queued it.
    fn send_notif(&self, remote_key: &str, notif_msg: &Bound<'_, PyAny>) -> PyResult<PyStatus> {
        let m = notif_bytes(Some(notif_msg))?.ok_or_else(|| crate::errors::invalid("send_notif: notif_msg is None; give bytes or str"))?;
        if remote_key.is_empty() {
            return Err(crate::errors::err(mori_io::ErrorCode::NotFound, "send_notif: empty engine key"));
        }
        Ok(PyStatus::new(self.eng.send_notif(remote_key, &m)))
    }

    fn __repr__(&self) -> String {
        let d = self.eng.desc();
        format!("IOEngine(key={:?}, host={:?}, port={})", d.key, d.host, d.port)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    Ok(())
}
