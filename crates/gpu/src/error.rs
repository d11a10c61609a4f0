//! Typed errors: every failed driver call names the call, the numeric code and its name.

use std::borrow::Cow;
use std::fmt;

use crate::RuntimeKind;

/// Result alias of this crate.
pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// One runtime that [`crate::detect`] tried and why it could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The runtime that was tried.
    pub runtime: RuntimeKind,
    /// Why it is unusable (library missing, initialization failed, ...).
    pub reason: String,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.runtime, self.runtime.library(), self.reason)
    }
}

fn attempts_text(attempts: &[Attempt]) -> String {
    attempts.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

fn hint_text(hint: &Option<Cow<'static, str>>) -> String {
    match hint {
        Some(h) => format!(": {h}"),
        None => String::new(),
    }
}

/// Errors of the GPU runtime layer.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// Neither libcuda nor libamdhip64 could be used.
    #[error("no GPU runtime{}: {}", forced.map(|f| format!(" (MORI_GPU_RUNTIME={f})")).unwrap_or_default(), attempts_text(attempts))]
    NoRuntime {
        /// The runtime forced by `MORI_GPU_RUNTIME`, if any.
        forced: Option<RuntimeKind>,
        /// Every runtime tried, with its reason.
        attempts: Vec<Attempt>,
    },
    /// The vendor library was not found by the dynamic loader.
    #[error("{library} not found ({runtime} is not installed or not on the loader path): tried {searched}")]
    LibraryNotFound {
        /// Vendor.
        runtime: RuntimeKind,
        /// Library base name (`libcuda`, `libamdhip64`).
        library: &'static str,
        /// The names and paths tried.
        searched: String,
    },
    /// The library was found but lacks a symbol this crate needs (driver too old).
    #[error("{runtime} library {library} lacks symbol {symbol} (driver too old?): {reason}")]
    MissingSymbol {
        /// Vendor.
        runtime: RuntimeKind,
        /// Library that was opened.
        library: String,
        /// The missing symbol.
        symbol: &'static str,
        /// Loader message.
        reason: String,
    },
    /// A driver call returned an error code.
    #[error("{call} failed: {name} ({code}){}", hint_text(hint))]
    Call {
        /// Vendor.
        runtime: RuntimeKind,
        /// The driver entry point (`cuMemCreate`).
        call: &'static str,
        /// The numeric code it returned.
        code: u32,
        /// The code's name (`CUDA_ERROR_NOT_PERMITTED`).
        name: Cow<'static, str>,
        /// What the code means in this context, when known.
        hint: Option<Cow<'static, str>>,
    },
    /// `MORI_GPU_RUNTIME` holds a value that is not `cuda`, `hip` or `auto`.
    #[error("MORI_GPU_RUNTIME={value:?} is not understood: expected cuda, hip or auto")]
    BadRuntimeChoice {
        /// The value found.
        value: String,
    },
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operation is not available on this runtime or device.
    #[error("{what} is not supported by {runtime}: {why}")]
    Unsupported {
        /// Vendor.
        runtime: RuntimeKind,
        /// The operation.
        what: &'static str,
        /// Why.
        why: Cow<'static, str>,
    },
    /// A serialized handle could not be decoded.
    #[error("malformed {what}: {why}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// A handle made by one runtime was given to another.
    #[error("{what} comes from the {found} runtime but this runtime is {expected}")]
    RuntimeMismatch {
        /// What was given.
        what: &'static str,
        /// Runtime of this process.
        expected: RuntimeKind,
        /// Runtime that made the handle.
        found: RuntimeKind,
    },
    /// An operating-system call failed (socket, file descriptor).
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl GpuError {
    /// The driver code when this error is a failed driver call.
    pub fn code(&self) -> Option<u32> {
        match self {
            GpuError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The driver entry point when this error is a failed driver call.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            GpuError::Call { call, .. } => Some(call),
            _ => None,
        }
    }

    pub(crate) fn io(op: &'static str, source: std::io::Error) -> Self {
        GpuError::Io { op, source }
    }

    /// `Io` of `op` with a `TimedOut` error saying `msg`.
    pub(crate) fn timed_out(op: &'static str, msg: impl Into<String>) -> Self {
        GpuError::Io { op, source: std::io::Error::new(std::io::ErrorKind::TimedOut, msg.into()) }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        GpuError::InvalidArgument(msg.into())
    }
}

/// `CUDA_ERROR_NOT_PERMITTED`.
pub const CUDA_ERROR_NOT_PERMITTED: u32 = 800;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const CUDA_ERROR_NOT_SUPPORTED: u32 = 801;

macro_rules! cuda_names {
    ($($v:ident),* $(,)?) => {
        /// Name of a CUDA driver code, from the codes `cudarc` knows (`cuda-13000`); `None` if unknown.
        pub fn cuda_error_name(code: u32) -> Option<&'static str> {
            use cudarc::driver::sys::cudaError_enum as E;
            $( if code == E::$v as u32 { return Some(stringify!($v)); } )*
            None
        }
    };
}

