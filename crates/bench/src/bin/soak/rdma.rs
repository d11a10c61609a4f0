//! Phase `rdma-burst`: two engines in this process with the rdma backend (one rxe device in
//! the SoftRoCE guest; each engine its own QPs and CQ), `--qps` QPs per transfer, `--count`
//! rounds of the three steps below. This process's RSS, FDs and threads are sampled after
//! each step; with 3 rounds or more they must stay within `--tolerance-pct` of their values
//! after the first round (its warm-up: it touches the QPs' queues, and the reconnect after
//! the first failure makes a second set); with fewer they are shown only.
//!
//! 1. **Bursts**: one `batch_write` and one `batch_read` of `--batch`
//!    entries of `--entry-bytes`, contiguous locally and with a gap of one entry between
//!    entries remotely (nothing merges: one work request per entry, spread over the QPs).
//!    Every byte is checked, so are the gap bytes (untouched), and the target pops the
//!    write's inbound status. A CQ overrun or a QP error shows as a failed or hung transfer.
//! 2. **A failing batch behind a valid one**: an entry of a batch always names the batch's
//!    one remote region, so "an entry whose region was deregistered just before" is built as
//!    two batches of that shape posted back to back on the same QPs: the first to a valid
//!    region, the second to a region the target deregistered just before (its sessions were
//!    made while it was registered). Checked: the first succeeds with every byte in place (a
//!    neighbour's failure does not hurt it); the second fails with the remote access error;
//!    it names the failed batch entries, in its error text (`entry N`) and in its per-entry
//!    outcomes (`TransferStatus::failed_entries`), the checks tagged [`ENTRY_NAMING`]; it is
//!    terminal only once every entry ended (the initiator's deregistration of its source
//!    region, drain deadline [`DRAIN_PROBE`], finds no operation still using it); none of its
//!    bytes landed and `entry_landed` says so for every entry; and the connection then
//!    recovers (a further burst succeeds).
//! 3. **A batch whose source is deregistered mid-way**: a `batch_read` of the same shape, the
//!    target deregistering the source region from another thread half the last read burst's
//!    time after the post began. Entries that ran before
//!    land, later ones fail: checked that the status ends only after every entry ended (the
//!    deregistration probe, and no byte of the destination changes after the status ended),
//!    that every entry is either wholly landed or untouched, that no entry `entry_landed`
//!    calls landed is missing (the reverse is allowed: the outcomes are conservative), and
//!    that the failure names entries as in 2. When the whole batch ran before the
//!    deregistration, this step says so and checks the bytes (not a failure: nothing to
//!    observe).

use crate::stats::{report, Series};
use crate::{Budget, Opts};
use mori_io::{BackendConfig, EngineConfig, ErrorCode, IoEngine, IoError, MemLoc, MemoryDesc, RdmaConfig, Session, TransferStatus};
use std::time::{Duration, Instant};

const INIT_KEY: &str = "soak-rdma-init";
const TARGET_KEY: &str = "soak-rdma-target";
/// The initiator's drain deadline: right after a status ended, deregistering its local
/// region must not find an operation still using it for this long.
pub const DRAIN_PROBE: Duration = Duration::from_millis(200);
/// Longest one burst may take (within the time limit).
const BURST_BOUND: Duration = Duration::from_secs(600);
/// Tags the checks that a failed batch names its failed entries (error text `entry N`,
/// `TransferStatus::failed_entries`), reported apart in the verdict.
pub const ENTRY_NAMING: &str = "[entry naming]";
/// From this many rounds on, this process's resources after the first round decide too.
pub const ROUNDS_FOR_FLAT: u64 = 3;
/// The value remote gaps and untouched destinations hold.
const SENTINEL: u8 = 0x5a;

/// A registered host buffer; deregistered (waiting for its operations) by [`Buf::release`],
/// leaked when that never succeeds.
struct Buf {
    v: Vec<u8>,
    mem: Option<MemoryDesc>,
}

