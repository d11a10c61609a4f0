//! Byte layouts of the protocol's entries, little-endian, each padded to 8 bytes:
//! - dispatch record: `src u32, token u32, dest u32 (V1-LL's destination rank, else
//!   u32::MAX), 0 u32`, K ids as i64, K weights f32, `scale_dim` f32 scales, H elements;
//! - combine row: `token u32, flags u32` (bit 0: has weights; bits 8..16: the writer's combine
//!   element type, [`elem_code`]), H elements, K f32 weights (0 when absent);
//! - combine partial: `token u32, flags u32` (bits 8..16 as a row's), H sums (in the combine
//!   dtype when the partial crosses to another node, as MORI's `tokCombXferBytes` counts them;
//!   f32 for the source's own node), K f32 weight sums.

use crate::config::EpConfig;
use crate::dtype::{DType, Element, TopkIndex};

const HDR: usize = 16;

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Bytes of one dispatch record with `elem` bytes per element.
pub(crate) fn record_stride(cfg: &EpConfig, elem: usize) -> usize {
    pad8(HDR + cfg.top_k * 12 + cfg.scale_dim * 4 + cfg.hidden * elem)
}

/// Bytes of one combine row with `elem` bytes per element.
pub(crate) fn contrib_stride(cfg: &EpConfig, elem: usize) -> usize {
    pad8(8 + cfg.hidden * elem + cfg.top_k * 4)
}

/// Bytes of one combine partial with `elem` bytes per sum: laid out as a combine row (the
/// weight sums are f32).
pub(crate) fn partial_stride(cfg: &EpConfig, elem: usize) -> usize {
    contrib_stride(cfg, elem)
}

/// A combine element type as it stands in bits 8..16 of a row's or partial's flags word: 1 + the
/// type's index (f32, bf16, fp8 e4m3), so that 0 names none.
fn elem_code(d: DType) -> u32 {
    (match d {
        DType::F32 => 1,
        DType::Bf16 => 2,
        DType::Fp8E4m3 => 3,
    }) << 8
}

