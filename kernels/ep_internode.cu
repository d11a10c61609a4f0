// ep_internode.cu: MORI-EP across nodes on GPUs, three schemes (IE_FLAG_RELAY picks V1-LL, with
// IE_FLAG_DEDUP V1):
// - AsyncLL: direct puts to every destination rank, no forwarding: same-node destinations by
//   P2P stores into their windows, other nodes' through the rank's proxy (one command per
//   destination into the ring of mori_ring.h; the proxy's MORI-IO write moves the staged bytes,
//   then a tail write moves the counter pair). Combine returns rows the same ways and the source
//   sums over destination ranks ascending.
// - V1-LL: records for another node cross once per (token, destination) to the relay there (the
//   rank with the source's local index), one command per relay; the relay forwards each by P2P
//   stores to its destination's dispatch segment for the source. Combine: destinations on
//   another node than the source return rows to that node's relay (P2P stores into its gather
//   area; with IE_FLAG_COMB_ROWS the relay reads them in their windows), the relay sums per
//   token over its node's destinations ascending in f32 and sends one partial per token back,
//   rounded to the combine dtype (bf16: half the bytes of f32, as MORI's combine moves hidden x
//   dtype bytes); the source adds, per node ascending, its own node's rows (summed first) and
//   the other nodes' partials (the reference's PerNodeRounded order).
// - V1: V1-LL with one record per (token, node): the record names every destination on the
//   relay's node, and the relay stores it to each. Combine as V1-LL.
// Below, "V1-LL" covers V1 too where not said otherwise.
// Host side and ABI mirror: crates/ep/src/gpu_internode/.
//
// One launch per phase serves the `num_local` ranks of this process (block / blocks_per_rank =
// local rank; the host keeps the grid co-resident). Every rank has:
// - a window (same layout everywhere, IeLayout): dispatch segments disp_in[s] (records from
//   source s, in s's token order), combine segments comb_in[e] (rows returned by rank e, in
//   this rank's token order to e; V1-LL: partials from the relay e), two staging areas for the
//   proxy (out_disp[d], out_comb[s]), and for V1-LL relay segments relay_in[m] (from the rank
//   of node m with this local index), their staging out_relay[m], and the gather area;
// - two counter blocks, u64 [phase][writer W][arrived, total]: the device one (phases 0
//   dispatch, 1 combine, 2 the relay's gather; written by same-node writers with atomics) and
//   one inside the window (ctr, phases 0 and 1), written by other nodes' proxies: after a
//   segment's bytes landed, the writer's proxy copies the pair (entries, entries + 1) from the
//   writer's window (sig, [phase][destination] 16 bytes) into it (a ring command with op
//   RING_OP_TAIL: no control message, the same path as the data). A segment is complete when
//   total != 0 and arrived == total - 1.
// Record (rec_bytes, 16-aligned): x row (row_bytes), K f32 weights, K ids (idx_size bytes
// each), scale_bytes of scales, i32 flat source (s * max_tokens + t), and for V1-LL u32
// destination, u32 index in its segment, u32 index among the tokens sent to its node (V1: that
// index, then per local index of the node the index in that rank's segment or 0xffffffff). Combine
// row (comb_bytes, 16-aligned): H elements of comb_elem bytes, K f32 weights. Partial
// (part_bytes): H elements of comb_elem bytes, K f32 (comb_bytes' layout).
//
// Kernels, in stream order per call:
//   mori_ie_dispatch_stage with blocks of its own, each for a share of the tokens: the layout
//                         of its share (destination masks mask[t] and pre[t][d], tokens before
//                         t sent to d: the token's index in its segment at d when its mask bit d
//                         is set; pre[T][d] = cnt[d]; for V1-LL also npre[t][m], tokens before t
//                         sent to node m), then the share's records for other nodes staged;
//                         the rank's last block to finish pushes one command per peer or relay
//                         for them;
//   mori_ie_dispatch      P2P stores to same-node ranks while the proxy moves the staged
//                         records; V1-LL: then the relay
//                         forwarding; then block 0 waits for every source and writes the
//                         received count and the first output row per source;
//   mori_ie_dispatch_recv copy the records into the outputs; the last block zeroes the
//                         rank's dispatch counters (with IE_FLAG_RECV_WIN not launched: the
//                         records are the output, and mori_ie_dispatch's last block zeroes
//                         them);
//   mori_ie_combine_stage every received row where it goes, with blocks of its own: this
//                         node's sources' by P2P store, other nodes' sources' into the staging
//                         (V1, V1-LL: into the relays' gather areas, whose counters the rank's
//                         last block then sets); with IE_FLAG_COMB_ROWS nothing (the input
//                         rows are the staging, this node's sources' sums and the relays read
//                         them in the window): the host does not launch it, and
//                         mori_ie_combine_send checks the row count;
//   mori_ie_combine_relay V1, V1-LL, with blocks of its own: this rank as the relay, once its
//                         gather counters are complete (IE_FLAG_COMB_ROWS: at once), the
//                         partial sums per token, handed to the proxy by the last block, which
//                         also zeroes the gather counters;
//   mori_ie_combine_send  block 0 signals this node's sources' rows (AsyncLL: and hands the
//                         rows for other nodes over, one proxy command per source), then waits
//                         for every rank's rows;
//   mori_ie_combine_recv  sum per token in f32 (AsyncLL: over destination ranks ascending;
//                         V1-LL: per node); the last block zeroes the combine counters.
// Counters are zeroed by their reader once read; the next writes to them follow causally
// (every rank's next phase needs this rank's current one).
// Faults land in the rank's status words as in ep_intranode.cu (first wins; the host zeroes
// them before each dispatch); a kernel whose rank already failed skips its work.
// Tracing (IeRank.trace != 0): u64 GPU-clock stamps (ns), [2 phases][2][W] per peer (0: when
// this rank's command for peer d was pushed, 1: when this rank saw source s's segment
// complete; V1-LL: only the relay pairs, the rank of each other node with this local index),
// then [trace_blocks][IE_T_SLOTS] per block (IE_T_* slots); block b >= trace_blocks and unreached
// points stay 0.
#include "ep_internode_relay.h"

