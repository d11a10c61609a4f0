//! `_EpOp`: MORI-EP's intranode dispatch/combine for one rank of this process, driven by
//! python/mori_rs/ops.py (`EpDispatchCombineOp`), which turns torch tensors into device
//! addresses and the op's heap regions back into tensors.
//!
//! Every call queues work on the stream it is given (PyTorch's current stream) and returns:
//! no host synchronisation and no pageable copy (rank arguments are device snapshots made once
//! per distinct set, `mori_ep::gpu`'s `gpu_args`), so a dispatch and combine can be captured in a CUDA graph; the received
//! count stays on the device (`recv_count_ptr`).

use mori_bootstrap::{Bootstrap, BootstrapError};
use mori_ep::gpu::{CombineInput, CombineSpec, DispatchInput, DispatchSpec, DispatchTicket, EpGpuError, IntranodeEp};
use mori_ep::{EpConfig, KernelType};
use mori_gpu::{Device, DeviceSlice, Runtime, Stream};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;
use std::time::Duration;

fn ep_err(e: EpGpuError) -> PyErr {
    match e {
        EpGpuError::Ep(e) => crate::errors::invalid(e.to_string()),
        EpGpuError::Kernel { .. } => crate::errors::err(mori_io::ErrorCode::BadState, e.to_string()),
        other => crate::errors::err(mori_io::ErrorCode::GpuOp, other.to_string()),
    }
}

/// The ranks' handle exchange through a Python object with `allgather(bytes) -> list[bytes]`
/// and `barrier()` (python/mori_rs/ops.py builds one over a torch.distributed group).
struct PyBootstrap {
    rank: usize,
    world: usize,
    obj: Py<PyAny>,
    timeout: Duration,
}

impl PyBootstrap {
    fn failed(op: &'static str, e: PyErr) -> BootstrapError {
        BootstrapError::InvalidArgument { op, detail: format!("the Python bootstrap's {op} raised {e}") }
    }
}

