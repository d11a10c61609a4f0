//! IntranodeEp on a real GPU (ignored here; scripts/gpu-machine.sh runs them with `--ignored`):
//! routing corner cases against the host reference, and the faults the kernels report.
//! 4 ranks share GPU 0 in this process; f32 rows, i32 ids.

use mori_ep::gpu::{CombineInput, CombineSpec, DispatchInput, DispatchSpec, DispatchTicket, EpGpuError, IntranodeEp};
use mori_ep::{dispatch, DispatchOptions, EpConfig, OutOfRange, RankInput, Tensor2};
use mori_gpu::{Device, DeviceBuffer, Runtime};
use std::sync::Arc;
use std::time::Duration;

const W: usize = 4;
const H: usize = 64;
const K: usize = 3;
const E: usize = 8;
const T: usize = 6;

fn runtime() -> Arc<dyn Runtime> {
    mori_gpu::detect().unwrap_or_else(|e| panic!("this test needs a GPU runtime: {e}"))
}

fn config() -> EpConfig {
    let mut c = EpConfig::new(W, H, E, K, T).unwrap();
    c.block_num = 4;
    c.warps_per_block = 4;
    c
}

fn ep(rt: &Arc<dyn Runtime>) -> IntranodeEp {
    let local: Vec<(usize, Device)> = (0..W).map(|r| (r, Device(0))).collect();
    IntranodeEp::new(rt.clone(), &config(), &local, None, Duration::from_secs(5), false).unwrap()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn up(rt: &Arc<dyn Runtime>, b: &[u8]) -> DeviceBuffer {
    let buf = rt.alloc(Device(0), b.len().max(16)).unwrap();
    if !b.is_empty() {
        rt.copy_htod(&buf.sub(0, b.len()).unwrap(), b).unwrap();
    }
    buf
}

struct Inputs {
    host: Vec<RankInput<f32, i32>>,
    dev: Vec<(DeviceBuffer, DeviceBuffer, DeviceBuffer)>, // x, weights, ids
}

fn inputs(rt: &Arc<dyn Runtime>, ids: &[Vec<i32>]) -> Inputs {
    let mut host = Vec::new();
    let mut dev = Vec::new();
    for (r, ids) in ids.iter().enumerate() {
        let t = ids.len() / K;
        let x = Tensor2::from_fn(t, H, |i, h| (r * 100 + i * 10 + h % 7) as f32).unwrap();
        let w = Tensor2::from_fn(t, K, |i, k| 0.5 + (i + k) as f32).unwrap();
        let idx = Tensor2::new(t, K, ids.clone()).unwrap();
        dev.push((
            up(rt, &f32_bytes(x.as_slice())),
            up(rt, &f32_bytes(w.as_slice())),
            up(rt, &ids.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()),
        ));
        host.push(RankInput { x, weights: w, scales: None, indices: idx });
    }
    Inputs { host, dev }
}

fn run_dispatch<'a>(
    ep: &mut IntranodeEp,
    rt: &Arc<dyn Runtime>,
    inp: &'a Inputs,
    drop: bool,
) -> Result<(Vec<usize>, DispatchTicket<'a>), EpGpuError> {
    let s = rt.stream(Device(0)).unwrap();
    let d: Vec<DispatchInput<'_>> = inp
        .dev
        .iter()
        .zip(&inp.host)
        .map(|((x, w, i), h)| DispatchInput {
            x: x.sub(0, h.x.rows() * H * 4).unwrap(),
            weights: Some(w.slice()),
            indices: i.slice(),
            scales: None,
            num_tokens: h.x.rows(),
        })
        .collect();
    let ticket = ep.dispatch(&d, DispatchSpec { elem_size: 4, idx_size: 4, drop_out_of_range: drop }, &[&s])?;
    s.synchronize().unwrap();
    Ok((ep.sync_status()?.iter().map(|s| s.recv_count).collect(), ticket))
}

/// Received (source flat index, row) pairs of every rank, sorted by source, against the oracle.
#[allow(clippy::needless_range_loop)] // r indexes several per-rank arrays
fn check_against_oracle(ep: &IntranodeEp, rt: &Arc<dyn Runtime>, inp: &Inputs, counts: &[usize], policy: OutOfRange) {
    let want = dispatch(&config(), &inp.host, DispatchOptions { out_of_range: policy }).unwrap();
    for r in 0..W {
        let n = counts[r];
        assert_eq!(n, want.ranks[r].num_recv(), "rank {r} received count");
        let [x, _, _, _, src] = ep.recv_slices(r, n, 4, 4).unwrap();
        let (mut xb, mut sb) = (vec![0u8; n * H * 4], vec![0u8; n * 4]);
        if n > 0 {
            rt.copy_dtoh(&mut xb, &x).unwrap();
            rt.copy_dtoh(&mut sb, &src).unwrap();
        }
        let mut got: Vec<(usize, Vec<u8>)> = (0..n)
            .map(|i| {
                let flat = i32::from_le_bytes(sb[4 * i..4 * i + 4].try_into().unwrap()) as usize;
                (flat, xb[i * H * 4..(i + 1) * H * 4].to_vec())
            })
            .collect();
        got.sort_by_key(|g| g.0);
        for (j, sp) in want.ranks[r].src.iter().enumerate() {
            assert_eq!(got[j].0, sp.flat(T), "rank {r} row {j} source");
            assert_eq!(got[j].1, f32_bytes(want.ranks[r].x.row(j).unwrap()), "rank {r} row {j} data");
        }
    }
}

