#![no_main]
//! See `mori_fuzz::trace_gantt`.
mori_fuzz::target!(trace_gantt);
