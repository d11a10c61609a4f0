// ep_internode_relay.h: the relay steps of V1 and V1-LL (ep_internode.cu describes the
// schemes): the source's staging per relay, the relay's forwarding inside its node, and the
// relay's partial sums in combine.
#pragma once
#include "ep_internode.h"

// Per block: the count a wait returned, records forwarded per destination local index, and
// the checked copy of a relay segment's header (read once from the peer's bytes).
struct IeFwd {
    uint32_t n;
    uint32_t cnt[IE_MAX_WORLD];
    uint32_t hdr[IE_MAX_WORLD];
};

// Records in the relay segment staged for node m: V1-LL one per (token, destination on m),
// V1 one per token with a destination on m.
MORI_DEVICE uint32_t ie_relay_count(const IeParams& p, const IeRank& a, uint32_t m) {
    if (ie_dedup(p)) return ((const uint32_t*)a.npre)[(uint64_t)a.num_tokens * ie_nodes(p) + m];
    uint32_t n = 0;
    for (uint32_t d = m * p.gpn; d < (m + 1) * p.gpn; d++) n += ((const uint32_t*)a.cnt)[d];
    return n;
}

// Stages this block's tokens [t0, t1) for other nodes, one relay segment per node m: a header
// (u32 [gpn] records per destination, then u32 records; written by mori_ie_dispatch_stage's
// last block before it hands the segment over, once every share is laid out) and the records.
// V1-LL: in (token, destination) order; record j of token t for destination d is the records of
// t's predecessors for m (the sum of pre[t][d'] over m's ranks) plus t's destinations in m below
// d, and its tail carries d, its index in d's segment (pre[t][d]) and the token's index among
// those sent to m (npre[t][m], its partial's row in combine). V1: record j = npre[t][m] of a
// token with a destination on m, its tail carrying j and per local index the index in that
// rank's segment (or 0xffffffff).
MORI_DEVICE void ie_stage_relay(const IeParams& p, const IeRank& a, uint32_t t0, uint32_t t1, uint32_t lane, uint32_t warp,
                                uint32_t nwarps) {
    const uint32_t r = a.rank, G = p.gpn, N = ie_nodes(p), own = r / G, tail = ie_rec_tail(p);
    const bool dedup = ie_dedup(p);
    const uint32_t* pre = (const uint32_t*)a.pre;
    const uint32_t* npre = (const uint32_t*)a.npre;
    for (uint32_t t = t0 + warp; t < t1; t += nwarps) {
        const uint64_t mask = ((const uint64_t*)a.mask)[t];
        for (uint32_t m = 0; m < N; m++) {
            if (m == own) continue;
            uint8_t* seg = (uint8_t*)(p.win[r] + p.lay.out_relay + m * p.lay.seg_relay + p.lay.relay_hdr);
            if (dedup) {
                if (!ie_col_bit(p, mask, p.world + m)) continue;
                const uint32_t j = npre[(uint64_t)t * N + m];
                uint8_t* rec = seg + (uint64_t)j * p.rec_bytes;
                ie_put_record(p, a, t, rec, lane);
                uint32_t* x = (uint32_t*)(rec + tail);
                if (lane == 0) x[1] = j;
                for (uint32_t dl = lane; dl < G; dl += 32) {
                    const uint32_t d = m * G + dl;
                    x[2 + dl] = ((mask >> d) & 1) ? pre[(uint64_t)t * p.world + d] : 0xffffffffu;
                }
                continue;
            }
            // The token's records for m are consecutive: written IE_FAN at a time, the token
            // read once for each group.
            uint32_t j = 0;
            for (uint32_t d = m * G; d < (m + 1) * G; d++) j += pre[(uint64_t)t * p.world + d];
            uint32_t n = 0;
            for (uint32_t d = m * G; d < (m + 1) * G; d++) {
                if (!((mask >> d) & 1)) continue;
                uint8_t* rec = seg + (uint64_t)(j + n) * p.rec_bytes;
                if (lane == 0) {
                    uint32_t* x = (uint32_t*)(rec + tail);
                    x[1] = d;
                    x[2] = pre[(uint64_t)t * p.world + d];
                    x[3] = npre[(uint64_t)t * N + m];
                }
                if (++n == IE_FAN) {
                    ie_put_run(p, a, t, seg + (uint64_t)j * p.rec_bytes, n, lane);
                    j += n;
                    n = 0;
                }
            }
            if (n) ie_put_run(p, a, t, seg + (uint64_t)j * p.rec_bytes, n, lane);
        }
    }
}

