// ep_intranode.cu: MORI-EP intranode dispatch and combine over P2P (NVLink / XGMI, or one GPU).
//
// One launch serves `num_local` ranks of this process (blockIdx.x / blocks_per_rank = local
// rank index): one rank per GPU with one process each, or several ranks sharing one GPU in one
// process. Every rank owns a symmetric heap (same layout on every rank, `EpLayout` offsets);
// `heap[r]` is rank r's heap as mapped in this process (IPC mapping or direct pointer).
// Spinning waits have a deadline (`timeout_ns`); a timeout, an out-of-range expert id or a
// receive-buffer overflow is recorded in the rank's status word and the kernel goes on (it
// never writes outside a buffer and never hangs); the host turns the status into an error.
//
// ABI (CUDA cuLaunchKernel / HIP hipModuleLaunchKernel): both kernels take one by-value
// `EpParams` (layout below, every field naturally aligned, little endian); grid
// num_local * blocks_per_rank blocks of warps_per_block * 32 threads (at most 512: the kernels
// are built with that launch bound); no dynamic shared memory.
// All blocks of the grid must be resident at once (the host keeps the grid within one block
// per multiprocessor).
//
// Dispatch (seq s): block b of rank r takes tokens [b*T/B, (b+1)*T/B) and
//   1. counts (token, destination rank) pairs, the destinations of a token being the unique
//      ranks owning its expert ids (id / experts_per_rank; -1 skipped);
//   2. reserves cnt[d] slots on each destination d with one remote atomic add on d's counter
//      (counter parity s & 1; the receiver zeroes it once everything has arrived);
//   3. one thread per token takes its slots and records them in the sender's send_map
//      [T, world] (-1 = not sent) for combine; then warps over (token, chunk) items read each
//      row once and write it to every destination's receive buffer (rows split over several
//      warps when the block has fewer tokens than warps), with weights, indices, scales and
//      the flat source position r*max_tokens + t;
//   4. fences, then stores (s << 32) | (cnt[d] + 1) in d's signal [r * B + b] — "+1" tells an
//      empty send from one not yet made. Sequence numbers wrap at 2^32 and are compared
//      wrap-safe (ep_seq_reached).
//   Block 0 of each rank waits for all world * B signals addressed to it, sums the counts
//   into status.recv_count and zeroes its counter of this parity.
// Combine (seq s): every block stages its share of the combine input into the heap (skipped
// when the caller wrote it there), fences, stores s in every peer's combine flag [r * B + b],
// waits for all world * B flags addressed to it, then one warp per original token sums, in
// f32, the rows the token's destinations hold (slot from send_map), optionally weighted by
// the sum of the receiving rank's weights over the token's top-k slots that rank owns, and
// writes the row as bf16 or f32 (and, with weights, the per-slot sum of the weights).
#include "ep_math.h"

#define EP_MAX_WORLD 64
#define EP_MAX_TOPK 32
#define EP_MASK_CACHE 1024 // tokens per block whose destination masks are kept in shared memory
#define EP_SLOT_CACHE 2048 // (token, destination) slots per block kept in shared memory

// Status word codes (status[1]); the first error wins, details in status[2..5].
#define EP_OK 0
#define EP_ERR_EXPERT_RANGE 1  // [2] token, [3] slot, [4] id (low 32 bits)
#define EP_ERR_RECV_OVERFLOW 2 // [2] destination rank, [3] slots wanted (base + count), [4] capacity
#define EP_ERR_TIMEOUT 3       // [2] phase (1 dispatch, 2 combine), [3] source rank, [4] source block
#define EP_ERR_RECV_COUNT 4    // [2] total announced (low 32 bits), [3] capacity
#define EP_ERR_COMBINE_ROWS 5  // [2] which (0 rows, 1 weights), [3] rows given, [4] rows received

