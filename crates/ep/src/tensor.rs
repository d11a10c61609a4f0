//! [`Tensor2`]: a plain row-major 2-D array with an explicit shape.

use crate::error::{EpError, EpResult};

/// A row-major `[rows, cols]` array: element `(r, c)` is `data[r * cols + c]`.
///
/// The shape invariant `data.len() == rows * cols` holds for every value of this type
/// (the fields are private; constructors check it). A tensor may have zero rows (a rank
/// with no tokens) or zero columns (no scales).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tensor2<T> {
    rows: usize,
    cols: usize,
    data: Vec<T>,
}

impl<T> Tensor2<T> {
    /// Wraps `data` as `[rows, cols]`. Errors: [`EpError::TensorData`] when
    /// `data.len() != rows * cols` (or the product overflows).
    pub fn new(rows: usize, cols: usize, data: Vec<T>) -> EpResult<Self> {
        match rows.checked_mul(cols) {
            Some(n) if n == data.len() => Ok(Self { rows, cols, data }),
            _ => Err(EpError::TensorData { rows, cols, len: data.len() }),
        }
    }

    /// Builds `[rows, cols]` with `f(r, c)` at each position. Errors: [`EpError::SizeOverflow`]
    /// when `rows * cols` overflows `usize`.
    pub fn from_fn(rows: usize, cols: usize, mut f: impl FnMut(usize, usize) -> T) -> EpResult<Self> {
        let n = rows.checked_mul(cols).ok_or(EpError::SizeOverflow { what: "tensor rows x cols", limit: "usize" })?;
        let mut data = Vec::with_capacity(n);
        for r in 0..rows {
            for c in 0..cols {
                data.push(f(r, c));
            }
        }
        Ok(Self { rows, cols, data })
    }

    /// Number of rows (tokens).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (hidden, top-k or scale dim).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// Row `r` as a slice of `cols` elements, or `None` when `r >= rows`.
    pub fn row(&self, r: usize) -> Option<&[T]> {
        if r < self.rows {
            self.data.get(r * self.cols..(r + 1) * self.cols)
        } else {
            None
        }
    }

    /// Row `r` mutably, or `None` when `r >= rows`.
    pub fn row_mut(&mut self, r: usize) -> Option<&mut [T]> {
        if r < self.rows {
            self.data.get_mut(r * self.cols..(r + 1) * self.cols)
        } else {
            None
        }
    }

    /// Iterates rows in order; yields `rows` slices even when `cols == 0`.
    pub fn iter_rows(&self) -> impl Iterator<Item = &[T]> + '_ {
        let cols = self.cols;
        (0..self.rows).map(move |r| &self.data[r * cols..(r + 1) * cols])
    }

    /// The row-major data.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// Consumes the tensor, returning the row-major data.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }

    /// Maps every element, keeping the shape.
    pub fn map<U>(&self, f: impl FnMut(&T) -> U) -> Tensor2<U> {
        Tensor2 { rows: self.rows, cols: self.cols, data: self.data.iter().map(f).collect() }
    }
}

impl<T: Clone> Tensor2<T> {
    /// `[rows, cols]` filled with `value`. Errors: [`EpError::SizeOverflow`].
    pub fn filled(rows: usize, cols: usize, value: T) -> EpResult<Self> {
        let n = rows.checked_mul(cols).ok_or(EpError::SizeOverflow { what: "tensor rows x cols", limit: "usize" })?;
        Ok(Self { rows, cols, data: vec![value; n] })
    }

    /// An empty `[0, cols]` tensor with room for `cap_rows` rows.
    pub(crate) fn with_row_capacity(cols: usize, cap_rows: usize) -> Self {
        Self { rows: 0, cols, data: Vec::with_capacity(cap_rows.saturating_mul(cols)) }
    }

    /// Appends a row; `row.len()` must equal `cols` (checked by the crate's callers).
    pub(crate) fn push_row(&mut self, row: &[T]) {
        debug_assert_eq!(row.len(), self.cols);
        self.data.extend_from_slice(row);
        self.rows += 1;
    }

    /// The rows in the order given by `perm` (each `perm[i] < rows`, checked by callers).
    pub(crate) fn gather_rows(&self, perm: &[usize]) -> Self {
        let mut out = Self::with_row_capacity(self.cols, perm.len());
        for &p in perm {
            out.push_row(&self.data[p * self.cols..(p + 1) * self.cols]);
        }
        out
    }
}

/// Checks that `t` is `[rows, cols]`, naming the input and rank on failure.
pub(crate) fn expect_shape<T>(t: &Tensor2<T>, input: &'static str, rank: usize, rows: usize, cols: usize) -> EpResult<()> {
    if t.rows == rows && t.cols == cols {
        Ok(())
    } else {
        Err(EpError::Shape { input, rank, exp_rows: rows, exp_cols: cols, rows: t.rows, cols: t.cols })
    }
}
