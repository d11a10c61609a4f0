//! kernels/ep_internode.cu (AsyncLL, V1-LL, V1) on CPU threads (`MORI_HOST_EMU`), 3 nodes x 3 ranks: each
//! node's kernels launched by a thread of its own with only its own ranks' windows and counter
//! blocks addressable (another node's are 0 in the parameters: touching them would fault),
//! other nodes reached only through each rank's proxy ring, carried by a real `RingProxy`
//! over MORI-IO tcp into the peer's window (segments, then their counter pairs as tail writes).
//! Two rounds of dispatch and combine, each equal to the host reference bit for bit (received
//! rows in the reference's order; combine summed in the scheme's order: over destination ranks
//! ascending for AsyncLL, per node for V1 and V1-LL).

use super::abi::{scheme_flags, IeParams, IeRank, FLAG_COMB_ROWS, FLAG_RECV_WIN, FLAG_WEIGHTED};
use super::run::{combine_kernels, Grid, KERNELS};
use super::trace::{perfetto, slot, trace_bytes, RankStamps};
use super::*;
use crate::emu_support::{launch, Region};
use crate::gpu_ring::RingDev;
use crate::internode::Scheme;
use crate::proxy::{PeerWindow, RingProxy, RingProxyOptions};
use crate::ring::{CmdOp, RingCmd, RingConsumer, RingLayout, RingMem};
use crate::routing::SplitMix64;
use crate::{bf16, combine, dispatch, CombineOptions, DispatchOptions, RankInput, Tensor2, Weighting};
use mori_io::{BackendConfig, EngineConfig, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use std::sync::Arc;

// 3 nodes of 3 ranks, top-6: up to 3 rows per node and token, so that a relay's or a node's
// summation order shows (with 2 ranks per node every order is a + b = b + a).
const W: usize = 9;
const G: usize = 3;
// Over 256 columns and not a multiple of 256 (the sum's column groups, shared by the warps of a
// block with fewer tokens than warps), rows past 4 x 32 x 16 bytes (the row copy's unrolled
// loop) with a remainder.
const H: usize = 1040;
const K: usize = 6;
const E: usize = 18;
const TMAX: usize = 6;
const SCALES: usize = 2;
const BLOCKS: u32 = 2;
/// Blocks per rank of the kernels that wait for nothing (the stagings, dispatch's copy-out,
/// combine's sum), more than the others', as on a GPU.
const COPY_BLOCKS: u32 = 3;
/// Trace rows per rank: the wider of the two grids (as the host sizes them).
const TRACE_BLOCKS: u32 = if COPY_BLOCKS > BLOCKS { COPY_BLOCKS } else { BLOCKS };
const THREADS: u32 = 64;

/// One rank's memory, all host memory standing in for device and mapped memory.
struct RankMem {
    win: Region,
    dev_ctr: Region,
    ring_region: Region,
    head: Region,
    scratch: Vec<Region>, // mask, pre, cnt, recv_cnt, recv_base, done, trace, npre
    x: Region,
    w: Region,
    idx: Region,
    scales: Region,
    out: Vec<Region>, // x, w, idx, scales, src
    comb_x: Region,
    comb_w: Region,
    comb_out: Region,
    comb_out_w: Region,
    status: Region,
}

impl RankMem {
    fn new(l: &InterLayout) -> Self {
        let r = Region::new;
        let ring = RingLayout::new(16).unwrap();
        Self {
            win: r(l.window_bytes),
            dev_ctr: r(l.counter_bytes()),
            ring_region: r(ring.bytes()),
            head: r(64),
            scratch: vec![
                r(TMAX * 8),
                r((TMAX + 1) * W * 4),
                r(W * 4),
                r(W * 4),
                r(W * 4),
                r(l.done_bytes()),
                r(trace_bytes(W, TRACE_BLOCKS)),
                r((TMAX + 1) * l.nodes() * 4),
            ],
            x: r(TMAX * l.row_bytes),
            w: r(TMAX * K * 4),
            idx: r(TMAX * K * 8),
            scales: r(TMAX * SCALES * 4),
            out: vec![
                r(l.max_recv * l.row_bytes),
                r(l.max_recv * K * 4),
                r(l.max_recv * K * 8),
                r(l.max_recv * SCALES * 4),
                r(l.max_recv * 4),
            ],
            comb_x: r(l.max_recv * H * l.comb_elem),
            comb_w: r(l.max_recv * K * 4),
            comb_out: r(TMAX * H * 4),
            comb_out_w: r(TMAX * K * 4),
            status: r(64),
        }
    }

    fn write(&self, reg: &Region, bytes: &[u8]) {
        self.write_at(reg, 0, bytes);
    }

    fn write_at(&self, reg: &Region, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= reg.bytes().len());
        // SAFETY: inside the region; no kernel runs while the test writes inputs.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), reg.ptr.add(at), bytes.len()) };
    }

    fn abi(&self, rank: usize, tokens: usize, comb_rows: usize) -> IeRank {
        let s = &self.scratch;
        IeRank {
            rank: rank as u32,
            num_tokens: tokens as u32,
            comb_rows: comb_rows as u32,
            pad: 0,
            x: self.x.addr(),
            weights: self.w.addr(),
            idx: self.idx.addr(),
            scales: self.scales.addr(),
            mask: s[0].addr(),
            pre: s[1].addr(),
            npre: s[7].addr(),
            cnt: s[2].addr(),
            recv_cnt: s[3].addr(),
            recv_base: s[4].addr(),
            done: s[5].addr(),
            out_x: self.out[0].addr(),
            out_w: self.out[1].addr(),
            out_idx: self.out[2].addr(),
            out_scales: self.out[3].addr(),
            out_src: self.out[4].addr(),
            comb_x: self.comb_x.addr(),
            comb_w: self.comb_w.addr(),
            comb_out: self.comb_out.addr(),
            comb_out_w: self.comb_out_w.addr(),
            status: self.status.addr(),
            trace: s[6].addr(),
            ring: RingDev { head: self.head.addr(), region: self.ring_region.addr(), slots: 16, pad: 0 },
        }
    }

    fn status(&self) -> [u32; 5] {
        let b = self.status.bytes();
        std::array::from_fn(|i| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]))
    }
}

fn le<T: Copy>(v: &[T], f: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

fn inputs(rng: &mut SplitMix64, round: usize) -> Vec<RankInput<bf16, i64>> {
    (0..W)
        .map(|r| {
            // Rank 1 sends nothing in round 0; the others 1..=TMAX tokens.
            let t = if r == 1 && round == 0 { 0 } else { 1 + rng.below(TMAX as u64) as usize };
            let ids: Vec<i64> = (0..t * K).map(|_| rng.below(E as u64 + 1) as i64 - 1).collect();
            RankInput {
                // Values with full mantissas, so that a different summation order shows in the
                // low bits.
                x: Tensor2::from_fn(t, H, |_, _| bf16::from_f32((rng.below(1 << 16) as f32 / 4096.0 - 8.0) * 1.37)).unwrap(),
                weights: Tensor2::from_fn(t, K, |_, _| rng.below(1 << 20) as f32 / 3.3e5).unwrap(),
                scales: Some(Tensor2::from_fn(t, SCALES, |_, _| rng.below(100) as f32 * 0.5).unwrap()),
                indices: Tensor2::new(t, K, ids).unwrap(),
            }
        })
        .collect()
}

fn tcp_engine(key: &str) -> Arc<IoEngine> {
    let e = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    e.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 2, min_lane_bytes: 64, ..TcpConfig::default() })).unwrap();
    Arc::new(e)
}

