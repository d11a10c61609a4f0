//! mori-gpu: the GPU runtime layer of mori-rs.
//!
//! One [`Runtime`] is chosen at run time by [`detect`]: CUDA (the driver API in libcuda, opened
//! through `cudarc` with `dynamic-loading`) or HIP (libamdhip64). Nothing is linked at build
//! time: a binary starts on a host without either library and reports what is missing
//! ([`GpuError::NoRuntime`] names both libraries and why each was refused). `MORI_GPU_RUNTIME`
//! = `cuda` | `hip` | `auto` forces the choice.
//!
//! The runtime hands out owning objects that release their resource on drop:
//! [`DeviceBuffer`], [`PinnedBuffer`], [`Stream`], [`Event`], [`IpcMapping`], [`VmmAllocation`], [`Module`] /
//! [`Function`]; handles that cross processes ([`IpcHandle`] with the offset of a sub-allocation,
//! [`ShareableHandle`] for VMM POSIX FD / FABRIC handles, [`DmabufFd`]) have fixed byte
//! encodings, and [`fdpass`] moves file descriptors over Unix sockets.
//!
//! Every driver call's return code is checked and becomes a [`GpuError::Call`] naming the call,
//! the code and its name (`cuMemCreate failed: CUDA_ERROR_NOT_PERMITTED (800): FABRIC handles
//! need an IMEX channel ...`). HIP paths are compile-checked only: no machine of this project has
//! an AMD GPU.
//!
//! Tests: `tests/cpu.rs` (no driver: the no-runtime errors, encodings, pure pieces),
//! `tests/gpu.rs` (ignored; needs a CUDA device: run by `scripts/gpu-machine.sh`), and
//! `tests/fake_driver.rs`, which runs `tests/gpu.rs` in CI against a stand-in libcuda
//! (`tests/fake_cuda/fake_cuda.c`) that checks every argument mori-gpu passes.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod cuda;
mod error;
pub mod fdpass;
mod handles;
pub mod hip;
mod memory;
mod module;
mod pool;
mod runtime;
mod stream;
mod types;

pub use error::{cuda_error_name, hip_error_name, Attempt, GpuError, Result, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED};
pub use handles::{dmabuf_window, DmabufFd, HandleKinds, IpcHandle, ShareableHandle, ShareableKind, VmmOptions, RAW_HANDLE_LEN};
pub use memory::{DeviceBuffer, DeviceSlice, IpcMapping, PinnedBuffer, VmmAllocation};
pub use module::{Function, KernelArgs, KernelImages, Module, ModuleImage};
pub use pool::{
    armed_depth, env_switch, env_text, submit_stats, CopyDone, CopyPool, CopyPoolConfig, CopySeg, Lane, PagedCopy, PagedRun, PagedSide,
    SubmitStats, ARMED_ENV, ARMED_MAX, CARVEOUT_ENV, FLAGS_ENV, FLAG_FALLBACK, ORDERED_ENV, ORDERED_REST_MAX, ORDERED_SEGS,
    PAGED_INLINE_RUNS, RESIDENT_CARVEOUT, RESIDENT_DEADLINE, RESIDENT_ENV, RESIDENT_IDLE, RESIDENT_MAX_BLOCKS, SPIN_ENV,
};
pub use runtime::{detect, detect_with, Runtime};
pub use stream::{Event, Stream};
pub use types::{
    numa_node_from_sysfs, Capabilities, Device, DeviceProperties, LaunchConfig, MemInfo, PciBusId, RuntimeChoice, RuntimeKind, StreamWrite,
    WaitCondition, STREAM_WRITES_MAX,
};
