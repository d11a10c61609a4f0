//! Sans-IO RDMA work-request (WR) planner: turns a batch into the WRs each QP posts.
//!
//! Rules (from the MORI-IO benchmark guide, "Benchmark Tuning Guide" and "The merged-WR size
//! limit", and the RDMA issue of this project):
//! 1. Zero-length entries are dropped; the rest are sorted by remote offset (stable).
//! 2. Remote-contiguous entries merge into one WR: the last SGE grows when the local side is
//!    contiguous too, else a new SGE is added, up to `max_sge` SGEs per WR.
//! 3. Without chunking, several workers split the sorted entries into contiguous near-equal
//!    shares (merging never crosses a share), so each merged WR stays smaller; each worker
//!    posts to its own subset of QPs. A merged WR longer than `max_msg_sz` is an
//!    `InvalidArgs` error worded as the guide's message.
//! 4. With chunking (workers then post inline, as one), a merged WR of `L` bytes is cut into
//!    `max(min(ceil(L / chunk_bytes), max_chunks), ceil(L / max_msg_sz))` near-equal pieces.
//! 5. A worker's WRs go round-robin over its QPs; worker `w` of `W` owns the QP slots at
//!    positions `w, w+W, ...` of the rotation that starts at `transfer_id % num_qps`. QP slot
//!    `q` lives on NIC `q % num_nics` as that NIC's QP `q / num_nics`
//!    (`MORI_IO_NUM_NICS_PER_TRANSFER` striping: consecutive slots alternate NICs).
//! 6. Signaling: on each QP the last WR is signaled (RC completes in order, so it covers the
//!    QP's earlier WRs), plus every `max_send_wr`-th WR so the send queue can be reclaimed.

use crate::error::{IoError, IoResult};
use crate::plan::Seg;

/// Most WRs one plan may hold; larger plans are refused rather than allocated.
pub const MAX_PLAN_WRS: u64 = 1 << 22;

/// Limits of the local RDMA endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// Largest message of one WR, bytes (`ibv_port_attr.max_msg_sz`; 2 GiB on mlx5 and
    /// bnxt_re), the minimum over the endpoints the transfer uses.
    pub max_msg_sz: u64,
    /// Most scatter/gather entries per WR (the QP's `max_send_sge`).
    pub max_sge: usize,
    /// Send-queue depth of each QP, in WRs (`max_send_wr`, `MORI_IO_QP_MAX_SEND_WR`).
    pub max_send_wr: usize,
}

/// How the batch is spread and cut (the bench's `--disable-chunking`, `--chunk-bytes`,
/// `--num-qp-per-transfer`, `--num-worker-threads`, `MORI_IO_NUM_NICS_PER_TRANSFER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrPlanConfig {
    /// Cut merged WRs into chunks (rule 4); when off, workers split the batch (rule 3).
    pub chunking: bool,
    /// Target chunk size, bytes (used when `chunking`; must be > 0 then).
    pub chunk_bytes: u64,
    /// Most chunks per merged WR from `chunk_bytes` alone (must be > 0 when `chunking`);
    /// `max_msg_sz` may still force more.
    pub max_chunks: usize,
    /// QPs per transfer, over all NICs (>= `num_nics`).
    pub num_qps: usize,
    /// NICs the transfer stripes over (>= 1).
    pub num_nics: usize,
    /// Worker threads posting (>= 1); only splits the batch when chunking is off.
    pub workers: usize,
}

/// One scatter/gather entry: a contiguous local range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Offset in the local region, bytes.
    pub local_off: u64,
    /// Length, bytes (> 0).
    pub len: u64,
}

/// One work request: `len` bytes at `remote_off`, gathered from (or scattered to) `sges`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wr {
    /// Offset in the remote region, bytes.
    pub remote_off: u64,
    /// Total length, bytes: the sum of the SGE lengths, at most `max_msg_sz`.
    pub len: u64,
    /// Local side, in remote order; 1..=`max_sge` entries.
    pub sges: Vec<Sge>,
    /// Whether the WR asks for a completion (rule 6).
    pub signaled: bool,
}

