//! The DeepEP-style routing generator (rules, determinism, statistics), and the accounting
//! on DeepEP's own routing: torch's topk_idx of all 16 ranks of seed 002's 2 x 8
//! configuration (crates/ep/tests/data/deepep_routing_2x8.*, written by
//! tools/deepep_routing.py), whose per-rank counts must equal `print_bw_values.py`'s digit
//! for digit.

use mori_ep::accounting::{rdma_algo_token_count, rdma_cross_node_token_count, rdma_physical_tokens};
use mori_ep::routing::{generate_routing, RoutingSpec, SplitMix64};
use mori_ep::{dispatch, dispatch_layout, DispatchOptions, EpConfig, OutOfRange, RankInput, Tensor2};
use std::collections::BTreeSet;
use std::path::PathBuf;

#[test]
fn grouped_top_k_rules() {
    // 8 nodes: each token may use only min(8, 4) = 4 node groups of 32 experts.
    let spec = RoutingSpec::deepep(200, 256, 8, 8);
    assert_eq!(spec.topk_groups, 4);
    let (idx, w) = generate_routing(spec, &mut SplitMix64::new(7)).unwrap();
    assert_eq!((idx.shape(), w.shape()), ([200, 8], [200, 8]));
    for (row, wrow) in idx.iter_rows().zip(w.iter_rows()) {
        let unique: BTreeSet<i64> = row.iter().copied().collect();
        assert_eq!(unique.len(), 8, "duplicate expert in {row:?}");
        let groups: BTreeSet<i64> = row.iter().map(|e| e / 32).collect();
        assert!(groups.len() <= 4, "{row:?} spans {groups:?}");
        assert!(wrow.iter().all(|&s| s >= 1.0), "scores are |randn| + 1");
        assert!(wrow.windows(2).all(|p| p[0] >= p[1]), "top-k is sorted by score");
    }
    let (again, _) = generate_routing(spec, &mut SplitMix64::new(7)).unwrap();
    assert_eq!(idx, again, "deterministic for a seed");
    let bad = RoutingSpec { topk_groups: 9, ..spec };
    assert!(generate_routing(bad, &mut SplitMix64::new(0)).is_err());
    assert!(generate_routing(RoutingSpec::deepep(1, 10, 3, 4), &mut SplitMix64::new(0)).is_err());
}

/// Our generator (not torch's RNG) on seed 002's configuration (2 nodes x 8 GPUs, 4096
/// tokens, 256 experts, top-8) lands where DeepEP's routing does (8152..=8169 algo tokens
/// per rank, see `deepep_routing_matches_print_bw_values`). A token misses a node only when all 8 experts fall in
/// one half: p = 2 C(128,8)/C(256,8) ≈ 0.0070, so E[algo] = 4096 (2 - p) ≈ 8163 (sd ≈ 5.3).
#[test]
fn seed_002_algo_count_in_distribution() {
    let (idx, _) = generate_routing(RoutingSpec::deepep(4096, 256, 8, 2), &mut SplitMix64::new(8)).unwrap();
    let algo = rdma_algo_token_count(&idx, 256, 2, OutOfRange::Error).unwrap();
    assert!(algo.abs_diff(8166) < 60, "algo = {algo}");
    let lay = dispatch_layout(&idx, 256, 16, 8).unwrap();
    assert_eq!(lay.tokens_per_node.iter().sum::<usize>() as u64, algo);
    assert!((rdma_physical_tokens(algo, 2) - algo as f64 / 2.0).abs() < 1e-9);
    // Tokens one rank sends to rank 8: p = 1 - C(240,8)/C(256,8) ≈ 0.4077, E ≈ 1670 (sd ≈ 31);
    // x 16 senders, E[recv of rank 8] ≈ 26719: DeepEP's routing gives 26755 (MORI's bench
    // line in seed 002 quotes 26757).
    let to8 = lay.tokens_per_rank[8] as f64;
    assert!((to8 - 4096.0 * 0.4077).abs() < 160.0, "to rank 8: {to8}");
}

const NODES: usize = 2;
const GPUS_PER_NODE: usize = 8;
const WORLD: usize = NODES * GPUS_PER_NODE;
const TOKENS: usize = 4096;
const EXPERTS: usize = 256;
const TOP_K: usize = 8;

/// `print_bw_values.py --num-nodes 2 --gpu-per-node 8 --num-tokens 4096 --hidden 7168
/// --num-experts 256 --num-topk 8` (torch 2.11.0, CPU), per rank: (recv_num_tokens,
/// num_rdma_token_sent (algo), num_rdma_token_sent (physical)). The seed quotes the algo
/// line "= 8166": ranks 3 and 7 print it.
const PRINT_BW_VALUES: [(u64, u64, u64); WORLD] = [
    (26452, 8163, 4081), // rank 0
    (26864, 8157, 4080), // rank 1
    (26752, 8163, 4082), // rank 2
    (26682, 8166, 4083), // rank 3
    (26663, 8152, 4079), // rank 4
    (26693, 8168, 4083), // rank 5
    (26533, 8159, 4077), // rank 6
    (26571, 8166, 4077), // rank 7
    (26755, 8168, 4085), // rank 8
    (26752, 8168, 4083), // rank 9
    (26668, 8165, 4082), // rank 10
    (26672, 8169, 4081), // rank 11
    (26748, 8160, 4075), // rank 12
    (26948, 8162, 4081), // rank 13
    (26851, 8164, 4079), // rank 14
    (26663, 8167, 4083), // rank 15
];

