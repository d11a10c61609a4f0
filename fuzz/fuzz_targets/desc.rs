#![no_main]
//! See `mori_fuzz::desc`.
mori_fuzz::target!(desc);
