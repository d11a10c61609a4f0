//! Offset and size arguments: a Python sequence of ints, or a 1-D numpy array of int64 or
//! uint64 read in place (no Python object per element).

use crate::errors::InvalidArgument;
use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// Byte offsets or sizes as the engine takes them.
///
/// A contiguous numpy array is read in place, without numpy's borrow tracking (about 1 µs a
/// call): like any extension reading an array's buffer, the engine reads it while the call
/// runs, and a Python thread writing the same array at that moment races with it (the engine
/// checks every value it reads against the registered regions, so a race yields another
/// batch, never an access outside them).
pub(crate) enum U64s<'py> {
    Owned(Vec<u64>),
    U64(Bound<'py, PyArray1<u64>>),
    /// Checked non-negative when made.
    I64(Bound<'py, PyArray1<i64>>),
}

impl U64s<'_> {
    /// The values.
    pub(crate) fn as_slice(&self) -> &[u64] {
        // SAFETY: contiguity was checked when the value was made, and the array is kept alive
        // by the Bound; see the type's doc for concurrent writers.
        match self {
            U64s::Owned(v) => v,
            U64s::U64(a) => unsafe { a.as_slice() }.unwrap_or(&[]),
            U64s::I64(a) => bytemuck::cast_slice(unsafe { a.as_slice() }.unwrap_or(&[])),
        }
    }
}

/// Reads argument `what`. Errors: `InvalidArgument` naming `what` for a negative value (and
/// its index), an array of another dtype or dimension, or anything that is not a sequence of
/// ints.
pub(crate) fn u64s<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<U64s<'py>> {
    // Only a numpy object is checked against numpy's types: a list never imports numpy, so
    // the package works where numpy is not installed.
    if obj.get_type().module().is_ok_and(|m| m.to_str().is_ok_and(|s| s == "numpy")) {
        return numpy_u64s(obj, what);
    }
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(InvalidArgument::new_err(format!("{what}: expected a list of ints or a numpy int64 array, got a string")));
    }
    let items: Vec<i128> = obj
        .extract()
        .map_err(|_| InvalidArgument::new_err(format!("{what}: expected a list of ints or a numpy int64 array, got {}", type_name(obj))))?;
    let mut out = Vec::with_capacity(items.len());
    for (i, v) in items.into_iter().enumerate() {
        out.push(u64::try_from(v).map_err(|_| InvalidArgument::new_err(format!("{what}[{i}] = {v} is outside 0..2^64")))?);
    }
    Ok(U64s::Owned(out))
}

/// [`u64s`] for an object of the numpy module.
fn numpy_u64s<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<U64s<'py>> {
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        if a.is_contiguous() {
            return Ok(U64s::U64(a.clone()));
        }
        return Ok(U64s::Owned(a.to_vec().map_err(|e| InvalidArgument::new_err(format!("{what}: {e}")))?));
    }
    if let Ok(a) = obj.cast::<PyArray1<i64>>() {
        let check = |i: usize, v: i64| -> PyResult<u64> {
            u64::try_from(v).map_err(|_| InvalidArgument::new_err(format!("{what}[{i}] = {v} is negative")))
        };
        if a.is_contiguous() {
            // SAFETY: contiguous (checked), alive for this call; read once here.
            if let Some((i, &v)) = unsafe { a.as_slice() }.unwrap_or(&[]).iter().enumerate().find(|(_, &v)| v < 0) {
                check(i, v)?;
            }
            return Ok(U64s::I64(a.clone()));
        }
        let v = a.to_vec().map_err(|e| InvalidArgument::new_err(format!("{what}: {e}")))?;
        let v: PyResult<Vec<u64>> = v.into_iter().enumerate().map(|(i, v)| check(i, v)).collect();
        return Ok(U64s::Owned(v?));
    }
    match obj.cast::<numpy::PyUntypedArray>() {
        Ok(a) => Err(InvalidArgument::new_err(format!(
            "{what}: a numpy array must be 1-D int64 or uint64, this one is {}-D {}",
            a.ndim(),
            a.dtype()
        ))),
        // A numpy scalar or other numpy object: as a sequence of ints, if it is one.
        Err(_) => obj.extract::<Vec<u64>>().map(U64s::Owned).map_err(|_| {
            InvalidArgument::new_err(format!("{what}: expected a list of ints or a numpy int64 array, got {}", type_name(obj)))
        }),
    }
}

/// A Python object's type name, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}