struct IeLayoutSh {
    uint64_t m[512];       // the tile's masks
    uint32_t c[16][32];    // per group: each lane's count in the tile
    uint32_t run[2 * IE_MAX_WORLD]; // per column (rank d, then V1-LL's node W + m): tokens before the tile
};


// The layout of this block's share of the tokens, [t0, t1): each token's destination mask
// mask[t], pre[t][d] (tokens before t sent to d: the token's index in its segment at d when its
// mask bit d is set) and for V1-LL npre[t][m] (tokens before t sent to node m). Each column's
// count over the tokens before t0 first (one thread per token, a block-scope atomic per set
// bit), then the share a tile of block-size tokens at a time, one 32-thread group per column.
// The rank's last block (its share ends at T) writes the totals: pre[T][d] = cnt[d] and
// npre[T][m]. An expert id out of range in the share lands in the status word (the host zeroes
// the status words before a dispatch); ids before t0 are skipped silently (their own block
// reports them).
MORI_DEVICE void ie_layout_share(const IeParams& p, const IeRank& a, uint32_t b, uint32_t t0, uint32_t t1, IeLayoutSh& sh) {
    uint32_t* status = (uint32_t*)a.status;
    const uint32_t T = a.num_tokens, W = p.world, tid = mori_thread_idx(), nthreads = mori_block_dim();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
    const int64_t num_experts = (int64_t)p.experts_per_rank * W;
    uint64_t* mask = (uint64_t*)a.mask;
    uint32_t* pre = (uint32_t*)a.pre;
    uint32_t* npre = (uint32_t*)a.npre;
    const uint8_t* idx = (const uint8_t*)a.idx;
    const uint32_t N = ie_nodes(p), cols = W + (ie_relay(p) ? N : 0);
    const uint64_t gmask = p.gpn >= 64 ? ~0ull : (1ull << p.gpn) - 1;
    for (uint32_t c = tid; c < cols; c += nthreads) sh.run[c] = 0;
    mori_sync_block();
    for (uint32_t u = tid; u < t0; u += nthreads) {
        uint64_t m = 0;
        for (uint32_t k = 0; k < p.top_k; k++) {
            const int64_t e = ie_load_idx(p, idx, (uint64_t)u * p.top_k + k);
            if (e >= 0 && e < num_experts) m |= 1ull << (uint32_t)(e / p.experts_per_rank);
        }
        for (uint64_t v = m; v; v &= v - 1) mori_atomic_add_block_u32(&sh.run[mori_ctz64(v)], 1);
        for (uint32_t n = 0; cols > W && n < N; n++)
            if ((m >> (n * p.gpn)) & gmask) mori_atomic_add_block_u32(&sh.run[W + n], 1);
    }
    mori_sync_block();
    // A tile of `nthreads` tokens at a time: masks by one thread per token, then per column
    // (destination rank, or V1-LL's destination node) one group, each lane counting `nwarps`
    // consecutive tokens of the tile.
    for (uint32_t tile = t0; tile < t1; tile += nthreads) {
        const uint32_t t = tile + tid;
        uint64_t m = 0;
        if (t < t1) {
            for (uint32_t k = 0; k < p.top_k; k++) {
                const int64_t e = ie_load_idx(p, idx, (uint64_t)t * p.top_k + k);
                if (e == -1) continue;
                if (e < -1 || e >= num_experts) {
                    if (!(p.flags & IE_FLAG_DROP_OUT_OF_RANGE)) ie_error(status, IE_ERR_EXPERT_RANGE, t, k, (uint32_t)e);
                    continue;
                }
                m |= 1ull << (uint32_t)(e / p.experts_per_rank);
            }
            mask[t] = m;
        }
        sh.m[tid] = m;
        mori_sync_block();
        const uint32_t first = lane * nwarps;
        for (uint32_t d = warp; d < cols; d += nwarps) {
            uint32_t c = 0;
            for (uint32_t i = 0; i < nwarps; i++) c += ie_col_bit(p, sh.m[first + i], d);
            sh.c[warp][lane] = c;
            mori_sync_group32();
            uint32_t before = sh.run[d];
            for (uint32_t j = 0; j < lane; j++) before += sh.c[warp][j];
            for (uint32_t i = 0; i < nwarps; i++) {
                const uint32_t tt = tile + first + i;
                if (tt < t1) {
                    if (d < W) pre[(uint64_t)tt * W + d] = before;
                    else npre[(uint64_t)tt * N + (d - W)] = before;
                }
                before += ie_col_bit(p, sh.m[first + i], d);
            }
            mori_sync_group32();
            if (lane == 31) sh.run[d] = before;
            mori_sync_group32();
        }
        mori_sync_block();
    }
    if (b + 1 == p.blocks_per_rank) {
        for (uint32_t d = tid; d < W; d += nthreads) {
            pre[(uint64_t)T * W + d] = sh.run[d];
            ((uint32_t*)a.cnt)[d] = sh.run[d];
        }
        for (uint32_t c = W + tid; c < cols; c += nthreads) npre[(uint64_t)T * N + (c - W)] = sh.run[c];
    }
    // The share's rows, written by this block's threads, before any of them stages from them.
    mori_sync_block();
}