// Destination local index `slot` of relay record `rec` (V1: each local index in turn; V1-LL:
// its one destination at slot 0): the destination rank and its index there, or false.
MORI_DEVICE bool ie_rec_dest(const IeParams& p, const uint8_t* rec, uint32_t own, uint32_t slot, uint32_t* d, uint32_t* q) {
    const uint32_t* x = (const uint32_t*)(rec + ie_rec_tail(p));
    if (ie_dedup(p)) {
        if (x[2 + slot] == 0xffffffffu) return false;
        *d = own * p.gpn + slot;
        *q = x[2 + slot];
        return true;
    }
    if (slot != 0) return false;
    *d = x[1];
    *q = x[2];
    return true;
}

// The relay's forwarding, by every block: for each other node m, once the relay segment of the
// rank there with this local index (the origin) is complete, its records go by P2P stores into
// their destinations' dispatch segments for the origin at the index the origin computed (V1: a
// record to each destination it names); then each destination's arrival count moves, and
// block 0 sets each total from the header. A segment whose count does not fit or disagrees
// with its header, or whose header names more than max_tokens records for a destination (or,
// V1-LL, does not add up), is IE_ERR_RELAY_SEG and not forwarded; a record naming a
// destination off this node, an index past the header or (V1-LL) a token index not below
// max_tokens is IE_ERR_RELAY and skipped (the rank has failed then).
MORI_DEVICE void ie_forward(const IeParams& p, const IeRank& a, uint32_t b, uint64_t deadline, IeFwd& sh, uint32_t lane, uint32_t warp,
                            uint32_t nwarps) {
    const uint32_t r = a.rank, G = p.gpn, N = ie_nodes(p), own = r / G, tid = mori_thread_idx();
    const uint32_t slots = ie_dedup(p) ? G : 1;
    uint32_t* status = (uint32_t*)a.status;
    for (uint32_t m = 0; m < N; m++) {
        if (m == own) continue;
        const uint32_t s = ie_relay_of(p, r, m);
        const uint8_t* seg = (const uint8_t*)(p.win[r] + p.lay.relay_in + m * p.lay.seg_relay);
        if (tid == 0) {
            uint32_t n = ie_wait_segment(p, a, 0, s, true, deadline);
            if (b == 0) ie_stamp_peer(p, a, 0, 1, s);
            // The segment comes from another node: its count must fit, and its header (copied
            // once, then only the copy is used) must agree with the pair, name no more records
            // per destination than a segment holds, and (V1-LL) add up to the count.
            if (n != 0xffffffffu) {
                const volatile uint32_t* hdr = (const volatile uint32_t*)seg;
                bool good = (uint64_t)n * p.rec_bytes <= p.lay.seg_relay - p.lay.relay_hdr && hdr[G] == n;
                uint64_t sum = 0;
                for (uint32_t dl = 0; dl < G; dl++) {
                    sh.hdr[dl] = hdr[dl];
                    good = good && sh.hdr[dl] <= p.max_tokens;
                    sum += sh.hdr[dl];
                }
                if (!good || (!ie_dedup(p) && sum != n)) {
                    ie_error(status, IE_ERR_RELAY_SEG, s, n, 0);
                    n = 0xffffffffu;
                }
            }
            sh.n = n;
        }
        for (uint32_t dl = tid; dl < G; dl += mori_block_dim()) sh.cnt[dl] = 0;
        mori_sync_block();
        const uint32_t n = sh.n;
        if (n == 0xffffffffu) return;
        const uint32_t j0 = (uint32_t)((uint64_t)n * b / p.blocks_per_rank), j1 = (uint32_t)((uint64_t)n * (b + 1) / p.blocks_per_rank);
        for (uint32_t j = j0 + warp; j < j1; j += nwarps) {
            const uint8_t* rec = seg + p.lay.relay_hdr + (uint64_t)j * p.rec_bytes;
            for (uint32_t slot = 0; slot < slots; slot++) {
                uint32_t d, q;
                if (!ie_rec_dest(p, rec, own, slot, &d, &q)) continue;
                // V1-LL's token index names the partial's row in combine: below max_tokens.
                const bool u_ok = ie_dedup(p) || ((const uint32_t*)(rec + ie_rec_tail(p)))[3] < p.max_tokens;
                if (d >= p.world || d / G != own || q >= sh.hdr[d % G] || !u_ok) {
                    if (lane == 0) ie_error(status, IE_ERR_RELAY, s, j, d);
                    continue;
                }
                ie_copy_group((uint8_t*)(p.win[d] + p.lay.disp_in + s * p.lay.seg_rec + (uint64_t)q * p.rec_bytes), rec, p.rec_bytes, lane);
                if (lane == 0) mori_atomic_add_block_u32(&sh.cnt[d % G], 1);
            }
        }
        mori_fence_system();
        mori_sync_block();
        for (uint32_t dl = tid; dl < G; dl += mori_block_dim()) {
            const uint32_t d = own * G + dl;
            if (sh.cnt[dl]) ie_signal_w(p, d, 0, s, 0, sh.cnt[dl]);
            if (b == 0) ie_signal_w(p, d, 0, s, 1, (uint64_t)sh.hdr[dl] + 1);
        }
        mori_sync_block();
    }
}

