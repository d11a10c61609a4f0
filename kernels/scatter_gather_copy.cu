// scatter_gather_copy.cu: batched copies on the GPU: a table of (src, dst, len) descriptors
// (mori_scatter_gather_copy), and paged KV-cache blocks addressed by a block table
// (mori_paged_copy). Both kernels share one copy routine and live in one module.
//
// ABI (CUDA: cuModuleGetFunction / cuLaunchKernel; HIP: hipModuleGetFunction /
// hipModuleLaunchKernel), the same on both, little endian:
//
// mori_scatter_gather_copy  (extern "C", unmangled)
//   params  0: const CopyDesc* descs  8 bytes, offset 0  (device-accessible array of n)
//           1: uint32_t n             4 bytes, offset 8  (number of descriptors, may be 0)
//           (kernelParams = { &descs, &n }; as one packed buffer: 16 bytes, 8-aligned)
//   CopyDesc (24 bytes, 8-aligned): { u64 src; u64 dst; u64 len; }
//           src and dst are device pointers (any alignment), len in bytes (may be 0).
//   launch  1-D, no dynamic shared memory; block (64, 1, 1) recommended (any block size up
//           to 1024 is correct), grid min(128 * multiprocessors, max(n, total_len / 16 KiB)).
// With n >= gridDim each block copies descriptors blockIdx, blockIdx + gridDim, ...; with
// fewer descriptors than blocks, gridDim / n blocks share each descriptor, so a few large
// ones still use the whole GPU. Ranges must not overlap (as memcpy); descriptors are
// independent and may come in any order.
//
// mori_paged_copy  (extern "C", unmangled)
//   params  0: const PagedRun* runs   8 bytes, offset 0  (device-accessible array of n_runs)
//           1: PagedParams p          88 bytes, offset 8, BY VALUE (8-aligned)
//           (kernelParams = { &runs, &p }; as one packed buffer: 96 bytes, 8-aligned)
//   PagedRun (12 bytes, 4-aligned): { u32 a_block; u32 b_block; u32 count; }
//           count consecutive blocks starting at block a_block on side A and b_block on B.
//   PagedParams (88 bytes, 8-aligned, no padding), byte offsets:
//            0 u64 a_base          device address of side A's layer 0, half 0, block 0
//            8 u64 a_layer_stride  bytes between layers on side A
//           16 u64 a_half_stride   bytes between the halves (K, V) of a layer on side A
//           24 u64 a_block_stride  bytes between blocks on side A
//           32 u64 b_base, 40 b_layer_stride, 48 b_half_stride, 56 b_block_stride  (side B)
//           64 u64 block_bytes     bytes per block (> 0)
//           72 u32 layers, 76 u32 halves, 80 u32 n_runs  (each > 0)
//           84 u32 a_to_b          1: copy A -> B; 0: copy B -> A
//   Work units u in 0 .. layers * halves * n_runs (at most 2^32 - 1; with more, the kernel
//   copies nothing): run r = u % n_runs, lh = u / n_runs, layer = lh / halves,
//   half = lh % halves. Side X's range is X_base + layer * X_layer_stride
//   + half * X_half_stride + X_block * X_block_stride, count * block_bytes long.
//   Contract: a run with count > 1 is one contiguous range per side, so it may only be given
//   when a_block_stride == block_bytes and b_block_stride == block_bytes. Destination ranges
//   of one launch must not overlap each other nor any source range.
//   launch  1-D, no dynamic shared memory; block (64, 1, 1) recommended (any block size up
//           to 1024 is correct: launch bounds 1024), grid min(128 * multiprocessors,
//           max(units, total_bytes / 4 KiB)).
//   Consecutive units are consecutive runs of one (layer, half), so the blocks running at
//   one time touch a few layers' worth of the cache, not all of it. With units >= gridDim
//   block b copies units b, b + gridDim, ...; with fewer units than blocks, gridDim / units
//   blocks share each unit.
//
// mori_paged_copy_inline  (extern "C", unmangled): mori_paged_copy with the run table passed
// in the parameters, so a small table needs no upload before the launch.
//   params  0: PagedInline t          3928 bytes, offset 0, BY VALUE (8-aligned)
//           (kernelParams = { &t })
//   PagedInline (3928 bytes, 8-aligned, no padding): { PagedParams p (offset 0);
//           PagedRun runs[320] (offset 88) }; only runs[0 .. p.n_runs] are read, the rest
//           may hold anything. p.n_runs above 320 copies nothing. 3928 bytes stay under the
//           4 KiB of parameters every CUDA and HIP launch accepts.
//   Units, addressing, contract and launch exactly as mori_paged_copy's.
//
// mori_ordered_copy  (extern "C", unmangled): up to 8 segments in up to 8 groups, each group's
// segments copied in order, with the segment table, the arrival counters and the completion
// word in the parameters, so one launch replaces a copy per segment and a stream write (the
// copy pool's ordered batches: a segment and the counter pair that tells the peer it landed;
// several such batches, one per group, from one post).
//   params  0: OrderedCopy t          232 bytes, offset 0, BY VALUE (8-aligned)
//           (kernelParams = { &t })
//   OrderedCopy (232 bytes, 8-aligned): { CopyDesc segs[8] (offset 0);
//           u64 arrivals (192): device address of groups + 1 u32 (one when groups <= 1), all 0
//           before the launch; u64 flag (200): device address of a u32 to write flag_value
//           into once every segment of every group landed, or 0; u32 n (208): segments used,
//           1..8 (else nothing is copied); u32 flag_value (212); u32 groups (216): 0 or 1 for
//           one group of n segments, else 2..n; u8 first[8] (220): group g's first segment,
//           first[0] = 0 and ascending (group g ends where g + 1 starts, the last at n);
//           u32 pad (228) }.
//   The grid is groups (at least 1) equal runs of blocks, run g for group g. A run copies its
//   group's first segment; each block then arrives on arrivals[g] (a block barrier, then
//   thread 0's system-scope fence and atomic add), and the block that arrives last copies the
//   group's other segments one after the other (every thread fencing at system scope on both
//   sides of a block barrier between two) and puts arrivals[g] back to 0. With one group it
//   then fences and writes flag_value into `flag`; with several it fences and arrives on
//   arrivals[groups], and the group that arrives last puts that back to 0, fences, and writes
//   the flag. So within a group every byte of a segment is written and fenced at system scope
//   before any byte of its later segments, and the flag after every group's. Groups are not
//   ordered among themselves. A table the kernel does not take (n, groups or first out of
//   range, or a grid that is not a multiple of the group count) copies nothing and writes no
//   flag. Launch 1-D, no dynamic shared memory, block 256 (any size up to 1024), grid
//   groups x min(32 * multiprocessors / groups, max(1, ceil(largest first segment / 16 KiB)));
//   one launch at a time per `arrivals` array.
//
// mori_ordered_copy_armed  (extern "C", unmangled): mori_ordered_copy with its table behind a
// pointer, for launches queued before the table exists (the copy pool's armed launches: a
// stream wait on a doorbell word, then this launch; the host writes the table, then the
// doorbell).
//   params  0: const OrderedCopy* table   8 bytes, offset 0 (host memory mapped into the
//           device, or device memory; 4-aligned; read once per block, volatile)
//   As mori_ordered_copy (a grid that is not a multiple of the group count copies nothing and
//   writes no flag). A table with n = 0 copies nothing and writes no flag (how a launch that is
//   no longer needed is let go).
//
// mori_ordered_copy_resident  (extern "C", unmangled): a grid that stays on the device and runs
// mori_ordered_copy tables as the host posts them into mapped host memory, so that posting an
// ordered batch makes no driver call and waits for no launch (the copy pool's resident copier).
//   params  0: ResidentParams p       40 bytes, offset 0, BY VALUE (8-aligned)
//   ResidentParams (40 bytes): { u64 ring (0): device address of the ring, host memory the
//           device maps; u64 scratch (8): device memory of the grid's own, 256 + depth * 256
//           bytes; u64 idle_ns (16): how long the grid waits with nothing posted before it
//           exits; u32 depth (24): table slots, a power of two from 1 to 64; u32 start (28):
//           the number of the last table already run (the next is start + 1, cyclic); u32 gen
//           (32): this launch's number, 1 to 2^31 - 1 (31 bits are compared), different from
//           the previous launch's on the same scratch; u32 pad (36): 0 (on the CPU
//           emulation, MORI_HOST_EMU, microseconds block 0 holds its exit decision before it
//           writes state 2, for tests) }.
//   The ring: u32 posted (0), the number of the last table posted (the host's); u32 stop (4),
//           non-zero: exit once nothing is posted (the host's); u32 state (8), the grid's:
//           1 running, 2 about to exit, 3 exited (the host writes 0 before a launch); u32 done
//           (12), the grid's: the number of the last table it ran, written before state 3;
//           table s (an OrderedCopy) at byte 256 + (s % depth) * 256; then, at byte
//           256 + depth * 256, a u32 per block, which block b sets to gen when it starts (the
//           host counts them to learn whether the whole grid is on the device).
//   In each table's slot, after the table, the grid writes three u64 GPU-clock stamps (ns):
//   at slot byte 232 when block 0 saw the table posted, at 240 when it published the table to
//   the other blocks, at 248 when the block that writes the flag was about to write it (the
//   host may zero them with the table; they are written before the flag).
//   Block 0 reads `posted` and each new table from the ring, copies the table into scratch
//   (byte 256 + (s % depth) * 256) and publishes its number in the u64 at scratch byte 0
//   (gen << 33 | exit << 32 | s); the other blocks read both from scratch, so only block 0
//   polls host memory. Every block runs every table, in order, as mori_ordered_copy's grid
//   would (the table's arrival words, flag and groups as there; the grid must be a multiple of
//   each table's group count, else the table copies nothing and writes no flag). With nothing
//   posted for idle_ns, or stop set and nothing posted, block 0 writes state 2, fences at
//   system scope and reads `posted` again: unchanged, it publishes the exit, writes done, then
//   state 3, and the grid exits; changed, it writes state 1 and runs the table. The host
//   writes a table, then `posted`, fences, then reads state (the same store-fence-load on both
//   sides: one of them sees the other's store): 2 means wait for 1 or 3, 3 means launch again
//   with start = done. A block other than 0 that sees nothing published for idle_ns + 1 s
//   exits (block 0 was never scheduled); the host's wait for the flag then times out. A depth
//   it does not take (0, above 64, not a power of two): block 0 writes state 3 and the grid
//   exits at once. Launch
//   1-D, no dynamic shared memory, block 256, every block co-resident (the grid's blocks wait
//   for block 0): a few blocks per multiprocessor at most; one grid at a time per ring.
//
// The copy: threads copy elements of the widest width src and dst share: 16 bytes when
// (src ^ dst) % 16 == 0, else 8, 4, 2 or 1, with byte copies before the first and after the
// last aligned element.
#include "mori_gpu.h"

