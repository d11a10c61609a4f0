//! [`InterNodeGpu`]'s side of the kernel ABI: the parameters of a node's launches, the per-rank
//! structs it uploads, and the status words it reads back.

use super::super::abi::{scheme_flags, IeLayout, IeParams, IeRank, FLAG_COMB_ROWS, FLAG_RECV_WIN, FLAG_WEIGHTED};
use super::super::MAX_WORLD;
use super::InterNodeGpu;
use crate::error::EpError;
use crate::gpu::{EpGpuError, GpuResult};

/// Bytes of a rank's status words (the kernels use the first 32).
pub(super) const STATUS_BYTES: usize = 64;

impl InterNodeGpu {
    pub(super) fn params(&self, node: usize) -> IeParams {
        let (w, g) = (self.layout.world, self.layout.gpn);
        let mut win = [0u64; MAX_WORLD];
        let mut dev_ctr = [0u64; MAX_WORLD];
        for r in node * g..(node + 1) * g {
            win[r] = self.ranks[r].win.dev_ptr();
            dev_ctr[r] = self.ranks[r].dev_ctr.ptr();
        }
        let l = &self.layout;
        IeParams {
            win,
            dev_ctr,
            lay: IeLayout { ..l.lay },
            ranks: self.abi[node].ptr(),
            timeout_ns: u64::try_from(self.opts.timeout.as_nanos()).unwrap_or(u64::MAX),
            num_local: g as u32,
            world: w as u32,
            gpn: g as u32,
            blocks_per_rank: self.opts.blocks_per_rank,
            row_bytes: l.row_bytes as u32,
            hidden: l.hidden as u32,
            top_k: l.top_k as u32,
            idx_size: l.idx_size as u32,
            scale_bytes: l.scale_bytes as u32,
            experts_per_rank: self.experts_per_rank as u32,
            max_tokens: l.max_tokens as u32,
            max_recv: l.max_recv as u32,
            rec_bytes: l.rec_bytes as u32,
            comb_bytes: l.comb_bytes as u32,
            comb_elem: l.comb_elem as u32,
            out_elem: self.out_elem as u32,
            flags: if self.opts.weighted { FLAG_WEIGHTED } else { 0 }
                | scheme_flags(l.scheme)
                | if self.in_window { FLAG_COMB_ROWS } else { 0 }
                | if self.opts.recv_in_window { FLAG_RECV_WIN } else { 0 },
            trace_blocks: if self.opts.trace { self.opts.trace_blocks() } else { 0 },
            part_bytes: l.part_bytes as u32,
        }
    }

