//! Bandwidth accounting, following the seeds:
//! - seed 002 (MORI-EP benchmark guide, "Bandwidth Computation"): NVL/XGMI bytes, RDMA
//!   "algo" and "physical" token counts, GB = 1e9, RDMA share of a total bandwidth, the fp8
//!   byte factor of `print_bw_values.py`;
//! - seed 003 (RDMA utilization, "What RDMA Actually Transfers"): per-token wire bytes and
//!   the bytes a rank injects into RDMA per dispatch/combine.
//!
//! Byte counts are `u64`; overflow is an error, never a wrap.

use crate::dtype::TopkIndex;
use crate::error::{EpError, EpResult};
use crate::layout::OutOfRange;
use crate::tensor::Tensor2;

/// Bytes per gigabyte in every bandwidth figure: 1e9 (seed 002: `bytes / 1e9 / t`).
pub const GB: f64 = 1e9;

/// Bytes of one top-k index on the wire (int32; seed 003 `index_bytes = topk * 4`).
pub const INDEX_BYTES: u64 = 4;

/// Bytes of one routing weight on the wire (float32; seed 003 `weight_bytes = topk * 4`).
pub const WEIGHT_BYTES: u64 = 4;

/// Trailing per-token bytes (the source token id, `sizeof(index_t)`; seed 003 `+ 4`).
pub const TOKEN_ID_BYTES: u64 = 4;

/// FP8 bytes relative to BF16 bytes with one 4-byte scale per 128 elements:
/// `(1 + 4/128) / 2 = 0.515625` (seed 002, `print_bw_values.py` `fp8_factor`).
pub const FP8_BYTES_FACTOR: f64 = (1.0 + 4.0 / 128.0) / 2.0;

fn ovf(what: &'static str) -> EpError {
    EpError::SizeOverflow { what, limit: "u64" }
}

/// Token payload bytes `tokens x hidden x elem_size`. Used for both
/// [`nvl_recv_bytes`] and [`rdma_algo_bytes`].
pub fn payload_bytes(tokens: u64, hidden: u64, elem_size: u64) -> EpResult<u64> {
    tokens.checked_mul(hidden).and_then(|b| b.checked_mul(elem_size)).ok_or(ovf("payload bytes"))
}

/// NVL/XGMI bytes a rank received in dispatch (= bytes it sends back in combine):
/// `received tokens x hidden x element size` (seed 002, "NVL / XGMI bandwidth").
pub fn nvl_recv_bytes(recv_tokens: u64, hidden: u64, elem_size: u64) -> EpResult<u64> {
    payload_bytes(recv_tokens, hidden, elem_size)
}

/// RDMA bytes as DeepEP/MORI report them: `algo tokens x hidden x element size`
/// (seed 002, "RDMA bandwidth" table, "Bytes").
pub fn rdma_algo_bytes(algo_tokens: u64, hidden: u64, elem_size: u64) -> EpResult<u64> {
    payload_bytes(algo_tokens, hidden, elem_size)
}

/// Per-token node sets: calls `f(node)` once per unique destination node of each token.
fn for_each_token_node<I: TopkIndex>(
    topk_idx: &Tensor2<I>,
    num_experts: usize,
    num_nodes: usize,
    policy: OutOfRange,
    mut f: impl FnMut(usize),
) -> EpResult<()> {
    if num_nodes == 0 || !num_experts.is_multiple_of(num_nodes) {
        return Err(EpError::ExpertsNotDivisible { num_experts, world: num_nodes });
    }
    let per_node = num_experts / num_nodes;
    let mut seen = vec![false; num_nodes];
    for (t, row) in topk_idx.iter_rows().enumerate() {
        seen.iter_mut().for_each(|s| *s = false);
        for (slot, &id) in row.iter().enumerate() {
            let v = id.as_i64();
            if v == -1 {
                continue;
            }
            match usize::try_from(v) {
                Ok(e) if e < num_experts => seen[e / per_node] = true,
                _ if policy == OutOfRange::Drop => {}
                _ => return Err(EpError::ExpertOutOfRange { rank: 0, token: t, slot, expert: v, num_experts }),
            }
        }
        seen.iter().enumerate().filter(|(_, &s)| s).for_each(|(n, _)| f(n));
    }
    Ok(())
}

/// RDMA "algo" token count of one rank: unique (token, destination node) pairs, the local
/// node included; node of expert `e` = `e / (num_experts / num_nodes)`; -1 skipped
/// (seed 002, "Why DeepEP and Mori RDMA token counts are equivalent", steps 1-3).
///
/// Errors: [`EpError::ExpertsNotDivisible`] (E not divisible by nodes, or 0 nodes);
/// [`EpError::ExpertOutOfRange`] (reported as rank 0) unless `policy` drops it.
pub fn rdma_algo_token_count<I: TopkIndex>(
    topk_idx: &Tensor2<I>,
    num_experts: usize,
    num_nodes: usize,
    policy: OutOfRange,
) -> EpResult<u64> {
    let mut n = 0u64;
    for_each_token_node(topk_idx, num_experts, num_nodes, policy, |_| n += 1)?;
    Ok(n)
}

