//! Phase `tcp-transfers`: write/read pairs of mixed sizes between this process and a target
//! process over the tcp backend on 127.0.0.1, each read checked, resources of both
//! processes sampled.
//!
//! Pair `j` (transfers `2j+1`, a write, and `2j+2`, a read; the ids are the transfer ids):
//! - a total of 8 B to 1 MiB (log-uniform), as one entry (half the pairs) or split into 2 to
//!   64 entries, with gaps of 0, 8 or 4096 bytes between entries locally and remotely (0
//!   merges them), at random places of the 4 MiB regions;
//! - the spot bytes of every entry (all of an entry of up to 64 bytes; else its first and
//!   last 8 and 16 in between) stamped in the source with values of this pair, the same bytes
//!   of the read-back buffer set to their complement;
//! - written from the source region to the target's region, then read back from there into
//!   the second local region, and the spot bytes compared;
//! - through the session (three pairs in four) or the engine's one-shot calls; single
//!   `write`/`read` for one entry, `batch_write`/`batch_read` otherwise.
//!
//! The target pops the inbound status of every id in order (`popseq`) and reports how many
//! were Ok at the end; all must be.

use crate::stats::{report, Series};
use crate::target::{TargetProc, POPSEQ};
use crate::{Budget, Opts, Rng};
use mori_io::{BackendConfig, EngineConfig, IoEngine, MemLoc, MemoryDesc, Session, TcpConfig};
use std::time::Duration;

/// Size of every region (both local ones and the target's).
const REGION: usize = 4 << 20;
/// Largest total of one transfer.
const MAX_TOTAL: u64 = 1 << 20;
/// Most entries of one batch.
const MAX_ENTRIES: u64 = 64;
const INIT_KEY: &str = "soak-init";
/// Longest one transfer may take before it counts as hung (within the time limit).
const TRANSFER_BOUND: Duration = Duration::from_secs(60);
/// How long the target waits for each inbound status after the previous one.
const POP_GAP_MS: u64 = 30_000;

/// The entries of one pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    /// Local offsets (the same in the source and the read-back region).
    pub lo: Vec<u64>,
    /// Remote offsets.
    pub ro: Vec<u64>,
    /// Entry sizes.
    pub sz: Vec<u64>,
}

impl Pair {
    /// Bytes of the pair's write (and of its read).
    pub fn bytes(&self) -> u64 {
        self.sz.iter().sum()
    }
}

/// Offsets of `n` entries of `sz` starting at a random place of a region of `len` bytes,
/// `gap` bytes apart.
fn place(rng: &mut Rng, sz: &[u64], gap: u64, len: u64) -> Vec<u64> {
    let span: u64 = sz.iter().sum::<u64>() + gap * (sz.len() as u64 - 1);
    let mut at = rng.range(0, len - span);
    sz.iter()
        .map(|s| {
            let o = at;
            at += s + gap;
            o
        })
        .collect()
}

/// The next pair of the mix.
pub fn plan(rng: &mut Rng) -> Pair {
    let t = rng.range(3, 20);
    let total = ((1u64 << t) + rng.range(0, (1u64 << t) - 1)).min(MAX_TOTAL);
    let n = if rng.next_u64().is_multiple_of(2) { 1 } else { rng.range(2, MAX_ENTRIES).min(total) };
    let each = total / n;
    let mut sz = vec![each; n as usize];
    sz[n as usize - 1] = total - each * (n - 1);
    const GAPS: [u64; 4] = [0, 0, 8, 4096];
    let (lg, rg) = (GAPS[(rng.next_u64() % 4) as usize], GAPS[(rng.next_u64() % 4) as usize]);
    let lo = place(rng, &sz, lg, REGION as u64);
    let ro = place(rng, &sz, rg, REGION as u64);
    Pair { lo, ro, sz }
}

