#![no_main]
//! See `mori_fuzz::inbound`.
mori_fuzz::target!(inbound);
