// ep_internode.h: the layout, ABI structs and device helpers shared by the inter-node GPU
// kernels of ep_internode.cu (AsyncLL, V1-LL, V1). The scheme, the window and the counters are
// described there; crates/ep/src/gpu_internode/abi.rs mirrors the structs.
#pragma once
#include "ep_math.h"
#include "mori_ring.h"

#define IE_MAX_WORLD 64

#define IE_OK 0u
#define IE_ERR_EXPERT_RANGE 1u  // [2] token, [3] slot, [4] id (low 32 bits)
#define IE_ERR_TIMEOUT 3u       // [2] phase (1 dispatch, 2 combine, 3 relay gather), [3] writer (rank; gather: node * gpn + local index), [4] entries arrived
#define IE_ERR_RECV_COUNT 4u    // [2] records announced (low 32 bits), [3] capacity
#define IE_ERR_COMBINE_ROWS 5u  // [2] rows given, [3] rows received
#define IE_ERR_RING_FULL 6u     // [2] destination rank, [3] phase
#define IE_ERR_RELAY 8u         // [2] origin rank, [3] record index, [4] destination rank named (a relay record out of bounds)
#define IE_ERR_RELAY_SEG 9u     // [2] origin rank, [3] records its pair announced (a relay segment's count or header out of bounds)
#define IE_ERR_SEG_COUNT 10u    // [2] writer rank, [3] entries its counter announced, [4] capacity (max_tokens)

#define IE_FLAG_DROP_OUT_OF_RANGE 1u
#define IE_FLAG_WEIGHTED 2u
#define IE_FLAG_RELAY 4u        // V1-LL and V1: other nodes through the same-local-index relay
#define IE_FLAG_DEDUP 8u        // with IE_FLAG_RELAY, V1: one record per (token, node), not per (token, destination)
#define IE_FLAG_COMB_ROWS 16u   // the combine input is comb_bytes rows (H elements, K f32
                                // weights or zeros) in this rank's window at out_comb, row i at
                                // out_comb + i * comb_bytes (IeRank.comb_x points there), and
                                // combine stores no row: a same-node source's sum reads its rows
                                // there in place (through rbase), the rank only signals them
                                // ready; AsyncLL: another node's source's rows are contiguous
                                // there, so the proxy moves them from it; V1, V1-LL: the relay
                                // reads the rows for other nodes' sources in place too (through
                                // the destination's rbase; the launch serves every rank of the
                                // node, so it waits for no gather counter) and stages its
                                // partials in its own gather area, which is then unused
#define IE_FLAG_RECV_WIN 32u    // the received records stay in the window (disp_in, source s's
                                // recv_cnt[s] records at disp_in + s * seg_rec, recv_base[s] its
                                // first output row): no copy-out kernel runs, and the last block
                                // of mori_ie_dispatch zeroes the dispatch counters

// Index in IeRank.done (u32) of mori_ie_combine_relay's finished-block count (V1, V1-LL:
// zeroes the gather counters).
#define IE_DONE_GATHER(world) (4u + 2u * (world))
// Index in IeRank.done of mori_ie_combine_stage's finished-block count (V1, V1-LL: its last
// block counts the rows for other nodes into the relays' gather counters).
#define IE_DONE_CSTAGED(world) (5u + 2u * (world))
// Index in IeRank.done of mori_ie_dispatch_stage's finished-block count (its last block hands
// the staged records over).
#define IE_DONE_STAGED 3u

