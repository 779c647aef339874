// cp.async (sm80 and newer): asynchronous copies from global to shared memory that zero-fill
// what they do not copy, so rows past the end of a tensor load as zeros without a branch around
// the copy; used by the sm80 kernels and the sm90 backward's K/V and statistics loads.
#pragma once

#include <cstdint>

#include "cuda/kernels/common/types.cuh"

namespace memeff::cuda {

// 16-byte asynchronous copy; copies `src_bytes` (0 or 16) and zero-fills the rest, so rows past
// the end of a tensor load as zeros without a branch around the copy.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// 4-byte asynchronous copy global -> shared, zero-filled when src_bytes is 0.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(src_bytes));
}

}  // namespace memeff::cuda