// Byte offsets inside every rank's heap.
struct EpLayout {
    uint64_t recv_x;      // [max_recv, row_bytes]
    uint64_t recv_w;      // [max_recv, top_k] f32
    uint64_t recv_idx;    // [max_recv, top_k] of idx_size bytes
    uint64_t recv_scales; // [max_recv, scale_bytes]
    uint64_t recv_src;    // [max_recv] i32 flat source position
    uint64_t comb_x;      // [max_recv, hidden] combine input elements
    uint64_t comb_w;      // [max_recv, top_k] f32 combine weights
    uint64_t counters;    // u32 [2] slot counters (by parity), 8-aligned
    uint64_t signals;     // u64 [world * blocks_per_rank] dispatch signals
    uint64_t comb_flags;  // u64 [world * blocks_per_rank] combine arrival flags
};

// One per local rank, in device memory.
struct EpRankArgs {
    uint32_t rank;
    uint32_t num_tokens;
    uint32_t comb_in_rows;   // rows the combine input buffer holds (checked against N_recv)
    uint32_t comb_w_rows;    // rows the combine weights buffer holds
    uint64_t x;        // [T, row_bytes]
    uint64_t weights;  // [T, top_k] f32 or 0
    uint64_t idx;      // [T, top_k] i32 / i64
    uint64_t scales;   // [T, scale_bytes] or 0
    uint64_t send_map; // [max_tokens, world] i32
    uint64_t comb_in;  // [N_recv, hidden] combine input (== heap + comb_x: nothing to stage)
    uint64_t comb_w_in;// [N_recv, top_k] f32 combine weights or 0
    uint64_t out;      // [T, hidden] combine output
    uint64_t out_w;    // [T, top_k] f32 or 0
    uint64_t status;   // u32 [8]: recv_count, error code, detail a, b, c
    uint64_t trace;    // u64 [blocks_per_rank, 8] phase timestamps (ns) or 0
    uint64_t seq_word; // u32 [2] (dispatch, combine) sequence advanced on the device before
                       // each call (mori_ep_seq_advance; CUDA graphs replay it), or 0: p.seq.
                       // Read with a plain load (the advance is an earlier kernel on the same
                       // stream): a volatile one made ptxas put EpParams on the stack (672 B
                       // frame), +16 us per decode dispatch on the H200.
};

struct EpParams {
    uint64_t heap[EP_MAX_WORLD];
    EpLayout lay;
    uint64_t rank_args;  // EpRankArgs[num_local]
    uint64_t timeout_ns;
    uint32_t num_local;
    uint32_t world;
    uint32_t blocks_per_rank;
    uint32_t row_bytes;  // dispatch: hidden * element size, a multiple of 16
    uint32_t hidden;     // elements; combine needs a multiple of 8
    uint32_t top_k;
    uint32_t idx_size;   // 4 or 8
    uint32_t scale_bytes;// per token, a multiple of 4 (0 = none)
    uint32_t experts_per_rank;
    uint32_t max_tokens;
    uint32_t max_recv;
    uint32_t seq;
    uint32_t flags;      // EP_FLAG_*
    uint32_t comb_in_elem;  // 2 = bf16, 4 = f32
    uint32_t comb_out_elem; // 2 = bf16, 4 = f32
    uint32_t pad;
};

#define EP_FLAG_DROP_OUT_OF_RANGE 1u
#define EP_FLAG_WEIGHTED 2u
#define EP_FLAG_ONE_DEVICE 4u // every rank's heap is on this launch's GPU: device-scope sync suffices

// Fences, releases, acquires and slot reservations at the narrowest scope that covers every
// rank: the GPU when all ranks share it, the system otherwise (peers over NVLink/XGMI, IPC).
MORI_DEVICE void ep_fence(const EpParams& p) {
    if (p.flags & EP_FLAG_ONE_DEVICE) mori_fence_device(); else mori_fence_system();
}
MORI_DEVICE void ep_release(const EpParams& p, uint64_t* f, uint64_t v) {
    if (p.flags & EP_FLAG_ONE_DEVICE) mori_store_release_device(f, v); else mori_store_release_system(f, v);
}
MORI_DEVICE uint64_t ep_acquire(const EpParams& p, const uint64_t* f) {
    return (p.flags & EP_FLAG_ONE_DEVICE) ? mori_load_acquire_device(f) : mori_load_acquire_system(f);
}
MORI_DEVICE uint32_t ep_reserve(const EpParams& p, uint32_t* counter, uint32_t n) {
    return (p.flags & EP_FLAG_ONE_DEVICE) ? mori_atomic_add_device_u32(counter, n) : mori_atomic_add_system_u32(counter, n);
}

