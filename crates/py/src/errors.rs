//! One Python exception class per engine error kind, all under `MoriError`; each carries the
//! Rust message (which names the input and the limit) and, as `code`, its `StatusCode`.

use mori_io::{ErrorCode, IoError};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(mori_rs, MoriError, PyException, "Base class of every mori_rs error.");
create_exception!(mori_rs, InvalidArgument, MoriError, "An argument is out of range, inconsistent or malformed.");
create_exception!(mori_rs, NotFound, MoriError, "A named engine, memory region or transfer is not known.");
create_exception!(mori_rs, BadState, MoriError, "The object is in a state that does not allow the call.");
create_exception!(mori_rs, TransportError, MoriError, "The transport failed (socket, verbs, protocol).");
create_exception!(mori_rs, GpuError, MoriError, "A GPU runtime call failed.");
create_exception!(mori_rs, Timeout, MoriError, "A deadline passed before the awaited event.");
create_exception!(mori_rs, RemoteDisconnect, MoriError, "The peer engine went away.");
create_exception!(mori_rs, NotSupported, MoriError, "The path is not available on this build or machine.");
create_exception!(mori_rs, Refused, MoriError, "The peer refused the connection or the message.");

/// The Python exception for an engine error, `code` attribute set to its `StatusCode` value.
pub(crate) fn to_py(e: IoError) -> PyErr {
    let msg = e.msg;
    let err = match e.code {
        ErrorCode::InvalidArgs => InvalidArgument::new_err(msg),
        ErrorCode::NotFound => NotFound::new_err(msg),
        ErrorCode::BadState => BadState::new_err(msg),
        ErrorCode::Transport => TransportError::new_err(msg),
        ErrorCode::GpuOp => GpuError::new_err(msg),
        ErrorCode::Timeout => Timeout::new_err(msg),
        ErrorCode::RemoteDisconnect => RemoteDisconnect::new_err(msg),
        ErrorCode::NotSupported => NotSupported::new_err(msg),
        ErrorCode::Refused => Refused::new_err(msg),
        ErrorCode::Success | ErrorCode::InProgress => BadState::new_err(format!("not an error ({:?}): {msg}", e.code)),
    };
    let code = crate::status::StatusCode::from(e.code) as i64;
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", code);
    });
    err
}

/// The Python exception of kind `code` with `msg` (and its `code` attribute).
pub(crate) fn err(code: ErrorCode, msg: impl Into<String>) -> PyErr {
    to_py(IoError::new(code, msg))
}

/// `InvalidArgument` with `msg`.
pub(crate) fn invalid(msg: impl Into<String>) -> PyErr {
    err(ErrorCode::InvalidArgs, msg)
}

/// An int argument `what` as u64. Errors: `InvalidArgument` naming it for a value outside
/// 0..2^64 or a non-int.
pub(crate) fn u64_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    let v: i128 = obj.extract().map_err(|_| invalid(format!("{what}: expected an int, got {}", crate::offsets::type_name(obj))))?;
    u64::try_from(v).map_err(|_| invalid(format!("{what} = {v} is outside 0..2^64")))
}

/// `to_py` for results.
pub(crate) trait IntoPy<T> {
    /// The value, or the engine error as its Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, IoError> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // Each class carries its kind's code too, so an instance raised from Python code (or one
    // that lost its attributes through pickling) still has `.code`.
    let kinds = [
        (py.get_type::<MoriError>(), ErrorCode::Transport),
        (py.get_type::<InvalidArgument>(), ErrorCode::InvalidArgs),
        (py.get_type::<NotFound>(), ErrorCode::NotFound),
        (py.get_type::<BadState>(), ErrorCode::BadState),
        (py.get_type::<TransportError>(), ErrorCode::Transport),
        (py.get_type::<GpuError>(), ErrorCode::GpuOp),
        (py.get_type::<Timeout>(), ErrorCode::Timeout),
        (py.get_type::<RemoteDisconnect>(), ErrorCode::RemoteDisconnect),
        (py.get_type::<NotSupported>(), ErrorCode::NotSupported),
        (py.get_type::<Refused>(), ErrorCode::Refused),
    ];
    for (t, c) in kinds {
        t.setattr("code", crate::status::StatusCode::from(c) as i64)?;
    }
    m.add("MoriError", py.get_type::<MoriError>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("BadState", py.get_type::<BadState>())?;
    m.add("TransportError", py.get_type::<TransportError>())?;
    m.add("GpuError", py.get_type::<GpuError>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("RemoteDisconnect", py.get_type::<RemoteDisconnect>())?;
    m.add("NotSupported", py.get_type::<NotSupported>())?;
    m.add("Refused", py.get_type::<Refused>())?;
    Ok(())
}