/// The combine element type the writer of the row or partial at `b[..8]` combines in, or the
/// code found when it names none.
pub(crate) fn row_elem(b: &[u8]) -> Result<DType, u32> {
    match (get_u32(b, 4) >> 8) & 0xff {
        1 => Ok(DType::F32),
        2 => Ok(DType::Bf16),
        3 => Ok(DType::Fp8E4m3),
        code => Err(code),
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn get_f32(b: &[u8], at: usize) -> f32 {
    f32::from_bits(get_u32(b, at))
}

fn put_elems<X: Element>(out: &mut Vec<u8>, xs: &[X]) {
    let size = X::DTYPE.size();
    let start = out.len();
    out.resize(start + xs.len() * size, 0);
    for (c, &x) in out[start..].chunks_exact_mut(size).zip(xs) {
        x.put_le(c);
    }
}

fn pad_to(out: &mut Vec<u8>, start: usize, stride: usize) {
    out.resize(start + stride, 0);
}

/// A dispatch record's fields, borrowed from the source's input rows.
pub(crate) struct RecordRef<'a, X, I> {
    pub src: usize,
    pub token: usize,
    pub dest: Option<usize>,
    pub ids: &'a [I],
    pub weights: &'a [f32],
    pub scales: Option<&'a [f32]>,
    pub x: &'a [X],
}

/// Appends one dispatch record of `stride` bytes.
pub(crate) fn put_record<X: Element, I: TopkIndex>(out: &mut Vec<u8>, stride: usize, r: &RecordRef<'_, X, I>) {
    let start = out.len();
    put_u32(out, r.src as u32);
    put_u32(out, r.token as u32);
    put_u32(out, r.dest.map_or(u32::MAX, |d| d as u32));
    put_u32(out, 0);
    for &id in r.ids {
        out.extend_from_slice(&id.as_i64().to_le_bytes());
    }
    for &w in r.weights {
        out.extend_from_slice(&w.to_le_bytes());
    }
    if let Some(s) = r.scales {
        for &v in s {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    put_elems(out, r.x);
    pad_to(out, start, stride);
}

/// A decoded dispatch record (header and ids; the payload stays in the bytes).
pub(crate) struct RecordHead {
    pub src: usize,
    pub token: usize,
    pub dest: Option<usize>,
    pub ids: Vec<i64>,
}

/// The header and ids of the record at `b[..stride]`.
pub(crate) fn record_head(cfg: &EpConfig, b: &[u8]) -> RecordHead {
    let dest = get_u32(b, 8);
    let ids = (0..cfg.top_k)
        .map(|k| {
            let at = HDR + k * 8;
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[at..at + 8]);
            i64::from_le_bytes(v)
        })
        .collect();
    RecordHead { src: get_u32(b, 0) as usize, token: get_u32(b, 4) as usize, dest: (dest != u32::MAX).then_some(dest as usize), ids }
}

/// The record's payload: (ids as `I`, weights, scales, elements).
pub(crate) fn record_body<X: Element, I: TopkIndex>(cfg: &EpConfig, b: &[u8]) -> (Vec<I>, Vec<f32>, Vec<f32>, Vec<X>) {
    let k = cfg.top_k;
    let ids = record_head(cfg, b).ids.into_iter().map(I::from_i64_lossy).collect();
    let f = |at: usize| get_f32(b, at);
    let w0 = HDR + k * 8;
    let weights = (0..k).map(|i| f(w0 + i * 4)).collect();
    let s0 = w0 + k * 4;
    let scales = (0..cfg.scale_dim).map(|i| f(s0 + i * 4)).collect();
    let x0 = s0 + cfg.scale_dim * 4;
    let size = X::DTYPE.size();
    let x = (0..cfg.hidden).map(|i| X::get_le(&b[x0 + i * size..])).collect();
    (ids, weights, scales, x)
}

/// Appends one combine row.
pub(crate) fn put_contrib<X: Element>(out: &mut Vec<u8>, stride: usize, token: usize, x: &[X], w: Option<&[f32]>, k: usize) {
    let start = out.len();
    put_u32(out, token as u32);
    put_u32(out, u32::from(w.is_some()) | elem_code(X::DTYPE));
    put_elems(out, x);
    for i in 0..k {
        out.extend_from_slice(&w.and_then(|w| w.get(i)).copied().unwrap_or(0.0).to_le_bytes());
    }
    pad_to(out, start, stride);
}

/// A combine row: (token, elements, weights if present).
pub(crate) fn contrib<X: Element>(cfg: &EpConfig, b: &[u8]) -> (usize, Vec<X>, Option<Vec<f32>>) {
    let size = X::DTYPE.size();
    let x: Vec<X> = (0..cfg.hidden).map(|i| X::get_le(&b[8 + i * size..])).collect();
    let w0 = 8 + cfg.hidden * size;
    let w = (get_u32(b, 4) & 1 != 0).then(|| (0..cfg.top_k).map(|i| get_f32(b, w0 + i * 4)).collect());
    (get_u32(b, 0) as usize, x, w)
}

/// Appends one combine partial: the sums `x` as `X` (rounded to nearest) when `rounded`, else
/// as f32, then the weight sums `w` as f32. Its flags name `X` either way: the combine's type.
pub(crate) fn put_partial<X: Element>(out: &mut Vec<u8>, stride: usize, token: usize, x: &[f32], w: &[f32], rounded: bool) {
    let start = out.len();
    put_u32(out, token as u32);
    put_u32(out, elem_code(X::DTYPE));
    if rounded {
        put_elems(out, &x.iter().map(|&v| X::from_f32(v)).collect::<Vec<X>>());
    } else {
        x.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    }
    w.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    pad_to(out, start, stride);
}

/// A combine partial written by [`put_partial`] with the same `rounded`: (token, H + K f32
/// values).
pub(crate) fn partial<X: Element>(cfg: &EpConfig, b: &[u8], rounded: bool) -> (usize, Vec<f32>) {
    let f = |at: usize| get_f32(b, at);
    let size = if rounded { X::DTYPE.size() } else { 4 };
    let x = (0..cfg.hidden).map(|i| if rounded { X::get_le(&b[8 + i * size..]).to_f32() } else { f(8 + i * 4) });
    let w0 = 8 + cfg.hidden * size;
    let v = x.chain((0..cfg.top_k).map(|i| f(w0 + i * 4))).collect();
    (get_u32(b, 0) as usize, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16;

    /// A partial for another node holds bf16 sums (half the bytes of f32 ones at H = 7168,
    /// K = 8: 8 + 14 336 + 32 B against 8 + 28 672 + 32), rounded to nearest even; the own
    /// node's keeps f32; the weight sums stay f32 in both.
    #[test]
    fn partials_cross_in_the_combine_dtype_and_stay_f32_at_home() {
        let cfg = EpConfig::new(2, 7168, 16, 8, 4).unwrap();
        assert_eq!((partial_stride(&cfg, 2), partial_stride(&cfg, 4)), (14_376, 28_712));
        let small = EpConfig::new(2, 4, 16, 1, 4).unwrap();
        let x = [1.0 + 2f32.powi(-9), 3.0 + 2f32.powi(-8), -0.5, 7.0];
        let w = [0.1f32];
        for (rounded, want) in [(true, [1.0, 3.0, -0.5, 7.0]), (false, x)] {
            let stride = partial_stride(&small, if rounded { 2 } else { 4 });
            let mut out = Vec::new();
            put_partial::<bf16>(&mut out, stride, 5, &x, &w, rounded);
            assert_eq!(out.len(), stride, "rounded {rounded}");
            let (token, v) = partial::<bf16>(&small, &out, rounded);
            assert_eq!((token, v), (5, vec![want[0], want[1], want[2], want[3], 0.1]), "rounded {rounded}");
        }
    }

    /// Rows and partials name their writer's combine element type in bits 8..16 of the flags
    /// word, beside a row's has-weights bit; a flags word that names none gives its code.
    #[test]
    fn rows_and_partials_name_the_combine_element_type() {
        let cfg = EpConfig::new(2, 4, 16, 2, 4).unwrap();
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = Vec::new();
        put_contrib::<f32>(&mut out, contrib_stride(&cfg, 4), 3, &x, Some(&[0.5, 0.25]), 2);
        assert_eq!((row_elem(&out), get_u32(&out, 4)), (Ok(DType::F32), 0x101));
        assert_eq!(contrib::<f32>(&cfg, &out), (3, x.to_vec(), Some(vec![0.5, 0.25])));
        out.clear();
        let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        put_contrib::<bf16>(&mut out, contrib_stride(&cfg, 2), 3, &xb, None, 2);
        assert_eq!((row_elem(&out), get_u32(&out, 4)), (Ok(DType::Bf16), 0x200));
        assert_eq!(contrib::<bf16>(&cfg, &out).2, None);
        for rounded in [true, false] {
            out.clear();
            put_partial::<crate::Fp8E4m3>(&mut out, partial_stride(&cfg, 4), 1, &x, &[0.0, 0.0], rounded);
            assert_eq!(row_elem(&out), Ok(DType::Fp8E4m3), "rounded {rounded}");
        }
        out[5] = 0;
        assert_eq!(row_elem(&out), Err(0));
        out[5] = 9;
        assert_eq!(row_elem(&out), Err(9));
    }
}
