//! [`InterNodeGpu`]'s device-resident calls, in the style of `IntranodeEp`: the inputs are GPU
//! memory of the caller's, the received records stay in each rank's window and the combine
//! input goes where the kernels read it, so only the status words and per-source counts
//! cross to the host. [`InterNodeGpu::dispatch`] / [`InterNodeGpu::combine`] (host bytes in and
//! out) are the same kernels with the host's copies around them.
//!
//! One `InterNodeGpu` drives every rank of the job in this process on one GPU (the nodes as
//! groups of ranks), so each call takes one entry per rank of the whole job. A caller's
//! sequence per layer: [`InterNodeGpu::dispatch_device`] (returns where every rank's records
//! lie, [`DeviceRecv`], and the [`DeviceTicket`]); the experts read the records and write
//! their output rows, in the received order, at [`InterNodeGpu::combine_input`];
//! [`InterNodeGpu::combine_device`] returns where each rank's combined rows lie. The records
//! stay where they are until the next dispatch (a combine does not touch them); the combined
//! rows until the next combine.

use super::host_api::{read_records, recv_counts};
use super::{bad, InterNodeGpu};
use crate::gpu::GpuResult;
use crate::gpu_internode::{InterTicket, RecvBytes};

use mori_gpu::DeviceSlice;
use std::marker::PhantomData;

/// One rank's dispatch inputs in GPU memory of the object's device, laid out as
/// [`crate::gpu_internode::RankBytes`] describes the host form.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRankInputs<'a> {
    /// T, at most `max_tokens_per_rank`.
    pub tokens: usize,
    /// `[T, hidden]` rows of `elem` bytes per element.
    pub x: DeviceSlice<'a>,
    /// `[T, top_k]` f32 weights.
    pub weights: DeviceSlice<'a>,
    /// `[T, top_k]` expert ids of `idx_size` bytes (-1: none). Read again by a weighted
    /// combine, so the [`DeviceTicket`] borrows them: do not overwrite them on the GPU before
    /// the combine either.
    pub idx: DeviceSlice<'a>,
    /// `[T, scale_dim]` scales of `scale_type_size` bytes; `None` exactly when the
    /// configuration has none.
    pub scales: Option<DeviceSlice<'a>>,
}

/// What [`InterNodeGpu::dispatch_device`] hands back for its combine: consumed by
/// [`InterNodeGpu::combine_device`]. It borrows the dispatch inputs (a weighted combine reads
/// their expert ids on the GPU), so they outlive the combine.
#[derive(Debug)]
pub struct DeviceTicket<'a> {
    pub(super) inner: InterTicket,
    pub(super) _inputs: PhantomData<&'a ()>,
}

/// Where a rank's received records lie after [`InterNodeGpu::dispatch_device`]: in its window
/// (device addresses, valid until the next dispatch of the object). Source `s`'s
/// `counts[s]` records start at `base + s * seg_stride`, one every `rec_bytes`; a record is the
/// x row (`row_bytes`), `top_k` f32 weights, `top_k` ids of `idx_size` bytes, `scale_bytes` of
/// scales and the i32 flat source token (`s * max_tokens + t`), at the offsets below (V1 and
/// V1-LL records carry their routing words after the source). The
/// received order (the combine input's, and the host reference's) is source ascending, then
/// each source's token order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRecv {
    /// Device address of source 0's segment.
    pub base: u64,
    /// Bytes from one source's segment to the next.
    pub seg_stride: u64,
    /// Bytes per record (16-aligned).
    pub rec_bytes: usize,
    /// Records per source, `[world]`.
    pub counts: Vec<u32>,
    /// Byte offsets inside a record: x, weights, ids, scales, source.
    pub offsets: [usize; 5],
}

impl DeviceRecv {
    /// Records received in all.
    pub fn total(&self) -> usize {
        self.counts.iter().map(|&c| c as usize).sum()
    }

    /// Device address of source `s`'s `q`-th record, or `None` past its count (or when the
    /// address would overflow).
    pub fn record(&self, s: usize, q: usize) -> Option<u64> {
        if q >= *self.counts.get(s)? as usize {
            return None;
        }
        let seg = (s as u64).checked_mul(self.seg_stride)?;
        let rec = (q as u64).checked_mul(self.rec_bytes as u64)?;
        self.base.checked_add(seg)?.checked_add(rec)
    }

    /// The received-order index of source `s`'s `q`-th record (its row of the combine input),
    /// or `None` past its count.
    pub fn row_of(&self, s: usize, q: usize) -> Option<usize> {
        if q >= *self.counts.get(s)? as usize {
            return None;
        }
        self.counts[..s].iter().try_fold(q, |acc, &c| acc.checked_add(c as usize))
    }
}