MORI_DEVICE void ep_error(uint32_t* status, uint32_t code, uint32_t a, uint32_t b, uint32_t c) {
    if (mori_atomic_cas_system_u32(status + 1, EP_OK, code) == EP_OK) {
        status[2] = a;
        status[3] = b;
        status[4] = c;
    }
}

MORI_DEVICE int64_t ep_load_idx(const EpParams& p, const uint8_t* idx, uint64_t i) {
    return p.idx_size == 8 ? ((const int64_t*)idx)[i] : (int64_t)((const int32_t*)idx)[i];
}

// Bit d set when rank d owns one of the token's experts. Out-of-range ids are reported (or
// dropped) and never routed.
MORI_DEVICE uint64_t ep_dest_mask(const EpParams& p, const EpRankArgs& a, uint32_t t, bool report) {
    const uint8_t* idx = (const uint8_t*)a.idx;
    const int64_t num_experts = (int64_t)p.experts_per_rank * p.world;
    uint64_t mask = 0;
    // Ids are loaded 8 at a time before any is used, so the loads overlap.
    for (uint32_t k0 = 0; k0 < p.top_k; k0 += 8) {
        int64_t ids[8];
#pragma unroll
        for (uint32_t u = 0; u < 8; u++) ids[u] = k0 + u < p.top_k ? ep_load_idx(p, idx, (uint64_t)t * p.top_k + k0 + u) : -1;
#pragma unroll
        for (uint32_t u = 0; u < 8; u++) {
            const int64_t e = ids[u];
            if (e == -1) continue;
            if (e < -1 || e >= num_experts) {
                if (report && !(p.flags & EP_FLAG_DROP_OUT_OF_RANGE))
                    ep_error((uint32_t*)a.status, EP_ERR_EXPERT_RANGE, t, k0 + u, (uint32_t)e);
                continue;
            }
            mask |= 1ull << (uint32_t)(e / p.experts_per_rank);
        }
    }
    return mask;
}

MORI_DEVICE void ep_trace(const EpRankArgs& a, uint32_t b, uint32_t slot) {
    if (a.trace && mori_thread_idx() == 0) ((uint64_t*)a.trace)[b * 8 + slot] = mori_clock_ns();
}

// Sequence numbers wrap at 2^32 (0 is an ordinary value: the counter parity s & 1 alternates
// across the wrap). A flag has reached `want` when it is `want` or up to 2^31 - 1 past it
// (serial-number arithmetic): a flag left at 0xffffffff by the operation before the wrap is
// behind operation 0, not ahead of it. Flags are at most one operation behind (every block
// signals every rank each time), or one ahead (a peer already past this barrier).
// The host mirrors this in crates/ep/src/gpu.rs (seq_reached).
MORI_DEVICE bool ep_seq_reached(uint32_t flag, uint32_t want) { return (int32_t)(flag - want) >= 0; }

// Spins until every flag [0, n) of `flags` has reached sequence `want` (ep_seq_reached; the
// sequence is the high 32 bits when `high` is set, the low 32 bits otherwise); returns the sum
// of the low 32 bits minus one of each (dispatch counts). A flag still short at the deadline
// records EP_ERR_TIMEOUT.
MORI_DEVICE uint64_t ep_wait_flags(const EpParams& p, const EpRankArgs& a, uint64_t* flags, uint32_t n,
                                   uint32_t want, bool high, uint32_t phase, uint64_t deadline,
                                   uint32_t* sum_shared) {
    for (uint32_t i = mori_thread_idx(); i < n; i += mori_block_dim()) {
        uint64_t v;
        for (;;) {
            v = ep_acquire(p, flags + i);
            if (ep_seq_reached((uint32_t)(high ? (v >> 32) : v), want)) break;
            if (mori_clock_ns() > deadline) {
                ep_error((uint32_t*)a.status, EP_ERR_TIMEOUT, phase, i / p.blocks_per_rank, i % p.blocks_per_rank);
                v = 0;
                break;
            }
        }
        if (high && (v & 0xffffffffull) > 0) mori_atomic_add_block_u32(sum_shared, (uint32_t)(v & 0xffffffffull) - 1);
    }
    mori_sync_block();
    return high ? *sum_shared : 0;
}

MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ep_dispatch(EpParams p) {
    MORI_SHARED uint32_t cnt[EP_MAX_WORLD];
    MORI_SHARED uint32_t base[EP_MAX_WORLD];
    MORI_SHARED uint32_t cursor[EP_MAX_WORLD];
    MORI_SHARED uint32_t total;
    MORI_SHARED uint64_t tok_mask[EP_MASK_CACHE];     // destination masks of the block's first tokens
    MORI_SHARED int32_t tok_slot[EP_SLOT_CACHE];      // their slots, [token - t0][destination]
    MORI_SHARED uint32_t warp_slot[32][EP_MAX_WORLD]; // compacted: slot per destination
    MORI_SHARED uint8_t warp_dst[32][EP_MAX_WORLD];   // compacted: destination rank
    MORI_SHARED uint32_t warp_n[32];

    const uint32_t local = mori_block_idx() / p.blocks_per_rank;
    const uint32_t b = mori_block_idx() % p.blocks_per_rank;
    const EpRankArgs a = ((const EpRankArgs*)p.rank_args)[local];
    const uint32_t r = a.rank;
    uint32_t* status = (uint32_t*)a.status;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    ep_trace(a, b, 0);
    const uint32_t T = a.num_tokens;
    const uint32_t t0 = (uint32_t)((uint64_t)T * b / p.blocks_per_rank);
    const uint32_t t1 = (uint32_t)((uint64_t)T * (b + 1) / p.blocks_per_rank);
    const uint32_t tid = mori_thread_idx();
    const uint32_t nthreads = mori_block_dim();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
    const uint32_t seq = a.seq_word ? ((const uint32_t*)a.seq_word)[0] : p.seq;
    const uint32_t parity = seq & 1;

    // 1. Count (token, destination) pairs of this block.
    for (uint32_t d = tid; d < p.world; d += nthreads) cnt[d] = 0, cursor[d] = 0;
    if (tid == 0) total = 0;
    mori_sync_block();
    for (uint32_t t = t0 + tid; t < t1; t += nthreads) {
        uint64_t m = ep_dest_mask(p, a, t, true);
        if (t - t0 < EP_MASK_CACHE) tok_mask[t - t0] = m;
        while (m) {
            const uint32_t d = mori_ctz64(m);
            m &= m - 1;
            mori_atomic_add_block_u32(&cnt[d], 1);
        }
    }
    mori_sync_block();
    // 2. Reserve slots on every destination with one remote atomic add.
    for (uint32_t d = tid; d < p.world; d += nthreads) {
        base[d] = 0xffffffffu;
        if (cnt[d] == 0) continue;
        uint32_t* counter = (uint32_t*)(p.heap[d] + p.lay.counters) + parity;
        const uint32_t got = ep_reserve(p, counter, cnt[d]);
        if ((uint64_t)got + cnt[d] > p.max_recv)
            ep_error(status, EP_ERR_RECV_OVERFLOW, d, got + cnt[d], p.max_recv);
        else
            base[d] = got;
    }
    mori_sync_block();
    // 3a. One thread per token: its slot on every destination, recorded in send_map.
    int32_t* send_map = (int32_t*)a.send_map;
    for (uint32_t t = t0 + tid; t < t1; t += nthreads) {
        const uint64_t m = t - t0 < EP_MASK_CACHE ? tok_mask[t - t0] : ep_dest_mask(p, a, t, false);
        for (uint32_t d = 0; d < p.world; d++) {
            int32_t s = -1;
            if (((m >> d) & 1) && base[d] != 0xffffffffu) s = (int32_t)(base[d] + mori_atomic_add_block_u32(&cursor[d], 1));
            send_map[(uint64_t)t * p.world + d] = s;
            const uint32_t c = (t - t0) * p.world + d;
            if (c < EP_SLOT_CACHE) tok_slot[c] = s;
        }
    }
    mori_sync_block();
    // 3b. Warps over (token, chunk) items: a token's row is read once and written to every
    // destination; with fewer tokens than warps (decode) a row is split over several warps.
    const uint8_t* x = (const uint8_t*)a.x;
    const uint32_t ntok = t1 - t0;
    const uint32_t nvec = p.row_bytes / 16;
    uint32_t cpt = ntok ? nwarps / ntok : 1;
    if (cpt < 1) cpt = 1;
    if (cpt > (nvec + 31) / 32) cpt = (nvec + 31) / 32 ? (nvec + 31) / 32 : 1;
    const uint32_t wwords = a.weights ? p.top_k : 0;
    const uint32_t iwords = p.top_k * p.idx_size / 4;
    const uint32_t swords = a.scales ? p.scale_bytes / 4 : 0;
    for (uint32_t item = warp; item < ntok * cpt; item += nwarps) {
        const uint32_t t = t0 + item / cpt, c = item % cpt;
        // The token's send_map row, loaded by all lanes at once, then compacted by lane 0
        // (in place: n <= d).
        for (uint32_t d = lane; d < p.world; d += 32) {
            const uint32_t c = (t - t0) * p.world + d;
            warp_slot[warp][d] = (uint32_t)(c < EP_SLOT_CACHE ? tok_slot[c] : send_map[(uint64_t)t * p.world + d]);
        }
        mori_sync_group32();
        if (lane == 0) {
            uint32_t n = 0;
            for (uint32_t d = 0; d < p.world; d++) {
                const int32_t s = (int32_t)warp_slot[warp][d];
                if (s < 0) continue;
                warp_slot[warp][n] = (uint32_t)s;
                warp_dst[warp][n] = (uint8_t)d;
                n++;
            }
            warp_n[warp] = n;
        }
        mori_sync_group32();
        const uint32_t n = warp_n[warp];
        const mori_vec16_t* src = (const mori_vec16_t*)(x + (uint64_t)t * p.row_bytes);
        const uint32_t v0 = (uint32_t)((uint64_t)nvec * c / cpt), v1 = (uint32_t)((uint64_t)nvec * (c + 1) / cpt);
        // Two loads in flight per lane before the stores (the compiler cannot move a load above
        // a store that might alias it).
        uint32_t v = v0 + lane;
        for (; v + 32 < v1; v += 64) {
            const mori_vec16_t val0 = src[v], val1 = src[v + 32];
            for (uint32_t j = 0; j < n; j++) {
                mori_vec16_t* dst = (mori_vec16_t*)(p.heap[warp_dst[warp][j]] + p.lay.recv_x + (uint64_t)warp_slot[warp][j] * p.row_bytes);
                dst[v] = val0;
                dst[v + 32] = val1;
            }
        }
        if (v < v1) {
            const mori_vec16_t val = src[v];
            for (uint32_t j = 0; j < n; j++) {
                mori_vec16_t* dst = (mori_vec16_t*)(p.heap[warp_dst[warp][j]] + p.lay.recv_x + (uint64_t)warp_slot[warp][j] * p.row_bytes);
                dst[v] = val;
            }
        }
        if (c == 0) {
            // Metadata: weights, indices, scales (4-byte words), source position.
            const uint32_t* wsrc = (const uint32_t*)a.weights + (uint64_t)t * p.top_k;
            const uint32_t* isrc = (const uint32_t*)a.idx + (uint64_t)t * iwords;
            const uint32_t* ssrc = (const uint32_t*)a.scales + (uint64_t)t * (p.scale_bytes / 4);
            for (uint32_t j = 0; j < n; j++) {
                const uint64_t slot = warp_slot[warp][j];
                const uint64_t h = p.heap[warp_dst[warp][j]];
                for (uint32_t i = lane; i < wwords; i += 32) ((uint32_t*)(h + p.lay.recv_w))[slot * p.top_k + i] = wsrc[i];
                for (uint32_t i = lane; i < iwords; i += 32) ((uint32_t*)(h + p.lay.recv_idx))[slot * iwords + i] = isrc[i];
                for (uint32_t i = lane; i < swords; i += 32)
                    ((uint32_t*)(h + p.lay.recv_scales))[slot * (p.scale_bytes / 4) + i] = ssrc[i];
                if (lane == 0) ((int32_t*)(h + p.lay.recv_src))[slot] = (int32_t)(r * p.max_tokens + t);
            }
        }
        mori_sync_group32();
    }
    ep_trace(a, b, 1);
    // 4. Everything this block wrote is visible before its signals.
    mori_sync_block();
    ep_fence(p);
    for (uint32_t d = tid; d < p.world; d += nthreads) {
        const uint32_t sent = base[d] == 0xffffffffu ? 0 : cnt[d];
        uint64_t* sig = (uint64_t*)(p.heap[d] + p.lay.signals) + (uint64_t)r * p.blocks_per_rank + b;
        ep_release(p, sig, ((uint64_t)seq << 32) | (uint64_t)(sent + 1));
    }
    if (b != 0) return;
    // 5. Block 0 receives: all world * B signals, the total, the counter reset.
    uint64_t* sigs = (uint64_t*)(p.heap[r] + p.lay.signals);
    const uint64_t n = ep_wait_flags(p, a, sigs, p.world * p.blocks_per_rank, seq, true, 1, deadline, &total);
    if (tid == 0) {
        if (n > p.max_recv) ep_error(status, EP_ERR_RECV_COUNT, (uint32_t)n, p.max_recv, 0);
        status[0] = (uint32_t)(n > p.max_recv ? p.max_recv : n);
        ((uint32_t*)(p.heap[r] + p.lay.counters))[parity] = 0;
    }
    ep_trace(a, b, 2);
}

