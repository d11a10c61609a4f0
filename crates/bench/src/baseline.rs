//! The bare-copy floor of a GPU transfer, measured inside bench_engine (`--copy-baseline`):
//! one `cuMemcpyDtoDAsync` (or HIP's) per segment on one stream, one event recorded after
//! them, spun on until it fired — between the very device addresses the engine's transfer
//! moves (the local buffer, and the remote buffer as mapped in this process), timed in
//! blocks that alternate with the engine's own, so both see the same GPU clocks, buffers and
//! machine state. This is the "one bare async copy plus event wait" of issue 7's latency
//! target, without the run-to-run drift of a separate bench_copy process.

use mori_gpu::{Device, DeviceSlice, Event, IpcMapping, Runtime, Stream};
use mori_io::{BackendKind, MemoryDesc};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a single event wait may spin before the run stops with an error.
pub const EVENT_DEADLINE: Duration = Duration::from_secs(30);

/// Spins on `ev` (`cuEventQuery`, no yielding) until it fired. `what` names the wait in an
/// error and is only called then (formatting it every iteration would add to the floor).
/// Errors: the driver's, or the event not firing within [`EVENT_DEADLINE`].
pub fn spin_event(ev: &Event, what: impl Fn() -> String) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        match ev.query() {
            Ok(true) => return Ok(()),
            Ok(false) if t0.elapsed() < EVENT_DEADLINE => std::hint::spin_loop(),
            Ok(false) => return Err(format!("{}: the event did not fire within {EVENT_DEADLINE:?}", what())),
            Err(e) => return Err(format!("{}: {e}", what())),
        }
    }
}

/// A stream, an event and both buffers' device addresses as seen from this process (see the
/// module docs). The remote buffer is reached the way the xgmi backend reaches it: its IPC
/// handle opened here (CUDA reference-counts a second open of the same handle in one
/// context: the same mapping), or its own address when the target lives in this process.
pub struct CopyBaseline {
    rt: Arc<dyn Runtime>,
    dev: Device,
    stream: Stream,
    event: Event,
    local: (u64, u64),
    remote: (u64, u64),
    /// Keeps the remote buffer mapped; closed on drop (before the target frees it: the
    /// initiator tears down first).
    _map: Option<IpcMapping>,
}

/// The device-address pairs (destination, source) of one iteration.
pub struct Views {
    pairs: Vec<(u64, u64, usize)>,
}

impl CopyBaseline {
    /// For the local buffer `local_len` bytes at device address `local_addr` of GPU `dev` and
    /// the peer's registered `remote` buffer (`same_process`: the target is a thread of this
    /// process, so its address is usable as it is). Errors: no GPU runtime, a remote
    /// descriptor without an xgmi IPC handle, or the handle failing to open.
    pub fn new(dev: u32, local_addr: u64, local_len: u64, remote: &MemoryDesc, same_process: bool) -> Result<Self, String> {
        let rt = mori_gpu::detect().map_err(|e| format!("--copy-baseline: {e}"))?;
        let dev = Device(dev);
        let (remote_addr, map) = if same_process {
            (remote.addr, None)
        } else {
            let bytes = remote
                .handle(BackendKind::Xgmi)
                .ok_or_else(|| format!("--copy-baseline: the target's memory {} carries no xgmi IPC handle", remote.id))?;
            let h = mori_gpu::IpcHandle::from_bytes(bytes).map_err(|e| format!("--copy-baseline: the target's IPC handle: {e}"))?;
            let m = rt.ipc_import(dev, &h).map_err(|e| format!("--copy-baseline: open the target's IPC handle on GPU {}: {e}", dev.0))?;
            (m.slice().ptr(), Some(m))
        };
        let stream = rt.stream(dev).map_err(|e| format!("--copy-baseline: stream on GPU {}: {e}", dev.0))?;
        let event = rt.event(dev, false).map_err(|e| format!("--copy-baseline: event on GPU {}: {e}", dev.0))?;
        Ok(CopyBaseline { rt, dev, stream, event, local: (local_addr, local_len), remote: (remote_addr, remote.len), _map: map })
    }

    /// The copies of one iteration: `msg` bytes at each offset of `offs`, local to remote for
    /// a write, remote to local for a read; slots that follow each other on both sides are one
    /// copy, as the engine merges them (`--batch-contiguous`). Errors: a slot past either
    /// buffer's end (named).
    pub fn views(&self, offs: &[u64], msg: u64, write: bool) -> Result<Views, String> {
        let len = usize::try_from(msg).map_err(|_| format!("--copy-baseline: {msg} bytes exceed usize"))?;
        let mut pairs = Vec::with_capacity(offs.len());
        for &o in offs {
            for (side, (_, n)) in [("local", self.local), ("remote", self.remote)] {
                if o.checked_add(msg).is_none_or(|end| end > n) {
                    return Err(format!("--copy-baseline: slot at offset {o} of {msg} bytes is past the {side} buffer's {n} bytes"));
                }
            }
            let (l, r) = (self.local.0 + o, self.remote.0 + o);
            let (dst, src) = if write { (r, l) } else { (l, r) };
            match pairs.last_mut() {
                Some((d, s, n)) if *d + *n as u64 == dst && *s + *n as u64 == src && len > 0 => *n += len,
                _ => pairs.push((dst, src, len)),
            }
        }
        Ok(Views { pairs })
    }

    /// One iteration: every copy of `v` queued, the event recorded, then spun on.
    pub fn once(&self, v: &Views) -> Result<(), String> {
        self.post(v)?;
        spin_event(&self.event, || "--copy-baseline: stop-and-wait copy".to_string())
    }

    /// [`CopyBaseline::once`], returning the time spent queueing and the time spent waiting.
    pub fn once_split(&self, v: &Views) -> Result<(Duration, Duration), String> {
        let t0 = Instant::now();
        self.post(v)?;
        let t1 = Instant::now();
        spin_event(&self.event, || "--copy-baseline: stop-and-wait copy".to_string())?;
        Ok((t1 - t0, t1.elapsed()))
    }

    fn post(&self, v: &Views) -> Result<(), String> {
        for &(dst, src, len) in &v.pairs {
            // SAFETY: `views` checked both ranges against the buffers' lengths; the local
            // buffer lives as long as the run, the remote one is mapped by `_map` (or lives in
            // this process) until the initiator's teardown, after the last iteration.
            let (d, s) = unsafe { (DeviceSlice::from_raw(dst, len, self.dev), DeviceSlice::from_raw(src, len, self.dev)) };
            self.rt.copy_dtod_async(&d, &s, &self.stream).map_err(|e| format!("--copy-baseline: copy: {e}"))?;
        }
        self.event.record(&self.stream).map_err(|e| format!("--copy-baseline: event record: {e}"))
    }
}
