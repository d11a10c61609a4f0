#![no_main]
//! See `mori_fuzz::fabric_handle`.
mori_fuzz::target!(fabric_handle);
