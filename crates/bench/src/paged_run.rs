//! `bench_engine --paged`: one point of one rank (see [`crate::paged`] for the layout): fill,
//! the timed loops (paged batch, contiguous baseline and, with `--copy-baseline`, the bare
//! device copy, alternating in blocks), and the validation exchange.

use crate::args::{Args, OpArg, PollArg};
use crate::baseline::CopyBaseline;
use crate::membuf::Buffer;
use crate::paged::{first_changed, PagedReport, Shape, Timed};
use crate::report::Row;
use crate::run::{fail, Failure, BASELINE_BLOCKS, MAGIC_ABORT, MAGIC_OK, MAGIC_SKIP};
use crate::validate::first_mismatch;
use mori_bootstrap::Bootstrap;
use mori_io::{ErrorCode, IoEngine, IoError, MemoryDesc, Session, TransferStatus};
use std::time::{Duration, Instant};

/// What a paged point needs of the run.
pub(crate) struct Ctx<'a> {
    pub args: &'a Args,
    pub boot: &'a dyn Bootstrap,
    pub eng: &'a IoEngine,
    pub sess: Option<&'a Session>,
    pub mem: &'a MemoryDesc,
    pub remote: &'a MemoryDesc,
    pub deadline: Duration,
    pub baseline: Option<&'a CopyBaseline>,
    /// The peer's rank in the bootstrap world.
    pub peer_rank: usize,
}

/// A paged point's result (rank 0 holds the row and report).
pub(crate) struct PointResult {
    pub row: Option<Row>,
    pub report: Option<PagedReport>,
    /// `None`: passed (or skipped); else the failure line.
    pub validation: Option<String>,
    pub skipped: bool,
}

/// Test-only fault injection on rank 1 with `--op write`: `MORI_BENCH_CORRUPT_SLOT=K` flips a
/// byte of paged entry K, `MORI_BENCH_CORRUPT_UNTOUCHED=K` one of untouched pool block K.
fn corrupt_for_test(args: &Args, buf: &mut Buffer, entries: &[u64], untouched: &[u64]) -> Result<(), String> {
    if args.op != OpArg::Write {
        return Ok(());
    }
    for (var, offs) in [("MORI_BENCH_CORRUPT_SLOT", entries), ("MORI_BENCH_CORRUPT_UNTOUCHED", untouched)] {
        if let Some(&o) = std::env::var(var).ok().and_then(|v| v.parse::<usize>().ok()).and_then(|i| offs.get(i)) {
            buf.flip(o)?;
        }
    }
    Ok(())
}

/// Runs the paged point on this rank. Rank 0 measures; both ranks validate (see the module
/// docs of [`crate::paged`]).
pub(crate) fn point(c: &Ctx<'_>, s: &Shape, buf: &mut Buffer) -> Result<PointResult, Failure> {
    let args = c.args;
    let rank = args.rank;
    let write = args.op == OpArg::Write;
    let dst = if write { 1 } else { 0 };
    let (t0, t1) = s.tables();
    let mine = if rank == 0 { &t0 } else { &t1 };
    let len = s.buffer_bytes().map_err(fail)?;
    let total = s.total_bytes().unwrap_or(0);
    let contig = s.contiguous_offset();
    // The source's whole buffer holds its pattern; the destination's another (rank-dependent),
    // whose untouched pool blocks are summed now and again after the transfers.
    buf.fill(&[0], len, rank as u64, 0).map_err(fail)?;
    let untouched = s.untouched_offsets(mine);
    let before = if rank == dst { buf.checksums(&untouched, s.block_size).map_err(fail)? } else { Vec::new() };
    c.boot.barrier().map_err(|e| fail(format!("barrier before the paged point: {e}")))?;
    let result = (rank == 0).then(|| measure(c, s, &t0, &t1));
    let status = match &result {
        Some(Err(_)) => MAGIC_ABORT,
        _ if args.skip_validate => MAGIC_SKIP,
        _ => MAGIC_OK,
    };
    let got = c.boot.allgather(&[status]);
    let (row, report) = match result {
        Some(Err(e)) => return Err(fail(format!("paged transfer failed (block size {} B, {} blocks): {e}", s.block_size, s.entries()))),
        Some(Ok((row, report))) => (Some(row), Some(report)),
        None => (None, None),
    };
    let got = got.map_err(|e| fail(format!("exchange after the paged point (is the peer still reachable?): {e}")))?;
    if got.iter().any(|g| g.first() == Some(&MAGIC_ABORT)) {
        return Err(fail("the initiator (rank 0) aborted; see its output"));
    }
    if got.iter().any(|g| g.first() == Some(&MAGIC_SKIP)) {
        return Ok(PointResult { row, report, validation: None, skipped: true });
    }
    // Rank 1 sends: the first changed untouched block + 1 (0: none, or rank 1 is the source),
    // then one checksum per paged entry in stream order, then the contiguous area's.
    let entries = s.entry_offsets(mine);
    let untouched_verdict = |buf: &mut Buffer| -> Result<Option<usize>, Failure> {
        let after = buf.checksums(&untouched, s.block_size).map_err(fail)?;
        Ok(first_changed(&before, &after))
    };
    let mut sums = Vec::new();
    if rank == 1 {
        corrupt_for_test(args, buf, &entries, &untouched).map_err(fail)?;
        let flag = if rank == dst { untouched_verdict(buf)?.map_or(0, |i| i as u64 + 1) } else { 0 };
        sums.extend_from_slice(&flag.to_le_bytes());
        for x in buf.checksums(&entries, s.block_size).map_err(fail)?.into_iter().chain(buf.checksums(&[contig], total).map_err(fail)?) {
            sums.extend_from_slice(&x.to_le_bytes());
        }
    }
    let all = c.boot.allgather(&sums).map_err(|e| fail(format!("checksum exchange after the paged point: {e}")))?;
    if rank != 0 {
        return Ok(PointResult { row, report, validation: None, skipped: false });
    }
    let theirs: Vec<u64> = all
        .get(c.peer_rank)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .collect();
    let ours: Vec<u64> =
        buf.checksums(&entries, s.block_size).map_err(fail)?.into_iter().chain(buf.checksums(&[contig], total).map_err(fail)?).collect();
    let n = s.entries() as usize;
    let mut validation = match first_mismatch(&ours, theirs.get(1..).unwrap_or_default()) {
        Some(k) if k < n => {
            let e = s.entry_at(k as u64, &t0, &t1);
            Some(format!(
                "FAILED: paged entry {k} (layer {}, half {}, block table entry {}: rank 0 block {}, rank 1 block {}) differs, block size {} B",
                e.layer, e.half, e.entry, e.block0, e.block1, s.block_size
            ))
        }
        Some(_) => Some(format!("FAILED: the contiguous baseline's {total} B at offset {contig} differ between the ranks")),
        None => None,
    };
    if validation.is_none() {
        let changed = if dst == 0 { untouched_verdict(buf)? } else { theirs.first().and_then(|&f| f.checked_sub(1)).map(|i| i as usize) };
        if let Some(k) = changed {
            let (l, h, b) = s.untouched_at(k, if dst == 0 { &t0 } else { &t1 });
            validation = Some(format!(
                "FAILED: rank {dst}'s pool block {b} of layer {l}, half {h} is in no block table entry but changed (untouched block {k})"
            ));
        }
    }
    Ok(PointResult { row, report, validation, skipped: false })
}

