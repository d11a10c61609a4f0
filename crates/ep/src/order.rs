//! Canonical received order: (source rank, source token) ascending — the order the host
//! reference produces. A GPU kernel may land tokens in any order (e.g. by arrival); bring
//! its output to this order with [`RankRecv::canonicalize`] before comparing.

use crate::dispatch::{RankRecv, SrcPos};
use crate::error::{EpError, EpResult};

/// The permutation `p` such that `src[p[0]], src[p[1]], ...` is ascending (stable).
pub fn canonical_order(src: &[SrcPos]) -> Vec<usize> {
    let mut p: Vec<usize> = (0..src.len()).collect();
    p.sort_by_key(|&i| src[i]);
    p
}

/// Whether `src` is strictly ascending (canonical and free of duplicates).
pub fn is_canonical(src: &[SrcPos]) -> bool {
    src.windows(2).all(|w| w[0] < w[1])
}

impl<X: Clone, I: Clone, S: Clone> RankRecv<X, I, S> {
    /// A copy with every row tensor permuted into canonical order. `rank` names the
    /// receiving rank in errors.
    ///
    /// Errors: [`EpError::Shape`] when a tensor's row count differs from `src.len()`;
    /// [`EpError::BadSource`] when a source appears twice.
    pub fn canonicalize(&self, rank: usize) -> EpResult<Self> {
        let n = self.src.len();
        let rows_ok = |t_rows: usize, cols: usize, input| {
            if t_rows == n {
                Ok(())
            } else {
                Err(shape(input, rank, n, cols, t_rows))
            }
        };
        rows_ok(self.x.rows(), self.x.cols(), "received x")?;
        rows_ok(self.weights.rows(), self.weights.cols(), "received weights")?;
        rows_ok(self.indices.rows(), self.indices.cols(), "received indices")?;
        if let Some(s) = &self.scales {
            rows_ok(s.rows(), s.cols(), "received scales")?;
        }
        let p = canonical_order(&self.src);
        for (i, w) in p.windows(2).enumerate() {
            if self.src[w[0]] == self.src[w[1]] {
                let SrcPos { rank: src_rank, token: src_token } = self.src[w[1]];
                return Err(EpError::BadSource { rank, row: i + 1, src_rank, src_token, problem: "appears twice" });
            }
        }
        Ok(Self {
            x: self.x.gather_rows(&p),
            weights: self.weights.gather_rows(&p),
            scales: self.scales.as_ref().map(|s| s.gather_rows(&p)),
            indices: self.indices.gather_rows(&p),
            src: p.iter().map(|&i| self.src[i]).collect(),
        })
    }

    /// Whether the rows are already in canonical order.
    pub fn is_canonical(&self) -> bool {
        is_canonical(&self.src)
    }
}

fn shape(input: &'static str, rank: usize, n: usize, cols: usize, rows: usize) -> EpError {
    EpError::Shape { input, rank, exp_rows: n, exp_cols: cols, rows, cols }
}
