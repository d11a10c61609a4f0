//! Status codes and the error type shared by every MORI-IO crate.

use std::fmt;

/// Status codes, compatible with upstream MORI-IO's `StatusCode` where a status crosses the API.
///
/// `Success` and `InProgress` are states of a [`crate::TransferStatus`]; the others are
/// failure kinds carried by [`IoError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ErrorCode {
    /// The operation finished and its data is in place.
    Success,
    /// The operation was posted and has not finished yet.
    InProgress,
    /// An argument is out of range, inconsistent or malformed.
    InvalidArgs,
    /// A named object (engine, memory region, transfer) is not known.
    NotFound,
    /// The object is in a state that does not allow the call (closed, still in use, ...).
    BadState,
    /// The transport failed (socket error, verbs error, protocol violation).
    Transport,
    /// A GPU runtime call failed.
    GpuOp,
    /// A deadline passed before the awaited event happened.
    Timeout,
    /// The peer engine went away (connection reset, end of stream, process gone).
    RemoteDisconnect,
    /// The requested path is not available on this build or machine.
    NotSupported,
    /// The connection did not present the engine's secret (its descriptor), or the engine
    /// took no more connections.
    Refused,
}

impl ErrorCode {
    /// Stable numeric value (0 = success), for FFI and wire use.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// Inverse of [`ErrorCode::as_u32`]; unknown values map to `Transport` (a peer speaking a
    /// newer protocol must not be able to make us panic).
    pub fn from_u32(v: u32) -> ErrorCode {
        use ErrorCode::*;
        match v {
            0 => Success,
            1 => InProgress,
            2 => InvalidArgs,
            3 => NotFound,
            4 => BadState,
            5 => Transport,
            6 => GpuOp,
            7 => Timeout,
            8 => RemoteDisconnect,
            9 => NotSupported,
            10 => Refused,
            _ => Transport,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// An error of the transfer engine: a code plus a human message that names the input and the
/// limit involved (e.g. "entry 3: remote range 4096+8192 exceeds region 7 of 8192 bytes").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{code}: {msg}")]
pub struct IoError {
    /// What kind of failure this is.
    pub code: ErrorCode,
    /// What happened, naming the culprit.
    pub msg: String,
}

impl IoError {
    /// Builds an error from a code and a message.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        IoError { code, msg: msg.into() }
    }
    /// `InvalidArgs` with a message.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgs, msg)
    }
    /// `NotFound` with a message.
    pub fn not_found(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, msg)
    }
    /// `BadState` with a message.
    pub fn bad_state(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadState, msg)
    }
    /// `GpuOp`: `what` failed with the GPU runtime's error `e`.
    pub fn gpu(what: &str, e: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::GpuOp, format!("{what}: {e}"))
    }
    /// `Transport` with a message.
    pub fn transport(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::Transport, msg)
    }
    /// `Timeout` with a message.
    pub fn timeout(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::Timeout, msg)
    }
    /// `Refused` with a message.
    pub fn refused(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::Refused, msg)
    }

    /// `NotSupported` with a message.
    pub fn not_supported(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotSupported, msg)
    }
    /// `RemoteDisconnect` with a message.
    pub fn disconnected(msg: impl Into<String>) -> Self {
        Self::new(ErrorCode::RemoteDisconnect, msg)
    }

    /// Maps an I/O error on a connection to a peer into an engine error: end of stream and
    /// resets become `RemoteDisconnect` (saying the peer's engine went away), expired socket
    /// deadlines `Timeout`, the rest `Transport`.
    pub fn from_io(context: &str, e: &std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        let (code, hint) = match e.kind() {
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected => {
                (ErrorCode::RemoteDisconnect, " (the peer's engine shut down or exited)")
            }
            // Nobody listens at the address: the peer engine exited (or the address is wrong).
            ConnectionRefused => (ErrorCode::RemoteDisconnect, " (nothing listens there: the engine exited, or its address is wrong)"),
            WouldBlock | TimedOut => (ErrorCode::Timeout, ""),
            _ => (ErrorCode::Transport, ""),
        };
        IoError::new(code, format!("{context}: {e}{hint}"))
    }
}

/// Result alias of the engine crates.
pub type IoResult<T> = Result<T, IoError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_errors_map_to_codes_with_hints() {
        let e = |k: std::io::ErrorKind| IoError::from_io("connect to engine \"b\"", &std::io::Error::from(k));
        let refused = e(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(refused.code, ErrorCode::RemoteDisconnect);
        assert!(refused.msg.contains("nothing listens there"), "{refused}");
        assert_eq!(e(std::io::ErrorKind::ConnectionReset).code, ErrorCode::RemoteDisconnect);
        assert_eq!(e(std::io::ErrorKind::TimedOut).code, ErrorCode::Timeout);
        assert_eq!(e(std::io::ErrorKind::PermissionDenied).code, ErrorCode::Transport);
        for v in 0..12 {
            assert_eq!(ErrorCode::from_u32(ErrorCode::from_u32(v).as_u32()), ErrorCode::from_u32(v));
        }
        assert_eq!(ErrorCode::from_u32(10), ErrorCode::Refused);
        assert_eq!(ErrorCode::from_u32(11), ErrorCode::Transport);
    }
}