/// Rank 0's timed loops: warm-up of each side, then `--iters` of each in up to
/// [`BASELINE_BLOCKS`] alternating blocks (paged, contiguous, bare copy), each side's time the
/// sum of its blocks.
fn measure(c: &Ctx<'_>, s: &Shape, t0: &[u32], t1: &[u32]) -> Result<(Row, PagedReport), IoError> {
    let args = c.args;
    let (eng, mem, remote) = (c.eng, c.mem, c.remote);
    let write = args.op == OpArg::Write;
    let batch = s.batch(t0, t1);
    let len = s.buffer_bytes().map_err(IoError::invalid)?;
    let plan = mori_io_core::paged::check_paged((mem.id, len), (remote.id, len), &batch)?;
    let total = plan.total_bytes();
    let off = [s.contiguous_offset()];
    let size = [total];
    let wait = |st: TransferStatus| match args.poll_cq_mode {
        PollArg::Polling => st.spin_for(c.deadline),
        PollArg::Event => st.wait_for(c.deadline),
    };
    let paged = || {
        let id = eng.allocate_transfer_uid();
        wait(match (c.sess, write) {
            (Some(x), true) => x.batch_write_paged(&batch, id),
            (Some(x), false) => x.batch_read_paged(&batch, id),
            (None, true) => eng.batch_write_paged(mem, remote, &batch, id),
            (None, false) => eng.batch_read_paged(mem, remote, &batch, id),
        })
    };
    let contiguous = || {
        let id = eng.allocate_transfer_uid();
        wait(match (c.sess, write) {
            (Some(x), true) => x.batch_write(&off, &off, &size, id),
            (Some(x), false) => x.batch_read(&off, &off, &size, id),
            (None, true) => eng.batch_write(mem, &off, remote, &off, &size, id),
            (None, false) => eng.batch_read(mem, &off, remote, &off, &size, id),
        })
    };
    let gpu_err = |e: String| IoError::new(ErrorCode::GpuOp, e);
    let views = match c.baseline {
        Some(b) => Some(b.views(&off, total, write).map_err(gpu_err)?),
        None => None,
    };
    let copy = || match (c.baseline, &views) {
        (Some(b), Some(v)) => b.once(v).map_err(gpu_err),
        _ => Ok(()),
    };
    for _ in 0..args.warmup_iters {
        paged()?;
        contiguous()?;
        copy()?;
    }
    let blocks = BASELINE_BLOCKS.min(args.iters).max(1);
    let mut times = [Duration::ZERO; 3];
    for k in 0..blocks {
        let n = args.iters / blocks + u64::from(k < args.iters % blocks);
        let sides: [&dyn Fn() -> Result<(), IoError>; 3] = [&paged, &contiguous, &copy];
        for (t, side) in times.iter_mut().zip(sides).take(if c.baseline.is_some() { 3 } else { 2 }) {
            let t1 = Instant::now();
            for _ in 0..n {
                side()?;
            }
            *t += t1.elapsed();
        }
    }
    let row = Row::new(s.block_size, s.entries(), args.iters, times[0]);
    let report = PagedReport {
        block_size: s.block_size,
        blocks_moved: s.entries(),
        layers: s.layers,
        halves: s.halves,
        table_entries: s.blocks,
        pool_blocks: s.pool_blocks,
        runs: plan.runs.len() as u64,
        bytes_per_transfer: total,
        paged: Timed::new(total, args.iters, times[0]),
        contiguous: Timed::new(total, args.iters, times[1]),
        copy: c.baseline.map(|_| Timed::new(total, args.iters, times[2])),
    };
    Ok((row, report))
}
