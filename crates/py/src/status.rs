//! `StatusCode` and `TransferStatus` as MORI's Python API has them, plus `wait` (raising the
//! error's class) and `wait_all`.

use crate::errors::to_py;
use mori_io::{ErrorCode, IoError, TransferStatus as RsStatus};
use pyo3::prelude::*;
use std::time::{Duration, Instant};

/// Status codes with upstream MORI's values (`SUCCESS=0`, `INIT=1`, `IN_PROGRESS=2`, errors
/// from 11); kinds MORI has no code for continue from 16. `Failed()` is `code > 10`.
#[pyclass(eq, eq_int, module = "mori_rs.io", from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum StatusCode {
    SUCCESS = 0,
    INIT = 1,
    IN_PROGRESS = 2,
    ERR_INVALID_ARGS = 11,
    ERR_NOT_FOUND = 12,
    /// The transport failed (MORI's name; tcp and GPU transports report it too).
    ERR_RDMA_OP = 13,
    ERR_BAD_STATE = 14,
    ERR_GPU_OP = 15,
    ERR_TIMEOUT = 16,
    ERR_REMOTE_DISCONNECT = 17,
    ERR_NOT_SUPPORTED = 18,
    ERR_REFUSED = 19,
}

impl From<ErrorCode> for StatusCode {
    fn from(c: ErrorCode) -> Self {
        match c {
            ErrorCode::Success => StatusCode::SUCCESS,
            ErrorCode::InProgress => StatusCode::IN_PROGRESS,
            ErrorCode::InvalidArgs => StatusCode::ERR_INVALID_ARGS,
            ErrorCode::NotFound => StatusCode::ERR_NOT_FOUND,
            ErrorCode::Transport => StatusCode::ERR_RDMA_OP,
            ErrorCode::BadState => StatusCode::ERR_BAD_STATE,
            ErrorCode::GpuOp => StatusCode::ERR_GPU_OP,
            ErrorCode::Timeout => StatusCode::ERR_TIMEOUT,
            ErrorCode::RemoteDisconnect => StatusCode::ERR_REMOTE_DISCONNECT,
            ErrorCode::NotSupported => StatusCode::ERR_NOT_SUPPORTED,
            ErrorCode::Refused => StatusCode::ERR_REFUSED,
        }
    }
}

#[pymethods]
impl StatusCode {
    fn __str__(&self) -> String {
        format!("{self:?}")
    }
}

/// A waiter spins (driving the backend's completion step, as NIXL's `check_xfer_state` loop
/// does) this long before it sleeps until the backend's thread completes the transfer.
const SPIN: Duration = Duration::from_micros(200);

/// The longest wait: what a negative `timeout_ms` means (MORI: wait until done).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Longest stretch a wait spends without the GIL before it lets Python's signal handlers run
/// (Ctrl-C interrupts every wait within this).
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// `timeout_ms` as MORI takes it: negative waits until done, 0 polls once.
pub(crate) fn timeout_of(ms: i64) -> Duration {
    if ms < 0 {
        FOREVER
    } else {
        Duration::from_millis(ms as u64)
    }
}

/// Waits for `st` up to `timeout` (GIL not held): spins first, then sleeps. `Ok(None)` when
/// the deadline passed with the transfer still in progress.
pub(crate) fn wait_rs(st: &RsStatus, timeout: Duration) -> Option<Result<(), IoError>> {
    if st.drive() || timeout.is_zero() {
        return st.poll();
    }
    let spin = timeout.min(SPIN);
    let _ = st.spin_for(spin);
    if st.is_done() {
        return st.poll();
    }
    let _ = st.wait_for(timeout - spin);
    st.poll()
}

/// [`wait_rs`] without the GIL in slices of [`SLICE`], running Python's signal handlers in
/// between. Errors: the handler's exception (KeyboardInterrupt).
pub(crate) fn wait_py(py: Python<'_>, st: &RsStatus, timeout: Duration) -> PyResult<Option<Result<(), IoError>>> {
    if st.drive() || timeout.is_zero() {
        return Ok(st.poll());
    }
    let deadline = Instant::now().checked_add(timeout);
    loop {
        let left = deadline.map_or(SLICE, |d| d.saturating_duration_since(Instant::now()));
        let slice = left.min(SLICE);
        let s = st.clone();
        if let Some(r) = py.detach(move || wait_rs(&s, slice)) {
            return Ok(Some(r));
        }
        if left <= slice {
            return Ok(None);
        }
        py.check_signals()?;
    }
}

/// The completion handle of one transfer (MORI's `TransferStatus`). Already `IN_PROGRESS` (or
/// failed) when the call that made it returns; a transfer's own errors (bad offsets, a peer
/// gone) end up here rather than raising at the call, as in MORI. `wait()` raises them.
#[pyclass(frozen, module = "mori_rs.io", name = "TransferStatus")]
#[derive(Clone)]
pub struct PyStatus {
    pub(crate) st: RsStatus,
}

