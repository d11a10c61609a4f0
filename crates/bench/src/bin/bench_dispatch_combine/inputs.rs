//! The inputs both paths run on, generated identically in every process: routing seeded per
//! rank (DeepEP's setting, one expert group per node), token rows and combine rows that are
//! small integers (exact in bf16 and fp8 E4M3 before scaling); and their little-endian bytes.

use crate::args::{AnyResult, Args};
use mori_ep::routing::{generate_routing, RoutingSpec, SplitMix64};
use mori_ep::{bf16, EpConfig, Fp8E4m3, SrcPos, Tensor2};

/// All ranks' inputs.
pub struct Inputs {
    pub idx: Vec<Tensor2<i64>>,
    pub weights: Vec<Tensor2<f32>>,
    pub x_f32: Vec<Tensor2<f32>>,
}

/// Rank r's routing from seed `seed * 1_000_003 + r`, expert groups = the nodes of `cfg`;
/// `--zero-token-ranks` have no tokens, `--none-rows-every N` makes every N-th token route nowhere.
pub fn gen_inputs(a: &Args, cfg: &EpConfig) -> AnyResult<Inputs> {
    let nodes = (cfg.world_size / cfg.gpus_per_node.max(1)).max(1);
    let mut idx = Vec::new();
    let mut weights = Vec::new();
    let mut x_f32 = Vec::new();
    for r in 0..cfg.world_size {
        let mut rng = SplitMix64::new(a.seed.wrapping_mul(1_000_003).wrapping_add(r as u64));
        let t_n = if a.zero_token_ranks.contains(&r) { 0 } else { a.num_tokens };
        let (mut i, w) = generate_routing(RoutingSpec::deepep(t_n, a.num_experts, a.top_k, nodes), &mut rng)?;
        if a.remote_only_ranks.contains(&r) {
            i = remote_only(&i, r / cfg.gpus_per_node.max(1), a.num_experts / nodes, a.num_experts, &mut rng)?;
        }
        if let Some(n) = a.none_rows_every.filter(|&n| n > 0) {
            i = Tensor2::from_fn(t_n, a.top_k, |t, k| if t % n == 0 { -1 } else { i.row(t).map_or(-1, |row| row[k]) })?;
        }
        idx.push(i);
        weights.push(w);
        x_f32.push(Tensor2::from_fn(t_n, a.hidden, |t, h| ((r * 131 + t * 7 + h) % 17) as f32 - 8.0)?);
    }
    Ok(Inputs { idx, weights, x_f32 })
}

/// `idx` with every expert of node `node` (`epn` experts per node, ids `[node*epn,
/// (node+1)*epn)`) replaced by a distinct random expert of another node; the other entries kept.
/// Errors when the other nodes hold fewer experts than a row's top-k.
fn remote_only(idx: &Tensor2<i64>, node: usize, epn: usize, experts: usize, rng: &mut SplitMix64) -> AnyResult<Tensor2<i64>> {
    let local = (node * epn) as i64..((node + 1) * epn) as i64;
    let k = idx.cols();
    if experts - epn < k {
        return Err(format!("--remote-only-ranks: the other nodes hold {} experts, fewer than --top-k {k}", experts - epn).into());
    }
    let mut rows = Vec::with_capacity(idx.rows() * k);
    for t in 0..idx.rows() {
        let mut row: Vec<i64> = idx.row(t).map(<[i64]>::to_vec).unwrap_or_default();
        for j in 0..row.len() {
            while local.contains(&row[j]) {
                let e = rng.below(experts as u64) as i64;
                if !local.contains(&e) && !row.contains(&e) {
                    row[j] = e;
                }
            }
        }
        rows.extend(row);
    }
    Ok(Tensor2::new(idx.rows(), k, rows)?)
}

/// The combine input row of a received token: a function of its source only.
pub fn comb_value(src: SrcPos, h: usize) -> f32 {
    ((src.rank * 5 + src.token * 3 + h) % 11) as f32 - 5.0
}

/// Little-endian bytes of an element, as the GPU buffers hold it.
pub trait RowBytes {
    fn put(&self, out: &mut Vec<u8>);
}
macro_rules! le_bytes {
    ($($t:ty => |$v:ident| $bits:expr),* $(,)?) => {$(
        impl RowBytes for $t {
            fn put(&self, out: &mut Vec<u8>) {
                let $v = self;
                out.extend_from_slice(&$bits.to_le_bytes())
            }
        }
    )*};
}
le_bytes!(f32 => |v| v, i32 => |v| v, i64 => |v| v, bf16 => |v| v.to_bits(), Fp8E4m3 => |v| v.0);

pub fn bytes_of<T: RowBytes>(t: &Tensor2<T>) -> Vec<u8> {
    let mut v = Vec::new();
    for x in t.as_slice() {
        x.put(&mut v);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_bytes_are_little_endian_as_on_the_gpu() {
        let t = |v: Vec<u8>| v;
        assert_eq!(bytes_of(&Tensor2::new(1, 2, vec![1.0f32, -2.0]).unwrap()), t(vec![0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]));
        assert_eq!(bytes_of(&Tensor2::new(1, 1, vec![bf16::from_f32(1.0)]).unwrap()), t(vec![0x80, 0x3f]));
        assert_eq!(bytes_of(&Tensor2::new(1, 2, vec![Fp8E4m3(0x38), Fp8E4m3(0xb8)]).unwrap()), t(vec![0x38, 0xb8]));
        assert_eq!(bytes_of(&Tensor2::new(1, 1, vec![-1i32]).unwrap()), t(vec![0xff; 4]));
        assert_eq!(bytes_of(&Tensor2::new(1, 1, vec![258i64]).unwrap()), t(vec![2, 1, 0, 0, 0, 0, 0, 0]));
    }

    #[test]
    fn remote_only_rows_leave_the_node_keep_remote_picks_and_stay_distinct() {
        // 2 nodes of 16 experts; rank on node 0; rows as DeepEP's generator gives them.
        let mut rng = SplitMix64::new(7);
        let (idx, _) = generate_routing(RoutingSpec::deepep(200, 32, 6, 2), &mut rng).unwrap();
        let out = remote_only(&idx, 0, 16, 32, &mut rng).unwrap();
        let mut moved = 0;
        for t in 0..200 {
            let (a, b) = (idx.row(t).unwrap(), out.row(t).unwrap());
            for (x, y) in a.iter().zip(b) {
                assert!((16..32).contains(y), "token {t}: {b:?} has an expert of node 0");
                if (16..32).contains(x) {
                    assert_eq!(x, y, "token {t}: a remote pick was changed");
                } else {
                    moved += 1;
                }
            }
            let mut d = b.to_vec();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 6, "token {t}: {b:?} repeats an expert");
        }
        assert!(moved > 100, "the routing had node-0 picks to move ({moved})");
        assert!(remote_only(&idx, 0, 28, 32, &mut rng).unwrap_err().to_string().contains("fewer than --top-k 6"));
    }
}
