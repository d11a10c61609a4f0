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
    /// Writes the element's bits, little-endian, into `out[..size]` (wire records).
    #[doc(hidden)]
    fn put_le(self, out: &mut [u8]);
    /// Reads an element from `b[..size]`, little-endian (the inverse of `put_le`).
    #[doc(hidden)]
    fn get_le(b: &[u8]) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn put_le(self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.to_le_bytes());
    }
    fn get_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
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
    fn put_le(self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.to_bits().to_le_bytes());
    }
    fn get_le(b: &[u8]) -> Self {
        bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))
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
    fn put_le(self, out: &mut [u8]) {
        out[0] = self.0;
    }
    fn get_le(b: &[u8]) -> Self {
        Fp8E4m3(b[0])
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
    /// The inverse of `as_i64` for values that came from this type (wire records).
    #[doc(hidden)]
    fn from_i64_lossy(v: i64) -> Self;
}

impl TopkIndex for i32 {
    fn as_i64(self) -> i64 {
        i64::from(self)
    }
    fn from_i64_lossy(v: i64) -> Self {
        v as i32
    }
}

impl TopkIndex for i64 {
    fn as_i64(self) -> i64 {
        self
    }
    fn from_i64_lossy(v: i64) -> Self {
        v
    }
}

#[cfg(test)]
mod wire_tests {
    use super::*;

    /// Bits survive `put_le`/`get_le` for every dtype, including NaN payloads and -0.
    #[test]
    fn raw_bytes_round_trip() {
        let mut b = [0u8; 4];
        for bits in [0u32, 0x8000_0000, 0x7fc0_1234, 0x3f80_0000, 0xff80_0001] {
            f32::from_bits(bits).put_le(&mut b);
            assert_eq!(b, bits.to_le_bytes());
            assert_eq!(f32::get_le(&b).to_bits(), bits);
        }
        for bits in [0u16, 0x8000, 0x7fc1, 0x3f80] {
            bf16::from_bits(bits).put_le(&mut b);
            assert_eq!(u16::from_le_bytes([b[0], b[1]]), bits);
            assert_eq!(bf16::get_le(&b).to_bits(), bits);
        }
        for bits in [0u8, 0x80, 0x7f, 0xff, 0x38] {
            Fp8E4m3(bits).put_le(&mut b);
            assert_eq!(b[0], bits);
            assert_eq!(Fp8E4m3::get_le(&b), Fp8E4m3(bits));
        }
        assert_eq!(i32::from_i64_lossy((-7i32).as_i64()), -7);
        assert_eq!(i64::from_i64_lossy(i64::MIN.as_i64()), i64::MIN);
    }
}
