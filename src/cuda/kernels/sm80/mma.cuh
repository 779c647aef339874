// Thin wrappers over the sm80+ warp-level instructions the mma.sync kernels are built from:
// ldmatrix and mma.sync m16n8k16 with fp32 accumulators (cp.async is common/cp_async.cuh). Fragment
// layouts are written down once here so the kernels and the dropout helpers agree on them (wgmma's
// accumulators use the same C layout per warp).
//
// m16n8k16 fragments (lane = 4·g + t, g = lane / 4 in 0..7, t = lane % 4 in 0..3):
//   A (16x16, row-major): a0 = (g, 2t..2t+1) a1 = (g+8, 2t..) a2 = (g, 2t+8..) a3 = (g+8, 2t+8..)
//   B (16x8, "col"):      b0 = (k = 2t..2t+1, n = g)        b1 = (k = 2t+8..2t+9, n = g)
//   C (16x8, fp32):       c0, c1 = (g, 2t), (g, 2t+1)       c2, c3 = (g+8, 2t), (g+8, 2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/common/types.cuh"

namespace memeff::cuda::sm80 {

// ldmatrix: lanes 8·m .. 8·m+7 give the row addresses of matrix m; r[m] receives this lane's
// two elements (row lane / 4, columns 2·(lane % 4)..+1) of matrix m.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

// D = A·B + C for one m16n8k16 tile, fp32 accumulate in place.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const std::uint32_t (&a)[4],
                                          const std::uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const std::uint32_t (&a)[4],
                                                         const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// An fp32 C fragment pair (two n8 tiles side by side, 16x16) repacked as the A operand of the
// next product (P·V in the forward): C's layout over 16 columns equals A's.
template <class T>
__device__ __forceinline__ void c_pair_to_a(std::uint32_t (&a)[4], const float (&c_left)[4],
                                            const float (&c_right)[4]) {
  a[0] = pack2<T>(c_left[0], c_left[1]);
  a[1] = pack2<T>(c_left[2], c_left[3]);
  a[2] = pack2<T>(c_right[0], c_right[1]);
  a[3] = pack2<T>(c_right[2], c_right[3]);
}

}  // namespace memeff::cuda::sm80
