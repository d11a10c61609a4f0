// ep_internode.cu: MORI-EP across nodes on GPUs, AsyncLL scheme (direct puts to every
// destination rank, no forwarding): same-node destinations by P2P stores into their windows,
// other nodes' through the rank's proxy (a command per block and destination into the ring of
// mori_ring.h; the proxy's MORI-IO signalled write moves the staged bytes, then adds to the
// destination's counter). Host side and ABI mirror: crates/ep/src/gpu_internode/.
//
// One launch per phase serves the `num_local` ranks of this process (block / blocks_per_rank =
// local rank; the host keeps the grid co-resident). Every rank has:
// - a window (same layout everywhere, IeLayout): dispatch segments disp_in[s] (records from
//   source s, in s's token order), combine segments comb_in[e] (rows returned by rank e, in
//   this rank's token order to e), and two staging areas for the proxy (out_disp[d],
//   out_comb[s]);
// - two counter blocks of the same layout, u64 [phase 2][writer W][arrived, total]: the device
//   one (written by same-node writers with atomics) and one inside the window (ctr), written
//   by other nodes' proxies: after a segment's bytes landed, the writer's proxy copies the
//   pair (entries, entries + 1) from the writer's window (sig, [phase][destination] 16 bytes)
//   into it (a ring command with op RING_OP_TAIL: no control message, the same path as the
//   data). A segment is complete when total != 0 and arrived == total - 1.
// Record (rec_bytes, 16-aligned): x row (row_bytes), K f32 weights, K ids (idx_size bytes
// each), scale_bytes of scales, i32 flat source (s * max_tokens + t). Combine row (comb_bytes,
// 16-aligned): H elements of comb_elem bytes, K f32 weights.
//
// Kernels, in stream order per call:
//   mori_ie_layout        one block per rank: destination masks mask[t] and pre[t][d] (tokens
//                         before t sent to d: the token's index in its segment at d when its
//                         mask bit d is set; pre[T][d] = cnt[d]), a tile of block-size tokens
//                         at a time, one 32-thread group per destination;
//   mori_ie_dispatch      records for other nodes first (staged, then one command per peer as
//                         soon as every block staged), then P2P stores to same-node ranks while
//                         the proxy moves the staged ones; then block 0 waits for every source
//                         and writes the received count and the first output row per source;
//   mori_ie_dispatch_recv copy the records into the outputs; the last block zeroes the
//                         rank's dispatch counters;
//   mori_ie_combine_send  return each received row to its source (put or proxy), signal;
//   mori_ie_combine_recv  wait for every rank's rows, sum per token in f32 over destination
//                         ranks ascending (the reference's AsyncLL order), zero the counters.
// Counters are zeroed by their reader once read; the next writes to them follow causally
// (every rank's next phase needs this rank's current one).
// Faults land in the rank's status words as in ep_intranode.cu (first wins); a kernel whose
// rank already failed skips its work.
// Tracing (IeRank.trace != 0): u64 GPU-clock stamps (ns), [2 phases][2][W] per peer (0: when
// this rank's command for peer d was pushed, 1: when this rank saw source s's segment
// complete), then [trace_blocks][16] per block (IE_T_* slots); block b >= trace_blocks and
// unreached points stay 0.
#include "mori_gpu.h"
#include "mori_ring.h"

#define IE_MAX_WORLD 64

#define IE_OK 0u
#define IE_ERR_EXPERT_RANGE 1u  // [2] token, [3] slot, [4] id (low 32 bits)
#define IE_ERR_TIMEOUT 3u       // [2] phase (1 dispatch, 2 combine), [3] writer rank, [4] entries arrived
#define IE_ERR_RECV_COUNT 4u    // [2] records announced (low 32 bits), [3] capacity
#define IE_ERR_COMBINE_ROWS 5u  // [2] rows given, [3] rows received
#define IE_ERR_RING_FULL 6u     // [2] destination rank, [3] phase
#define IE_ERR_RELEASE 7u       // [2] block: combine's block 0 never released it (deadline)

#define IE_FLAG_DROP_OUT_OF_RANGE 1u
#define IE_FLAG_WEIGHTED 2u

// Per-block trace slots.
#define IE_T_LAYOUT0 0   // layout start (block 0)
#define IE_T_LAYOUT1 1   // layout end
#define IE_T_DISP0 2     // dispatch start
#define IE_T_STAGED 3    // records for other nodes staged, their commands handed over
#define IE_T_INTRA 4     // records for this node stored, signalled
#define IE_T_RECVD 5     // block 0: every source's segment complete
#define IE_T_COPY0 6     // copy-out start
#define IE_T_COPY1 7     // copy-out end
#define IE_T_COMB0 8     // combine send start
#define IE_T_CSTAGED 9   // rows for other nodes staged, commands handed over
#define IE_T_CINTRA 10   // rows for this node stored, signalled
#define IE_T_RED0 11     // combine reduce start
#define IE_T_CRECVD 12   // every rank's rows complete
#define IE_T_RED1 13     // reduce end
#define IE_T_SLOTS 16

