//! `bench_dispatch_combine`: MORI-EP dispatch/combine, checked against the host reference
//! (mori-ep's oracle) and timed.
//!
//! - `--device gpu` (default, [`gpu`]): the intranode GPU kernels, next to a plain
//!   device-to-device copy of the same byte count (the roofline) measured in the same run;
//!   across nodes with `--kernel-type v1`, `v1_ll` or `async_ll` ([`gpu_inter`]): every rank on one GPU, the
//!   nodes as groups of ranks, the inter-node leg through the proxies (xgmi or tcp).
//! - `--device cpu` ([`cpu`]): the host implementation (`mori_ep::host`), intra- and inter-node
//!   (V1, V1-LL, AsyncLL), either every rank on this host (`--local`: one spawned process per
//!   `--ranks-per-proc` ranks) or one process among many a launcher started (torchrun, srun,
//!   mpirun: rank, world and master from the environment).
//!
//! Flags, their checks and the configuration they build are in [`args`]; both paths run on the
//! inputs of [`inputs`] (same seeds, DeepEP routing with one expert group per node).
//!
//! Accounting (MORI-EP seed, "Bandwidth Computation"): XGMI/NVL bytes of a rank = received
//! tokens x (hidden x element size + scale bytes); combine moves the same token count in the
//! combine dtype; RDMA algo tokens = unique (token, node) pairs incl. the local node, physical
//! = algo x (nodes-1)/nodes; GB = 1e9.

mod arg_types;
mod args;
mod cpu;
mod cpu_supervisor;
mod flag_words;
mod gpu;
mod gpu_check;
mod gpu_device_api;
mod gpu_inter;
mod inputs;
mod table;

use args::{AnyResult, Args, DeviceArg};
use clap::Parser;
use std::process::ExitCode;

fn run(a: &Args) -> AnyResult<bool> {
    match a.device {
        DeviceArg::Gpu => gpu::run(a),
        DeviceArg::Cpu => cpu::run(a),
    }
}

/// Writes `line` and a newline to stderr in one write: the processes of a `--local` job share
/// the parent's stderr, and `eprintln!` writes its pieces separately, so lines of two
/// processes could interleave mid-line (a pipe keeps writes of up to 4 KiB whole).
pub fn say(line: &str) {
    use std::io::Write;
    let mut b = Vec::with_capacity(line.len() + 1);
    b.extend_from_slice(line.as_bytes());
    b.push(b'\n');
    let _ = std::io::stderr().lock().write_all(&b);
}

fn main() -> ExitCode {
    let vars = |k: &str| std::env::var(k).ok();
    match args::resolve(Args::parse(), &vars).and_then(|a| run(&a)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let msg = flag_words::reworded(e.as_ref()).unwrap_or_else(|| e.to_string());
            say(&format!("bench_dispatch_combine: error: {msg}"));
            ExitCode::FAILURE
        }
    }
}
