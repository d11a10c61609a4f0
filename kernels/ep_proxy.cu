// ep_proxy.cu: the GPU producer of the proxy's command ring (crates/ep/src/ring.rs has the
// layout and the host consumer) and two kernels that drive it through a proxy thread.
//
// Ring: the head (u64, next ticket) in device memory, so that the producers' atomics stay on
// the GPU; the ring region in pinned host memory mapped into the device: tail (u64) at byte 0,
// written by the consumer, then `slots` slots of 64 bytes: seq u64 at 0 (ticket + 1 once
// written), dst u32 at 8, op u32 at 12 (1 add, 2 set), local_off u64 at 16, remote_off at 24,
// len at 32, counter at 40, value at 48. A producer takes a ticket, waits (deadline) for room,
// writes the fields, fences, and release-stores seq.
//
// ABI (CUDA cuLaunchKernel / HIP hipModuleLaunchKernel): each kernel takes one by-value struct
// (layouts below, every field naturally aligned, little endian); mirrored in
// crates/ep/src/gpu_ring.rs.
//
// mori_ep_ring_roundtrip: thread 0 of block 0, `iters` times: push one command (Add 1 on the
// destination's counter after `len` bytes), then spin until the counter, read through its
// device mapping, reaches base + i + 1; records the nanoseconds of each round trip.
// mori_ep_ring_flood: every warp of the grid stages `per_warp` chunks into the source window
// (word w of chunk c is ep_flood_word(c, w)), then pushes one command per chunk (Add 1 on
// counter c % counters, from counter_base); the host checks the destination's bytes once the counters add up.
// Faults (a full ring or a counter that never arrives, past `timeout_ns`) go to status:
// [0] code (1 ring full, 2 counter timeout), [1] warp or iteration, [2] chunk.
#include "mori_gpu.h"
#include "mori_ring.h"

#define RING_ERR_FULL 1u
#define RING_ERR_TIMEOUT 2u

struct RoundtripParams {
    RingDev ring;
    uint64_t counter;    // u64* the destination's counter, as the device addresses it
    uint64_t times;      // u64[iters] round-trip nanoseconds (device memory)
    uint64_t status;     // u32[4] (device memory)
    uint64_t local_off;
    uint64_t remote_off;
    uint64_t len;
    uint64_t counter_off; // the counter's byte offset in the destination's counter region
    uint64_t base;        // the counter's value before the first round trip
    uint64_t timeout_ns;
    uint32_t dst;
    uint32_t iters;
};

MORI_KERNEL void mori_ep_ring_roundtrip(RoundtripParams p) {
    if (mori_thread_idx() != 0 || mori_block_idx() != 0) return;
    uint32_t* status = (uint32_t*)p.status;
    for (uint32_t i = 0; i < p.iters; i++) {
        const uint64_t t0 = mori_clock_ns();
        const uint64_t deadline = t0 + p.timeout_ns;
        if (mori_ring_push(p.ring, p.dst, RING_OP_ADD, p.local_off, p.remote_off, p.len, p.counter_off, 1, 0, deadline)) {
            status[0] = RING_ERR_FULL;
            status[1] = i;
            return;
        }
        const uint64_t want = p.base + i + 1;
        while (mori_load_acquire_system((const uint64_t*)p.counter) < want) {
            if (mori_clock_ns() > deadline) {
                status[0] = RING_ERR_TIMEOUT;
                status[1] = i;
                return;
            }
        }
        ((uint64_t*)p.times)[i] = mori_clock_ns() - t0;
    }
}

struct FloodParams {
    RingDev ring;
    uint64_t src;        // the source window as the device addresses it
    uint64_t status;     // u32[4] (device memory)
    uint64_t chunk;      // bytes between chunks (>= len)
    uint64_t len;        // bytes per chunk, a multiple of 4
    uint64_t timeout_ns;
    uint64_t counter_base; // byte offset of the first counter in the destination's counter region
    uint32_t dst;
    uint32_t per_warp;
    uint32_t counters;   // commands add 1 to counter (chunk % counters), 8 bytes apart
    uint32_t pad;
};

// Word w of chunk c (the host recomputes it to check the destination).
MORI_DEVICE uint32_t ep_flood_word(uint32_t c, uint32_t w) {
    uint32_t x = c * 2654435761u ^ (w + 1) * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    return x ^ (x >> 13);
}

// Per warp of a block, whether it stops (lane 0's read of the fault word, so that the whole
// warp leaves its loop together: lanes reading the word themselves could see a fault another
// warp set between their reads, and some would wait at the next group sync forever).
struct FloodStop {
    uint32_t stop[32];
};

MORI_KERNEL void mori_ep_ring_flood(FloodParams p) {
    const uint32_t lane = mori_thread_idx() % 32;
    const uint32_t warps = mori_block_dim() / 32;
    const uint32_t warp = mori_thread_idx() / 32;
    const uint32_t gw = mori_block_idx() * warps + warp;
    const uint64_t deadline = mori_clock_ns() + p.timeout_ns;
    uint32_t* status = (uint32_t*)p.status;
    MORI_SHARED_STRUCT(FloodStop, sh);
    for (uint32_t j = 0; j < p.per_warp; j++) {
        const uint32_t c = gw * p.per_warp + j;
        uint32_t* dst = (uint32_t*)(p.src + (uint64_t)c * p.chunk);
        for (uint32_t w = lane; w < p.len / 4; w += 32) dst[w] = ep_flood_word(c, w);
        // Every lane's stores are visible system-wide before lane 0 publishes the command.
        mori_fence_system();
        mori_sync_group32();
        if (lane == 0) {
            const uint64_t off = (uint64_t)c * p.chunk;
            if (mori_ring_push(p.ring, p.dst, RING_OP_ADD, off, off, p.len, p.counter_base + 8ull * (c % p.counters), 1, 0, deadline)) {
                if (mori_atomic_cas_system_u32(status, 0, RING_ERR_FULL) == 0) {
                    status[1] = gw;
                    status[2] = c;
                }
            }
            sh.stop[warp] = *(volatile uint32_t*)status; // a full ring anywhere: stop pushing
        }
        mori_sync_group32();
        // Lane 0 writes it again only after the next iteration's first group sync, which every
        // lane reaches after this read.
        if (sh.stop[warp]) break;
    }
}

#ifdef MORI_HOST_EMU
MORI_EMU_EXPORT(mori_ep_ring_roundtrip, RoundtripParams)
MORI_EMU_EXPORT(mori_ep_ring_flood, FloodParams)
#endif