// Loads in flight per thread in mori_paged_copy (the scatter/gather kernel keeps 2).
// Measured on an H200 (driver 580, kernels/check_on_gpu.py with MORI_PAGED_VARIANTS, side B
// mapped from another process through CUDA IPC, random block tables, GB/s = 1e9 B/s), for
// 16384 x 32 KiB / 4096 x 4 KiB / 128 x 64 KiB blocks at block 64, grid cap 128 per SM:
//   unroll 4: 2012 / 2242 / 1656   unroll 2: 1950 / 2109 / 1583   unroll 8: 1942 / 1926 / 1524
//   unroll 4 with streaming (.cs) loads and stores: 2014 / 2111 / 1668 (no gain: not used)
// Block 64 won for small blocks (4 KiB: 2242 against 1812 at 128, 1222 at 256, 678 at 512)
// and within 2-4% of the best for 32 KiB (512: 2055); grid cap 128 per SM beat one wave
// (2048 / block per SM) and a block per 4 KiB beat one per 16 KiB (1656 vs 1643 at 64 KiB).
// A contiguous copy_ of the same bytes: 2101 / 2552 (L2-resident) / 2068 GB/s.
#ifndef MORI_PAGED_UNROLL
#define MORI_PAGED_UNROLL 4
#endif

// A full unroll of the loop that follows (nothing on the CPU emulation, whose compiler does not
// know the pragma).
#ifdef MORI_HOST_EMU
#define MORI_UNROLL_ALL
#else
#define MORI_UNROLL_ALL _Pragma("unroll")
#endif

