//! The HIP runtime entry points this crate calls, resolved once from libamdhip64.
//!
//! Types and constants come from `cubecl-hip-sys` (their layouts and values are identical
//! across the HIP versions it ships bindings for). Functions are resolved here so that a
//! missing symbol is an error at load time (or, for the optional ones, an `Unsupported` error
//! at use) instead of a panic at first call.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_void};

use cubecl_hip_sys::{hipIpcMemHandle_t, hipMemAccessDesc, hipMemAllocationProp};

/// `hipError_t`.
pub(crate) type HipResult = c_uint;
type Stream = *mut c_void;
type Event = *mut c_void;
type Handle = *mut c_void;

macro_rules! hip_api {
    (
        required { $( $sym:ident ( $($arg:ty),* ); )* }
        optional { $( $osym:ident ( $($oarg:ty),* ); )* }
    ) => {
        /// Resolved runtime entry points (names as exported by libamdhip64).
        pub(crate) struct HipApi {
            $( pub(crate) $sym: unsafe extern "C" fn($($arg),*) -> HipResult, )*
            $( pub(crate) $osym: Option<unsafe extern "C" fn($($oarg),*) -> HipResult>, )*
            pub(crate) hipGetErrorName: Option<unsafe extern "C" fn(HipResult) -> *const c_char>,
        }

        impl HipApi {
            /// Resolves every required entry point (the first missing one is the error) and the
            /// optional ones newer ROCm releases add.
            pub(crate) fn load(lib: &'static libloading::Library) -> Result<Self, (&'static str, String)> {
                Ok(HipApi {
                    $( $sym: {
                        // SAFETY: the symbol is the HIP entry point of that name and the pointer
                        // type matches its C prototype in hip_runtime_api.h; the library is
                        // 'static, so the pointer never dangles.
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> HipResult>(
                                concat!(stringify!($sym), "\0").as_bytes(),
                            )
                        }
                        .map_err(|e| (stringify!($sym), e.to_string()))?;
                        *s
                    }, )*
                    $( $osym: {
                        // SAFETY: as above.
                        unsafe {
                            lib.get::<unsafe extern "C" fn($($oarg),*) -> HipResult>(
                                concat!(stringify!($osym), "\0").as_bytes(),
                            )
                        }
                        .ok()
                        .map(|s| *s)
                    }, )*
                    hipGetErrorName: {
                        // SAFETY: as above; `const char* hipGetErrorName(hipError_t)`.
                        unsafe { lib.get::<unsafe extern "C" fn(HipResult) -> *const c_char>(b"hipGetErrorName\0") }
                            .ok()
                            .map(|s| *s)
                    },
                })
            }
        }
    };
}

hip_api! {
    required {
        hipInit(c_uint);
        hipDriverGetVersion(*mut c_int);
        hipGetDeviceCount(*mut c_int);
        hipDeviceGetName(*mut c_char, c_int, c_int);
        hipDeviceGetAttribute(*mut c_int, c_uint, c_int);
        hipDeviceGetPCIBusId(*mut c_char, c_int, c_int);
        hipDeviceTotalMem(*mut usize, c_int);
        hipSetDevice(c_int);
        hipGetDevice(*mut c_int);
        hipMemGetInfo(*mut usize, *mut usize);
        hipDeviceCanAccessPeer(*mut c_int, c_int, c_int);
        hipDeviceEnablePeerAccess(c_int, c_uint);
        hipMalloc(*mut *mut c_void, usize);
        hipFree(*mut c_void);
        hipHostMalloc(*mut *mut c_void, usize, c_uint);
        hipHostFree(*mut c_void);
        hipHostGetDevicePointer(*mut *mut c_void, *mut c_void, c_uint);
        hipMemGetAddressRange(*mut *mut c_void, *mut usize, *mut c_void);
        hipMemcpy(*mut c_void, *const c_void, usize, c_uint);
        hipMemcpyAsync(*mut c_void, *const c_void, usize, c_uint, Stream);
        hipMemcpyPeer(*mut c_void, c_int, *const c_void, c_int, usize);
        hipMemcpyPeerAsync(*mut c_void, c_int, *const c_void, c_int, usize, Stream);
        hipMemsetD8(*mut c_void, c_uchar, usize);
        hipMemsetD8Async(*mut c_void, c_uchar, usize, Stream);
        hipStreamCreateWithFlags(*mut Stream, c_uint);
        hipStreamDestroy(Stream);
        hipStreamSynchronize(Stream);
        hipStreamQuery(Stream);
        hipStreamWaitEvent(Stream, Event, c_uint);
        hipStreamWriteValue32(Stream, *mut c_void, u32, c_uint);
        hipStreamWriteValue64(Stream, *mut c_void, u64, c_uint);
        hipStreamWaitValue32(Stream, *mut c_void, u32, c_uint, u32);
        hipEventCreateWithFlags(*mut Event, c_uint);
        hipEventDestroy(Event);
        hipEventRecord(Event, Stream);
        hipEventSynchronize(Event);
        hipEventQuery(Event);
        hipEventElapsedTime(*mut f32, Event, Event);
        hipIpcGetMemHandle(*mut hipIpcMemHandle_t, *mut c_void);
        hipIpcOpenMemHandle(*mut *mut c_void, hipIpcMemHandle_t, c_uint);
        hipIpcCloseMemHandle(*mut c_void);
        hipMemGetAllocationGranularity(*mut usize, *const hipMemAllocationProp, c_uint);
        hipMemCreate(*mut Handle, usize, *const hipMemAllocationProp, c_ulonglong);
        hipMemRelease(Handle);
        hipMemAddressReserve(*mut *mut c_void, usize, usize, *mut c_void, c_ulonglong);
        hipMemAddressFree(*mut c_void, usize);
        hipMemMap(*mut c_void, usize, usize, Handle, c_ulonglong);
        hipMemUnmap(*mut c_void, usize);
        hipMemSetAccess(*mut c_void, usize, *const hipMemAccessDesc, usize);
        hipMemExportToShareableHandle(*mut c_void, Handle, c_uint, c_ulonglong);
        hipMemImportFromShareableHandle(*mut Handle, *mut c_void, c_uint);
        hipModuleLoadData(*mut *mut c_void, *const c_void);
        hipModuleUnload(*mut c_void);
        hipModuleGetFunction(*mut *mut c_void, *mut c_void, *const c_char);
        hipModuleLaunchKernel(
            *mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Stream, *mut *mut c_void, *mut *mut c_void
        );
    }
    optional {
        hipMemGetHandleForAddressRange(*mut c_void, *mut c_void, usize, c_uint, c_ulonglong);
    }
}
