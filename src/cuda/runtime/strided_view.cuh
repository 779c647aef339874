// A tensor view as element-wise kernels see it: up to four dimensions with element strides and a
// run-time dtype (every memeff::DType), read and written as double (16-bit types round through
// fp32 to nearest even, as the host's store_element does). The fill kernel, the context-parallel
// ring's copies and merges and cuda_math's gathers use it; the attention kernels do not.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "memeff/tensor.h"

namespace memeff::cuda {

struct StridedView {
  char* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t n[4] = {1, 1, 1, 1};  // sizes; a view of rank r < 4 fills n[0..r) (rows, then 1s)
  std::int64_t s[4] = {0, 0, 0, 0};  // strides in elements
  std::int64_t elements() const { return n[0] * n[1] * n[2] * n[3]; }
  std::int64_t rows() const { return n[0] * n[1] * n[2]; }
};

inline StridedView strided_view(const TensorView& t) {
  StridedView v;
  v.data = static_cast<char*>(t.data);
  v.dtype = t.dtype;
  for (int d = 0; d < t.rank; ++d) {
    v.n[d] = t.shape[d];
    v.s[d] = t.stride[d];
  }
  return v;
}

// Element e of row `row`, rows numbered over the first three dimensions.
__device__ __forceinline__ std::int64_t offset_of(const StridedView& v, std::int64_t row,
                                                  std::int64_t e) {
  const std::int64_t i = row % v.n[2], h = (row / v.n[2]) % v.n[1], b = row / (v.n[2] * v.n[1]);
  return b * v.s[0] + h * v.s[1] + i * v.s[2] + e * v.s[3];
}

__device__ __forceinline__ double load(const StridedView& v, std::int64_t off) {
  switch (v.dtype) {
    case DType::f32:
      return reinterpret_cast<const float*>(v.data)[off];
    case DType::f64:
      return reinterpret_cast<const double*>(v.data)[off];
    case DType::f16:
      return __half2float(reinterpret_cast<const __half*>(v.data)[off]);
    case DType::bf16:
      return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(v.data)[off]);
    case DType::i32:
      return reinterpret_cast<const std::int32_t*>(v.data)[off];
  }
  return 0.0;
}

__device__ __forceinline__ void store(const StridedView& v, std::int64_t off, double x) {
  switch (v.dtype) {
    case DType::f32:
      reinterpret_cast<float*>(v.data)[off] = static_cast<float>(x);
      break;
    case DType::f64:
      reinterpret_cast<double*>(v.data)[off] = x;
      break;
    case DType::f16:
      reinterpret_cast<__half*>(v.data)[off] = __float2half_rn(static_cast<float>(x));
      break;
    case DType::bf16:
      reinterpret_cast<__nv_bfloat16*>(v.data)[off] = __float2bfloat16_rn(static_cast<float>(x));
      break;
    case DType::i32:
      reinterpret_cast<std::int32_t*>(v.data)[off] = static_cast<std::int32_t>(x);
      break;
  }
}

// Grid-stride launches of the element-wise kernels: 256 threads, at most 4096 blocks.
inline constexpr int kElementwiseThreads = 256;
inline unsigned elementwise_blocks(std::int64_t work) {
  constexpr std::int64_t kMaxBlocks = 4096;
  return static_cast<unsigned>(std::clamp<std::int64_t>(
      (work + kElementwiseThreads - 1) / kElementwiseThreads, 1, kMaxBlocks));
}

}  // namespace memeff::cuda
