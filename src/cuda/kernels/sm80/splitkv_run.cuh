// Host side of one split-KV instantiation (dtype x head-dim bucket): the dropout and modifiers
// switches, the shared-memory opt-in and the two launches (splits, then their combine). Included
// only by inst/splitkv_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/sm80/splitkv.h"
#include "cuda/kernels/sm80/splitkv_kernel.cuh"
#include "cuda/runtime/check.h"

namespace memeff::cuda::sm80 {

// The splits' kernel of one instantiation, opted in to its shared memory on the current device.
template <class T, class Tr, bool kDropout, bool kMods>
auto splitkv_kernel_opted_in() {
  auto kernel = splitkv_forward_kernel<T, Tr, kDropout, kMods>;
  static std::atomic<unsigned long long> opted_in{0};
  opt_in_shared_memory(opted_in, kernel, Tr::kSmemBytes, "split-KV forward kernel");
  return kernel;
}

template <class T, class Tr, bool kDropout, bool kMods>
void launch_splitkv_kernels(const ForwardParams& p, const SplitKvPlan& plan, bool chained,
                            cudaStream_t stream) {
  auto kernel = splitkv_kernel_opted_in<T, Tr, kDropout, kMods>();
  const std::int64_t ctas = static_cast<std::int64_t>(plan.row_blocks) * plan.splits * p.B * p.Hkv;
  kernel<<<static_cast<unsigned>(ctas), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, plan);
  check_launch("splitkv_forward_kernel launch");
  // One CTA per row of [B, Hq, Lq]. Chained (programmatic stream serialization): the combine's
  // CTAs may be scheduled once every split CTA has passed its main loop, and wait in the kernel
  // (griddepcontrol.wait) until the splits' grid has finished and its writes are visible; the
  // launch's latency is spent under the splits' last CTAs instead of after them.
  const std::int64_t rows = static_cast<std::int64_t>(p.B) * p.Hq * p.Lq;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(rows));
  config.blockDim = dim3(kSplitKvCombineThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = chained ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&config, splitkv_combine_kernel<T>, p, plan),
             "splitkv_combine_kernel launch");
}

// Calls run(dropout, mods) with the switches (std::integral_constant<bool, ...>) of the kernel
// that runs p: its launch and its occupancy take the same one.
template <class Run>
void with_splitkv_switches(const ForwardParams& p, Run&& run) {
  if (p.mods.flags != 0) {
    // Window, ALiBi, softcap: the modifiers' kernels (splitkv_kernel.cuh, kMods).
    if (p.has_dropout) {
      run(std::integral_constant<bool, true>{}, std::integral_constant<bool, true>{});
    } else {
      run(std::integral_constant<bool, false>{}, std::integral_constant<bool, true>{});
    }
  } else if (p.has_dropout) {
    run(std::integral_constant<bool, true>{}, std::integral_constant<bool, false>{});
  } else {
    run(std::integral_constant<bool, false>{}, std::integral_constant<bool, false>{});
  }
}

template <class T, int kHeadDim>
void run_splitkv_forward(const ForwardParams& p, const SplitKvPlan& plan, bool chained,
                         cudaStream_t stream) {
  with_splitkv_switches(p, [&](auto dropout, auto mods) {
    launch_splitkv_kernels<T, SplitKvTraits<kHeadDim>, decltype(dropout)::value,
                           decltype(mods)::value>(p, plan, chained, stream);
  });
}

template <class T, int kHeadDim>
int splitkv_ctas_per_sm(const ForwardParams& p) {
  int n = 1;
  with_splitkv_switches(p, [&](auto dropout, auto mods) {
    using Tr = SplitKvTraits<kHeadDim>;
    // Opted in above 48 KB first: the calculator counts no CTA the kernel may not launch.
    auto kernel = splitkv_kernel_opted_in<T, Tr, decltype(dropout)::value, decltype(mods)::value>();
    static std::atomic<int> per_sm{0};
    n = resident_ctas_per_sm(per_sm, kernel, Tr::kThreads, Tr::kSmemBytes);
  });
  return n;
}

}  // namespace memeff::cuda::sm80