/// The parameters of node `n`'s launches: only its ranks' windows and device counter blocks.
fn params(l: &InterLayout, mems: &[RankMem], ranks_abi: &Region, n: usize) -> IeParams {
    let mut win = [0u64; MAX_WORLD];
    let mut dev_ctr = [0u64; MAX_WORLD];
    for r in n * G..(n + 1) * G {
        win[r] = mems[r].win.addr();
        dev_ctr[r] = mems[r].dev_ctr.addr();
    }
    IeParams {
        win,
        dev_ctr,
        lay: l.lay,
        ranks: ranks_abi.addr(),
        timeout_ns: 20_000_000_000,
        num_local: G as u32,
        world: W as u32,
        gpn: G as u32,
        blocks_per_rank: BLOCKS,
        row_bytes: l.row_bytes as u32,
        hidden: H as u32,
        top_k: K as u32,
        idx_size: 8,
        scale_bytes: l.scale_bytes as u32,
        experts_per_rank: (E / W) as u32,
        max_tokens: TMAX as u32,
        max_recv: l.max_recv as u32,
        rec_bytes: l.rec_bytes as u32,
        comb_bytes: l.comb_bytes as u32,
        comb_elem: l.comb_elem as u32,
        out_elem: 4,
        flags: FLAG_WEIGHTED | scheme_flags(l.scheme),
        trace_blocks: TRACE_BLOCKS,
        part_bytes: l.part_bytes as u32,
    }
}

fn run_node(p: &IeParams, kernel: &str) {
    let grid = KERNELS.iter().find(|k| k.0 == kernel).map(|k| k.1);
    let per_rank = if grid == Some(Grid::Own) { COPY_BLOCKS } else { BLOCKS };
    let p = IeParams { blocks_per_rank: per_rank, ..*p };
    launch("ep_internode", kernel, p.num_local * per_rank, THREADS, &p);
}

/// How a run keeps its data: the combine input as rows in the window (`IE_FLAG_COMB_ROWS`),
/// the received records left in the window (`IE_FLAG_RECV_WIN`: no copy-out kernel).
#[derive(Clone, Copy)]
struct InWindow {
    comb_rows: bool,
    recv: bool,
}
const COPIES: InWindow = InWindow { comb_rows: false, recv: false };

#[test]
fn async_ll_three_nodes_of_three_through_proxies_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::AsyncLL, COPIES, None);
}

/// AsyncLL as `InterNodeGpu` runs it by default over xgmi: the received records read from the
/// window (no copy-out kernel; the dispatch kernel zeroes the counters), the combine input
/// written there as rows.
#[test]
fn async_ll_with_records_and_combine_rows_in_the_window_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::AsyncLL, InWindow { comb_rows: true, recv: true }, None);
}

/// V1 with the received records read from the window: one record per (token, node) stored by
/// the relay to each destination.
#[test]
fn v1_with_the_records_in_the_window_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::V1, InWindow { comb_rows: false, recv: true }, None);
}

/// V1-LL with the received records read from the window: the relays' forwarded records too.
#[test]
fn v1_ll_with_the_records_in_the_window_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::V1LL, InWindow { comb_rows: false, recv: true }, None);
}

/// V1 as `InterNodeGpu` runs it by default over xgmi: the records read from the window, the
/// combine input written there as rows, which the relays read in place for their partial sums
/// (staged in their gather areas) and this node's sources for their sums: no row is stored.
#[test]
fn v1_with_records_and_combine_rows_in_the_window_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::V1, InWindow { comb_rows: true, recv: true }, None);
}

/// V1-LL as `InterNodeGpu` runs it by default over xgmi (as V1's above).
#[test]
fn v1_ll_with_records_and_combine_rows_in_the_window_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::V1LL, InWindow { comb_rows: true, recv: true }, None);
}

/// V1-LL with f32 combine rows in the window: the relays' in-place reads at 4-byte elements.
#[test]
fn v1_ll_with_f32_combine_rows_in_the_window_equals_the_reference() {
    three_nodes_of_three(Scheme::V1LL, InWindow { comb_rows: true, recv: false }, None, 4);
}

/// V1 and V1-LL with rank 4's combine rows in the window one short: with no staging kernel,
/// combine's send refuses it, and the relays of rank 4's node see it before counting their sums
/// done and send no partial, so every rank fails (the others at their deadlines) instead of the
/// other nodes summing rows that were never given.
#[test]
fn v1_combine_rows_in_the_window_one_short_are_refused_by_the_kernel() {
    for scheme in [Scheme::V1, Scheme::V1LL] {
        three_nodes_of_three_equal_the_reference(scheme, InWindow { comb_rows: true, recv: true }, Some(Fault::Short(4)));
    }
}

/// V1-LL with a relay record naming a destination off the relay's node (a peer's bytes,
/// overwritten between dispatch and combine in relay 5's segment from node 0): the relay reads
/// the rows in place in the named rank's window, so it refuses the record (`IE_ERR_RELAY` with
/// the origin, the record and the rank named) instead of reading through it, with the rows in
/// the window and staged.
#[test]
fn v1_ll_relay_record_naming_a_rank_off_its_node_is_refused_in_combine() {
    for comb_rows in [true, false] {
        for d in [0, 1000] {
            three_nodes_of_three_equal_the_reference(Scheme::V1LL, InWindow { comb_rows, recv: true }, Some(Fault::Dest(5, d)));
        }
    }
}

/// AsyncLL with its combine input as rows in the window (`IE_FLAG_COMB_ROWS`): the proxy
/// moves another node's source's rows from the input itself, combine stages nothing.
#[test]
fn async_ll_with_combine_rows_in_the_window_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::AsyncLL, InWindow { comb_rows: true, recv: false }, None);
}

/// The same with rank 4's combine input one row short: with no staging kernel, combine's
/// send refuses it (`IE_ERR_COMBINE_ROWS` in rank 4's status, with both counts).
#[test]
fn async_ll_combine_rows_in_the_window_one_short_are_refused_by_the_kernel() {
    three_nodes_of_three_equal_the_reference(Scheme::AsyncLL, InWindow { comb_rows: true, recv: true }, Some(Fault::Short(4)));
}

/// V1 with rank 4's combine input one row short: the staging kernel refuses it; the relays
/// that wait for rank 4's gather counters and the ranks that wait for its rows give up at
/// their deadlines instead of hanging.
#[test]
fn v1_combine_input_one_short_is_refused_by_the_staging_kernel() {
    three_nodes_of_three_equal_the_reference(Scheme::V1, InWindow { comb_rows: false, recv: true }, Some(Fault::Short(4)));
}

#[test]
fn v1_ll_three_nodes_of_three_through_relays_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::V1LL, COPIES, None);
}

#[test]
fn v1_three_nodes_of_three_through_relays_equals_the_reference() {
    three_nodes_of_three_equal_the_reference(Scheme::V1, COPIES, None);
}

/// V1 and V1-LL with f32 combine inputs whose values bf16 cannot hold: the relays' partial sums
/// cross in f32 (a partial rounded to bf16 on the way shows in the combined rows).
#[test]
fn v1_and_v1_ll_with_f32_combine_inputs_equal_the_reference() {
    for scheme in [Scheme::V1, Scheme::V1LL] {
        three_nodes_of_three(scheme, COPIES, None, 4);
    }
}

