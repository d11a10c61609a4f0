// shmem.cu: device helpers of mori-shmem (symmetric heap).
//
// ABI (CUDA cuLaunchKernel / HIP hipModuleLaunchKernel):
//   symbol  mori_shmem_atomic_add_u64 (extern "C")
//   params  0: uint64_t* target  8 bytes (a device address, local or a peer's mapped heap)
//           1: uint64_t value    8 bytes
//           2: uint64_t* old     8 bytes (receives the value before the add; may be 0)
//   launch  1 block of 1 thread.
// The add is a system-scope atomic (atomicAdd_system / __hip_atomic_fetch_add, system scope),
// so it is atomic against the same add from kernels of other ranks and processes.
#include "mori_gpu.h"

MORI_KERNEL void mori_shmem_atomic_add_u64(uint64_t* target, uint64_t value, uint64_t* old) {
    if (mori_thread_idx() != 0 || mori_block_idx() != 0) return;
    const uint64_t before = mori_atomic_add_system(target, value);
    if (old) *old = before;
}
