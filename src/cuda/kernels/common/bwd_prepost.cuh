// The small kernels around both families' backward main kernels, with their launches: the
// preprocess (delta = rowsum(dO ∘ O) per query row, and for the sm90 kernels lse·log2(e)) into a
// row layout the family chooses, and the conversion of a reduced dbias's fp32 accumulator into
// the bias's dtype (or zeros where dbias is written tile by tile and skipped tiles stay 0). The
// conversion of dQ stays with each family: their accumulators' layouts differ (rows, fragments).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/types.cuh"
#include "cuda/runtime/check.h"

namespace memeff::cuda {

// The workspace rows the preprocess writes: head bh (b·Hq + h, b < heads / Hq) owns rows
// [bh·per_head, (bh + 1)·per_head); query row i < valid of (b, h) is its row i, rows from valid on
// are padding (delta 0, lse_log2 +inf).
struct PreprocessRows {
  std::int64_t heads = 0, per_head = 0, valid = 0;
  // Optionally also zeroed: zero_cols floats per workspace row from `zero` on (head bh's rows
  // [bh·per_head·zero_cols, (bh + 1)·per_head·zero_cols), 16-byte aligned, zero_cols a multiple
  // of 4): an accumulator the main kernel adds into, zeroed by the pass that reads dO anyway
  // instead of by a memset of its own.
  float* zero = nullptr;
  std::int64_t zero_cols = 0;
};

// delta[r] = delta_scale·Σ_e dO·O and, unless lse_log2 is null, lse_log2[r] = lse·log2(e) (+inf
// past `valid` and for rows without a visible key, lse = -inf, so P = exp2(x − lse_log2) is 0
// there). kLanes lanes share a row (16 bytes of O and dO each per step); a block of 256 threads
// covers 256 / kLanes rows of one head; grid (row blocks, heads), heads past 65535 looped. With
// rows.zero set, the block also zeroes its rows of that accumulator.
template <class T, int kLanes>
__global__ void bwd_preprocess_kernel(BackwardParams p, float* delta, float* lse_log2,
                                      PreprocessRows rows, float delta_scale) {
  constexpr int kRowsPerBlock = 256 / kLanes;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const std::int64_t i =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  for (std::int64_t bh = blockIdx.y; bh < rows.heads; bh += gridDim.y) {
    if (rows.zero != nullptr) {
      const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock;
      const std::int64_t n = (std::min<std::int64_t>(i0 + kRowsPerBlock, rows.per_head) - i0) *
                             rows.zero_cols / 4;
      float4* const z =
          reinterpret_cast<float4*>(rows.zero + (bh * rows.per_head + i0) * rows.zero_cols);
      for (std::int64_t k = threadIdx.x; k < n; k += 256) z[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const std::int64_t h = bh % p.Hq, b = bh / p.Hq;
    float acc = 0.f, l2 = INFINITY;
    if (i < rows.valid) {
      const T* o = static_cast<const T*>(p.out) + b * p.out_stride.b + h * p.out_stride.h +
                   i * p.out_stride.l;
      const T* d = static_cast<const T*>(p.dout) + b * p.dout_stride.b + h * p.dout_stride.h +
                   i * p.dout_stride.l;
      acc = row_dot_share(o, d, p.Dv, lane, kLanes);
      if (lse_log2 != nullptr) {
        const float lse = p.lse[b * p.lse_stride_b + h * p.lse_stride_h + i];
        l2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
      }
    }
#pragma unroll
    for (int s = kLanes / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, s);
    if (lane == 0 && i < rows.per_head) {
      const std::int64_t r = bh * rows.per_head + i;
      delta[r] = acc * delta_scale;
      if (lse_log2 != nullptr) lse_log2[r] = l2;
    }
  }
}

// Grid of a 1-D grid-stride launch: enough blocks of 256 for `work` items of `per_block` each, at
// most 65535.
inline unsigned prepost_blocks(std::int64_t work, int per_block) {
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((work + per_block - 1) / per_block, 1, kMaxGridY));
}

template <class T>
void launch_bwd_preprocess(const BackwardParams& p, float* delta, float* lse_log2,
                           const PreprocessRows& rows, float delta_scale, cudaStream_t stream) {
  if (rows.heads == 0 || rows.per_head == 0) return;
  const unsigned head_blocks = static_cast<unsigned>(std::min(rows.heads, kMaxGridY));
  auto launch = [&](auto kernel, int lanes) {
    const dim3 grid(static_cast<unsigned>((rows.per_head * lanes + 255) / 256), head_blocks);
    kernel<<<grid, 256, 0, stream>>>(p, delta, lse_log2, rows, delta_scale);
  };
  // Lanes per row: Dv / 8 16-byte chunks, 8 or 16 lanes (Dv > 128 loops).
  p.Dv <= 64 ? launch(bwd_preprocess_kernel<T, 8>, 8) : launch(bwd_preprocess_kernel<T, 16>, 16);
  check_launch("bwd_preprocess_kernel launch");
}

// dbias (dtype of the bias: fp32 or T) from its fp32 accumulator [dB, dH, dL, Lk] (contiguous);
// with accum == nullptr it writes zeros.
template <class T>
__global__ void bwd_convert_dbias_kernel(BackwardParams p, const float* accum) {
  const std::int64_t n1 = p.dbias_shape[1], n2 = p.dbias_shape[2], n3 = p.Lk;
  const std::int64_t total = p.dbias_shape[0] * n1 * n2 * n3;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = k % n3, i = (k / n3) % n2, h = (k / (n3 * n2)) % n1,
                       b = k / (n3 * n2 * n1);
    const std::int64_t off = b * p.dbias_stride.b + h * p.dbias_stride.h + i * p.dbias_stride.l + j;
    const float v = accum != nullptr ? accum[k] : 0.f;
    if (p.bias_is_fp32) {
      static_cast<float*>(p.dbias)[off] = v;
    } else {
      static_cast<T*>(p.dbias)[off] = from_float<T>(v);
    }
  }
}

// dbias from the accumulator (`accum`, DbiasMode::reduced) or zeroed (`accum` null: direct mode,
// before the main kernel, whose causally skipped tiles never write theirs).
template <class T>
void launch_convert_dbias(const BackwardParams& p, const float* accum, cudaStream_t stream) {
  const std::int64_t elems =
      static_cast<std::int64_t>(p.dbias_shape[0]) * p.dbias_shape[1] * p.dbias_shape[2] * p.Lk;
  bwd_convert_dbias_kernel<T><<<prepost_blocks(elems, 256), 256, 0, stream>>>(p, accum);
  check_launch(accum ? "bwd_convert_dbias_kernel launch"
                     : "bwd_convert_dbias_kernel (zero) launch");
}

}  // namespace memeff::cuda