/// Where a rank's combine input goes (device addresses): row `i` (received order) is `hidden`
/// elements of `comb_elem` bytes at `x + i * x_stride`, its `top_k` f32 weights at
/// `w + i * w_stride`. The caller writes both for every row (zeros for weights it has none
/// of): the object keeps whatever was written last, and the weights are summed into the
/// combine's weight output. Over xgmi
/// ([`InterNodeGpu::combine_in_window`]) both lie interleaved in the window, one row of
/// `comb_bytes` each; otherwise in two buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CombineInputBuf {
    /// Device address of row 0's elements.
    pub x: u64,
    /// Bytes from one row's elements to the next.
    pub x_stride: usize,
    /// Device address of row 0's weights.
    pub w: u64,
    /// Bytes from one row's weights to the next.
    pub w_stride: usize,
    /// Rows it holds.
    pub rows: usize,
}

/// Where a rank's combined output lies after [`InterNodeGpu::combine_device`] (device
/// addresses, valid until the next combine): `[tokens, hidden]` rows of `out_elem` bytes per
/// element at `x`, `[tokens, top_k]` f32 weight sums at `weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCombined {
    /// The rank's token count in the dispatch.
    pub tokens: usize,
    /// Device address of the combined rows.
    pub x: u64,
    /// Device address of the weight sums.
    pub weights: u64,
}

