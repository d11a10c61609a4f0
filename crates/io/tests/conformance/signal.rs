//! Signalled writes on any backend: the counter a write signals moves only after every byte of
//! the write is visible at the target, with the batch striped over every lane / QP; failed
//! batches and refused signals apply nothing.

use super::*;
use mori_io::{IoError, RegionBatch, Signal, SignalOp};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A zeroed, 8-byte aligned host buffer registered with an engine; freed on drop (after the
/// engine's deregistration, see [`Rig`]).
pub struct AlignedBuf {
    ptr: *mut u64,
    words: usize,
}

// SAFETY: the buffer is a plain allocation; the tests read it only where no transfer writes.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(bytes: usize) -> Self {
        let words = bytes.div_ceil(8).max(1);
        let b: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        AlignedBuf { ptr: Box::into_raw(b) as *mut u64, words }
    }
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }
    pub fn len(&self) -> usize {
        self.words * 8
    }
    /// `n` bytes at `off` (no transfer may be writing them).
    pub fn bytes(&self, off: usize, n: usize) -> &[u8] {
        assert!(off + n <= self.len());
        // SAFETY: in bounds (asserted); the caller reads only bytes no transfer is writing.
        unsafe { std::slice::from_raw_parts(self.as_mut_ptr().add(off), n) }
    }
    /// Fills every byte from `f(offset)` (before any transfer uses the buffer).
    pub fn fill(&self, f: impl Fn(usize) -> u8) {
        for o in 0..self.len() {
            // SAFETY: in bounds; nothing else touches the buffer yet.
            unsafe { *self.as_mut_ptr().add(o) = f(o) };
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: made by Box::into_raw of a boxed slice of `words` u64 in `new`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.words)) });
    }
}

/// Two engines; the initiator holds a patterned source region, the target a zeroed data
/// region and a counter region. Fields drop in order: engines before buffers.
pub struct Rig {
    pub init: IoEngine,
    pub target: IoEngine,
    pub src_mem: MemoryDesc,
    pub dst_mem: MemoryDesc,
    pub ctr_mem: MemoryDesc,
    pub src: AlignedBuf,
    pub dst: AlignedBuf,
    pub ctr: AlignedBuf,
}