// Hands the staged records for other nodes to the proxy, one thread per peer: AsyncLL each
// peer's segment, V1 and V1-LL each other node's relay's segment after writing its header (per
// local index of node m the records for that rank, then the record count). Called by the
// rank's last staging block, once every block's records and the totals are fenced.
MORI_DEVICE void ie_dispatch_hand_over(const IeParams& p, const IeRank& a, uint64_t deadline) {
    const uint32_t r = a.rank, W = p.world, tid = mori_thread_idx(), nthreads = mori_block_dim();
    const uint32_t* cnt = (const uint32_t*)a.cnt;
    if (ie_relay(p)) {
        const uint32_t own = r / p.gpn;
        for (uint32_t m = tid; m < ie_nodes(p); m += nthreads) {
            if (m == own) continue;
            const uint32_t n = ie_relay_count(p, a, m);
            uint32_t* hdr = (uint32_t*)(p.win[r] + p.lay.out_relay + m * p.lay.seg_relay);
            for (uint32_t c = 0; c < p.gpn; c++) hdr[c] = cnt[m * p.gpn + c];
            hdr[p.gpn] = n;
            // (The ring push's system fence releases the header with the records.)
            ie_hand_over(p, a, ie_relay_of(p, r, m), 0, n, p.lay.relay_hdr + (uint64_t)n * p.rec_bytes, p.lay.out_relay + m * p.lay.seg_relay,
                         p.lay.relay_in + own * p.lay.seg_relay, deadline);
        }
        return;
    }
    for (uint32_t d = tid; d < W; d += nthreads)
        if (!ie_same_node(p, r, d))
            ie_hand_over(p, a, d, 0, cnt[d], (uint64_t)cnt[d] * p.rec_bytes, p.lay.out_disp + d * p.lay.seg_rec, p.lay.disp_in + r * p.lay.seg_rec,
                         deadline);
}

// Lays out this block's share of the tokens (ie_layout_share), then stages its records for
// other nodes in this rank's window (the proxy reads them there), one 32-thread group per
// token; the rank's last block to finish hands them to the proxy. Waits for no other block (only
// the last one, for ring space, to its deadline), so the host may launch it with more blocks per
// rank than the co-resident kernels (its own blocks_per_rank); mori_ie_dispatch, next in stream
// order, reads the whole layout. Held to 64 registers a thread (two 512-thread blocks per
// multiprocessor; the records written IE_FAN at a time took it to 128 otherwise).
MORI_KERNEL MORI_LAUNCH_BOUNDS_RESIDENT(512, 2) void mori_ie_dispatch_stage(IeParams p) {
    MORI_SHARED_STRUCT(IeLayoutSh, sh);
    MORI_SHARED_STRUCT(IeLast, last);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, W = p.world, tid = mori_thread_idx();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = mori_block_dim() / 32;
    const uint32_t T = a.num_tokens;
    const uint32_t t0 = (uint32_t)((uint64_t)T * b / p.blocks_per_rank), t1 = (uint32_t)((uint64_t)T * (b + 1) / p.blocks_per_rank);
    ie_stamp(p, a, b, IE_T_LAYOUT0);
    ie_layout_share(p, a, b, t0, t1, sh);
    ie_stamp(p, a, b, IE_T_LAYOUT1);
    ie_stamp(p, a, b, IE_T_DISP0);
    // (An out-of-range id recorded by the layout does not stop the dispatch: it was skipped.)
    if (ie_relay(p)) {
        ie_stage_relay(p, a, t0, t1, lane, warp, nwarps);
    } else {
        for (uint32_t t = t0 + warp; t < t1; t += nwarps)
            for (uint32_t d = 0; d < W; d++) {
                if (ie_same_node(p, r, d)) continue;
                const int32_t q = ie_pos(p, a, t, d);
                if (q >= 0) ie_put_record(p, a, t, (uint8_t*)(p.win[r] + p.lay.out_disp + d * p.lay.seg_rec + (uint64_t)q * p.rec_bytes), lane);
            }
    }
    // Ordered at device scope before the block counts itself done: the last block's hand-over
    // then releases every block's records to the proxy with the ring push's system fence (a
    // fence is cumulative: what this thread saw before it is ordered with it).
    mori_fence_device();
    mori_sync_block();
    ie_stamp(p, a, b, IE_T_STAGED);
    // The rank's last block to finish staging sees every block's records and the totals (the
    // block whose share ends at T wrote them before its own staging): it hands the segments to
    // the proxy at once, so the legs start while mori_ie_dispatch is still being scheduled. (An
    // out-of-range id recorded by the layout does not stop the hand-over: it was skipped.)
    if (ie_last_block(p, a, IE_DONE_STAGED, last)) ie_dispatch_hand_over(p, a, mori_clock_ns() + p.timeout_ns);
}

