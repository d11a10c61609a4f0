#![no_main]
//! See `mori_fuzz::tcp_data`.
mori_fuzz::target!(tcp_data);
