//! The native module `mori_rs._native` behind the Python package `mori_rs`.
//!
//! `mori_rs.io` (python/mori_rs/io.py) re-exports the transfer engine's classes with the names
//! and argument orders of MORI's `mori.io`, so a connector written for MORI moves over by
//! changing its import; `mori_rs.ops` is MORI-EP. Nothing here links libtorch or a GPU SDK:
//! torch tensors are read through their Python methods (`data_ptr()`, `numel()`, ...), and the
//! GPU backends load the CUDA/HIP driver at run time, so the module imports on any host.
//!
//! Threads: every call that can block (waits, backend creation, registration, sessions,
//! deregistration, notification waits) releases the GIL, and one engine may be used from
//! several Python threads at once (the Rust engine is `Sync`).

use pyo3::prelude::*;

mod config;
mod desc;
mod engine;
mod errors;
mod offsets;
mod ops;
mod session;
mod status;

/// Sets the log level of the Rust side (`"error"`, `"warn"`, `"info"`, `"debug"`, `"trace"`,
/// or a `tracing` filter such as `"mori_io=debug"`), printed to stderr. MORI's
/// `set_log_level`. At `"info"` the engine prints which backend serves each pair of regions.
/// Errors: `InvalidArgument` for a filter that does not parse.
#[pyfunction]
fn set_log_level(level: &str) -> PyResult<()> {
    use std::sync::OnceLock;
    use tracing_subscriber::{layer::SubscriberExt, reload, util::SubscriberInitExt, EnvFilter, Registry};
    type Handle = reload::Handle<EnvFilter, Registry>;
    static HANDLE: OnceLock<Option<Handle>> = OnceLock::new();
    let filter = EnvFilter::try_new(level.to_ascii_lowercase().replace("warning", "warn"))
        .map_err(|e| crate::errors::invalid(format!("log level {level:?}: {e}")))?;
    let mut first = Some(filter);
    let h = HANDLE.get_or_init(|| {
        let (layer, handle) = reload::Layer::new(first.take().unwrap_or_default());
        let ok = tracing_subscriber::registry().with(layer).with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr)).try_init();
        ok.ok().map(|_| handle)
    });
    match (h, first) {
        (_, None) => Ok(()),
        (Some(h), Some(f)) => h.reload(f).map_err(|e| crate::errors::err(mori_io::ErrorCode::BadState, format!("set_log_level: {e}"))),
        (None, Some(_)) => {
            Err(crate::errors::err(mori_io::ErrorCode::BadState, "set_log_level: another tracing subscriber is installed in this process"))
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    desc::register(m)?;
    status::register(m)?;
    config::register(m)?;
    engine::register(m)?;
    session::register(m)?;
    ops::register(m)?;
    m.add_function(wrap_pyfunction!(set_log_level, m)?)?;
    m.add("MAX_NOTIF_LEN", mori_io::MAX_NOTIF_LEN)?;
    Ok(())
}