// With IE_FLAG_RECV_WIN, the last block of the rank to finish zeroes its dispatch counters
// (block 0 read them in its wait; V1-LL's relay blocks theirs in the forwarding).
MORI_DEVICE void ie_dispatch_done(const IeParams& p, const IeRank& a, IeLast& last) {
    if (ie_recv_win(p) && ie_last_block(p, a, 2, last) && !ie_failed((const uint32_t*)a.status)) ie_zero_phase(p, a, 0);
}

// Held to 64 registers a thread: at the 112 that the records written IE_FAN at a time took it
// to, one 512-thread block fits a multiprocessor, and the co-resident grid would leave the
// proxies' copy kernels almost no room beside it.
MORI_KERNEL MORI_LAUNCH_BOUNDS_RESIDENT(512, 2) void mori_ie_dispatch(IeParams p) {
    MORI_SHARED_STRUCT(IeSpan, sh);
    MORI_SHARED_STRUCT(IeFwd, fw);
    MORI_SHARED_STRUCT(IeLast, last);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, W = p.world, tid = mori_thread_idx(), nthreads = mori_block_dim();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
    uint32_t* status = (uint32_t*)a.status;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    ie_stamp(p, a, b, IE_T_DISP1);
    const uint32_t T = a.num_tokens;
    const uint32_t t0 = (uint32_t)((uint64_t)T * b / p.blocks_per_rank), t1 = (uint32_t)((uint64_t)T * (b + 1) / p.blocks_per_rank);
    const uint32_t* pre = (const uint32_t*)a.pre;
    // This block's entries per destination: contiguous in the destination's segment.
    for (uint32_t d = tid; d < W; d += nthreads) {
        sh.first[d] = pre[(uint64_t)t0 * W + d];
        sh.n[d] = pre[(uint64_t)t1 * W + d] - sh.first[d];
        if (b == 0 && ie_same_node(p, r, d)) ie_signal(p, a, d, 0, 1, (uint64_t)((const uint32_t*)a.cnt)[d] + 1);
    }
    mori_sync_block();
    // The records for other nodes went to the proxy from mori_ie_dispatch_stage's last block;
    // this node's ranks get theirs by P2P stores into their windows while the proxy works.
    // Each token read once for up to IE_FAN of them.
    const bool relay = ie_relay(p);
    for (uint32_t t = t0 + warp; t < t1; t += nwarps) {
        // (Named slots, not an array: an array indexed by n would live in local memory.)
        uint8_t *r0 = nullptr, *r1 = nullptr, *r2 = nullptr, *r3 = nullptr;
        uint32_t n = 0;
        for (uint32_t d = (r / p.gpn) * p.gpn; d < (r / p.gpn + 1) * p.gpn; d++) {
            const int32_t q = ie_pos(p, a, t, d);
            if (q < 0) continue;
            uint8_t* at = (uint8_t*)(p.win[d] + p.lay.disp_in + r * p.lay.seg_rec + (uint64_t)q * p.rec_bytes);
            if (n == 0) r0 = at;
            else if (n == 1) r1 = at;
            else if (n == 2) r2 = at;
            else r3 = at;
            if (++n == IE_FAN) {
                ie_put_records(p, a, t, r0, r1, r2, r3, n, lane);
                n = 0;
            }
        }
        if (n) ie_put_records(p, a, t, r0, r1, r2, r3, n, lane);
    }
    // Every record of the block is visible before its counter moves.
    mori_fence_system();
    mori_sync_block();
    for (uint32_t d = tid; d < W; d += nthreads)
        if (ie_same_node(p, r, d) && sh.n[d]) ie_signal(p, a, d, 0, 0, sh.n[d]);
    ie_stamp(p, a, b, IE_T_INTRA);
    mori_sync_block(); // the INTRA stamp (thread 0) before any wait's "seen" stamp
    // V1-LL: this rank as the relay of the other nodes' ranks with its local index.
    if (relay) {
        ie_forward(p, a, b, deadline, fw, lane, warp, nwarps);
        ie_stamp(p, a, b, IE_T_FWD1);
    }
    if (b != 0) {
        ie_dispatch_done(p, a, last);
        return;
    }
    // Block 0 receives: every source's segment complete, then the first output row of each.
    // (V1-LL: another node's records come forwarded by a relay of this node.)
    uint32_t* rc = (uint32_t*)a.recv_cnt;
    for (uint32_t s = tid; s < W; s += nthreads) {
        const bool remote = !ie_same_node(p, r, s);
        rc[s] = ie_wait_segment(p, a, 0, s, remote && !relay, deadline);
        if (!(remote && relay)) ie_stamp_peer(p, a, 0, 1, s);
    }
    mori_sync_block();
    if (tid == 0 && !ie_failed(status)) {
        // A count from another node's pair is a peer's: no segment holds more than max_tokens.
        uint64_t base = 0;
        for (uint32_t s = 0; s < W; s++) {
            ((uint32_t*)a.recv_base)[s] = (uint32_t)base;
            // The window's copy, for same-node sources' combine (IE_FLAG_COMB_ROWS).
            ((uint32_t*)(p.win[r] + p.lay.rbase))[s] = (uint32_t)base;
            if (rc[s] > p.max_tokens) ie_error(status, IE_ERR_SEG_COUNT, s, rc[s], p.max_tokens);
            base += rc[s];
        }
        if (!ie_failed(status)) {
            if (base > p.max_recv) ie_error(status, IE_ERR_RECV_COUNT, (uint32_t)base, p.max_recv, 0);
            else status[0] = (uint32_t)base;
        }
    }
    ie_stamp(p, a, b, IE_T_RECVD);
    ie_dispatch_done(p, a, last);
}