    /// Uploads every node's per-rank structs; with `reset_status` (before a dispatch) also
    /// zeroes the ranks' status words, which follow the structs in the same buffer (one copy
    /// per node; the kernels only set them, first fault wins).
    pub(super) fn upload_abi(&self, reset_status: bool) -> GpuResult<()> {
        let g = self.layout.gpn;
        for (node, buf) in self.abi.iter().enumerate() {
            let mut bytes = Vec::with_capacity(g * (std::mem::size_of::<IeRank>() + STATUS_BYTES));
            for r in node * g..(node + 1) * g {
                let gr = &self.ranks[r];
                let s = &gr.scratch;
                // A device dispatch's inputs are the caller's buffers.
                let inp = gr.ext_inp.unwrap_or([
                    gr.inp[0].ptr(),
                    gr.inp[1].ptr(),
                    gr.inp[2].ptr(),
                    if self.layout.scale_bytes > 0 { gr.inp[3].ptr() } else { 0 },
                ]);
                let a = IeRank {
                    rank: r as u32,
                    num_tokens: gr.tokens as u32,
                    comb_rows: gr.comb_rows as u32,
                    pad: 0,
                    x: inp[0],
                    weights: inp[1],
                    idx: inp[2],
                    scales: inp[3],
                    mask: s[0].ptr(),
                    pre: s[1].ptr(),
                    npre: s[7].ptr(),
                    cnt: s[2].ptr(),
                    recv_cnt: s[3].ptr(),
                    recv_base: s[4].ptr(),
                    done: s[5].ptr(),
                    out_x: gr.out[0].ptr(),
                    out_w: gr.out[1].ptr(),
                    out_idx: gr.out[2].ptr(),
                    out_scales: if self.layout.scale_bytes > 0 { gr.out[3].ptr() } else { 0 },
                    out_src: gr.out[4].ptr(),
                    comb_x: if self.in_window { gr.win.dev_ptr() + self.layout.lay.out_comb } else { gr.comb[0].ptr() },
                    comb_w: if self.in_window { 0 } else { gr.comb[1].ptr() },
                    comb_out: gr.comb[2].ptr(),
                    comb_out_w: gr.comb[3].ptr(),
                    status: self.status_ptr(r),
                    trace: if self.opts.trace { s[6].ptr() } else { 0 },
                    ring: gr.ring.dev_args()?,
                };
                // SAFETY: IeRank is plain old data (integers), read as its bytes.
                bytes.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(&a as *const IeRank as *const u8, std::mem::size_of::<IeRank>())
                });
            }
            if reset_status {
                bytes.resize(g * (std::mem::size_of::<IeRank>() + STATUS_BYTES), 0);
            }
            self.rt.copy_htod(&buf.sub(0, bytes.len())?, &bytes)?;
        }
        Ok(())
    }

    /// Device address of rank `r`'s status words: after its node's structs in the node's
    /// per-rank buffer.
    fn status_ptr(&self, r: usize) -> u64 {
        let g = self.layout.gpn;
        self.abi[r / g].ptr() + (g * std::mem::size_of::<IeRank>() + (r % g) * STATUS_BYTES) as u64
    }

    /// The status words of every rank: a fault becomes `Kernel { rank, what }`.
    /// When several ranks failed, the error names a rank whose fault is not a deadline (the
    /// cause; the others then waited for it), else the first, and counts the others.
    pub(super) fn check_status(&self, phase: &str) -> GpuResult<Vec<u32>> {
        let mut counts = Vec::with_capacity(self.ranks.len());
        let mut faults: Vec<(usize, u32, String)> = Vec::new();
        let g = self.layout.gpn;
        let mut words = vec![0u8; g * STATUS_BYTES];
        for r in 0..self.ranks.len() {
            if r % g == 0 {
                self.rt.copy_dtoh(&mut words, &self.abi[r / g].sub(g * std::mem::size_of::<IeRank>(), g * STATUS_BYTES)?)?;
            }
            let b = &words[(r % g) * STATUS_BYTES..(r % g + 1) * STATUS_BYTES];
            let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
            let what = match w(1) {
                0 => None,
                1 => Some(format!("{phase}: expert id {} out of range (token {}, slot {})", w(4) as i32, w(2), w(3))),
                3 if w(2) == 3 => Some(format!(
                    "{phase}: deadline: as the relay, rank {r} never got the rows of local rank {} for node {} ({} entries arrived)",
                    w(3) as usize % self.layout.gpn,
                    w(3) as usize / self.layout.gpn,
                    w(4)
                )),
                3 => Some(format!(
                    "{phase}: deadline: rank {} never completed its segment ({} entries arrived) in the {} phase",
                    w(3),
                    w(4),
                    if w(2) == 1 { "dispatch" } else { "combine" }
                )),
                4 => Some(format!("{phase}: {} records announced, capacity {}", w(2), w(3))),
                5 => Some(format!("{phase}: the combine input holds {} rows, {} were received", w(2), w(3))),
                6 => Some(format!("{phase}: the proxy's command ring stayed full (destination rank {})", w(2))),
                9 => Some(format!(
                    "{phase}: the relay segment from rank {} is malformed: {} records announced, more than it holds, or a header disagreeing with that count or naming more than {} per destination",
                    w(2),
                    w(3),
                    self.layout.max_tokens
                )),
                10 => Some(format!("{phase}: rank {}'s segment announced {} entries, more than a segment holds ({})", w(2), w(3), w(4))),
                8 => Some(format!(
                    "{phase}: the relay segment from rank {} is out of bounds at record {} (destination rank {})",
                    w(2),
                    w(3),
                    w(4)
                )),
                c => Some(format!("{phase}: fault code {c}")),
            };
            if let Some(what) = what {
                let proxy = self.proxies[r].failure().map(|f| format!("; proxy: {f}")).unwrap_or_default();
                faults.push((r, w(1), what + &proxy));
            }
            counts.push(w(0));
        }
        let n = faults.len();
        let cause = faults.iter().position(|f| f.1 != 3).unwrap_or(0);
        match faults.into_iter().nth(cause) {
            None => Ok(counts),
            Some((rank, _, what)) => {
                let others = if n > 1 { format!(" ({} other rank(s) failed too)", n - 1) } else { String::new() };
                Err(EpGpuError::Kernel { rank, what: what + &others })
            }
        }
    }
}

/// Checks rank `rank`'s `[T, top_k]` expert ids (`idx_size` bytes each, little-endian): each
/// -1 or in `[0, num_experts)`. Errors: `ExpertOutOfRange` naming the token and slot.
pub(super) fn check_ids(idx: &[u8], idx_size: usize, top_k: usize, num_experts: usize, rank: usize) -> GpuResult<()> {
    for (j, c) in idx.chunks_exact(idx_size).enumerate() {
        let id = if idx_size == 8 {
            i64::from_le_bytes(c.try_into().unwrap_or_default())
        } else {
            i64::from(i32::from_le_bytes(c.try_into().unwrap_or_default()))
        };
        if id < -1 || id >= num_experts as i64 {
            return Err(EpGpuError::Ep(EpError::ExpertOutOfRange { rank, token: j / top_k, slot: j % top_k, expert: id, num_experts }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_ids_are_checked_before_any_kernel_runs() {
        let ids64: Vec<u8> = [3i64, -1, 15, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(check_ids(&ids64, 8, 2, 16, 0).is_ok());
        let bad: Vec<u8> = [3i64, -1, 16, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let e = check_ids(&bad, 8, 2, 16, 5).unwrap_err().to_string();
        assert!(e.contains("rank 5, token 1, slot 0: expert id 16 is out of range [0, 16)"), "{e}");
        let bad32: Vec<u8> = [0i32, -2].iter().flat_map(|v| v.to_le_bytes()).collect();
        let e = check_ids(&bad32, 4, 2, 16, 1).unwrap_err().to_string();
        assert!(e.contains("token 0, slot 1: expert id -2"), "{e}");
    }
}
