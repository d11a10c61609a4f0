#![no_main]
//! See `mori_fuzz::bootstrap_wire`.
mori_fuzz::target!(bootstrap_wire);
