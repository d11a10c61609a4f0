#![no_main]
//! See `mori_fuzz::inbound_bulk`.
mori_fuzz::target!(inbound_bulk);
