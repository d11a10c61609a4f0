#![no_main]
//! See `mori_fuzz::engine_control`.
mori_fuzz::target!(engine_control);