// The source of output row i (recv_base ascending).
MORI_DEVICE uint32_t ie_source_of(const IeParams& p, const IeRank& a, uint32_t i) {
    const uint32_t* base = (const uint32_t*)a.recv_base;
    const uint32_t* cnt = (const uint32_t*)a.recv_cnt;
    for (uint32_t s = 0; s < p.world; s++)
        if (i < base[s] + cnt[s]) return s;
    return p.world - 1;
}

// Copies the received records into the outputs. Spins on nothing, so the host may launch it
// with more blocks per rank than the co-resident kernels (its own blocks_per_rank).
MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ie_dispatch_recv(IeParams p) {
    MORI_SHARED_STRUCT(IeLast, sh);
    MORI_SHARED_STRUCT(IeOk, oksh);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, tid = mori_thread_idx();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = mori_block_dim() / 32;
    const uint32_t* status = (const uint32_t*)a.status;
    ie_stamp(p, a, b, IE_T_COPY0);
    const bool ok = ie_block_ok(status, oksh);
    const uint32_t N = ok ? status[0] : 0;
    const uint32_t i0 = (uint32_t)((uint64_t)N * b / p.blocks_per_rank), i1 = (uint32_t)((uint64_t)N * (b + 1) / p.blocks_per_rank);
    const uint32_t kw = p.top_k * 4, ki = p.top_k * p.idx_size;
    for (uint32_t i = i0 + warp; i < i1; i += nwarps) {
        const uint32_t s = ie_source_of(p, a, i);
        const uint32_t q = i - ((const uint32_t*)a.recv_base)[s];
        const uint8_t* rec = (const uint8_t*)(p.win[r] + p.lay.disp_in + s * p.lay.seg_rec + (uint64_t)q * p.rec_bytes);
        const uint8_t* m = rec + p.row_bytes;
        ie_copy_group((uint8_t*)a.out_x + (uint64_t)i * p.row_bytes, rec, p.row_bytes, lane);
        if (a.out_w) ie_copy_group((uint8_t*)a.out_w + (uint64_t)i * kw, m, kw, lane);
        ie_copy_group((uint8_t*)a.out_idx + (uint64_t)i * ki, m + kw, ki, lane);
        if (a.out_scales && p.scale_bytes)
            ie_copy_group((uint8_t*)a.out_scales + (uint64_t)i * p.scale_bytes, m + kw + ki, p.scale_bytes, lane);
        if (lane == 0) ((int32_t*)a.out_src)[i] = *(const int32_t*)(m + kw + ki + p.scale_bytes);
    }
    if (ie_last_block(p, a, 0, sh) && ok) ie_zero_phase(p, a, 0);
    ie_stamp(p, a, b, IE_T_COPY1);
}

// Writes received row i (H elements, then K f32 weights or zeros) at `row` with one group.
MORI_DEVICE void ie_put_row(const IeParams& p, const IeRank& a, uint32_t i, uint8_t* row, uint32_t lane) {
    if (ie_comb_rows(p)) {
        ie_copy_group(row, (const uint8_t*)a.comb_x + (uint64_t)i * p.comb_bytes, p.comb_bytes, lane);
        return;
    }
    const uint32_t xb = p.hidden * p.comb_elem, kw = p.top_k * 4;
    ie_copy_group(row, (const uint8_t*)a.comb_x + (uint64_t)i * xb, xb, lane);
    if (a.comb_w) ie_copy_group(row + xb, (const uint8_t*)a.comb_w + (uint64_t)i * kw, kw, lane);
    else ie_zero_group(row + xb, kw, lane);
}

// The address rank r's received row i goes to (its source s, at index q of s's rows here):
// s's combine segment for r (same node), s's relay's gather segment for (s's node, r's local
// index) (V1-LL), or r's own staging for s (AsyncLL, another node: the proxy moves it).
MORI_DEVICE uint64_t ie_comb_dest(const IeParams& p, uint32_t r, uint32_t s, uint64_t q) {
    const uint32_t G = p.gpn;
    if (ie_same_node(p, r, s)) return p.win[s] + p.lay.comb_in + r * p.lay.seg_comb + q * p.comb_bytes;
    if (ie_relay(p))
        return p.win[ie_relay_of(p, s, r / G)] + p.lay.gather + ((s / G) * G + r % G) * p.lay.seg_gather + q * p.comb_bytes;
    return p.win[r] + p.lay.out_comb + s * p.lay.seg_comb + q * p.comb_bytes;
}