struct IeLayout {
    uint64_t disp_in;   // segment s at disp_in + s * seg_rec
    uint64_t comb_in;   // segment e at comb_in + e * seg_comb
    uint64_t out_disp;  // staging for destination d at out_disp + d * seg_rec
    uint64_t out_comb;  // staging for source s at out_comb + s * seg_comb
    uint64_t seg_rec;   // max_tokens * rec_bytes
    uint64_t seg_comb;  // max_tokens * comb_bytes
    uint64_t ctr;       // other nodes' counter pairs, u64 [2][W][2]
    uint64_t sig;       // this rank's outgoing pairs, u64 [2][W][2]
};

struct IeRank {
    uint32_t rank;
    uint32_t num_tokens;
    uint32_t comb_rows;  // rows the combine input holds
    uint32_t pad;
    uint64_t x;          // [T, row_bytes]
    uint64_t weights;    // [T, K] f32 or 0
    uint64_t idx;        // [T, K] of idx_size
    uint64_t scales;     // [T, scale_bytes] or 0
    uint64_t mask;       // u64 [max_tokens]: bit d = the token goes to rank d
    uint64_t pre;        // u32 [max_tokens + 1, W]: tokens before t sent to d
    uint64_t cnt;        // u32 [W] tokens sent to each rank
    uint64_t recv_cnt;   // u32 [W] records received from each rank
    uint64_t recv_base;  // u32 [W] first output row of each source
    uint64_t recv_pos;   // u32 [max_recv] index of output row i in its source's segment
    uint64_t done;       // u32 [4 + 2W]: blocks finished per zeroing kernel [0], [1]; u64 at
                         // byte 8: combine's release word (the epoch block 0 saw every
                         // segment in); then blocks that staged for each remote destination
                         // (dispatch [W], combine [W])
    uint64_t out_x;      // [max_recv, row_bytes]
    uint64_t out_w;      // [max_recv, K] f32 or 0
    uint64_t out_idx;    // [max_recv, K] of idx_size
    uint64_t out_scales; // [max_recv, scale_bytes] or 0
    uint64_t out_src;    // i32 [max_recv]
    uint64_t comb_x;     // [N, H] of comb_elem
    uint64_t comb_w;     // [N, K] f32 or 0
    uint64_t comb_out;   // [T, H] of out_elem
    uint64_t comb_out_w; // [T, K] f32 or 0
    uint64_t status;     // u32 [8]: recv count, error code, details
    uint64_t trace;      // u64 stamps (see the top), or 0
    RingDev ring;        // this rank's proxy ring
};

struct IeParams {
    uint64_t win[IE_MAX_WORLD];     // every rank's window as this process addresses it (0: not reachable)
    uint64_t dev_ctr[IE_MAX_WORLD]; // every same-node rank's device counter block (0: other node)
    IeLayout lay;
    uint64_t ranks;      // IeRank[num_local]
    uint64_t timeout_ns;
    uint32_t num_local;
    uint32_t world;
    uint32_t gpn;        // ranks per node
    uint32_t blocks_per_rank;
    uint32_t row_bytes;  // hidden * element size, a multiple of 16
    uint32_t hidden;     // a multiple of 8
    uint32_t top_k;
    uint32_t idx_size;   // 4 or 8
    uint32_t scale_bytes;// a multiple of 4
    uint32_t experts_per_rank;
    uint32_t max_tokens;
    uint32_t max_recv;
    uint32_t rec_bytes;  // a multiple of 16
    uint32_t comb_bytes; // a multiple of 16
    uint32_t comb_elem;  // 2 bf16, 4 f32
    uint32_t out_elem;   // 2 bf16, 4 f32
    uint32_t flags;
    uint32_t trace_blocks; // per-block trace rows per rank
    uint64_t epoch;      // this call's number (non-zero, increasing): combine's block-0 release word
};

MORI_DEVICE uint64_t ie_ctr(uint32_t world, uint32_t phase, uint32_t w, uint32_t which) {
    return 8ull * (((uint64_t)phase * world + w) * 2 + which);
}

MORI_DEVICE bool ie_same_node(const IeParams& p, uint32_t a, uint32_t b) { return a / p.gpn == b / p.gpn; }