struct CopyDesc {
    uint64_t src;
    uint64_t dst;
    uint64_t len;
};

struct PagedRun {
    uint32_t a_block;
    uint32_t b_block;
    uint32_t count;
};

// Capacity of mori_paged_copy_inline's run table.
#define MORI_PAGED_INLINE_RUNS 320

struct PagedParams {
    uint64_t a_base;
    uint64_t a_layer_stride;
    uint64_t a_half_stride;
    uint64_t a_block_stride;
    uint64_t b_base;
    uint64_t b_layer_stride;
    uint64_t b_half_stride;
    uint64_t b_block_stride;
    uint64_t block_bytes;
    uint32_t layers;
    uint32_t halves;
    uint32_t n_runs;
    uint32_t a_to_b;
};
static_assert(sizeof(PagedRun) == 12, "PagedRun is 12 bytes");
static_assert(sizeof(PagedParams) == 88, "PagedParams is 88 bytes");

struct PagedInline {
    PagedParams p;
    PagedRun runs[MORI_PAGED_INLINE_RUNS];
};
static_assert(sizeof(PagedInline) == 3928, "PagedInline is 3928 bytes");

// Capacity of mori_ordered_copy's segment table.
#define MORI_ORDERED_SEGS 8

struct OrderedCopy {
    CopyDesc segs[MORI_ORDERED_SEGS];
    uint64_t arrivals;
    uint64_t flag;
    uint32_t n;
    uint32_t flag_value;
    uint32_t groups;
    uint8_t first[MORI_ORDERED_SEGS];
    uint32_t pad;
};
static_assert(sizeof(OrderedCopy) == 232, "OrderedCopy is 232 bytes");

