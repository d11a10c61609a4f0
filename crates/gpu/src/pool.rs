//! [`CopyPool`]: device-to-device copies on a pool of streams per device, each batch closed by
//! an event, and one completion thread that calls the batch's callback when its event fired.
//! Transport backends queue copies here and learn of completion without blocking the caller.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{GpuError, Result};
use crate::memory::DeviceSlice;
use crate::stream::{Event, Stream};
use crate::types::Device;
use crate::Runtime;

/// One copy: `len` bytes from device address `src` to device address `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopySeg {
    /// Source device address.
    pub src: u64,
    /// Destination device address.
    pub dst: u64,
    /// Bytes.
    pub len: u64,
}

/// Settings of a [`CopyPool`].
#[derive(Debug, Clone)]
pub struct CopyPoolConfig {
    /// Streams per device the batches rotate over (at least 1).
    pub num_streams: usize,
    /// Most batches in flight per device, each with its event (at least 1).
    pub num_events: usize,
    /// How long [`CopyPool::copy`] waits for a free event slot before it gives up.
    pub admission_timeout: Duration,
}

impl Default for CopyPoolConfig {
    fn default() -> Self {
        CopyPoolConfig {
            num_streams: 64,
            num_events: 64,
            admission_timeout: Duration::from_secs(30),
        }
    }
}

/// Called once, from the completion thread, with the batch's outcome.
pub type CopyDone = Box<dyn FnOnce(Result<()>) + Send>;

struct DevPool {
    streams: Vec<Stream>,
    next: AtomicUsize,
    inflight: AtomicUsize,
}

struct Pending {
    event: Event,
    dev: Arc<DevPool>,
    done: CopyDone,
}

struct Shared {
    rt: Arc<dyn Runtime>,
    cfg: CopyPoolConfig,
    devs: Mutex<HashMap<u32, Arc<DevPool>>>,
    pending: Mutex<Vec<Pending>>,
    shutdown: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Streams and events per device plus a completion thread (see the module docs). Dropping it
/// stops the thread; batches still in flight then never call back.
pub struct CopyPool {
    shared: Arc<Shared>,
    reaper: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for CopyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CopyPool({:?})", self.shared.cfg)
    }
}

impl CopyPool {
    /// Starts the completion thread (named `thread_name`). Streams are created per device on
    /// first use. Errors: `InvalidArgument` for zero streams or events; `Io` if the thread
    /// cannot be spawned.
    pub fn new(rt: Arc<dyn Runtime>, cfg: CopyPoolConfig, thread_name: &str) -> Result<Self> {
        if cfg.num_streams == 0 || cfg.num_events == 0 {
            return Err(GpuError::invalid(format!(
                "copy pool: num_streams ({}) and num_events ({}) must be at least 1",
                cfg.num_streams, cfg.num_events
            )));
        }
        let shared = Arc::new(Shared {
            rt,
            cfg,
            devs: Mutex::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
            shutdown: AtomicBool::new(false),
        });
        let s2 = shared.clone();
        let reaper = std::thread::Builder::new()
            .name(thread_name.to_string())
            .spawn(move || s2.reap_loop())
            .map_err(|e| GpuError::io("spawn copy-pool completion thread", e))?;
        Ok(CopyPool {
            shared,
            reaper: Some(reaper),
        })
    }

    /// Queues `segs` (empty ones skipped) on the next stream of `dev`, records an event after
    /// them and returns; `done` runs on the completion thread once the event fired (or with the
    /// error the event reported). When `num_events` batches are already in flight on `dev` it
    /// waits for one to finish, at most `admission_timeout` (then `Io` with `TimedOut`).
    /// On an error return nothing of the batch is pending and `done` is dropped uncalled.
    ///
    /// # Safety
    /// Every segment's `src..src+len` and `dst..dst+len` must be device memory mapped in this
    /// process and accessible from `dev`, and must stay mapped until `done` has been called.
    pub unsafe fn copy(&self, dev: Device, segs: &[CopySeg], done: CopyDone) -> Result<()> {
        let s = &self.shared;
        let dp = s.dev_pool(dev)?;
        let t0 = Instant::now();
        while dp.inflight.load(Ordering::Acquire) >= s.cfg.num_events {
            if t0.elapsed() > s.cfg.admission_timeout {
                return Err(GpuError::io(
                    "copy pool admission",
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "{} copy batches still in flight on {dev} after {:?}",
                            s.cfg.num_events, s.cfg.admission_timeout
                        ),
                    ),
                ));
            }
            std::thread::yield_now();
        }
        let stream = &dp.streams[dp.next.fetch_add(1, Ordering::Relaxed) % dp.streams.len()];
        for seg in segs.iter().filter(|g| g.len > 0) {
            let len = usize::try_from(seg.len)
                .map_err(|_| GpuError::invalid(format!("copy of {} bytes exceeds usize", seg.len)))?;
            // SAFETY: forwarded contract: both ranges are mapped device memory of this process.
            let (d, sr) = unsafe { (DeviceSlice::from_raw(seg.dst, len, dev), DeviceSlice::from_raw(seg.src, len, dev)) };
            s.rt.copy_dtod_async(&d, &sr, stream)?;
        }
        let event = s.rt.event(dev, false)?;
        event.record(stream)?;
        dp.inflight.fetch_add(1, Ordering::AcqRel);
        lock(&s.pending).push(Pending { event, dev: dp, done });
        Ok(())
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        if let Some(h) = self.reaper.take() {
            let _ = h.join();
        }
    }
}

impl Shared {
    fn dev_pool(&self, dev: Device) -> Result<Arc<DevPool>> {
        if let Some(p) = lock(&self.devs).get(&dev.0) {
            return Ok(p.clone());
        }
        let streams = (0..self.cfg.num_streams).map(|_| self.rt.stream(dev)).collect::<Result<Vec<_>>>()?;
        let p = Arc::new(DevPool { streams, next: AtomicUsize::new(0), inflight: AtomicUsize::new(0) });
        Ok(lock(&self.devs).entry(dev.0).or_insert(p).clone())
    }

    /// Polls the events of pending batches: spins while any is pending (completion latency is
    /// what stop-and-wait transfers measure), backs off to short sleeps when idle.
    fn reap_loop(&self) {
        let mut idle = 0u32;
        while !self.shutdown.load(Ordering::Acquire) {
            let (done, left) = {
                let mut p = lock(&self.pending);
                let mut out = Vec::new();
                let mut i = 0;
                while i < p.len() {
                    match p[i].event.query() {
                        Ok(false) => i += 1,
                        Ok(true) => out.push((p.swap_remove(i), Ok(()))),
                        Err(e) => out.push((p.swap_remove(i), Err(e))),
                    }
                }
                (out, p.len())
            };
            if done.is_empty() {
                if left > 0 {
                    std::hint::spin_loop();
                    continue;
                }
                idle = idle.saturating_add(1);
                if idle < 256 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
                continue;
            }
            idle = 0;
            for (p, r) in done {
                p.dev.inflight.fetch_sub(1, Ordering::AcqRel);
                (p.done)(r);
            }
        }
    }
}
