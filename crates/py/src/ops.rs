//! `mori_rs.ops` (MORI-EP): to come; see python/mori_rs/ops.py.

use pyo3::prelude::*;

pub(crate) fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