// Writes every received row where it goes (ie_comb_dest: a same-node source's combine
// segment by P2P store, the staging the proxy reads, or V1/V1-LL the relays' gather areas),
// each block a share of the rows (not launched with IE_FLAG_COMB_ROWS: the rows are read in
// place). Spins on nothing, so the host launches it with more blocks per rank than the
// co-resident kernels (its own blocks_per_rank); the counters of this node's rows move in
// mori_ie_combine_send, later in stream order, and under V1/V1-LL the rank's last block sets
// the relays' gather counters here. (In mori_ie_combine_send's 16 blocks a rank the same-node
// stores took 76-84 µs on the blocks whose share held them and 13-24 on the others, V1 decode
// at 2 x 4 on an H100.)
MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ie_combine_stage(IeParams p) {
    MORI_SHARED_STRUCT(IeLast, last);
    MORI_SHARED_STRUCT(IeOk, oksh);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, tid = mori_thread_idx();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = mori_block_dim() / 32;
    uint32_t* status = (uint32_t*)a.status;
    ie_stamp(p, a, b, IE_T_COMB0);
    if (!ie_block_ok(status, oksh)) return;
    const uint32_t N = status[0];
    if (N > a.comb_rows) {
        if (tid == 0 && b == 0) ie_error(status, IE_ERR_COMBINE_ROWS, a.comb_rows, N, 0);
        return;
    }
    const uint32_t i0 = (uint32_t)((uint64_t)N * b / p.blocks_per_rank), i1 = (uint32_t)((uint64_t)N * (b + 1) / p.blocks_per_rank);
    // IE_FLAG_COMB_ROWS (the host does not launch this kernel then): every row already lies
    // in the window, read there in place.
    for (uint32_t i = i0 + warp; i < i1 && !ie_comb_rows(p); i += nwarps) {
        const uint32_t s = ie_source_of(p, a, i);
        ie_put_row(p, a, i, (uint8_t*)ie_comb_dest(p, r, s, i - ((const uint32_t*)a.recv_base)[s]), lane);
    }
    // Visible system-wide (the proxy reads the staging through the host) before the counters
    // move in the next kernel.
    mori_fence_system();
    mori_sync_block();
    ie_stamp(p, a, b, IE_T_CSTAGED);
    // V1, V1-LL: once every block's rows are written, the last block counts the rows for each
    // other node's source s into the gather counters, in its phase-2 block, of s's relay on this
    // node (writer slot (s's node, this rank's local index)), the total first.
    if (!ie_relay(p) || !ie_last_block(p, a, IE_DONE_CSTAGED(p.world), last)) return;
    const uint32_t G = p.gpn, own = r / G;
    const uint32_t* rc = (const uint32_t*)a.recv_cnt;
    for (uint32_t s = tid; s < p.world; s += mori_block_dim()) {
        if (ie_same_node(p, r, s)) continue;
        ie_signal_w(p, ie_relay_of(p, s, own), 2, (s / G) * G + r % G, 1, (uint64_t)rc[s] + 1);
        if (rc[s]) ie_signal_w(p, ie_relay_of(p, s, own), 2, (s / G) * G + r % G, 0, rc[s]);
    }
}

// V1, V1-LL: this rank as the relay: once this node's ranks counted their rows of each other
// node's tokens into its gather counters (mori_ie_combine_stage's last blocks, before this
// kernel in stream order; with IE_FLAG_COMB_ROWS at once: the rows lie in the window), the
// partial sums per token, each block a share, handed to the proxy by the last block. Waits
// only for those counters, so the host launches it on more blocks per rank than the
// co-resident kernels (in mori_ie_combine_send's 16 blocks a rank the sums took
// 66-117 µs, V1 decode at 2 x 4 on an H100). Held to 64 registers a thread, as
// mori_ie_combine_recv (two 512-thread blocks per multiprocessor; the lanes' parallel look-up
// of a token's rows took it to 93 otherwise: one block per multiprocessor).
MORI_KERNEL MORI_LAUNCH_BOUNDS_RESIDENT(512, 2) void mori_ie_combine_relay(IeParams p) {
    MORI_SHARED_STRUCT(IeFwd, fw);
    MORI_SHARED_STRUCT(IeOk, oksh);
    MORI_SHARED_STRUCT(IeGather, gs);
    MORI_SHARED_STRUCT(IeLast, last);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t tid = mori_thread_idx(), lane = tid % 32, warp = tid / 32, nwarps = mori_block_dim() / 32;
    uint32_t* status = (uint32_t*)a.status;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    ie_stamp(p, a, b, IE_T_RRED0);
    if (!ie_relay(p) || !ie_block_ok(status, oksh)) return;
    ie_relay_reduce(p, a, b, deadline, fw, gs, lane, warp, nwarps);
    ie_stamp(p, a, b, IE_T_RRED1);
    if (ie_last_block(p, a, IE_DONE_GATHER(p.world), last) && !ie_failed(status)) ie_zero_phase(p, a, 2);
}