/// Exact cross-node count of one rank on node `my_node`: the algo pairs whose node is not
/// `my_node` (seed 002 `print_bw_values.py`, `num_rdma_token_sent (physical)`).
/// Errors as [`rdma_algo_token_count`].
pub fn rdma_cross_node_token_count<I: TopkIndex>(
    topk_idx: &Tensor2<I>,
    num_experts: usize,
    num_nodes: usize,
    my_node: usize,
    policy: OutOfRange,
) -> EpResult<u64> {
    let mut n = 0u64;
    for_each_token_node(topk_idx, num_experts, num_nodes, policy, |node| n += u64::from(node != my_node))?;
    Ok(n)
}

/// Physical RDMA tokens from the algo count: `algo x (nodes - 1) / nodes` (seed 002,
/// "Algo BW vs Physical BW"); the same factor converts algo to physical bandwidth.
/// 0 nodes gives 0.
pub fn rdma_physical_tokens(algo_tokens: u64, num_nodes: u64) -> f64 {
    if num_nodes == 0 {
        return 0.0;
    }
    algo_tokens as f64 * (num_nodes - 1) as f64 / num_nodes as f64
}

/// Dispatch wire bytes per token: `hidden x elem_size + top_k x 4 (indices) + top_k x 4
/// (weights) + scale_dim x scale_type_size + 4` (seed 003, `xferBytes`).
pub fn dispatch_xfer_bytes_per_token(hidden: u64, elem_size: u64, top_k: u64, scale_dim: u64, scale_type_size: u64) -> EpResult<u64> {
    let parts = [
        hidden.checked_mul(elem_size),
        top_k.checked_mul(INDEX_BYTES),
        top_k.checked_mul(WEIGHT_BYTES),
        scale_dim.checked_mul(scale_type_size),
        Some(TOKEN_ID_BYTES),
    ];
    parts.into_iter().try_fold(0u64, |acc, p| acc.checked_add(p?)).ok_or(ovf("dispatch bytes per token"))
}

/// Combine wire bytes per token: `hidden x elem_size` plus `top_k x 4` when weights travel
/// (seed 003, `tokCombXferBytes`).
pub fn combine_xfer_bytes_per_token(hidden: u64, elem_size: u64, top_k: u64, with_weights: bool) -> EpResult<u64> {
    let w = if with_weights { top_k.checked_mul(WEIGHT_BYTES) } else { Some(0) };
    hidden.checked_mul(elem_size).and_then(|h| h.checked_add(w?)).ok_or(ovf("combine bytes per token"))
}

/// Bytes one rank injects into RDMA per dispatch or combine:
/// `cur_rank_tokens x bytes_per_token x (nodes - 1)` (seed 003, `dispatch_rdma_bytes`,
/// `combine_rdma_bytes`). 0 nodes gives 0.
pub fn rdma_send_bytes(cur_rank_tokens: u64, bytes_per_token: u64, num_nodes: u64) -> EpResult<u64> {
    cur_rank_tokens.checked_mul(bytes_per_token).and_then(|b| b.checked_mul(num_nodes.saturating_sub(1))).ok_or(ovf("RDMA send bytes"))
}

/// Bytes as gigabytes (1e9).
pub fn gb(bytes: u64) -> f64 {
    bytes as f64 / GB
}

/// Bandwidth in GB/s: `bytes / 1e9 / seconds` (seed 002 "BW" rows). Non-positive or
/// non-finite `seconds` gives 0.
pub fn bandwidth_gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 && seconds.is_finite() {
        gb(bytes) / seconds
    } else {
        0.0
    }
}

/// Bandwidth in GB/s from a span in microseconds, as the seed-003 trace recipe:
/// `bytes / (us x 1e-6) / 1e9`.
pub fn bandwidth_gbps_from_us(bytes: u64, micros: f64) -> f64 {
    bandwidth_gbps(bytes, micros * 1e-6)
}

/// RDMA part of a combined bandwidth: `total_bw x rdma_tokens / total_tokens`
/// (seed 002, "Inter-node"). 0 total tokens gives 0.
pub fn rdma_share_of_bandwidth(total_bw: f64, rdma_tokens: u64, total_tokens: u64) -> f64 {
    if total_tokens == 0 {
        return 0.0;
    }
    total_bw * rdma_tokens as f64 / total_tokens as f64
}
