#![no_main]
//! See `mori_fuzz::topo_capture`.
mori_fuzz::target!(topo_capture);
