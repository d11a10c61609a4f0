//! FP8 E4M3 (the OCP "e4m3fn" variant: bias 7, no infinities, 0x7F/0xFF = NaN,
//! largest finite 448) and per-128-column block quantization.
//!
//! Written from the format's definition: 1 sign bit, 4 exponent bits, 3 mantissa bits;
//! exponent field 0 encodes subnormals `m/8 x 2^-6`, otherwise `(1 + m/8) x 2^(e-7)`.
//! The AMD "fnuz" variant (bias 8, NaN = 0x80, max 240) is not implemented here.

use crate::error::{EpError, EpResult};
use crate::tensor::Tensor2;

/// Largest finite E4M3 value, 448 = 1.75 x 2^8.
pub const FP8_E4M3_MAX: f32 = 448.0;

/// Columns that share one scale in block quantization (DeepSeek-style 1x128 blocks).
pub const FP8_BLOCK: usize = 128;

/// Smallest scale [`quantize_fp8_blocks`] uses: a block's amax is clamped to at least this x 448,
/// so an all-zero block gets a finite, non-zero scale.
pub const FP8_MIN_AMAX: f32 = 1e-4;

/// One FP8 E4M3 (e4m3fn) value, stored as its bit pattern.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Fp8E4m3(pub u8);

impl Fp8E4m3 {
    /// Encodes `v` with round-to-nearest-even. Finite values beyond ±448 (and ±inf)
    /// saturate to ±448 (`0x7E`/`0xFE`); NaN encodes as `0x7F` (sign kept).
    pub fn from_f32(v: f32) -> Self {
        let sign: u8 = if v.is_sign_negative() { 0x80 } else { 0 };
        if v.is_nan() {
            return Self(sign | 0x7F);
        }
        let a = v.abs();
        if a >= FP8_E4M3_MAX {
            return Self(sign | 0x7E);
        }
        // Below 2^-6 the code is linear: code = a / 2^-9 (subnormals; 8 -> first normal).
        let min_normal = f32::powi(2.0, -6);
        let code = if a < min_normal {
            (a * 512.0).round_ties_even() as u8
        } else {
            // a = s x 2^e with s in [1, 2); 2^e is exact in f32 for e in [-6, 8].
            let e = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
            let q = (a / f32::powi(2.0, e - 3)).round_ties_even() as i32; // in 8..=16
                                                                          // q == 16 carries into the exponent, which the addition does by itself.
            (((e + 7) << 3) + (q - 8)) as u8
        };
        Self(sign | code.min(0x7E))
    }

    /// Decodes to f32 (exact: every E4M3 value is an f32).
    pub fn to_f32(self) -> f32 {
        let neg = self.0 & 0x80 != 0;
        let e = ((self.0 >> 3) & 0x0F) as i32;
        let m = (self.0 & 0x07) as f32;
        let mag = if e == 0x0F && self.0 & 0x07 == 0x07 {
            f32::NAN
        } else if e == 0 {
            m * f32::powi(2.0, -9)
        } else {
            (1.0 + m / 8.0) * f32::powi(2.0, e - 7)
        };
        if neg {
            -mag
        } else {
            mag
        }
    }

    /// Whether this is one of the two NaN codes.
    pub fn is_nan(self) -> bool {
        self.0 & 0x7F == 0x7F
    }
}

/// Number of scale columns for `hidden` columns: `ceil(hidden / 128)`.
pub fn fp8_scale_cols(hidden: usize) -> usize {
    hidden.div_ceil(FP8_BLOCK)
}

/// Quantizes `x` `[T, H]` (f32) to E4M3 with one f32 scale per row and 128-column block.
///
/// Returns `(q [T, H] Fp8E4m3, scales [T, ceil(H/128)] f32)` with
/// `scale = max(amax(block), 1e-4) / 448` and `q = encode(x / scale)`, so that
/// `x ≈ decode(q) x scale` ([`dequantize_fp8_blocks`]). Non-finite inputs: NaN stays NaN,
/// ±inf makes the block's scale infinite (callers feed finite activations).
pub fn quantize_fp8_blocks(x: &Tensor2<f32>) -> (Tensor2<Fp8E4m3>, Tensor2<f32>) {
    let (t, h) = (x.rows(), x.cols());
    let s_cols = fp8_scale_cols(h);
    let mut q = Vec::with_capacity(t * h);
    let mut scales = Vec::with_capacity(t * s_cols);
    for row in x.iter_rows() {
        for block in row.chunks(FP8_BLOCK) {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = amax.max(FP8_MIN_AMAX) / FP8_E4M3_MAX;
            scales.push(scale);
            q.extend(block.iter().map(|v| Fp8E4m3::from_f32(v / scale)));
        }
    }
    // Shapes are consistent by construction.
    let q = Tensor2::new(t, h, q).unwrap_or_default();
    let scales = Tensor2::new(t, s_cols, scales).unwrap_or_default();
    (q, scales)
}

/// Inverse of [`quantize_fp8_blocks`]: `x[t, c] = decode(q[t, c]) x scales[t, c / 128]`.
/// Errors: [`EpError::Shape`] (input `"scales"`, rank 0) when `scales` is not `[T, ceil(H/128)]`.
pub fn dequantize_fp8_blocks(q: &Tensor2<Fp8E4m3>, scales: &Tensor2<f32>) -> EpResult<Tensor2<f32>> {
    crate::tensor::expect_shape(scales, "scales", 0, q.rows(), fp8_scale_cols(q.cols()))?;
    let mut out = Vec::with_capacity(q.rows() * q.cols());
    for (row, srow) in q.iter_rows().zip(scales.iter_rows()) {
        for (block, s) in row.chunks(FP8_BLOCK).zip(srow) {
            out.extend(block.iter().map(|v| v.to_f32() * s));
        }
    }
    Tensor2::new(q.rows(), q.cols(), out).map_err(|_| EpError::SizeOverflow { what: "dequantized tensor", limit: "usize" })
}
