//! `bench_dispatch_combine --device-api`: the inputs of `InterNodeGpu::dispatch_device` in
//! device buffers of the bench's.
use crate::args::{err, AnyResult};
use mori_ep::gpu_internode::{DeviceRankInputs, RankBytes};
use mori_gpu::{Device, DeviceBuffer, Runtime};
use std::sync::Arc;

/// `--device-api`: each rank's inputs (x, weights, ids, scales) copied into device buffers of
/// their own (at least one byte each).
pub fn upload_inputs(rt: &Arc<dyn Runtime>, rb: &[RankBytes<'_>]) -> AnyResult<Vec<[DeviceBuffer; 4]>> {
    let mut out = Vec::with_capacity(rb.len());
    for r in rb {
        let mut bufs = Vec::with_capacity(4);
        for b in [r.x, r.weights, r.idx, r.scales] {
            let d = rt.alloc(Device(0), b.len().max(1))?;
            if !b.is_empty() {
                rt.copy_htod(&d.sub(0, b.len())?, b)?;
            }
            bufs.push(d);
        }
        out.push(bufs.try_into().map_err(|_| err("four input buffers per rank"))?);
    }
    Ok(out)
}

/// The device inputs over `bufs` (`upload_inputs`'), shaped as `rb`; scales when the
/// configuration has them (`scales`).
pub fn device_inputs<'a>(rb: &[RankBytes<'_>], bufs: &'a [[DeviceBuffer; 4]], scales: bool) -> AnyResult<Vec<DeviceRankInputs<'a>>> {
    rb.iter()
        .zip(bufs)
        .map(|(r, b)| {
            Ok(DeviceRankInputs {
                tokens: r.tokens,
                x: b[0].sub(0, r.x.len())?,
                weights: b[1].sub(0, r.weights.len())?,
                idx: b[2].sub(0, r.idx.len())?,
                scales: if scales { Some(b[3].sub(0, r.scales.len())?) } else { None },
            })
        })
        .collect()
}