impl Bootstrap for PyBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        Python::attach(|py| {
            let r = self.obj.bind(py).call_method1("allgather", (PyBytes::new(py, data),)).map_err(|e| Self::failed("allgather", e))?;
            let v: Vec<Vec<u8>> = r.extract().map_err(|e| Self::failed("allgather", e))?;
            if v.len() != self.world {
                return Err(BootstrapError::InvalidArgument {
                    op: "allgather",
                    detail: format!("the Python bootstrap returned {} blocks for a world of {}", v.len(), self.world),
                });
            }
            Ok(v)
        })
    }
    fn all_to_all(&self, data: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, BootstrapError> {
        // Through allgather: each rank publishes all its blocks, keeps those addressed to it.
        let mut packed = Vec::new();
        for d in &data {
            packed.extend_from_slice(&(d.len() as u64).to_le_bytes());
            packed.extend_from_slice(d);
        }
        let all = self.allgather(&packed)?;
        let mut out = Vec::with_capacity(self.world);
        for (src, b) in all.iter().enumerate() {
            let mut at = 0usize;
            let mut mine = None;
            for j in 0..self.world {
                let bad = || BootstrapError::Protocol { from: format!("rank {src}"), detail: "truncated all_to_all block".into() };
                let n = u64::from_le_bytes(b.get(at..at + 8).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
                let body = b.get(at + 8..at + 8 + n).ok_or_else(bad)?;
                if j == self.rank {
                    mine = Some(body.to_vec());
                }
                at += 8 + n;
            }
            out.push(mine.unwrap_or_default());
        }
        Ok(out)
    }
    fn broadcast(&self, root: usize, data: Option<&[u8]>) -> Result<Vec<u8>, BootstrapError> {
        let all = self.allgather(data.unwrap_or_default())?;
        all.into_iter()
            .nth(root)
            .ok_or(BootstrapError::InvalidArgument { op: "broadcast", detail: format!("root {root} >= world {}", self.world) })
    }
    fn barrier(&self) -> Result<(), BootstrapError> {
        Python::attach(|py| self.obj.bind(py).call_method0("barrier").map(|_| ()).map_err(|e| Self::failed("barrier", e)))
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// A device range from an address the caller (ops.py) took from a live tensor.
fn slice(ptr: u64, len: usize, dev: Device) -> DeviceSlice<'static> {
    // SAFETY: ops.py passes the data pointer and byte length of a live CUDA tensor on `dev`
    // and keeps the tensor referenced until the work queued with it can no longer run
    // (the next dispatch or combine, see ops.py).
    unsafe { DeviceSlice::from_raw(ptr, len, dev) }
}

/// One rank's dispatch/combine state (see the module docs). Not thread-safe by design:
/// used from the thread that made it, as torch modules are.
#[pyclass(unsendable, module = "mori_rs._native", name = "_EpOp")]
pub struct PyEpOp {
    ep: IntranodeEp,
    rt: Arc<dyn Runtime>,
    dev: Device,
    cfg: EpConfig,
    ticket: Option<DispatchTicket<'static>>,
}

impl PyEpOp {
    fn stream(&self, raw: u64) -> Stream {
        // SAFETY: ops.py passes torch.cuda.current_stream(device).cuda_stream, a live stream of
        // this device's primary context that outlives the call.
        unsafe { Stream::borrowed(self.rt.clone(), self.dev, raw) }
    }
}

#[pymethods]
impl PyEpOp {
    /// Builds rank `rank`'s heap on GPU `device` and exchanges handles through `bootstrap`
    /// (a Python object with `allgather` and `barrier`; None: our socket bootstrap from the
    /// launcher's environment, or nothing for world size 1). Errors: `NotSupported` (no GPU runtime, an internode kernel
    /// type), `InvalidArgument` (configuration), `GpuError`.
    #[new]
    #[pyo3(signature = (rank, world_size, hidden, scale_dim, scale_type_size, max_token_type_size, max_tokens, experts_per_rank,
        top_k, max_recv_tokens, block_num, warps_per_block, gpus_per_node, kernel_type, device, bootstrap, timeout_ms))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank: usize,
        world_size: usize,
        hidden: usize,
        scale_dim: usize,
        scale_type_size: usize,
        max_token_type_size: usize,
        max_tokens: usize,
        experts_per_rank: usize,
        top_k: usize,
        max_recv_tokens: usize,
        block_num: usize,
        warps_per_block: usize,
        gpus_per_node: usize,
        kernel_type: u32,
        device: u32,
        bootstrap: Option<Py<PyAny>>,
        timeout_ms: u64,
    ) -> PyResult<Self> {
        if kernel_type != 0 {
            return Err(crate::errors::err(
                mori_io::ErrorCode::NotSupported,
                format!("kernel_type {kernel_type}: mori_rs.ops runs the IntraNode kernels only (the inter-node GPU kernels run every rank of a job in one process, as mori_ep::gpu_internode::InterNodeGpu and bench_dispatch_combine --kernel-type v1|v1_ll|async_ll; one rank per Python process is not wired to them)"),
            ));
        }
        let mut cfg = EpConfig::new(world_size, hidden, experts_per_rank.saturating_mul(world_size), top_k, max_tokens)
            .map_err(|e| crate::errors::invalid(e.to_string()))?;
        cfg.rank = rank;
        cfg.scale_dim = scale_dim;
        if scale_dim > 0 {
            cfg.scale_type_size = scale_type_size;
        }
        cfg.max_token_type_size = max_token_type_size;
        if max_recv_tokens > 0 {
            cfg.max_recv_tokens = max_recv_tokens;
        }
        cfg.block_num = block_num;
        cfg.warps_per_block = warps_per_block;
        cfg.gpus_per_node = gpus_per_node.max(1).min(world_size);
        cfg.kernel_type = KernelType::IntraNode;
        cfg.validate().map_err(|e| crate::errors::invalid(e.to_string()))?;
        let rt = mori_gpu::detect()
            .map_err(|e| crate::errors::err(mori_io::ErrorCode::NotSupported, format!("mori_rs.ops needs a GPU: {e}")))?;
        let boot: Option<Box<dyn Bootstrap>> = match (world_size, bootstrap) {
            (1, _) => None,
            (_, Some(obj)) => Some(Box::new(PyBootstrap { rank, world: world_size, obj, timeout: Duration::from_millis(timeout_ms) })),
            // Our socket bootstrap, from the launcher's environment (torchrun, srun, mpirun,
            // or MORI_RANK / MORI_WORLD_SIZE / MASTER_ADDR / MASTER_PORT).
            (_, None) => {
                let b = mori_bootstrap::SocketBootstrap::from_env()
                    .map_err(|e| crate::errors::invalid(format!("socket bootstrap from the environment: {e}")))?;
                if b.rank() != rank || b.world_size() != world_size {
                    return Err(crate::errors::invalid(format!(
                        "the launcher environment says rank {} of {}, the config rank {rank} of {world_size}",
                        b.rank(),
                        b.world_size()
                    )));
                }
                Some(Box::new(b))
            }
        };
        let dev = Device(device);
        let ep = IntranodeEp::new(rt.clone(), &cfg, &[(rank, dev)], boot.as_deref(), Duration::from_millis(timeout_ms), false)
            .map_err(ep_err)?;
        let mut ep = ep;
        // Sequence numbers on the device, so that captured graphs replay correctly.
        ep.use_device_sequence().map_err(ep_err)?;
        Ok(PyEpOp { ep, rt, dev, cfg, ticket: None })
    }

    /// Queues this rank's dispatch on `stream` (a `CUstream` as int). Addresses are device
    /// pointers of contiguous tensors (0: absent); shapes are `[num_tokens, hidden]` of
    /// `elem_size` bytes, `[num_tokens, top_k]` ids of `idx_size` bytes, f32 weights, scales.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &mut self,
        x: u64,
        elem_size: usize,
        weights: u64,
        indices: u64,
        idx_size: usize,
        scales: u64,
        num_tokens: usize,
        stream: u64,
    ) -> PyResult<()> {
        let c = &self.cfg;
        let t = num_tokens;
        let d = self.dev;
        let inp = DispatchInput {
            x: slice(x, t * c.hidden * elem_size, d),
            weights: (weights != 0).then(|| slice(weights, t * c.top_k * 4, d)),
            indices: slice(indices, t * c.top_k * idx_size, d),
            scales: (scales != 0).then(|| slice(scales, t * c.scale_dim * c.scale_type_size, d)),
            num_tokens: t,
        };
        let s = self.stream(stream);
        let ticket = self.ep.dispatch(&[inp], DispatchSpec { elem_size, idx_size, drop_out_of_range: false }, &[&s]).map_err(ep_err)?;
        self.ticket = Some(ticket);
        Ok(())
    }

    /// Queues this rank's combine of the last dispatch on `stream`. `x` (0: the heap's combine
    /// buffer) holds `[N_recv, hidden]` rows of `in_elem` bytes in received order; `weights`
    /// `[N_recv, top_k]` f32 (0: none); `out` `[num_tokens, hidden]` of `out_elem` bytes;
    /// `out_weights` `[num_tokens, top_k]` f32 (0: none).
    #[allow(clippy::too_many_arguments)]
    fn combine(
        &mut self,
        x: u64,
        x_rows: usize,
        in_elem: usize,
        weights: u64,
        out: u64,
        out_elem: usize,
        out_weights: u64,
        num_tokens: usize,
        idx_size: usize,
        stream: u64,
    ) -> PyResult<()> {
        let Some(ticket) = self.ticket.as_ref() else {
            return Err(crate::errors::err(
                mori_io::ErrorCode::BadState,
                "combine before any dispatch: combine sums the rows of the last dispatch",
            ));
        };
        let c = &self.cfg;
        let d = self.dev;
        let inp = CombineInput {
            x: (x != 0).then(|| slice(x, x_rows * c.hidden * in_elem, d)),
            weights: (weights != 0).then(|| slice(weights, x_rows * c.top_k * 4, d)),
            weights_in_heap: false,
            out: slice(out, num_tokens * c.hidden * out_elem, d),
            out_weights: (out_weights != 0).then(|| slice(out_weights, num_tokens * c.top_k * 4, d)),
        };
        let s = self.stream(stream);
        self.ep.combine(ticket, &[inp], CombineSpec { in_elem, out_elem, weighted: false, idx_size }, &[&s]).map_err(ep_err)
    }

    /// `(address, bytes)` of the received `x`, weights, indices, scales and source regions for
    /// `max_recv_tokens` rows (fixed addresses: views of them stay valid for the op's life).
    fn recv_regions(&self, elem_size: usize, idx_size: usize) -> PyResult<Vec<(u64, usize)>> {
        let r = self.ep.recv_slices(self.cfg.rank, self.cfg.max_recv_tokens, elem_size, idx_size).map_err(ep_err)?;
        Ok(r.iter().map(|s| (s.ptr(), s.len())).collect())
    }

    /// Device address of the received-token count (u32) of the last dispatch.
    fn recv_count_ptr(&self) -> PyResult<u64> {
        self.ep.recv_count_ptr(0).map_err(ep_err)
    }

    /// Reads the status word (synchronises the device): the last dispatch's received count, or
    /// the kernel's fault as `BadState`.
    fn sync_status(&self) -> PyResult<usize> {
        let s = self.ep.sync_status().map_err(ep_err)?;
        Ok(s.first().map_or(0, |r| r.recv_count))
    }

    /// Distinct argument sets uploaded so far (one device snapshot each).
    fn argument_snapshots(&self) -> usize {
        self.ep.argument_snapshots()
    }

    /// `max_recv_tokens` of the configuration in use.
    #[getter]
    fn max_recv_tokens(&self) -> usize {
        self.cfg.max_recv_tokens
    }
}

/// Whether a GPU runtime loads here (`(True, "")` or `(False, why)`).
#[pyfunction]
fn gpu_runtime() -> (bool, String) {
    match mori_gpu::detect() {
        Ok(_) => (true, String::new()),
        Err(e) => (false, e.to_string()),
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEpOp>()?;
    m.add_function(wrap_pyfunction!(gpu_runtime, m)?)?;
    Ok(())
}
