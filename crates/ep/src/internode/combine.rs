//! One rank's combine under the inter-node protocol: rows back to the relays (V1, V1-LL) or
//! to the sources (AsyncLL), the relays' per-node partial sums, and the final sums.

use super::record::{contrib, contrib_stride, partial, partial_stride, put_contrib, put_partial, row_elem};
use super::{Outbox, Proto, Seg, Window};
use crate::combine::{contribution, slot_factor, CombineOptions, Combined};
use crate::dispatch::SrcPos;
use crate::dtype::{CombineOut, DType, Element};
use crate::error::{EpError, EpResult};
use crate::tensor::{expect_shape, Tensor2};

/// A token a relay (or its own source) sums for: its id, routing ids, destinations on the
/// relay's node (ascending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelayToken {
    pub token: usize,
    pub ids: Vec<i64>,
    pub dests: Vec<usize>,
}

/// What dispatch leaves for combine on one rank.
#[derive(Debug, Clone)]
pub struct CombineState {
    pub(crate) me: usize,
    pub(crate) recv_src: Vec<SrcPos>,
    pub(crate) ids: Vec<Vec<i64>>,
    pub(crate) dests: Vec<Vec<usize>>,
    pub(crate) relay_tokens: Vec<Vec<RelayToken>>,
}

impl CombineState {
    /// Rows this rank received in dispatch (the row count combine's x must have).
    pub fn num_recv(&self) -> usize {
        self.recv_src.len()
    }

    /// Tokens this rank dispatched (the row count of its combine output).
    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }
}

/// Combine state of one rank between [`CombineRank::start`] and [`CombineRank::finish`].
#[derive(Debug, Clone)]
pub struct CombineRank {
    st: CombineState,
    opts: CombineOptions,
    stride: usize,
    /// The element type `start` was given (`poll` and `finish` must be given the same; a
    /// partial from another node holds its sums in it).
    dtype: DType,
    has_weights: bool,
    reduced: Vec<bool>,
}

impl CombineRank {
    /// [`CombineRank::start`]'s input checks alone, without consuming `st` (so that a caller
    /// with several ranks can refuse bad input before any of them starts). Errors: `Shape`;
    /// `WeightsRequired`; `ElementSize`.
    pub fn check<X: Element>(
        proto: &Proto,
        st: &CombineState,
        x: &Tensor2<X>,
        weights: Option<&Tensor2<f32>>,
        opts: CombineOptions,
    ) -> EpResult<()> {
        let cfg = proto.config();
        let (me, n) = (st.me, st.recv_src.len());
        expect_shape(x, "combine x", me, n, cfg.hidden)?;
        if let Some(w) = weights {
            expect_shape(w, "combine weights", me, n, cfg.top_k)?;
        }
        if opts.weighting == crate::combine::Weighting::RankSlotSum && weights.is_none() {
            return Err(EpError::WeightsRequired { weighting: "RankSlotSum" });
        }
        if X::DTYPE.size() > cfg.max_token_type_size {
            return Err(EpError::ElementSize {
                input: "combine x",
                got: X::DTYPE.size(),
                relation: "exceeds",
                limit: cfg.max_token_type_size,
                field: "max_token_type_size",
            });
        }
        Ok(())
    }

