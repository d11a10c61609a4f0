// scatter_gather_copy.cu: copies a batch of (src, dst, len) descriptors on the GPU.
//
// ABI (CUDA: cuModuleGetFunction / cuLaunchKernel; HIP: hipModuleGetFunction /
// hipModuleLaunchKernel), the same on both:
//   symbol  mori_scatter_gather_copy  (extern "C", unmangled)
//   params  0: const CopyDesc* descs  8 bytes, offset 0  (device-accessible array of n)
//           1: uint32_t n             4 bytes, offset 8  (number of descriptors, may be 0)
//           (kernelParams = { &descs, &n }; as one packed buffer: 16 bytes, 8-aligned)
//   CopyDesc (24 bytes, 8-aligned, little endian): { u64 src; u64 dst; u64 len; }
//           src and dst are device pointers (any alignment), len in bytes (may be 0).
//   launch  1-D, no dynamic shared memory; block (64, 1, 1) recommended (any block size up
//           to 1024 is correct), grid min(128 * multiprocessors, max(n, total_len / 16 KiB)).
// With n >= gridDim each block copies descriptors blockIdx, blockIdx + gridDim, ...; with
// fewer descriptors than blocks, gridDim / n blocks share each descriptor, so a few large
// ones still use the whole GPU. Threads copy with the widest width src and dst share: 16
// bytes when (src ^ dst) % 16 == 0, else 8, 4, 2 or 1, with byte copies before the first
// and after the last aligned element. Ranges must not overlap (as memcpy); descriptors are
// independent and may come in any order.
#include "mori_gpu.h"

struct CopyDesc {
    uint64_t src;
    uint64_t dst;
    uint64_t len;
};

// Copies count elements of T: this thread takes elements lane, lane + stride, ..., two
// loads in flight at a time (on an H200, 4 or 8 slowed small descriptors and won nothing).
template <typename T>
MORI_DEVICE void mori_copy_elems(const T* __restrict__ s, T* __restrict__ d, uint64_t count,
                                 uint64_t lane, uint64_t stride) {
    constexpr int U = 2;
    uint64_t i = lane;
    for (; i + (U - 1) * stride < count; i += U * stride) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = s[i + u * stride];
#pragma unroll
        for (int u = 0; u < U; u++) d[i + u * stride] = v[u];
    }
    for (; i < count; i += stride) d[i] = s[i];
}

MORI_KERNEL void mori_scatter_gather_copy(const CopyDesc* descs, uint32_t n) {
    const uint32_t grid = mori_grid_dim();
    if (n == 0) return;
    // k blocks per descriptor: 1 when there are at least as many descriptors as blocks, else
    // as many as fit, so that a few large descriptors still spread over the whole GPU.
    const uint32_t k = n < grid ? grid / n : 1;
    const uint32_t groups = grid / k;
    const uint64_t nt = mori_block_dim();
    const uint64_t lane = (mori_block_idx() % k) * nt + mori_thread_idx();
    const uint64_t stride = k * nt;
    for (uint64_t i = mori_block_idx() / k; i < n; i += groups) {
        const uint64_t src = descs[i].src;
        const uint64_t dst = descs[i].dst;
        const uint64_t len = descs[i].len;
        const uint64_t mis = src ^ dst;
        const uint32_t w = (mis & 15) == 0 ? 16 : (mis & 7) == 0 ? 8 : (mis & 3) == 0 ? 4
                                                 : (mis & 1) == 0 ? 2 : 1;
        // Bytes before src (and so dst) reaches a multiple of w, the elements, the rest.
        uint64_t head = (0 - src) & (w - 1);
        if (head > len) head = len;
        const uint64_t count = (len - head) / w;
        const uint64_t tail = head + count * w;
        const uint8_t* s8 = (const uint8_t*)src;
        uint8_t* d8 = (uint8_t*)dst;
        for (uint64_t b = lane; b < head; b += stride) d8[b] = s8[b];
        for (uint64_t b = tail + lane; b < len; b += stride) d8[b] = s8[b];
        const void* s = s8 + head;
        void* d = d8 + head;
        switch (w) {
        case 16: mori_copy_elems((const mori_vec16_t*)s, (mori_vec16_t*)d, count, lane, stride); break;
        case 8: mori_copy_elems((const uint64_t*)s, (uint64_t*)d, count, lane, stride); break;
        case 4: mori_copy_elems((const uint32_t*)s, (uint32_t*)d, count, lane, stride); break;
        case 2: mori_copy_elems((const uint16_t*)s, (uint16_t*)d, count, lane, stride); break;
        default: mori_copy_elems(s8 + head, d8 + head, count, lane, stride); break;
        }
    }
}
