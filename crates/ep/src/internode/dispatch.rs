//! One rank's dispatch under the inter-node protocol: the source's puts, the relay's
//! forwarding, and the decoding of the rank's segments into the reference's output.

use super::combine::{CombineState, RelayToken};
use super::record::{put_record, record_body, record_head, record_stride, RecordRef};
use super::{Outbox, Proto, Scheme, Seg, Window};
use crate::dispatch::{RankInput, RankRecv, SrcPos};
use crate::dtype::{Element, TopkIndex};
use crate::error::{EpError, EpResult};
use crate::tensor::expect_shape;

/// Dispatch state of rank `me` between [`DispatchRank::start`] and [`DispatchRank::finish`].
#[derive(Debug, Clone)]
pub struct DispatchRank {
    me: usize,
    stride: usize,
    ids: Vec<Vec<i64>>,
    dests: Vec<Vec<usize>>,
    /// Per origin node: records consumed from its relay segment.
    relay_done: Vec<usize>,
    /// Per origin node and destination local index: records forwarded.
    relay_fwd: Vec<Vec<usize>>,
    relay_ended: Vec<bool>,
    relay_tokens: Vec<Vec<RelayToken>>,
}

impl DispatchRank {
    /// Starts rank `me`'s dispatch of `input` (`[T, H]` x, `[T, K]` f32 weights, optional
    /// `[T, scale_dim]` f32 scales, `[T, K]` ids): returns the state and the puts to issue.
    ///
    /// Errors: `TooManyTokens` (T above `max_tokens_per_rank`), `Shape`, `ScalesPresence`,
    /// `ElementSize` (x wider than `max_token_type_size`, or scales with `scale_type_size` != 4),
    /// `ExpertOutOfRange`.
    pub fn start<X: Element, I: TopkIndex>(proto: &Proto, me: usize, input: &RankInput<X, I, f32>) -> EpResult<(Self, Outbox)> {
        let cfg = proto.config();
        let t_n = input.indices.rows();
        check_input(proto, me, input)?;
        let stride = record_stride(cfg, X::DTYPE.size());
        let (g, nodes, my_node) = (proto.g(), proto.topology().num_nodes(), proto.node(me));
        let mut ids = Vec::with_capacity(t_n);
        let mut dests = Vec::with_capacity(t_n);
        for (t, row) in input.indices.iter_rows().enumerate() {
            ids.push(row.iter().map(|i| i.as_i64()).collect::<Vec<_>>());
            dests.push(proto.topology().dest_ranks(row, proto.policy, me, t)?);
        }
        let record = |buf: &mut Vec<u8>, t: usize, dest: Option<usize>| {
            let rec = RecordRef {
                src: me,
                token: t,
                dest,
                ids: input.indices.row(t).unwrap_or(&[]),
                weights: input.weights.row(t).unwrap_or(&[]),
                scales: input.scales.as_ref().and_then(|s| s.row(t)),
                x: input.x.row(t).unwrap_or(&[]),
            };
            put_record(buf, stride, &rec);
        };
        let lay = proto.layout();
        let mut out = Outbox::default();
        let mut ends = Vec::new();
        let direct = |out: &mut Outbox, ends: &mut Vec<(usize, Seg, usize)>, d: usize| {
            let mut buf = Vec::new();
            let toks: Vec<usize> = (0..t_n).filter(|&t| dests[t].contains(&d)).collect();
            for &t in &toks {
                record(&mut buf, t, None);
            }
            proto.chunked(out, me, d, Seg::In(me), 0, stride, &buf);
            ends.push((d, Seg::In(me), toks.len()));
        };
        match proto.scheme() {
            Scheme::AsyncLL => {
                for d in 0..cfg.world_size {
                    direct(&mut out, &mut ends, d);
                }
            }
            Scheme::V1 | Scheme::V1LL => {
                for d in proto.node_ranks(my_node) {
                    direct(&mut out, &mut ends, d);
                }
                for m in (0..nodes).filter(|&m| m != my_node) {
                    let relay = proto.relay_of(me, m);
                    let mut buf = Vec::new();
                    let mut n = 0;
                    for (t, dt) in dests.iter().enumerate() {
                        let in_node: Vec<usize> = dt.iter().copied().filter(|&d| proto.node(d) == m).collect();
                        if proto.scheme() == Scheme::V1 {
                            if !in_node.is_empty() {
                                record(&mut buf, t, None);
                                n += 1;
                            }
                        } else {
                            for d in in_node {
                                record(&mut buf, t, Some(d));
                                n += 1;
                            }
                        }
                    }
                    proto.chunked(&mut out, me, relay, Seg::Relay(my_node), 0, stride, &buf);
                    ends.push((relay, Seg::Relay(my_node), n));
                }
            }
        }
        for (d, seg, n) in ends {
            out.end(d, seg, lay, n);
        }
        let own: Vec<RelayToken> = (0..t_n)
            .filter_map(|t| {
                let in_node: Vec<usize> = dests[t].iter().copied().filter(|&d| proto.node(d) == my_node).collect();
                (!in_node.is_empty()).then(|| RelayToken { token: t, ids: ids[t].clone(), dests: in_node })
            })
            .collect();
        let mut relay_tokens = vec![Vec::new(); nodes];
        relay_tokens[my_node] = own;
        let st = Self {
            me,
            stride,
            ids,
            dests,
            relay_done: vec![0; nodes],
            relay_fwd: vec![vec![0; g]; nodes],
            relay_ended: (0..nodes).map(|m| m == my_node || !proto.scheme().relays()).collect(),
            relay_tokens,
        };
        Ok((st, out))
    }