MORI_DEVICE void ie_error(uint32_t* status, uint32_t code, uint32_t a, uint32_t b, uint32_t c) {
    if (mori_atomic_cas_system_u32(status + 1, IE_OK, code) == IE_OK) {
        ((volatile uint32_t*)status)[2] = a;
        ((volatile uint32_t*)status)[3] = b;
        ((volatile uint32_t*)status)[4] = c;
    }
}

MORI_DEVICE bool ie_failed(const uint32_t* status) { return ((const volatile uint32_t*)status)[1] != IE_OK; }

MORI_DEVICE int64_t ie_load_idx(const IeParams& p, const uint8_t* idx, uint64_t i) {
    return p.idx_size == 8 ? ((const int64_t*)idx)[i] : (int64_t)((const int32_t*)idx)[i];
}

// Trace stamps (no-ops without a trace buffer): slot `k` of block b, by thread 0.
MORI_DEVICE void ie_stamp(const IeParams& p, const IeRank& a, uint32_t b, uint32_t k) {
    if (a.trace && b < p.trace_blocks && mori_thread_idx() == 0)
        ((volatile uint64_t*)a.trace)[4ull * p.world + (uint64_t)b * IE_T_SLOTS + k] = mori_clock_ns();
}
// Per-peer stamp `which` (0 pushed, 1 seen) of `phase` for peer q.
MORI_DEVICE void ie_stamp_peer(const IeParams& p, const IeRank& a, uint32_t phase, uint32_t which, uint32_t q) {
    if (a.trace) ((volatile uint64_t*)a.trace)[((uint64_t)phase * 2 + which) * p.world + q] = mori_clock_ns();
}

// Whether token t goes to rank d, and its index in d's segment then.
MORI_DEVICE int32_t ie_pos(const IeParams& p, const IeRank& a, uint32_t t, uint32_t d) {
    if (!((((const uint64_t*)a.mask)[t] >> d) & 1)) return -1;
    return (int32_t)((const uint32_t*)a.pre)[(uint64_t)t * p.world + d];
}

// The counter word of (phase, writer w, which) that this rank reads: the device block for a
// same-node writer, the window's pairs for another node's.
MORI_DEVICE const uint64_t* ie_own_ctr(const IeParams& p, const IeRank& a, uint32_t phase, uint32_t w, uint32_t which) {
    const uint64_t base = ie_same_node(p, a.rank, w) ? p.dev_ctr[a.rank] : p.win[a.rank] + p.lay.ctr;
    return (const uint64_t*)(base + ie_ctr(p.world, phase, w, which));
}

// Waits until segment (phase, writer w) of rank a is complete; returns its entries, or
// 0xffffffff after recording a timeout.
// Another node's pairs back off between reads (in host memory on the tcp path: thousands of GPU
// threads reading host memory in a tight loop slowed the engines' copies and commands).
MORI_DEVICE uint32_t ie_wait_segment(const IeParams& p, const IeRank& a, uint32_t phase, uint32_t w, uint64_t deadline) {
    const uint64_t* arrived = ie_own_ctr(p, a, phase, w, 0);
    const uint64_t* total = ie_own_ctr(p, a, phase, w, 1);
    const bool host = !ie_same_node(p, a.rank, w);
    for (;;) {
        const uint64_t t = mori_load_acquire_system(total);
        if (t != 0 && mori_load_acquire_system(arrived) == t - 1) return (uint32_t)(t - 1);
        if (ie_failed((const uint32_t*)a.status)) return 0xffffffffu;
        if (mori_clock_ns() > deadline) {
            ie_error((uint32_t*)a.status, IE_ERR_TIMEOUT, phase + 1, w, (uint32_t)mori_load_acquire_system(arrived));
            return 0xffffffffu;
        }
        if (host) mori_backoff();
    }
}

// A counter operation at same-node rank d for (phase, writer me): an atomic on d's device
// block (after the caller's fence).
MORI_DEVICE void ie_signal(const IeParams& p, const IeRank& a, uint32_t d, uint32_t phase, uint32_t which, uint64_t value) {
    uint64_t* c = (uint64_t*)(p.dev_ctr[d] + ie_ctr(p.world, phase, a.rank, which));
    if (which == 0) mori_atomic_add_system(c, value); else mori_store_release_system(c, value);
}

