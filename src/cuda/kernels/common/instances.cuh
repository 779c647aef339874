// The switch from a run-time (dtype, head-dim bucket) to the template arguments of a family's
// compiled instantiation (its buckets are a HeadDims type, common/reasons.h), so a launcher
// names each bucket once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"

namespace memeff::cuda {

// One instantiation's template arguments.
template <class T_, int kHeadDim_>
struct Instance {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;
};

// Calls run(Instance<T, bucket>{}) with T the element type of `type`; false when `bucket` is not
// one of kDims.
template <int... kDims, class Run>
bool switch_instance(HeadDims<kDims...>, ElemType type, int bucket, Run&& run) {
  auto one = [&](auto dim) {
    constexpr int kDim = decltype(dim)::value;
    if (bucket != kDim) return false;
    if (type == ElemType::bf16) {
      run(Instance<__nv_bfloat16, kDim>{});
    } else {
      run(Instance<__half, kDim>{});
    }
    return true;
  };
  return (one(std::integral_constant<int, kDims>{}) || ...);
}

}  // namespace memeff::cuda
