//! Phase `reconnect`: cycles of connect, write + notification, disconnect against one
//! long-lived target process (tcp backend, 127.0.0.1), with no delay between cycles.
//!
//! Cycle `c`:
//! 1. even `c`: the initiator's previous engine (if any) deregisters its buffer and is
//!    dropped, and a fresh engine is made under the same key [`KEY`] (a new incarnation: new
//!    epoch, new port, transfer ids from 1 again) with the buffer registered; odd `c`: the
//!    engine of the previous cycle is kept;
//! 2. connect: `register_remote_engine(target)`, `create_session` (a control-plane lookup of
//!    the target's region, then the tcp connections);
//! 3. write 1 B to 16 KiB of fresh random bytes to a random place of the target's region;
//!    the target pops the write's inbound status (it must be `Ok`) and checks the bytes;
//! 4. disconnect: drop the session, `deregister_remote_engine(target)`.
//!
//! Every `count / samples` cycles, at a cycle boundary, both processes are sampled twice:
//! at once ("instant", informational), and once their FD and thread counts stopped moving
//! (unchanged for [`QUIET`], at most [`SETTLE_MAX`]; the connections just closed end on
//! their own: the target's connection threads at the close, a dropped engine's threads
//! within ~200 ms). The settled RSS, FDs and threads of both processes must stay flat after
//! the warm-up (the long-lived target's, and the initiator's, whose engines come and go).
//! The cycles themselves follow each other with no delay; only the sampling pauses.