impl InterNodeGpu {
    /// Dispatches every rank's tokens from GPU memory (`inputs[r]` for rank r) and returns, per
    /// rank, where its received records lie in its window ([`DeviceRecv`]), with the ticket
    /// [`InterNodeGpu::combine_device`] takes. Nothing of the payload crosses to the host: it
    /// reads back the status words and each rank's per-source counts. Returns once the kernels
    /// ran.
    ///
    /// Errors: `InvalidConfig` for a wrong number of inputs, a token count above the maximum,
    /// a buffer shorter than its shape or on another device, scales given without the
    /// configuration's (or missing), or an object whose records do not stay in the window
    /// (`InterNodeOptions::recv_in_window` off: use [`InterNodeGpu::dispatch`]) — all before
    /// anything runs. Expert ids are checked on the GPU, not here: an id out of range (unless
    /// dropped) faults the kernels, and as with every kernel fault the error names the rank,
    /// token and slot, comes after the other ranks' deadline, and leaves the object unusable.
    ///
    /// Ordering: the kernels run on the object's own streams and wait for nothing of the
    /// caller's, so the inputs must be complete (the caller's stream that wrote them
    /// synchronized) before the call. After an error that got past the checks, the call
    /// returns only once the kernels stopped (each ends by its in-kernel deadline), so the
    /// caller may free the inputs then.
    pub fn dispatch_device<'a>(&mut self, inputs: &[DeviceRankInputs<'a>]) -> GpuResult<(Vec<DeviceRecv>, DeviceTicket<'a>)> {
        self.usable()?;
        self.check_device_inputs(inputs)?;
        let r = self.dispatch_device_inner(inputs);
        if r.is_err() {
            self.settle();
        }
        let (recv, inner) = self.poison_on(r)?;
        Ok((recv, DeviceTicket { inner, _inputs: PhantomData }))
    }

    /// Where rank `rank`'s combine input goes ([`CombineInputBuf`]). Errors: `InvalidConfig`
    /// for a rank out of range.
    pub fn combine_input(&self, rank: usize) -> GpuResult<CombineInputBuf> {
        self.rank_in_range(rank)?;
        let (l, gr) = (&self.layout, &self.ranks[rank]);
        let xb = l.hidden * l.comb_elem;
        Ok(if self.in_window {
            let x = gr.win.dev_ptr() + l.lay.out_comb;
            CombineInputBuf { x, x_stride: l.comb_bytes, w: x + xb as u64, w_stride: l.comb_bytes, rows: l.world * l.max_tokens }
        } else {
            let rows = (gr.comb[0].len() / xb).min(gr.comb[1].len() / (l.top_k * 4).max(1));
            CombineInputBuf { x: gr.comb[0].ptr(), x_stride: xb, w: gr.comb[1].ptr(), w_stride: l.top_k * 4, rows }
        })
    }

    /// Combines the dispatch of `ticket` from the rows each rank's experts wrote at
    /// [`InterNodeGpu::combine_input`] (`rows[r]` rows for rank r, at least what it received:
    /// the kernels read the received ones, the first `DeviceRecv::total()`; more is allowed,
    /// up to the input's capacity, and is ignored);
    /// returns where each rank's combined rows lie ([`DeviceCombined`]). Returns once the
    /// kernels ran.
    ///
    /// Errors: a ticket of another object or of a superseded dispatch; a wrong number of row
    /// counts, or a rank given fewer rows than it received or more than its input holds
    /// (`InvalidConfig` naming the rank and both counts, before anything runs: the object
    /// stays usable for the next dispatch; the ticket is spent); kernel faults naming the rank.
    ///
    /// Ordering as [`InterNodeGpu::dispatch_device`]: the rows must be complete before the
    /// call; after a kernel fault it returns once the kernels stopped.
    pub fn combine_device(&mut self, ticket: DeviceTicket<'_>, rows: &[usize]) -> GpuResult<Vec<DeviceCombined>> {
        self.usable()?;
        self.check_ticket(&ticket.inner)?;
        self.check_combine_rows(rows)?;
        let r = self.combine_device_inner(rows);
        match &r {
            Ok(_) => self.dispatched = None,
            Err(_) => self.settle(),
        }
        self.poison_on(r)
    }

    /// Rank `rank`'s records of the last dispatch, read to the host from its window, as
    /// [`InterNodeGpu::dispatch`] returns them (for checks and tools: it copies the payload).
    /// Errors: a rank out of range; an object whose records do not stay in the window.
    pub fn read_recv(&mut self, rank: usize) -> GpuResult<RecvBytes> {
        self.usable()?;
        self.rank_in_range(rank)?;
        if !self.opts.recv_in_window {
            return Err(bad("recv_in_window", false, "the records are read from the window: this object copies them out (use dispatch)"));
        }
        let n = self.ranks[rank].recv;
        let l = self.layout.clone();
        read_records(self.rt.as_ref(), &l, &mut self.ranks[rank], n)
    }

    /// Writes host rows into rank `rank`'s combine input ([`InterNodeGpu::combine_input`]):
    /// `x` `[N, hidden]` of `comb_elem` bytes per element, `w` `[N, top_k]` f32 or empty
    /// (zeros). For tools and tests of the device calls. Errors: a rank out of range, rows
    /// past the input's capacity or weights of another row count.
    pub fn write_combine_input(&mut self, rank: usize, x: &[u8], w: &[u8]) -> GpuResult<()> {
        let buf = self.combine_input(rank)?;
        let l = &self.layout;
        let xb = l.hidden * l.comb_elem;
        let n = x.len() / xb;
        if !x.len().is_multiple_of(xb) || n > buf.rows || (!w.is_empty() && w.len() != n * l.top_k * 4) {
            return Err(bad(
                "combine input",
                format!("rank {rank}: {} bytes of rows, {} of weights", x.len(), w.len()),
                format!("whole rows of {xb} B, at most {}, and {} f32 weights per row (or none)", buf.rows, l.top_k),
            ));
        }
        let gr = &mut self.ranks[rank];
        if self.in_window {
            // The host interleaves the rows (a caller whose expert output is on the GPU writes
            // them there directly: [`InterNodeGpu::combine_input`]).
            if n > 0 {
                let rows = l.combine_rows(x, w);
                gr.win.write(self.rt.as_ref(), l.lay.out_comb as usize, &rows)?;
            }
            return Ok(());
        }
        if !x.is_empty() {
            self.rt.copy_htod(&gr.comb[0].sub(0, x.len())?, x)?;
        }
        if !w.is_empty() {
            self.rt.copy_htod(&gr.comb[1].sub(0, w.len())?, w)?;
        } else {
            self.rt.memset(&gr.comb[1].slice(), 0)?;
        }
        Ok(())
    }

    /// Rank `rank`'s combined rows and weight sums of the last combine, read to the host (as
    /// [`InterNodeGpu::combine`] returns them). For checks and tools. Errors: a rank out of
    /// range.
    pub fn read_combined(&self, rank: usize) -> GpuResult<(Vec<u8>, Vec<u8>)> {
        self.rank_in_range(rank)?;
        let (l, gr) = (&self.layout, &self.ranks[rank]);
        let mut ox = vec![0u8; gr.tokens * l.hidden * self.out_elem];
        let mut ow = vec![0u8; gr.tokens * l.top_k * 4];
        let (nx, nw) = (ox.len(), ow.len());
        if nx > 0 {
            self.rt.copy_dtoh(&mut ox, &gr.comb[2].sub(0, nx)?)?;
            self.rt.copy_dtoh(&mut ow, &gr.comb[3].sub(0, nw)?)?;
        }
        Ok((ox, ow))
    }
}

impl InterNodeGpu {
    /// Waits for every stream of the object (its kernels end by their in-kernel deadlines):
    /// after a failed device call, so that the caller's buffers are no longer read.
    fn settle(&self) {
        for s in &self.streams {
            let _ = s.synchronize();
        }
    }