// Per-block trace slots.
#define IE_T_LAYOUT0 0   // layout of the block's share start (dispatch staging kernel)
#define IE_T_LAYOUT1 1   // layout of the block's share end
#define IE_T_DISP0 2     // dispatch staging start
#define IE_T_STAGED 3    // dispatch staging end: records for other nodes staged
#define IE_T_INTRA 4     // records for this node stored, signalled
#define IE_T_RECVD 5     // block 0: every source's segment complete
#define IE_T_COPY0 6     // copy-out start
#define IE_T_COPY1 7     // copy-out end
#define IE_T_COMB0 8     // combine staging start
#define IE_T_CSTAGED 9   // combine staging end: every row stored or staged
#define IE_T_CINTRA 10   // combine send: this node's rows signalled, the other nodes' handed over
#define IE_T_RED0 11     // block 0, end of combine send: its wait for every rank's rows starts
#define IE_T_CRECVD 12   // combine sum start (block 0: also the end of its wait, overwritten)
#define IE_T_RED1 13     // combine sum end
#define IE_T_FWD1 14     // V1, V1-LL: this rank's relay forwarding done (dispatch)
#define IE_T_RRED1 15    // V1, V1-LL: this rank's relay partial sums handed over (combine relay)
#define IE_T_DISP1 16    // dispatch start (stores for this node's ranks)
#define IE_T_COMB1 17    // combine send start (signals the stored rows)
#define IE_T_RRED0 18    // V1, V1-LL: this rank's relay partial sums start (combine relay kernel)
#define IE_T_SLOTS 19

