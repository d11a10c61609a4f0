//! [`CopyPoolConfig`]: a pool's settings, and the environment variables that override some of
//! them.

use std::time::Duration;

use super::paged::PAGED_INLINE_RUNS;
#[cfg(doc)]
use super::CopyPool;
use crate::error::{GpuError, Result};

/// Settings of a [`CopyPool`].
#[derive(Debug, Clone)]
pub struct CopyPoolConfig {
    /// Streams per device (at least 1). A submission takes the first one with nothing in
    /// flight, else the next in turn.
    pub num_streams: usize,
    /// Most submissions in flight per device, each with its slot's event (at least 1).
    pub num_events: usize,
    /// How long a submission waits for a free slot before it gives up.
    pub admission_timeout: Duration,
    /// [`CopyPool::copy`] batches with at least this many segments use the scatter/gather
    /// kernel (default 32; 0 disables the kernel) ...
    pub kernel_threshold: usize,
    /// ... unless their segments average at least this many bytes (default 48 MiB): then one
    /// async copy per segment, each streaming through its own range, does not spread the
    /// kernel's threads over the whole batch at once (which thrashed the TLB on gigabyte IPC
    /// mappings). Measured on the H200, two processes, batch 128 (docs/PERFORMANCE.md): the
    /// kernel gave 1165-1510 GB/s for 4-32 MiB segments but 411-620 at 64 MiB; copies gave
    /// 533-616 GB/s at 4 MiB and 1402-1500 at 64 MiB.
    pub kernel_max_mean_bytes: u64,
    /// [`CopyPool::copy_paged`] passes run tables of at most this many runs in the kernel's
    /// parameters (no upload before the launch); larger ones are uploaded from pinned memory.
    /// Default and most: [`PAGED_INLINE_RUNS`] (320); 0 uploads every table. The environment
    /// variable `MORI_GPU_PAGED_INLINE_RUNS`, when set, overrides it ([`CopyPool::new`]).
    pub paged_inline_runs: usize,
    /// Whether the completion thread spins between completion steps while submissions are
    /// in flight (default: true, the lowest completion latency) or yields its core between
    /// them (for processes with more busy threads than cores, where a spinning thread can
    /// hold up the others' driver calls). The environment variable `MORI_GPU_POOL_SPIN`
    /// (`1` or `0`), when set, overrides it ([`CopyPool::new`]).
    pub spin_in_flight: bool,
    /// Whether completion steps learn that a submission finished from a flag word in mapped
    /// pinned host memory that the stream writes after the work (`Some(true)`), with the
    /// event asked only every [`FLAG_FALLBACK`] (to surface errors), or by polling its event
    /// (`Some(false)`). Reading memory takes no driver lock. `None` (the default): flags on
    /// CUDA, events on HIP (whose stream write documents no fence, and where the flag path
    /// never ran). The environment variable `MORI_GPU_POOL_FLAGS` (`1` or `0`), when set,
    /// overrides it ([`CopyPool::new`]). A device whose flag memory cannot be allocated or
    /// mapped uses events (warned once).
    ///
    /// Measured (docs/PERFORMANCE.md, events against flags in the same calls): bench_engine's
    /// batch-1 xgmi write latency on an H100, two alternating rounds, fell from 13.2-13.8 to
    /// 11.3 µs at 8 B, 13.6-14.0 to 11.7 at 1 MiB and 14.6-14.7 to 11.5-12.2 at 4 MiB (an
    /// H200 likewise); batch-128 bandwidth stayed within 2 % from 1 to 64 MiB; the
    /// inter-node EP figures stayed within their spread.
    pub host_flags: Option<bool>,
    /// Whether ordered batches ([`CopyPool::copy_in_order_with`]) of 1 to
    /// [`super::ORDERED_SEGS`] segments with at most [`super::ORDERED_REST_MAX`] bytes after
    /// the first go through one launch of the ordered-copy kernel, which also writes the
    /// completion flag (`Some(true)`), or as one async copy per segment and a flag write
    /// (`Some(false)`). `None` (the default): the kernel on CUDA, copies on HIP (where it never
    /// ran). The environment variable `MORI_GPU_POOL_ORDERED_KERNEL` (`1` or `0`), when set,
    /// overrides it ([`CopyPool::new`]). Needs the scatter/gather module (`kernel_threshold`
    /// above 0 and an image that loads); without it, copies.
    pub ordered_kernel: Option<bool>,
    /// Launches of the ordered-copy kernel armed ahead per device (0, the default: none; at
    /// most [`super::ARMED_MAX`]): each a stream wait on a doorbell word and a launch that
    /// reads its table from mapped host memory, so posting an ordered batch writes the table
    /// and the doorbell and makes no driver call (`pool/armed.rs`). Needs the ordered-copy
    /// kernel. Off by default because a stream waiting on its doorbell holds a hardware queue
    /// and anything that waits for the whole device waits for it, forever while nothing is
    /// posted: a device-wide synchronisation, and freeing device or pinned host memory
    /// (`cuMemFree`, `cuMemFreeHost`). Only for a process that gives every stream a queue of
    /// its own (`CUDA_DEVICE_MAX_CONNECTIONS`) and calls [`CopyPool::disarm`] before freeing
    /// anything while the pool lives. The environment variable
    /// `MORI_GPU_POOL_ARMED` (a number), when set, overrides it ([`CopyPool::new`]); HIP
    /// turns it off (never run on an AMD GPU).
    pub armed_depth: usize,
    /// Blocks of the resident copier per device (0, the default: none; at most
    /// [`super::RESIDENT_MAX_BLOCKS`], and cut to 4 per multiprocessor): a grid of the
    /// ordered-copy kernel that stays on the device and runs ordered batches as they are
    /// written into mapped host memory, so posting one makes no driver call
    /// (`pool/resident.rs`). A table whose group count does not divide the blocks, or one
    /// posted while all 16 table slots are in flight, is launched as before. The grid exits
    /// after [`CopyPoolConfig::resident_idle`] with nothing posted (a device-wide
    /// synchronisation or a `cuMemFree` waits for it until posting paused that long) and is
    /// launched again by the next post. Needs the ordered-copy kernel and completion flags.
    /// Off by default: its blocks stay on the device while it runs, all of them must be
    /// co-resident (a grid whose blocks did not all start within 100 ms turns the copier off),
    /// and its stream holds a hardware queue while it runs. The environment variable
    /// `MORI_GPU_POOL_RESIDENT` (a number of blocks), when set, overrides it
    /// ([`CopyPool::new`]); HIP turns it off (never run on an AMD GPU), and it turns
    /// `armed_depth` off (it takes the ordered batches first). [`CopyPool::disarm`] stops
    /// the grid.
    pub resident_blocks: u32,
    /// How long the resident copier's grid waits with nothing posted before it exits
    /// ([`super::RESIDENT_IDLE`] by default, 1 ms to 10 s): longer keeps it on the device
    /// between bursts (no launch when the next burst comes), shorter lets a device-wide
    /// synchronisation or a `cuMemFree` through sooner.
    pub resident_idle: Duration,
    /// The shared-memory split the resident copier's grid asks of the multiprocessors it
    /// stays on, in percent of the largest shared-memory configuration (-1: the driver's
    /// choice; [`super::RESIDENT_CARVEOUT`] by default; see [`crate::Function::set_shared_carveout`]).
    /// A multiprocessor changes its split only when empty, so one with a block of the grid
    /// keeps it for every kernel beside it: with the driver's choice (presumably little
    /// shared memory: the copier needs 240 bytes a block), kernels that need more shared
    /// memory per block than that split gives would find no room there (the likely cause of
    /// the slowdown in docs/PERFORMANCE.md; not yet proven). A split the driver refuses is
    /// logged and the grid runs with the driver's. The environment variable
    /// `MORI_GPU_POOL_RESIDENT_CARVEOUT`, when set, overrides it.
    pub resident_carveout: i32,
}