// Columns summed by one warp at a time in the relay's sums (32 lanes x 8 elements x 4 groups).
#define IE_SUM_CHUNK 1024u

// Columns [c0, min(c0 + IE_SUM_CHUNK, hidden)) of dst = the nd rows at rows[0..nd) (elem-byte
// elements, times factors fs) summed per column in f32, rows in order, stored in elem-byte
// elements (bf16 rounded to nearest even), by the lanes of a 32-thread group: four groups of
// 256 columns, so that a lane has four loads in flight per row instead of one.
MORI_DEVICE void ie_sum_chunk(uint8_t* dst, const uint64_t* rows, const float* fs, uint32_t nd, uint32_t c0, uint32_t hidden,
                              uint32_t elem, uint32_t lane) {
    const uint32_t h0 = c0 + lane * 8;
    float acc[4][8];
    for (int g = 0; g < 4; g++)
        for (int i = 0; i < 8; i++) acc[g][i] = 0.0f;
    for (uint32_t e = 0; e < nd; e++)
        for (uint32_t g = 0; g < 4; g++) {
            const uint32_t h = h0 + 256 * g;
            if (h < hidden) ie_acc8(acc[g], (const uint8_t*)rows[e] + (uint64_t)h * elem, elem, fs[e]);
        }
    for (uint32_t g = 0; g < 4; g++) {
        const uint32_t h = h0 + 256 * g;
        if (h < hidden) ie_store8(dst + (uint64_t)h * elem, elem, acc[g]);
    }
}

// Whether every rank of this launch (this node) holds no fault and a combine input that covers
// its received rows (status[0] <= comb_rows).
MORI_DEVICE bool ie_local_ranks_ok(const IeParams& p) {
    for (uint32_t l = 0; l < p.num_local; l++) {
        const IeRank& o = ((const IeRank*)p.ranks)[l];
        const uint32_t* st = (const uint32_t*)o.status;
        if (ie_failed(st) || st[0] > o.comb_rows) return false;
    }
    return true;
}

