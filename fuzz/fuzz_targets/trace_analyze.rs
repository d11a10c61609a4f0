#![no_main]
//! See `mori_fuzz::trace_analyze`.
mori_fuzz::target!(trace_analyze);
