#![no_main]
//! See `mori_fuzz::env_strings`.
mori_fuzz::target!(env_strings);