struct ResidentParams {
    uint64_t ring;
    uint64_t scratch;
    uint64_t idle_ns;
    uint32_t depth;
    uint32_t start;
    uint32_t gen;
    uint32_t pad;
};
static_assert(sizeof(ResidentParams) == 40, "ResidentParams is 40 bytes");

// Block-wide flags in shared memory (structs: MORI_HOST_EMU emulates shared structs only, one
// per type and block, so each flag has a type of its own).
struct MoriLastSh {
    uint32_t v;
};
struct MoriMoreSh {
    uint32_t v;
};

// The resident grid's states (ring word 2) and its table slots' stride.
#define MORI_RESIDENT_RUNNING 1u
#define MORI_RESIDENT_EXITING 2u
#define MORI_RESIDENT_EXITED 3u
#define MORI_RESIDENT_STRIDE 256u
// Byte offsets in a table slot, after its OrderedCopy, of the GPU-clock stamps (u64 ns) of the
// table's run: block 0 saw it posted, block 0 published it to the other blocks, the flag's
// writer was about to write the flag.
#define MORI_RESIDENT_SEEN 232u
#define MORI_RESIDENT_RELAYED 240u
#define MORI_RESIDENT_FLAGGED 248u

// Copies count elements of T: this thread takes elements lane, lane + stride, ..., U loads in
// flight at a time.
template <int U, typename T>
MORI_DEVICE void mori_copy_elems(const T* __restrict__ s, T* __restrict__ d, uint64_t count,
                                 uint64_t lane, uint64_t stride) {
    uint64_t i = lane;
    for (; i + (U - 1) * stride < count; i += U * stride) {
        T v[U];
MORI_UNROLL_ALL
        for (int u = 0; u < U; u++) v[u] = s[i + u * stride];
MORI_UNROLL_ALL
        for (int u = 0; u < U; u++) d[i + u * stride] = v[u];
    }
    for (; i < count; i += stride) d[i] = s[i];
}

// Copies len bytes from src to dst; this thread is number lane of the stride threads that
// share the range.
template <int U>
MORI_DEVICE void mori_copy_range(uint64_t src, uint64_t dst, uint64_t len, uint64_t lane,
                                 uint64_t stride) {
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
    case 16: mori_copy_elems<U>((const mori_vec16_t*)s, (mori_vec16_t*)d, count, lane, stride); break;
    case 8: mori_copy_elems<U>((const uint64_t*)s, (uint64_t*)d, count, lane, stride); break;
    case 4: mori_copy_elems<U>((const uint32_t*)s, (uint32_t*)d, count, lane, stride); break;
    case 2: mori_copy_elems<U>((const uint16_t*)s, (uint16_t*)d, count, lane, stride); break;
    default: mori_copy_elems<U>(s8 + head, d8 + head, count, lane, stride); break;
    }
}