impl PyStatus {
    pub(crate) fn new(st: RsStatus) -> Self {
        PyStatus { st }
    }
}

#[pymethods]
impl PyStatus {
    /// Current code (runs one completion step first, never blocks).
    #[pyo3(name = "Code")]
    fn code(&self) -> StatusCode {
        self.st.drive();
        self.st.code().into()
    }

    /// The error message; `""` while in progress or after success.
    #[pyo3(name = "Message")]
    fn message(&self) -> String {
        match self.st.poll() {
            Some(Err(e)) => e.msg,
            _ => String::new(),
        }
    }

    /// True once the transfer succeeded.
    #[pyo3(name = "Succeeded")]
    fn succeeded(&self) -> bool {
        self.st.drive();
        self.st.succeeded()
    }

    /// True once the transfer failed.
    #[pyo3(name = "Failed")]
    fn failed(&self) -> bool {
        self.st.drive();
        self.st.is_done() && !self.st.succeeded()
    }

    /// True while the transfer runs.
    #[pyo3(name = "InProgress")]
    fn in_progress(&self) -> bool {
        !self.st.drive()
    }

    /// Always false: a status is posted (in progress or failed) when it is returned.
    #[pyo3(name = "Init")]
    fn init(&self) -> bool {
        false
    }

    /// Blocks until done (GIL released; Ctrl-C interrupts it).
    #[pyo3(name = "Wait")]
    fn wait_forever(&self, py: Python<'_>) -> PyResult<()> {
        wait_py(py, &self.st, FOREVER).map(|_| ())
    }

    /// Waits up to `timeout_ms` (negative: until done; 0: poll once) and returns the code
    /// (`IN_PROGRESS` when the deadline passed). GIL released.
    #[pyo3(name = "WaitFor", signature = (timeout_ms = -1))]
    fn wait_for(&self, py: Python<'_>, timeout_ms: i64) -> PyResult<StatusCode> {
        wait_py(py, &self.st, timeout_of(timeout_ms))?;
        Ok(self.st.code().into())
    }

    /// Waits up to `timeout_ms` (negative: until done) and raises the failure's exception
    /// class (`InvalidArgument`, `RemoteDisconnect`, ...) or `Timeout` when the deadline
    /// passed. GIL released.
    #[pyo3(signature = (timeout_ms = -1))]
    fn wait(&self, py: Python<'_>, timeout_ms: i64) -> PyResult<()> {
        match wait_py(py, &self.st, timeout_of(timeout_ms))? {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(to_py(e)),
            None => Err(crate::errors::err(ErrorCode::Timeout, format!("transfer not complete after {} ms", timeout_ms.max(0)))),
        }
    }

    /// For each failed batch entry range `(start, end)` of the caller's arrays, the message;
    /// `None` while in progress, `[]` after success. `(-1, -1)` names the whole batch.
    fn failed_entries(&self) -> Option<Vec<((i64, i64), String)>> {
        let f = self.st.failed_entries()?;
        let mut out = Vec::new();
        for x in f {
            match x.entries {
                None => out.push(((-1, -1), x.error.msg.clone())),
                Some(rs) => out.extend(rs.into_iter().map(|r| ((i64::from(r.start), i64::from(r.end)), x.error.msg.clone()))),
            }
        }
        Some(out)
    }

    fn __repr__(&self) -> String {
        format!("TransferStatus({:?})", StatusCode::from(self.st.code()))
    }
}

/// Waits for every status up to `timeout_ms` in all (negative: until all are done; 0: poll
/// once) and returns `SUCCESS`, the code of the first failed status in list order, or
/// `IN_PROGRESS` when the deadline passed with one still running (MORI's `wait_all`). GIL
/// released.
#[pyfunction]
#[pyo3(signature = (statuses, timeout_ms = -1))]
pub(crate) fn wait_all(py: Python<'_>, statuses: Vec<PyRef<'_, PyStatus>>, timeout_ms: i64) -> PyResult<StatusCode> {
    let sts: Vec<RsStatus> = statuses.iter().map(|s| s.st.clone()).collect();
    drop(statuses);
    let deadline = Instant::now().checked_add(timeout_of(timeout_ms));
    let mut running = false;
    for st in &sts {
        let left = deadline.map_or(FOREVER, |d| d.saturating_duration_since(Instant::now()));
        if wait_py(py, st, left)?.is_none() {
            running = true;
        }
    }
    if let Some(e) = sts.iter().find(|s| s.is_done() && !s.succeeded()) {
        return Ok(e.code().into());
    }
    Ok(if running { StatusCode::IN_PROGRESS } else { StatusCode::SUCCESS })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<StatusCode>()?;
    m.add_class::<PyStatus>()?;
    m.add_function(wrap_pyfunction!(wait_all, m)?)?;
    Ok(())
}
