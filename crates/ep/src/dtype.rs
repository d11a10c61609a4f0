//! Element types of token data ([`Element`]: f32, bf16, fp8-e4m3) and of top-k indices
//! ([`TopkIndex`]: i32, i64).

use crate::fp8::Fp8E4m3;
use half::bf16;

/// Token element type, as upstream's `data_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DType {
    /// IEEE binary32, 4 bytes.
    F32,
    /// bfloat16, 2 bytes.
    Bf16,
    /// FP8 E4M3 (e4m3fn), 1 byte; carried with per-128-column f32 scales.
    Fp8E4m3,
}

impl DType {
    /// Size of one element in bytes (4, 2, 1).
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
            DType::Fp8E4m3 => 1,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for crate::fp8::Fp8E4m3 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// A token element: f32, [`bf16`] or [`Fp8E4m3`]. Conversions are exact where the target
/// can represent the value, otherwise round-to-nearest-even (fp8 saturates at ±448).
pub trait Element: Copy + Default + PartialEq + std::fmt::Debug + sealed::Sealed + 'static {
    /// The runtime tag.
    const DTYPE: DType;
    /// Widens to f32 (exact for all three types; fp8 without its block scale).
    fn to_f32(self) -> f32;
    /// Narrows from f32.
    fn from_f32(v: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Element for Fp8E4m3 {
    const DTYPE: DType = DType::Fp8E4m3;
    fn to_f32(self) -> f32 {
        Fp8E4m3::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        Fp8E4m3::from_f32(v)
    }
}

/// Output element of combine: f32 or bf16 (accumulation is always f32).
pub trait CombineOut: Element {}
impl CombineOut for f32 {}
impl CombineOut for bf16 {}

/// Top-k expert id type: i32 (MORI) or i64 (DeepEP's `topk_idx_t`). `-1` means "no expert".
pub trait TopkIndex: Copy + Default + PartialEq + std::fmt::Debug + sealed::Sealed + 'static {
    /// The id as i64.
    fn as_i64(self) -> i64;
}

impl TopkIndex for i32 {
    fn as_i64(self) -> i64 {
        i64::from(self)
    }
}

impl TopkIndex for i64 {
    fn as_i64(self) -> i64 {
        self
    }
}