/// A fault a run injects (one round; the run ends once the kernels refused it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// That rank's combine input is one row short of what it received.
    Short(usize),
    /// V1-LL: the destination of the first record in that relay's segment from node 0
    /// overwritten with the rank given, between dispatch and combine (not relay 4: its origin,
    /// rank 1, sends nothing in the first round).
    Dest(usize, u32),
}

/// `fault`: see [`Fault`]. Combine inputs in bf16.
fn three_nodes_of_three_equal_the_reference(scheme: Scheme, win: InWindow, fault: Option<Fault>) {
    three_nodes_of_three(scheme, win, fault, 2);
}

/// The same with combine inputs of `comb_elem` bytes: 2 (bf16, the received rows as they are)
/// or 4 (f32: each received row times 1 + j * 2^-10 for j = 0..4 by element, so every value
/// needs more than bf16's 8 mantissa bits).
fn three_nodes_of_three(scheme: Scheme, win: InWindow, fault: Option<Fault>, comb_elem: usize) {
    let comb_rows = win.comb_rows;
    let mut cfg = EpConfig::with_gpus_per_node(W, G, H, E, K, TMAX).unwrap();
    cfg.scale_dim = SCALES;
    cfg.scale_type_size = 4;
    cfg.max_token_type_size = 2;
    let l = InterLayout::new(&cfg, scheme, 2, 8, comb_elem).unwrap();
    let mems: Vec<RankMem> = (0..W).map(|_| RankMem::new(&l)).collect();
    let engines: Vec<Arc<IoEngine>> = (0..W).map(|r| tcp_engine(&format!("ie-emu-r{r}"))).collect();
    // SAFETY: the windows outlive the registrations (deregistered at the end).
    let regs: Vec<MemoryDesc> = (0..W)
        .map(|r| unsafe { engines[r].register_memory(mems[r].win.ptr, l.window_bytes, MemLoc::Host { numa: None }).unwrap() })
        .collect();
    let mut proxies = Vec::new();
    for r in 0..W {
        let mut peers = vec![None; W];
        for (d, peer) in peers.iter_mut().enumerate() {
            if d / G != r / G {
                engines[r].register_remote_engine(engines[d].desc().clone()).unwrap();
                *peer = Some(PeerWindow::single(regs[d].clone()));
            }
        }
        // SAFETY: 64-aligned zeroed region living as long as `mems` (the proxies stop first).
        let ring = unsafe { RingMem::new(mems[r].ring_region.ptr, RingLayout::new(16).unwrap()).unwrap() };
        proxies.push(
            RingProxy::start(&format!("ie{r}"), engines[r].clone(), regs[r].clone(), peers, ring, RingProxyOptions::SHORT_SPIN).unwrap(),
        );
    }
    let mut rng = SplitMix64::new(0x1e_2024);
    // Bytes each rank's proxy moves: the scheme's inter-node segments, summed over the rounds.
    let mut leg_bytes = [0u64; W];
    for round in 0..if fault.is_some() { 1 } else { 2 } {
        let inp = inputs(&mut rng, round);
        for (r, b) in leg_bytes.iter_mut().enumerate() {
            *b += expected_leg_bytes(&l, &inp, r);
        }
        let want = dispatch(&cfg, &inp, DispatchOptions::default()).unwrap();
        for (r, i) in inp.iter().enumerate() {
            let m = &mems[r];
            m.write(&m.x, &le(i.x.as_slice(), |v: bf16| v.to_bits().to_le_bytes().to_vec()));
            m.write(&m.w, &le(i.weights.as_slice(), |v: f32| v.to_le_bytes().to_vec()));
            m.write(&m.idx, &le(i.indices.as_slice(), |v: i64| v.to_le_bytes().to_vec()));
            m.write(&m.scales, &le(i.scales.as_ref().unwrap().as_slice(), |v: f32| v.to_le_bytes().to_vec()));
            // The status words zeroed before each dispatch, as InterNodeGpu's upload does.
            m.write(&m.status, &[0u8; 64]);
        }
        // Combine inputs: each rank returns its received rows (bf16 as they are, or widened
        // to f32 with extra mantissa bits) with their received weights; the reference gets
        // the same.
        let abi_regions: Vec<Region> = (0..W / G).map(|_| Region::new(G * std::mem::size_of::<IeRank>())).collect();
        for (n, reg) in abi_regions.iter().enumerate() {
            for (j, r) in (n * G..(n + 1) * G).enumerate() {
                let given = want.ranks[r].num_recv() - usize::from(fault == Some(Fault::Short(r)));
                let mut a = mems[r].abi(r, inp[r].x.rows(), given);
                if comb_rows {
                    a.comb_x = mems[r].win.addr() + l.lay.out_comb;
                    a.comb_w = 0;
                }
                // SAFETY: the region holds G IeRank structs.
                unsafe { (reg.ptr as *mut IeRank).add(j).write(a) };
            }
        }
        let flags = if comb_rows { FLAG_COMB_ROWS } else { 0 } | if win.recv { FLAG_RECV_WIN } else { 0 };
        let ps: Vec<IeParams> = (0..W / G)
            .map(|n| {
                let p = params(&l, &mems, &abi_regions[n], n);
                IeParams { flags: p.flags | flags, ..p }
            })
            .collect();
        // Dispatch: each node's kernels in stream order on a thread of its own.
        std::thread::scope(|s| {
            for p in &ps {
                s.spawn(move || {
                    // With the records in the window, no copy-out (as InterNodeGpu does).
                    let copy_out = ["mori_ie_dispatch_recv"].into_iter().filter(|_| !win.recv);
                    for k in ["mori_ie_dispatch_stage", "mori_ie_dispatch"].into_iter().chain(copy_out) {
                        run_node(p, k);
                    }
                });
            }
        });
        for r in 0..W {
            let st = mems[r].status();
            let rr = &want.ranks[r];
            let n = rr.num_recv();
            assert_eq!(st[1], 0, "round {round} rank {r}: fault {st:?}; proxy {:?}", proxies[r].failure());
            assert_eq!(st[0] as usize, n, "round {round} rank {r}: received count");
            let got = if win.recv { records_in_window(&l, &mems[r], n) } else { copied_out(&l, &mems[r], n) };
            assert_eq!(got.x, le(rr.x.as_slice(), |v: bf16| v.to_bits().to_le_bytes().to_vec()), "rank {r} rows");
            assert_eq!(got.weights, le(rr.weights.as_slice(), |v: f32| v.to_le_bytes().to_vec()), "rank {r} weights");
            assert_eq!(got.idx, le(rr.indices.as_slice(), |v: i64| v.to_le_bytes().to_vec()), "rank {r} ids");
            assert_eq!(got.scales, le(rr.scales.as_ref().unwrap().as_slice(), |v: f32| v.to_le_bytes().to_vec()), "rank {r} scales");
            let src: Vec<u8> = rr.src.iter().flat_map(|s| (s.flat(TMAX) as i32).to_le_bytes()).collect();
            assert_eq!(got.src, src, "rank {r} sources");
            if win.recv {
                // The copy-out's buffers stay untouched.
                assert!(mems[r].out.iter().all(|o| o.bytes().iter().all(|&b| b == 0)), "rank {r}: copy-out buffers written");
            }
            let m = &mems[r];
            let wb = le(comb_weights(rr, r).as_slice(), |v: f32| v.to_le_bytes().to_vec());
            let xb = if comb_elem == 4 { le(widened(&rr.x).as_slice(), |v: f32| v.to_le_bytes().to_vec()) } else { got.x };
            if comb_rows {
                m.write_at(&m.win, l.lay.out_comb as usize, &l.combine_rows(&xb, &wb));
            } else {
                m.write(&m.comb_x, &xb);
                m.write(&m.comb_w, &wb);
            }
        }
        if let Some(Fault::Dest(rr, d)) = fault {
            // x[1] of the record's tail (after the row, weights, ids, scales and the source).
            let tail: usize = l.record_fields()[..4].iter().sum();
            let at = (l.lay.relay_in + l.lay.relay_hdr) as usize + tail + 4;
            mems[rr].write_at(&mems[rr].win, at, &d.to_le_bytes());
        }
        // Combine. A refused rank's peers wait for its rows until their deadline: a short one.
        let ps_comb: Vec<IeParams> =
            ps.iter().map(|p| IeParams { timeout_ns: if fault.is_some() { 1_000_000_000 } else { p.timeout_ns }, ..*p }).collect();
        std::thread::scope(|s| {
            for p in &ps_comb {
                s.spawn(move || {
                    // With the input rows in the window there is nothing to stage: the
                    // kernel is not launched (as InterNodeGpu does).
                    for k in combine_kernels(comb_rows, scheme != Scheme::AsyncLL) {
                        run_node(p, KERNELS[k].0);
                    }
                });
            }
        });
        if let Some(f) = fault {
            match f {
                Fault::Short(sr) => {
                    let n = want.ranks[sr].num_recv() as u32;
                    let st = mems[sr].status();
                    assert_eq!(
                        (st[1], st[2], st[3]),
                        (5, n - 1, n),
                        "rank {sr}: IE_ERR_COMBINE_ROWS with the rows given and received {st:?}"
                    );
                    // No rank sums rows that were never given: the others fail too.
                    for (r, m) in mems.iter().enumerate() {
                        assert_ne!(m.status()[1], 0, "rank {r} finished combine beside rank {sr}'s short input");
                    }
                }
                Fault::Dest(rr, d) => {
                    // Origin: the rank of node 0 with the relay's local index; record 0.
                    let st = mems[rr].status();
                    assert_eq!((st[1], st[2], st[3], st[4]), (8, (rr % G) as u32, 0, d), "relay {rr}: IE_ERR_RELAY {st:?}");
                    // The failed relay handed no partial over: the origin waited for it to its
                    // deadline (IE_ERR_TIMEOUT in combine, writer the relay).
                    let so = mems[rr % G].status();
                    assert_eq!((so[1], so[2], so[3]), (3, 2, rr as u32), "origin {}: {so:?}", rr % G);
                }
            }
            for (r, s) in stats_of(&proxies).into_iter().enumerate() {
                assert!(s.is_none(), "rank {r}: proxy failed {s:?}");
            }
            for (r, wm) in regs.iter().enumerate() {
                engines[r].deregister_memory(wm).unwrap();
            }
            return;
        }
        let ws: Vec<Tensor2<f32>> = want.ranks.iter().enumerate().map(|(r, rr)| comb_weights(rr, r)).collect();
        let idx: Vec<Tensor2<i64>> = inp.iter().map(|i| i.indices.clone()).collect();
        let opts = CombineOptions { weighting: Weighting::RankSlotSum, order: scheme.sum_order(), ..CombineOptions::default() };
        let out = if comb_elem == 4 {
            let xs: Vec<Tensor2<f32>> = want.ranks.iter().map(|r| widened(&r.x)).collect();
            combine::<f32, f32, i64>(&cfg, &want.handle, &xs, Some(&ws), &idx, opts).unwrap()
        } else {
            let xs: Vec<Tensor2<bf16>> = want.ranks.iter().map(|r| r.x.clone()).collect();
            combine::<bf16, f32, i64>(&cfg, &want.handle, &xs, Some(&ws), &idx, opts).unwrap()
        };
        for r in 0..W {
            let st = mems[r].status();
            assert_eq!(st[1], 0, "round {round} rank {r}: combine fault {st:?}; proxy {:?}", proxies[r].failure());
            let t = inp[r].x.rows();
            let got_x: Vec<u32> =
                mems[r].comb_out.bytes()[..t * H * 4].chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            let want_x: Vec<u32> = out[r].x.as_slice().iter().map(|v| v.to_bits()).collect();
            assert_eq!(got_x, want_x, "round {round} rank {r}: combined rows");
            let got_w: Vec<u32> =
                mems[r].comb_out_w.bytes()[..t * K * 4].chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            let want_w: Vec<u32> = out[r].weights.as_ref().unwrap().as_slice().iter().map(|v| v.to_bits()).collect();
            assert_eq!(got_w, want_w, "round {round} rank {r}: combined weights");
            // Every counter was zeroed by its reader.
            assert!(mems[r].dev_ctr.bytes()[..l.counter_bytes()].iter().all(|&b| b == 0), "rank {r}: device counters left set");
            let pairs = l.lay.ctr as usize..l.lay.ctr as usize + l.pair_bytes();
            assert!(mems[r].win.bytes()[pairs].iter().all(|&b| b == 0), "rank {r}: window counter pairs left set");
        }
    }
    check_trace(&mems, scheme, !comb_rows, !win.recv);
    let stats: Vec<_> = proxies.into_iter().map(|p| p.stop().unwrap()).collect();
    // One command per inter-node peer and phase in each of the two rounds: every rank of the
    // other node (AsyncLL), or only the relay there (V1-LL, V1); and the scheme's bytes.
    let peers = if scheme == Scheme::AsyncLL { W - G } else { W / G - 1 };
    for (r, s) in stats.iter().enumerate() {
        assert_eq!(s.commands, 2 * 2 * peers as u64, "rank {r}: proxy commands {s:?}");
        assert_eq!(s.bytes, leg_bytes[r], "rank {r}: bytes through the proxy {s:?}");
    }
    for (r, wm) in regs.iter().enumerate() {
        engines[r].deregister_memory(wm).unwrap();
    }
}