/// The environment variable that overrides [`CopyPoolConfig::host_flags`].
pub const FLAGS_ENV: &str = "MORI_GPU_POOL_FLAGS";

/// With completion flags, how often a completion step still asks a submission's event (an
/// asynchronous error sets no flag).
pub const FLAG_FALLBACK: Duration = Duration::from_millis(1);

/// The environment variable that overrides [`CopyPoolConfig::spin_in_flight`].
pub const SPIN_ENV: &str = "MORI_GPU_POOL_SPIN";

impl Default for CopyPoolConfig {
    fn default() -> Self {
        CopyPoolConfig {
            num_streams: 64,
            num_events: 64,
            admission_timeout: Duration::from_secs(30),
            kernel_threshold: 32,
            kernel_max_mean_bytes: 48 << 20,
            paged_inline_runs: PAGED_INLINE_RUNS,
            spin_in_flight: true,
            host_flags: None,
            ordered_kernel: None,
            armed_depth: 0,
            resident_blocks: 0,
            resident_idle: super::RESIDENT_IDLE,
            resident_carveout: super::RESIDENT_CARVEOUT,
        }
    }
}

/// The value of environment variable `name`, if set; `InvalidArgument` when it is not UTF-8.
pub fn env_text(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(GpuError::invalid(format!("{name}={v:?}: not UTF-8 text"))),
    }
}

/// `configured`, unless the value `env` of variable `name` says otherwise (`1` on, `0` off;
/// surrounding blanks ignored). Errors: `InvalidArgument` for any other value, naming the
/// variable.
pub fn env_switch(name: &str, configured: bool, env: Option<&str>) -> Result<bool> {
    match env.map(str::trim) {
        None => Ok(configured),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(v) => Err(GpuError::invalid(format!("{name}={v:?}: must be 1 (on) or 0 (off)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_that_is_not_utf8_is_refused_by_name() {
        use std::os::unix::ffi::OsStrExt;
        // A name no other test reads (tests share the process environment).
        let name = "MORI_GPU_TEST_NOT_UTF8";
        std::env::set_var(name, std::ffi::OsStr::from_bytes(b"1\xff"));
        let e = env_text(name).unwrap_err().to_string();
        std::env::remove_var(name);
        assert!(e.contains("MORI_GPU_TEST_NOT_UTF8=") && e.contains("not UTF-8"), "{e}");
        assert_eq!(env_text(name).unwrap(), None);
    }

    #[test]
    fn the_switch_variables_override_or_are_refused() {
        assert!(env_switch(SPIN_ENV, true, None).unwrap());
        assert!(!env_switch(SPIN_ENV, false, None).unwrap());
        assert!(!env_switch(SPIN_ENV, true, Some("0")).unwrap());
        assert!(env_switch(FLAGS_ENV, false, Some(" 1")).unwrap());
        let e = env_switch(SPIN_ENV, true, Some("yes")).unwrap_err().to_string();
        assert!(e.contains("MORI_GPU_POOL_SPIN=\"yes\"") && e.contains("must be 1"), "{e}");
    }
}
