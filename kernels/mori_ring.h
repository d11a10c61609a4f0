// mori_ring.h: the GPU producer of the proxy's command ring (crates/ep/src/ring.rs has the
// layout and the host consumer). Included by the kernels that hand work to a proxy thread.
#pragma once
#include "mori_gpu.h"

#define RING_TAIL_BYTES 64
#define RING_SLOT_BYTES 64
#define RING_OP_ADD 1u
#define RING_OP_SET 2u
#define RING_OP_TAIL 3u // value: source offset of 16 bytes written to `counter` of the peer's window after the bytes landed;
                        // total: those bytes' second u64 (the first is total - 1), 0 when not carried

struct RingDev {
    uint64_t head;   // u64* next ticket (device memory)
    uint64_t region; // ring region as the device addresses it (host-mapped)
    uint32_t slots;  // a power of two
    uint32_t pad;
};

// Writes one command (slot bytes 8..64); 0 on success, 1 when no slot freed before `deadline`
// (the ticket then stays reserved: the job must be failed).
MORI_DEVICE uint32_t mori_ring_push(const RingDev& r, uint32_t dst, uint32_t op, uint64_t local_off,
                                    uint64_t remote_off, uint64_t len, uint64_t counter, uint64_t value,
                                    uint64_t total, uint64_t deadline) {
    const uint64_t t = mori_atomic_add_system((uint64_t*)r.head, 1);
    const uint64_t* tail = (const uint64_t*)r.region;
    while (t - mori_load_acquire_system(tail) >= (uint64_t)r.slots) {
        if (mori_clock_ns() > deadline) return 1;
    }
    uint8_t* slot = (uint8_t*)r.region + RING_TAIL_BYTES + (t & (uint64_t)(r.slots - 1)) * RING_SLOT_BYTES;
    volatile uint32_t* w32 = (volatile uint32_t*)(slot + 8);
    w32[0] = dst;
    w32[1] = op;
    volatile uint64_t* w64 = (volatile uint64_t*)(slot + 16);
    w64[0] = local_off;
    w64[1] = remote_off;
    w64[2] = len;
    w64[3] = counter;
    w64[4] = value;
    w64[5] = total;
    // Callers rely on this system fence to release what other blocks staged and ordered before
    // the push at device scope only (fences are cumulative): keep it at system scope.
    mori_fence_system();
    mori_store_release_system((uint64_t*)slot, t + 1);
    return 0;
}