// Called by every block of the rank for peer d after its entries for d are staged (fenced):
// the last block to finish writes the pair (count, count + 1) to its window's sig slot and
// hands the whole segment (`count` entries of `stride` bytes from `local` to `remote`) to the
// proxy as one command whose tail write carries the pair into d's window once the bytes
// landed. One command per (rank, remote peer, phase).
MORI_DEVICE void ie_stage_done(const IeParams& p, const IeRank& a, uint32_t d, uint32_t phase, uint32_t count, uint64_t stride,
                               uint64_t local, uint64_t remote, uint64_t deadline) {
    uint32_t* staged = (uint32_t*)a.done + 4 + phase * p.world + d;
    if (mori_atomic_add_system_u32(staged, 1) != p.blocks_per_rank - 1) return;
    *(volatile uint32_t*)staged = 0;
    ie_stamp_peer(p, a, phase, 0, d); // the hand-over starts (stamped first: the proxy may finish before a later stamp)
    const uint64_t sig = p.lay.sig + ((uint64_t)phase * p.world + d) * 16;
    volatile uint64_t* pair = (volatile uint64_t*)(p.win[a.rank] + sig);
    pair[0] = count;
    pair[1] = (uint64_t)count + 1;
    mori_fence_system(); // every block's staged entries and the pair before the command that carries them
    if (mori_ring_push(a.ring, d, RING_OP_TAIL, local, remote, (uint64_t)count * stride, p.lay.ctr + ie_ctr(p.world, phase, a.rank, 0),
                       sig, deadline))
        ie_error((uint32_t*)a.status, IE_ERR_RING_FULL, d, phase + 1, 0);
}

// Zeroes this rank's counters of `phase` (device block and the window's pairs).
MORI_DEVICE void ie_zero_phase(const IeParams& p, const IeRank& a, uint32_t phase) {
    for (uint32_t w = mori_thread_idx(); w < p.world; w += mori_block_dim()) {
        for (uint32_t which = 0; which < 2; which++) {
            *(volatile uint64_t*)(p.dev_ctr[a.rank] + ie_ctr(p.world, phase, w, which)) = 0;
            *(volatile uint64_t*)(p.win[a.rank] + p.lay.ctr + ie_ctr(p.world, phase, w, which)) = 0;
        }
    }
    mori_fence_system();
}

// Whether the calling block is the last of its rank to finish kernel `k` (then it resets the
// count for the next call). Every thread of the block gets the answer.
struct IeLast {
    uint32_t last;
};
MORI_DEVICE bool ie_last_block(const IeParams& p, const IeRank& a, uint32_t k, IeLast& sh) {
    mori_sync_block();
    if (mori_thread_idx() == 0) {
        mori_fence_system();
        uint32_t* done = (uint32_t*)a.done + k;
        sh.last = mori_atomic_add_system_u32(done, 1) == p.blocks_per_rank - 1;
        if (sh.last) *(volatile uint32_t*)done = 0;
    }
    mori_sync_block();
    return sh.last != 0;
}

// Copies `bytes` (a multiple of 4) from src to dst with the lanes of a 32-thread group, 16
// bytes per lane and step where both are 16-aligned.
MORI_DEVICE void ie_copy_group(uint8_t* dst, const uint8_t* src, uint32_t bytes, uint32_t lane) {
    const uint32_t v16 = ((((uint64_t)dst | (uint64_t)src) & 15) == 0) ? bytes / 16 : 0;
    for (uint32_t v = lane; v < v16; v += 32) ((mori_vec16_t*)dst)[v] = ((const mori_vec16_t*)src)[v];
    for (uint32_t w = v16 * 4 + lane; w < bytes / 4; w += 32) ((uint32_t*)dst)[w] = ((const uint32_t*)src)[w];
}

MORI_DEVICE void ie_zero_group(uint8_t* dst, uint32_t bytes, uint32_t lane) {
    for (uint32_t w = lane; w < bytes / 4; w += 32) ((uint32_t*)dst)[w] = 0;
}

struct IeLayoutSh {
    uint64_t m[512];       // the tile's masks
    uint32_t c[16][32];    // per group: each lane's count in the tile
    uint32_t run[IE_MAX_WORLD]; // tokens sent to d before the tile
};

MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ie_layout(IeParams p) {
    MORI_SHARED_STRUCT(IeLayoutSh, sh);
    const IeRank a = ((const IeRank*)p.ranks)[mori_block_idx()];
    uint32_t* status = (uint32_t*)a.status;
    const uint32_t T = a.num_tokens, W = p.world, tid = mori_thread_idx(), nthreads = mori_block_dim();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
    const int64_t num_experts = (int64_t)p.experts_per_rank * W;
    uint64_t* mask = (uint64_t*)a.mask;
    uint32_t* pre = (uint32_t*)a.pre;
    const uint8_t* idx = (const uint8_t*)a.idx;
    ie_stamp(p, a, 0, IE_T_LAYOUT0);
    if (tid == 0) {
        status[0] = 0;
        status[1] = IE_OK;
    }
    for (uint32_t d = tid; d < W; d += nthreads) sh.run[d] = 0;
    mori_sync_block();
    // A tile of `nthreads` tokens at a time: masks by one thread per token, then per
    // destination one group, each lane counting `nwarps` consecutive tokens of the tile.
    for (uint32_t tile = 0; tile < T; tile += nthreads) {
        const uint32_t t = tile + tid;
        uint64_t m = 0;
        if (t < T) {
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
        for (uint32_t d = warp; d < W; d += nwarps) {
            uint32_t c = 0;
            for (uint32_t i = 0; i < nwarps; i++) c += (uint32_t)(sh.m[first + i] >> d) & 1;
            sh.c[warp][lane] = c;
            mori_sync_group32();
            uint32_t before = sh.run[d];
            for (uint32_t j = 0; j < lane; j++) before += sh.c[warp][j];
            for (uint32_t i = 0; i < nwarps; i++) {
                const uint32_t tt = tile + first + i;
                if (tt < T) pre[(uint64_t)tt * W + d] = before;
                before += (uint32_t)(sh.m[first + i] >> d) & 1;
            }
            mori_sync_group32();
            if (lane == 31) sh.run[d] = before;
            mori_sync_group32();
        }
        mori_sync_block();
    }
    for (uint32_t d = tid; d < W; d += nthreads) {
        pre[(uint64_t)T * W + d] = sh.run[d];
        ((uint32_t*)a.cnt)[d] = sh.run[d];
    }
    ie_stamp(p, a, 0, IE_T_LAYOUT1);
}

struct IeSpan {
    uint32_t n[IE_MAX_WORLD];     // entries of this block per peer
    uint32_t first[IE_MAX_WORLD]; // index of its first entry in the peer's segment
    uint32_t last;
};

// Writes token t's record (rows, weights, ids, scales, flat source) at `rec` with the lanes
// of one 32-thread group.
MORI_DEVICE void ie_put_record(const IeParams& p, const IeRank& a, uint32_t t, uint8_t* rec, uint32_t lane) {
    const uint32_t kw = p.top_k * 4, ki = p.top_k * p.idx_size;
    ie_copy_group(rec, (const uint8_t*)a.x + (uint64_t)t * p.row_bytes, p.row_bytes, lane);
    uint8_t* m = rec + p.row_bytes;
    if (a.weights) ie_copy_group(m, (const uint8_t*)a.weights + (uint64_t)t * kw, kw, lane);
    else ie_zero_group(m, kw, lane);
    ie_copy_group(m + kw, (const uint8_t*)a.idx + (uint64_t)t * ki, ki, lane);
    if (p.scale_bytes) {
        if (a.scales) ie_copy_group(m + kw + ki, (const uint8_t*)a.scales + (uint64_t)t * p.scale_bytes, p.scale_bytes, lane);
        else ie_zero_group(m + kw + ki, p.scale_bytes, lane);
    }
    if (lane == 0) *(int32_t*)(m + kw + ki + p.scale_bytes) = (int32_t)(a.rank * p.max_tokens + t);
}

MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ie_dispatch(IeParams p) {
    MORI_SHARED_STRUCT(IeSpan, sh);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, W = p.world, tid = mori_thread_idx(), nthreads = mori_block_dim();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
    uint32_t* status = (uint32_t*)a.status;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    ie_stamp(p, a, b, IE_T_DISP0);
    // (An out-of-range id recorded by the layout does not stop the dispatch: it was skipped.)
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
    // Records for other nodes first: one 32-thread group per token, staged in this rank's
    // window; the last block to stage for a peer hands the peer's segment to the proxy.
    for (uint32_t t = t0 + warp; t < t1; t += nwarps)
        for (uint32_t d = 0; d < W; d++) {
            if (ie_same_node(p, r, d)) continue;
            const int32_t q = ie_pos(p, a, t, d);
            if (q >= 0) ie_put_record(p, a, t, (uint8_t*)(p.win[r] + p.lay.out_disp + d * p.lay.seg_rec + (uint64_t)q * p.rec_bytes), lane);
        }
    mori_fence_system();
    mori_sync_block();
    for (uint32_t d = tid; d < W; d += nthreads)
        if (!ie_same_node(p, r, d))
            ie_stage_done(p, a, d, 0, ((const uint32_t*)a.cnt)[d], p.rec_bytes, p.lay.out_disp + d * p.lay.seg_rec,
                          p.lay.disp_in + r * p.lay.seg_rec, deadline);
    ie_stamp(p, a, b, IE_T_STAGED);
    // Then this node's ranks, by P2P stores into their windows, while the proxy works.
    for (uint32_t t = t0 + warp; t < t1; t += nwarps)
        for (uint32_t d = 0; d < W; d++) {
            if (!ie_same_node(p, r, d)) continue;
            const int32_t q = ie_pos(p, a, t, d);
            if (q >= 0) ie_put_record(p, a, t, (uint8_t*)(p.win[d] + p.lay.disp_in + r * p.lay.seg_rec + (uint64_t)q * p.rec_bytes), lane);
        }
    // Every record of the block is visible before its counter moves.
    mori_fence_system();
    mori_sync_block();
    for (uint32_t d = tid; d < W; d += nthreads)
        if (ie_same_node(p, r, d) && sh.n[d]) ie_signal(p, a, d, 0, 0, sh.n[d]);
    ie_stamp(p, a, b, IE_T_INTRA);
    if (b != 0) return;
    mori_sync_block(); // the INTRA stamp (thread 0) before any wait's "seen" stamp
    // Block 0 receives: every source's segment complete, then the first output row of each.
    uint32_t* rc = (uint32_t*)a.recv_cnt;
    for (uint32_t s = tid; s < W; s += nthreads) {
        rc[s] = ie_wait_segment(p, a, 0, s, deadline);
        ie_stamp_peer(p, a, 0, 1, s);
    }
    mori_sync_block();
    if (tid == 0 && !ie_failed(status)) {
        uint64_t base = 0;
        for (uint32_t s = 0; s < W; s++) {
            ((uint32_t*)a.recv_base)[s] = (uint32_t)base;
            base += rc[s];
        }
        if (base > p.max_recv) ie_error(status, IE_ERR_RECV_COUNT, (uint32_t)base, p.max_recv, 0);
        else status[0] = (uint32_t)base;
    }
    ie_stamp(p, a, b, IE_T_RECVD);
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
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, tid = mori_thread_idx();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = mori_block_dim() / 32;
    const uint32_t* status = (const uint32_t*)a.status;
    ie_stamp(p, a, b, IE_T_COPY0);
    const bool ok = !ie_failed(status);
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
        if (lane == 0) {
            ((int32_t*)a.out_src)[i] = *(const int32_t*)(m + kw + ki + p.scale_bytes);
            ((uint32_t*)a.recv_pos)[i] = q;
        }
    }
    if (ie_last_block(p, a, 0, sh) && ok) ie_zero_phase(p, a, 0);
    ie_stamp(p, a, b, IE_T_COPY1);
}