impl Buf {
    fn new(eng: &IoEngine, len: usize, fill: u8) -> Result<Buf, String> {
        let mut v = vec![fill; len];
        // SAFETY: the vector is never resized, and freed only after a successful
        // deregistration (`release`, which waits for the operations using it) or leaked.
        let mem = unsafe { eng.register_memory(v.as_mut_ptr(), len, MemLoc::Host { numa: None }) }
            .map_err(|e| format!("register {len} bytes: {e}"))?;
        Ok(Buf { v, mem: Some(mem) })
    }
    fn mem(&self) -> &MemoryDesc {
        self.mem.as_ref().expect("a registered buffer")
    }
    /// Deregisters, retrying the drain until `bound`; returns how long it waited.
    fn release(&mut self, eng: &IoEngine, bound: Duration) -> Result<Duration, String> {
        let Some(m) = self.mem.take() else { return Ok(Duration::ZERO) };
        let t = Instant::now();
        loop {
            match eng.deregister_memory(&m) {
                Ok(()) => return Ok(t.elapsed()),
                Err(e) if e.code == ErrorCode::Timeout && t.elapsed() < bound => continue,
                Err(e) => {
                    std::mem::forget(std::mem::take(&mut self.v));
                    return Err(format!("deregistering memory {}: {e} (buffer leaked)", m.id));
                }
            }
        }
    }
}

/// The batch shape: local offsets, remote offsets, sizes.
struct Shape {
    lo: Vec<u64>,
    ro: Vec<u64>,
    sz: Vec<u64>,
    eb: usize,
}

impl Shape {
    fn new(n: usize, eb: usize) -> Shape {
        Shape {
            lo: (0..n).map(|i| (i * eb) as u64).collect(),
            ro: (0..n).map(|i| (2 * i * eb) as u64).collect(),
            sz: vec![eb as u64; n],
            eb,
        }
    }
    fn n(&self) -> usize {
        self.sz.len()
    }
    fn local_len(&self) -> usize {
        self.n() * self.eb
    }
    fn remote_len(&self) -> usize {
        2 * self.n() * self.eb
    }
    /// Entry `i` of a local buffer.
    fn local<'a>(&self, b: &'a [u8], i: usize) -> &'a [u8] {
        &b[i * self.eb..(i + 1) * self.eb]
    }
    /// Entry `i` of a remote buffer, and the gap after it.
    fn remote<'a>(&self, b: &'a [u8], i: usize) -> (&'a [u8], &'a [u8]) {
        let o = 2 * i * self.eb;
        (&b[o..o + self.eb], &b[o + self.eb..o + 2 * self.eb])
    }
}

fn pattern(round: u64, i: usize, k: usize) -> u8 {
    let h = (round.wrapping_mul(0x1000_0001) ^ ((i as u64) << 8) ^ k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    match (h >> 56) as u8 {
        SENTINEL => SENTINEL ^ 0xff,
        v => v,
    }
}

/// The index N of the first `entry N` in `msg`.
pub fn named_entry(msg: &str) -> Option<usize> {
    let mut rest = msg;
    while let Some(p) = rest.find("entry ") {
        rest = &rest[p + 6..];
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if let Ok(n) = digits.parse() {
            return Some(n);
        }
    }
    None
}

fn engine(key: &str, cfg: &RdmaConfig, drain: Option<Duration>) -> Result<IoEngine, String> {
    let mut ec = EngineConfig::new("127.0.0.1", 0).map_err(|e| e.to_string())?;
    if let Some(d) = drain {
        ec.drain_timeout = d;
    }
    let e = IoEngine::new(key, ec).map_err(|e| format!("engine {key}: {e}"))?;
    e.create_backend(BackendConfig::Rdma(cfg.clone())).map_err(|e| format!("engine {key}: rdma backend: {e}"))?;
    Ok(e)
}

/// Outcome lines of the checks; the phase fails when one failed.
#[derive(Default)]
struct Checks {
    lines: Vec<(bool, String)>,
    /// Put before every line (the round).
    prefix: String,
}

impl Checks {
    fn pass(&mut self, what: impl Into<String>) {
        let w = format!("{}{}", self.prefix, what.into());
        println!("  ok    {w}");
        self.lines.push((true, w));
    }
    fn fail(&mut self, what: impl Into<String>) {
        let w = format!("{}{}", self.prefix, what.into());
        println!("  FAIL  {w}");
        self.lines.push((false, w));
    }
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        if ok {
            self.pass(what)
        } else {
            self.fail(what)
        }
    }
}

