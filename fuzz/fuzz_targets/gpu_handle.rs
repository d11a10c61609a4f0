#![no_main]
//! See `mori_fuzz::gpu_handle`.
mori_fuzz::target!(gpu_handle);