struct IeLayout {
    uint64_t disp_in;   // segment s at disp_in + s * seg_rec
    uint64_t comb_in;   // segment e at comb_in + e * seg_comb (V1-LL: rank e of another node is
                        // this rank's relay there, its segment the node's partial sums)
    uint64_t out_disp;  // staging for destination d at out_disp + d * seg_rec
    uint64_t out_comb;  // staging for source s at out_comb + s * seg_comb
    uint64_t seg_rec;   // max_tokens * rec_bytes
    uint64_t seg_comb;  // max_tokens * max(comb_bytes, part_bytes): V1-LL's partials land in comb_in
    uint64_t ctr;       // other nodes' counter pairs, u64 [2][W][2]
    uint64_t sig;       // this rank's outgoing pairs, u64 [2][W][2]
    uint64_t relay_in;  // V1-LL: relay segment of origin node m at relay_in + m * seg_relay
    uint64_t out_relay; // V1-LL: staging for the relay on node m at out_relay + m * seg_relay
    uint64_t seg_relay; // relay_hdr + max_tokens * (V1-LL gpn, V1 1) * rec_bytes (0 under AsyncLL)
    uint64_t relay_hdr; // bytes of a relay segment's header: u32 [gpn] records per destination, then u32 records
    uint64_t gather;    // V1-LL: rows for origin node m from local rank l at gather + (m * gpn + l) * seg_gather
                        // (IE_FLAG_COMB_ROWS: the relay's partials for origin node m at
                        // gather + m * gpn * seg_gather instead; part_bytes == comb_bytes)
    uint64_t seg_gather; // max_tokens * comb_bytes (0 under AsyncLL)
    uint64_t rbase;     // u32 [W]: this rank's first received row per source (recv_base), written
                        // by its dispatch; with IE_FLAG_COMB_ROWS a same-node source (V1,
                        // V1-LL: and a relay) reads its rows here in place: at
                        // out_comb + (rbase[s] + index) * comb_bytes
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
    uint64_t npre;       // u32 [max_tokens + 1, nodes]: tokens before t sent to node m (V1-LL)
    uint64_t cnt;        // u32 [W] tokens sent to each rank
    uint64_t recv_cnt;   // u32 [W] records received from each rank
    uint64_t recv_base;  // u32 [W] first output row of each source
    uint64_t done;       // u32 [6 + 2W]: blocks finished per zeroing kernel: [0] copy-out, [1]
                         // combine sum, [2] dispatch (IE_FLAG_RECV_WIN), [3] dispatch staging; then blocks
                         // that staged for each remote destination
                         // (dispatch [W], combine [W]); then IE_DONE_GATHER, IE_DONE_CSTAGED
    uint64_t out_x;      // [max_recv, row_bytes]
    uint64_t out_w;      // [max_recv, K] f32 or 0
    uint64_t out_idx;    // [max_recv, K] of idx_size
    uint64_t out_scales; // [max_recv, scale_bytes] or 0
    uint64_t out_src;    // i32 [max_recv]
    uint64_t comb_x;     // [N, H] of comb_elem (IE_FLAG_COMB_ROWS: [N] rows of comb_bytes)
    uint64_t comb_w;     // [N, K] f32 or 0 (IE_FLAG_COMB_ROWS: unused)
    uint64_t comb_out;   // [T, H] of out_elem
    uint64_t comb_out_w; // [T, K] f32 or 0
    uint64_t status;     // u32 [8]: recv count, error code, details
    uint64_t trace;      // u64 stamps (see ep_internode.cu), or 0
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
    uint32_t part_bytes; // V1-LL partial sum row: H comb_elem-byte elements, K f32, 16-aligned (0 under AsyncLL)
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

// Whether the rank's status word holds no fault, one answer for the whole block: thread 0 reads
// the word and the block barrier hands its reading to every thread. (Each thread reading it for
// itself could split a block, or a 32-thread group, when another block or the proxy records a
// fault between two reads: the threads that returned would leave the rest waiting at the next
// barrier.) Every thread of the block calls it, once per kernel, before its other barriers.
struct IeOk {
    uint32_t ok;
};
MORI_DEVICE bool ie_block_ok(const uint32_t* status, IeOk& sh) {
    if (mori_thread_idx() == 0) sh.ok = !ie_failed(status);
    mori_sync_block();
    return sh.ok != 0;
}

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

MORI_DEVICE bool ie_relay(const IeParams& p) { return (p.flags & IE_FLAG_RELAY) != 0; }
MORI_DEVICE bool ie_dedup(const IeParams& p) { return (p.flags & IE_FLAG_DEDUP) != 0; }
MORI_DEVICE bool ie_comb_rows(const IeParams& p) { return (p.flags & IE_FLAG_COMB_ROWS) != 0; }
MORI_DEVICE bool ie_recv_win(const IeParams& p) { return (p.flags & IE_FLAG_RECV_WIN) != 0; }
MORI_DEVICE uint32_t ie_nodes(const IeParams& p) { return p.world / p.gpn; }
// The relay of `src` on `node`: the rank there with src's local index.
MORI_DEVICE uint32_t ie_relay_of(const IeParams& p, uint32_t src, uint32_t node) { return node * p.gpn + src % p.gpn; }
// Whether a token of mask m counts in column c: rank c (c < W), or any rank of node c - W.
MORI_DEVICE uint32_t ie_col_bit(const IeParams& p, uint64_t m, uint32_t c) {
    if (c < p.world) return (uint32_t)(m >> c) & 1;
    const uint64_t g = p.gpn >= 64 ? ~0ull : (1ull << p.gpn) - 1;
    return ((m >> ((c - p.world) * p.gpn)) & g) != 0;
}

// Byte offset in a record of its tail: i32 flat source, then for V1-LL u32 destination rank,
// u32 index in the destination's segment, u32 index of the token among those sent to the
// node; for V1 u32 index of the token among those sent to the node, then per local index of
// the node u32 the index in that rank's segment (0xffffffff: not a destination).
MORI_DEVICE uint32_t ie_rec_tail(const IeParams& p) { return p.row_bytes + p.top_k * (4 + p.idx_size) + p.scale_bytes; }

// The counter word of (phase, writer w, which) that this rank reads: the window's pairs when
// `remote` (written by another node's proxy), else the device block.
MORI_DEVICE const uint64_t* ie_own_ctr(const IeParams& p, const IeRank& a, uint32_t phase, uint32_t w, uint32_t which, bool remote) {
    const uint64_t base = remote ? p.win[a.rank] + p.lay.ctr : p.dev_ctr[a.rank];
    return (const uint64_t*)(base + ie_ctr(p.world, phase, w, which));
}

// Waits until segment (phase, writer w) of rank a is complete; returns its entries, or
// 0xffffffff after recording a timeout. `remote`: the pair another node's proxy writes.
// Another node's pairs back off between reads (in host memory on the tcp path: thousands of GPU
// threads reading host memory in a tight loop slowed the engines' copies and commands).
MORI_DEVICE uint32_t ie_wait_segment(const IeParams& p, const IeRank& a, uint32_t phase, uint32_t w, bool remote, uint64_t deadline) {
    const uint64_t* arrived = ie_own_ctr(p, a, phase, w, 0, remote);
    const uint64_t* total = ie_own_ctr(p, a, phase, w, 1, remote);
    const bool host = remote;
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

// A counter operation at same-node rank d for (phase, writer slot w): an atomic on d's device
// block (after the caller's fence).
MORI_DEVICE void ie_signal_w(const IeParams& p, uint32_t d, uint32_t phase, uint32_t w, uint32_t which, uint64_t value) {
    uint64_t* c = (uint64_t*)(p.dev_ctr[d] + ie_ctr(p.world, phase, w, which));
    if (which == 0) mori_atomic_add_system(c, value); else mori_store_release_system(c, value);
}
// The same with this rank as the writer.
MORI_DEVICE void ie_signal(const IeParams& p, const IeRank& a, uint32_t d, uint32_t phase, uint32_t which, uint64_t value) {
    ie_signal_w(p, d, phase, a.rank, which, value);
}

// Hands the segment for peer d (`bytes` from `local` to `remote`, `count` entries, all staged
// and ordered before this call, at device scope at least) to the proxy: writes the pair
// (count, count + 1) to the window's sig slot and pushes one command whose tail write carries
// the pair into d's window once the bytes landed. One command per (rank, remote peer,
// phase): called once, by one thread.
MORI_DEVICE void ie_hand_over(const IeParams& p, const IeRank& a, uint32_t d, uint32_t phase, uint32_t count, uint64_t bytes,
                              uint64_t local, uint64_t remote, uint64_t deadline) {
    ie_stamp_peer(p, a, phase, 0, d); // the hand-over starts (stamped first: the proxy may finish before a later stamp)
    const uint64_t sig = p.lay.sig + ((uint64_t)phase * p.world + d) * 16;
    volatile uint64_t* pair = (volatile uint64_t*)(p.win[a.rank] + sig);
    pair[0] = count;
    pair[1] = (uint64_t)count + 1;
    // The ring push fences at system scope before it publishes the command: every block's
    // staged entries (ordered before the hand-over at device scope) and the pair go with it.
    // The command carries the pair's total too, so a proxy may store the two words itself.
    if (mori_ring_push(a.ring, d, RING_OP_TAIL, local, remote, bytes, p.lay.ctr + ie_ctr(p.world, phase, a.rank, 0),
                       sig, (uint64_t)count + 1, deadline))
        ie_error((uint32_t*)a.status, IE_ERR_RING_FULL, d, phase + 1, 0);
}

// Called by every block of the rank for peer d once its own entries for d are staged and
// fenced: the last block to get here hands the segment over (ie_hand_over), unless the rank
// has failed.
MORI_DEVICE void ie_stage_done(const IeParams& p, const IeRank& a, uint32_t d, uint32_t phase, uint32_t count, uint64_t bytes,
                               uint64_t local, uint64_t remote, uint64_t deadline) {
    uint32_t* staged = (uint32_t*)a.done + 4 + phase * p.world + d;
    // The block's entries (ordered by its threads before the barrier that led here) before
    // its count: a release in the counting thread itself.
    mori_fence_device();
    if (mori_atomic_add_device_u32(staged, 1) != p.blocks_per_rank - 1) return;
    *(volatile uint32_t*)staged = 0;
    // A rank that failed hands nothing over (the peer waits to its deadline); the fence makes
    // the other blocks' faults, recorded before they counted, visible here (every block is on
    // this device: device scope; the hand-over's ring push releases to the proxy).
    mori_fence_device();
    if (!ie_failed((const uint32_t*)a.status)) ie_hand_over(p, a, d, phase, count, bytes, local, remote, deadline);
}

// Zeroes this rank's counters of `phase` (device block, and for phases 0 and 1 the window's
// pairs; phase 2, the relay's gather counters, lives in the device block only).
MORI_DEVICE void ie_zero_phase(const IeParams& p, const IeRank& a, uint32_t phase) {
    for (uint32_t w = mori_thread_idx(); w < p.world; w += mori_block_dim()) {
        for (uint32_t which = 0; which < 2; which++) {
            *(volatile uint64_t*)(p.dev_ctr[a.rank] + ie_ctr(p.world, phase, w, which)) = 0;
            if (phase < 2) *(volatile uint64_t*)(p.win[a.rank] + p.lay.ctr + ie_ctr(p.world, phase, w, which)) = 0;
        }
    }
    mori_fence_system();
}

// Whether the calling block is the last of its rank to finish kernel `k` (then it resets the
// count for the next call). Every thread of the block gets the answer; the last block's
// threads see every other block's writes from before its count (each block fences before
// counting; the last one fences again after seeing the count, and the block barrier passes
// that on). Device scope: a rank's blocks all run on this device; what the last block then
// publishes to the host or another device it releases at system scope itself (the ring push's
// fence, a release store of a counter's total), and fences are cumulative.
struct IeLast {
    uint32_t last;
};
MORI_DEVICE bool ie_last_block(const IeParams& p, const IeRank& a, uint32_t k, IeLast& sh) {
    mori_sync_block();
    if (mori_thread_idx() == 0) {
        mori_fence_device();
        uint32_t* done = (uint32_t*)a.done + k;
        sh.last = mori_atomic_add_device_u32(done, 1) == p.blocks_per_rank - 1;
        if (sh.last) {
            mori_fence_device();
            *(volatile uint32_t*)done = 0;
        }
    }
    mori_sync_block();
    return sh.last != 0;
}

// Copies `bytes` (a multiple of 4) from src to dst with the lanes of a 32-thread group, 16
// bytes per lane and step where both are 16-aligned.
MORI_DEVICE void ie_copy_group(uint8_t* dst, const uint8_t* src, uint32_t bytes, uint32_t lane) {
    const uint32_t v16 = ((((uint64_t)dst | (uint64_t)src) & 15) == 0) ? bytes / 16 : 0;
    const mori_vec16_t* s = (const mori_vec16_t*)src;
    mori_vec16_t* d = (mori_vec16_t*)dst;
    uint32_t v = lane;
    // Four loads in flight per lane (the ranges never overlap): a row copy is bound by the
    // latency of each load (P2P and remote windows), and the compiler may not hoist a load
    // above the store before it.
    for (; v + 96 < v16; v += 128) {
        const mori_vec16_t x0 = s[v], x1 = s[v + 32], x2 = s[v + 64], x3 = s[v + 96];
        d[v] = x0;
        d[v + 32] = x1;
        d[v + 64] = x2;
        d[v + 96] = x3;
    }
    for (; v < v16; v += 32) d[v] = s[v];
    for (uint32_t w = v16 * 4 + lane; w < bytes / 4; w += 32) ((uint32_t*)dst)[w] = ((const uint32_t*)src)[w];
}

MORI_DEVICE void ie_zero_group(uint8_t* dst, uint32_t bytes, uint32_t lane) {
    for (uint32_t w = lane; w < bytes / 4; w += 32) ((uint32_t*)dst)[w] = 0;
}

// Per 32-thread group: the token's contributing ranks, compacted (ascending), with their rows
// and factors (V1-LL's combine: this node's ranks' rows and other nodes' partial sums).
struct IeGather {
    uint64_t row[16][IE_MAX_WORLD];
    float f[16][IE_MAX_WORLD];
    uint8_t node[16][IE_MAX_WORLD]; // V1-LL: the entry's node (its partial when not this rank's)
    uint32_t n[16];
    uint32_t last;
    // The relay's sums: a refused record seen by the block, its destination in the high 32
    // bits and its index + 1 in the low (0: none; one store, so the two always match),
    // reported once after the loop (an error call inside the look-up took registers from
    // the sums).
    uint64_t bad;
};

struct IeSpan {
    uint32_t n[IE_MAX_WORLD];     // entries of this block per peer
    uint32_t first[IE_MAX_WORLD]; // index of its first entry in the peer's segment
    uint32_t last;
};

// Destinations one record write serves at most (ie_put_records, at most 4). The emulated
// kernels use 2, so that their 3 ranks a node take the path of a full group and a rest (the
// GPU tests' 4 a node fill a group of 4).
#ifdef MORI_HOST_EMU
#define IE_FAN 2u
#else
#define IE_FAN 4u
#endif
static_assert(IE_FAN >= 1 && IE_FAN <= 4, "ie_put_records takes four destinations at most");

// Copies `bytes` (a multiple of 4) from src to dst[0..n) (n <= IE_FAN) with the lanes of a
// 32-thread group, each 16-byte vector (where all are 16-aligned) loaded once and stored n
// times, four loads in flight per lane as ie_copy_group.
MORI_DEVICE void ie_copy_group_fan(uint8_t* d0, uint8_t* d1, uint8_t* d2, uint8_t* d3, uint32_t n, const uint8_t* src, uint32_t bytes,
                                   uint32_t lane) {
    uint8_t* const d[4] = {d0, d1, d2, d3};
    uint64_t al = (uint64_t)src;
    for (uint32_t i = 0; i < IE_FAN; i++)
        if (i < n) al |= (uint64_t)d[i];
    const uint32_t v16 = (al & 15) == 0 ? bytes / 16 : 0;
    const mori_vec16_t* s = (const mori_vec16_t*)src;
    uint32_t v = lane;
    for (; v + 96 < v16; v += 128) {
        const mori_vec16_t x0 = s[v], x1 = s[v + 32], x2 = s[v + 64], x3 = s[v + 96];
        for (uint32_t i = 0; i < IE_FAN; i++) {
            if (i >= n) break;
            mori_vec16_t* o = (mori_vec16_t*)d[i];
            o[v] = x0;
            o[v + 32] = x1;
            o[v + 64] = x2;
            o[v + 96] = x3;
        }
    }
    for (; v < v16; v += 32) {
        const mori_vec16_t x = s[v];
        for (uint32_t i = 0; i < IE_FAN; i++)
            if (i < n) ((mori_vec16_t*)d[i])[v] = x;
    }
    for (uint32_t w = v16 * 4 + lane; w < bytes / 4; w += 32) {
        const uint32_t x = ((const uint32_t*)src)[w];
        for (uint32_t i = 0; i < IE_FAN; i++)
            if (i < n) ((uint32_t*)d[i])[w] = x;
    }
}

// Writes token t's record (rows, weights, ids, scales, flat source) at r0..r3, the first n of
// them (1 <= n <= IE_FAN), with the lanes of one 32-thread group, reading the token once.
MORI_DEVICE void ie_put_records(const IeParams& p, const IeRank& a, uint32_t t, uint8_t* r0, uint8_t* r1, uint8_t* r2, uint8_t* r3, uint32_t n,
                                uint32_t lane) {
    // The unused slots point at r0 (never written through: every copy stops at n).
    if (n < 2) r1 = r0;
    if (n < 3) r2 = r0;
    if (n < 4) r3 = r0;
    const uint32_t kw = p.top_k * 4, ki = p.top_k * p.idx_size;
    const uint8_t* x = (const uint8_t*)a.x + (uint64_t)t * p.row_bytes;
    ie_copy_group_fan(r0, r1, r2, r3, n, x, p.row_bytes, lane);
    const uint32_t mo = p.row_bytes;
    if (a.weights) ie_copy_group_fan(r0 + mo, r1 + mo, r2 + mo, r3 + mo, n, (const uint8_t*)a.weights + (uint64_t)t * kw, kw, lane);
    ie_copy_group_fan(r0 + mo + kw, r1 + mo + kw, r2 + mo + kw, r3 + mo + kw, n, (const uint8_t*)a.idx + (uint64_t)t * ki, ki, lane);
    const uint32_t so = mo + kw + ki;
    if (p.scale_bytes && a.scales)
        ie_copy_group_fan(r0 + so, r1 + so, r2 + so, r3 + so, n, (const uint8_t*)a.scales + (uint64_t)t * p.scale_bytes, p.scale_bytes, lane);
    uint8_t* const rs[4] = {r0, r1, r2, r3};
    for (uint32_t i = 0; i < IE_FAN; i++) {
        if (i >= n) break;
        if (!a.weights) ie_zero_group(rs[i] + mo, kw, lane);
        if (p.scale_bytes && !a.scales) ie_zero_group(rs[i] + so, p.scale_bytes, lane);
        if (lane == 0) *(int32_t*)(rs[i] + so + p.scale_bytes) = (int32_t)(a.rank * p.max_tokens + t);
    }
}

// ie_put_records into n (1 <= n <= IE_FAN) consecutive records from `first`.
MORI_DEVICE void ie_put_run(const IeParams& p, const IeRank& a, uint32_t t, uint8_t* first, uint32_t n, uint32_t lane) {
    const uint64_t b = p.rec_bytes;
    ie_put_records(p, a, t, first, first + b, first + 2 * b, first + 3 * b, n, lane);
}

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

// The factor of rank e's row for a token with ids `ids[i0 .. i0 + K)` and the row's K f32
// weights `w`: the sum of w over the slots whose expert lives on e (RankSlotSum).
MORI_DEVICE float ie_factor(const IeParams& p, const uint8_t* ids, uint64_t i0, const float* w, uint32_t e) {
    const int64_t num_experts = (int64_t)p.experts_per_rank * p.world;
    float f = 0.0f;
    for (uint32_t k = 0; k < p.top_k; k++) {
        const int64_t id = ie_load_idx(p, ids, i0 + k);
        if (id >= 0 && id < num_experts && (uint32_t)(id / p.experts_per_rank) == e) f += w[k];
    }
    return f;
}


// acc[0..8) += f * the 8 elements at src (elem bytes each: 2 bf16, 4 f32), each product
// rounded before its add (as the reference).
MORI_DEVICE void ie_acc8(float* acc, const uint8_t* src, uint32_t elem, float f) {
    if (elem == 2) {
        const mori_vec16_t v = *(const mori_vec16_t*)src;
        const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
        for (int i = 0; i < 4; i++) {
            acc[2 * i] += mori_mul_rn(f, mori_bf16_to_f32(wv[i] & 0xffffu));
            acc[2 * i + 1] += mori_mul_rn(f, mori_bf16_to_f32(wv[i] >> 16));
        }
    } else {
        const mori_vec16_t v0 = ((const mori_vec16_t*)src)[0], v1 = ((const mori_vec16_t*)src)[1];
        const uint32_t wv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        for (int i = 0; i < 8; i++) acc[i] += mori_mul_rn(f, __builtin_bit_cast(float, wv[i]));
    }
}

// Stores acc[0..8) at dst as elem-byte elements (2 bf16 rounded to nearest even, 4 f32).
MORI_DEVICE void ie_store8(uint8_t* dst, uint32_t elem, const float* acc) {
    if (elem == 2) {
        mori_vec16_t v;
        v.x = mori_f32_to_bf16(acc[0]) | (mori_f32_to_bf16(acc[1]) << 16);
        v.y = mori_f32_to_bf16(acc[2]) | (mori_f32_to_bf16(acc[3]) << 16);
        v.z = mori_f32_to_bf16(acc[4]) | (mori_f32_to_bf16(acc[5]) << 16);
        v.w = mori_f32_to_bf16(acc[6]) | (mori_f32_to_bf16(acc[7]) << 16);
        *(mori_vec16_t*)dst = v;
    } else {
        mori_vec16_t v0, v1;
        v0.x = __builtin_bit_cast(uint32_t, acc[0]); v0.y = __builtin_bit_cast(uint32_t, acc[1]);
        v0.z = __builtin_bit_cast(uint32_t, acc[2]); v0.w = __builtin_bit_cast(uint32_t, acc[3]);
        v1.x = __builtin_bit_cast(uint32_t, acc[4]); v1.y = __builtin_bit_cast(uint32_t, acc[5]);
        v1.z = __builtin_bit_cast(uint32_t, acc[6]); v1.w = __builtin_bit_cast(uint32_t, acc[7]);
        *(mori_vec16_t*)dst = v0;
        *(mori_vec16_t*)(dst + 16) = v1;
    }
}