/// The WRs of one QP, in posting order (increasing remote offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpWrs {
    /// NIC index, `0..num_nics`.
    pub nic: usize,
    /// QP index within the NIC.
    pub qp: usize,
    /// Worker that posts to this QP, `0..workers`.
    pub worker: usize,
    /// Work requests, posting order.
    pub wrs: Vec<Wr>,
}

/// A planned batch: the QPs with work, ordered by QP slot, and the completions to wait for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WrPlan {
    /// One entry per QP that has at least one WR.
    pub queues: Vec<QpWrs>,
    /// Number of signaled WRs over all QPs: completions the transfer waits for.
    pub signaled: usize,
}

fn check_config(limits: &EndpointLimits, cfg: &WrPlanConfig) -> IoResult<()> {
    let bad = |what: &str| Err(IoError::invalid(format!("RDMA WR planner: {what}")));
    if limits.max_msg_sz == 0 || limits.max_sge == 0 || limits.max_send_wr == 0 {
        return bad(&format!(
            "endpoint limits must be > 0 (max_msg_sz {}, max_sge {}, max_send_wr {})",
            limits.max_msg_sz, limits.max_sge, limits.max_send_wr
        ));
    }
    if cfg.num_nics == 0 || cfg.workers == 0 {
        return bad(&format!("num_nics ({}) and workers ({}) must be >= 1", cfg.num_nics, cfg.workers));
    }
    if cfg.num_qps < cfg.num_nics {
        return bad(&format!("num_qps {} < num_nics {}: each NIC needs a QP", cfg.num_qps, cfg.num_nics));
    }
    if cfg.chunking && (cfg.chunk_bytes == 0 || cfg.max_chunks == 0) {
        return bad(&format!("with chunking, chunk_bytes ({}) and max_chunks ({}) must be > 0", cfg.chunk_bytes, cfg.max_chunks));
    }
    Ok(())
}

/// Merges sorted entries into WRs (rule 2); returns each WR with its entry count.
fn merge(entries: &[Seg], max_sge: usize) -> Vec<(Wr, usize)> {
    let mut out: Vec<(Wr, usize)> = Vec::new();
    for e in entries {
        if let Some((wr, n)) = out.last_mut() {
            if wr.remote_off + wr.len == e.remote_off {
                let grow = wr.sges.last_mut().filter(|s| s.local_off + s.len == e.local_off);
                if let Some(s) = grow {
                    s.len += e.len;
                } else if wr.sges.len() < max_sge {
                    wr.sges.push(Sge { local_off: e.local_off, len: e.len });
                } else {
                    out.push(new_wr(e));
                    continue;
                }
                wr.len += e.len;
                *n += 1;
                continue;
            }
        }
        out.push(new_wr(e));
    }
    out
}

fn new_wr(e: &Seg) -> (Wr, usize) {
    let sge = Sge { local_off: e.local_off, len: e.len };
    (Wr { remote_off: e.remote_off, len: e.len, sges: vec![sge], signaled: false }, 1)
}

/// Number of chunks for a merged WR of `len` bytes (rule 4); always in `1..=len`.
pub fn chunk_count(len: u64, chunk_bytes: u64, max_chunks: usize, max_msg_sz: u64) -> u64 {
    let by_chunk = len.div_ceil(chunk_bytes.max(1)).min(max_chunks as u64);
    by_chunk.max(len.div_ceil(max_msg_sz.max(1))).max(1)
}

/// Cuts `wr` into `n` pieces whose lengths differ by at most one byte (first ones longer).
fn split(wr: &Wr, n: u64, out: &mut Vec<Wr>) {
    let mut sges = wr.sges.iter().copied();
    let mut cur: Option<Sge> = None;
    let mut remote = wr.remote_off;
    for k in 0..n {
        let share = wr.len / n + u64::from(k < wr.len % n);
        let mut piece = Wr { remote_off: remote, len: 0, sges: Vec::new(), signaled: false };
        while piece.len < share {
            let Some(s) = cur.take().or_else(|| sges.next()) else { break };
            let take = s.len.min(share - piece.len);
            piece.sges.push(Sge { local_off: s.local_off, len: take });
            if take < s.len {
                cur = Some(Sge { local_off: s.local_off + take, len: s.len - take });
            }
            piece.len += take;
        }
        remote += piece.len;
        out.push(piece);
    }
}