cuda_names!(
    CUDA_SUCCESS,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_STUB_LIBRARY,
    CUDA_ERROR_DEVICE_UNAVAILABLE,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_DEVICE_NOT_LICENSED,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_MAP_FAILED,
    CUDA_ERROR_UNMAP_FAILED,
    CUDA_ERROR_ALREADY_MAPPED,
    CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_ALREADY_ACQUIRED,
    CUDA_ERROR_NOT_MAPPED,
    CUDA_ERROR_ECC_UNCORRECTABLE,
    CUDA_ERROR_UNSUPPORTED_LIMIT,
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_NVLINK_UNCORRECTABLE,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CUDA_ERROR_JIT_COMPILATION_DISABLED,
    CUDA_ERROR_INVALID_SOURCE,
    CUDA_ERROR_FILE_NOT_FOUND,
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
    CUDA_ERROR_OPERATING_SYSTEM,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    CUDA_ERROR_LAUNCH_TIMEOUT,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,
    CUDA_ERROR_CONTEXT_IS_DESTROYED,
    CUDA_ERROR_ASSERT,
    CUDA_ERROR_TOO_MANY_PEERS,
    CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUDA_ERROR_MISALIGNED_ADDRESS,
    CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUDA_ERROR_INVALID_PC,
    CUDA_ERROR_LAUNCH_FAILED,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_SYSTEM_NOT_READY,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
    CUDA_ERROR_TIMEOUT,
    CUDA_ERROR_UNKNOWN,
);

macro_rules! hip_names {
    ($($v:ident),* $(,)?) => {
        /// Name of a HIP runtime code, from the codes `cubecl-hip-sys` knows; `None` if unknown.
        pub fn hip_error_name(code: u32) -> Option<&'static str> {
            use cubecl_hip_sys as h;
            $( if code == h::$v { return Some(&stringify!($v)["hipError_t_".len()..]); } )*
            None
        }
    };
}

hip_names!(
    hipError_t_hipSuccess,
    hipError_t_hipErrorInvalidValue,
    hipError_t_hipErrorOutOfMemory,
    hipError_t_hipErrorNotInitialized,
    hipError_t_hipErrorDeinitialized,
    hipError_t_hipErrorNoDevice,
    hipError_t_hipErrorInvalidDevice,
    hipError_t_hipErrorInvalidImage,
    hipError_t_hipErrorInvalidContext,
    hipError_t_hipErrorNoBinaryForGpu,
    hipError_t_hipErrorInvalidHandle,
    hipError_t_hipErrorNotFound,
    hipError_t_hipErrorNotReady,
    hipError_t_hipErrorIllegalAddress,
    hipError_t_hipErrorLaunchOutOfResources,
    hipError_t_hipErrorPeerAccessUnsupported,
    hipError_t_hipErrorPeerAccessAlreadyEnabled,
    hipError_t_hipErrorPeerAccessNotEnabled,
    hipError_t_hipErrorLaunchFailure,
    hipError_t_hipErrorNotSupported,
    hipError_t_hipErrorInvalidDevicePointer,
    hipError_t_hipErrorMapFailed,
    hipError_t_hipErrorUnknown,
);
