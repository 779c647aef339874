// Host side of one sm80 forward instantiation: the dropout and packed-sequence switches turned
// into template arguments (and calls with a window, ALiBi or a softcap sent to the modifiers'
// kernel), the shared-memory opt-in and the launch. Included only by the per-instantiation files
// inst/fwd_*.cu (one dtype x head dim each).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "cuda/kernels/common/bias_row_repair.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm80/fwd_kernel.cuh"
#include "cuda/kernels/sm80/fwd_traits.cuh"
#include "cuda/kernels/sm80/instances.h"
#include "cuda/runtime/check.h"

namespace memeff::cuda::sm80 {

template <class T, class Tr, bool kDropout, bool kPacked, bool kBias, bool kMods = false>
void launch_forward_kernel(const ForwardParams& params, cudaStream_t stream) {
  auto kernel = attention_forward_kernel<T, Tr, kDropout, kPacked, kBias, kMods>;
  static std::atomic<unsigned long long> opted_in{0};
  opt_in_shared_memory(opted_in, kernel, Tr::kSmemBytes, "sm80 forward kernel");
  dim3 grid;
  if (kPacked || (kMods && params.cu_seqlens_q != nullptr)) {
    // Query tiles of all sequences (an upper bound from the row count, so no host read of the
    // offsets: graph capture and unchecked offsets work) x heads; surplus CTAs return at once.
    const std::int64_t tiles = varlen_tile_bound(params.total_q, params.B, params.Lq, Tr::kBlockM);
    if (tiles == 0) return;
    grid = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(params.Hq));
  } else {
    grid = dim3(static_cast<unsigned>(params.B * params.Hq),
                static_cast<unsigned>((params.Lq + Tr::kBlockM - 1) / Tr::kBlockM));
  }
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(params);
  check_launch("attention_forward_kernel launch");
}

template <class T, class Tr, bool kDropout>
void launch_forward_layout(const ForwardParams& params, cudaStream_t stream) {
  if (params.mods.flags != 0) {
    // Window, ALiBi, softcap: the modifiers' kernel (fwd_kernel.cuh, kMods), dense or packed,
    // with or without a bias; the repair below returns at once without one.
    launch_forward_kernel<T, Tr, kDropout, false, true, true>(params, stream);
    launch_bias_row_repair<T>(params, stream);
    check_launch("bias_row_repair_kernel launch");
  } else if (params.cu_seqlens_q != nullptr) {  // packed calls take no bias (validation)
    launch_forward_kernel<T, Tr, kDropout, true, false>(params, stream);
  } else if (params.bias != nullptr) {
    launch_forward_kernel<T, Tr, kDropout, false, true>(params, stream);
    // Rows a NaN behind a -inf bias reached (common/bias_row_repair.cuh).
    launch_bias_row_repair<T>(params, stream);
    check_launch("bias_row_repair_kernel launch");
  } else {
    launch_forward_kernel<T, Tr, kDropout, false, false>(params, stream);
  }
}

template <class T, int kHeadDim>
void run_forward(const ForwardParams& params, cudaStream_t stream) {
  using Tr = typename FwdConfig<kHeadDim>::Traits;
  if (params.has_dropout) {
    launch_forward_layout<T, Tr, true>(params, stream);
  } else {
    launch_forward_layout<T, Tr, false>(params, stream);
  }
}

}  // namespace memeff::cuda::sm80