// Two loads in flight per thread (on an H200, 4 or 8 slowed small descriptors and won nothing).
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
        mori_copy_range<2>(descs[i].src, descs[i].dst, descs[i].len, lane, stride);
    }
}

// The work units of a paged copy (see mori_paged_copy) shared out over the grid.
MORI_DEVICE void mori_paged_units(const PagedRun* runs, const PagedParams& p) {
    const uint64_t n64 = (uint64_t)p.layers * p.halves * p.n_runs;
    if (n64 == 0 || n64 > 0xffffffffull) return;
    const uint32_t n = (uint32_t)n64;
    const uint32_t grid = mori_grid_dim();
    const uint32_t k = n < grid ? grid / n : 1;
    const uint32_t groups = grid / k;
    const uint64_t nt = mori_block_dim();
    const uint64_t lane = (mori_block_idx() % k) * nt + mori_thread_idx();
    const uint64_t stride = k * nt;
    for (uint64_t u64 = mori_block_idx() / k; u64 < n; u64 += groups) {
        const uint32_t u = (uint32_t)u64;
        const uint32_t lh = u / p.n_runs;
        const uint32_t r = u - lh * p.n_runs;
        const uint32_t layer = lh / p.halves;
        const uint32_t half = lh - layer * p.halves;
        const uint32_t a_block = runs[r].a_block;
        const uint32_t b_block = runs[r].b_block;
        const uint64_t len = (uint64_t)runs[r].count * p.block_bytes;
        const uint64_t a = p.a_base + layer * p.a_layer_stride + half * p.a_half_stride
                           + a_block * p.a_block_stride;
        const uint64_t b = p.b_base + layer * p.b_layer_stride + half * p.b_half_stride
                           + b_block * p.b_block_stride;
        if (p.a_to_b) {
            mori_copy_range<MORI_PAGED_UNROLL>(a, b, len, lane, stride);
        } else {
            mori_copy_range<MORI_PAGED_UNROLL>(b, a, len, lane, stride);
        }
    }
}

// Launch bounds 1024: registers capped so that every block size up to 1024 launches.
MORI_KERNEL MORI_LAUNCH_BOUNDS(1024) void mori_paged_copy(const PagedRun* runs, PagedParams p) {
    mori_paged_units(runs, p);
}

MORI_KERNEL MORI_LAUNCH_BOUNDS(1024) void mori_paged_copy_inline(const MORI_GRID_CONSTANT PagedInline t) {
    if (t.p.n_runs > MORI_PAGED_INLINE_RUNS) return;
    mori_paged_units(t.runs, t.p);
}

// Per group, the first segment by its run of blocks, the rest by the block of the run that
// arrives last (see the ABI above); the grid must be groups x run blocks. An arrival is a
// grid barrier's: a block barrier (the block's stores before thread 0's next step), thread 0's
// system-scope fence (releasing them) and atomic; in the last block, thread 0's fence after it
// (acquiring every block's) and a block barrier before the rest. Between two later segments,
// every thread fences on both sides of a block barrier. Returns at once for a table it does
// not take. With `stamp` non-zero, the block that writes the flag first stores the GPU clock
// (ns) there (the resident copier's timing; 0 for the launched kernels).
MORI_DEVICE void mori_ordered_runs(const OrderedCopy& t, uint32_t run, uint64_t stamp) {
    if (t.n == 0 || t.n > MORI_ORDERED_SEGS) return;
    const uint32_t groups = t.groups > 1 ? t.groups : 1;
    if (groups > t.n || run == 0) return;
    for (uint32_t i = 0; i < groups; i++) {
        if ((i == 0 && t.first[0] != 0) || (i > 0 && t.first[i] <= t.first[i - 1])
            || t.first[i] >= t.n) return;
    }
    const uint32_t g = mori_block_idx() / run;
    const uint32_t lo = groups > 1 ? t.first[g] : 0;
    const uint32_t hi = g + 1 < groups ? t.first[g + 1] : t.n;
    uint32_t* arrivals = (uint32_t*)t.arrivals;
    const uint64_t nt = mori_block_dim();
    const uint32_t tid = mori_thread_idx();
    mori_copy_range<2>(t.segs[lo].src, t.segs[lo].dst, t.segs[lo].len,
                       (uint64_t)(mori_block_idx() - g * run) * nt + tid, (uint64_t)run * nt);
    mori_sync_block();
    MORI_SHARED_STRUCT(MoriLastSh, last);
    if (tid == 0) {
        mori_fence_system();
        last.v = mori_atomic_add_system_u32(&arrivals[g], 1) == run - 1;
        if (last.v) mori_fence_system();
    }
    mori_sync_block();
    if (!last.v) return;
    for (uint32_t i = lo + 1; i < hi; i++) {
        mori_copy_range<2>(t.segs[i].src, t.segs[i].dst, t.segs[i].len, tid, nt);
        mori_fence_system();
        mori_sync_block();
        mori_fence_system();
    }
    if (tid == 0) {
        *(volatile uint32_t*)&arrivals[g] = 0;
        bool flag = true;
        if (groups > 1) {
            mori_fence_system();
            flag = mori_atomic_add_system_u32(&arrivals[groups], 1) == groups - 1;
            if (flag) *(volatile uint32_t*)&arrivals[groups] = 0;
        }
        if (flag && t.flag != 0) {
            if (stamp) *(volatile uint64_t*)stamp = mori_clock_ns();
            mori_fence_system();
            *(volatile uint32_t*)t.flag = t.flag_value;
        }
    }
}