/// Received bf16 rows as f32 combine inputs that bf16 cannot hold: element j of a row times
/// 1 + (j % 5) * 2^-10.
fn widened(x: &Tensor2<bf16>) -> Tensor2<f32> {
    Tensor2::from_fn(x.rows(), x.cols(), |i, j| x.as_slice()[i * x.cols() + j].to_f32() * (1.0 + (j % 5) as f32 / 1024.0)).unwrap()
}

/// Rank `m`'s `n` received records as the copy-out kernel wrote them.
fn copied_out(l: &InterLayout, m: &RankMem, n: usize) -> RecvBytes {
    let o = &m.out;
    let part = |i: usize, len: usize| o[i].bytes()[..n * len].to_vec();
    RecvBytes { x: part(0, l.row_bytes), weights: part(1, K * 4), idx: part(2, K * 8), scales: part(3, l.scale_bytes), src: part(4, 4) }
}

/// Rank `m`'s received records read from its window as `InterNodeGpu` reads them: each
/// source's `recv_cnt[s]` records from its segment, in source order (`n` in all).
fn records_in_window(l: &InterLayout, m: &RankMem, n: usize) -> RecvBytes {
    let win = m.win.bytes();
    let read = |off: usize, buf: &mut [u8]| -> Result<(), EpError> {
        buf.copy_from_slice(&win[off..off + buf.len()]);
        Ok(())
    };
    let cnt: &[u32] = &m.scratch[3].bytes()[..W * 4].chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    let got = l.gather_records(cnt, &mut vec![0u8; n * l.rec_bytes], read).unwrap();
    // Counts that do not add up to the received count are refused.
    let e = l.gather_records(cnt, &mut vec![0u8; (n + 1) * l.rec_bytes], read).unwrap_err().to_string();
    assert!(e.contains(&format!("the sources' counts add up to {n}")), "{e}");
    if n > 0 {
        let e = l.gather_records(cnt, &mut vec![0u8; (n - 1) * l.rec_bytes], read).unwrap_err().to_string();
        assert!(e.contains("count passes them"), "{e}");
    }
    got
}