fn pattern(o: usize) -> u8 {
    ((o as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 | 1
}

pub fn rig(data_bytes: usize, counters: usize, cfg: &dyn Fn() -> BackendConfig) -> Rig {
    let engine = |key: &str| {
        let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        e.create_backend(cfg()).unwrap();
        e
    };
    let (init, target) = (engine("sig-init"), engine("sig-target"));
    init.register_remote_engine(target.desc().clone()).unwrap();
    target.register_remote_engine(init.desc().clone()).unwrap();
    let (src, dst, ctr) = (AlignedBuf::new(data_bytes), AlignedBuf::new(data_bytes), AlignedBuf::new(counters * 8));
    src.fill(pattern);
    let host = MemLoc::Host { numa: None };
    // SAFETY: the buffers outlive the engines (field order of `Rig`) and every transfer is
    // waited for before the end.
    let (src_mem, dst_mem, ctr_mem) = unsafe {
        (
            init.register_memory(src.as_mut_ptr(), src.len(), host).unwrap(),
            target.register_memory(dst.as_mut_ptr(), dst.len(), host).unwrap(),
            target.register_memory(ctr.as_mut_ptr(), ctr.len(), host).unwrap(),
        )
    };
    Rig { init, target, src_mem, dst_mem, ctr_mem, src, dst, ctr }
}

/// Write `i` of the conformance run: its entries (offsets into both regions, lengths), each
/// entry followed by an 8-byte gap that must stay zero, so entries never merge and a batch
/// spreads over every lane / QP.
#[derive(Debug, Clone)]
pub struct Planned {
    pub offs: Vec<u64>,
    pub sizes: Vec<u64>,
    /// The slot: `[start, end)` of the target region covered by this write and its gaps.
    pub slot: (u64, u64),
}

/// `n` writes of 1 B..64 KiB (2^(i mod 17) plus a little), 1..=8 entries each, laid out one
/// after another; returns them and the bytes they need.
pub fn plan_writes(n: usize) -> (Vec<Planned>, usize) {
    let mut at = 0u64;
    let mut v = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let total = ((1u64 << (i % 17)) + (i * 37) % 61).min(65536);
        let k = (1 + i % 8).min(total);
        let start = at;
        let (mut offs, mut sizes) = (Vec::new(), Vec::new());
        for e in 0..k {
            let len = if e + 1 == k { total - (total / k) * (k - 1) } else { total / k };
            offs.push(at);
            sizes.push(len);
            at += len + 8;
        }
        at = at.next_multiple_of(8);
        // Posted in reverse order: the backend sorts and spreads them.
        offs.reverse();
        sizes.reverse();
        v.push(Planned { offs, sizes, slot: (start, at) });
    }
    (v, at as usize)
}

/// What the checker saw.
#[derive(Debug, Default)]
pub struct Checked {
    pub verified: usize,
    pub verified_while_writing: usize,
    pub mismatches: usize,
    pub first_mismatch: Option<String>,
}

/// Verifies write `i` at the target: its entries equal the source, its gaps are zero.
fn verify(r: &Rig, p: &Planned) -> Result<(), String> {
    let mut covered: Vec<(u64, u64)> = p.offs.iter().zip(&p.sizes).map(|(&o, &n)| (o, n)).collect();
    covered.sort_unstable();
    let mut at = p.slot.0;
    for (o, n) in covered {
        if r.dst.bytes(at as usize, (o - at) as usize).iter().any(|&b| b != 0) {
            return Err(format!("gap bytes {at}..{o} changed"));
        }
        let (got, want) = (r.dst.bytes(o as usize, n as usize), r.src.bytes(o as usize, n as usize));
        if let Some(k) = got.iter().zip(want).position(|(g, w)| g != w) {
            return Err(format!("byte {} of entry at {o} (+{n}) is {:#04x}, the source has {:#04x}", k, got[k], want[k]));
        }
        at = o + n;
    }
    if r.dst.bytes(at as usize, (p.slot.1 - at) as usize).iter().any(|&b| b != 0) {
        return Err(format!("gap bytes {at}..{} changed", p.slot.1));
    }
    Ok(())
}

/// The conformance run: `n` signalled writes, up to `window` in flight; write `i` sets counter
/// `i` to `i + 1` and adds 1 to counter `n`. A checker thread on the target spins on the
/// counters and, for each one it sees set, verifies every byte of that write (and its gaps).
/// Asserts every write verified, no mismatch, and the shared counter `n`. Returns what the
/// checker saw and the writer's time.
pub fn signalled_writes(cfg: &dyn Fn() -> BackendConfig, n: usize, window: usize, deadline: Duration) -> (Checked, Duration) {
    let (plan, bytes) = plan_writes(n);
    let r = rig(bytes, n + 1, cfg);
    let writing = AtomicBool::new(true);
    let start = Instant::now();
    let (checked, took) = std::thread::scope(|s| {
        let checker = s.spawn(|| {
            let mut c = Checked::default();
            let mut done = vec![false; n];
            while c.verified < n && start.elapsed() < deadline {
                let still_writing = writing.load(Ordering::Acquire);
                for (i, p) in plan.iter().enumerate() {
                    if done[i] {
                        continue;
                    }
                    let v = r.target.load_counter(&r.ctr_mem, 8 * i as u64).unwrap();
                    if v == 0 {
                        continue;
                    }
                    done[i] = true;
                    c.verified += 1;
                    if still_writing {
                        c.verified_while_writing += 1;
                    }
                    let bad = if v != i as u64 + 1 { Err(format!("counter {i} is {v}, not {}", i + 1)) } else { verify(&r, p) };
                    if let Err(m) = bad {
                        c.mismatches += 1;
                        c.first_mismatch.get_or_insert(format!("write {i}: {m}"));
                    }
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            c
        });
        let mut inflight: VecDeque<(usize, mori_io::TransferStatus)> = VecDeque::new();
        for (i, p) in plan.iter().enumerate() {
            if inflight.len() >= window {
                let (j, st) = inflight.pop_front().unwrap();
                st.wait_for(deadline).unwrap_or_else(|e| panic!("signalled write {j}: {e}"));
            }
            let b = RegionBatch {
                local: &r.src_mem,
                local_offs: &p.offs,
                remote: &r.dst_mem,
                remote_offs: &p.offs,
                sizes: &p.sizes,
                id: r.init.allocate_transfer_uid(),
            };
            let sigs = [
                Signal { remote: r.ctr_mem.clone(), offset: 8 * i as u64, op: SignalOp::Set(i as u64 + 1) },
                Signal { remote: r.ctr_mem.clone(), offset: 8 * n as u64, op: SignalOp::Add(1) },
            ];
            inflight.push_back((i, r.init.post_signalled(&b, &sigs)));
        }
        for (j, st) in inflight {
            st.wait_for(deadline).unwrap_or_else(|e| panic!("signalled write {j}: {e}"));
        }
        let took = start.elapsed();
        writing.store(false, Ordering::Release);
        (checker.join().unwrap(), took)
    });
    assert_eq!(checked.mismatches, 0, "first: {:?}", checked.first_mismatch);
    assert_eq!(checked.verified, n, "the checker verified {} of {n} writes before its deadline", checked.verified);
    assert_eq!(r.target.wait_counter(&r.ctr_mem, 8 * n as u64, n as u64, T).unwrap(), n as u64);
    assert_eq!(r.target.load_counter(&r.ctr_mem, 8 * n as u64).unwrap(), n as u64, "no signal applied twice");
    // Bytes behind the last slot were never written.
    assert!(r.dst.bytes(plan[n - 1].slot.1 as usize, r.dst.len() - plan[n - 1].slot.1 as usize).iter().all(|&b| b == 0));
    (checked, took)
}

/// The same `n` writes as [`signalled_writes`], without signals (a baseline): the writer's
/// time, up to `window` in flight.
pub fn plain_writes(cfg: &dyn Fn() -> BackendConfig, n: usize, window: usize) -> Duration {
    let (plan, bytes) = plan_writes(n);
    let r = rig(bytes, 1, cfg);
    let start = Instant::now();
    let mut inflight = VecDeque::new();
    for p in &plan {
        if inflight.len() >= window {
            let st: mori_io::TransferStatus = inflight.pop_front().unwrap();
            st.wait_for(T).unwrap();
        }
        let id = r.init.allocate_transfer_uid();
        inflight.push_back(r.init.batch_write(&r.src_mem, &p.offs, &r.dst_mem, &p.offs, &p.sizes, id));
    }
    for st in inflight {
        st.wait_for(T).unwrap();
    }
    let took = start.elapsed();
    for (i, p) in plan.iter().enumerate() {
        verify(&r, p).unwrap_or_else(|m| panic!("plain write {i}: {m}"));
    }
    took
}

fn assert_err(r: Result<(), IoError>, code: ErrorCode, words: &[&str]) -> IoError {
    let e = r.expect_err("an error");
    assert_eq!(e.code, code, "{e}");
    for w in words {
        assert!(e.msg.contains(w), "{w:?} not in: {e}");
    }
    e
}

/// Errors: a failed batch applies no signal; bad counters are refused before anything moves;
/// the target re-checks against its own registration; deregistered counters; timeouts.
/// `forged_words`: what the backend reports for a write outside the target's registration.
pub fn signal_errors(cfg: &dyn Fn() -> BackendConfig, forged_words: &[&str]) {
    let r = rig(1 << 16, 16, cfg);
    let (a, t) = (&r.init, &r.target);
    let c = &r.ctr_mem;
    let sig = |offset: u64, op: SignalOp| Signal { remote: c.clone(), offset, op };
    let post = |remote: &MemoryDesc, off: u64, sigs: &[Signal]| {
        let id = a.allocate_transfer_uid();
        a.post_signalled(
            &RegionBatch { local: &r.src_mem, local_offs: &[0, 2048], remote, remote_offs: &[off, off + 4096], sizes: &[1024, 1024], id },
            sigs,
        )
        .wait_for(T)
    };

    // A good one first: data and counter.
    post(&r.dst_mem, 0, &[sig(0, SignalOp::Add(5)), sig(8, SignalOp::Set(77))]).unwrap();
    assert_eq!(t.load_counter(c, 0).unwrap(), 5);
    assert_eq!(t.load_counter(c, 8).unwrap(), 77);
    assert_eq!(r.dst.bytes(4096, 1024), r.src.bytes(2048, 1024));

    // A batch refused at once (remote range out of bounds): no signal.
    assert_err(
        post(&r.dst_mem, 64_000, &[sig(0, SignalOp::Add(1))]),
        ErrorCode::InvalidArgs,
        &["entry 1: remote range offset 68096 + length 1024 exceeds region"],
    );
    // A batch the target refuses (a forged, larger descriptor): no signal.
    let mut forged = r.dst_mem.clone();
    forged.len = 1 << 30;
    assert_err(post(&forged, 1 << 20, &[sig(0, SignalOp::Add(1))]), ErrorCode::InvalidArgs, forged_words);
    // Ops of one request apply in order: Set then Add.
    a.signal(&[sig(16, SignalOp::Set(40)), sig(16, SignalOp::Add(2))]).wait_for(T).unwrap();
    assert_eq!(t.load_counter(c, 16).unwrap(), 42);
    assert_eq!(t.load_counter(c, 0).unwrap(), 5, "the failed batches applied nothing");

    // Counters the initiator refuses, before anything is posted.
    let before = r.dst.bytes(8192, 8192).to_vec();
    let e = assert_err(post(&r.dst_mem, 8192, &[sig(124, SignalOp::Add(1))]), ErrorCode::InvalidArgs, &[]);
    assert_eq!(e.msg, format!("signal 0: counter at offset 124 (8 bytes) exceeds memory {} of 128 bytes", c.id));
    let e = assert_err(post(&r.dst_mem, 8192, &[sig(0, SignalOp::Add(1)), sig(4, SignalOp::Add(1))]), ErrorCode::InvalidArgs, &[]);
    assert!(e.msg.starts_with(&format!("signal 1: counter at offset 4 of memory {} lies at address", c.id)), "{e}");
    assert!(e.msg.ends_with("not 8-byte aligned"), "{e}");
    let mut gpu = c.clone();
    gpu.loc = MemLoc::Gpu { device: 0 };
    let e = assert_err(
        post(&r.dst_mem, 8192, &[Signal { remote: gpu, offset: 0, op: SignalOp::Add(1) }]),
        ErrorCode::NotSupported,
        &["signal 0: counter at offset 0 of memory", "GPU memory (device 0)"],
    );
    assert!(e.msg.contains(&format!("memory {}", c.id)), "{e}");
    let mut other = c.clone();
    other.engine_key = "somebody-else".into();
    assert_err(
        post(&r.dst_mem, 8192, &[sig(0, SignalOp::Add(1)), Signal { remote: other.clone(), offset: 0, op: SignalOp::Add(1) }]),
        ErrorCode::InvalidArgs,
        &["signal 1 names memory", "of engine \"somebody-else\", but the batch's remote memory is at engine \"sig-target\""],
    );
    assert_err(
        a.signal(&[sig(0, SignalOp::Add(1)), Signal { remote: other, offset: 0, op: SignalOp::Add(1) }]).wait_for(T),
        ErrorCode::InvalidArgs,
        &["signal 1 names memory", "but signal 0 is at engine \"sig-target\""],
    );
    assert_err(a.signal(&[]).wait_for(T), ErrorCode::InvalidArgs, &["no signals given"]);
    let many: Vec<Signal> = (0..4097).map(|_| sig(0, SignalOp::Add(1))).collect();
    assert_err(a.signal(&many).wait_for(T), ErrorCode::InvalidArgs, &["4097 signals in one call, at most 4096"]);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(r.dst.bytes(8192, 8192), &before[..], "refused signalled writes posted nothing");
    assert_eq!(t.load_counter(c, 0).unwrap(), 5, "refused signals applied nothing");

    // The target re-checks against its registration (128 bytes) whatever the descriptor says.
    let mut bigger = c.clone();
    bigger.len = 1 << 20;
    let e = assert_err(
        post(&r.dst_mem, 8192, &[Signal { remote: bigger, offset: 4096, op: SignalOp::Add(1) }]),
        ErrorCode::InvalidArgs,
        &[
            "the batch's data landed, but signal 0 (counter at offset 4096 of memory",
            ") was not applied: engine \"sig-target\": counter at offset 4096 (8 bytes) exceeds memory",
            "of 128 bytes",
        ],
    );
    assert!(e.msg.contains(&format!("of memory {}", c.id)), "{e}");
    assert_eq!(r.dst.bytes(12288, 1024), r.src.bytes(2048, 1024), "that batch's data landed");

    // Local counter reads and waits.
    let e = assert_err(t.load_counter(c, 128).map(|_| ()), ErrorCode::InvalidArgs, &[]);
    assert_eq!(e.msg, format!("counter at offset 128 (8 bytes) exceeds memory {} of 128 bytes", c.id));
    assert_err(t.load_counter(c, 12).map(|_| ()), ErrorCode::InvalidArgs, &["not 8-byte aligned"]);
    assert_err(a.load_counter(c, 0).map(|_| ()), ErrorCode::InvalidArgs, &["belongs to engine \"sig-target\", not to this engine"]);
    let t0 = Instant::now();
    let e = assert_err(t.wait_counter(c, 24, 1, Duration::from_millis(50)).map(|_| ()), ErrorCode::Timeout, &[]);
    assert!(t0.elapsed() >= Duration::from_millis(50));
    assert_eq!(e.msg, format!("counter at offset 24 of memory {} is 0, still below 1 after the deadline of 0.050 s", c.id));
    assert_eq!(t.wait_counter(c, 16, 42, Duration::ZERO).unwrap(), 42, "a counter already there needs no wait");

    // A counter region deregistered at the target: refused there, named.
    let extra = AlignedBuf::new(64);
    // SAFETY: `extra` outlives its registration, removed below before it drops.
    let xm = unsafe { t.register_memory(extra.as_mut_ptr(), extra.len(), MemLoc::Host { numa: None }) }.unwrap();
    a.signal(&[Signal { remote: xm.clone(), offset: 8, op: SignalOp::Add(3) }]).wait_for(T).unwrap();
    assert_eq!(t.load_counter(&xm, 8).unwrap(), 3);
    t.deregister_memory(&xm).unwrap();
    let e = assert_err(
        a.signal(&[sig(32, SignalOp::Add(1)), Signal { remote: xm.clone(), offset: 8, op: SignalOp::Add(1) }]).wait_for(T),
        ErrorCode::NotFound,
        &[],
    );
    assert_eq!(
        e.msg,
        format!(
            "signal 1 (counter at offset 8 of memory {id}) was not applied: engine \"sig-target\": memory {id} is not registered \
             (never, or deregistered)",
            id = xm.id
        )
    );
    assert_eq!(t.load_counter(c, 32).unwrap(), 1, "the other signal of that request was applied");
    assert_err(t.load_counter(&xm, 8).map(|_| ()), ErrorCode::NotFound, &["is not registered"]);
    assert_eq!(extra.bytes(8, 8), &3u64.to_le_bytes(), "nothing touched the deregistered counter");
}