MORI_KERNEL MORI_LAUNCH_BOUNDS(1024) void mori_ordered_copy(const MORI_GRID_CONSTANT OrderedCopy t) {
    const uint32_t groups = t.groups > 1 ? t.groups : 1;
    if (mori_grid_dim() % groups != 0) return;
    mori_ordered_runs(t, mori_grid_dim() / groups, 0);
}

// The armed form (see the ABI above): the table is read from `table` (host memory the device
// maps, written before the stream's wait on the doorbell let this launch start) with volatile
// loads into shared memory, once per block.
MORI_KERNEL MORI_LAUNCH_BOUNDS(1024) void mori_ordered_copy_armed(const OrderedCopy* table) {
    MORI_SHARED_STRUCT(OrderedCopy, t);
    const volatile uint32_t* src = (const volatile uint32_t*)table;
    uint32_t* dst = (uint32_t*)&t;
    for (uint32_t i = mori_thread_idx(); i < sizeof(OrderedCopy) / 4; i += mori_block_dim()) dst[i] = src[i];
    mori_sync_block();
    // Every block must arrive before the flag is written: a block that returned without
    // arriving could still be unscheduled when the host reuses this table slot.
    const uint32_t groups = t.groups > 1 ? t.groups : 1;
    if (mori_grid_dim() % groups != 0) return;
    mori_ordered_runs(t, mori_grid_dim() / groups, 0);
}

// The word block 0 publishes in scratch for the other blocks (see the ABI above).
MORI_DEVICE uint64_t mori_resident_word(uint32_t gen, uint32_t exit, uint32_t seq) {
    return ((uint64_t)(gen & 0x7fffffffu) << 33) | ((uint64_t)exit << 32) | seq;
}

// Block 0's wait for the next table (see the ABI above): true when one was posted, false when
// the grid exits. Thread 0 only.
MORI_DEVICE bool mori_resident_lead(const ResidentParams& p, volatile uint32_t* ring, uint32_t seq,
                                    uint64_t since) {
    for (;;) {
        if (ring[0] != seq) return true;
        if (ring[1] == 0 && mori_clock_ns() - since < p.idle_ns) continue;
#ifdef MORI_HOST_EMU
        // Tests hold the decision here (a post then finds state 1 and relies on the read below).
        if (p.pad != 0) mori_emu_sleep_us(p.pad);
#endif
        ring[2] = MORI_RESIDENT_EXITING;
        mori_fence_system();
        if (ring[0] == seq) return false;
        ring[2] = MORI_RESIDENT_RUNNING;
        mori_fence_system();
        return true;
    }
}

// The other blocks' wait for block 0's word: true when a table after `seq` was published,
// false on the exit (or with nothing published for idle_ns + 1 s). Thread 0 only.
MORI_DEVICE bool mori_resident_follow(const ResidentParams& p, volatile uint64_t* word, uint32_t seq,
                                      uint64_t since) {
    for (;;) {
        const uint64_t w = *word;
        if ((uint32_t)(w >> 33) == (p.gen & 0x7fffffffu)) {
            if ((uint32_t)w != seq) return true;
            if ((w >> 32) & 1) return false;
        }
        if (mori_clock_ns() - since > p.idle_ns + 1000000000ull) return false;
        mori_backoff();
    }
}

