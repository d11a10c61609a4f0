//! The CUDA driver entry points this crate calls, resolved once from the library `cudarc` opens.
//!
//! Types and constants come from `cudarc::driver::sys` (`cuda-13000`). The function pointers are
//! declared here with the return code as a plain `c_uint` (and enum arguments as `c_uint`), so a
//! code newer than the bindings can never be an invalid Rust enum value, and a missing symbol is
//! an error at load time instead of a panic at first call.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_void};

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUevent, CUfunction, CUipcMemHandle, CUmemAccessDesc, CUmemAllocationProp, CUmodule, CUstream,
};

/// `CUresult` as returned by the driver.
pub(crate) type CuResult = c_uint;
/// `CUdeviceptr`.
pub(crate) type Dptr = c_ulonglong;
/// `CUmemGenericAllocationHandle`.
pub(crate) type MemHandle = c_ulonglong;

macro_rules! cuda_api {
    ($( $sym:ident ( $($arg:ty),* ); )*) => {
        /// Resolved driver entry points (names as exported by libcuda).
        pub(crate) struct CudaApi {
            $( pub(crate) $sym: unsafe extern "C" fn($($arg),*) -> CuResult, )*
        }

        impl CudaApi {
            /// Resolves every entry point; the first missing one is the error.
            pub(crate) fn load(lib: &'static libloading::Library) -> Result<Self, (&'static str, String)> {
                Ok(CudaApi {
                    $( $sym: {
                        // SAFETY: the symbol is the driver entry point of that name and the pointer
                        // type matches its C prototype in cuda.h (CUDA 13.0); the library is
                        // 'static, so the pointer never dangles.
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> CuResult>(
                                concat!(stringify!($sym), "\0").as_bytes(),
                            )
                        }
                        .map_err(|e| (stringify!($sym), e.to_string()))?;
                        *s
                    }, )*
                })
            }
        }
    };
}

cuda_api! {
    cuInit(c_uint);
    cuDriverGetVersion(*mut c_int);
    cuGetErrorName(c_uint, *mut *const c_char);
    cuDeviceGetCount(*mut c_int);
    cuDeviceGet(*mut CUdevice, c_int);
    cuDeviceGetName(*mut c_char, c_int, CUdevice);
    cuDeviceGetAttribute(*mut c_int, c_uint, CUdevice);
    cuDeviceGetPCIBusId(*mut c_char, c_int, CUdevice);
    cuDeviceTotalMem_v2(*mut usize, CUdevice);
    cuDevicePrimaryCtxRetain(*mut CUcontext, CUdevice);
    cuDevicePrimaryCtxRelease_v2(CUdevice);
    cuCtxSetCurrent(CUcontext);
    cuCtxGetCurrent(*mut CUcontext);
    cuCtxSynchronize();
    cuMemGetInfo_v2(*mut usize, *mut usize);
    cuDeviceCanAccessPeer(*mut c_int, CUdevice, CUdevice);
    cuCtxEnablePeerAccess(CUcontext, c_uint);
    cuMemAlloc_v2(*mut Dptr, usize);
    cuMemFree_v2(Dptr);
    cuMemHostAlloc(*mut *mut c_void, usize, c_uint);
    cuMemFreeHost(*mut c_void);
    cuMemHostGetDevicePointer_v2(*mut Dptr, *mut c_void, c_uint);
    cuMemGetAddressRange_v2(*mut Dptr, *mut usize, Dptr);
    cuMemcpyHtoD_v2(Dptr, *const c_void, usize);
    cuMemcpyDtoH_v2(*mut c_void, Dptr, usize);
    cuMemcpyDtoD_v2(Dptr, Dptr, usize);
    cuMemcpyPeer(Dptr, CUcontext, Dptr, CUcontext, usize);
    cuMemcpyHtoDAsync_v2(Dptr, *const c_void, usize, CUstream);
    cuMemcpyDtoHAsync_v2(*mut c_void, Dptr, usize, CUstream);
    cuMemcpyDtoDAsync_v2(Dptr, Dptr, usize, CUstream);
    cuMemcpyPeerAsync(Dptr, CUcontext, Dptr, CUcontext, usize, CUstream);
    cuMemsetD8_v2(Dptr, c_uchar, usize);
    cuMemsetD8Async(Dptr, c_uchar, usize, CUstream);
    cuStreamCreate(*mut CUstream, c_uint);
    cuStreamDestroy_v2(CUstream);
    cuStreamSynchronize(CUstream);
    cuStreamQuery(CUstream);
    cuStreamWaitEvent(CUstream, CUevent, c_uint);
    cuStreamWriteValue32_v2(CUstream, Dptr, u32, c_uint);
    cuStreamWaitValue32_v2(CUstream, Dptr, u32, c_uint);
    cuStreamBatchMemOp_v2(CUstream, c_uint, *mut c_void, c_uint);
    cuEventCreate(*mut CUevent, c_uint);
    cuEventDestroy_v2(CUevent);
    cuEventRecord(CUevent, CUstream);
    cuEventSynchronize(CUevent);
    cuEventQuery(CUevent);
    cuEventElapsedTime_v2(*mut f32, CUevent, CUevent);
    cuIpcGetMemHandle(*mut CUipcMemHandle, Dptr);
    cuIpcOpenMemHandle_v2(*mut Dptr, CUipcMemHandle, c_uint);
    cuIpcCloseMemHandle(Dptr);
    cuMemGetAllocationGranularity(*mut usize, *const CUmemAllocationProp, c_uint);
    cuMemCreate(*mut MemHandle, usize, *const CUmemAllocationProp, c_ulonglong);
    cuMemRelease(MemHandle);
    cuMemAddressReserve(*mut Dptr, usize, usize, Dptr, c_ulonglong);
    cuMemAddressFree(Dptr, usize);
    cuMemMap(Dptr, usize, usize, MemHandle, c_ulonglong);
    cuMemUnmap(Dptr, usize);
    cuMemSetAccess(Dptr, usize, *const CUmemAccessDesc, usize);
    cuMemExportToShareableHandle(*mut c_void, MemHandle, c_uint, c_ulonglong);
    cuMemImportFromShareableHandle(*mut MemHandle, *mut c_void, c_uint);
    cuMemGetHandleForAddressRange(*mut c_void, Dptr, usize, c_uint, c_ulonglong);
    cuModuleLoadDataEx(*mut CUmodule, *const c_void, c_uint, *mut c_uint, *mut *mut c_void);
    cuModuleUnload(CUmodule);
    cuModuleGetFunction(*mut CUfunction, CUmodule, *const c_char);
    cuFuncSetAttribute(CUfunction, c_uint, c_int);
    cuLaunchKernel(
        CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void
    );
}
