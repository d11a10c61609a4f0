//! [`IntranodeEp`]'s operations: dispatch, combine, the status words and the trace stamps.

use super::*;

impl IntranodeEp {
    /// Queues a dispatch of every local rank's tokens (`inputs[i]` for `local_ranks()[i]`) on
    /// `streams` (one per entry of [`IntranodeEp::devices`]). Every process must call it.
    /// Read the outcome with [`IntranodeEp::sync_status`] after the streams ran it.
    ///
    /// Returns the [`DispatchTicket`] that [`IntranodeEp::combine`] takes: it borrows the
    /// inputs' expert ids (weighted combine reads them on the GPU), so they cannot be freed
    /// before the combine is queued.
    ///
    /// Errors: [`EpError::InvalidConfig`] / [`EpError::TooManyTokens`] for a wrong number of
    /// inputs, element sizes, token counts above `max_tokens_per_rank`, or buffers shorter than
    /// their shape (each names the input); GPU errors.
    pub fn dispatch<'a>(&mut self, inputs: &[DispatchInput<'a>], spec: DispatchSpec, streams: &[&Stream]) -> GpuResult<DispatchTicket<'a>> {
        self.check_stream(streams)?;
        let c = self.cfg.clone();
        if inputs.len() != self.local.len() {
            return Err(bad("dispatch inputs", inputs.len(), format!("one per local rank ({})", self.local.len())));
        }
        if ![1, 2, 4].contains(&spec.elem_size) || spec.elem_size > c.max_token_type_size {
            return Err(bad(
                "elem_size",
                spec.elem_size,
                format!("must be 1, 2 or 4 and at most max_token_type_size = {}", c.max_token_type_size),
            ));
        }
        if ![4, 8].contains(&spec.idx_size) {
            return Err(bad("idx_size", spec.idx_size, "must be 4 (i32) or 8 (i64)"));
        }
        let row_bytes = c.hidden * spec.elem_size;
        if !row_bytes.is_multiple_of(16) {
            return Err(EpError::HiddenBytesNotAligned { what: "x", hidden: c.hidden, elem_size: spec.elem_size, bytes: row_bytes }.into());
        }
        for (i, inp) in inputs.iter().enumerate() {
            let rank = self.local[i].rank;
            let t = inp.num_tokens;
            if t > c.max_tokens_per_rank {
                return Err(EpError::TooManyTokens { rank, tokens: t, limit: c.max_tokens_per_rank }.into());
            }
            need("x", rank, inp.x.len(), t * row_bytes)?;
            need("indices", rank, inp.indices.len(), t * c.top_k * spec.idx_size)?;
            if let Some(w) = &inp.weights {
                need("weights", rank, w.len(), t * c.top_k * 4)?;
            }
            match (&inp.scales, c.scale_dim) {
                (Some(s), d) if d > 0 => need("scales", rank, s.len(), t * d * c.scale_type_size)?,
                (None, 0) => {}
                (given, d) => return Err(EpError::ScalesPresence { rank, scale_dim: d, given: given.is_some() }.into()),
            }
            for (what, s) in
                [("x", Some(&inp.x)), ("indices", Some(&inp.indices)), ("weights", inp.weights.as_ref()), ("scales", inp.scales.as_ref())]
            {
                if let Some(s) = s {
                    if s.device() != self.local[i].device {
                        return Err(bad(what, s.device(), format!("rank {rank}'s input must live on its {}", self.local[i].device)));
                    }
                }
            }
        }
        self.dispatch_seq = next_seq(self.dispatch_seq);
        self.last_idx_size = spec.idx_size;
        let rt = self.heap.runtime().clone();
        for (i, inp) in inputs.iter().enumerate() {
            let l = &mut self.local[i];
            l.num_tokens = inp.num_tokens;
        }
        if self.status_dirty.swap(false, Ordering::AcqRel) {
            for (g, stream) in self.groups.iter().zip(streams) {
                // Clear the status words in stream order (one async memset per device).
                // SAFETY: the status buffer is live device memory of g.device; the stream is live.
                unsafe { rt.raw().memset(g.device, g.status.ptr(), 0, g.status.len(), Some(stream.raw()))? };
            }
        }
        let mut groups = std::mem::take(&mut self.groups);
        let result: GpuResult<()> = (|| {
            for (g, stream) in groups.iter_mut().zip(streams) {
                let seq_base = self.advance_seq(g, 0, stream)?;
                let args: Vec<RankArgs> = g
                    .ranks
                    .iter()
                    .enumerate()
                    .map(|(k, &i)| {
                        let (l, inp) = (&self.local[i], &inputs[i]);
                        RankArgs {
                            rank: l.rank as u32,
                            num_tokens: inp.num_tokens as u32,
                            x: inp.x.ptr(),
                            weights: inp.weights.map_or(0, |w| w.ptr()),
                            idx: inp.indices.ptr(),
                            scales: inp.scales.map_or(0, |s| s.ptr()),
                            send_map: l.send_map.ptr(),
                            status: l.status,
                            trace: l.trace.as_ref().map_or(0, |t| t.ptr()),
                            seq_word: if seq_base == 0 { 0 } else { seq_base + 8 * k as u64 },
                            ..RankArgs::default()
                        }
                    })
                    .collect();
                let rank_args = Self::upload_args(g, &args, stream)?;
                let mut p = self.params(g, rank_args, self.dispatch_seq, if spec.drop_out_of_range { FLAG_DROP_OUT_OF_RANGE } else { 0 });
                p.row_bytes = row_bytes as u32;
                p.idx_size = spec.idx_size as u32;
                self.launch(g, false, stream, p)?;
            }
            Ok(())
        })();
        self.groups = groups;
        result?;
        Ok(DispatchTicket {
            seq: self.dispatch_seq,
            indices: inputs.iter().map(|inp| inp.indices.ptr()).collect(),
            _borrow: std::marker::PhantomData,
        })
    }

    /// Queues a combine of every local rank (`inputs[i]` for `local_ranks()[i]`), after the
    /// dispatch whose `ticket` it gets (the last one: its send maps are the ones kept). Every
    /// process must call it.
    ///
    /// Errors: [`EpError::InvalidConfig`] for a ticket of an earlier dispatch, element sizes,
    /// missing weights for a weighted combine, or buffers shorter than their shape; GPU errors.
    pub fn combine(
        &mut self,
        ticket: &DispatchTicket<'_>,
        inputs: &[CombineInput<'_>],
        spec: CombineSpec,
        streams: &[&Stream],
    ) -> GpuResult<()> {
        self.check_stream(streams)?;
        if ticket.seq != self.dispatch_seq || ticket.indices.len() != self.local.len() {
            return Err(bad(
                "combine ticket",
                ticket.seq,
                format!("is not from the last dispatch ({}): combine must follow its own dispatch", self.dispatch_seq),
            ));
        }
        let c = self.cfg.clone();
        if inputs.len() != self.local.len() {
            return Err(bad("combine inputs", inputs.len(), format!("one per local rank ({})", self.local.len())));
        }
        for (what, v) in [("in_elem", spec.in_elem), ("out_elem", spec.out_elem)] {
            if ![2, 4].contains(&v) {
                return Err(bad(what, v, "must be 2 (bf16) or 4 (f32)"));
            }
        }
        if spec.in_elem > c.max_token_type_size {
            return Err(bad("in_elem", spec.in_elem, format!("exceeds max_token_type_size = {}", c.max_token_type_size)));
        }
        if spec.idx_size != self.last_idx_size {
            return Err(bad("idx_size", spec.idx_size, format!("differs from the dispatch's {}", self.last_idx_size)));
        }
        for (i, inp) in inputs.iter().enumerate() {
            let (rank, t) = (self.local[i].rank, self.local[i].num_tokens);
            // The received count is only known on the GPU: the kernel checks it against the
            // rows these buffers hold (EP_ERR_COMBINE_ROWS) before staging anything.
            if inp.weights_in_heap && inp.weights.is_some() {
                return Err(bad("combine weights", rank, "given both as a buffer and as already in the heap"));
            }
            if inp.weights.is_none() && spec.weighted && !inp.weights_in_heap {
                return Err(EpError::WeightsRequired { weighting: "RankSlotSum" }.into());
            }
            need("combine out", rank, inp.out.len(), t * c.hidden * spec.out_elem)?;
            if inp.out_weights.is_some() && inp.weights.is_none() && !inp.weights_in_heap {
                return Err(bad("combine out weights", rank, "need combine weights (a buffer or weights_in_heap) to sum"));
            }
            if let Some(w) = &inp.out_weights {
                need("combine out weights", rank, w.len(), t * c.top_k * 4)?;
            }
        }
        self.combine_seq = next_seq(self.combine_seq);
        let comb_x = self.layout.comb_x;
        let mut groups = std::mem::take(&mut self.groups);
        let result = (|| {
            for (g, stream) in groups.iter_mut().zip(streams) {
                let seq_base = self.advance_seq(g, 1, stream)?;
                let mut args = Vec::with_capacity(g.ranks.len());
                for (k, &i) in g.ranks.iter().enumerate() {
                    let (l, inp) = (&self.local[i], &inputs[i]);
                    let rows = |s: Option<DeviceSlice<'_>>, row: usize| s.map_or(0, |s| (s.len() / row).min(u32::MAX as usize) as u32);
                    args.push(RankArgs {
                        rank: l.rank as u32,
                        num_tokens: l.num_tokens as u32,
                        comb_in_rows: rows(inp.x, c.hidden * spec.in_elem),
                        comb_w_rows: rows(inp.weights, c.top_k * 4),
                        idx: ticket.indices[i],
                        send_map: l.send_map.ptr(),
                        comb_in: inp.x.map_or(self.heap.addr(l.rank)? + comb_x, |x| x.ptr()),
                        comb_w_in: match (inp.weights, inp.weights_in_heap) {
                            (Some(w), _) => w.ptr(),
                            (None, true) => self.heap.addr(l.rank)? + self.layout.comb_w,
                            (None, false) => 0,
                        },
                        out: inp.out.ptr(),
                        out_w: inp.out_weights.map_or(0, |w| w.ptr()),
                        status: l.status,
                        trace: l.trace.as_ref().map_or(0, |t| t.ptr()),
                        seq_word: if seq_base == 0 { 0 } else { seq_base + 8 * k as u64 },
                        ..RankArgs::default()
                    });
                }
                let rank_args = Self::upload_args(g, &args, stream)?;
                let mut p = self.params(g, rank_args, self.combine_seq, if spec.weighted { FLAG_WEIGHTED } else { 0 });
                p.idx_size = spec.idx_size as u32;
                p.comb_in_elem = spec.in_elem as u32;
                p.comb_out_elem = spec.out_elem as u32;
                self.launch(g, true, stream, p)?;
            }
            Ok(())
        })();
        self.groups = groups;
        result
    }

    /// Reads every local rank's status word (synchronous: waits for queued work touching it).
    /// Returns the received counts of the last dispatch.
    ///
    /// Errors: [`EpGpuError::Kernel`] for the first rank whose kernel reported a fault.
    pub fn sync_status(&self) -> GpuResult<Vec<RankStatus>> {
        let rt = self.heap.runtime();
        let mut words = vec![[0u8; 32]; self.local.len()];
        for g in &self.groups {
            let mut b = vec![0u8; g.status.len()];
            rt.copy_dtoh(&mut b, &g.status.slice())?;
            for (k, &i) in g.ranks.iter().enumerate() {
                words[i].copy_from_slice(&b[32 * k..32 * k + 32]);
            }
        }
        let mut out = Vec::with_capacity(self.local.len());
        for (l, b) in self.local.iter().zip(&words) {
            let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
            let what = match w(1) {
                0 => None,
                1 => Some(format!(
                    "expert id {} of token {} slot {} is outside 0..{} (or -1)",
                    w(4) as i32,
                    w(2),
                    w(3),
                    self.cfg.num_experts()
                )),
                2 => Some(format!(
                    "receive buffer of rank {} overflows: {} slots wanted, max_recv_tokens = {}",
                    w(2),
                    w(3),
                    w(4)
                )),
                3 => Some(format!(
                    "{} wait timed out after {:?}: block {} of rank {} never signalled (a rank that did not call, or blocks not co-resident)",
                    if w(2) == 1 { "dispatch" } else { "combine" },
                    self.timeout,
                    w(4),
                    w(3)
                )),
                4 => Some(format!("announced {} received tokens, above max_recv_tokens = {}", w(2), w(3))),
                5 => Some(format!(
                    "combine {} buffer holds {} rows but {} tokens were received",
                    if w(2) == 0 { "input" } else { "weights" },
                    w(3),
                    w(4)
                )),
                code => Some(format!("unknown kernel status {code}")),
            };
            if let Some(what) = what {
                self.status_dirty.store(true, Ordering::Release);
                return Err(EpGpuError::Kernel { rank: l.rank, what });
            }
            out.push(RankStatus { rank: l.rank, recv_count: w(0) as usize });
        }
        Ok(out)
    }

    /// Per local rank and block, the phase timestamps (ns) of the last dispatch and combine:
    /// `[dispatch start, send done, receive done (block 0), combine start, barrier done, end]`;
    /// `None` when built without tracing.
    pub fn trace(&self) -> GpuResult<Option<Vec<RankTrace>>> {
        let rt = self.heap.runtime();
        let mut out = Vec::new();
        for l in &self.local {
            let Some(t) = &l.trace else { return Ok(None) };
            let mut b = vec![0u8; t.len()];
            rt.copy_dtoh(&mut b, &t.slice())?;
            let blocks = b
                .chunks(64)
                .map(|c| {
                    let mut ts = [0u64; 6];
                    for (i, v) in ts.iter_mut().enumerate() {
                        *v = u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap_or_default());
                    }
                    ts
                })
                .collect();
            out.push((l.rank, blocks));
        }
        Ok(Some(out))
    }
}