// Writes received row i (H elements, then K f32 weights or zeros) at `row` with one group.
MORI_DEVICE void ie_put_row(const IeParams& p, const IeRank& a, uint32_t i, uint8_t* row, uint32_t lane) {
    const uint32_t xb = p.hidden * p.comb_elem, kw = p.top_k * 4;
    ie_copy_group(row, (const uint8_t*)a.comb_x + (uint64_t)i * xb, xb, lane);
    if (a.comb_w) ie_copy_group(row + xb, (const uint8_t*)a.comb_w + (uint64_t)i * kw, kw, lane);
    else ie_zero_group(row + xb, kw, lane);
}

MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ie_combine_send(IeParams p) {
    MORI_SHARED_STRUCT(IeSpan, sh);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, W = p.world, tid = mori_thread_idx(), nthreads = mori_block_dim();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
    uint32_t* status = (uint32_t*)a.status;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    ie_stamp(p, a, b, IE_T_COMB0);
    if (ie_failed(status)) return;
    const uint32_t N = status[0];
    if (N > a.comb_rows) {
        if (tid == 0 && b == 0) ie_error(status, IE_ERR_COMBINE_ROWS, a.comb_rows, N, 0);
        return;
    }
    const uint32_t i0 = (uint32_t)((uint64_t)N * b / p.blocks_per_rank), i1 = (uint32_t)((uint64_t)N * (b + 1) / p.blocks_per_rank);
    const uint32_t* base = (const uint32_t*)a.recv_base;
    const uint32_t* rc = (const uint32_t*)a.recv_cnt;
    for (uint32_t s = tid; s < W; s += nthreads) {
        const uint32_t lo = base[s] > i0 ? base[s] : i0, hi = base[s] + rc[s] < i1 ? base[s] + rc[s] : i1;
        sh.n[s] = hi > lo ? hi - lo : 0;
        sh.first[s] = hi > lo ? lo - base[s] : 0;
        if (b == 0 && ie_same_node(p, r, s)) ie_signal(p, a, s, 1, 1, (uint64_t)rc[s] + 1);
    }
    mori_sync_block();
    // Rows for other nodes first (staged; commands as soon as every block staged), then this
    // node's by P2P stores.
    for (uint32_t pass = 0; pass < 2; pass++) {
        for (uint32_t i = i0 + warp; i < i1; i += nwarps) {
            const uint32_t s = ie_source_of(p, a, i);
            if (ie_same_node(p, r, s) != (pass == 1)) continue;
            const uint32_t q = ((const uint32_t*)a.recv_pos)[i];
            uint8_t* row = pass == 1 ? (uint8_t*)(p.win[s] + p.lay.comb_in + r * p.lay.seg_comb + (uint64_t)q * p.comb_bytes)
                                     : (uint8_t*)(p.win[r] + p.lay.out_comb + s * p.lay.seg_comb + (uint64_t)q * p.comb_bytes);
            ie_put_row(p, a, i, row, lane);
        }
        mori_fence_system();
        mori_sync_block();
        for (uint32_t s = tid; s < W; s += nthreads) {
            if (pass == 0 && !ie_same_node(p, r, s))
                ie_stage_done(p, a, s, 1, rc[s], p.comb_bytes, p.lay.out_comb + s * p.lay.seg_comb, p.lay.comb_in + r * p.lay.seg_comb,
                              deadline);
            if (pass == 1 && ie_same_node(p, r, s) && sh.n[s]) ie_signal(p, a, s, 1, 0, sh.n[s]);
        }
        ie_stamp(p, a, b, pass == 0 ? IE_T_CSTAGED : IE_T_CINTRA);
    }
}