    /// Starts rank `me`'s combine: `x` `[N, H]` in dispatch's received order, optional
    /// `weights` `[N, K]` f32 (every rank passes weights, or none does). Returns the state and
    /// the puts to issue. Errors: those of [`CombineRank::check`].
    pub fn start<X: Element>(
        proto: &Proto,
        st: CombineState,
        x: &Tensor2<X>,
        weights: Option<&Tensor2<f32>>,
        opts: CombineOptions,
    ) -> EpResult<(Self, Outbox)> {
        Self::check(proto, &st, x, weights, opts)?;
        let cfg = proto.config();
        let me = st.me;
        let n = st.recv_src.len();
        let stride = contrib_stride(cfg, X::DTYPE.size());
        let lay = proto.layout();
        let my_node = proto.node(me);
        let nodes = proto.topology().num_nodes();
        // Rows are grouped by origin rank (dispatch's order): one put per origin.
        let mut out = Outbox::default();
        let mut sent = std::collections::BTreeMap::<(usize, Seg), usize>::new();
        let mut i = 0;
        while i < n {
            let s = st.recv_src[i].rank;
            let mut j = i;
            let mut buf = Vec::new();
            while j < n && st.recv_src[j].rank == s {
                put_contrib(&mut buf, stride, st.recv_src[j].token, x.row(j).unwrap_or(&[]), weights.and_then(|w| w.row(j)), cfg.top_k);
                j += 1;
            }
            let (dst, seg) = if proto.scheme().relays() {
                (proto.relay_of(s, my_node), Seg::Gather(me % proto.g(), proto.node(s)))
            } else {
                (s, Seg::CombineIn(me))
            };
            proto.chunked(&mut out, me, dst, seg, 0, stride, &buf);
            sent.insert((dst, seg), j - i);
            i = j;
        }
        let targets: Vec<(usize, Seg)> = if proto.scheme().relays() {
            proto.node_ranks(my_node).flat_map(|r| (0..nodes).map(move |m| (r, Seg::Gather(me % proto.g(), m)))).collect()
        } else {
            (0..cfg.world_size).map(|s| (s, Seg::CombineIn(me))).collect()
        };
        for (dst, seg) in targets {
            out.end(dst, seg, lay, sent.get(&(dst, seg)).copied().unwrap_or(0));
        }
        let reduced = vec![!proto.scheme().relays(); nodes];
        Ok((Self { st, opts, stride, dtype: X::DTYPE, has_weights: weights.is_some(), reduced }, out))
    }

    /// Sums, as a relay, every origin node whose rows from all of this node's ranks are
    /// complete, and sends one partial per token back to its source (V1, V1-LL): sums in f32,
    /// sent in the combine dtype `X` to another node's source, in f32 to this rank itself.
    /// Errors: `CombineElementType` (`X` is not `start`'s); `PeerElementType` (a row written in
    /// another element type); `SegmentOverflow`; `Protocol` for rows of unknown or misordered
    /// tokens.
    pub fn poll<X: Element>(&mut self, proto: &Proto, win: &dyn Window) -> EpResult<Outbox> {
        self.same_type::<X>("poll")?;
        let mut out = Outbox::default();
        let (me, cfg, g) = (self.st.me, proto.config(), proto.g());
        let my_node = proto.node(me);
        let lay = proto.layout();
        'nodes: for m in 0..self.reduced.len() {
            if self.reduced[m] {
                continue;
            }
            let mut rows: Vec<Vec<u8>> = Vec::with_capacity(g);
            for dl in 0..g {
                let seg = Seg::Gather(dl, m);
                let writer = my_node * g + dl;
                let Some(e) = proto.seg_complete(win, me, seg, writer, self.stride)? else { continue 'nodes };
                let mut b = vec![0u8; e * self.stride];
                win.read(lay.data(seg).start, &mut b);
                rows.push(b);
            }
            let origin = proto.relay_of(me, m);
            let rounded = m != my_node;
            let pstride = self.partial_stride(proto, my_node, m);
            let mut cursor = vec![0usize; g];
            let mut buf = Vec::new();
            let (h, k) = (cfg.hidden, cfg.top_k);
            for tok in &self.st.relay_tokens[m] {
                let mut p = vec![0f32; h];
                let mut wp = vec![0f32; k];
                for &d in &tok.dests {
                    let dl = d % g;
                    let seg = Seg::Gather(dl, m);
                    let at = cursor[dl] * self.stride;
                    let row = rows[dl].get(at..at + self.stride).ok_or_else(|| EpError::Protocol {
                        rank: me,
                        segment: seg.to_string(),
                        writer: d,
                        detail: format!("no row for token {} of rank {origin}", tok.token),
                    })?;
                    same_elem::<X>(me, seg, d, row)?;
                    let (token, xv, w) = contrib::<X>(cfg, row);
                    if token != tok.token {
                        return Err(EpError::Protocol {
                            rank: me,
                            segment: seg.to_string(),
                            writer: d,
                            detail: format!("row for token {token} where token {} was due", tok.token),
                        });
                    }
                    cursor[dl] += 1;
                    let f = slot_factor(proto.topology(), self.opts, &tok.ids, w.as_deref(), d, (origin, tok.token))?;
                    for (a, v) in p.iter_mut().zip(xv) {
                        *a += f * contribution(cfg.quant, v);
                    }
                    if let Some(w) = w {
                        for (a, v) in wp.iter_mut().zip(w) {
                            *a += v;
                        }
                    }
                }
                put_partial::<X>(&mut buf, pstride, tok.token, &p, &wp, rounded);
            }
            for (dl, c) in cursor.iter().enumerate() {
                if *c * self.stride != rows[dl].len() {
                    let seg = Seg::Gather(dl, m);
                    return Err(EpError::Protocol {
                        rank: me,
                        segment: seg.to_string(),
                        writer: my_node * g + dl,
                        detail: "rows for tokens it never received".into(),
                    });
                }
            }
            let count = self.st.relay_tokens[m].len();
            proto.chunked(&mut out, me, origin, Seg::Partial(my_node), 0, pstride, &buf);
            out.end(origin, Seg::Partial(my_node), lay, count);
            self.reduced[m] = true;
        }
        Ok(out)
    }

