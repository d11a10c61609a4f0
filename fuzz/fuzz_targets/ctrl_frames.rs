#![no_main]
//! See `mori_fuzz::ctrl_frames`.
mori_fuzz::target!(ctrl_frames);