    fn rank_in_range(&self, rank: usize) -> GpuResult<()> {
        if rank >= self.layout.world {
            return Err(bad("rank", rank, format!("below the world size {}", self.layout.world)));
        }
        Ok(())
    }

    /// [`InterNodeGpu::dispatch_device`]'s checks, before anything runs.
    fn check_device_inputs(&self, inputs: &[DeviceRankInputs<'_>]) -> GpuResult<()> {
        let l = &self.layout;
        if !self.opts.recv_in_window {
            return Err(bad(
                "recv_in_window",
                false,
                "the device calls leave the received records in the window: use dispatch (host bytes) with the copy-out",
            ));
        }
        if inputs.len() != l.world {
            return Err(bad("device inputs", inputs.len(), format!("one per rank: {}", l.world)));
        }
        let dev = self.ranks[0].dev_ctr.device();
        for (r, i) in inputs.iter().enumerate() {
            let t = i.tokens;
            if t > l.max_tokens {
                return Err(bad("device inputs", format!("rank {r}: {t} tokens"), format!("at most {}", l.max_tokens)));
            }
            if i.scales.is_some() != (l.scale_bytes > 0) {
                return Err(bad(
                    "device inputs",
                    format!("rank {r}: scales {}", if i.scales.is_some() { "given" } else { "missing" }),
                    format!("scales exactly when the configuration has them ({} bytes per token)", l.scale_bytes),
                ));
            }
            let need = [
                ("x", Some(&i.x), t * l.row_bytes),
                ("weights", Some(&i.weights), t * l.top_k * 4),
                ("idx", Some(&i.idx), t * l.top_k * l.idx_size),
                ("scales", i.scales.as_ref(), t * l.scale_bytes),
            ];
            for (what, sl, n) in need {
                let Some(sl) = sl else { continue };
                if sl.len() < n {
                    return Err(bad(
                        "device inputs",
                        format!("rank {r}: {what} of {} bytes", sl.len()),
                        format!("{n} bytes for {t} tokens"),
                    ));
                }
                if sl.device() != dev {
                    return Err(bad("device inputs", format!("rank {r}: {what} on {}", sl.device()), format!("on this object's {dev}")));
                }
            }
        }
        Ok(())
    }

    /// `dispatch_device` after its checks.
    fn dispatch_device_inner(&mut self, inputs: &[DeviceRankInputs<'_>]) -> GpuResult<(Vec<DeviceRecv>, InterTicket)> {
        for (gr, i) in self.ranks.iter_mut().zip(inputs) {
            gr.tokens = i.tokens;
            gr.ext_inp = Some([i.x.ptr(), i.weights.ptr(), i.idx.ptr(), i.scales.map_or(0, |s| s.ptr())]);
        }
        let counts = self.run_dispatch()?;
        let l = self.layout.clone();
        let mut offsets = [0usize; 5];
        for (i, len) in l.record_fields().into_iter().enumerate().take(4) {
            offsets[i + 1] = offsets[i] + len;
        }
        let mut out = Vec::with_capacity(l.world);
        for (gr, &n) in self.ranks.iter_mut().zip(&counts) {
            gr.comb_rows = 0;
            gr.recv = n as usize;
            let cnt = recv_counts(self.rt.as_ref(), &l, gr)?;
            out.push(DeviceRecv {
                base: gr.win.dev_ptr() + l.lay.disp_in,
                seg_stride: l.lay.seg_rec,
                rec_bytes: l.rec_bytes,
                counts: cnt,
                offsets,
            });
        }
        self.dispatched = Some(self.calls);
        Ok((out, InterTicket { seq: self.calls, owner: self.id }))
    }

    /// [`InterNodeGpu::combine_device`]'s row counts: one per rank, each at least what the rank
    /// received and at most what its input holds.
    fn check_combine_rows(&self, rows: &[usize]) -> GpuResult<()> {
        if rows.len() != self.layout.world {
            return Err(bad("combine rows", rows.len(), format!("one count per rank: {}", self.layout.world)));
        }
        for (r, &n) in rows.iter().enumerate() {
            let cap = self.combine_input(r)?.rows;
            if n > cap {
                return Err(bad("combine rows", format!("rank {r}: {n}"), format!("its combine input holds {cap} rows")));
            }
        }
        self.check_received(rows)
    }

    /// `combine_device` after its checks.
    fn combine_device_inner(&mut self, rows: &[usize]) -> GpuResult<Vec<DeviceCombined>> {
        for (gr, &n) in self.ranks.iter_mut().zip(rows) {
            gr.comb_rows = n;
        }
        self.run_combine()?;
        Ok(self.ranks.iter().map(|gr| DeviceCombined { tokens: gr.tokens, x: gr.comb[2].ptr(), weights: gr.comb[3].ptr() }).collect())
    }
}