    fn same_type<X: Element>(&self, step: &'static str) -> EpResult<()> {
        if X::DTYPE == self.dtype {
            return Ok(());
        }
        Err(EpError::CombineElementType { rank: self.st.me, step, got: X::DTYPE, started: self.dtype })
    }

    /// Bytes of a partial that node `from`'s relay sends to a source on node `to`.
    fn partial_stride(&self, proto: &Proto, from: usize, to: usize) -> usize {
        partial_stride(proto.config(), if from == to { 4 } else { self.dtype.size() })
    }

    fn segs(&self, proto: &Proto) -> Vec<(Seg, usize, usize)> {
        let me = self.st.me;
        if proto.scheme().relays() {
            let own = proto.node(me);
            (0..proto.topology().num_nodes())
                .map(|n| (Seg::Partial(n), proto.relay_of(me, n), self.partial_stride(proto, n, own)))
                .collect()
        } else {
            (0..proto.config().world_size).map(|d| (Seg::CombineIn(d), d, self.stride)).collect()
        }
    }

    /// Whether every relay sum was sent and every incoming segment is complete.
    pub fn is_complete(&self, proto: &Proto, win: &dyn Window) -> EpResult<bool> {
        if self.reduced.iter().any(|r| !r) {
            return Ok(false);
        }
        for (seg, writer, stride) in self.segs(proto) {
            if proto.seg_complete(win, self.st.me, seg, writer, stride)?.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The segments still awaited, with their writers.
    pub fn pending(&self, proto: &Proto, win: &dyn Window) -> Vec<(Seg, usize)> {
        let mut p: Vec<(Seg, usize)> = Vec::new();
        let g = proto.g();
        for (m, _) in self.reduced.iter().enumerate().filter(|(_, r)| !**r) {
            for dl in 0..g {
                let w = proto.node(self.st.me) * g + dl;
                if !matches!(proto.seg_complete(win, self.st.me, Seg::Gather(dl, m), w, self.stride), Ok(Some(_))) {
                    p.push((Seg::Gather(dl, m), w));
                }
            }
        }
        for (seg, writer, stride) in self.segs(proto) {
            if !matches!(proto.seg_complete(win, self.st.me, seg, writer, stride), Ok(Some(_))) {
                p.push((seg, writer));
            }
        }
        p
    }

    /// The rank's combined tokens `[T, H]` (and `[T, K]` weight sums when weights were
    /// passed), summed in the scheme's order ([`super::Scheme::sum_order`]). Call once
    /// complete; then zero [`super::WindowLayout::combine_counters`].
    /// Errors: `CombineElementType` (`X` is not `start`'s); `PeerElementType` (a row or partial
    /// written in another element type); `Protocol` (rows for tokens not routed to their
    /// writer, out of order).
    pub fn finish<X: Element, O: CombineOut>(self, proto: &Proto, win: &dyn Window) -> EpResult<Combined<O>> {
        self.same_type::<X>("finish")?;
        let cfg = proto.config();
        let (me, h, k) = (self.st.me, cfg.hidden, cfg.top_k);
        let t_n = self.st.ids.len();
        let mut acc = vec![0f32; t_n * h];
        let mut wacc = vec![0f32; t_n * k];
        for (seg, writer, stride) in self.segs(proto) {
            let e = proto.seg_complete(win, me, seg, writer, stride)?.unwrap_or(0);
            let mut b = vec![0u8; e * stride];
            win.read(proto.layout().data(seg).start, &mut b);
            let mut last = None;
            for row in b.chunks_exact(stride) {
                let bad = |detail: String| EpError::Protocol { rank: me, segment: seg.to_string(), writer, detail };
                let token = super::record::get_u32(row, 0) as usize;
                let routed_here = self.st.dests.get(token).is_some_and(|d| match seg {
                    Seg::Partial(n) => d.iter().any(|&r| proto.node(r) == n),
                    _ => d.contains(&writer),
                });
                if !routed_here || last.is_some_and(|l| l >= token) {
                    return Err(bad(format!("row for token {token} it was not routed, or out of order")));
                }
                last = Some(token);
                same_elem::<X>(me, seg, writer, row)?;
                let dst = &mut acc[token * h..(token + 1) * h];
                let wdst = &mut wacc[token * k..(token + 1) * k];
                if let Seg::Partial(n) = seg {
                    let (_, v) = partial::<X>(cfg, row, n != proto.node(me));
                    for (a, p) in dst.iter_mut().zip(&v[..h]) {
                        *a += p;
                    }
                    for (a, p) in wdst.iter_mut().zip(&v[h..]) {
                        *a += p;
                    }
                } else {
                    let (_, xv, w) = contrib::<X>(cfg, row);
                    let f = slot_factor(proto.topology(), self.opts, &self.st.ids[token], w.as_deref(), writer, (me, token))?;
                    for (a, v) in dst.iter_mut().zip(xv) {
                        *a += f * contribution(cfg.quant, v);
                    }
                    if let Some(w) = w {
                        for (a, v) in wdst.iter_mut().zip(w) {
                            *a += v;
                        }
                    }
                }
            }
        }
        let x = Tensor2::new(t_n, h, acc.into_iter().map(O::from_f32).collect())?;
        let weights = self.has_weights.then(|| Tensor2::new(t_n, k, wacc)).transpose()?;
        Ok(Combined { x, weights })
    }
}

/// The row or partial `row` of `seg`, written by `writer`, names the element type `X` this rank
/// combines in: `PeerElementType` otherwise, or `Protocol` when its flags name no type.
fn same_elem<X: Element>(me: usize, seg: Seg, writer: usize, row: &[u8]) -> EpResult<()> {
    match row_elem(row) {
        Ok(theirs) if theirs == X::DTYPE => Ok(()),
        Ok(theirs) => Err(EpError::PeerElementType { rank: me, segment: seg.to_string(), writer, theirs, mine: X::DTYPE }),
        Err(code) => Err(EpError::Protocol {
            rank: me,
            segment: seg.to_string(),
            writer,
            detail: format!("a combine row whose flags name element type code {code}, which is none"),
        }),
    }
}
