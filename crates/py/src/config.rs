//! Configuration classes of MORI's `mori.io` (`IOEngineConfig`, `RdmaBackendConfig`,
//! `XgmiBackendConfig`, `FabricBackendConfig`) plus `TcpBackendConfig`, and their mapping onto
//! the Rust backends' settings (defaults and environment of each Rust config apply first).

use crate::desc::{BackendType, PollCqMode};
use crate::errors::IntoPy;
use mori_io::{BackendConfig, FabricConfig, PollMode, RdmaConfig, TcpConfig, XgmiConfig};
use pyo3::prelude::*;

/// `IOEngineConfig(host="", port=0)`: where the engine's control plane listens and what its
/// descriptor advertises. `host=""` means `127.0.0.1` (peers on this host only); port 0 picks
/// a free port (`get_engine_desc().port` tells which).
#[pyclass(module = "mori_rs.io", name = "IOEngineConfig", from_py_object)]
#[derive(Clone)]
pub struct PyEngineConfig {
    #[pyo3(get, set)]
    pub host: String,
    #[pyo3(get, set)]
    pub port: u16,
}

#[pymethods]
impl PyEngineConfig {
    #[new]
    #[pyo3(signature = (host = String::new(), port = 0))]
    fn new(host: String, port: u16) -> Self {
        PyEngineConfig { host, port }
    }

    fn __repr__(&self) -> String {
        format!("IOEngineConfig(host={:?}, port={})", self.host, self.port)
    }
}

/// MORI's `RdmaBackendConfig`, same argument order (the first five are often passed
/// positionally). Mapped: `qp_per_transfer` (QPs a transfer is striped over),
/// `num_worker_threads` (completion workers; -1 keeps the default), `poll_cq_mode`,
/// `enable_transfer_chunking`, `chunk_bytes`, `max_chunks_per_transfer`,
/// `num_nics_per_transfer`. Accepted with no effect: `post_batch_size` (WRs are posted in the
/// largest chains the send queue takes), `enable_notification` and `notif_per_qp` (inbound
/// statuses and notifications are always on).
#[pyclass(module = "mori_rs.io", name = "RdmaBackendConfig", from_py_object)]
#[derive(Clone)]
pub struct PyRdmaConfig {
    #[pyo3(get, set)]
    qp_per_transfer: i64,
    #[pyo3(get, set)]
    post_batch_size: i64,
    #[pyo3(get, set)]
    num_worker_threads: i64,
    #[pyo3(get, set)]
    poll_cq_mode: PollCqMode,
    #[pyo3(get, set)]
    enable_notification: bool,
    #[pyo3(get, set)]
    notif_per_qp: i64,
    #[pyo3(get, set)]
    enable_transfer_chunking: bool,
    #[pyo3(get, set)]
    chunk_bytes: i64,
    #[pyo3(get, set)]
    max_chunks_per_transfer: i64,
    #[pyo3(get, set)]
    num_nics_per_transfer: i64,
}

#[pymethods]
impl PyRdmaConfig {
    #[new]
    #[pyo3(signature = (qp_per_transfer = 1, post_batch_size = -1, num_worker_threads = -1, poll_cq_mode = PollCqMode::POLLING,
        enable_notification = true, notif_per_qp = 1024, enable_transfer_chunking = false, chunk_bytes = 65536,
        max_chunks_per_transfer = 64, num_nics_per_transfer = 1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        qp_per_transfer: i64,
        post_batch_size: i64,
        num_worker_threads: i64,
        poll_cq_mode: PollCqMode,
        enable_notification: bool,
        notif_per_qp: i64,
        enable_transfer_chunking: bool,
        chunk_bytes: i64,
        max_chunks_per_transfer: i64,
        num_nics_per_transfer: i64,
    ) -> Self {
        PyRdmaConfig {
            qp_per_transfer,
            post_batch_size,
            num_worker_threads,
            poll_cq_mode,
            enable_notification,
            notif_per_qp,
            enable_transfer_chunking,
            chunk_bytes,
            max_chunks_per_transfer,
            num_nics_per_transfer,
        }
    }
}

/// MORI's `XgmiBackendConfig(num_streams=64, num_events=64)`: streams per GPU and most
/// transfers in flight per GPU.
#[pyclass(module = "mori_rs.io", name = "XgmiBackendConfig", from_py_object)]
#[derive(Clone)]
pub struct PyXgmiConfig {
    #[pyo3(get, set)]
    num_streams: usize,
    #[pyo3(get, set)]
    num_events: usize,
}

#[pymethods]
impl PyXgmiConfig {
    #[new]
    #[pyo3(signature = (num_streams = 64, num_events = 64))]
    fn new(num_streams: usize, num_events: usize) -> Self {
        PyXgmiConfig { num_streams, num_events }
    }
}

/// MORI's `FabricBackendConfig(num_streams=64, num_events=64)`; the handle type comes from
/// `MORI_IO_FABRIC_HANDLE` (POSIX FD within a node by default).
#[pyclass(module = "mori_rs.io", name = "FabricBackendConfig", from_py_object)]
#[derive(Clone)]
pub struct PyFabricConfig {
    #[pyo3(get, set)]
    num_streams: usize,
    #[pyo3(get, set)]
    num_events: usize,
}

