//! Offset and size arguments: a Python sequence of ints, or a 1-D numpy array of int64 or
//! uint64 read in place (no Python object per element).

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArrayMethods};
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
        return Err(crate::errors::invalid(format!("{what}: expected a list of ints or a numpy int64 array, got a string")));
    }
    let items: Vec<i128> = obj
        .extract()
        .map_err(|_| crate::errors::invalid(format!("{what}: expected a list of ints or a numpy int64 array, got {}", type_name(obj))))?;
    let mut out = Vec::with_capacity(items.len());
    for (i, v) in items.into_iter().enumerate() {
        out.push(u64::try_from(v).map_err(|_| crate::errors::invalid(format!("{what}[{i}] = {v} is outside 0..2^64")))?);
    }
    Ok(U64s::Owned(out))
}

/// [`u64s`] for an object of the numpy module: a contiguous, aligned 1-D int64 or uint64 array
/// is read in place; another 1-D integer array (strided, misaligned, int32, ...) is first
/// converted by numpy (`astype`, a contiguous copy).
fn numpy_u64s<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<U64s<'py>> {
    let Ok(arr) = obj.cast::<numpy::PyUntypedArray>() else {
        // A numpy scalar or other numpy object: as a sequence of ints, if it is one.
        return obj.extract::<Vec<u64>>().map(U64s::Owned).map_err(|_| {
            crate::errors::invalid(format!("{what}: expected a list of ints or a numpy int64 array, got {}", type_name(obj)))
        });
    };
    let kind = arr.dtype().kind();
    if arr.ndim() != 1 || !(kind == b'i' || kind == b'u') {
        return Err(crate::errors::invalid(format!(
            "{what}: a numpy array must be 1-D of integers, this one is {}-D {}",
            arr.ndim(),
            arr.dtype()
        )));
    }
    let aligned = |p: usize| p.is_multiple_of(8);
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        if a.is_contiguous() && aligned(a.data() as usize) {
            return Ok(U64s::U64(a.clone()));
        }
    }
    if let Ok(a) = obj.cast::<PyArray1<i64>>() {
        if a.is_contiguous() && aligned(a.data() as usize) {
            // SAFETY: contiguous and aligned (checked), alive for this call; read once here.
            if let Some((i, &v)) = unsafe { a.as_slice() }.unwrap_or(&[]).iter().enumerate().find(|(_, &v)| v < 0) {
                return Err(crate::errors::invalid(format!("{what}[{i}] = {v} is negative")));
            }
            return Ok(U64s::I64(a.clone()));
        }
    }
    let target = if kind == b'u' { "uint64" } else { "int64" };
    let copy = obj.call_method1("astype", (target,))?;
    let c = copy
        .cast::<numpy::PyUntypedArray>()
        .map_err(|_| crate::errors::invalid(format!("{what}: numpy astype({target}) gave no array")))?;
    if !c.is_contiguous() {
        return Err(crate::errors::invalid(format!("{what}: numpy gave a non-contiguous copy")));
    }
    numpy_u64s(&copy, what)
}

/// A Python object's type name, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}
