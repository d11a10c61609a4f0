//! FP8 E4M3 encode/decode and per-128-column block quantization.

use mori_ep::*;
use proptest::prelude::*;

#[test]
fn every_code_roundtrips() {
    for b in 0..=255u8 {
        let f = Fp8E4m3(b);
        if f.is_nan() {
            assert!(f.to_f32().is_nan(), "code {b:#04x}");
            assert!(Fp8E4m3::from_f32(f.to_f32()).is_nan());
        } else {
            assert_eq!(Fp8E4m3::from_f32(f.to_f32()), f, "code {b:#04x} = {}", f.to_f32());
        }
    }
}

#[test]
fn known_values() {
    let cases = [
        (0.0, 0x00),
        (-0.0, 0x80),
        (1.0, 0x38),
        (-2.0, 0xC0),
        (448.0, 0x7E),
        (1.75, 0x3E),
        (f32::powi(2.0, -6), 0x08),         // smallest normal
        (f32::powi(2.0, -9), 0x01),         // smallest subnormal
        (0.875 * f32::powi(2.0, -6), 0x07), // largest subnormal
        (240.0, 0x77),
    ];
    for (v, code) in cases {
        assert_eq!(Fp8E4m3::from_f32(v).0, code, "{v}");
        assert_eq!(Fp8E4m3(code).to_f32().to_bits(), f32::to_bits(v), "{code:#04x}");
    }
}

#[test]
fn rounding_and_saturation() {
    // Ties go to even mantissa.
    assert_eq!(Fp8E4m3::from_f32(1.0625).0, 0x38); // between 1.0 (m=0) and 1.125 (m=1)
    assert_eq!(Fp8E4m3::from_f32(1.1875).0, 0x3A); // between 1.125 (m=1) and 1.25 (m=2)
    assert_eq!(Fp8E4m3::from_f32(15.5).0, Fp8E4m3::from_f32(16.0).0); // carries into the exponent
    assert_eq!(Fp8E4m3::from_f32(f32::powi(2.0, -10)).0, 0x00); // half the smallest subnormal -> 0 (even)
    assert_eq!(Fp8E4m3::from_f32(3.0 * f32::powi(2.0, -10)).0, 0x02); // 1.5 subnormal steps -> 2
                                                                      // Saturation at ±448, including infinities.
    for v in [449.0, 464.0, 1e6, f32::INFINITY] {
        assert_eq!(Fp8E4m3::from_f32(v).0, 0x7E, "{v}");
        assert_eq!(Fp8E4m3::from_f32(-v).0, 0xFE, "{v}");
    }
    assert!(Fp8E4m3::from_f32(f32::NAN).is_nan());
}

#[test]
fn block_quantization_shapes_and_zero_blocks() {
    let x = Tensor2::from_fn(3, 300, |r, c| if r == 1 { 0.0 } else { (c as f32 - 150.0) / 7.0 }).unwrap();
    let (q, s) = quantize_fp8_blocks(&x);
    assert_eq!(q.shape(), [3, 300]);
    assert_eq!(s.shape(), [3, 3]); // ceil(300 / 128)
    assert!(s.row(1).unwrap().iter().all(|&v| v == FP8_MIN_AMAX / FP8_E4M3_MAX));
    let back = dequantize_fp8_blocks(&q, &s).unwrap();
    assert!(back.row(1).unwrap().iter().all(|&v| v == 0.0));
    let bad = Tensor2::filled(3, 2, 1.0f32).unwrap();
    assert!(matches!(dequantize_fp8_blocks(&q, &bad), Err(EpError::Shape { input: "scales", .. })));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Encoding is the nearest representable value (within half a step) and monotone.
    #[test]
    fn encode_is_nearest(v in -460.0f32..460.0, w in -460.0f32..460.0) {
        let q = Fp8E4m3::from_f32(v).to_f32();
        let a = v.abs().min(FP8_E4M3_MAX);
        // Step at |v|: 2^(e-3) for normals, 2^-9 for subnormals.
        let step = if a < f32::powi(2.0, -6) { f32::powi(2.0, -9) } else { f32::powi(2.0, a.log2().floor() as i32 - 3) };
        prop_assert!((q - v.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)).abs() <= step / 2.0, "{} -> {}", v, q);
        if v <= w {
            prop_assert!(q <= Fp8E4m3::from_f32(w).to_f32());
        }
    }

    /// Block dequantization is within half an fp8 step of the input (relative 2^-4) plus the
    /// subnormal floor.
    #[test]
    fn block_roundtrip_error(vals in proptest::collection::vec(-1000.0f32..1000.0, 1..400)) {
        let n = vals.len();
        let x = Tensor2::new(1, n, vals).unwrap();
        let (q, s) = quantize_fp8_blocks(&x);
        let back = dequantize_fp8_blocks(&q, &s).unwrap();
        for (c, (&a, &b)) in x.as_slice().iter().zip(back.as_slice()).enumerate() {
            let scale = s.as_slice()[c / FP8_BLOCK];
            prop_assert!((a - b).abs() <= a.abs() / 16.0 + scale * f32::powi(2.0, -10) + 1e-6, "{} vs {}", a, b);
        }
    }
}