MORI_DEVICE float ie_bf16_to_f32(uint32_t bits16) { return __builtin_bit_cast(float, bits16 << 16); }
MORI_DEVICE uint32_t ie_f32_to_bf16(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40; // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1);                                // round to nearest even
    return u >> 16;
}

// Per 32-thread group: the token's contributing ranks, compacted (ascending), with their rows
// and factors.
struct IeGather {
    uint64_t row[16][IE_MAX_WORLD];
    float f[16][IE_MAX_WORLD];
    uint32_t n[16];
    uint32_t last;
};

MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ie_combine_recv(IeParams p) {
    MORI_SHARED_STRUCT(IeLast, sh);
    MORI_SHARED_STRUCT(IeGather, gs);
    const uint32_t local = mori_block_idx() / p.blocks_per_rank, b = mori_block_idx() % p.blocks_per_rank;
    const IeRank a = ((const IeRank*)p.ranks)[local];
    const uint32_t r = a.rank, W = p.world, tid = mori_thread_idx();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = mori_block_dim() / 32;
    uint32_t* status = (uint32_t*)a.status;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    ie_stamp(p, a, b, IE_T_RED0);
    bool ok = !ie_failed(status);
    // Block 0 waits for every rank's rows, then posts this call's epoch in device memory; the
    // other blocks wait for that word (one poller per segment, not one per block).
    if (ok && b == 0) {
        for (uint32_t e = tid; e < W; e += mori_block_dim()) {
            ie_wait_segment(p, a, 1, e, deadline);
            ie_stamp_peer(p, a, 1, 1, e);
        }
        mori_sync_block();
        if (tid == 0) {
            mori_fence_system();
            mori_store_release_system((uint64_t*)a.done + 1, p.epoch);
        }
    } else if (ok && tid == 0) {
        // A deadline past block 0's, so that block 0's timeout (naming the missing writer)
        // is the one recorded.
        const uint64_t late = deadline + 100000000ull;
        for (;;) {
            if (mori_load_acquire_system((const uint64_t*)a.done + 1) == p.epoch || ie_failed(status)) break;
            if (mori_clock_ns() > late) {
                ie_error(status, IE_ERR_RELEASE, b, 0, 0);
                break;
            }
        }
    }
    mori_sync_block();
    ie_stamp(p, a, b, IE_T_CRECVD);
    ok = !ie_failed(status);
    const uint32_t T = ok ? a.num_tokens : 0;
    const uint32_t t0 = (uint32_t)((uint64_t)T * b / p.blocks_per_rank), t1 = (uint32_t)((uint64_t)T * (b + 1) / p.blocks_per_rank);
    const uint8_t* idx = (const uint8_t*)a.idx;
    const bool weighted = (p.flags & IE_FLAG_WEIGHTED) != 0;
    const uint32_t xb = p.hidden * p.comb_elem;
    const int64_t num_experts = (int64_t)p.experts_per_rank * W;
    for (uint32_t t = t0 + warp; t < t1; t += nwarps) {
        // The contributing ranks' rows and factors, then compacted by lane 0 (in place).
        for (uint32_t e = lane; e < W; e += 32) {
            const int32_t q = ie_pos(p, a, t, e);
            const uint64_t row = q < 0 ? 0 : p.win[r] + p.lay.comb_in + e * p.lay.seg_comb + (uint64_t)q * p.comb_bytes;
            float f = 1.0f;
            if (weighted && q >= 0) {
                const float* w = (const float*)(row + xb);
                f = 0.0f;
                for (uint32_t k = 0; k < p.top_k; k++) {
                    const int64_t id = ie_load_idx(p, idx, (uint64_t)t * p.top_k + k);
                    if (id >= 0 && id < num_experts && (uint32_t)(id / p.experts_per_rank) == e) f += w[k];
                }
            }
            gs.row[warp][e] = row;
            gs.f[warp][e] = f;
        }
        mori_sync_group32();
        if (lane == 0) {
            uint32_t n = 0;
            for (uint32_t e = 0; e < W; e++) {
                if (!gs.row[warp][e]) continue;
                gs.row[warp][n] = gs.row[warp][e];
                gs.f[warp][n] = gs.f[warp][e];
                n++;
            }
            gs.n[warp] = n;
        }
        mori_sync_group32();
        const uint32_t nd = gs.n[warp];
        uint8_t* out = (uint8_t*)a.comb_out + (uint64_t)t * p.hidden * p.out_elem;
        // 8 columns per lane and step, summed over the ranks in ascending order.
        for (uint32_t h0 = lane * 8; h0 < p.hidden; h0 += 256) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (uint32_t j = 0; j < nd; j++) {
                const uint8_t* src = (const uint8_t*)gs.row[warp][j] + (uint64_t)h0 * p.comb_elem;
                const float f = gs.f[warp][j];
                if (p.comb_elem == 2) {
                    const mori_vec16_t v = *(const mori_vec16_t*)src;
                    const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
                    for (int i = 0; i < 4; i++) {
                        acc[2 * i] += f * ie_bf16_to_f32(wv[i] & 0xffffu);
                        acc[2 * i + 1] += f * ie_bf16_to_f32(wv[i] >> 16);
                    }
                } else {
                    const mori_vec16_t v0 = ((const mori_vec16_t*)src)[0], v1 = ((const mori_vec16_t*)src)[1];
                    const uint32_t wv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
                    for (int i = 0; i < 8; i++) acc[i] += f * __builtin_bit_cast(float, wv[i]);
                }
            }
            if (p.out_elem == 2) {
                mori_vec16_t v;
                v.x = ie_f32_to_bf16(acc[0]) | (ie_f32_to_bf16(acc[1]) << 16);
                v.y = ie_f32_to_bf16(acc[2]) | (ie_f32_to_bf16(acc[3]) << 16);
                v.z = ie_f32_to_bf16(acc[4]) | (ie_f32_to_bf16(acc[5]) << 16);
                v.w = ie_f32_to_bf16(acc[6]) | (ie_f32_to_bf16(acc[7]) << 16);
                *(mori_vec16_t*)(out + (uint64_t)h0 * 2) = v;
            } else {
                mori_vec16_t v0, v1;
                v0.x = __builtin_bit_cast(uint32_t, acc[0]); v0.y = __builtin_bit_cast(uint32_t, acc[1]);
                v0.z = __builtin_bit_cast(uint32_t, acc[2]); v0.w = __builtin_bit_cast(uint32_t, acc[3]);
                v1.x = __builtin_bit_cast(uint32_t, acc[4]); v1.y = __builtin_bit_cast(uint32_t, acc[5]);
                v1.z = __builtin_bit_cast(uint32_t, acc[6]); v1.w = __builtin_bit_cast(uint32_t, acc[7]);
                *(mori_vec16_t*)(out + (uint64_t)h0 * 4) = v0;
                *(mori_vec16_t*)(out + (uint64_t)h0 * 4 + 16) = v1;
            }
        }
        if (a.comb_out_w) {
            for (uint32_t k = lane; k < p.top_k; k += 32) {
                float sw = 0.0f;
                for (uint32_t j = 0; j < nd; j++) sw += ((const float*)(gs.row[warp][j] + xb))[k];
                ((float*)a.comb_out_w)[(uint64_t)t * p.top_k + k] = sw;
            }
        }
        mori_sync_group32();
    }
    if (ie_last_block(p, a, 1, sh) && ok) ie_zero_phase(p, a, 1);
    ie_stamp(p, a, b, IE_T_RED1);
}

#ifdef MORI_HOST_EMU
MORI_EMU_EXPORT(mori_ie_layout, IeParams)
MORI_EMU_EXPORT(mori_ie_dispatch, IeParams)
MORI_EMU_EXPORT(mori_ie_dispatch_recv, IeParams)
MORI_EMU_EXPORT(mori_ie_combine_send, IeParams)
MORI_EMU_EXPORT(mori_ie_combine_recv, IeParams)
#endif