/// Each proxy's failure, if any.
fn stats_of(proxies: &[RingProxy]) -> Vec<Option<String>> {
    proxies.iter().map(|p| p.failure()).collect()
}

/// Rank `r`'s combine weights: its received weights times a factor of its own, so that every
/// rank returns different weight rows (and their summation order shows).
fn comb_weights(rr: &crate::RankRecv<bf16, i64, f32>, r: usize) -> Tensor2<f32> {
    let f = 1.0 + 0.137 * r as f32;
    rr.weights.map(|&v| v * f)
}

/// The ranks token `t` of `inp` goes to (one bit per rank).
fn dest_mask(inp: &RankInput<bf16, i64>, t: usize) -> u64 {
    inp.indices.row(t).unwrap().iter().filter(|&&e| e >= 0).fold(0, |m, &e| m | 1 << (e as usize / (E / W)))
}

/// The bytes rank `r`'s proxy moves in one round: AsyncLL, its records for each rank of the
/// other node and the rows it returns to them; V1-LL and V1, one relay segment per other node
/// (header and records: one per (token, destination) there, or one per token) and, as a relay,
/// one partial per token of its partner there with a destination on this node.
fn expected_leg_bytes(l: &InterLayout, inp: &[RankInput<bf16, i64>], r: usize) -> u64 {
    let node = |d: usize| d / G;
    let on = |m: u64, n: usize| (m >> (n * G)) & ((1 << G) - 1);
    let tokens = |s: usize| (0..inp[s].x.rows()).map(move |t| dest_mask(&inp[s], t));
    let mut b = 0u64;
    for s in (0..W).filter(|&s| node(s) != node(r)) {
        b += match l.scheme {
            // r's records for s, and r's rows for s's tokens.
            Scheme::AsyncLL => {
                tokens(r).filter(|m| m >> s & 1 == 1).count() as u64 * l.rec_bytes as u64
                    + tokens(s).filter(|m| m >> r & 1 == 1).count() as u64 * l.comb_bytes as u64
            }
            _ if s % G != r % G => 0,
            // The relay segment for s's node, and the partials for s's tokens.
            scheme => {
                let recs: u64 = tokens(r)
                    .map(|m| if scheme == Scheme::V1LL { on(m, node(s)).count_ones() as u64 } else { u64::from(on(m, node(s)) != 0) })
                    .sum();
                let parts = tokens(s).filter(|&m| on(m, node(r)) != 0).count() as u64;
                l.lay.relay_hdr + recs * l.rec_bytes as u64 + parts * l.part_bytes as u64
            }
        };
    }
    b
}

/// The last round's trace stamps: every phase stamped in order on every block, every command
/// to another node pushed before its receiver saw the segment, and the Perfetto form with
/// each span's begin and end. `staged`: combine's staging kernel ran; `copied`: dispatch's
/// copy-out kernel ran.
fn check_trace(mems: &[RankMem], scheme: Scheme, staged: bool, copied: bool) {
    let stamps: Vec<RankStamps> = (0..W)
        .map(|r| RankStamps::parse(r, W, TRACE_BLOCKS, &mems[r].scratch[6].bytes()[..trace_bytes(W, TRACE_BLOCKS)]).unwrap())
        .collect();
    use slot::*;
    for s in &stamps {
        let r = s.rank;
        let b0 = &s.blocks[0];
        assert!(b0[INTRA] <= b0[RECVD], "rank {r}: block 0 received before its own sends {b0:?}");
        if scheme != Scheme::AsyncLL {
            assert!(b0[FWD1] <= b0[RECVD], "rank {r}: block 0 received before its relay forwarding ended {b0:?}");
        }
        // Block 0 waits for every rank's rows at the end of combine_send, before the sum.
        assert!(b0[CINTRA] <= b0[RED0] && b0[RED0] <= b0[CRECVD], "rank {r}: block 0's combine wait {b0:?}");
        for (b, t) in s.blocks.iter().enumerate() {
            // The blocks past BLOCKS run only the stagings, the copy-out, the relay's sums and
            // the sum.
            let waits_for_nothing = b >= BLOCKS as usize;
            // The slots a block stamps, in time order: the kernels it ran in stream order (its
            // share's layout first, in the staging kernel).
            let mut chain = vec![LAYOUT0, LAYOUT1, DISP0, STAGED];
            if !waits_for_nothing {
                chain.extend([DISP1, INTRA]);
            }
            if copied {
                chain.extend([COPY0, COPY1]);
            }
            if staged {
                chain.extend([COMB0, CSTAGED]);
            }
            if scheme != Scheme::AsyncLL {
                // The relay kernel, after the staging and before the send.
                chain.extend([RRED0, RRED1]);
            }
            if !waits_for_nothing {
                chain.extend([COMB1, CINTRA]);
            }
            chain.extend([CRECVD, RED1]);
            for x in chain.windows(2) {
                assert!(t[x[0]] > 0 && t[x[0]] <= t[x[1]], "rank {r} block {b}: slot {} then {}: {t:?}", x[0], x[1]);
            }
            if !copied {
                assert_eq!((t[COPY0], t[COPY1]), (0, 0), "rank {r} block {b}: the records stayed in the window, no copy-out ran {t:?}");
            }
            if !staged {
                assert_eq!((t[COMB0], t[CSTAGED]), (0, 0), "rank {r} block {b}: combine staged nothing, no kernel ran {t:?}");
            }
            if waits_for_nothing {
                assert_eq!(
                    (t[DISP1], t[INTRA], t[COMB1], t[CINTRA], t[RED0]),
                    (0, 0, 0, 0, 0),
                    "rank {r} block {b}: only the stagings, the copy-out and the sum {t:?}"
                );
                continue;
            }
            assert_eq!(t[RED0] > 0, b == 0, "rank {r} block {b}: only block 0 waits for the rows {t:?}");
            // The relay steps: stamped between the phases around them under V1 and V1-LL,
            // never under AsyncLL.
            if scheme == Scheme::AsyncLL {
                assert_eq!((t[FWD1], t[RRED0], t[RRED1]), (0, 0, 0), "rank {r} block {b}: AsyncLL has no relay steps: {t:?}");
            } else {
                // The slot after dispatch's in the chain: the copy-out's or combine's start.
                let next = chain[chain.iter().position(|&x| x == INTRA).unwrap() + 1];
                assert!(t[INTRA] <= t[FWD1] && t[FWD1] <= t[next], "rank {r} block {b}: relay forwarding out of place {t:?}");
                assert!(b != 0 || t[RRED1] <= t[RED0], "rank {r}: block 0 waits after its relay reduce {t:?}");
            }
        }
        // The inter-node peers: every rank of the other node (AsyncLL), or the relay there
        // (V1-LL: the rank with this rank's local index).
        for q in (0..W).filter(|q| q / G != r / G && (scheme == Scheme::AsyncLL || q % G == r % G)) {
            for ph in 0..2 {
                let (pushed, seen) = (s.pushed[ph][q], stamps[q].seen[ph][r]);
                assert!(pushed > 0 && pushed <= seen, "phase {ph}: rank {r} pushed for {q} at {pushed}, seen at {seen}");
            }
        }
    }
    let traces = perfetto(&stamps, G);
    let peers = if scheme == Scheme::AsyncLL { W - G } else { W / G - 1 };
    assert_eq!(traces.len(), W);
    for (r, t) in &traces {
        let count = |name: &str, ph: &str| t.trace_events.iter().filter(|e| e.name == name && e.ph == ph).count();
        for (name, n) in [
            ("dispatch_layout", COPY_BLOCKS as usize),
            ("ep_dispatch_copy_to_staging", COPY_BLOCKS as usize),
            ("dispatch_intra", BLOCKS as usize),
            ("dispatch_sync", 1),
            ("dispatch_inter_node_send", peers),
            ("dispatch_inter_node_recv", peers),
            ("combine_inter_node", peers),
            ("ep_combine_all", COPY_BLOCKS as usize),
            ("dispatch_copy_out", if copied { COPY_BLOCKS as usize } else { 0 }),
            ("combine_copy_to_staging", if staged { COPY_BLOCKS as usize } else { 0 }),
            ("combine_intra_node", BLOCKS as usize),
            ("combine_sync", 1),
            ("dispatch_relay_forward", if scheme == Scheme::AsyncLL { 0 } else { BLOCKS as usize }),
            ("combine_relay_reduce", if scheme == Scheme::AsyncLL { 0 } else { COPY_BLOCKS as usize }),
        ] {
            assert_eq!((count(name, "B"), count(name, "E")), (n, n), "rank {r}: {name}");
        }
        // Block 0's wait starts where its relay forwarding ended (no two spans of a tid start
        // together).
        let at = |name: &str, ph: &str| t.trace_events.iter().find(|e| e.name == name && e.ph == ph && e.tid == 0).map(|e| e.ts);
        if scheme != Scheme::AsyncLL {
            assert_eq!(at("dispatch_sync", "B"), at("dispatch_relay_forward", "E"), "rank {r}");
        } else {
            assert_eq!(at("dispatch_sync", "B"), at("dispatch_intra", "E"), "rank {r}");
        }
    }
}