/// Offsets within an entry of `size` bytes that are stamped and checked.
pub fn spots(size: u64) -> Vec<u64> {
    if size <= 64 {
        return (0..size).collect();
    }
    let mut v: Vec<u64> = (0..8).chain(size - 8..size).chain((1..=16).map(|k| k * size / 17)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The value stamped at spot `p` of entry `i` of pair `j`.
pub fn stamp(j: u64, i: u64, p: u64) -> u8 {
    let h = (j ^ (i << 40) ^ (p << 20)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 56) as u8
}

/// Runs the phase.
pub fn run(o: &Opts) -> Result<(), String> {
    let budget = Budget::new(o.time_limit);
    let lifetime = o.time_limit + Duration::from_secs(120);
    let mut target = TargetProc::spawn(REGION, o.lanes, lifetime, Duration::from_secs(60))?;
    let eng = IoEngine::new(INIT_KEY, EngineConfig::new("127.0.0.1", 0).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let tcp = TcpConfig { lanes: o.lanes, ..TcpConfig::from_env().map_err(|e| e.to_string())? };
    eng.create_backend(BackendConfig::Tcp(tcp)).map_err(|e| e.to_string())?;
    let mut src = vec![0u8; REGION];
    let mut dst = vec![0u8; REGION];
    // SAFETY: both buffers live until the end of this function, and are deregistered (which
    // waits for the operations using them) before they are dropped, or leaked when that fails.
    let smem = unsafe { eng.register_memory(src.as_mut_ptr(), REGION, MemLoc::Host { numa: None }) }.map_err(|e| e.to_string())?;
    // SAFETY: as above.
    let dmem = unsafe { eng.register_memory(dst.as_mut_ptr(), REGION, MemLoc::Host { numa: None }) }.map_err(|e| e.to_string())?;
    let r = (|| {
        eng.register_remote_engine(target.desc.clone()).map_err(|e| e.to_string())?;
        let ws = eng.create_session(&smem, &target.mem).map_err(|e| format!("session for writes: {e}"))?;
        let rs = eng.create_session(&dmem, &target.mem).map_err(|e| format!("session for reads: {e}"))?;
        target.send(&format!("popseq {INIT_KEY} 1 {} {POP_GAP_MS}", o.count))?;
        let env = Env { o, eng: &eng, smem: &smem, dmem: &dmem, tmem: &target.mem, ws: &ws, rs: &rs, budget: &budget };
        let pids = [std::process::id(), target.pid()];
        let (moved, series) = env.soak(&mut src, &mut dst, &pids)?;
        // Every inbound status was popped: all Ok.
        let line = target.wait_line(POPSEQ, Duration::from_millis(POP_GAP_MS) + Duration::from_secs(30))?;
        let w: Vec<&str> = line.splitn(5, ' ').collect();
        let (ok, failed, missing) = match w.as_slice() {
            [_, ok, failed, missing, _] => (ok.parse::<u64>(), failed.parse::<u64>(), missing.parse::<u64>()),
            _ => return Err(format!("malformed answer from the target: {line:?}")),
        };
        let (Ok(ok), Ok(failed), Ok(missing)) = (ok, failed, missing) else {
            return Err(format!("malformed answer from the target: {line:?}"));
        };
        let secs = budget.elapsed().as_secs_f64();
        println!(
            "summary: {} transfers ({} pairs) in {secs:.1} s, {:.2} GiB each way, {:.0} transfers/s; target popped {ok} Ok, {failed} failed, {missing} missing",
            o.count,
            o.count / 2,
            moved as f64 / (1u64 << 30) as f64,
            o.count as f64 / secs,
        );
        println!("resources after the warm-up ({} {}), against the sample ending it:", o.warmup(), series.unit);
        let (text, flat) = report(&series.drifts(o.warmup(), o.tolerance_pct), o.tolerance_pct);
        print!("{text}");
        if ok != o.count || failed != 0 || missing != 0 {
            let first = w.get(4).copied().unwrap_or("-");
            return Err(format!("the target saw {ok} of {} transfers Ok ({failed} failed, {missing} missing; first: {first})", o.count));
        }
        if !flat {
            return Err(format!("resources not flat within ±{} % after the warm-up (table above)", o.tolerance_pct));
        }
        Ok(())
    })();
    let mut leak = false;
    for m in [&smem, &dmem] {
        if let Err(e) = eng.deregister_memory(m) {
            eprintln!("soak: deregistering local memory {}: {e}; leaking the buffers", m.id);
            leak = true;
        }
    }
    if leak {
        std::mem::forget(src);
        std::mem::forget(dst);
    }
    r
}

struct Env<'a> {
    o: &'a Opts,
    eng: &'a IoEngine,
    smem: &'a MemoryDesc,
    dmem: &'a MemoryDesc,
    tmem: &'a MemoryDesc,
    ws: &'a Session,
    rs: &'a Session,
    budget: &'a Budget,
}

impl Env<'_> {
    /// The pairs; returns the bytes written and the samples.
    fn soak(&self, src: &mut [u8], dst: &mut [u8], pids: &[u32]) -> Result<(u64, Series), String> {
        let o = self.o;
        let mut series = Series::new("transfers", vec![("initiator".into(), true), ("target".into(), true)]);
        let every = o.sample_every();
        let (warm, secs) = (o.warmup(), || self.budget.elapsed().as_secs_f64());
        println!("{}", series.header());
        let i = series.take(0, secs(), pids)?;
        println!("{}", series.row(i, warm));
        let mut next_sample = every;
        let mut rng = Rng::new(o.seed);
        let mut moved = 0u64;
        for j in 0..o.count / 2 {
            self.budget.check(2 * j, o.count, "transfers")?;
            let p = plan(&mut rng);
            for (i, (&l, &s)) in p.lo.iter().zip(&p.sz).enumerate() {
                for q in spots(s) {
                    let v = stamp(j, i as u64, q);
                    src[(l + q) as usize] = v;
                    dst[(l + q) as usize] = !v;
                }
            }
            let (wid, rid) = (2 * j + 1, 2 * j + 2);
            let one_shot = j % 4 == 3;
            let (lo, ro, sz) = (&p.lo[..], &p.ro[..], &p.sz[..]);
            let st = match (sz.len() == 1, one_shot) {
                (true, false) => self.ws.write(lo[0], ro[0], sz[0], wid),
                (false, false) => self.ws.batch_write(lo, ro, sz, wid),
                (true, true) => self.eng.write(self.smem, lo[0], self.tmem, ro[0], sz[0], wid),
                (false, true) => self.eng.batch_write(self.smem, lo, self.tmem, ro, sz, wid),
            };
            let what = |op: &str, id: u64| format!("transfer {id} ({op}, {} entries, {} bytes)", sz.len(), p.bytes());
            self.budget.wait(&st, TRANSFER_BOUND).map_err(|e| format!("{}: {e}", what("write", wid)))?;
            let st = match (sz.len() == 1, one_shot) {
                (true, false) => self.rs.read(lo[0], ro[0], sz[0], rid),
                (false, false) => self.rs.batch_read(lo, ro, sz, rid),
                (true, true) => self.eng.read(self.dmem, lo[0], self.tmem, ro[0], sz[0], rid),
                (false, true) => self.eng.batch_read(self.dmem, lo, self.tmem, ro, sz, rid),
            };
            self.budget.wait(&st, TRANSFER_BOUND).map_err(|e| format!("{}: {e}", what("read", rid)))?;
            for (i, (&l, &s)) in p.lo.iter().zip(&p.sz).enumerate() {
                for q in spots(s) {
                    let (want, got) = (src[(l + q) as usize], dst[(l + q) as usize]);
                    if got != want {
                        return Err(format!(
                            "pair {j} (transfers {wid}, {rid}): entry {i} of {} ({s} bytes, local {l}, remote {}), byte {q}: read back {got:#04x}, wrote {want:#04x}",
                            sz.len(),
                            p.ro[i]
                        ));
                    }
                }
            }
            moved += p.bytes();
            let done = 2 * j + 2;
            if done >= next_sample || done == o.count {
                let i = series.take(done, secs(), pids)?;
                println!("{}", series.row(i, warm));
                next_sample += every;
            }
        }
        Ok((moved, series))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_fit_their_regions_and_mix_sizes() {
        let mut rng = Rng::new(3);
        let (mut single, mut batch, mut small, mut large) = (0, 0, 0, 0);
        for _ in 0..20_000 {
            let p = plan(&mut rng);
            let total = p.bytes();
            assert!((8..=MAX_TOTAL).contains(&total), "{total}");
            assert!(p.sz.iter().all(|&s| s >= 1) && p.sz.len() as u64 <= MAX_ENTRIES);
            for offs in [&p.lo, &p.ro] {
                for w in 0..p.sz.len() {
                    assert!(offs[w] + p.sz[w] <= REGION as u64);
                    if w > 0 {
                        assert!(offs[w] >= offs[w - 1] + p.sz[w - 1], "entries do not overlap");
                    }
                }
            }
            if p.sz.len() == 1 {
                single += 1
            } else {
                batch += 1
            }
            if total <= 64 {
                small += 1
            }
            if total >= 512 << 10 {
                large += 1
            }
        }
        assert!(single > 8000 && batch > 8000 && small > 1000 && large > 500, "{single} {batch} {small} {large}");
    }

    #[test]
    fn spots_cover_small_entries_and_both_ends() {
        assert_eq!(spots(3), vec![0, 1, 2]);
        let s = spots(1 << 20);
        assert!(s.len() <= 32 && s.contains(&0) && s.contains(&((1 << 20) - 1)));
        assert!(s.windows(2).all(|w| w[0] < w[1]) && s.iter().all(|&q| q < 1 << 20));
        assert_eq!(spots(65).len(), 28, "3, 7, 57 and 61 fall on the ends");
        // Stamps differ between pairs at the same place.
        assert!((0..64).any(|j| stamp(j, 0, 0) != stamp(j + 1, 0, 0)));
    }
}