    /// Forwards every relay segment that became complete since the last call, with the end
    /// markers of what it forwarded (V1, V1-LL; nothing under AsyncLL).
    ///
    /// Errors: `SegmentOverflow`; `Protocol` for a record of another origin, a token id not
    /// below `max_tokens_per_rank`, or one with no destination on this node.
    pub fn poll(&mut self, proto: &Proto, win: &dyn Window) -> EpResult<Outbox> {
        let mut out = Outbox::default();
        let (me, my_node, cfg) = (self.me, proto.node(self.me), proto.config());
        let lay = proto.layout();
        for m in 0..self.relay_ended.len() {
            if self.relay_ended[m] {
                continue;
            }
            let seg = Seg::Relay(m);
            let origin = proto.relay_of(me, m);
            // Chunks may land in any order: an arrival count says how many, not which, so a
            // relay segment is forwarded once complete.
            let Some(entries) = proto.seg_complete(win, me, seg, origin, self.stride)? else { continue };
            let (from, to) = (self.relay_done[m], entries);
            if to > from {
                let mut bytes = vec![0u8; (to - from) * self.stride];
                win.read(lay.data(seg).start + from * self.stride, &mut bytes);
                let mut per_dest: Vec<Vec<u8>> = vec![Vec::new(); proto.g()];
                for rec in bytes.chunks_exact(self.stride) {
                    let head = record_head(cfg, rec);
                    let bad = |detail: String| EpError::Protocol { rank: me, segment: seg.to_string(), writer: origin, detail };
                    if head.src != origin || head.token >= cfg.max_tokens_per_rank {
                        return Err(bad(format!("record names source rank {} token {}", head.src, head.token)));
                    }
                    let routed = proto.topology().dest_ranks(&head.ids, proto.policy, origin, head.token)?;
                    let here: Vec<usize> = match (proto.scheme(), head.dest) {
                        (Scheme::V1LL, Some(d)) if proto.node(d) == my_node && routed.contains(&d) => vec![d],
                        (Scheme::V1, None) => routed.iter().copied().filter(|&d| proto.node(d) == my_node).collect(),
                        _ => Vec::new(),
                    };
                    if here.is_empty() {
                        return Err(bad(format!("token {} has no destination on node {my_node}", head.token)));
                    }
                    let list = &mut self.relay_tokens[m];
                    match list.last_mut() {
                        Some(last) if last.token == head.token && proto.scheme() == Scheme::V1LL => last.dests.extend(&here),
                        Some(last) if last.token >= head.token => {
                            return Err(bad(format!("token {} after token {}: records out of order", head.token, last.token)))
                        }
                        _ => list.push(RelayToken { token: head.token, ids: head.ids.clone(), dests: here.clone() }),
                    }
                    for d in here {
                        per_dest[d % proto.g()].extend_from_slice(rec);
                    }
                }
                for (dl, buf) in per_dest.iter().enumerate() {
                    if !buf.is_empty() {
                        let d = my_node * proto.g() + dl;
                        let first = self.relay_fwd[m][dl];
                        proto.chunked(&mut out, me, d, Seg::In(origin), first, self.stride, buf);
                        self.relay_fwd[m][dl] += buf.len() / self.stride;
                    }
                }
                self.relay_done[m] = to;
            }
            for dl in 0..proto.g() {
                out.end(my_node * proto.g() + dl, Seg::In(origin), lay, self.relay_fwd[m][dl]);
            }
            self.relay_ended[m] = true;
        }
        Ok(out)
    }

    /// The segments this rank still waits for, with the rank that writes each.
    pub fn pending(&self, proto: &Proto, win: &dyn Window) -> Vec<(Seg, usize)> {
        let mut p: Vec<(Seg, usize)> =
            (0..self.relay_ended.len()).filter(|&m| !self.relay_ended[m]).map(|m| (Seg::Relay(m), proto.relay_of(self.me, m))).collect();
        for s in 0..proto.config().world_size {
            if !matches!(proto.seg_complete(win, self.me, Seg::In(s), self.writer_of_in(proto, s), self.stride), Ok(Some(_))) {
                p.push((Seg::In(s), self.writer_of_in(proto, s)));
            }
        }
        p
    }