// Block 0 signals the rows mori_ie_combine_stage wrote (this node's sources' combine counters;
// AsyncLL: the rows for other nodes, one proxy command per source; V1 and V1-LL handed theirs
// over in mori_ie_combine_relay), then waits for every rank's rows.
MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ie_combine_send(IeParams p) {
    MORI_SHARED_STRUCT(IeOk, oksh);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, W = p.world, G = p.gpn, tid = mori_thread_idx(), nthreads = mori_block_dim();
    uint32_t* status = (uint32_t*)a.status;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    const bool relay = ie_relay(p);
    ie_stamp(p, a, b, IE_T_COMB1);
    // mori_ie_combine_stage refused more rows than the input holds.
    if (!ie_block_ok(status, oksh)) return;
    const uint32_t N = status[0];
    // IE_FLAG_COMB_ROWS: no staging kernel ran to check the rows given (every block returns).
    if (ie_comb_rows(p) && N > a.comb_rows) {
        if (tid == 0 && b == 0) ie_error(status, IE_ERR_COMBINE_ROWS, a.comb_rows, N, 0);
        return;
    }
    const uint32_t* base = (const uint32_t*)a.recv_base;
    const uint32_t* rc = (const uint32_t*)a.recv_cnt;
    // Block 0 signals the same-node sources' rows, whole (mori_ie_combine_stage stored them,
    // or with IE_FLAG_COMB_ROWS they lie in the window since before the launch), count and
    // total.
    for (uint32_t s = tid; b == 0 && s < W; s += nthreads) {
        if (ie_same_node(p, r, s)) {
            if (rc[s]) ie_signal(p, a, s, 1, 0, rc[s]);
            ie_signal(p, a, s, 1, 1, (uint64_t)rc[s] + 1);
        } else if (!relay) {
            // The rows for other nodes, staged and fenced by mori_ie_combine_stage (AsyncLL:
            // one proxy command per source). IE_FLAG_COMB_ROWS: the rows of s from the input
            // itself (rows base[s] on).
            const uint64_t from = ie_comb_rows(p) ? p.lay.out_comb + (uint64_t)base[s] * p.comb_bytes
                                                  : p.lay.out_comb + s * p.lay.seg_comb;
            ie_hand_over(p, a, s, 1, rc[s], (uint64_t)rc[s] * p.comb_bytes, from, p.lay.comb_in + r * p.lay.seg_comb, deadline);
        }
    }
    ie_stamp(p, a, b, IE_T_CINTRA);
    if (b != 0) return;
    // Block 0 waits for every rank's rows (V1-LL: this node's ranks' rows and each other node's
    // partials from this rank's relay there). mori_ie_combine_recv, next in stream order, sums
    // them without waiting, so the host may launch it on more blocks than this kernel's.
    ie_stamp(p, a, b, IE_T_RED0);
    for (uint32_t e = tid; e < W; e += nthreads) {
        const bool remote = !ie_same_node(p, r, e);
        if (relay && remote && e != ie_relay_of(p, r, e / G)) continue;
        ie_wait_segment(p, a, 1, e, remote, deadline);
        ie_stamp_peer(p, a, 1, 1, e);
    }
    mori_sync_block();
    ie_stamp(p, a, b, IE_T_CRECVD);
}

