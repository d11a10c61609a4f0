//! MORI-EP, sans-IO core: everything about expert-parallel dispatch/combine that can be
//! decided without a GPU or a network.
//!
//! An MoE layer on each of `world` ranks holds `T` tokens of hidden size `H` and, per token,
//! `K` expert ids (-1 = none) with f32 weights. Experts are split evenly: rank `r` owns
//! experts `[r * E/world, (r+1) * E/world)`. **Dispatch** sends each token once to every
//! rank owning at least one of its experts; **combine** returns each rank's processed rows
//! and sums them per original token.
//!
//! - [`EpConfig`]: upstream's configuration fields, validated up front ([`EpConfig::validate`]).
//! - [`dispatch_layout`]: tokens per rank / node / expert and `is_token_in_rank`.
//! - [`dispatch`] / [`combine`]: the host reference over all ranks — plain loops, the oracle
//!   GPU kernels are checked against. Received order: (source rank, source token)
//!   ascending; [`RankRecv::canonicalize`] brings any other order to it.
//! - [`accounting`]: the seeds' bandwidth formulas (NVL/XGMI bytes, RDMA algo/physical
//!   tokens, per-token wire bytes, GB = 1e9).
//! - Element types: [`Element`] (f32, [`half::bf16`], [`Fp8E4m3`] with per-128-column
//!   scales), [`TopkIndex`] (i32, i64).
//! - [`routing`]: DeepEP-style random routing (`|randn| + 1`, grouped top-k) for tests and
//!   benches.
//!
//! - [`internode`]: the inter-node protocol (V1, V1-LL, AsyncLL) as a sans-IO core, and
//!   [`host`]: its host executor (shared memory within a node, MORI-IO signalled writes through
//!   a proxy thread per rank between nodes).
//! - [`ring`] and [`proxy`]: the proxy's command ring in shared memory (GPU warps or host
//!   threads produce fixed-size commands, one proxy thread consumes them) and the proxy that
//!   turns commands into MORI-IO signalled writes.
//! - [`gpu`]: the intranode kernels' host side ([`gpu::IntranodeEp`]) over a `mori-shmem`
//!   symmetric heap: one process per GPU or several ranks sharing a GPU.
//!
//! No function here panics on input: every rejection is an [`EpError`] naming the input and
//! the limit.
//!
//! ```
//! use mori_ep::*;
//! // 2 ranks, 4 experts (2 per rank), hidden 16, top-2, up to 2 tokens per rank.
//! let cfg = EpConfig::new(2, 16, 4, 2, 2)?;
//! let rank = |ids: Vec<i32>| -> EpResult<RankInput<bf16, i32>> {
//!     let t = ids.len() / 2;
//!     Ok(RankInput {
//!         x: Tensor2::filled(t, 16, bf16::from_f32(1.0))?,
//!         weights: Tensor2::filled(t, 2, 0.5)?,
//!         scales: None,
//!         indices: Tensor2::new(t, 2, ids)?,
//!     })
//! };
//! // Rank 0: token 0 -> experts 0 (rank 0) and 3 (rank 1). Rank 1: no tokens.
//! let inputs = vec![rank(vec![0, 3])?, rank(vec![])?];
//! let d = dispatch(&cfg, &inputs, DispatchOptions::default())?;
//! assert_eq!((d.ranks[0].num_recv(), d.ranks[1].num_recv()), (1, 1));
//! let xs: Vec<_> = d.ranks.iter().map(|r| r.x.clone()).collect();
//! let idx: Vec<_> = inputs.iter().map(|i| i.indices.clone()).collect();
//! let out = combine::<bf16, f32, i32>(&cfg, &d.handle, &xs, None, &idx, CombineOptions::default())?;
//! assert_eq!(out[0].x.row(0).unwrap()[0], 2.0); // sum over the 2 receiving ranks
//! # Ok::<(), EpError>(())
//! ```

#![warn(missing_docs)]

pub mod accounting;
mod combine;
mod config;
#[cfg(test)]
mod copy_emu_tests;
mod dispatch;
mod dtype;
#[cfg(test)]
mod emu_support;
mod error;
mod fp8;
pub mod gpu;
mod gpu_args;
pub mod gpu_internode;
pub mod gpu_ring;
pub mod host;
pub mod internode;
mod layout;
mod order;
pub mod proxy;
pub mod ring;
pub mod routing;
mod tensor;

pub use combine::{combine, CombineOptions, Combined, SumOrder, Weighting};
pub use config::{EpConfig, KernelType, Quantization, MAX_TOP_K, MAX_WARPS_PER_BLOCK};
pub use dispatch::{dispatch, localize_indices, DispatchHandle, DispatchOptions, Dispatched, RankInput, RankRecv, SrcPos};
pub use dtype::{CombineOut, DType, Element, TopkIndex};
pub use error::{EpError, EpResult};
pub use fp8::{dequantize_fp8_blocks, fp8_scale_cols, quantize_fp8_blocks, Fp8E4m3, FP8_BLOCK, FP8_E4M3_MAX, FP8_MIN_AMAX};
pub use half::bf16;
pub use layout::{dispatch_layout, dispatch_layout_with, Layout, LayoutOptions, OutOfRange, Topology};
pub use order::{canonical_order, is_canonical};
pub use tensor::Tensor2;
