// Host side of one split-KV instantiation (dtype x head-dim bucket): the dropout and modifiers
// switches, the shared-memory opt-in and the two launches (splits, then their combine). Included
// only by inst/splitkv_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/kernels/sm80/splitkv.h"
#include "cuda/kernels/sm80/splitkv_kernel.cuh"
#include "cuda/runtime/check.h"

namespace memeff::cuda::sm80 {

template <class T, class Tr, bool kDropout, bool kMods>
void launch_splitkv_kernels(const ForwardParams& p, const SplitKvPlan& plan, cudaStream_t stream) {
  auto kernel = splitkv_forward_kernel<T, Tr, kDropout, kMods>;
  static std::atomic<unsigned long long> opted_in{0};
  opt_in_shared_memory(opted_in, kernel, Tr::kSmemBytes, "split-KV forward kernel");
  const std::int64_t ctas = static_cast<std::int64_t>(plan.row_blocks) * plan.splits * p.B * p.Hkv;
  kernel<<<static_cast<unsigned>(ctas), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, plan);
  check_launch("splitkv_forward_kernel launch");
  const std::int64_t rows = static_cast<std::int64_t>(p.B) * p.Hq * p.Lq;
  splitkv_combine_kernel<T><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(p, plan);
  check_launch("splitkv_combine_kernel launch");
}

template <class T, int kHeadDim>
void run_splitkv_forward(const ForwardParams& p, const SplitKvPlan& plan, cudaStream_t stream) {
  using Tr = SplitKvTraits<kHeadDim>;
  if (p.mods.flags != 0) {
    // Window, ALiBi, softcap: the modifiers' kernels (splitkv_kernel.cuh, kMods).
    if (p.has_dropout) {
      launch_splitkv_kernels<T, Tr, true, true>(p, plan, stream);
    } else {
      launch_splitkv_kernels<T, Tr, false, true>(p, plan, stream);
    }
  } else if (p.has_dropout) {
    launch_splitkv_kernels<T, Tr, true, false>(p, plan, stream);
  } else {
    launch_splitkv_kernels<T, Tr, false, false>(p, plan, stream);
  }
}

}  // namespace memeff::cuda::sm80
