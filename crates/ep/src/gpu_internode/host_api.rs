//! [`InterNodeGpu`]'s host calls: inputs and outputs as little-endian host bytes, uploaded
//! and read back around the kernels (the device calls, `device_api.rs`, leave them on the
//! GPU).

use super::{bad, host_err, run_abi, GpuRank, InterNodeGpu};
use crate::gpu::GpuResult;
use crate::gpu_internode::{InterLayout, InterTicket, RankBytes, RecvBytes};
use crate::gpu_ring::Window;
use mori_gpu::Runtime;

impl InterNodeGpu {
    /// Dispatches `inputs[r]` of every rank; returns what each received, in the reference's
    /// order, and the ticket the matching [`InterNodeGpu::combine`] takes. A dispatch whose
    /// ticket was not combined is superseded by the next one (its ticket then refused).
    /// Errors: `RankCount`-like `InvalidConfig` for a wrong number of inputs, a token count
    /// above the maximum or byte lengths that do not match; `ExpertOutOfRange` (checked before
    /// any kernel runs); kernel faults naming the rank, after which the object refuses further
    /// calls.
    pub fn dispatch(&mut self, inputs: &[RankBytes<'_>]) -> GpuResult<(Vec<RecvBytes>, InterTicket)> {
        self.usable()?;
        let l = self.layout.clone();
        if inputs.len() != l.world {
            return Err(bad("inputs", inputs.len(), format!("one per rank: {}", l.world)));
        }
        for (r, i) in inputs.iter().enumerate() {
            let want = [i.tokens * l.row_bytes, i.tokens * l.top_k * 4, i.tokens * l.top_k * l.idx_size, i.tokens * l.scale_bytes];
            let got = [i.x.len(), i.weights.len(), i.idx.len(), i.scales.len()];
            if i.tokens > l.max_tokens || want != got {
                return Err(bad(
                    "rank inputs",
                    format!("rank {r}: {} tokens, bytes {got:?}", i.tokens),
                    format!("at most {} tokens and bytes {want:?}", l.max_tokens),
                ));
            }
            // Expert ids are checked here, before any kernel runs (a fault in the kernels would
            // leave the object unusable).
            run_abi::check_ids(i.idx, l.idx_size, l.top_k, self.experts_per_rank * l.world, r)?;
        }
        // From here a failure may leave counters half-updated (a faulted rank does not zero its
        // own): the object is then unusable.
        let r = self.dispatch_inner(inputs);
        self.poison_on(r)
    }

    /// `dispatch` after its checks: uploads, runs, reads back.
    fn dispatch_inner(&mut self, inputs: &[RankBytes<'_>]) -> GpuResult<(Vec<RecvBytes>, InterTicket)> {
        let l = self.layout.clone();
        for (r, i) in inputs.iter().enumerate() {
            let gr = &mut self.ranks[r];
            gr.tokens = i.tokens;
            gr.ext_inp = None;
            for (buf, bytes) in gr.inp.iter().zip([i.x, i.weights, i.idx, i.scales]) {
                if !bytes.is_empty() {
                    self.rt.copy_htod(&buf.sub(0, bytes.len())?, bytes)?;
                }
            }
        }
        let counts = self.run_dispatch()?;
        let mut out = Vec::with_capacity(l.world);
        for (gr, &n) in self.ranks.iter_mut().zip(&counts) {
            let n = n as usize;
            gr.comb_rows = 0;
            gr.recv = n;
            if self.opts.recv_in_window {
                out.push(read_records(self.rt.as_ref(), &l, gr, n)?);
                continue;
            }
            let sizes = [n * l.row_bytes, n * l.top_k * 4, n * l.top_k * l.idx_size, n * l.scale_bytes, n * 4];
            let mut got: Vec<Vec<u8>> = Vec::new();
            for (buf, len) in gr.out.iter().zip(sizes) {
                let mut v = vec![0u8; len];
                if len > 0 {
                    self.rt.copy_dtoh(&mut v, &buf.sub(0, len)?)?;
                }
                got.push(v);
            }
            let mut it = got.into_iter();
            let mut next = || it.next().unwrap_or_default();
            out.push(RecvBytes { x: next(), weights: next(), idx: next(), scales: next(), src: next() });
        }
        self.dispatched = Some(self.calls);
        Ok((out, InterTicket { seq: self.calls, owner: self.id }))
    }

    /// Combines the dispatch of `ticket`: `x[r]` `[N_r, H]` (combine element bytes) and optional
    /// `w[r]` `[N_r, K]` f32 in rank r's received order; returns each rank's `[T, H]` output
    /// (output element bytes) and `[T, K]` f32 weight sums (zeros without weights).
    /// Errors: a ticket of another object or of a superseded dispatch; shapes as `dispatch`;
    /// a rank given fewer rows than it received (`InvalidConfig` naming the rank and both
    /// counts, before anything runs: the object stays usable);
    /// kernel faults naming the rank.
    pub fn combine(&mut self, ticket: InterTicket, x: &[&[u8]], w: Option<&[&[u8]]>) -> GpuResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.usable()?;
        self.check_ticket(&ticket)?;
        let l = &self.layout;
        if x.len() != l.world || w.is_some_and(|w| w.len() != l.world) {
            return Err(bad("combine inputs", x.len(), format!("one per rank: {}", l.world)));
        }
        let row = l.hidden * l.comb_elem;
        for (r, xr) in x.iter().enumerate() {
            if xr.len() % row != 0 || xr.len() / row > l.max_recv {
                return Err(bad(
                    "combine rows",
                    format!("rank {r}: {} bytes", xr.len()),
                    format!("whole rows of {row} B, at most {}", l.max_recv),
                ));
            }
            // Refused here, before anything runs (the kernels would check it too, but then
            // the other ranks wait for this one's rows until their deadline).
            self.check_received_by(r, xr.len() / row)?;
            let wr = w.map(|w| w[r]).unwrap_or(&[]);
            if !wr.is_empty() && wr.len() != xr.len() / row * l.top_k * 4 {
                return Err(bad(
                    "combine weights",
                    format!("rank {r}: {} bytes", wr.len()),
                    format!("{} rows of {} f32", xr.len() / row, l.top_k),
                ));
            }
        }
        let r = self.combine_inner(x, w);
        if r.is_ok() {
            self.dispatched = None;
        }
        self.poison_on(r)
    }

    /// Refuses a ticket of another object or of a dispatch since superseded or combined.
    pub(super) fn check_ticket(&self, ticket: &InterTicket) -> GpuResult<()> {
        if ticket.owner != self.id || self.dispatched != Some(ticket.seq) {
            return Err(host_err(
                "InterNodeGpu combine",
                format!(
                    "the ticket (dispatch {}) is not this object's latest uncombined dispatch ({})",
                    ticket.seq,
                    self.dispatched.map_or("none".to_string(), |s| s.to_string())
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a combine input of fewer rows than its rank received (`given[r]` for rank r).
    pub(super) fn check_received(&self, given: &[usize]) -> GpuResult<()> {
        given.iter().enumerate().try_for_each(|(r, &n)| self.check_received_by(r, n))
    }

    /// Refuses `given` rows for rank `r` when it received more.
    fn check_received_by(&self, r: usize, given: usize) -> GpuResult<()> {
        let received = self.ranks.get(r).map_or(0, |gr| gr.recv);
        if given < received {
            return Err(bad(
                "combine rows",
                format!("rank {r}: {given}"),
                format!("the combine input holds {given} rows, {received} were received"),
            ));
        }
        Ok(())
    }

    /// `combine` after its checks: uploads, runs, reads back.
    fn combine_inner(&mut self, x: &[&[u8]], w: Option<&[&[u8]]>) -> GpuResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let l = self.layout.clone();
        let row = l.hidden * l.comb_elem;
        for (r, xr) in x.iter().enumerate() {
            let wr = w.map(|w| w[r]).unwrap_or(&[]);
            // In the window the kernels read at most the received rows, at most world x
            // max_tokens (what the out_comb area holds).
            let n = if self.in_window { (xr.len() / row).min(l.world * l.max_tokens) } else { xr.len() / row };
            self.write_combine_input(r, &xr[..n * row], wr.get(..n * l.top_k * 4).unwrap_or(&[]))?;
            self.ranks[r].comb_rows = xr.len() / row;
        }
        self.run_combine()?;
        (0..l.world).map(|r| self.read_combined(r)).collect()
    }
}

/// What rank `gr` received (`n` records in all), read from its window: each source's segment
/// holds its `recv_cnt[s]` records in the received order.
pub(super) fn read_records(rt: &dyn Runtime, l: &InterLayout, gr: &mut GpuRank, n: usize) -> GpuResult<RecvBytes> {
    let cnt = recv_counts(rt, l, gr)?;
    // The kernels checked every count against max_tokens and their sum against status[0]
    // (at most max_recv records: what recv_host holds).
    let len = n * l.rec_bytes;
    let win = &gr.win;
    if let Window::Host(_) = win {
        // Host memory already: plain copies, no pinned staging needed.
        return l.gather_records(&cnt, &mut vec![0u8; len], |off, buf| win.read(rt, off, buf));
    }
    let p = match gr.recv_host.take() {
        Some(p) if p.len() >= len => p,
        old => {
            // Kept until the object goes (see `recv_host_old`); powers of two bound them to
            // the size of the last one.
            gr.recv_host_old.extend(old);
            rt.alloc_pinned(gr.dev_ctr.device(), len.max(1).next_power_of_two())?
        }
    };
    let p = gr.recv_host.insert(p);
    l.gather_records(&cnt, &mut p.as_mut_slice()[..len], |off, buf| win.read(rt, off, buf))
}

/// Rank `gr`'s records per source of the last dispatch, `[world]`.
pub(super) fn recv_counts(rt: &dyn Runtime, l: &InterLayout, gr: &GpuRank) -> GpuResult<Vec<u32>> {
    let mut cnt = vec![0u8; l.world * 4];
    rt.copy_dtoh(&mut cnt, &gr.scratch[3].sub(0, l.world * 4)?)?;
    Ok(cnt.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}
