// mori_gpu.h: the portability layer of the kernels in kernels/*.cu.
//
// The same source is compiled by nvcc (CUDA, sm_90) and by clang in HIP mode (gfx942,
// gfx950) with -nogpulib -nogpuinc, so in HIP mode this header uses no vendor header:
// only clang attributes and __builtin_amdgcn_* / __hip_atomic_* builtins.
// Kernels use MORI_KERNEL (extern "C": the symbol name is the function name), MORI_DEVICE
// for helpers, and the mori_* functions below instead of threadIdx/__syncthreads/atomics.
#pragma once

typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __UINT64_TYPE__ uint64_t;

#if defined(__HIP__) // clang -x hip
#define MORI_DEVICE __attribute__((device)) inline __attribute__((always_inline))
#define MORI_KERNEL extern "C" __attribute__((global))
#define MORI_SHARED __attribute__((shared))
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

#elif defined(__CUDACC__) // nvcc
#define MORI_DEVICE __device__ __forceinline__
#define MORI_KERNEL extern "C" __global__
#define MORI_SHARED __shared__
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

#else
#error "mori_gpu.h: compile with nvcc or with clang -x hip"
#endif