// acc[0..8] += f * (8 bf16 in v), each product rounded before its add.
MORI_DEVICE void ep_add8_bf16(float* acc, mori_vec16_t v, float f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        acc[2 * i] += mori_mul_rn(f, mori_bf16_to_f32(w[i] & 0xffffu));
        acc[2 * i + 1] += mori_mul_rn(f, mori_bf16_to_f32(w[i] >> 16));
    }
}

// acc[0..8] += f * (8 f32 in v0, v1), each product rounded before its add.
MORI_DEVICE void ep_add8_f32(float* acc, mori_vec16_t v0, mori_vec16_t v1, float f) {
    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] += mori_mul_rn(f, __builtin_bit_cast(float, w[i]));
}

MORI_KERNEL MORI_LAUNCH_BOUNDS(512) void mori_ep_combine(EpParams p) {
    MORI_SHARED uint32_t unused_sum;
    MORI_SHARED int32_t warp_slot[32][EP_MAX_WORLD];
    MORI_SHARED float warp_factor[32][EP_MAX_WORLD];
    MORI_SHARED uint64_t warp_row[32][EP_MAX_WORLD]; // compacted: row address per destination
    MORI_SHARED uint8_t warp_dst[32][EP_MAX_WORLD];  // compacted: destination rank
    MORI_SHARED uint32_t warp_n[32];

    const uint32_t local = mori_block_idx() / p.blocks_per_rank;
    const uint32_t b = mori_block_idx() % p.blocks_per_rank;
    const EpRankArgs a = ((const EpRankArgs*)p.rank_args)[local];
    const uint32_t r = a.rank;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    ep_trace(a, b, 3);
    const uint32_t tid = mori_thread_idx();
    const uint32_t nthreads = mori_block_dim();
    const uint32_t lane = tid % 32, warp = tid / 32, nwarps = nthreads / 32;
    const uint64_t in_row = (uint64_t)p.hidden * p.comb_in_elem;
    const bool weighted = (p.flags & EP_FLAG_WEIGHTED) != 0;
    const bool has_w = a.comb_w_in != 0;
    const uint32_t seq = a.seq_word ? ((const uint32_t*)a.seq_word)[1] : p.seq;

    // 1. Stage this block's share of the combine input into the heap (unless already there).
    const uint64_t heap_x = p.heap[r] + p.lay.comb_x;
    const uint32_t n_recv = ((const uint32_t*)a.status)[0];
    const bool x_fits = a.comb_in == heap_x || n_recv <= a.comb_in_rows;
    const bool w_fits = !has_w || a.comb_w_in == p.heap[r] + p.lay.comb_w || n_recv <= a.comb_w_rows;
    if (tid == 0 && b == 0 && !x_fits) ep_error((uint32_t*)a.status, EP_ERR_COMBINE_ROWS, 0, a.comb_in_rows, n_recv);
    if (tid == 0 && b == 0 && !w_fits) ep_error((uint32_t*)a.status, EP_ERR_COMBINE_ROWS, 1, a.comb_w_rows, n_recv);
    if (a.comb_in != heap_x && x_fits) {
        const uint64_t total = (uint64_t)n_recv * in_row / 16;
        const uint64_t per = (total + p.blocks_per_rank - 1) / p.blocks_per_rank;
        const uint64_t lo = per * b, hi = lo + per < total ? lo + per : total;
        const mori_vec16_t* s = (const mori_vec16_t*)a.comb_in;
        mori_vec16_t* d = (mori_vec16_t*)heap_x;
        for (uint64_t i = lo + tid; i < hi; i += nthreads) d[i] = s[i];
    }
    const uint64_t heap_w = p.heap[r] + p.lay.comb_w;
    if (has_w && a.comb_w_in != heap_w && w_fits) {
        const uint64_t total = (uint64_t)n_recv * p.top_k;
        const uint64_t per = (total + p.blocks_per_rank - 1) / p.blocks_per_rank;
        const uint64_t lo = per * b, hi = lo + per < total ? lo + per : total;
        for (uint64_t i = lo + tid; i < hi; i += nthreads) ((float*)heap_w)[i] = ((const float*)a.comb_w_in)[i];
    }
    // 2. Cross-rank barrier: my share is staged; wait until every block of every rank's is.
    if (tid == 0) unused_sum = 0;
    mori_sync_block();
    ep_fence(p);
    for (uint32_t d = tid; d < p.world; d += nthreads) {
        uint64_t* f = (uint64_t*)(p.heap[d] + p.lay.comb_flags) + (uint64_t)r * p.blocks_per_rank + b;
        ep_release(p, f, seq);
    }
    ep_wait_flags(p, a, (uint64_t*)(p.heap[r] + p.lay.comb_flags), p.world * p.blocks_per_rank, seq, false, 2,
                  deadline, &unused_sum);
    ep_trace(a, b, 4);
    // 3. One warp per original token: gather from the destinations, accumulate in f32.
    // The destinations holding the token are compacted (ascending rank: the oracle's order),
    // then each lane loads its 8 columns of up to 8 rows before adding them, so that 8 loads
    // are in flight per lane instead of one.
    const uint32_t T = a.num_tokens;
    const uint32_t t0 = (uint32_t)((uint64_t)T * b / p.blocks_per_rank);
    const uint32_t t1 = (uint32_t)((uint64_t)T * (b + 1) / p.blocks_per_rank);
    const int32_t* send_map = (const int32_t*)a.send_map;
    const uint8_t* idx = (const uint8_t*)a.idx;
    const uint64_t out_row = (uint64_t)p.hidden * p.comb_out_elem;
    for (uint32_t t = t0 + warp; t < t1; t += nwarps) {
        for (uint32_t d = lane; d < p.world; d += 32) {
            const int32_t s = send_map[(uint64_t)t * p.world + d];
            warp_slot[warp][d] = s;
            float f = 1.0f;
            if (s >= 0 && weighted) {
                const float* w = (const float*)(p.heap[d] + p.lay.comb_w) + (uint64_t)s * p.top_k;
                f = 0.0f;
                for (uint32_t k = 0; k < p.top_k; k++) {
                    const int64_t e = ep_load_idx(p, idx, (uint64_t)t * p.top_k + k);
                    if (e >= 0 && e < (int64_t)p.experts_per_rank * p.world && (uint32_t)(e / p.experts_per_rank) == d)
                        f += w[k];
                }
            }
            warp_factor[warp][d] = f;
        }
        mori_sync_group32();
        if (lane == 0) {
            uint32_t n = 0;
            for (uint32_t d = 0; d < p.world; d++) {
                const int32_t s = warp_slot[warp][d];
                if (s < 0) continue;
                // In-place forward compaction (n <= d): slot and factor move down.
                warp_row[warp][n] = p.heap[d] + p.lay.comb_x + (uint64_t)s * in_row;
                warp_dst[warp][n] = (uint8_t)d;
                warp_slot[warp][n] = s;
                warp_factor[warp][n] = warp_factor[warp][d];
                n++;
            }
            warp_n[warp] = n;
        }
        mori_sync_group32();
        const uint32_t nd = warp_n[warp];
        uint8_t* out = (uint8_t*)a.out + (uint64_t)t * out_row;
        for (uint32_t e = lane * 8; e < p.hidden; e += 32 * 8) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (uint32_t j0 = 0; j0 < nd; j0 += 8) {
                if (p.comb_in_elem == 2) {
                    mori_vec16_t v[8];
#pragma unroll
                    for (uint32_t u = 0; u < 8; u++)
                        if (j0 + u < nd) v[u] = *(const mori_vec16_t*)(warp_row[warp][j0 + u] + (uint64_t)e * 2);
#pragma unroll
                    for (uint32_t u = 0; u < 8; u++)
                        if (j0 + u < nd) ep_add8_bf16(acc, v[u], warp_factor[warp][j0 + u]);
                } else {
                    // f32 rows: 32 bytes a row; two groups of 4 rows keep the registers in bounds.
#pragma unroll
                    for (uint32_t h = 0; h < 8; h += 4) {
                        mori_vec16_t v[4][2];
#pragma unroll
                        for (uint32_t u = 0; u < 4; u++)
                            if (j0 + h + u < nd) {
                                const mori_vec16_t* q = (const mori_vec16_t*)(warp_row[warp][j0 + h + u] + (uint64_t)e * 4);
                                v[u][0] = q[0];
                                v[u][1] = q[1];
                            }
#pragma unroll
                        for (uint32_t u = 0; u < 4; u++)
                            if (j0 + h + u < nd) ep_add8_f32(acc, v[u][0], v[u][1], warp_factor[warp][j0 + h + u]);
                    }
                }
            }
            if (p.comb_out_elem == 2) {
                mori_vec16_t v;
                v.x = mori_f32_to_bf16(acc[0]) | (mori_f32_to_bf16(acc[1]) << 16);
                v.y = mori_f32_to_bf16(acc[2]) | (mori_f32_to_bf16(acc[3]) << 16);
                v.z = mori_f32_to_bf16(acc[4]) | (mori_f32_to_bf16(acc[5]) << 16);
                v.w = mori_f32_to_bf16(acc[6]) | (mori_f32_to_bf16(acc[7]) << 16);
                *(mori_vec16_t*)(out + (uint64_t)e * 2) = v;
            } else {
                mori_vec16_t v0, v1;
                v0.x = __builtin_bit_cast(uint32_t, acc[0]); v0.y = __builtin_bit_cast(uint32_t, acc[1]);
                v0.z = __builtin_bit_cast(uint32_t, acc[2]); v0.w = __builtin_bit_cast(uint32_t, acc[3]);
                v1.x = __builtin_bit_cast(uint32_t, acc[4]); v1.y = __builtin_bit_cast(uint32_t, acc[5]);
                v1.z = __builtin_bit_cast(uint32_t, acc[6]); v1.w = __builtin_bit_cast(uint32_t, acc[7]);
                *(mori_vec16_t*)(out + (uint64_t)e * 4) = v0;
                *(mori_vec16_t*)(out + (uint64_t)e * 4 + 16) = v1;
            }
        }
        if (has_w && a.out_w) {
            for (uint32_t k = lane; k < p.top_k; k += 32) {
                float sw = 0.0f;
                for (uint32_t j = 0; j < nd; j++)
                    sw += ((const float*)(p.heap[warp_dst[warp][j]] + p.lay.comb_w))[(uint64_t)warp_slot[warp][j] * p.top_k + k];
                ((float*)a.out_w)[(uint64_t)t * p.top_k + k] = sw;
            }
        }
        mori_sync_group32();
    }
    ep_trace(a, b, 5);
}

// Advances word `which` (0: dispatch, 1: combine) of the `n` local ranks' sequence pairs
// (EpRankArgs::seq_word) by one: queued before each call in device-sequence mode, so that a
// CUDA graph replaying the calls replays the advance too and every replay gets a fresh sequence.
MORI_KERNEL void mori_ep_seq_advance(uint64_t words, uint32_t n, uint32_t which) {
    const uint32_t i = mori_thread_idx();
    if (i < n) ((uint32_t*)words)[2 * i + which] += 1;
}
