//! Sweep points and buffer layout (pure).

use crate::args::Args;

/// Largest batch of `--all-batch`.
pub const MAX_SWEEP_BATCH: u64 = 32768;

/// One measured point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// Message size, bytes.
    pub msg: u64,
    /// Transfers per iteration.
    pub batch: u64,
}

/// The points in order: `--all` sweeps message size (×2 from `--sweep-start`, or `+step`
/// when `--sweep-step > 0`) up to `--sweep-max` inclusive; `--all-batch` sweeps the batch
/// 1, 2, 4, ..., 32768; otherwise one point.
pub fn points(a: &Args) -> Vec<Point> {
    if a.all {
        let mut v = Vec::new();
        let mut m = a.sweep_start;
        while m <= a.sweep_max && m > 0 {
            v.push(Point { msg: m, batch: a.transfer_batch_size });
            // Stop at the top of the range instead of wrapping around.
            let next = if a.sweep_step > 0 { m.checked_add(a.sweep_step) } else { m.checked_mul(2) };
            match next {
                Some(n) => m = n,
                None => break,
            }
        }
        v
    } else if a.all_batch {
        (0..).map(|k| 1u64 << k).take_while(|&b| b <= MAX_SWEEP_BATCH).map(|b| Point { msg: a.buffer_size, batch: b }).collect()
    } else {
        vec![Point { msg: a.buffer_size, batch: a.transfer_batch_size }]
    }
}

/// Distance between consecutive slots: `msg` when contiguous, else `msg` rounded up to 64
/// plus a 64-byte gap, so no two slots are adjacent and nothing merges.
/// Saturates at `u64::MAX` for absurd sizes (then [`buffer_bytes`] refuses them).
pub fn stride(msg: u64, contiguous: bool) -> u64 {
    if contiguous {
        msg
    } else {
        msg.div_ceil(64).saturating_mul(64).saturating_add(64)
    }
}

/// Bytes a buffer needs to hold every point's slots. Errors name the point whose layout does
/// not fit in the address space (message size x batch overflows).
pub fn buffer_bytes(points: &[Point], contiguous: bool) -> Result<u64, String> {
    let mut most = 0u64;
    for p in points {
        let need = stride(p.msg, contiguous)
            .checked_mul(p.batch)
            .filter(|&n| n < u64::MAX / 2 && usize::try_from(n).is_ok())
            .ok_or_else(|| format!("message size {} B x batch {} does not fit in memory", p.msg, p.batch))?;
        most = most.max(need);
    }
    Ok(most)
}

/// Slot offsets of a point (identical on both ranks).
pub fn offsets(p: Point, contiguous: bool) -> Vec<u64> {
    let s = stride(p.msg, contiguous);
    (0..p.batch).map(|i| i * s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(v: &[&str]) -> Args {
        Args::parse_from(std::iter::once("bench_engine").chain(v.iter().copied()))
    }

    #[test]
    fn sweeps() {
        let p = points(&args(&["--all"]));
        assert_eq!(p.len(), 18, "8 B .. 1 MiB geometric");
        assert_eq!((p[0].msg, p[17].msg, p[0].batch), (8, 1 << 20, 256));
        let p = points(&args(&["--all", "--sweep-start", "1048576", "--sweep-max", "4194304", "--sweep-step", "1048576"]));
        assert_eq!(p.iter().map(|x| x.msg).collect::<Vec<_>>(), vec![1 << 20, 2 << 20, 3 << 20, 4 << 20]);
        // A step that would wrap around stops the sweep instead.
        let p = points(&args(&["--all", "--sweep-start", "8", "--sweep-max", "64", "--sweep-step", "18446744073709551614"]));
        assert_eq!(p.iter().map(|x| x.msg).collect::<Vec<_>>(), vec![8]);
        let p = points(&args(&["--all-batch", "--buffer-size", "1024"]));
        assert_eq!(p.len(), 16);
        assert_eq!((p[15].batch, p[15].msg), (32768, 1024));
        assert_eq!(points(&args(&[])), vec![Point { msg: 32768, batch: 256 }]);
    }

    #[test]
    fn layout() {
        assert_eq!(stride(100, true), 100);
        assert_eq!(stride(100, false), 192);
        assert_eq!(stride(64, false), 128);
        let p = Point { msg: 8, batch: 3 };
        assert_eq!(offsets(p, false), vec![0, 128, 256]);
        assert_eq!(offsets(p, true), vec![0, 8, 16]);
        assert_eq!(buffer_bytes(&[p, Point { msg: 16, batch: 2 }], true), Ok(32));
        assert!(buffer_bytes(&[Point { msg: u64::MAX, batch: 1 }], false).unwrap_err().contains("does not fit"));
        assert!(buffer_bytes(&[Point { msg: 1 << 62, batch: 4 }], true).is_err());
    }
}