// The relay's combine step, by every block: for each other node m, once this node's ranks
// returned their rows for the origin (gather counters, phase 2, writer slot m * gpn + local
// index; IE_FLAG_COMB_ROWS: at once, their rows in their windows), one partial per token sent
// to m (H sums over its destinations ascending with their factors, in f32, stored in the
// combine dtype, then K f32 weight sums) into the staging for the origin, handed to the proxy
// as one command into the origin's combine segment for this rank.
MORI_DEVICE void ie_relay_reduce(const IeParams& p, const IeRank& a, uint32_t b, uint64_t deadline, IeFwd& sh, IeGather& gs, uint32_t lane,
                                 uint32_t warp, uint32_t nwarps) {
    const uint32_t r = a.rank, G = p.gpn, N = ie_nodes(p), own = r / G, tail = ie_rec_tail(p), tid = mori_thread_idx();
    const uint32_t xb = p.hidden * p.comb_elem, kw = p.top_k * 4;
    const bool weighted = (p.flags & IE_FLAG_WEIGHTED) != 0, dedup = ie_dedup(p);
    uint32_t* status = (uint32_t*)a.status;
    // IE_FLAG_COMB_ROWS: the rows lie in the window since before the launch, which serves every
    // rank of this node (one launch per node), so there is nothing to wait for; but no staging
    // kernel checked them: a rank of this launch that failed or whose input is short of its
    // received rows stops the partials (its send kernel names it, and the origins' ranks wait
    // to their deadlines, as behind a staging kernel's refusal). Checked by thread 0 once its
    // block's sums are done, before the block counts itself (a check before the sums, by thread
    // 0 walking the ranks or one thread a rank, cost the relay's sums 10-16 µs at the decode
    // shape on an H100: the kernel spilled more registers). The sums may so read a short or
    // failed rank's rows: every read stays in that rank's window (the row index is taken
    // modulo world x max_tokens, and the rows area holds that many rows). A rank of the node
    // that fails during the kernel (a refused record here) may stop the other relays' partials
    // too; the object refuses further calls after any fault.
    const bool in_place = ie_comb_rows(p);
    for (uint32_t m = 0; m < N; m++) {
        if (m == own) continue;
        const uint32_t s = ie_relay_of(p, r, m);
        if (tid == 0) {
            sh.n = 1;
            gs.bad = 0;
            for (uint32_t dl = 0; dl < G && sh.n && !in_place; dl++)
                if (ie_wait_segment(p, a, 2, m * G + dl, false, deadline) == 0xffffffffu) sh.n = 0;
        }
        mori_sync_block();
        if (!sh.n) return;
        const uint8_t* seg = (const uint8_t*)(p.win[r] + p.lay.relay_in + m * p.lay.seg_relay);
        const uint8_t* recs = seg + p.lay.relay_hdr;
        // Records (dispatch checked them against the segment; bounded again here, as the bytes
        // are a peer's), and the tokens they hold.
        const uint32_t n = ((const uint32_t*)seg)[G];
        if ((uint64_t)n * p.rec_bytes > p.lay.seg_relay - p.lay.relay_hdr) {
            if (tid == 0) ie_error((uint32_t*)a.status, IE_ERR_RELAY_SEG, s, n, 0);
            return;
        }
        uint32_t U = n == 0 ? 0 : dedup ? n : ((const uint32_t*)(recs + (uint64_t)(n - 1) * p.rec_bytes + tail))[3] + 1;
        if (U > p.max_tokens) U = p.max_tokens;
        // IE_FLAG_COMB_ROWS: the rows lie in place in each destination's window (its input,
        // in received order: row rbase[s] + q for index q of s's records there), and the
        // partials go to the gather area, unused then (out_comb holds this rank's own rows).
        const uint64_t stage = in_place ? p.lay.gather + (uint64_t)m * G * p.lay.seg_gather : p.lay.out_comb + s * p.lay.seg_comb;
        uint8_t* out = (uint8_t*)(p.win[r] + stage);
        const uint32_t j0 = (uint32_t)((uint64_t)n * b / p.blocks_per_rank), j1 = (uint32_t)((uint64_t)n * (b + 1) / p.blocks_per_rank);
        // One item per (record, IE_SUM_CHUNK columns), so that a block's warps share its few
        // tokens' rows (at the decode shape a block holds about 4 records for 8 warps).
        const uint32_t C = (p.hidden + IE_SUM_CHUNK - 1) / IE_SUM_CHUNK;
        for (uint32_t it = j0 * C + warp; it < j1 * C; it += nwarps) {
            const uint32_t j = it / C, c0 = (it % C) * IE_SUM_CHUNK;
            // V1-LL: a token's records are consecutive; the group at its first record sums them
            // all. V1: one record per token.
            const uint32_t u = dedup ? j : ((const uint32_t*)(recs + (uint64_t)j * p.rec_bytes + tail))[3];
            if (!dedup && j > 0 && ((const uint32_t*)(recs + (uint64_t)(j - 1) * p.rec_bytes + tail))[3] == u) continue;
            // The token's rows, one candidate per lane (V1: the record's local index i; V1-LL:
            // record j + i, if it is still u's), each with its row (0: none) and factor at gs
            // index i, all loads at once; then lane 0 compacts them in order (V1-LL: up to the
            // first record of another token), as one lane's scan of them did. The records are
            // a peer's bytes: a destination off this node, or (V1-LL) a G + 1-th record of u
            // (a token has one per destination here), is IE_ERR_RELAY and adds nothing.
            const uint32_t cand = dedup ? G : (n - j < G + 1 ? n - j : G + 1);
            for (uint32_t i = lane; i < cand; i += 32) {
                const uint8_t* rec = recs + (uint64_t)(dedup ? j : j + i) * p.rec_bytes;
                uint64_t row = 0;
                float f = 1.0f;
                uint32_t d, q;
                if ((dedup || ((const uint32_t*)(rec + tail))[3] == u) && ie_rec_dest(p, rec, own, dedup ? i : 0, &d, &q)) {
                    if (i >= G || d >= p.world || d / G != own) {
                        *(volatile uint64_t*)&gs.bad = (uint64_t)d << 32 | ((dedup ? j : j + i) + 1);
                    } else {
                        // (q below the header's count, dispatch checked; bounded again here.)
                        const uint64_t at = in_place ? ((uint64_t)((const uint32_t*)(p.win[d] + p.lay.rbase))[s] + q % p.max_tokens) %
                                                           ((uint64_t)p.world * p.max_tokens)
                                                     : q % p.max_tokens;
                        row = in_place ? p.win[d] + p.lay.out_comb + at * p.comb_bytes
                                       : p.win[r] + p.lay.gather + (uint64_t)(m * G + d % G) * p.lay.seg_gather + at * p.comb_bytes;
                        if (weighted) f = ie_factor(p, rec + p.row_bytes + kw, 0, (const float*)(row + xb), d);
                    }
                }
                if (i < G) {
                    gs.row[warp][i] = row;
                    gs.f[warp][i] = f;
                }
            }
            mori_sync_group32();
            if (lane == 0) {
                uint32_t nd = 0;
                for (uint32_t i = 0; i < cand && i < G; i++) {
                    if (!gs.row[warp][i]) {
                        if (dedup) continue;
                        break;
                    }
                    gs.row[warp][nd] = gs.row[warp][i];
                    gs.f[warp][nd] = gs.f[warp][i];
                    nd++;
                }
                gs.n[warp] = nd;
            }
            mori_sync_group32();
            const uint32_t nd = gs.n[warp];
            uint8_t* part = out + (uint64_t)u * p.part_bytes;
            if (u < U) ie_sum_chunk(part, gs.row[warp], gs.f[warp], nd, c0, p.hidden, p.comb_elem, lane);
            for (uint32_t k = lane; k < p.top_k && u < U && c0 == 0; k += 32) {
                float sw = 0.0f;
                for (uint32_t e = 0; e < nd; e++) sw += ((const float*)(gs.row[warp][e] + xb))[k];
                ((float*)(part + xb))[k] = sw;
            }
            mori_sync_group32();
        }
        // Device scope: the partials lie in this rank's window, read by the proxy's copy once
        // the hand-over's ring push released them at system scope.
        mori_fence_device();
        mori_sync_block();
        if (tid == 0) {
            // A refused record fails the rank before the block counts itself: no hand-over.
            if ((uint32_t)gs.bad) ie_error(status, IE_ERR_RELAY, s, (uint32_t)gs.bad - 1, (uint32_t)(gs.bad >> 32));
            // A failed or short rank of the node: the block does not count itself, so no block
            // hands the partials over.
            if (!in_place || ie_local_ranks_ok(p))
                ie_stage_done(p, a, s, 1, U, (uint64_t)U * p.part_bytes, stage, p.lay.comb_in + r * p.lay.seg_comb, deadline);
        }
        mori_sync_block();
    }
}
