//! `--device gpu`'s oracle checks: the received bytes of every local rank and the combine
//! output, read back from the devices and compared with the host reference.

use crate::args::{err, AnyResult, Args, CombDType};
use crate::gpu::OracleRecv;
use crate::inputs::{comb_value, Inputs};
use mori_ep::gpu::IntranodeEp;
use mori_ep::{bf16, combine, CombineOptions, DispatchHandle, EpConfig, Tensor2, Weighting};
use mori_gpu::{Device, DeviceBuffer, Runtime};

#[allow(clippy::too_many_arguments)]
pub fn check_dispatch(
    ep: &IntranodeEp,
    rt: &dyn Runtime,
    local: &[(usize, Device)],
    orc: &[OracleRecv],
    a: &Args,
    idx_size: usize,
    counts: &[usize],
) -> AnyResult<()> {
    let cfg = ep.config();
    for (li, &(r, _)) in local.iter().enumerate() {
        let o = &orc[r];
        let n = counts[li];
        if n != o.src.len() {
            return Err(err(format!("rank {r} received {n} tokens, the oracle {}", o.src.len())));
        }
        let sl = ep.recv_slices(r, n, a.dtype.size(), idx_size)?;
        let mut got: Vec<Vec<u8>> = Vec::new();
        for s in &sl {
            let mut b = vec![0u8; s.len()];
            if !b.is_empty() {
                rt.copy_dtoh(&mut b, s)?;
            }
            got.push(b);
        }
        let src: Vec<usize> = got[4].chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| src[i]);
        let row = [a.hidden * a.dtype.size(), cfg.top_k * 4, cfg.top_k * idx_size, cfg.scale_dim * cfg.scale_type_size];
        let want = [&o.x, &o.w, &o.idx, &o.scales];
        let names = ["rows", "weights", "indices", "scales"];
        for (j, &gi) in order.iter().enumerate() {
            let sp = o.src[j];
            if src[gi] != sp.flat(cfg.max_tokens_per_rank) {
                return Err(err(format!("rank {r}: received source #{j} is {} , oracle {:?}", src[gi], sp)));
            }
            for k in 0..4 {
                let rb = row[k];
                if got[k][gi * rb..(gi + 1) * rb] != want[k][j * rb..(j + 1) * rb] {
                    return Err(err(format!("rank {r}: {} of token {:?} (slot {gi}) differ", names[k], sp)));
                }
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn check_combine(
    a: &Args,
    cfg: &EpConfig,
    inp: &Inputs,
    orc: &[OracleRecv],
    handle: &DispatchHandle,
    rt: &dyn Runtime,
    local: &[(usize, Device)],
    outs: &[(&DeviceBuffer, &DeviceBuffer)],
) -> AnyResult<()> {
    // Oracle combine over canonical order (the rows depend on the source only).
    let xs: Vec<Tensor2<f32>> =
        orc.iter().map(|o| Tensor2::from_fn(o.src.len(), a.hidden, |i, h| comb_value(o.src[i], h))).collect::<Result<_, _>>()?;
    let ws: Vec<Tensor2<f32>> = orc
        .iter()
        .map(|o| {
            let v: Vec<f32> = o.w.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            Tensor2::new(o.src.len(), cfg.top_k, v)
        })
        .collect::<Result<_, _>>()?;
    let opts = CombineOptions { weighting: if a.weighted { Weighting::RankSlotSum } else { Weighting::Unweighted }, ..Default::default() };
    // The kernels round each product before adding it, as the reference does, so weighted sums
    // are expected bit-exact too; accepted within 1e-2 relative, and said which.
    let tol = if a.weighted { 1e-2f32 } else { 0.0 };
    let exact = std::cell::Cell::new(true);
    let close = |g: f32, w: f32| {
        let same = g.to_bits() == w.to_bits() || g == w;
        exact.set(exact.get() && same);
        if tol == 0.0 {
            same
        } else {
            (g - w).abs() <= tol * w.abs().max(1.0)
        }
    };
    let r = match a.combine_dtype {
        CombDType::Bf16 => {
            let xb: Vec<Tensor2<bf16>> = xs.iter().map(|t| t.map(|&v| bf16::from_f32(v))).collect();
            let want = combine::<bf16, bf16, i64>(cfg, handle, &xb, Some(&ws), &inp.idx, opts)?;
            compare_out(rt, local, outs, &want.iter().map(|c| (c.x.map(|v| v.to_f32()), c.weights.clone())).collect::<Vec<_>>(), 2, &close)
        }
        CombDType::F32 => {
            let want = combine::<f32, f32, i64>(cfg, handle, &xs, Some(&ws), &inp.idx, opts)?;
            compare_out(rt, local, outs, &want.iter().map(|c| (c.x.clone(), c.weights.clone())).collect::<Vec<_>>(), 4, &close)
        }
    };
    if a.weighted && r.is_ok() {
        println!("check: weighted combine {}", if exact.get() { "bit-exact" } else { "within 1e-2 relative, not bit-exact" });
    }
    r
}

type WantOut = (Tensor2<f32>, Option<Tensor2<f32>>);

fn compare_out(
    rt: &dyn Runtime,
    local: &[(usize, Device)],
    outs: &[(&DeviceBuffer, &DeviceBuffer)],
    want: &[WantOut],
    elem: usize,
    close: &dyn Fn(f32, f32) -> bool,
) -> AnyResult<()> {
    for (li, &(r, _)) in local.iter().enumerate() {
        let (wx, ww) = &want[r];
        let n = wx.as_slice().len();
        let mut b = vec![0u8; n * elem];
        if n > 0 {
            rt.copy_dtoh(&mut b, &outs[li].0.sub(0, n * elem)?)?;
        }
        for (i, &w) in wx.as_slice().iter().enumerate() {
            let g = if elem == 2 {
                bf16::from_bits(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).to_f32()
            } else {
                f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            };
            if !close(g, w) {
                let h = wx.cols().max(1);
                return Err(err(format!("rank {r} token {} column {}: combine gave {g}, oracle {w}", i / h, i % h)));
            }
        }
        if let Some(ww) = ww {
            let m = ww.as_slice().len();
            let mut b = vec![0u8; m * 4];
            if m > 0 {
                rt.copy_dtoh(&mut b, &outs[li].1.sub(0, m * 4)?)?;
            }
            for (i, &w) in ww.as_slice().iter().enumerate() {
                let g = f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
                if (g - w).abs() > 1e-4 * w.abs().max(1.0) {
                    return Err(err(format!("rank {r} weight entry {i}: combine gave {g}, oracle {w}")));
                }
            }
        }
    }
    Ok(())
}