/// Plans a batch of `(local offset, remote offset, length)` entries (offsets in the local
/// and remote regions, bytes) for RDMA; see the module rules.
///
/// Errors (`InvalidArgs`): a zero limit or config field, `num_qps < num_nics`, an entry whose
/// end overflows `u64`, a plan over [`MAX_PLAN_WRS`] WRs, and, without chunking, a merged WR
/// over `max_msg_sz` ("merged RDMA WR .. length L bytes exceeds local max_msg_sz M bytes;
/// enable RDMA transfer chunking or reduce batch size"). An empty batch gives an empty plan.
pub fn plan_wrs(batch: &[Seg], limits: &EndpointLimits, cfg: &WrPlanConfig, transfer_id: u64) -> IoResult<WrPlan> {
    check_config(limits, cfg)?;
    let mut entries = Vec::with_capacity(batch.len());
    for (i, s) in batch.iter().enumerate() {
        if s.local_off.checked_add(s.len).is_none() || s.remote_off.checked_add(s.len).is_none() {
            return Err(IoError::invalid(format!(
                "entry {i}: local offset {} / remote offset {} + length {} overflows",
                s.local_off, s.remote_off, s.len
            )));
        }
        if s.len > 0 {
            entries.push(*s);
        }
    }
    entries.sort_by_key(|s| s.remote_off);
    let slots = cfg.num_qps;
    let workers = if cfg.chunking { 1 } else { cfg.workers.min(slots).min(entries.len()).max(1) };
    let start = (transfer_id % slots as u64) as usize;
    let mut per_slot: Vec<Vec<Wr>> = vec![Vec::new(); slots];
    let mut owner = vec![0usize; slots];
    let mut first = 0usize;
    for w in 0..workers {
        let count = entries.len() / workers + usize::from(w < entries.len() % workers);
        let merged = merge(&entries[first..first + count], limits.max_sge);
        first += count;
        let mut wrs = Vec::with_capacity(merged.len());
        if cfg.chunking {
            let mut pieces = 0u64;
            for (wr, _) in &merged {
                pieces += chunk_count(wr.len, cfg.chunk_bytes, cfg.max_chunks, limits.max_msg_sz);
            }
            if pieces > MAX_PLAN_WRS {
                return Err(IoError::invalid(format!(
                    "RDMA WR planner: chunking would make {pieces} WRs (limit {MAX_PLAN_WRS}); raise chunk_bytes"
                )));
            }
            for (wr, _) in merged {
                // A WR that stays one chunk moves through as it is (no rebuilt SGE list).
                match chunk_count(wr.len, cfg.chunk_bytes, cfg.max_chunks, limits.max_msg_sz) {
                    1 => wrs.push(wr),
                    n => split(&wr, n, &mut wrs),
                }
            }
        } else {
            for (k, (wr, n)) in merged.into_iter().enumerate() {
                if wr.len > limits.max_msg_sz {
                    return Err(IoError::invalid(format!(
                        "merged RDMA WR {k} (worker {w}, remote offset {}, {n} batch entries) length {} bytes \
                         exceeds local max_msg_sz {} bytes; enable RDMA transfer chunking or reduce batch size \
                         (or use more worker threads)",
                        wr.remote_off, wr.len, limits.max_msg_sz
                    )));
                }
                wrs.push(wr);
            }
        }
        let mine: Vec<usize> = (w..slots).step_by(workers).map(|p| (start + p) % slots).collect();
        for &q in &mine {
            owner[q] = w;
        }
        for (k, wr) in wrs.into_iter().enumerate() {
            per_slot[mine[k % mine.len()]].push(wr);
        }
    }
    let mut plan = WrPlan::default();
    for (q, mut wrs) in per_slot.into_iter().enumerate() {
        let last = wrs.len().wrapping_sub(1);
        for (i, wr) in wrs.iter_mut().enumerate() {
            wr.signaled = i == last || (i + 1) % limits.max_send_wr == 0;
            plan.signaled += usize::from(wr.signaled);
        }
        if !wrs.is_empty() {
            plan.queues.push(QpWrs { nic: q % cfg.num_nics, qp: q / cfg.num_nics, worker: owner[q], wrs });
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;
    const LIM: EndpointLimits = EndpointLimits { max_msg_sz: 2048 * MIB, max_sge: 4, max_send_wr: 1024 };
    fn cfg(chunking: bool, num_qps: usize, num_nics: usize, workers: usize) -> WrPlanConfig {
        WrPlanConfig { chunking, chunk_bytes: MIB, max_chunks: 4, num_qps, num_nics, workers }
    }
    fn contiguous(n: u64, len: u64) -> Vec<Seg> {
        (0..n).map(|i| Seg { local_off: i * len, remote_off: i * len, len }).collect()
    }
    /// Oracle: every (local byte, remote byte) pair, sorted.
    fn bytes_in(batch: &[Seg]) -> Vec<(u64, u64)> {
        let mut v: Vec<_> = batch.iter().flat_map(|s| (0..s.len).map(move |i| (s.local_off + i, s.remote_off + i))).collect();
        v.sort_unstable();
        v
    }
    /// All WRs with their (nic, qp, worker), in remote order.
    fn flat(p: &WrPlan) -> Vec<(usize, usize, usize, Wr)> {
        let mut v: Vec<_> = p.queues.iter().flat_map(|q| q.wrs.iter().map(|w| (q.nic, q.qp, q.worker, w.clone()))).collect();
        v.sort_by_key(|x| x.3.remote_off);
        v
    }
    fn bytes_out(p: &WrPlan) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        for (_, _, _, w) in flat(p) {
            let mut r = w.remote_off;
            for s in &w.sges {
                v.extend((0..s.len).map(|i| (s.local_off + i, r + i)));
                r += s.len;
            }
        }
        v.sort_unstable();
        v
    }

    #[test]
    fn seed_merged_wr_limit_and_workers() {
        // 128 contiguous 32 MiB transfers, chunking off, one worker: one 4 GiB WR > 2 GiB.
        let batch = contiguous(128, 32 * MIB);
        let e = plan_wrs(&batch, &LIM, &cfg(false, 8, 1, 1), 0).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidArgs);
        for part in [
            "merged RDMA WR",
            "length 4294967296 bytes",
            "exceeds local max_msg_sz 2147483648",
            "enable RDMA transfer chunking or reduce batch size",
            "128 batch entries",
        ] {
            assert!(e.msg.contains(part), "{part:?} not in {e}");
        }
        // Eight workers over eight QPs: eight 512 MiB WRs, one per QP, all signaled.
        let p = plan_wrs(&batch, &LIM, &cfg(false, 8, 1, 8), 3).unwrap();
        assert_eq!((p.queues.len(), p.signaled), (8, 8));
        assert!(p.queues.iter().all(|q| q.wrs.len() == 1 && q.wrs[0].len == 512 * MIB && q.wrs[0].signaled));
        assert_eq!((p.queues[3].worker, p.queues[3].wrs[0].remote_off), (0, 0), "worker 0 starts at slot 3");
        // Chunking instead: ceil(4 GiB / 1 MiB) capped at 4 chunks, but max_msg_sz forces 2.
        let p = plan_wrs(&batch, &EndpointLimits { max_msg_sz: 2048 * MIB, ..LIM }, &cfg(true, 2, 1, 8), 0).unwrap();
        let lens: Vec<u64> = flat(&p).iter().map(|x| x.3.len).collect();
        assert_eq!(lens, vec![1024 * MIB; 4]);
        assert_eq!(chunk_count(4096 * MIB, MIB, 4, 512 * MIB), 8);
        assert_eq!(chunk_count(3 * MIB, MIB, 64, 2048 * MIB), 3);
    }

    #[test]
    fn sge_limit_nics_and_signaling() {
        // Remote-contiguous, local gaps: 4 SGEs per WR at most.
        let batch: Vec<Seg> = (0..6).map(|i| Seg { local_off: i * 100, remote_off: i * 10, len: 10 }).collect();
        let p = plan_wrs(&batch, &LIM, &cfg(false, 4, 2, 1), 1).unwrap();
        let f = flat(&p);
        assert_eq!(f.iter().map(|x| x.3.sges.len()).collect::<Vec<_>>(), vec![4, 2]);
        assert_eq!(f.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(), vec![(1, 0), (0, 1)], "slots 1, 2");
        // Overlapping remote ranges never merge; max_send_wr 2 signals every second WR.
        let batch = vec![Seg { local_off: 0, remote_off: 0, len: 8 }; 5];
        let p = plan_wrs(&batch, &EndpointLimits { max_send_wr: 2, ..LIM }, &cfg(false, 1, 1, 1), 0).unwrap();
        let sig: Vec<bool> = p.queues[0].wrs.iter().map(|w| w.signaled).collect();
        assert_eq!((sig, p.signaled), (vec![false, true, false, true, true], 3));
        assert_eq!(plan_wrs(&[], &LIM, &cfg(false, 1, 1, 1), 0).unwrap(), WrPlan::default());
    }

    #[test]
    fn bad_config_is_invalid_args() {
        let b = contiguous(2, 8);
        let zero = EndpointLimits { max_sge: 0, ..LIM };
        assert!(plan_wrs(&b, &zero, &cfg(false, 1, 1, 1), 0).unwrap_err().msg.contains("max_sge 0"));
        assert!(plan_wrs(&b, &LIM, &cfg(false, 1, 2, 1), 0).unwrap_err().msg.contains("num_qps 1 < num_nics 2"));
        let c = WrPlanConfig { chunk_bytes: 0, ..cfg(true, 1, 1, 1) };
        assert!(plan_wrs(&b, &LIM, &c, 0).unwrap_err().msg.contains("chunk_bytes (0)"));
        let o = [Seg { local_off: u64::MAX, remote_off: 0, len: 1 }];
        assert!(plan_wrs(&o, &LIM, &cfg(false, 1, 1, 1), 0).unwrap_err().msg.contains("entry 0"));
        let huge = [Seg { local_off: 0, remote_off: 0, len: 1 << 40 }];
        let l1 = EndpointLimits { max_msg_sz: 1, ..LIM };
        assert!(plan_wrs(&huge, &l1, &cfg(true, 1, 1, 1), 0).unwrap_err().msg.contains("raise chunk_bytes"));
    }

    fn batch_strategy() -> impl Strategy<Value = Vec<Seg>> {
        proptest::collection::vec((0u64..3, 0u64..3, 0u64..40), 0..24).prop_flat_map(|raw| {
            let (mut lo, mut ro, mut v) = (0u64, 5u64, Vec::new());
            for (lgap, rgap, len) in raw {
                lo += lgap * 7;
                ro += rgap * 3;
                v.push(Seg { local_off: lo, remote_off: ro, len });
                lo += len;
                ro += len;
            }
            Just(v).prop_shuffle()
        })
    }

    proptest! {
        #[test]
        fn plan_matches_oracle(
            batch in batch_strategy(), chunking: bool, chunk_bytes in 1u64..64, max_chunks in 1usize..5,
            max_msg_sz in 1u64..200, max_sge in 1usize..4, max_send_wr in 1usize..4,
            nics in 1usize..3, extra_qps in 0usize..4, workers in 1usize..6, tid in 0u64..50,
        ) {
            let lim = EndpointLimits { max_msg_sz, max_sge, max_send_wr };
            let c = WrPlanConfig { chunking, chunk_bytes, max_chunks, num_qps: nics + extra_qps, num_nics: nics, workers };
            // Same plan without the size limit (one worker when chunking: what gets chunked).
            let base = WrPlanConfig { chunking: false, workers: if chunking { 1 } else { workers }, ..c };
            let unlimited = plan_wrs(&batch, &EndpointLimits { max_msg_sz: u64::MAX, ..lim }, &base, tid).unwrap();
            let longest = flat(&unlimited).iter().map(|x| x.3.len).max().unwrap_or(0);
            let p = match plan_wrs(&batch, &lim, &c, tid) {
                Err(e) => {
                    prop_assert!(!chunking && longest > max_msg_sz, "{e}");
                    prop_assert!(e.msg.contains("exceeds local max_msg_sz"));
                    return Ok(());
                }
                Ok(p) => p,
            };
            prop_assert!(chunking || longest <= max_msg_sz);
            prop_assert_eq!(bytes_out(&p), bytes_in(&batch));
            let f = flat(&p);
            for (i, (_, _, w, wr)) in f.iter().enumerate() {
                prop_assert!(wr.len <= max_msg_sz && !wr.sges.is_empty() && wr.sges.len() <= max_sge);
                prop_assert_eq!(wr.len, wr.sges.iter().map(|s| s.len).sum::<u64>());
                prop_assert!(wr.sges.windows(2).all(|s| s[0].local_off + s[0].len != s[1].local_off));
                match f.get(i + 1) {
                    Some((_, _, w2, next)) if !chunking && w2 == w && wr.remote_off + wr.len == next.remote_off => {
                        let (a, b) = (wr.sges[wr.sges.len() - 1], next.sges[0]);
                        prop_assert!(wr.sges.len() == max_sge && a.local_off + a.len != b.local_off, "merge not maximal");
                    }
                    _ => {}
                }
            }
            if chunking {
                // Each WR of the unchunked plan is cut into chunk_count near-equal pieces.
                for (_, _, _, m) in flat(&unlimited) {
                    let pieces: Vec<u64> = f.iter().filter(|x| x.3.remote_off >= m.remote_off && x.3.remote_off < m.remote_off + m.len).map(|x| x.3.len).collect();
                    prop_assert_eq!(pieces.len() as u64, chunk_count(m.len, chunk_bytes, max_chunks, max_msg_sz));
                    prop_assert!(pieces.iter().max().unwrap() - pieces.iter().min().unwrap() <= 1);
                }
            }
            // Workers: contiguous near-equal shares of the non-empty entries, own QP slots.
            let n = batch.iter().filter(|s| s.len > 0).count();
            let used = if chunking { 1 } else { workers.min(c.num_qps).min(n).max(1) };
            let mut per_worker = vec![0usize; used];
            for s in batch.iter().filter(|s| s.len > 0) {
                let k = f.iter().position(|x| x.3.remote_off <= s.remote_off && s.remote_off < x.3.remote_off + x.3.len).unwrap();
                per_worker[f[k].2] += 1;
            }
            for (w, &cnt) in per_worker.iter().enumerate() {
                prop_assert_eq!(cnt, n / used + usize::from(w < n % used));
            }
            prop_assert!(f.windows(2).all(|x| x[0].2 <= x[1].2), "worker shares not in remote order");
            for w in 0..used {
                let slots: Vec<usize> = (w..c.num_qps).step_by(used).map(|p| (tid as usize + p) % c.num_qps).collect();
                for (k, x) in f.iter().filter(|x| x.2 == w).enumerate() {
                    let q = slots[k % slots.len()];
                    prop_assert_eq!((x.0, x.1), (q % nics, q / nics));
                }
            }
            let mut signaled = 0;
            for q in &p.queues {
                prop_assert!(q.wrs.windows(2).all(|x| x[0].remote_off < x[1].remote_off));
                for (i, wr) in q.wrs.iter().enumerate() {
                    prop_assert_eq!(wr.signaled, i + 1 == q.wrs.len() || (i + 1) % max_send_wr == 0);
                    signaled += usize::from(wr.signaled);
                }
            }
            prop_assert_eq!(p.signaled, signaled);
        }
    }
}
