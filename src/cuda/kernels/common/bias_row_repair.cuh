// The fused forwards' exact pass over biased rows whose lse came out NaN.
//
// The fused kernels add the bias to the score (common/mask.cuh, add_scaled_bias): a -inf entry
// masks a finite score, but a NaN or +inf score behind it gives NaN, which reaches the row's sum,
// out and lse. docs/api.md promises that a key a -inf bias masks never reaches the row, whatever
// its score holds. Every way of doing that inside the fused kernels cost their biased forward
// measurably on an H100 (a select per score 10-13%, a fix-up per tile about 5%, a recompute in
// the epilogue 5-9%: each changed the main loop's registers), so the fused kernels stay as they
// were and this kernel runs after every biased fused forward: one thread per row reads its lse,
// and only where it is NaN (rare: a NaN or Inf in q or k) does a warp recompute the row key by key
// in fp32 with the selection. A row that sees a NaN or +inf score stops there and stays NaN, as
// in the fused path; a row whose NaN came only from masked keys gets its finite out and lse. The
// scan costs one launch and a read of lse per biased forward; the recompute runs on CUDA cores,
// one key at a time, so a head every row of which meets such a key (a NaN key in the padding of
// a key-padding mask) takes many times the fused kernel's time for that call (docs/api.md).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/dropout_map.h"
#include "cuda/kernels/common/dropout_frag.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/score_modifiers.cuh"
#include "cuda/kernels/common/types.cuh"

namespace memeff::cuda {

inline constexpr int kRepairThreads = 256;  // rows scanned per block; its 8 warps recompute
inline constexpr int kRepairMaxDv = 256;    // output columns: 8 per lane

// Row i of (b, h) of a dense biased forward, recomputed by one warp: lane l takes the dimensions
// l, l + 32, ... of each dot product and of the output, with the window, ALiBi and softcap of
// the call (ScoreMods). Writes out and lse.
template <class T>
__device__ void recompute_biased_row(const ForwardParams& p, int b, int h, std::int64_t i,
                                     int lane) {
  constexpr int kCols = kRepairMaxDv / 32;
  const int hk = h / p.group;
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride.b + h * p.q_stride.h + i * p.q_stride.l;
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride.b + hk * p.k_stride.h;
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride.b + hk * p.v_stride.h;
  const std::int64_t bias_row = b * p.bias_stride.b + h * p.bias_stride.h + i * p.bias_stride.l;
  const std::uint64_t bh = static_cast<std::uint64_t>(b) * p.Hq + h;
  const detail::DropoutKey key = p.has_dropout ? dropout_key_of(p) : detail::DropoutKey{0, 0};
  // The row's keys under the causal mask and the window; its ALiBi slope (score_modifiers.cuh).
  const detail::KeySpan keys =
      KeyMask{is_causal(p), p.Lk, p.causal_shift, p.mods.left_reach, p.mods.right_reach}
          .keys_of_row(i);
  const bool alibi = (p.mods.flags & ScoreMods::kAlibi) != 0;
  const float slope = alibi ? alibi_slope(p.mods, b, h) : 0.0f;
  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  bool nan_row = false;
  for (std::int64_t j = keys.begin; j < keys.end; ++j) {
    const float bv = load_bias<T>(p.bias, p.bias_is_fp32, bias_row + j);
    if (bv == -INFINITY) continue;  // masked, whatever the score holds
    const T* kr = k + j * p.k_stride.l;
    float dot = 0.0f;
    for (int d = lane; d < p.D; d += 32) dot = fmaf(to_float<T>(q[d]), to_float<T>(kr[d]), dot);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
    // The cap of q·k with tanhf (this pass is rare; the kernels' tanh is as accurate where it
    // matters, score_modifiers.cuh), then scale and bias, then ALiBi, as the fused kernels.
    if (p.mods.flags & ScoreMods::kSoftcap)
      dot = tanhf(dot * p.mods.softcap_in) * p.mods.softcap_out;
    float x = fmaf(dot, p.scale, bv);
    if (alibi) x = fmaf(-slope, fabsf(static_cast<float>(i + p.causal_shift - j)), x);
    if (isnan(x) || x == INFINITY) {  // a key the row sees: the row is NaN
      nan_row = true;
      break;
    }
    if (x == -INFINITY) continue;  // weighs 0
    const float m_new = fmaxf(m, x);
    const float alpha = expf(m - m_new);  // 0 while m is -inf
    const float pj = expf(x - m_new);
    l = l * alpha + pj;
    m = m_new;
    const bool kept =
        !p.has_dropout || detail::dropout_keep_element(key, p.keep_threshold, bh, p.q_start + i,
                                                       64ull * p.k_block64 + j);
    const float w = kept ? pj : 0.0f;  // a dropped key's v still counts 0·v (NaN stays)
    const T* vr = v + j * p.v_stride.l;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      const float vd = d < p.Dv ? to_float<T>(vr[d]) : 0.0f;
      acc[c] = fmaf(w, vd, acc[c] * alpha);
    }
  }
  const bool empty = !nan_row && l == 0.0f;
  const float inv = nan_row ? NAN : (empty ? 0.0f : p.keep_scale / l);
  T* out = static_cast<T*>(p.out) + b * p.out_stride.b + h * p.out_stride.h + i * p.out_stride.l;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int d = lane + 32 * c;
    if (d < p.Dv) out[d] = from_float<T>(acc[c] * inv);
  }
  if (lane == 0) {
    p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i] =
        nan_row ? NAN : (empty ? -INFINITY : m + logf(l));
  }
}

// One thread per row of the [B, Hq, Lq] lse; the block's rows whose lse is NaN go to a list in
// shared memory, which its warps then recompute (almost always the list is empty).
template <class T>
__global__ void __launch_bounds__(kRepairThreads) bias_row_repair_kernel(const ForwardParams p) {
  __shared__ std::int64_t rows[kRepairThreads];
  __shared__ int count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  const std::int64_t total = static_cast<std::int64_t>(p.B) * p.Hq * p.Lq;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kRepairThreads + threadIdx.x;
  if (r < total) {
    const std::int64_t bh = r / p.Lq, i = r % p.Lq;
    const std::int64_t b = bh / p.Hq, h = bh % p.Hq;
    if (isnan(p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i])) rows[atomicAdd(&count, 1)] = r;
  }
  __syncthreads();
  const int n = count;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int x = warp; x < n; x += kRepairThreads / 32) {
    const std::int64_t row = rows[x];
    const std::int64_t bh = row / p.Lq;
    recompute_biased_row<T>(p, static_cast<int>(bh / p.Hq), static_cast<int>(bh % p.Hq), row % p.Lq,
                            lane);
  }
}

// After a dense biased fused forward on `stream` (packed calls take no bias).
template <class T>
void launch_bias_row_repair(const ForwardParams& p, cudaStream_t stream) {
  const std::int64_t total = static_cast<std::int64_t>(p.B) * p.Hq * p.Lq;
  if (p.bias == nullptr || total == 0) return;
  const std::int64_t blocks = (total + kRepairThreads - 1) / kRepairThreads;
  bias_row_repair_kernel<T><<<static_cast<unsigned>(blocks), kRepairThreads, 0, stream>>>(p);
}

}  // namespace memeff::cuda