fn data_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// The fixture's topk_idx of every rank, `[T, K]` i64 each.
fn deepep_routing() -> Vec<Tensor2<i64>> {
    let path = data_file("deepep_routing_2x8.u8");
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e} (regenerate with tools/deepep_routing.py)", path.display()));
    let per_rank = TOKENS * TOP_K;
    assert_eq!(raw.len(), WORLD * per_rank, "{}: expected {WORLD} ranks x {TOKENS} tokens x {TOP_K} uint8 ids", path.display());
    raw.chunks_exact(per_rank).map(|chunk| Tensor2::new(TOKENS, TOP_K, chunk.iter().map(|&e| i64::from(e)).collect()).unwrap()).collect()
}

fn json_u64(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("deepep_routing_2x8.json: '{key}' is not an unsigned integer in {v}"))
}

#[test]
fn deepep_routing_matches_print_bw_values() {
    let routing = deepep_routing();
    for (r, idx) in routing.iter().enumerate() {
        for (t, row) in idx.iter_rows().enumerate() {
            let unique: BTreeSet<i64> = row.iter().copied().collect();
            assert_eq!(unique.len(), TOP_K, "rank {r} token {t}: torch.topk gives distinct experts, got {row:?}");
        }
    }

    let meta_path = data_file("deepep_routing_2x8.json");
    let text = std::fs::read_to_string(&meta_path).unwrap_or_else(|e| panic!("reading {}: {e}", meta_path.display()));
    let meta: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", meta_path.display()));
    for (key, want) in
        [("num_nodes", NODES), ("gpu_per_node", GPUS_PER_NODE), ("num_tokens", TOKENS), ("num_experts", EXPERTS), ("num_topk", TOP_K)]
    {
        assert_eq!(json_u64(&meta, key), want as u64, "{key}");
    }
    let ranks = meta["ranks"].as_array().expect("deepep_routing_2x8.json: 'ranks' is not an array");
    assert_eq!(ranks.len(), WORLD);

    let mut recv = [0u64; WORLD];
    for (r, idx) in routing.iter().enumerate() {
        let (_, want_algo, want_physical) = PRINT_BW_VALUES[r];
        let node = r / GPUS_PER_NODE;
        let algo = rdma_algo_token_count(idx, EXPERTS, NODES, OutOfRange::Error).unwrap();
        let physical = rdma_cross_node_token_count(idx, EXPERTS, NODES, node, OutOfRange::Error).unwrap();
        assert_eq!((algo, physical), (want_algo, want_physical), "rank {r}: (algo, physical) RDMA tokens");
        let lay = dispatch_layout(idx, EXPERTS, WORLD, GPUS_PER_NODE).unwrap();
        assert_eq!(lay.tokens_per_node.iter().sum::<usize>() as u64, algo, "rank {r}: layout's tokens per node");
        assert_eq!(lay.tokens_per_node[node] as u64, algo - physical, "rank {r}: tokens kept on its own node");
        // The generator's own record agrees with print_bw_values.py and with our layout.
        let rec = &ranks[r];
        assert_eq!(json_u64(rec, "rank"), r as u64);
        assert_eq!((json_u64(rec, "rdma_algo_tokens"), json_u64(rec, "rdma_physical_tokens")), (algo, physical), "rank {r}: json");
        let to: Vec<u64> =
            rec["tokens_to_rank"].as_array().expect("tokens_to_rank").iter().map(|v| v.as_u64().expect("tokens_to_rank entry")).collect();
        let ours: Vec<u64> = lay.tokens_per_rank.iter().map(|&n| n as u64).collect();
        assert_eq!(ours, to, "rank {r}: tokens sent to each rank");
        ours.iter().zip(recv.iter_mut()).for_each(|(n, acc)| *acc += n);
    }
    // gbl_num_tokens_per_rank = all_reduce(num_tokens_per_rank): the tokens each rank receives.
    let want_recv: Vec<u64> = PRINT_BW_VALUES.iter().map(|p| p.0).collect();
    assert_eq!(recv.to_vec(), want_recv, "recv tokens per rank (layout, summed over senders)");
    let json_recv: Vec<u64> = ranks.iter().map(|rec| json_u64(rec, "recv_tokens")).collect();
    assert_eq!(json_recv, want_recv, "recv tokens per rank (json)");

    // The host reference dispatch receives exactly those tokens (payload irrelevant: hidden 8).
    let hidden = 8;
    let cfg = EpConfig::with_gpus_per_node(WORLD, GPUS_PER_NODE, hidden, EXPERTS, TOP_K, TOKENS).unwrap();
    let inputs: Vec<RankInput<f32, i64>> = routing
        .into_iter()
        .map(|indices| RankInput {
            x: Tensor2::new(TOKENS, hidden, vec![0.0; TOKENS * hidden]).unwrap(),
            weights: Tensor2::new(TOKENS, TOP_K, vec![0.0; TOKENS * TOP_K]).unwrap(),
            scales: None,
            indices,
        })
        .collect();
    let out = dispatch(&cfg, &inputs, DispatchOptions::default()).unwrap();
    let got: Vec<u64> = out.ranks.iter().map(|rr| rr.num_recv() as u64).collect();
    assert_eq!(got, want_recv, "recv_num_token of the reference dispatch");

    // The seed's quoted "num_rdma_token_sent (algo) = 8166" (ranks 3 and 7 here); rank 8,
    // the rank its MORI bench line names, prints 8168 and receives 26755.
    assert_eq!(PRINT_BW_VALUES[3].1, 8166);
    assert_eq!(PRINT_BW_VALUES[7].1, 8166);
    assert_eq!(PRINT_BW_VALUES[8], (26755, 8168, 4085));
}
