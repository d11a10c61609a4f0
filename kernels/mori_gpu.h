// mori_gpu.h: the portability layer of the kernels in kernels/*.cu.
//
// The same source is compiled by nvcc (CUDA, sm_90) and by clang in HIP mode (gfx942,
// gfx950) with -nogpulib -nogpuinc, so in HIP mode this header uses no vendor header:
// only clang attributes and __builtin_amdgcn_* / __hip_atomic_* builtins. With
// -DMORI_HOST_EMU a host C++ compiler builds kernels that use no shared memory into a
// library whose threads run them on the CPU (tests only; see the end of this header).
// Kernels use MORI_KERNEL (extern "C": the symbol name is the function name), MORI_DEVICE
// for helpers, and the mori_* functions below instead of threadIdx/__syncthreads/atomics.
#pragma once

typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __UINT64_TYPE__ uint64_t;
typedef __INT32_TYPE__ int32_t;
typedef __INT64_TYPE__ int64_t;

#if defined(__HIP__) // clang -x hip
#define MORI_DEVICE __attribute__((device)) inline __attribute__((always_inline))
#define MORI_KERNEL extern "C" __attribute__((global))
#define MORI_SHARED __attribute__((shared))
// A block's shared variable of struct type T (the form MORI_HOST_EMU can emulate).
#define MORI_SHARED_STRUCT(T, name) __attribute__((shared)) T name
// Kernel launchable with up to n threads per block (caps registers per thread accordingly).
#define MORI_LAUNCH_BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
// The same; the residency hint m is CUDA's only (HIP keeps the compiler's register choice).
#define MORI_LAUNCH_BOUNDS_RESIDENT(n, m) __attribute__((amdgpu_flat_work_group_size(1, n)))
// A by-value kernel parameter read in place (kernel arguments already live in readable memory).
#define MORI_GRID_CONSTANT
typedef uint32_t mori_vec16_t __attribute__((ext_vector_type(4))); // 16 bytes, 16-aligned