    fn writer_of_in(&self, proto: &Proto, s: usize) -> usize {
        if proto.scheme().relays() && !proto.same_node(s, self.me) {
            proto.relay_of(s, proto.node(self.me))
        } else {
            s
        }
    }

    /// Whether every segment is complete and every relay segment forwarded. Errors as
    /// [`Proto::seg_complete`].
    pub fn is_complete(&self, proto: &Proto, win: &dyn Window) -> EpResult<bool> {
        let mut all = self.relay_ended.iter().all(|e| *e);
        for s in 0..proto.config().world_size {
            all &= proto.seg_complete(win, self.me, Seg::In(s), self.writer_of_in(proto, s), self.stride)?.is_some();
        }
        Ok(all)
    }

    /// Decodes the complete segments into the rank's output (origin rank ascending, then token
    /// ascending: the reference's order) and the state combine needs. Call once
    /// [`DispatchRank::is_complete`]; then zero [`super::WindowLayout::dispatch_counters`].
    ///
    /// Errors: `Protocol` (a record of another origin, tokens not ascending), `RecvOverflow`,
    /// `SegmentOverflow`.
    pub fn finish<X: Element, I: TopkIndex>(self, proto: &Proto, win: &dyn Window) -> EpResult<(RankRecv<X, I, f32>, CombineState)> {
        let cfg = proto.config();
        let lay = proto.layout();
        let mut segs = Vec::with_capacity(cfg.world_size);
        let mut n = 0;
        for s in 0..cfg.world_size {
            let w = self.writer_of_in(proto, s);
            let e = proto.seg_complete(win, self.me, Seg::In(s), w, self.stride)?.unwrap_or(0);
            n += e;
            segs.push((s, w, e));
        }
        if n > cfg.max_recv_tokens {
            return Err(EpError::RecvOverflow { rank: self.me, received: n, limit: cfg.max_recv_tokens });
        }
        let mut out = RankRecv::<X, I, f32>::with_capacity(cfg, n);
        for (s, writer, e) in segs {
            let seg = Seg::In(s);
            let mut bytes = vec![0u8; e * self.stride];
            win.read(lay.data(seg).start, &mut bytes);
            let mut last = None;
            for rec in bytes.chunks_exact(self.stride) {
                let head = record_head(cfg, rec);
                if head.src != s || head.token >= cfg.max_tokens_per_rank || last.is_some_and(|l| l >= head.token) {
                    return Err(EpError::Protocol {
                        rank: self.me,
                        segment: seg.to_string(),
                        writer,
                        detail: format!("record (rank {}, token {}) out of place", head.src, head.token),
                    });
                }
                last = Some(head.token);
                let (ids, w, sc, x) = record_body::<X, I>(cfg, rec);
                out.x.push_row(&x);
                out.weights.push_row(&w);
                out.indices.push_row(&ids);
                if let Some(dst) = out.scales.as_mut() {
                    dst.push_row(&sc);
                }
                out.src.push(SrcPos { rank: s, token: head.token });
            }
        }
        let state =
            CombineState { me: self.me, recv_src: out.src.clone(), ids: self.ids, dests: self.dests, relay_tokens: self.relay_tokens };
        Ok((out, state))
    }
}

fn check_input<X: Element, I: TopkIndex>(proto: &Proto, me: usize, input: &RankInput<X, I, f32>) -> EpResult<()> {
    let cfg = proto.config();
    let t = input.indices.rows();
    if t > cfg.max_tokens_per_rank {
        return Err(EpError::TooManyTokens { rank: me, tokens: t, limit: cfg.max_tokens_per_rank });
    }
    if X::DTYPE.size() > cfg.max_token_type_size {
        return Err(EpError::ElementSize {
            input: "x",
            got: X::DTYPE.size(),
            relation: "exceeds",
            limit: cfg.max_token_type_size,
            field: "max_token_type_size",
        });
    }
    if cfg.scale_dim > 0 && cfg.scale_type_size != 4 {
        return Err(EpError::ElementSize {
            input: "scales",
            got: 4,
            relation: "differs from",
            limit: cfg.scale_type_size,
            field: "scale_type_size",
        });
    }
    expect_shape(&input.indices, "indices", me, t, cfg.top_k)?;
    expect_shape(&input.x, "x", me, t, cfg.hidden)?;
    expect_shape(&input.weights, "weights", me, t, cfg.top_k)?;
    match (&input.scales, cfg.scale_dim) {
        (None, 0) => Ok(()),
        (Some(s), d) if d > 0 => expect_shape(s, "scales", me, t, d),
        (given, d) => Err(EpError::ScalesPresence { rank: me, scale_dim: d, given: given.is_some() }),
    }
}