fn wait(st: &TransferStatus, budget: &Budget) -> (Result<(), IoError>, Duration) {
    let t = Instant::now();
    let r = st.wait_for(budget.left().min(BURST_BOUND));
    (r, t.elapsed())
}

fn pop_within(eng: &IoEngine, from: &str, id: u64, bound: Duration) -> Option<Result<(), IoError>> {
    let t = Instant::now();
    loop {
        if let Some(r) = eng.pop_inbound_status(from, id) {
            return Some(r);
        }
        if t.elapsed() >= bound {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Rig<'a> {
    o: &'a Opts,
    budget: Budget,
    init: IoEngine,
    tgt: IoEngine,
    shape: Shape,
    checks: Checks,
    series: Series,
    /// How long the last read burst took (the mid-way step deregisters half-way through).
    read_time: Duration,
}

/// Runs the phase.
pub fn run(o: &Opts) -> Result<(), String> {
    let budget = Budget::new(o.time_limit);
    let cfg = RdmaConfig { qps_per_transfer: o.qps, ..RdmaConfig::from_env().map_err(|e| e.to_string())? };
    let init = engine(INIT_KEY, &cfg, Some(DRAIN_PROBE))?;
    let tgt = engine(TARGET_KEY, &cfg, None)?;
    init.register_remote_engine(tgt.desc().clone()).map_err(|e| e.to_string())?;
    let mut rig = Rig {
        o,
        budget,
        init,
        tgt,
        shape: Shape::new(o.batch, o.entry_bytes),
        checks: Checks::default(),
        series: Series::new("step", vec![("this process".into(), o.count >= ROUNDS_FOR_FLAT)]),
        read_time: Duration::ZERO,
    };
    let r = rig.all();
    let failed: Vec<&String> = rig.checks.lines.iter().filter(|(ok, _)| !ok).map(|(_, w)| w).collect();
    let naming = failed.iter().filter(|w| w.contains(ENTRY_NAMING)).count();
    let decides = o.count >= ROUNDS_FOR_FLAT;
    println!(
        "resources of this process, one sample per step (3 per round){}:",
        if decides { ", against the sample after the first round" } else { " (informational: fewer than 3 rounds)" }
    );
    // Steps 1..=3 are the first round: the sample at 3 is the reference.
    print!("{}", rig.series.table(3));
    let (text, flat) = report(&rig.series.drifts(3, o.tolerance_pct), o.tolerance_pct);
    print!("{text}");
    r?;
    if failed.is_empty() && flat {
        return Ok(());
    }
    if failed.is_empty() {
        return Err(format!("this process's resources are not flat within ±{} % after the first round (table above)", o.tolerance_pct));
    }
    Err(format!("{} of {} checks failed ({naming} of them {ENTRY_NAMING}); first: {}", failed.len(), rig.checks.lines.len(), failed[0]))
}

impl Rig<'_> {
    fn sample(&mut self, step: u64) -> Result<(), String> {
        self.series.take(step, self.budget.elapsed().as_secs_f64(), &[std::process::id()]).map(|_| ())
    }

    fn all(&mut self) -> Result<(), String> {
        let (n, eb, qps) = (self.shape.n(), self.shape.eb, self.o.qps);
        println!("rdma-burst: {qps} QPs per transfer, batch {n} × {eb} B (one WR per entry), {} round(s)", self.o.count);
        let mut src = Buf::new(&self.init, self.shape.local_len(), 0)?;
        let mut back = Buf::new(&self.init, self.shape.local_len(), 0)?;
        let mut dst = Buf::new(&self.tgt, self.shape.remote_len(), SENTINEL)?;
        let ws = self.init.create_session(src.mem(), dst.mem()).map_err(|e| format!("session: {e}"))?;
        let rs = self.init.create_session(back.mem(), dst.mem()).map_err(|e| format!("session: {e}"))?;
        println!("  backend {:?}", ws.backend());
        self.sample(0)?;
        let r = (|| {
            for round in 0..self.o.count {
                self.budget.check(round, self.o.count, "rounds")?;
                self.checks.prefix = format!("round {round}: ");
                self.burst(round, &ws, &rs, &mut src, &mut back, &mut dst)?;
                self.sample(3 * round + 1)?;
                self.failing_behind_valid(round, &ws, &mut src, &mut dst)?;
                self.sample(3 * round + 2)?;
                self.midway(round)?;
                self.sample(3 * round + 3)?;
            }
            Ok(())
        })();
        drop((ws, rs));
        let bound = self.budget.left().max(Duration::from_secs(30));
        for (b, e) in [(&mut src, &self.init), (&mut back, &self.init), (&mut dst, &self.tgt)] {
            if let Err(err) = b.release(e, bound) {
                self.checks.fail(format!("teardown: {err}"));
            }
        }
        r
    }

    /// One write and one read burst; every byte checked.
    fn burst(&mut self, round: u64, ws: &Session, rs: &Session, src: &mut Buf, back: &mut Buf, dst: &mut Buf) -> Result<(), String> {
        let (n, eb, sh) = (self.shape.n(), self.shape.eb, &self.shape);
        for i in 0..n {
            for k in 0..eb {
                src.v[i * eb + k] = pattern(round, i, k);
            }
        }
        dst.v.fill(SENTINEL);
        back.v.fill(0);
        let id = self.init.allocate_transfer_uid();
        let t = Instant::now();
        let st = ws.batch_write(&sh.lo, &sh.ro, &sh.sz, id);
        let posted = t.elapsed();
        let (r, took) = wait(&st, &self.budget);
        let took = posted + took;
        let rate = n as f64 / took.as_secs_f64();
        match r {
            Err(e) => {
                self.checks.fail(format!("write burst failed after {took:?}: {e}"));
                return Err(format!("round {round}: the write burst failed: {e}"));
            }
            Ok(()) => {
                let bad = (0..n)
                    .find(|&i| sh.remote(&dst.v, i).0 != sh.local(&src.v, i) || sh.remote(&dst.v, i).1.iter().any(|&b| b != SENTINEL));
                self.checks.check(
                    bad.is_none(),
                    format!(
                        "write burst of {n} × {eb} B over {} QPs: Ok in {:.3} s (posting {:.3} s), {rate:.0} entries/s; every byte {}",
                        self.o.qps,
                        took.as_secs_f64(),
                        posted.as_secs_f64(),
                        match bad {
                            None => "in place, gaps untouched".to_string(),
                            Some(i) => format!("NOT in place: entry {i} (or its gap) differs"),
                        }
                    ),
                );
            }
        }
        match pop_within(&self.tgt, INIT_KEY, id, Duration::from_secs(30)) {
            Some(Ok(())) => self.checks.pass("the target popped the write's inbound status: Ok"),
            other => self.checks.fail(format!("the target's inbound status of the write: {other:?}")),
        }
        let id = self.init.allocate_transfer_uid();
        let t = Instant::now();
        let st = rs.batch_read(&sh.lo, &sh.ro, &sh.sz, id);
        let (r, _) = wait(&st, &self.budget);
        let took = t.elapsed();
        self.read_time = took;
        match r {
            Err(e) => {
                self.checks.fail(format!("read burst failed after {took:?}: {e}"));
                return Err(format!("round {round}: the read burst failed: {e}"));
            }
            Ok(()) => {
                let bad = (0..n).find(|&i| sh.local(&back.v, i) != sh.remote(&dst.v, i).0);
                self.checks.check(
                    bad.is_none(),
                    format!(
                        "read burst of {n} × {eb} B: Ok in {:.3} s, {:.0} entries/s; every byte {}",
                        took.as_secs_f64(),
                        n as f64 / took.as_secs_f64(),
                        match bad {
                            None => "matches the target's".to_string(),
                            Some(i) => format!("NOT matching: entry {i} differs"),
                        }
                    ),
                );
            }
        }
        // Reads notify the target too on this backend: take it, so nothing accumulates.
        let _ = pop_within(&self.tgt, INIT_KEY, id, Duration::from_secs(5));
        Ok(())
    }

    /// Checks how a batch failed: the code and hint, and that it names the failed entries,
    /// both in its error text (`entry N`) and in its per-entry outcomes
    /// (`TransferStatus::failed_entries`, an entry range per failed piece; `None`: the whole
    /// batch, not attributed).
    fn check_error(&mut self, what: &str, st: &TransferStatus, e: &IoError) {
        let n = self.shape.n();
        self.checks.check(
            e.code == ErrorCode::InvalidArgs && e.msg.contains("remote access error"),
            format!("{what}: fails with the remote access error (InvalidArgs): {e}"),
        );
        match named_entry(&e.msg) {
            Some(i) if i < n => self.checks.pass(format!("{ENTRY_NAMING} {what}: the error names batch entry {i}")),
            Some(i) => self.checks.fail(format!("{ENTRY_NAMING} {what}: the error names entry {i}, beyond the batch of {n}")),
            None => self.checks.fail(format!("{ENTRY_NAMING} {what}: the error names no batch entry (`entry N`)")),
        }
        let failures = st.failed_entries().unwrap_or_default();
        let ranges: Vec<String> = failures
            .iter()
            .map(|f| match &f.entries {
                None => "the whole batch".to_string(),
                Some(rs) if rs.len() > 4 => {
                    format!("{} ranges, {}..{} to {}..{}", rs.len(), rs[0].start, rs[0].end, rs[rs.len() - 1].start, rs[rs.len() - 1].end)
                }
                Some(rs) => rs.iter().map(|r| format!("{}..{}", r.start, r.end)).collect::<Vec<_>>().join(" "),
            })
            .collect();
        let attributed = failures.iter().filter_map(|f| f.entries.as_ref()).flatten().all(|r| r.start < r.end && r.end as usize <= n)
            && failures.iter().any(|f| f.entries.is_some());
        self.checks.check(
            attributed,
            format!(
                "{ENTRY_NAMING} {what}: failed_entries() attributes the failure to batch entries: {} failure(s), entries {}",
                failures.len(),
                if ranges.is_empty() { "-".to_string() } else { ranges.join(", ") }
            ),
        );
    }

    /// Right after `local`'s transfer ended: deregistering it must find nothing using it.
    fn probe_ended(&mut self, what: &str, local: &mut Buf) -> Result<(), String> {
        let t = Instant::now();
        let Some(m) = local.mem.take() else { return Ok(()) };
        match self.init.deregister_memory(&m) {
            Ok(()) => {
                self.checks.pass(format!(
                    "{what}: terminal only once every entry ended (its source region deregistered at once, {:?})",
                    t.elapsed()
                ));
                Ok(())
            }
            Err(e) if e.code == ErrorCode::Timeout => {
                local.mem = Some(m);
                let more = local.release(&self.init, self.budget.left().max(Duration::from_secs(30)))?;
                self.checks.fail(format!(
                    "{what}: the status was terminal while entries were still in flight: deregistering its local region right after found them \
                     ({e}); they ended {:.3} s after the status",
                    (DRAIN_PROBE + more).as_secs_f64()
                ));
                Ok(())
            }
            Err(e) => Err(format!("{what}: deregistering its local region: {e}")),
        }
    }

    fn failing_behind_valid(&mut self, round: u64, ws: &Session, src: &mut Buf, dst: &mut Buf) -> Result<(), String> {
        let (n, eb) = (self.shape.n(), self.shape.eb);
        println!(
            "round {round}: failing batch: {n} entries to a region the target deregistered just before, posted right behind a valid burst on the same QPs"
        );
        let mut src2 = Buf::new(&self.init, self.shape.local_len(), 0xc3)?;
        let mut gone = Buf::new(&self.tgt, self.shape.remote_len(), SENTINEL)?;
        let sd = self.init.create_session(src2.mem(), gone.mem()).map_err(|e| format!("session to the second region: {e}"))?;
        for i in 0..n {
            for k in 0..eb {
                src.v[i * eb + k] = pattern((1 << 40) + round, i, k);
            }
        }
        dst.v.fill(SENTINEL);
        // The entry's region, deregistered just before (the target's remote memory stays
        // allocated: only the registration goes).
        let gm = gone.mem.take().expect("registered");
        self.tgt.deregister_memory(&gm).map_err(|e| format!("deregistering the target's second region: {e}"))?;
        let sh = &self.shape;
        let (id1, id2) = (self.init.allocate_transfer_uid(), self.init.allocate_transfer_uid());
        let t0 = Instant::now();
        let b1 = ws.batch_write(&sh.lo, &sh.ro, &sh.sz, id1);
        let p1 = t0.elapsed();
        let b2 = sd.batch_write(&sh.lo, &sh.ro, &sh.sz, id2);
        let p2 = t0.elapsed() - p1;
        let (r2, _) = wait(&b2, &self.budget);
        let t2 = t0.elapsed() - p1;
        // Probe first: nothing else must run between the status ending and the probe.
        match &r2 {
            Err(_) if b2.is_done() => self.probe_ended("failing batch", &mut src2)?,
            Err(e) => return Err(format!("failing batch: still in progress after {t2:?}: {e}")),
            Ok(()) => self.checks.fail("failing batch: succeeded, though its region was deregistered"),
        }
        let (r1, _) = wait(&b1, &self.budget);
        let t1 = t0.elapsed();
        let sh = &self.shape;
        match r1 {
            Ok(()) => {
                let bad = (0..n).find(|&i| sh.remote(&dst.v, i).0 != sh.local(&src.v, i));
                self.checks.check(
                    bad.is_none(),
                    format!(
                        "valid burst ahead of it: Ok (posted in {:.3} s, seen done {:.3} s after its post began), every byte {}",
                        p1.as_secs_f64(),
                        t1.as_secs_f64(),
                        if bad.is_none() { "in place" } else { "NOT in place" }
                    ),
                );
            }
            Err(e) => self.checks.fail(format!("valid burst ahead of the failing batch: failed ({:.3} s): {e}", t1.as_secs_f64())),
        }
        if let Err(e) = &r2 {
            println!("  failing batch posted in {:.3} s, ended {:.3} s after its post began: {e}", p2.as_secs_f64(), t2.as_secs_f64());
            self.check_error("failing batch", &b2, e);
        }
        let landed = (0..n).filter(|&i| self.shape.remote(&gone.v, i).0.iter().any(|&b| b != SENTINEL)).count();
        self.checks.check(landed == 0, format!("failing batch: {landed} of {n} entries landed in the deregistered region"));
        let said = (0..n).filter(|&i| b2.entry_landed(i) != Some(false)).count();
        self.checks.check(said == 0, format!("failing batch: entry_landed() says {said} of {n} entries landed (or does not know)"));
        drop(sd);
        // The connection recovers: one more burst to the valid region.
        for i in 0..n {
            for k in 0..eb {
                src.v[i * eb + k] = pattern((1 << 41) + round, i, k);
            }
        }
        let sh = &self.shape;
        let t = Instant::now();
        let st = ws.batch_write(&sh.lo, &sh.ro, &sh.sz, self.init.allocate_transfer_uid());
        let (r, _) = wait(&st, &self.budget);
        let t = t.elapsed();
        let ok = r.is_ok() && (0..n).all(|i| sh.remote(&dst.v, i).0 == sh.local(&src.v, i));
        self.checks.check(
            ok,
            format!(
                "after the failure, a burst on the same session: {r:?} in {:.3} s, bytes {}",
                t.as_secs_f64(),
                if ok { "in place" } else { "checked: NOT in place" }
            ),
        );
        let bound = self.budget.left().max(Duration::from_secs(30));
        src2.release(&self.init, bound)?;
        // `gone` is deregistered already: its buffer may go (no registration, nothing in flight
        // can reach it through a dropped MR).
        drop(gone);
        Ok(())
    }

    fn midway(&mut self, round: u64) -> Result<(), String> {
        let n = self.shape.n();
        println!("round {round}: mid-way: a read batch of {n} entries whose source the target deregisters while it runs");
        let mut src = Buf::new(&self.tgt, self.shape.remote_len(), 0)?;
        for i in 0..n {
            for k in 0..self.shape.eb {
                src.v[2 * i * self.shape.eb + k] = pattern((1 << 42) + round, i, k);
            }
        }
        let mut dst = Buf::new(&self.init, self.shape.local_len(), 0)?;
        let s = self.init.create_session(dst.mem(), src.mem()).map_err(|e| format!("mid-way session: {e}"))?;
        let (sh, tgt, delay) = (&self.shape, &self.tgt, self.read_time / 2);
        let sm = src.mem.take().expect("registered");
        let id = self.init.allocate_transfer_uid();
        let t0 = Instant::now();
        let (st, dereg) = std::thread::scope(|sc| {
            let h = sc.spawn(move || {
                std::thread::sleep(delay);
                tgt.deregister_memory(&sm)
            });
            let st = s.batch_read(&sh.lo, &sh.ro, &sh.sz, id);
            (st, h.join())
        });
        match dereg {
            Ok(Ok(())) => println!("  the target deregistered the source {delay:?} after the post began"),
            Ok(Err(e)) => return Err(format!("mid-way: deregistering the source: {e}")),
            Err(_) => return Err("mid-way: the deregistering thread panicked".into()),
        }
        let (r, _) = wait(&st, &self.budget);
        let t = t0.elapsed();
        let snapshot = dst.v.clone();
        match &r {
            Ok(()) => {
                let sh = &self.shape;
                let ok = (0..n).all(|i| sh.local(&dst.v, i) == sh.remote(&src.v, i).0);
                self.checks.check(
                    ok,
                    format!(
                        "mid-way: not exercised: the whole batch ran before the deregistration took effect (Ok in {:.3} s; bytes {})",
                        t.as_secs_f64(),
                        if ok { "checked" } else { "NOT matching" }
                    ),
                );
                dst.release(&self.init, Duration::from_secs(30))?;
                return Ok(());
            }
            Err(e) if !st.is_done() => return Err(format!("mid-way: still in progress after {t:?}: {e}")),
            Err(_) => self.probe_ended("mid-way batch", &mut dst)?,
        }
        std::thread::sleep(Duration::from_millis(300));
        let changed = (0..dst.v.len()).filter(|&k| dst.v[k] != snapshot[k]).count();
        self.checks.check(changed == 0, format!("mid-way: {changed} destination bytes changed after the status ended"));
        let sh = &self.shape;
        let (mut landed, mut torn) = (0, 0);
        for i in 0..n {
            let (got, want) = (sh.local(&snapshot, i), sh.remote(&src.v, i).0);
            if got == want {
                landed += 1;
            } else if got.iter().any(|&b| b != 0) {
                torn += 1;
            }
        }
        let said: Vec<usize> = (0..n).filter(|&i| st.entry_landed(i) == Some(true)).collect();
        let missing = said.iter().filter(|&&i| sh.local(&snapshot, i) != sh.remote(&src.v, i).0).count();
        if let Err(e) = &r {
            println!("  mid-way batch ended {:.3} s after its post began, with {landed} of {n} entries landed: {e}", t.as_secs_f64());
            self.check_error("mid-way batch", &st, e);
        }
        self.checks.check(torn == 0, format!("mid-way: {landed} entries landed whole, {torn} torn, {} untouched", n - landed - torn));
        self.checks.check(
            missing == 0,
            format!("mid-way: entry_landed() says {} entries landed, {missing} of them did not (bytes say {landed})", said.len()),
        );
        drop(s);
        dst.release(&self.init, self.budget.left().max(Duration::from_secs(30)))?;
        drop(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_entry_finds_the_index() {
        assert_eq!(named_entry("rdma work request failed: entry 17 of 32768: remote access error"), Some(17));
        assert_eq!(named_entry("batch entry 0 failed"), Some(0));
        assert_eq!(named_entry("no entry here; entry x; then entry 5"), Some(5));
        assert_eq!(named_entry("failed on QP 3: remote access error"), None);
    }

    #[test]
    fn shape_scatters_remotely() {
        let s = Shape::new(4, 8);
        assert_eq!((s.local_len(), s.remote_len()), (32, 64));
        assert_eq!(s.ro, vec![0, 16, 32, 48]);
        let b: Vec<u8> = (0..64).collect();
        assert_eq!(s.remote(&b, 1), (&b[16..24], &b[24..32]));
        assert!((0..1000).all(|i| pattern(3, i, 1) != SENTINEL));
    }
}
