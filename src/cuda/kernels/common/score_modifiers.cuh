// The score modifiers of docs/window.md (ScoreMods, params.h) on the forward's score fragments:
// the sliding window's element mask, ALiBi's distance penalty and the softcap, each applied in
// place to the m16n8 C layout of common/softmax.cuh (a thread's rows row0 and row0 + 8, its keys
// n0 + 8n + 2t + {0, 1}), and the tanh the cap takes, to the absolute accuracy a score needs.
// The backwards apply the same rules to their Sᵀ fragments with these scalar helpers; the split-KV
// forward, whose rows are of several heads, row by row (add_alibi_row, mask_row_span).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/types.cuh"

namespace memeff::cuda {

// tanh(x) = 1 - 2 / (1 + exp(2x)) from y = 2·log2(e)·x, to a few 1e-7 absolute: one MUFU.EX2, one
// MUFU.RCP and three ops, few registers per score; ±inf give ±1 and NaN stays NaN. A score takes
// the cap's absolute error times softcap: tanh.approx.f32 (one MUFU.TANH, 2^-11 relative) would
// put up to softcap·2^-11 into it, 2.4% of P at softcap 50, above the fp16 tolerance of the tests.
__device__ __forceinline__ float tanh_of_exp2_arg(float y) {
  return fmaf(-2.0f, __fdividef(1.0f, 1.0f + fast_exp2(y)), 1.0f);
}

// The capped score in the units the kernels keep it (ScoreMods::softcap_exp2, softcap_out).
__device__ __forceinline__ float softcap_score(float s, const ScoreMods& m) {
  return tanh_of_exp2_arg(s * m.softcap_exp2) * m.softcap_out;
}

template <int kNT>
__device__ __forceinline__ void softcap_scores(float (&s)[kNT][4], const ScoreMods& m) {
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) s[n][r] = softcap_score(s[n][r], m);
}

// A backward's P∘Z (in T, as its dV product takes it) and the cap's derivative 1 - tanh² (fp16:
// it lies in [0, 1]) in one 32-bit register, the word of the element's fp32 P∘Z: dbias takes dS
// before the derivative multiplies it, and meanwhile no fragment beyond the plain step's is held.
template <class T>
__device__ __forceinline__ float pack_p_and_cap_grad(float pz, float cap_grad) {
  return __uint_as_float((std::uint32_t{bits16(from_float<T>(pz))} << 16) |
                         bits16(__float2half_rn(cap_grad)));
}
__device__ __forceinline__ float cap_grad_of(float packed) {
  return unpack_lo<__half>(__float_as_uint(packed));
}
template <class T>
__device__ __forceinline__ float p_of_packed(float packed) {
  return unpack_hi<T>(__float_as_uint(packed));
}

// The ALiBi slope of (b, h): b the batch entry, or the sequence when packed.
__device__ __forceinline__ float alibi_slope(const ScoreMods& m, int b, int h) {
  return __ldg(m.alibi_slopes + b * m.alibi_stride_b + h * m.alibi_stride_h);
}

// s -= slope·|i + shift - j| on one row (half hh) of scores in natural units (scale applied):
// `diagonal` is i + shift - n0 - 2t, the signed distance of the row and the thread's first key.
// Distances are fp32, exact below 2^24 keys.
template <int kNT>
__device__ __forceinline__ void add_alibi_row(float (&s)[kNT][4], int hh, float slope,
                                              std::int64_t diagonal) {
  const float d0 = static_cast<float>(diagonal);
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[n][2 * hh + e] = fmaf(-slope, fabsf(d0 - static_cast<float>(8 * n + e)), s[n][2 * hh + e]);
    }
}

// add_alibi_row on rows row0 and row0 + 8 of one head: `diagonal` is row0 + shift - n0 - 2t.
template <int kNT>
__device__ __forceinline__ void add_alibi(float (&s)[kNT][4], float slope, std::int64_t diagonal) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) add_alibi_row(s, hh, slope, diagonal + 8 * hh);
}

// One row (half hh) of a fragment whose columns start at key n0: keys outside [begin, end) become
// -inf (all of them when end <= begin).
template <int kNT>
__device__ __forceinline__ void mask_row_span(float (&s)[kNT][4], int hh, std::int64_t begin,
                                              std::int64_t end, std::int64_t n0, int t) {
  const int first = fragment_column<kNT>(begin, n0, t);
  const int limit = fragment_column<kNT>(end, n0, t);
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (8 * n + e < first || 8 * n + e >= limit) s[n][2 * hh + e] = -INFINITY;
    }
}

// The window's mask (with Lk's and the causal one: KeyMask::keys_of_row) on rows row0 and
// row0 + 8: keys outside each row's span become -inf.
template <int kNT>
__device__ __forceinline__ void mask_scores_window(float (&s)[kNT][4], std::int64_t row0,
                                                   std::int64_t n0, int t, const KeyMask& mask) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const detail::KeySpan keys = mask.keys_of_row(row0 + 8 * hh);
    mask_row_span(s, hh, keys.begin, keys.end, n0, t);
  }
}

}  // namespace memeff::cuda