use crate::stats::{report, Series};
use crate::target::{fnv1a, TargetProc, POP, TARGET_KEY};
use crate::{Budget, Opts, Rng};
use mori_io::{BackendConfig, EngineConfig, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use std::time::Duration;

/// The initiator engines' key (every incarnation's).
pub const KEY: &str = "soak-reconnect";
/// The initiator's buffer and the target's region.
const BUF: usize = 64 << 10;
/// Largest write of a cycle.
const MAX_WRITE: u64 = 16 << 10;
/// Longest the write may take, and the target may wait for its status.
const STEP_BOUND: Duration = Duration::from_secs(30);
/// A settled sample: FD and thread counts unchanged this long...
pub const QUIET: Duration = Duration::from_millis(300);
/// ... or this long passed.
pub const SETTLE_MAX: Duration = Duration::from_secs(3);

/// Runs the phase.
pub fn run(o: &Opts) -> Result<(), String> {
    let budget = Budget::new(o.time_limit);
    let mut target = TargetProc::spawn(BUF, o.lanes, o.time_limit + Duration::from_secs(120), Duration::from_secs(60))?;
    let mut buf = vec![0u8; BUF];
    let mut cur: Option<(IoEngine, MemoryDesc)> = None;
    let r = cycles(o, &budget, &mut target, &mut buf, &mut cur);
    if let Some((e, m)) = cur.take() {
        if let Err(err) = e.deregister_memory(&m) {
            eprintln!("soak: deregistering the initiator's buffer: {err}; leaking it");
            std::mem::forget(buf);
        }
    }
    r
}

fn fresh_engine(o: &Opts, buf: &mut [u8]) -> Result<(IoEngine, MemoryDesc), String> {
    let cfg = EngineConfig::new("127.0.0.1", 0).map_err(|e| e.to_string())?;
    let e = IoEngine::new(KEY, cfg).map_err(|e| format!("new engine: {e}"))?;
    let tcp = TcpConfig { lanes: o.lanes, ..TcpConfig::from_env().map_err(|e| e.to_string())? };
    e.create_backend(BackendConfig::Tcp(tcp)).map_err(|e| format!("tcp backend: {e}"))?;
    // SAFETY: `buf` outlives every engine made here: each deregisters it (waiting for the
    // operations using it) before it is dropped, and `run` leaks it when that fails.
    let m = unsafe { e.register_memory(buf.as_mut_ptr(), buf.len(), MemLoc::Host { numa: None }) }.map_err(|e| format!("register: {e}"))?;
    Ok((e, m))
}

fn cycles(
    o: &Opts,
    budget: &Budget,
    target: &mut TargetProc,
    buf: &mut [u8],
    cur: &mut Option<(IoEngine, MemoryDesc)>,
) -> Result<(), String> {
    let procs = vec![("target".into(), true), ("initiator".into(), true)];
    let mut series = Series::new("cycles", procs.clone());
    let mut instant = Series::new("cycles", procs.into_iter().map(|(l, _)| (l, false)).collect());
    let pids = [target.pid(), std::process::id()];
    let (every, warm) = (o.sample_every(), o.warmup());
    let secs = || budget.elapsed().as_secs_f64();
    let mut settling = Duration::ZERO;
    let mut sample = |done: u64, series: &mut Series, instant: &mut Series| -> Result<(), String> {
        let i = instant.take(done, secs(), &pids)?;
        let (j, waited) = series.take_settled(done, secs(), &pids, QUIET, SETTLE_MAX)?;
        settling += waited;
        let inst: Vec<String> = instant.samples[i].usage.iter().map(|u| format!("{}/{}", u.fds, u.threads)).collect();
        println!("{}   (settled after {:.2} s; instant fds/threads {})", series.row(j, warm), waited.as_secs_f64(), inst.join(", "));
        Ok(())
    };
    println!("{}", series.header());
    sample(0, &mut series, &mut instant)?;
    let mut rng = Rng::new(o.seed);
    let (mut fresh_n, mut rereg_n, mut bytes) = (0u64, 0u64, 0u64);
    for c in 0..o.count {
        budget.check(c, o.count, "cycles")?;
        let fresh = c % 2 == 0 || cur.is_none();
        if fresh {
            if let Some((e, m)) = cur.take() {
                e.deregister_memory(&m).map_err(|err| format!("cycle {c}: deregistering the previous engine's buffer: {err}"))?;
                drop(e);
            }
            *cur = Some(fresh_engine(o, buf).map_err(|e| format!("cycle {c}: {e}"))?);
            fresh_n += 1;
        } else {
            rereg_n += 1;
        }
        let Some((eng, mem)) = cur.as_ref() else { return Err(format!("cycle {c}: no engine")) };
        let how = if fresh { "fresh engine" } else { "same engine, re-registered" };
        let fail = |step: &str, e: &dyn std::fmt::Display| format!("cycle {c} ({how}): {step}: {e}");
        // connect
        eng.register_remote_engine(target.desc.clone()).map_err(|e| fail("register_remote_engine", &e))?;
        let sess = eng.create_session(mem, &target.mem).map_err(|e| fail("create_session", &e))?;
        // write + notification
        let size = rng.range(1, MAX_WRITE);
        let off = rng.range(0, BUF as u64 - size);
        for b in buf[..size as usize].iter_mut() {
            *b = rng.next_u64() as u8;
        }
        let id = eng.allocate_transfer_uid();
        budget.wait(&sess.write(0, off, size, id), STEP_BOUND).map_err(|e| fail("write", &e))?;
        let hash = fnv1a(&buf[..size as usize]);
        target.send(&format!("pop {KEY} {id} {off} {size} {hash} {}", STEP_BOUND.as_millis()))?;
        let line = target.wait_line(POP, STEP_BOUND + Duration::from_secs(10)).map_err(|e| fail("notification", &e))?;
        if line != format!("{POP} ok") {
            return Err(fail("the target's pop_inbound_status and byte check", &line));
        }
        bytes += size;
        // disconnect
        drop(sess);
        eng.deregister_remote_engine(TARGET_KEY);
        let done = c + 1;
        if done % every == 0 || done == o.count {
            sample(done, &mut series, &mut instant)?;
        }
    }
    let s = secs();
    let run = s - settling.as_secs_f64();
    println!(
        "summary: {} cycles ({fresh_n} fresh engines, {rereg_n} re-registrations of the target) in {s:.1} s ({run:.1} s of cycles, {:.1} s of settling for samples), {:.1} cycles/s, {bytes} bytes written, every notification Ok and every byte checked at the target",
        o.count,
        settling.as_secs_f64(),
        o.count as f64 / run
    );
    println!("settled resources after the warm-up ({warm} {}), against the sample ending it:", series.unit);
    let (text, flat) = report(&series.drifts(warm, o.tolerance_pct), o.tolerance_pct);
    print!("{text}");
    println!("instant resources (informational):");
    print!("{}", report(&instant.drifts(warm, o.tolerance_pct), o.tolerance_pct).0);
    if !flat {
        return Err(format!("settled resources not flat within ±{} % after the warm-up (table above)", o.tolerance_pct));
    }
    Ok(())
}