MORI_KERNEL MORI_LAUNCH_BOUNDS(1024) void mori_ordered_copy_resident(const MORI_GRID_CONSTANT ResidentParams p) {
    volatile uint32_t* ring = (volatile uint32_t*)p.ring;
    if (p.depth == 0 || p.depth > 64 || (p.depth & (p.depth - 1)) != 0) {
        if (mori_block_idx() == 0 && mori_thread_idx() == 0) ring[2] = MORI_RESIDENT_EXITED;
        return;
    }
    volatile uint64_t* word = (volatile uint64_t*)p.scratch;
    MORI_SHARED_STRUCT(OrderedCopy, t);
    MORI_SHARED_STRUCT(MoriMoreSh, more);
    const uint32_t tid = mori_thread_idx();
    const bool lead = mori_block_idx() == 0;
    uint32_t seq = p.start;
    uint64_t seen = 0; // block 0's thread 0: when it saw the table posted
    if (tid == 0) ring[(MORI_RESIDENT_STRIDE + p.depth * MORI_RESIDENT_STRIDE) / 4 + mori_block_idx()] = p.gen;
    if (lead && tid == 0) {
        *word = mori_resident_word(p.gen, 0, seq);
        ring[2] = MORI_RESIDENT_RUNNING;
        mori_fence_system();
    }
    uint64_t since = mori_clock_ns();
    for (;;) {
        if (tid == 0) {
            // Acquire: block 0 then reads the host's table, the others block 0's copy.
            if (lead) {
                more.v = mori_resident_lead(p, ring, seq, since);
                seen = mori_clock_ns();
                mori_fence_system();
            } else {
                more.v = mori_resident_follow(p, word, seq, since);
                mori_fence_device();
            }
        }
        mori_sync_block();
        if (!more.v) break;
        seq += 1;
        const uint32_t off = MORI_RESIDENT_STRIDE + (seq & (p.depth - 1)) * MORI_RESIDENT_STRIDE;
        uint32_t* dst = (uint32_t*)&t;
        const uint32_t words = sizeof(OrderedCopy) / 4;
        if (lead) {
            if (tid == 0) *(volatile uint64_t*)(p.ring + off + MORI_RESIDENT_SEEN) = seen;
            const volatile uint32_t* src = (const volatile uint32_t*)(p.ring + off);
            volatile uint32_t* rel = (volatile uint32_t*)(p.scratch + off);
            for (uint32_t i = tid; i < words; i += mori_block_dim()) {
                const uint32_t v = src[i];
                dst[i] = v;
                rel[i] = v;
            }
            // Release: the block's copies, then thread 0's fence, then the word.
            mori_sync_block();
            if (tid == 0) {
                mori_fence_device();
                *word = mori_resident_word(p.gen, 0, seq);
                *(volatile uint64_t*)(p.ring + off + MORI_RESIDENT_RELAYED) = mori_clock_ns();
            }
        } else {
            const volatile uint32_t* src = (const volatile uint32_t*)(p.scratch + off);
            for (uint32_t i = tid; i < words; i += mori_block_dim()) dst[i] = src[i];
            mori_sync_block();
        }
        const uint32_t groups = t.groups > 1 ? t.groups : 1;
        if (mori_grid_dim() % groups == 0) mori_ordered_runs(t, mori_grid_dim() / groups, p.ring + off + MORI_RESIDENT_FLAGGED);
        // Every thread is done with `t` and `more` before thread 0 waits for the next table.
        mori_sync_block();
        since = mori_clock_ns();
    }
    if (lead && tid == 0) {
        *word = mori_resident_word(p.gen, 1, seq);
        ring[3] = seq;
        mori_fence_system();
        ring[2] = MORI_RESIDENT_EXITED;
        mori_fence_system();
    }
}

#ifdef MORI_HOST_EMU
// The resident grid on CPU threads, for its protocol's tests (crates/ep/src/copy_emu_tests.rs).
MORI_EMU_EXPORT(mori_ordered_copy_resident, ResidentParams)
#endif
