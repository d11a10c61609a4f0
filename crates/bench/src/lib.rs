//! `bench_engine`: the nixlbench-comparable MORI-IO benchmark (see the MORI-IO seed's
//! "C++ Benchmark" section for the flags, timing rules, table and validation).
//!
//! Timing (as nixlbench): one whole-loop timer around the timed iterations; latency per
//! transfer = total / (iters × batch); bandwidth = msg × batch × iters / 1e9 / seconds
//! (GB = 1e9); completion by spin-poll; one request outstanding at a time (stop-and-wait;
//! with `--disable-batch-transfer` the batch's single transfers are posted together, then all
//! awaited, as the Python benchmark does); warm-up iterations excluded.

pub mod args;
pub mod baseline;
pub mod local;
pub mod membuf;
pub mod paged;
mod paged_run;
pub mod report;
pub mod run;
pub mod sweep;
pub mod validate;