/// Rank 0's buffers of `T` tokens with expert ids `ids` (`[T, K]`), run through the dispatch
/// staging kernel alone on `blocks` blocks (node 0, only rank 0): its mask, pre and npre
/// regions (`[T]`, `[T + 1, W]`, `[T + 1, W / G]`), with `mems[0]`'s status and counts.
struct StageRun {
    mems: Vec<RankMem>,
    mask: Region,
    pre: Region,
    npre: Region,
}

fn stage_alone(l: &InterLayout, ids: &[i64], blocks: u32) -> StageRun {
    let t = ids.len() / K;
    let mems: Vec<RankMem> = (0..W).map(|_| RankMem::new(l)).collect();
    let m = &mems[0];
    let (idx, mask, pre) = (Region::new(t * K * 8), Region::new(t * 8), Region::new((t + 1) * W * 4));
    let npre = Region::new((t + 1) * (W / G) * 4);
    // The staging that follows the layout reads T tokens' rows, weights and scales.
    let (x, w, sc) = (Region::new(t * l.row_bytes), Region::new(t * K * 4), Region::new(t * l.scale_bytes.max(1)));
    m.write(&idx, &le(ids, |v: i64| v.to_le_bytes().to_vec()));
    let a = IeRank {
        num_tokens: t as u32,
        idx: idx.addr(),
        mask: mask.addr(),
        pre: pre.addr(),
        npre: npre.addr(),
        x: x.addr(),
        weights: w.addr(),
        scales: sc.addr(),
        ..m.abi(0, t, 0)
    };
    let abi = Region::new(std::mem::size_of::<IeRank>());
    // SAFETY: the region holds one IeRank.
    unsafe { (abi.ptr as *mut IeRank).write(a) };
    let p = IeParams { num_local: 1, blocks_per_rank: blocks, ..params(l, &mems, &abi, 0) };
    launch("ep_internode", "mori_ie_dispatch_stage", blocks, THREADS, &p);
    StageRun { mems, mask, pre, npre }
}

/// The commands in rank `m`'s ring (nobody consumes it when the staging kernel runs alone),
/// in push order.
fn ring_commands(m: &RankMem) -> Vec<RingCmd> {
    // SAFETY: the region holds a ring of 16 slots (RankMem::new) and outlives the consumer.
    let ring = unsafe { RingMem::new(m.ring_region.ptr, RingLayout::new(16).unwrap()).unwrap() };
    let mut out = Vec::new();
    RingConsumer::new(ring).poll(&mut out, 16).unwrap();
    out
}

/// The staging kernel's last block hands over one segment per other node's relay (V1, V1-LL)
/// or per other node's rank (AsyncLL), each the records counted for it (after the relay
/// header, which holds the counts per local index and the segment's record count: V1-LL one
/// record per (token, destination), V1 one per token with a destination on the node, `nodes`
/// `[W / G]` the tokens sent to each node), with its counter pair as the tail; the kernel's
/// finished-block count is back at 0 for the next call.
fn assert_handed_over(l: &InterLayout, m: &RankMem, cnt: &[u32], nodes: &[u32], what: &str) {
    let cmds = ring_commands(m);
    let relay = l.scheme != Scheme::AsyncLL;
    let peers: Vec<usize> = if relay { (1..W / G).map(|n| n * G).collect() } else { (G..W).collect() };
    let mut got: Vec<u32> = cmds.iter().map(|c| c.dst).collect();
    got.sort();
    assert_eq!(got, peers.iter().map(|&d| d as u32).collect::<Vec<_>>(), "{what}: one command per peer");
    for c in &cmds {
        let d = c.dst as usize;
        let n: u32 = match l.scheme {
            Scheme::V1 => nodes[d / G],
            Scheme::V1LL => cnt[d..d + G].iter().sum(),
            _ => cnt[d],
        };
        let want = if relay { l.lay.relay_hdr + n as u64 * l.rec_bytes as u64 } else { n as u64 * l.rec_bytes as u64 };
        assert_eq!(c.len, want, "{what}: bytes for rank {d}");
        let CmdOp::Tail { src, total } = c.op else { panic!("{what}: rank {d}'s counter pair as the tail write, {c:?}") };
        // The command carries the pair it points at: (total - 1, total), as in the window.
        let pair = &m.win.bytes()[src as usize..][..16];
        let pair = [0, 8].map(|o| u64::from_le_bytes(pair[o..o + 8].try_into().unwrap()));
        assert_eq!(total, Some(pair[1]), "{what}: rank {d}'s command carries its pair's total");
        assert_eq!(pair[0] + 1, pair[1], "{what}: rank {d}'s pair is (count, count + 1)");
        if relay {
            let hdr = &m.win.bytes()[c.local_off as usize..][..4 * (G + 1)];
            let hdr: Vec<u32> = hdr.chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
            let mut want_hdr = cnt[d..d + G].to_vec();
            want_hdr.push(n);
            assert_eq!(hdr, want_hdr, "{what}: relay header for node {}", d / G);
        }
    }
    let done = &m.scratch[5].bytes()[3 * 4..4 * 4];
    assert_eq!(done, &[0u8; 4], "{what}: the staging kernel's finished-block count");
}

