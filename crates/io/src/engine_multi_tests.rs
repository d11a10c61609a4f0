//! The path `IoEngine::post_ordered_multi` takes after its checks, on tcp (which refuses
//! ordered batches, so these jobs are made unordered): `Connector::post_many` hands jobs made
//! together to their backend at once, and the default `Backend::post_many` posts each.

use super::*;
use crate::paged::Batch;
use mori_io_core::MemLoc;

fn side(key: &str, len: usize, seed: u8) -> (IoEngine, Vec<u8>, MemoryDesc) {
    let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.create_backend(BackendConfig::Tcp(TcpConfig::default())).unwrap();
    let mut buf: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    // SAFETY: `buf` is never reallocated and outlives every transfer (all waited for below);
    // the engine is dropped before it.
    let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
    (eng, buf, mem)
}

/// A batch of two entries: its remote region, local offsets, remote offsets, sizes.
type Planned<'a> = (&'a MemoryDesc, [u64; 2], [u64; 2], [u64; 2]);

#[test]
fn jobs_made_together_reach_their_backend_and_land() {
    let t = Duration::from_secs(20);
    let (a, abuf, am) = side("multi-a", 1 << 16, 1);
    let (b, bbuf, bm) = side("multi-b", 1 << 16, 2);
    let (c, cbuf, cm) = side("multi-c", 1 << 16, 3);
    for p in [&b, &c] {
        a.register_remote_engine(p.desc().clone()).unwrap();
        p.register_remote_engine(a.desc().clone()).unwrap();
    }
    // Connected first, so the jobs take the connector's at-once path.
    a.write(&am, 0, &bm, 0, 1, a.allocate_transfer_uid()).wait_for(t).unwrap();
    a.write(&am, 0, &cm, 0, 1, a.allocate_transfer_uid()).wait_for(t).unwrap();
    let plan: [Planned<'_>; 3] = [
        (&bm, [100, 9000], [200, 30_000], [5000, 16]),
        (&cm, [20_000, 40_000], [64, 50_000], [10_000, 8]),
        (&bm, [60_000, 61_000], [40_000, 41_000], [700, 300]),
    ];
    let mut jobs = Vec::new();
    let mut statuses = Vec::new();
    for (remote, lo, ro, sz) in &plan {
        let id = a.allocate_transfer_uid();
        match a.prepare(Op::Write, &am, remote, Batch::Ranges(lo, ro, sz), id, false) {
            Ok((be, req, st)) => {
                statuses.push(st.clone());
                jobs.push((be, req, st));
            }
            Err(st) => panic!("a good batch refused: {:?}", st.wait_for(t)),
        }
    }
    a.inner.connector.post_many(jobs, &a.inner.shutdown);
    for (i, st) in statuses.into_iter().enumerate() {
        st.wait_for(t).unwrap_or_else(|e| panic!("batch {i}: {e}"));
    }
    let mut want_b = bbuf.clone();
    let mut want_c = cbuf.clone();
    for (remote, lo, ro, sz) in &plan {
        let want = if remote.engine_key == "multi-c" { &mut want_c } else { &mut want_b };
        for e in 0..2 {
            let (l, r, n) = (lo[e] as usize, ro[e] as usize, sz[e] as usize);
            want[r..r + n].copy_from_slice(&abuf[l..l + n]);
        }
    }
    // The warm-up byte at 0 came from a's byte 0.
    want_b[0] = abuf[0];
    want_c[0] = abuf[0];
    assert!(bbuf == want_b, "b: the two batches to it landed, nothing else moved");
    assert!(cbuf == want_c, "c: its batch landed, nothing else moved");
    drop((a, b, c));
}