#[test]
#[ignore = "needs a GPU (run on the GPU machine)"]
#[allow(clippy::needless_range_loop)] // r indexes several per-rank arrays
fn gpu_routing_corners_match_the_oracle() {
    let rt = runtime();
    let mut ep = ep(&rt);
    // Rank 0: every token to rank 1 (experts 2 and 3) plus a -1; rank 1: no tokens; rank 2:
    // all -1; rank 3: odd T = 5, spread over all ranks, duplicates within a rank.
    let ids =
        vec![vec![2, 3, -1, 3, 2, 2, -1, -1, 2], vec![], vec![-1, -1, -1, -1, -1, -1], vec![0, 7, 4, 1, 1, 1, 6, 5, -1, 3, 0, 7, 4, 4, 4]];
    let inp = inputs(&rt, &ids);
    let (counts, _) = run_dispatch(&mut ep, &rt, &inp, false).unwrap();
    println!("received per rank: {counts:?}");
    check_against_oracle(&ep, &rt, &inp, &counts, OutOfRange::Error);
    // Twice in a row (sequence numbers, counter parity): the same result.
    let (again, ticket) = run_dispatch(&mut ep, &rt, &inp, false).unwrap();
    assert_eq!(again, counts);
    check_against_oracle(&ep, &rt, &inp, &again, OutOfRange::Error);

    // Combine: unweighted f32 in/out over the received rows as they are (identity expert):
    // every token comes back times the number of unique ranks it went to.
    let s = rt.stream(Device(0)).unwrap();
    for r in 0..W {
        let n = counts[r];
        let [x, ..] = ep.recv_slices(r, n, 4, 4).unwrap();
        if n > 0 {
            rt.copy_dtod(&ep.combine_buffer(r, 4).unwrap().sub(0, n * H * 4).unwrap(), &x).unwrap();
        }
    }
    let outs: Vec<DeviceBuffer> = (0..W).map(|_| rt.alloc(Device(0), T * H * 4).unwrap()).collect();
    let ci: Vec<CombineInput<'_>> =
        outs.iter().map(|o| CombineInput { x: None, weights: None, weights_in_heap: false, out: o.slice(), out_weights: None }).collect();
    ep.combine(&ticket, &ci, CombineSpec { in_elem: 4, out_elem: 4, weighted: false, idx_size: 4 }, &[&s]).unwrap();
    s.synchronize().unwrap();
    ep.sync_status().unwrap();
    for (r, host) in inp.host.iter().enumerate() {
        let t = host.x.rows();
        let mut b = vec![0u8; t * H * 4];
        if t > 0 {
            rt.copy_dtoh(&mut b, &outs[r].sub(0, t * H * 4).unwrap()).unwrap();
        }
        for i in 0..t {
            let mut ranks: Vec<i32> = host.indices.row(i).unwrap().iter().filter(|&&e| e >= 0).map(|&e| e / 2).collect();
            ranks.sort();
            ranks.dedup();
            for h in 0..H {
                let got = f32::from_le_bytes(b[4 * (i * H + h)..4 * (i * H + h) + 4].try_into().unwrap());
                let want = host.x.row(i).unwrap()[h] * ranks.len() as f32;
                assert_eq!(got, want, "rank {r} token {i} column {h}");
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU (run on the GPU machine)"]
fn gpu_out_of_range_ids_are_reported_or_dropped() {
    let rt = runtime();
    let mut ep = ep(&rt);
    let ids = vec![vec![0, 9, 2], vec![1, -1, -1], vec![], vec![-3, 4, 4]];
    let inp = inputs(&rt, &ids);
    let e = run_dispatch(&mut ep, &rt, &inp, false).unwrap_err().to_string();
    println!("out of range: {e}");
    assert!(e.contains("is outside 0..8"), "{e}");
    assert!(e.starts_with("rank 0:") || e.starts_with("rank 3:"), "{e}");
    // The fault is cleared for the next call; with dropping, the valid slots still route.
    let (counts, _) = run_dispatch(&mut ep, &rt, &inp, true).unwrap();
    check_against_oracle(&ep, &rt, &inp, &counts, OutOfRange::Drop);
}

#[test]
#[ignore = "needs a GPU (run on the GPU machine)"]
fn gpu_combine_input_shorter_than_received_is_refused() {
    let rt = runtime();
    let mut ep = ep(&rt);
    let ids = vec![vec![0, 2, 4, 1, 3, 5], vec![6, 7, 0], vec![], vec![]];
    let inp = inputs(&rt, &ids);
    let (counts, ticket) = run_dispatch(&mut ep, &rt, &inp, false).unwrap();
    assert!(counts[0] >= 2, "{counts:?}");
    let s = rt.stream(Device(0)).unwrap();
    let short = rt.alloc(Device(0), H * 4).unwrap(); // one row
    let outs: Vec<DeviceBuffer> = (0..W).map(|_| rt.alloc(Device(0), T * H * 4).unwrap()).collect();
    let ci: Vec<CombineInput<'_>> = outs
        .iter()
        .enumerate()
        .map(|(r, o)| CombineInput {
            x: (r == 0).then(|| short.slice()),
            weights: None,
            weights_in_heap: false,
            out: o.slice(),
            out_weights: None,
        })
        .collect();
    ep.combine(&ticket, &ci, CombineSpec { in_elem: 4, out_elem: 4, weighted: false, idx_size: 4 }, &[&s]).unwrap();
    s.synchronize().unwrap();
    let e = ep.sync_status().unwrap_err().to_string();
    println!("short combine input: {e}");
    assert!(e.contains("rank 0: combine input buffer holds 1 rows but"), "{e}");
}

/// Across the 2^32 wrap of the sequence numbers: dispatch and combine from u32::MAX - 1 to 3,
/// each with its own routing (stale signals or flags taken for the current operation's would
/// show as wrong counts, rows or sums, or as a timeout).
#[test]
#[ignore = "needs a GPU (run on the GPU machine)"]
#[allow(clippy::needless_range_loop)] // r indexes several per-rank arrays
fn gpu_sequence_wraps_at_2_32() {
    let rt = runtime();
    let mut ep = ep(&rt);
    ep.set_sequence_for_tests(u32::MAX - 2).unwrap();
    let s = rt.stream(Device(0)).unwrap();
    for it in 0..6u32 {
        // Rank r's token i goes to experts (r + i + it) % E and (3 r + 5 i + 2 it + 1) % E, and
        // rank (it % W) sends nothing.
        let ids: Vec<Vec<i32>> = (0..W)
            .map(|r| {
                let t = if r == it as usize % W { 0 } else { T - (r + it as usize) % 3 };
                (0..t)
                    .flat_map(|i| {
                        let a = ((r + i + it as usize) % E) as i32;
                        let b = ((3 * r + 5 * i + 2 * it as usize + 1) % E) as i32;
                        [a, b, -1]
                    })
                    .collect()
            })
            .collect();
        let inp = inputs(&rt, &ids);
        let (counts, ticket) = run_dispatch(&mut ep, &rt, &inp, false).unwrap_or_else(|e| panic!("iteration {it}: {e}"));
        check_against_oracle(&ep, &rt, &inp, &counts, OutOfRange::Error);
        for r in 0..W {
            let n = counts[r];
            let [x, ..] = ep.recv_slices(r, n, 4, 4).unwrap();
            if n > 0 {
                rt.copy_dtod(&ep.combine_buffer(r, 4).unwrap().sub(0, n * H * 4).unwrap(), &x).unwrap();
            }
        }
        let outs: Vec<DeviceBuffer> = (0..W).map(|_| rt.alloc(Device(0), T * H * 4).unwrap()).collect();
        let ci: Vec<CombineInput<'_>> = outs
            .iter()
            .map(|o| CombineInput { x: None, weights: None, weights_in_heap: false, out: o.slice(), out_weights: None })
            .collect();
        ep.combine(&ticket, &ci, CombineSpec { in_elem: 4, out_elem: 4, weighted: false, idx_size: 4 }, &[&s]).unwrap();
        s.synchronize().unwrap();
        ep.sync_status().unwrap_or_else(|e| panic!("iteration {it} combine: {e}"));
        for (r, host) in inp.host.iter().enumerate() {
            let t = host.x.rows();
            let mut b = vec![0u8; t * H * 4];
            if t > 0 {
                rt.copy_dtoh(&mut b, &outs[r].sub(0, t * H * 4).unwrap()).unwrap();
            }
            for i in 0..t {
                let mut ranks: Vec<i32> = host.indices.row(i).unwrap().iter().filter(|&&e| e >= 0).map(|&e| e / 2).collect();
                ranks.sort();
                ranks.dedup();
                for h in 0..H {
                    let got = f32::from_le_bytes(b[4 * (i * H + h)..4 * (i * H + h) + 4].try_into().unwrap());
                    assert_eq!(got, host.x.row(i).unwrap()[h] * ranks.len() as f32, "iteration {it} rank {r} token {i} column {h}");
                }
            }
        }
        println!("iteration {it}: received {counts:?}");
    }
}
