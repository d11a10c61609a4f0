//! The `mori` command's library: everything that decides is a pure module with its own
//! tests; `main.rs` only parses arguments and prints.
//!
//! - [`check`] / [`probe`]: runtimes and devices present, engine backend verdicts, environment.
//! - [`gpu`]: the GPU runtime through mori-gpu (devices, capabilities, live FABRIC probe, peer
//!   access) and the peer-copy measurement of `mori peer-bw`.
//! - [`class`], [`parse_nvidia`], [`parse_rocm`], [`topo`]: normalized GPU/NIC topology classes
//!   from sysfs or captured vendor matrices; worst class in a group.
//! - [`peer_bw`]: the silent-fallback detector over peer-copy measurements (measured here or
//!   supplied).
//! - [`model`]: staged-versus-direct cost and injection ceiling (models, labelled so).
//! - [`kernel`], [`trace`], [`gantt`]: EP kernel traces, per-iteration extents, aggregates, timeline PNG.
//! - [`rdma_util`]: RDMA bytes and observed bandwidth of dispatch/combine, interpreted.
//! - [`render`]: text tables for the subcommands.

#![warn(missing_docs)]

pub mod check;
pub mod check_io;
pub mod class;
pub mod error;
pub mod gantt;
pub mod gpu;
pub mod kernel;
pub mod model;
pub mod parse_nvidia;
pub mod parse_rocm;
pub mod peer_bw;
pub mod probe;
pub mod rdma_util;
pub mod render;
pub mod topo;
pub mod trace;

pub use error::{CliError, CliResult, EXIT_INPUT, EXIT_NO, EXIT_OK};
