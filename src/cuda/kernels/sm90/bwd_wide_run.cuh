// Host side of the sm90 backward's wide tile (head dims 129-256, bwd_wide_kernel.cuh): zeroing ->
// preprocess -> main kernel -> dq conversion, dropout a template argument. Included only by the
// per-dtype files inst/bwd_*_hd256.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/bwd_prepost.cuh"
#include "cuda/kernels/sm90/bwd_prepost.cuh"
#include "cuda/kernels/sm90/bwd_run.cuh"
#include "cuda/kernels/sm90/bwd_wide_kernel.cuh"
#include "cuda/kernels/sm90/instances.h"
#include "cuda/kernels/sm90/kernel_setup.h"
#include "cuda/runtime/check.h"

namespace memeff::cuda::sm90 {

template <class T, bool kDropout>
void launch_backward_wide_kernel(BackwardTmaParams tp, int multiprocessors,
                                 cudaStream_t stream) {
  using Tr = BwdWideTraits;
  auto kernel = attention_backward_wide_kernel<T, kDropout>;
  static std::atomic<unsigned long long> prepared{0};
  setup_warp_specialized<Tr>(prepared, kernel, Tr::kSmemBytes, "sm90 wide backward kernel");
  const BackwardParams& p = tp.p;
  // (band, key blocks, B·Hkv / band), as bwd_run.cuh's dense grids (common/block_order.h).
  const int key_blocks = static_cast<int>((p.Lk + Tr::kBlockN - 1) / Tr::kBlockN);
  const int heads = p.B * p.Hkv;
  const int band = backward_band_heads(p, key_blocks, std::max(multiprocessors, 1), sizeof(T));
  tp.walk_from_last = deterministic_walk_from_last(p);  // the deterministic turns' walk
  kernel<<<dim3(band, key_blocks, heads / band), Tr::kThreads, Tr::kSmemBytes, stream>>>(tp);
  check_launch("attention_backward_wide_kernel launch");
}

template <class T>
void run_backward_wide(BackwardTmaParams tp, const BackwardWorkspace& ws, int multiprocessors,
                       cudaStream_t stream) {
  using Tr = BwdWideTraits;
  const BackwardParams& p = tp.p;
  const std::int64_t heads = static_cast<std::int64_t>(p.B) * p.Hq;
  zero_dq_accumulators(tp, ws, stream);
  // delta (divided by keep_scale with dropout) and lse·log2(e), padded to whole query blocks.
  launch_bwd_preprocess<T>(p, p.softmax_d, tp.lse_log2, PreprocessRows{heads, ws.lq_pad, p.Lq},
                           delta_scale_of(p), stream);
  p.has_dropout ? launch_backward_wide_kernel<T, true>(tp, multiprocessors, stream)
                : launch_backward_wide_kernel<T, false>(tp, multiprocessors, stream);
  const float dq_scale = p.has_dropout ? p.scale * p.keep_scale : p.scale;
  const unsigned head_blocks = static_cast<unsigned>(std::min(heads, kMaxGridY));
  bwd_convert_dq_kernel<T, Tr::kBlockM, false, false, Tr::kDqChunks>
      <<<dim3(Tr::kDqChunks * ws.m_blocks, head_blocks), 256, 0, stream>>>(p, p.dq_accum,
                                                                           ws.m_blocks, dq_scale);
  check_launch("bwd_convert_dq_kernel launch");
}

}  // namespace memeff::cuda::sm90
