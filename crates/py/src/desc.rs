//! `EngineDesc`, `MemoryDesc` and the enums of MORI's `mori.io` (`BackendType`,
//! `MemoryLocationType`, `PollCqMode`) with upstream's values.

use crate::errors::IntoPy;
use mori_io::{BackendKind, EngineDesc as RsEngineDesc, MemLoc, MemoryDesc as RsMemoryDesc};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Which transport: upstream's values (`XGMI=1`, `RDMA=2`, `TCP=3`, `FABRIC=4`).
#[pyclass(eq, eq_int, module = "mori_rs.io", from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum BackendType {
    Unknown = 0,
    XGMI = 1,
    RDMA = 2,
    TCP = 3,
    FABRIC = 4,
}

impl From<BackendKind> for BackendType {
    fn from(k: BackendKind) -> Self {
        match k {
            BackendKind::Xgmi => BackendType::XGMI,
            BackendKind::Rdma => BackendType::RDMA,
            BackendKind::Tcp => BackendType::TCP,
            BackendKind::Fabric => BackendType::FABRIC,
        }
    }
}

/// Where memory lives: upstream's values (`CPU=1`, `GPU=2`).
#[pyclass(eq, eq_int, module = "mori_rs.io", from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum MemoryLocationType {
    Unknown = 0,
    CPU = 1,
    GPU = 2,
}

/// How the rdma backend waits for completions: `POLLING=0` (spin, then sleep when idle) or
/// `EVENT=1` (sleep on the completion channel).
#[pyclass(eq, eq_int, module = "mori_rs.io", from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum PollCqMode {
    POLLING = 0,
    EVENT = 1,
}

/// An engine's descriptor: give `pack()` to the peers that may read and write this engine's
/// registered memory (it carries the engine's secret); they `unpack` it and
/// `register_remote_engine` it. Fields as MORI's: `key, node_id, hostname, host, port, pid`.
#[pyclass(frozen, eq, module = "mori_rs.io", name = "EngineDesc")]
#[derive(Clone, PartialEq)]
pub struct PyEngineDesc {
    pub(crate) d: RsEngineDesc,
}

#[pymethods]
impl PyEngineDesc {
    #[getter]
    fn key(&self) -> &str {
        &self.d.key
    }
    #[getter]
    fn node_id(&self) -> &str {
        &self.d.node_id
    }
    #[getter]
    fn hostname(&self) -> &str {
        &self.d.hostname
    }
    #[getter]
    fn host(&self) -> &str {
        &self.d.host
    }
    #[getter]
    fn port(&self) -> u16 {
        self.d.port
    }
    #[getter]
    fn pid(&self) -> u32 {
        self.d.pid
    }

    /// The descriptor as bytes (versioned; `EngineDesc.unpack` reads it).
    fn pack<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.d.pack())
    }

    /// Reads a packed descriptor. Errors: `InvalidArgument` for bytes that are not one (or of
    /// another descriptor version), naming what is wrong.
    #[staticmethod]
    fn unpack(data: &[u8]) -> PyResult<Self> {
        Ok(PyEngineDesc { d: RsEngineDesc::unpack(data).py()? })
    }

    fn __repr__(&self) -> String {
        format!("EngineDesc(key={:?}, host={:?}, port={}, pid={})", self.d.key, self.d.host, self.d.port, self.d.pid)
    }
}

/// A registered region as peers address it. Fields as MORI's: `engine_key, id, device_id`
/// (-1 for host memory), `device_bus_id`, `data` (address), `size` (bytes), `loc`.
#[pyclass(frozen, eq, module = "mori_rs.io", name = "MemoryDesc")]
#[derive(Clone, PartialEq)]
pub struct PyMemoryDesc {
    pub(crate) d: RsMemoryDesc,
}

#[pymethods]
impl PyMemoryDesc {
    #[getter]
    fn engine_key(&self) -> &str {
        &self.d.engine_key
    }
    #[getter]
    fn id(&self) -> u64 {
        self.d.id
    }
    #[getter]
    fn device_id(&self) -> i64 {
        self.d.loc.gpu().map_or(-1, i64::from)
    }
    #[getter]
    fn device_bus_id(&self) -> String {
        self.d.bus_id.clone().unwrap_or_default()
    }
    #[getter]
    fn data(&self) -> u64 {
        self.d.addr
    }
    #[getter]
    fn size(&self) -> u64 {
        self.d.len
    }
    #[getter]
    fn loc(&self) -> MemoryLocationType {
        match self.d.loc {
            MemLoc::Host { .. } => MemoryLocationType::CPU,
            MemLoc::Gpu { .. } => MemoryLocationType::GPU,
        }
    }
    #[getter]
    fn numa_node(&self) -> i64 {
        match self.d.loc {
            MemLoc::Host { numa: Some(n) } => i64::from(n),
            _ => -1,
        }
    }

    /// The descriptor as bytes (`MemoryDesc.unpack` reads it).
    fn pack<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.d.pack())
    }

    /// Reads a packed descriptor. Errors: `InvalidArgument` for bytes that are not one.
    #[staticmethod]
    fn unpack(data: &[u8]) -> PyResult<Self> {
        Ok(PyMemoryDesc { d: RsMemoryDesc::unpack(data).py()? })
    }

    fn __repr__(&self) -> String {
        format!(
            "MemoryDesc(engine_key={:?}, id={}, data={:#x}, size={}, loc={:?})",
            self.d.engine_key,
            self.d.id,
            self.d.addr,
            self.d.len,
            self.loc()
        )
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BackendType>()?;
    m.add_class::<MemoryLocationType>()?;
    m.add_class::<PollCqMode>()?;
    m.add_class::<PyEngineDesc>()?;
    m.add_class::<PyMemoryDesc>()?;
    Ok(())
}
