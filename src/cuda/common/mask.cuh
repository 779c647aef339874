// Masking and the additive bias on a score fragment (the m16n8 C layout of src/cuda/common/
// softmax.cuh), shared by both kernel families: keys past the end of the sequence and, with a
// causal mask, keys after the (shifted) diagonal become -inf; the bias is read per element with
// its broadcast strides; rows that see a single key (whose dS is exactly 0).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/visible_keys.h"
#include "cuda/common/types.cuh"

namespace memeff::cuda {

// Rows row0 (thread's row g) and row0 + 8; columns start at absolute key n0. Query i sees key j
// iff j < Lk and, when causal, j <= i + causal_shift.
template <int kNT>
__device__ __forceinline__ void mask_scores(float (&s)[kNT][4], std::int64_t row0, std::int64_t n0,
                                            int t, std::int64_t Lk, bool causal,
                                            std::int64_t causal_shift) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const std::int64_t i = row0 + 8 * hh;
    const std::int64_t j_limit = causal ? min(Lk, i + causal_shift + 1) : Lk;
    // Visible columns of this lane within the fragment: 8n + e < lim.
    const int lim = static_cast<int>(
        max(min(j_limit - n0 - 2 * t, static_cast<std::int64_t>(8 * kNT)), std::int64_t{0}));
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (8 * n + e >= lim) s[n][2 * hh + e] = -INFINITY;
      }
  }
}

using detail::sees_one_key;  // rows whose dS is exactly 0 (core/visible_keys.h)

template <class T>
__device__ __forceinline__ float load_bias(const void* bias, bool is_fp32, std::int64_t index) {
  return is_fp32 ? __ldg(static_cast<const float*>(bias) + index)
                 : to_float<T>(static_cast<const T*>(bias)[index]);
}

// s = scale·s + bias(i, j) for the fragment's two rows (0 where i >= Lq or j >= Lk). `base` is
// the offset of (b, h) in the bias, `stride_l` its row stride (0 when broadcast over queries).
template <class T, int kNT>
__device__ __forceinline__ void add_scaled_bias(float (&s)[kNT][4], const void* bias, bool is_fp32,
                                                std::int64_t base, std::int64_t stride_l,
                                                std::int64_t row0, std::int64_t n0, int t,
                                                std::int64_t Lq, std::int64_t Lk, float scale) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const std::int64_t i = row0 + 8 * hh;
    const std::int64_t row_base = base + i * stride_l;
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t j = n0 + 8 * n + 2 * t + e;
        const float bv = (i < Lq && j < Lk) ? load_bias<T>(bias, is_fp32, row_base + j) : 0.0f;
        s[n][2 * hh + e] = fmaf(s[n][2 * hh + e], scale, bv);
      }
  }
}

}  // namespace memeff::cuda