MORI_DEVICE uint32_t mori_thread_idx() { return __builtin_amdgcn_workitem_id_x(); }
MORI_DEVICE uint32_t mori_block_idx() { return __builtin_amdgcn_workgroup_id_x(); }
MORI_DEVICE uint32_t mori_block_dim() { return __builtin_amdgcn_workgroup_size_x(); }
// grid_size_x counts work-items; launches use whole blocks.
MORI_DEVICE uint32_t mori_grid_dim() { return __builtin_amdgcn_grid_size_x() / mori_block_dim(); }
MORI_DEVICE void mori_sync_block() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
MORI_DEVICE void mori_fence_system() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, ""); }
MORI_DEVICE uint64_t mori_atomic_add_system(uint64_t* p, uint64_t v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
MORI_DEVICE uint32_t mori_atomic_add_system_u32(uint32_t* p, uint32_t v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
MORI_DEVICE uint32_t mori_atomic_cas_system_u32(uint32_t* p, uint32_t expected, uint32_t desired) {
    __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                         __HIP_MEMORY_SCOPE_SYSTEM);
    return expected;
}
// Block-scope atomic add (shared memory counters).
MORI_DEVICE uint32_t mori_atomic_add_block_u32(uint32_t* p, uint32_t v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
}
MORI_DEVICE uint64_t mori_load_acquire_system(const uint64_t* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
MORI_DEVICE void mori_store_release_system(uint64_t* p, uint64_t v) {
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// Device-scope (one GPU) variants: ordering among one rank's blocks, or among ranks that all
// live on the same device.
MORI_DEVICE void mori_fence_device() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }
MORI_DEVICE uint32_t mori_atomic_add_device_u32(uint32_t* p, uint32_t v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
MORI_DEVICE uint64_t mori_load_acquire_device(const uint64_t* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
MORI_DEVICE void mori_store_release_device(uint64_t* p, uint64_t v) {
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
// Nanoseconds from a constant-rate clock (s_memrealtime runs at 100 MHz).
MORI_DEVICE uint64_t mori_clock_ns() { return __builtin_amdgcn_s_memrealtime() * 10; }
// A short pause (about 128 cycles) between polls of memory another agent writes, so that many
// pollers of host memory do not fill the bus with reads.
MORI_DEVICE void mori_backoff() { __builtin_amdgcn_s_sleep(2); }
// Synchronizes the 32-thread group (a half or whole wavefront) the calling thread is in.
MORI_DEVICE void mori_sync_group32() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
// Index of the lowest set bit of a non-zero value.
MORI_DEVICE uint32_t mori_ctz64(uint64_t v) { return (uint32_t)__builtin_ctzll(v); }

#elif defined(__CUDACC__) // nvcc
#define MORI_DEVICE __device__ __forceinline__
#define MORI_KERNEL extern "C" __global__
#define MORI_SHARED __shared__
// A block's shared variable of struct type T (the form MORI_HOST_EMU can emulate).
#define MORI_SHARED_STRUCT(T, name) __shared__ T name
// Kernel launchable with up to n threads per block (caps registers per thread accordingly).
#define MORI_LAUNCH_BOUNDS(n) __launch_bounds__(n)
// The same, with m such blocks resident per multiprocessor (caps registers per thread at
// 65536 / (n * m)).
#define MORI_LAUNCH_BOUNDS_RESIDENT(n, m) __launch_bounds__(n, m)
// A by-value kernel parameter read in place, never copied to local memory (sm_70+, CUDA 11.7+).
#define MORI_GRID_CONSTANT __grid_constant__
typedef uint4 mori_vec16_t; // 16 bytes, 16-aligned

MORI_DEVICE uint32_t mori_thread_idx() { return threadIdx.x; }
MORI_DEVICE uint32_t mori_block_idx() { return blockIdx.x; }
MORI_DEVICE uint32_t mori_block_dim() { return blockDim.x; }
MORI_DEVICE uint32_t mori_grid_dim() { return gridDim.x; }
MORI_DEVICE void mori_sync_block() { __syncthreads(); }
MORI_DEVICE void mori_fence_system() { __threadfence_system(); }
MORI_DEVICE uint64_t mori_atomic_add_system(uint64_t* p, uint64_t v) {
    return atomicAdd_system((unsigned long long*)p, (unsigned long long)v);
}
MORI_DEVICE uint32_t mori_atomic_add_system_u32(uint32_t* p, uint32_t v) {
    return atomicAdd_system((unsigned int*)p, (unsigned int)v);
}
MORI_DEVICE uint32_t mori_atomic_cas_system_u32(uint32_t* p, uint32_t expected, uint32_t desired) {
    return atomicCAS_system((unsigned int*)p, (unsigned int)expected, (unsigned int)desired);
}
// Block-scope atomic add (shared memory counters).
MORI_DEVICE uint32_t mori_atomic_add_block_u32(uint32_t* p, uint32_t v) {
    return atomicAdd_block((unsigned int*)p, (unsigned int)v);
}
MORI_DEVICE uint64_t mori_load_acquire_system(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
MORI_DEVICE void mori_store_release_system(uint64_t* p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Device-scope (one GPU) variants: ordering among one rank's blocks, or among ranks that all
// live on the same device.
MORI_DEVICE void mori_fence_device() { __threadfence(); }
MORI_DEVICE uint32_t mori_atomic_add_device_u32(uint32_t* p, uint32_t v) {
    return atomicAdd((unsigned int*)p, (unsigned int)v);
}
MORI_DEVICE uint64_t mori_load_acquire_device(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
MORI_DEVICE void mori_store_release_device(uint64_t* p, uint64_t v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Nanoseconds from the global timer.
MORI_DEVICE uint64_t mori_clock_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// A short pause (about 128 ns) between polls of memory another agent writes, so that many
// pollers of host memory do not fill the bus with reads.
MORI_DEVICE void mori_backoff() { __nanosleep(128); }
// Synchronizes the 32-thread warp the calling thread is in.
MORI_DEVICE void mori_sync_group32() { __syncwarp(); }
// Index of the lowest set bit of a non-zero value.
MORI_DEVICE uint32_t mori_ctz64(uint64_t v) { return (uint32_t)(__ffsll((long long)v) - 1); }

#elif defined(MORI_HOST_EMU) // g++/clang++ -std=c++20 -pthread: the kernels on CPU threads, for tests
// Every GPU thread of a launch is an OS thread (mori_emu_launch); blocks and 32-thread groups
// synchronize through barriers, atomics are the compiler's (system scope = the process),
// device memory is host memory. Reading the clock yields the CPU: every spin loop reads it for
// its deadline, and spinning threads would otherwise starve the ones they wait for. Shared
// memory is emulated for MORI_SHARED_STRUCT (one zeroed instance per block and type);
// MORI_SHARED arrays do not compile here.
#include <barrier>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sched.h>
#include <thread>
#include <time.h>
#include <vector>
#define MORI_DEVICE inline
#define MORI_KERNEL extern "C"
#define MORI_LAUNCH_BOUNDS(n)
#define MORI_LAUNCH_BOUNDS_RESIDENT(n, m)
#define MORI_GRID_CONSTANT
#define MORI_SHARED static_assert(false, "shared memory is not emulated by MORI_HOST_EMU");
struct alignas(16) mori_vec16_t { uint32_t x, y, z, w; };

struct mori_emu_block {
    std::barrier<> all;
    std::vector<std::unique_ptr<std::barrier<>>> groups;
    std::mutex shared_mu;
    std::vector<std::pair<const void*, void*>> shared; // (type tag, instance)
    explicit mori_emu_block(uint32_t threads) : all(threads) {
        for (uint32_t i = 0; i < threads / 32; i++) groups.emplace_back(new std::barrier<>(32));
    }
    ~mori_emu_block() {
        for (auto& s : shared) std::free(s.second);
    }
};
struct mori_emu_ctx {
    uint32_t tid, bid, bdim, gdim;
    mori_emu_block* block;
};
inline thread_local mori_emu_ctx mori_emu_tls;

MORI_DEVICE uint32_t mori_thread_idx() { return mori_emu_tls.tid; }
MORI_DEVICE uint32_t mori_block_idx() { return mori_emu_tls.bid; }
MORI_DEVICE uint32_t mori_block_dim() { return mori_emu_tls.bdim; }
MORI_DEVICE uint32_t mori_grid_dim() { return mori_emu_tls.gdim; }
MORI_DEVICE void mori_sync_block() { mori_emu_tls.block->all.arrive_and_wait(); }
MORI_DEVICE void mori_sync_group32() { mori_emu_tls.block->groups[mori_emu_tls.tid / 32]->arrive_and_wait(); }
MORI_DEVICE void mori_fence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
MORI_DEVICE void mori_fence_device() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
MORI_DEVICE uint64_t mori_atomic_add_system(uint64_t* p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
MORI_DEVICE uint32_t mori_atomic_add_system_u32(uint32_t* p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
MORI_DEVICE uint32_t mori_atomic_add_device_u32(uint32_t* p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
MORI_DEVICE uint32_t mori_atomic_add_block_u32(uint32_t* p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
MORI_DEVICE uint32_t mori_atomic_cas_system_u32(uint32_t* p, uint32_t expected, uint32_t desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;
}
MORI_DEVICE uint64_t mori_load_acquire_system(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
MORI_DEVICE uint64_t mori_load_acquire_device(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
MORI_DEVICE void mori_store_release_system(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
MORI_DEVICE void mori_store_release_device(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
MORI_DEVICE void mori_backoff() { sched_yield(); }
MORI_DEVICE uint64_t mori_clock_ns() {
    sched_yield();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
MORI_DEVICE uint32_t mori_ctz64(uint64_t v) { return (uint32_t)__builtin_ctzll(v); }
// Sleeps `us` microseconds (tests hold an emulated kernel at a chosen step with it).
MORI_DEVICE void mori_emu_sleep_us(uint32_t us) {
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&ts, nullptr);
}

// The calling block's instance of shared struct T (zeroed at first use).
template <typename T>
T& mori_emu_shared() {
    static const char tag = 0;
    mori_emu_block* b = mori_emu_tls.block;
    std::lock_guard<std::mutex> g(b->shared_mu);
    for (auto& s : b->shared)
        if (s.first == &tag) return *(T*)s.second;
    void* m = std::aligned_alloc(64, (sizeof(T) + 63) / 64 * 64);
    __builtin_memset(m, 0, (sizeof(T) + 63) / 64 * 64);
    b->shared.emplace_back(&tag, m);
    return *(T*)m;
}
#define MORI_SHARED_STRUCT(T, name) T& name = mori_emu_shared<T>()

// Runs kernel k over grid x block threads (block a multiple of 32) and returns when all ended.
template <typename P>
void mori_emu_launch(void (*k)(P), uint32_t grid, uint32_t block, const P& p) {
    std::vector<std::unique_ptr<mori_emu_block>> blocks;
    for (uint32_t b = 0; b < grid; b++) blocks.emplace_back(new mori_emu_block(block));
    std::vector<std::thread> threads;
    for (uint32_t b = 0; b < grid; b++)
        for (uint32_t t = 0; t < block; t++)
            threads.emplace_back([=, &blocks] {
                mori_emu_tls = mori_emu_ctx{t, b, block, grid, blocks[b].get()};
                k(p);
            });
    for (auto& th : threads) th.join();
}
// Exports `mori_emu_NAME(grid, block, params)`: the launch of kernel NAME, whose by-value
// parameter is read from `params` (laid out as on the GPU).
#define MORI_EMU_EXPORT(name, P)                                                              \
    extern "C" __attribute__((visibility("default"))) int mori_emu_##name(uint32_t grid, uint32_t block, const void* params) { \
        if (block == 0 || block % 32 != 0) return 1;                                          \
        mori_emu_launch<P>(name, grid, block, *(const P*)params);                             \
        return 0;                                                                             \
    }

#else
#error "mori_gpu.h: compile with nvcc or with clang -x hip (or define MORI_HOST_EMU for the CPU emulation)"
#endif
