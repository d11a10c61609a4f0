//! The seeds' bandwidth formulas on their worked examples.

use mori_ep::accounting::*;
use mori_ep::{OutOfRange, Tensor2};

/// Seed 003 "Step 3: Compute observed RDMA bandwidth": 2048 tokens, 4 nodes, hidden 7168,
/// bf16, top-4, no scales, dispatch_inter_node_send 120 us, combine_inter_node 340 us.
#[test]
fn seed_003_step3_example() {
    let xfer = dispatch_xfer_bytes_per_token(7168, 2, 4, 0, 0).unwrap();
    assert_eq!(xfer, 7168 * 2 + 4 * 4 + 4 * 4 + 4);
    assert_eq!(xfer, 14_372);
    let dispatch = rdma_send_bytes(2048, xfer, 4).unwrap();
    assert_eq!(dispatch, 88_301_568);
    let comb_tok = combine_xfer_bytes_per_token(7168, 2, 4, false).unwrap();
    assert_eq!(comb_tok, 14_336);
    let combine = rdma_send_bytes(2048, comb_tok, 4).unwrap();
    assert_eq!(combine, 88_080_384);
    let d_bw = bandwidth_gbps_from_us(dispatch, 120.0);
    let c_bw = bandwidth_gbps_from_us(combine, 340.0);
    assert!((d_bw - 735.8464).abs() < 1e-3, "{d_bw}");
    assert!((c_bw - 259.0599529).abs() < 1e-3, "{c_bw}");
    // With weights on the combine wire and fp8 scales on the dispatch wire.
    assert_eq!(combine_xfer_bytes_per_token(7168, 2, 4, true).unwrap(), 14_336 + 16);
    assert_eq!(dispatch_xfer_bytes_per_token(7168, 1, 8, 56, 4).unwrap(), 7168 + 32 + 32 + 224 + 4);
}

/// Seed 002 "Bandwidth Computation": 2 nodes x 8 GPUs, 4096 tokens, hidden 7168, 256
/// experts, top-8; rank 8 received 26757 tokens and 8166 RDMA (algo) tokens.
#[test]
fn seed_002_two_node_example() {
    let (algo, recv, hidden) = (8166u64, 26757u64, 7168u64);
    assert_eq!(rdma_physical_tokens(algo, 2), 4083.0);
    assert_eq!(rdma_physical_tokens(algo, 1), 0.0); // one node: nothing crosses RDMA
    let rdma = rdma_algo_bytes(algo, hidden, 2).unwrap();
    assert_eq!(rdma, 117_067_776);
    assert_eq!(format!("{:.4}", gb(rdma)), "0.1171");
    let nvl = nvl_recv_bytes(recv, hidden, 2).unwrap();
    assert_eq!(nvl, 383_588_352);
    assert_eq!(format!("{:.4}", gb(nvl)), "0.3836");
    // print_bw_values.py fp8 factor (1 + 4/128) / 2 and the fp8-adjusted bytes.
    assert_eq!(FP8_BYTES_FACTOR, 0.515625);
    assert_eq!(rdma as f64 * FP8_BYTES_FACTOR, 60_363_072.0);
    assert_eq!(nvl as f64 * FP8_BYTES_FACTOR, 197_787_744.0);
    // "RDMA BW = Total BW x (RDMA tokens / Total tokens)".
    let share = rdma_share_of_bandwidth(100.0, algo, recv);
    assert!((share - 30.519116).abs() < 1e-5, "{share}");
    // GB = 1e9: 1e9 bytes in 1 s is 1 GB/s.
    assert_eq!(bandwidth_gbps(1_000_000_000, 1.0), 1.0);
    assert_eq!(bandwidth_gbps(1, 0.0), 0.0);
}

/// Algo vs exact cross-node counts on a hand-made routing: 2 nodes, 8 experts (4 per node).
#[test]
fn algo_and_cross_node_counts() {
    let idx = Tensor2::new(
        4,
        3,
        vec![
            0i64, 1, 2, // node 0 only: 1 pair
            0, 5, -1, // nodes 0 and 1: 2 pairs
            7, 6, 4, // node 1 only, three slots: 1 pair
            -1, -1, -1, // nowhere: 0
        ],
    )
    .unwrap();
    assert_eq!(rdma_algo_token_count(&idx, 8, 2, OutOfRange::Error).unwrap(), 4);
    assert_eq!(rdma_cross_node_token_count(&idx, 8, 2, 0, OutOfRange::Error).unwrap(), 2);
    assert_eq!(rdma_cross_node_token_count(&idx, 8, 2, 1, OutOfRange::Error).unwrap(), 2);
    let bad = Tensor2::new(1, 2, vec![3i32, 8]).unwrap();
    assert!(rdma_algo_token_count(&bad, 8, 2, OutOfRange::Error).is_err());
    assert_eq!(rdma_algo_token_count(&bad, 8, 2, OutOfRange::Drop).unwrap(), 1);
    assert!(rdma_algo_token_count(&idx, 8, 3, OutOfRange::Error).is_err()); // 8 experts over 3 nodes
    assert!(rdma_send_bytes(u64::MAX, 2, 2).is_err());
    assert_eq!(rdma_send_bytes(10, 100, 1).unwrap(), 0);
}
