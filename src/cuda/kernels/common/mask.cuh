// Masking and the additive bias, shared by both kernel families: the mask policy (KeyMask: the
// trip counts of the kernels' loops under a causal mask), the masking of a score fragment (the
// m16n8 C layout of common/softmax.cuh: keys past the end of the sequence and, with a causal
// mask, keys after the shifted diagonal become -inf), the bias read per element with its
// broadcast strides, and rows that see a single key (dS exactly 0).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/hostdevice.h"
#include "core/visible_keys.h"
#include "cuda/kernels/common/types.cuh"

namespace memeff::cuda {

// One row (half hh: row g or g + 8) of a score fragment whose columns start at absolute key n0:
// columns j >= j_limit become -inf (j_limit: the row's first invisible key).
template <int kNT>
__device__ __forceinline__ void mask_row(float (&s)[kNT][4], int hh, std::int64_t j_limit,
                                         std::int64_t n0, int t) {
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

// Rows row0 (thread's row g) and row0 + 8; columns start at absolute key n0. Query i sees key j
// iff j < Lk and, when causal, j <= i + causal_shift.
template <int kNT>
__device__ __forceinline__ void mask_scores(float (&s)[kNT][4], std::int64_t row0, std::int64_t n0,
                                            int t, std::int64_t Lk, bool causal,
                                            std::int64_t causal_shift) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const std::int64_t i = row0 + 8 * hh;
    mask_row(s, hh, causal ? min(Lk, i + causal_shift + 1) : Lk, n0, t);
  }
}

using detail::sees_one_key;  // rows whose dS is exactly 0 (core/visible_keys.h)

// The mask of one sequence as a policy over tiles: the trip counts of the kernels' loops, so no
// kernel spells out the causal arithmetic of its bounds. Query i sees key j iff j < Lk and, when
// causal, j <= i + shift. Inside the main loops the kernels test a tile (does it cross the end
// of the keys or the diagonal?) and mask it with mask_scores in place: built there, a KeyMask
// kept its copies of Lk and the shift in registers through the loop (ptxas, sm_90a: the sm90
// backward with bias spilled up to 440 bytes more), while the trip counts below, taken once per
// CTA, compile to the code they replaced.
struct KeyMask {
  bool causal;
  std::int64_t Lk;     // keys of the sequence
  std::int64_t shift;  // the causal diagonal: i + shift is the last key query i sees

  // Key tiles [0, n) of kBlockN keys of which some row of the query block [m0, m0 + kBlockM)
  // sees a key: the forward's trip count over key tiles.
  template <int kBlockM, int kBlockN>
  MEMEFF_HD int key_tiles(std::int64_t m0) const {
    std::int64_t n_end = Lk;  // keys [0, n_end) can be visible to some row of the block
    if (causal) n_end = min(n_end, m0 + kBlockM + shift);
    return n_end > 0 ? static_cast<int>((n_end + kBlockN - 1) / kBlockN) : 0;
  }

  // The first of `m_blocks` query blocks of kBlockM rows with a row that sees key n0 (and so
  // any key of the block starting there): the backward's trip count over query blocks starts
  // here (m_blocks when none does).
  template <int kBlockM>
  MEMEFF_HD int first_query_block(std::int64_t n0, int m_blocks) const {
    if (!causal) return 0;
    const std::int64_t need = n0 - shift - (kBlockM - 1);  // the smallest m·kBlockM it takes
    if (need <= 0) return 0;
    return static_cast<int>(
        min((need + kBlockM - 1) / kBlockM, static_cast<std::int64_t>(m_blocks)));
  }
};

template <class T>
__device__ __forceinline__ float load_bias(const void* bias, bool is_fp32, std::int64_t index) {
  return is_fp32 ? __ldg(static_cast<const float*>(bias) + index)
                 : to_float<T>(static_cast<const T*>(bias)[index]);
}

// s = scale·s + bias(i, j) for one row (half hh) of a fragment: `row_base` is the offset of the
// row's (b, h, i) in the bias; its bias is read only when `row_valid` and j < Lk (0 otherwise).
// kSelect: -inf where the bias is -inf, whatever s holds (a compare and a select per score, for
// kernels bound by memory such as the split-KV forward; the fused ones add, and
// bias_row_repair.cuh repairs what that let through).
template <class T, int kNT, bool kSelect = false>
__device__ __forceinline__ void add_scaled_bias_row(float (&s)[kNT][4], int hh, const void* bias,
                                                    bool is_fp32, std::int64_t row_base,
                                                    bool row_valid, std::int64_t n0, int t,
                                                    std::int64_t Lk, float scale) {
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const std::int64_t j = n0 + 8 * n + 2 * t + e;
      const float bv = (row_valid && j < Lk) ? load_bias<T>(bias, is_fp32, row_base + j) : 0.0f;
      const float x = fmaf(s[n][2 * hh + e], scale, bv);
      s[n][2 * hh + e] = kSelect && bv == -INFINITY ? bv : x;
    }
}

// s = scale·s + bias(i, j) for the fragment's two rows (0 where i >= Lq or j >= Lk). `base` is
// the offset of (b, h) in the bias, `stride_l` its row stride (0 when broadcast over queries).
// A NaN or Inf score at a -inf bias entry gives NaN here: after a biased fused forward a kernel
// recomputes the rows whose lse came out NaN (bias_row_repair.cuh); the backwards clamp the score
// before the bias (bias_safe_score).
template <class T, int kNT>
__device__ __forceinline__ void add_scaled_bias(float (&s)[kNT][4], const void* bias, bool is_fp32,
                                                std::int64_t base, std::int64_t stride_l,
                                                std::int64_t row0, std::int64_t n0, int t,
                                                std::int64_t Lq, std::int64_t Lk, float scale) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const std::int64_t i = row0 + 8 * hh;
    add_scaled_bias_row<T>(s, hh, bias, is_fp32, base + i * stride_l, i < Lq, n0, t, Lk, scale);
  }
}

// The backward's score before scale·s + bias: a NaN or +inf score becomes a finite one, so a -inf
// bias entry gives exp(-inf) = 0 there, as the forward's selection does, at one min per score.
// What it changes elsewhere cannot show: a row whose scores reach a NaN or +inf at a key it sees
// has a NaN lse, and exp(x - NaN) is NaN. Needs scale > 0 (the fused backwards refuse a bias with
// scale <= 0: -inf·scale would turn over); `limit` is bias_score_limit(scale).
__device__ __forceinline__ float bias_safe_score(float s, float limit) { return fminf(s, limit); }
// FLT_MAX / max(1, scale): the largest score whose product with scale is finite.
__device__ __forceinline__ float bias_score_limit(float scale) {
  return 3.4e38f / fmaxf(1.0f, scale);
}

}  // namespace memeff::cuda