#[pymethods]
impl PyFabricConfig {
    #[new]
    #[pyo3(signature = (num_streams = 64, num_events = 64))]
    fn new(num_streams: usize, num_events: usize) -> Self {
        PyFabricConfig { num_streams, num_events }
    }
}

/// `TcpBackendConfig(lanes=4, min_lane_bytes=262144)`: connections per peer (1..=64) and the
/// smallest share of a transfer given to one more lane, bytes. Deadlines come from
/// `MORI_IO_CONTROL_TIMEOUT_MS` / `MORI_IO_TCP_TIMEOUT_MS`.
#[pyclass(module = "mori_rs.io", name = "TcpBackendConfig", from_py_object)]
#[derive(Clone)]
pub struct PyTcpConfig {
    #[pyo3(get, set)]
    lanes: usize,
    #[pyo3(get, set)]
    min_lane_bytes: u64,
}

#[pymethods]
impl PyTcpConfig {
    #[new]
    #[pyo3(signature = (lanes = 4, min_lane_bytes = 262144))]
    fn new(lanes: usize, min_lane_bytes: u64) -> Self {
        PyTcpConfig { lanes, min_lane_bytes }
    }
}

/// A positive `i64` setting as `usize`; `keep` for -1 (MORI's "default").
fn knob(name: &str, v: i64, keep: usize) -> PyResult<usize> {
    match v {
        -1 => Ok(keep),
        v if v > 0 => Ok(v as usize),
        _ => Err(crate::errors::invalid(format!("RdmaBackendConfig.{name} = {v}: must be positive (or -1 for the default)"))),
    }
}

/// The Rust settings for `create_backend(ty, cfg)`. Errors: `InvalidArgument` for a config of
/// another backend's class, a bad value, or `BackendType.Unknown`.
pub(crate) fn backend_config(ty: BackendType, cfg: Option<&Bound<'_, PyAny>>) -> PyResult<BackendConfig> {
    let wrong = |want: &str| {
        crate::errors::invalid(format!(
            "create_backend({ty:?}, config): config must be a {want} or None, got {}",
            cfg.map_or("None".to_string(), |c| c.get_type().name().map(|n| n.to_string()).unwrap_or_default())
        ))
    };
    Ok(match ty {
        BackendType::TCP => {
            let mut c = TcpConfig::from_env().py()?;
            if let Some(o) = cfg {
                let p: PyTcpConfig = o.extract().map_err(|_| wrong("TcpBackendConfig"))?;
                c.lanes = p.lanes;
                c.min_lane_bytes = p.min_lane_bytes;
            }
            BackendConfig::Tcp(c)
        }
        BackendType::RDMA => {
            let mut c = RdmaConfig::from_env().py()?;
            if let Some(o) = cfg {
                let p: PyRdmaConfig = o.extract().map_err(|_| wrong("RdmaBackendConfig"))?;
                c.qps_per_transfer = knob("qp_per_transfer", p.qp_per_transfer, c.qps_per_transfer)?;
                c.workers = knob("num_worker_threads", p.num_worker_threads, c.workers)?;
                c.poll_mode = match p.poll_cq_mode {
                    PollCqMode::POLLING => PollMode::Polling,
                    PollCqMode::EVENT => PollMode::Event,
                };
                c.chunking = p.enable_transfer_chunking;
                c.chunk_bytes = knob("chunk_bytes", p.chunk_bytes, c.chunk_bytes as usize)? as u64;
                c.max_chunks = knob("max_chunks_per_transfer", p.max_chunks_per_transfer, c.max_chunks)?;
                c.nics_per_transfer = knob("num_nics_per_transfer", p.num_nics_per_transfer, c.nics_per_transfer)?;
            }
            BackendConfig::Rdma(c)
        }
        BackendType::XGMI => {
            let mut c = XgmiConfig::default();
            if let Some(o) = cfg {
                let p: PyXgmiConfig = o.extract().map_err(|_| wrong("XgmiBackendConfig"))?;
                c.num_streams = p.num_streams;
                c.num_events = p.num_events;
            }
            BackendConfig::Xgmi(c)
        }
        BackendType::FABRIC => {
            let mut c = FabricConfig::from_env().py()?;
            if let Some(o) = cfg {
                let p: PyFabricConfig = o.extract().map_err(|_| wrong("FabricBackendConfig"))?;
                c.num_streams = p.num_streams;
                c.num_events = p.num_events;
            }
            BackendConfig::Fabric(c)
        }
        BackendType::Unknown => return Err(crate::errors::invalid("create_backend: BackendType.Unknown is not a backend")),
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngineConfig>()?;
    m.add_class::<PyRdmaConfig>()?;
    m.add_class::<PyXgmiConfig>()?;
    m.add_class::<PyFabricConfig>()?;
    m.add_class::<PyTcpConfig>()?;
    Ok(())
}