// Sums every rank's rows per token. Spins on nothing (mori_ie_combine_send's block 0 waited
// for the rows), so the host may launch it with more blocks per rank than the co-resident
// kernels (its own blocks_per_rank). Held to 64 registers a thread (two 512-thread blocks per
// multiprocessor): four 256-thread blocks fit on one, so both nodes' sums run in one wave
// (at 90 registers most of a rank's blocks waited for a second).
MORI_KERNEL MORI_LAUNCH_BOUNDS_RESIDENT(512, 2) void mori_ie_combine_recv(IeParams p) {
    MORI_SHARED_STRUCT(IeLast, sh);
    MORI_SHARED_STRUCT(IeOk, oksh);
    MORI_SHARED_STRUCT(IeGather, gs);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, W = p.world, G = p.gpn, tid = mori_thread_idx();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = mori_block_dim() / 32;
    const uint32_t* status = (const uint32_t*)a.status;
    const bool relay = ie_relay(p);
    ie_stamp(p, a, b, IE_T_CRECVD);
    const bool ok = ie_block_ok(status, oksh);
    const uint32_t T = ok ? a.num_tokens : 0;
    const uint32_t t0 = (uint32_t)((uint64_t)T * b / p.blocks_per_rank), t1 = (uint32_t)((uint64_t)T * (b + 1) / p.blocks_per_rank);
    const uint8_t* idx = (const uint8_t*)a.idx;
    const bool weighted = (p.flags & IE_FLAG_WEIGHTED) != 0;
    const uint32_t xb = p.hidden * p.comb_elem, NN = ie_nodes(p);
    // With fewer tokens than warps in the block (decode: 2 tokens per block at 64 blocks per
    // rank), wpt warps share a token, each summing every wpt-th group of 256 columns: the sum
    // is bound by the latency of each warp's loads, not by bandwidth.
    const uint32_t nt = t1 - t0, wpt = nt > 0 && nt < nwarps ? nwarps / nt : 1, sub = warp % wpt;
    for (uint32_t t = t0 + warp / wpt; t < t1; t += nwarps / wpt) {
        // The contributing entries, then compacted by lane 0 (in place): rank e's row, or
        // (V1-LL, e another node's relay for this rank) that node's partial.
        const uint64_t mask = ((const uint64_t*)a.mask)[t];
        for (uint32_t e = lane; e < W; e += 32) {
            uint64_t row = 0;
            float f = 1.0f;
            if (!relay || ie_same_node(p, r, e)) {
                const int32_t q = ie_pos(p, a, t, e);
                if (q >= 0 && ie_comb_rows(p) && ie_same_node(p, r, e)) {
                    // In place in e's window: e's row for this token, among e's rows from r.
                    const uint32_t rb = ((const uint32_t*)(p.win[e] + p.lay.rbase))[r];
                    row = p.win[e] + p.lay.out_comb + ((uint64_t)rb + (uint64_t)q) * p.comb_bytes;
                } else if (q >= 0) {
                    row = p.win[r] + p.lay.comb_in + e * p.lay.seg_comb + (uint64_t)q * p.comb_bytes;
                }
                if (q >= 0) {
                    if (weighted) f = ie_factor(p, idx, (uint64_t)t * p.top_k, (const float*)(row + xb), e);
                }
            } else if (e == ie_relay_of(p, r, e / G) && ie_col_bit(p, mask, W + e / G)) {
                const uint32_t u = ((const uint32_t*)a.npre)[(uint64_t)t * NN + e / G];
                row = p.win[r] + p.lay.comb_in + e * p.lay.seg_comb + (uint64_t)u * p.part_bytes;
            }
            gs.row[warp][e] = row;
            gs.f[warp][e] = f;
            gs.node[warp][e] = (uint8_t)(e / G);
        }
        mori_sync_group32();
        if (lane == 0) {
            uint32_t n = 0;
            for (uint32_t e = 0; e < W; e++) {
                if (!gs.row[warp][e]) continue;
                gs.row[warp][n] = gs.row[warp][e];
                gs.f[warp][n] = gs.f[warp][e];
                gs.node[warp][n] = gs.node[warp][e];
                n++;
            }
            gs.n[warp] = n;
        }
        mori_sync_group32();
        const uint32_t nd = gs.n[warp];
        uint8_t* out = (uint8_t*)a.comb_out + (uint64_t)t * p.hidden * p.out_elem;
        // 8 columns per lane and step. AsyncLL: summed over the ranks in ascending order.
        // V1-LL: per node ascending, a node's sum (this node's rows, or another's partial)
        // first, then added to the total.
        // Two groups of 256 columns per pass (every wpt-th group is this warp's): two loads in
        // flight per row. Named accumulators (no index chosen at run time: registers, not
        // local memory).
        for (uint32_t h0 = (sub * 32 + lane) * 8; h0 < p.hidden; h0 += 512 * wpt) {
            const uint32_t h1 = h0 + 256 * wpt;
            const bool two = h1 < p.hidden;
            float a0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, a1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            float q0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, q1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            uint32_t cur = 0xffffffffu;
            for (uint32_t j = 0; j < nd; j++) {
                const uint32_t node = gs.node[warp][j];
                const uint8_t* src = (const uint8_t*)gs.row[warp][j];
                if (!relay) {
                    ie_acc8(a0, src + (uint64_t)h0 * p.comb_elem, p.comb_elem, gs.f[warp][j]);
                    if (two) ie_acc8(a1, src + (uint64_t)h1 * p.comb_elem, p.comb_elem, gs.f[warp][j]);
                    continue;
                }
                if (node != cur) {
                    if (cur != 0xffffffffu)
                        for (int i = 0; i < 8; i++) a0[i] += q0[i], q0[i] = 0.0f, a1[i] += q1[i], q1[i] = 0.0f;
                    cur = node;
                }
                // Another node's partial (in the combine dtype, factor 1) or this node's row.
                ie_acc8(q0, src + (uint64_t)h0 * p.comb_elem, p.comb_elem, gs.f[warp][j]);
                if (two) ie_acc8(q1, src + (uint64_t)h1 * p.comb_elem, p.comb_elem, gs.f[warp][j]);
            }
            if (relay && nd)
                for (int i = 0; i < 8; i++) a0[i] += q0[i], a1[i] += q1[i];
            ie_store8(out + (uint64_t)h0 * p.out_elem, p.out_elem, a0);
            if (two) ie_store8(out + (uint64_t)h1 * p.out_elem, p.out_elem, a1);
        }
        if (a.comb_out_w && sub == 0) {
            for (uint32_t k = lane; k < p.top_k; k += 32) {
                float sw = 0.0f, sp = 0.0f;
                uint32_t cur = 0xffffffffu;
                for (uint32_t j = 0; j < nd; j++) {
                    const uint32_t node = gs.node[warp][j];
                    if (relay && node != cur) {
                        if (cur != 0xffffffffu) sw += sp, sp = 0.0f;
                        cur = node;
                    }
                    (relay ? sp : sw) += ((const float*)(gs.row[warp][j] + xb))[k];
                }
                if (relay && nd) sw += sp;
                ((float*)a.comb_out_w)[(uint64_t)t * p.top_k + k] = sw;
            }
        }
        mori_sync_group32();
    }
    if (ie_last_block(p, a, 1, sh) && ok) ie_zero_phase(p, a, 1);
    ie_stamp(p, a, b, IE_T_RED1);
}

#ifdef MORI_HOST_EMU
MORI_EMU_EXPORT(mori_ie_dispatch_stage, IeParams)
MORI_EMU_EXPORT(mori_ie_dispatch, IeParams)
MORI_EMU_EXPORT(mori_ie_dispatch_recv, IeParams)
MORI_EMU_EXPORT(mori_ie_combine_stage, IeParams)
MORI_EMU_EXPORT(mori_ie_combine_relay, IeParams)
MORI_EMU_EXPORT(mori_ie_combine_send, IeParams)
MORI_EMU_EXPORT(mori_ie_combine_recv, IeParams)
#endif