/// The layout of the dispatch staging kernel over several tiles (150 tokens, 64 threads a
/// tile), on one block (its share spans three tiles) and on four (each block's share starts
/// with the counts of the tokens before it), V1-LL on both and V1 on four: masks, the
/// exclusive per-destination and per-node prefixes and the counts equal a sequential walk,
/// whichever block wrote them; then the last block's hand-over ([`assert_handed_over`]).
#[test]
fn layout_over_several_tiles_and_blocks_equals_a_sequential_walk() {
    const T: usize = 150;
    let mut cfg = EpConfig::with_gpus_per_node(W, G, H, E, K, T).unwrap();
    cfg.max_recv_tokens = T * W;
    for (scheme, blocks) in [(Scheme::V1LL, 1u32), (Scheme::V1LL, 4), (Scheme::V1, 4)] {
        let l = InterLayout::new(&cfg, scheme, 2, 8, 2).unwrap();
        let mut rng = SplitMix64::new(0x1a_7041 + blocks as u64);
        let ids: Vec<i64> = (0..T * K).map(|_| rng.below(E as u64 + 1) as i64 - 1).collect();
        let StageRun { mems, mask, pre, npre } = stage_alone(&l, &ids, blocks);
        let m = &mems[0];
        let u64s: Vec<u64> = mask.bytes()[..T * 8].chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let u32s = |b: &[u8]| -> Vec<u32> { b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect() };
        let (got_pre, got_cnt) = (u32s(&pre.bytes()[..(T + 1) * W * 4]), u32s(&m.scratch[2].bytes()[..W * 4]));
        let got_npre = u32s(&npre.bytes()[..(T + 1) * (W / G) * 4]);
        let mut run = [0u32; W];
        let mut nrun = [0u32; W / G];
        for t in 0..T {
            let want: u64 = ids[t * K..(t + 1) * K].iter().filter(|&&e| e >= 0).fold(0, |m, &e| m | 1 << (e as usize / (E / W)));
            assert_eq!(u64s[t], want, "{blocks} blocks, token {t}: mask");
            for d in 0..W {
                assert_eq!(got_pre[t * W + d], run[d], "{blocks} blocks, token {t}, rank {d}: tokens before it");
                run[d] += ((want >> d) & 1) as u32;
            }
            for n in 0..W / G {
                assert_eq!(got_npre[t * (W / G) + n], nrun[n], "{blocks} blocks, token {t}, node {n}: tokens before it");
                nrun[n] += u32::from((want >> (n * G)) & ((1 << G) - 1) != 0);
            }
        }
        assert_eq!(&got_pre[T * W..], &run[..], "{blocks} blocks");
        assert_eq!(&got_npre[T * (W / G)..], &nrun[..], "{blocks} blocks");
        assert_eq!(got_cnt, run.to_vec(), "{blocks} blocks");
        assert_eq!(m.status()[1], 0, "{blocks} blocks");
        assert_handed_over(&l, m, &got_cnt, &nrun, &format!("{scheme:?}, {blocks} blocks"));
    }
}

/// An expert id out of range is reported once, by the block whose share holds its token,
/// naming the token, slot and id (the blocks before it skip it in their counts): 4 blocks, 20
/// tokens, token 13's slot 2 out of range.
#[test]
fn an_out_of_range_id_is_reported_by_the_block_of_its_share() {
    const T: usize = 20;
    let cfg = EpConfig::with_gpus_per_node(W, G, H, E, K, T).unwrap();
    let l = InterLayout::new(&cfg, Scheme::AsyncLL, 2, 8, 2).unwrap();
    let mut ids: Vec<i64> = (0..T * K).map(|i| (i % E) as i64).collect();
    ids[13 * K + 2] = E as i64 + 5;
    let run = stage_alone(&l, &ids, 4);
    let m = &run.mems[0];
    let st = m.status();
    assert_eq!((st[1], st[2], st[3], st[4] as i32), (1, 13, 2, E as i32 + 5), "status {st:?}");
    // The hand-over still happens (the id was skipped), with the counts without it.
    let cnt: Vec<u32> = m.scratch[2].bytes()[..W * 4].chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    let mut want = [0u32; W];
    for (i, &e) in ids.iter().enumerate() {
        let prior = ids[i - i % K..i].iter().any(|&f| (0..E as i64).contains(&f) && f as usize / (E / W) == e as usize / (E / W));
        if (0..E as i64).contains(&e) && !prior {
            want[e as usize / (E / W)] += 1;
        }
    }
    assert_eq!(cnt, want.to_vec());
    assert_handed_over(&l, m, &cnt, &[], "out-of-range id");
}

/// A relay segment from another node that is malformed is refused at the relay naming the
/// origin, and nothing of it reaches a destination: a header whose record count disagrees with
/// the counter pair, or that names more than `max_tokens` records for a destination
/// (`IE_ERR_RELAY_SEG`, with the count); a record naming a destination off the relay's node, a
/// V1-LL token index past `max_tokens`, a V1 index past the header (`IE_ERR_RELAY`, with the
/// record and the destination). Rank 0 runs alone (no tokens); its relay segment from rank 3
/// (node 1), one record, is written by hand, rank 6's as empty and complete. Every other wait of
/// rank 0 ends at its fault; the deadline (10 s) is far past the refusal even on a loaded
/// machine (at 0.3 s a wait's deadline was at times recorded first).
#[test]
fn a_malformed_relay_segment_is_refused_naming_origin_and_record() {
    let cfg = EpConfig::with_gpus_per_node(W, G, H, E, K, TMAX).unwrap();
    let t = TMAX as u32;
    // (scheme, header per local index, header record count, record tail after the source,
    // expected code and details [2], [3], [4])
    type Case = (Scheme, [u32; G], u32, Vec<u32>, (u32, [u32; 3]));
    let cases: [Case; 5] = [
        (Scheme::V1LL, [1, 0, 0], 2, vec![0, 0, 0], (9, [3, 1, 0])),
        (Scheme::V1LL, [t + 1, 0, 0], 1, vec![0, 0, 0], (9, [3, 1, 0])),
        (Scheme::V1LL, [0, 1, 0], 1, vec![4, 0, 0], (8, [3, 0, 4])),
        (Scheme::V1LL, [1, 0, 0], 1, vec![0, 0, t], (8, [3, 0, 0])),
        (Scheme::V1, [1, 0, 0], 1, vec![0, 1, u32::MAX, u32::MAX], (8, [3, 0, 0])),
    ];
    for (case, (scheme, hdr, count, rec_tail, want)) in cases.into_iter().enumerate() {
        let l = InterLayout::new(&cfg, scheme, 2, 8, 2).unwrap();
        let tail = l.row_bytes + K * 4 + K * 8 + l.scale_bytes;
        let mems: Vec<RankMem> = (0..W).map(|_| RankMem::new(&l)).collect();
        let m = &mems[0];
        let seg = l.lay.relay_in as usize + l.lay.seg_relay as usize;
        m.write_at(&m.win, seg, &le(&[hdr[0], hdr[1], hdr[2], count], |v: u32| v.to_le_bytes().to_vec()));
        let mut x = vec![3 * TMAX as u32];
        x.extend(rec_tail);
        m.write_at(&m.win, seg + l.lay.relay_hdr as usize + tail, &le(&x, |v: u32| v.to_le_bytes().to_vec()));
        // The pair (1 record) as rank 3's proxy would have written it; rank 6's relay segment
        // empty and complete.
        m.write_at(&m.win, l.lay.ctr as usize + l.counter(0, 3, 0), &le(&[1u64, 2], |v: u64| v.to_le_bytes().to_vec()));
        m.write_at(&m.win, l.lay.ctr as usize + l.counter(0, 6, 0), &le(&[0u64, 1], |v: u64| v.to_le_bytes().to_vec()));
        let abi = Region::new(std::mem::size_of::<IeRank>());
        // SAFETY: the region holds one IeRank.
        unsafe { (abi.ptr as *mut IeRank).write(m.abi(0, 0, 0)) };
        // Rank 0 runs alone: its waits for what never comes (its node's other ranks, what they
        // relay, the records it refuses) end at its own fault, long before this deadline.
        let p = IeParams { num_local: 1, timeout_ns: 10_000_000_000, ..params(&l, &mems, &abi, 0) };
        run_node(&p, "mori_ie_dispatch_stage");
        run_node(&p, "mori_ie_dispatch");
        let st = m.status();
        assert_eq!((st[1], [st[2], st[3], st[4]]), want, "case {case}: status {st:?}");
        for (d, mem) in mems.iter().enumerate().take(G) {
            let at = l.lay.disp_in as usize + 3 * l.lay.seg_rec as usize;
            assert!(mem.win.bytes()[at..at + l.lay.seg_rec as usize].iter().all(|&b| b == 0), "case {case}: a record reached rank {d}");
        }
    }
}

