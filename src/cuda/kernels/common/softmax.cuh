// The online softmax on MMA accumulator fragments, shared by the sm80 (mma.sync) and sm90 (wgmma)
// kernels. Both hold scores in the m16n8 C layout: a thread owns rows g and g + 8 (g = lane / 4)
// of a 16-row tile and columns 8n + 2t + {0, 1} (t = lane % 4) of each n8 tile n, so a row's
// values are spread over the four lanes of a quad and reduced with two shuffles.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <numbers>

namespace memeff::cuda {

inline constexpr float kLog2e = std::numbers::log2e_v<float>;

// 2^x by the special-function unit (one MUFU.EX2, flush-to-zero: P below 2^-126 is 0, as in
// FlashAttention; exp2f adds denormal handling). 2^-inf = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Max and sum over the four lanes (t = 0..3) that share a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 1);
  return x + __shfl_xor_sync(0xFFFFFFFFu, x, 2);
}

// One online-softmax step for the two rows (hh = 0: row g, 1: row g + 8) of a 16-row tile with
// kNT n8 column tiles. Scores x are exponentiated as exp2(x·f - m·f) (f > 0 folds the softmax scale
// and log2 e). On return s holds the unnormalized probabilities, row_m the running maxima
// (quad-reduced), alpha the factor the previous partial sums and outputs must be multiplied by,
// and sum this thread's share of the new probabilities' row sums (not quad-reduced).
// A row with nothing visible yet keeps m = -inf and is exponentiated against 0, so masked entries
// give exp2(-inf) = 0 and never -inf - -inf.
template <int kNT>
__device__ __forceinline__ void online_softmax_step(float (&s)[kNT][4], float (&row_m)[2], float f,
                                                    float (&alpha)[2], float (&sum)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float mx = row_m[hh];
#pragma unroll
    for (int n = 0; n < kNT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * hh], s[n][2 * hh + 1]));
    mx = quad_max(mx);
    const float m_scaled = mx == -INFINITY ? 0.0f : mx * f;
    alpha[hh] = fast_exp2(row_m[hh] * f - m_scaled);  // f > 0: -inf stays -inf
    row_m[hh] = mx;
    float acc = 0.0f;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const float p0 = fast_exp2(fmaf(s[n][2 * hh], f, -m_scaled));
      const float p1 = fast_exp2(fmaf(s[n][2 * hh + 1], f, -m_scaled));
      acc += p0 + p1;
      s[n][2 * hh] = p0;
      s[n][2 * hh + 1] = p1;
    }
    sum[hh] = acc;
  }
}

// Multiplies both rows of an output fragment (kDT n8 tiles) by their alpha.
template <int kDT>
__device__ __forceinline__ void rescale_rows(float (&o)[kDT][4], const float (&alpha)[2]) {
#pragma unroll
  for (int d = 0; d < kDT; ++d) {
    o[d][0] *= alpha[0];
    o[d][1] *= alpha[0];
    o[d][2] *= alpha[1];
    o[d][3] *= alpha[1];
  }
}

}  // namespace memeff::cuda
