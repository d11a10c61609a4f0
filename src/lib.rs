//! mori: facade re-exporting the layers of mori-rs.
pub use mori_bootstrap as bootstrap;
pub use mori_io as io;
pub use mori_io_core as io_core;
pub use mori_io_tcp as io_tcp;