/// The relay's combine reads the record count of the dispatch's relay segment again (the bytes
/// are a peer's): a count past what the segment holds is refused (`IE_ERR_RELAY_SEG`, with the
/// origin and the count) and nothing is summed or handed to the proxy; the largest count that
/// fits is summed and handed over (one command, and one with no tokens for node 2); V1-LL's
/// records of that count all of one token are refused at its G+1-th (`IE_ERR_RELAY`) and the
/// failed relay hands nothing over. Rank 0 runs alone as the relay of ranks 3 (node 1) and 6
/// (node 2), node 1's segment header and records' tails and every gather counter (no rows)
/// written by hand.
#[test]
fn a_relay_segment_count_past_its_capacity_is_refused_by_the_relay_combine() {
    let cfg = EpConfig::with_gpus_per_node(W, G, H, E, K, TMAX).unwrap();
    for scheme in [Scheme::V1, Scheme::V1LL] {
        let l = InterLayout::new(&cfg, scheme, 2, 8, 2).unwrap();
        let cap = ((l.lay.seg_relay - l.lay.relay_hdr) / l.rec_bytes as u64) as u32;
        // (count, records one per destination (else V1-LL: all zeros, one token's cap records),
        // the status words wanted: code and details, commands handed to the proxy.)
        let cases = [(cap + 1, true, (9, 3, cap + 1, 0), 0), (cap, true, (0, 0, 0, 0), W / G - 1), (cap, false, (8, 3, G as u32, 0), 0)];
        for (n, one_each, want, want_cmds) in cases.into_iter().filter(|c| c.1 || scheme == Scheme::V1LL) {
            let mems: Vec<RankMem> = (0..W).map(|_| RankMem::new(&l)).collect();
            let m = &mems[0];
            let seg = l.lay.relay_in as usize + l.lay.seg_relay as usize;
            m.write_at(&m.win, seg + 4 * G, &n.to_le_bytes());
            // V1-LL: G records a token, one to each rank of node 0 (the relay's), as a relay
            // segment holds them; zeros are cap records of one token, whose G+1-th the relay
            // refuses (a token has one record per destination).
            let tail: usize = l.record_fields()[..4].iter().sum();
            for j in (0..n.min(cap) as usize).filter(|_| scheme == Scheme::V1LL && one_each) {
                let x = [(j % G) as u32, (j / G) as u32, (j / G) as u32];
                m.write_at(&m.win, seg + l.lay.relay_hdr as usize + j * l.rec_bytes + tail + 4, &le(&x, |v: u32| v.to_le_bytes().to_vec()));
            }
            for w in G..W {
                m.write_at(&m.dev_ctr, l.counter(2, w, 0), &le(&[0u64, 1], |v: u64| v.to_le_bytes().to_vec()));
            }
            let abi = Region::new(std::mem::size_of::<IeRank>());
            // SAFETY: the region holds one IeRank.
            unsafe { (abi.ptr as *mut IeRank).write(m.abi(0, 0, 0)) };
            let p = IeParams { num_local: 1, blocks_per_rank: COPY_BLOCKS, timeout_ns: 300_000_000, ..params(&l, &mems, &abi, 0) };
            launch("ep_internode", "mori_ie_combine_relay", COPY_BLOCKS, THREADS, &p);
            let st = m.status();
            let what = format!("{scheme:?} count {n} (capacity {cap}, one record each {one_each}): status {st:?}");
            assert_eq!((st[1], st[2], st[3], st[4]), want, "{what}");
            assert_eq!(ring_commands(m).len(), want_cmds, "{what}: commands handed to the proxy");
        }
    }
}

/// The window's sizes at 2 nodes x 4 ranks (H 64 bf16, top-8, i64 ids, 16 tokens), worked out by
/// hand: record tails (AsyncLL 4 B, V1-LL 16 B, V1 8 + 4 x 4 B), the relay header (4 u32 counts
/// and the record count: 20 B, 32 with alignment), relay segments (V1-LL 4 records per token,
/// V1 one), partial rows (64 bf16 + 8 f32, as combine rows) and the gather area (combine rows
/// only).
#[test]
fn window_sizes_per_scheme_at_four_ranks_per_node() {
    let cfg = EpConfig::with_gpus_per_node(8, 4, 64, 16, 8, 16).unwrap();
    let a = InterLayout::new(&cfg, Scheme::AsyncLL, 2, 8, 2).unwrap();
    let ll = InterLayout::new(&cfg, Scheme::V1LL, 2, 8, 2).unwrap();
    let v1 = InterLayout::new(&cfg, Scheme::V1, 2, 8, 2).unwrap();
    assert_eq!((a.rec_bytes, ll.rec_bytes, v1.rec_bytes), (240, 240, 256));
    assert_eq!((a.lay.relay_hdr, ll.lay.relay_hdr, v1.lay.relay_hdr), (0, 32, 32));
    assert_eq!((a.lay.seg_relay, ll.lay.seg_relay, v1.lay.seg_relay), (0, 32 + 16 * 4 * 240, 32 + 16 * 256));
    assert_eq!((a.part_bytes, ll.part_bytes), (0, 160));
    assert_eq!((a.lay.seg_comb, ll.lay.seg_comb, ll.lay.seg_gather), (16 * 160, 16 * 160, 16 * 160));
    for l in [&a, &ll, &v1] {
        let end = l.lay.gather + 8 * l.lay.seg_gather;
        assert_eq!(l.lay.ctr, end, "{:?}: the pairs follow the gather area", l.scheme);
        // Then the outgoing pairs, then rbase (u32 per rank, 8 ranks here).
        assert_eq!(l.lay.rbase, l.lay.sig + l.pair_bytes() as u64);
        assert_eq!(l.window_bytes as u64, l.lay.rbase + 32);
        assert!(l.lay.out_relay + 2 * l.lay.seg_relay == l.lay.gather);
    }
}
