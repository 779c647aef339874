// The sm80 backward's dQ conversion: its fp32 accumulator holds plain rows (workspace_rows in
// bwd_traits.cuh), converted into dq's dtype and strides after the main kernel. The preprocess
// and the dbias conversion are shared with the sm90 family (common/bwd_prepost.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/sm80/bwd_traits.cuh"

namespace memeff::cuda::sm80 {

// dq = dq_accum · scale in the output dtype and strides (packed: every packed row, as above).
template <class T>
__global__ void bwd_convert_dq_kernel(BackwardParams p) {
  const WorkspaceRows wr = workspace_rows(p);
  const std::int64_t pairs = wr.batches * p.Hq * wr.rows * (p.D / 2);
  const int half_d = p.D / 2;
  for (std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; k < pairs;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t e = (k % half_d) * 2, r = k / half_d;
    const std::int64_t i = r % wr.rows, bh = r / wr.rows, h = bh % p.Hq, b = bh / p.Hq;
    const float2 v = *reinterpret_cast<const float2*>(p.dq_accum + r * p.D + e);
    T* dst = static_cast<T*>(p.dq) + b * p.dq_stride.b + h * p.dq_stride.h + i * p.dq_stride.l + e;
    *reinterpret_cast<std::uint32_t*>(dst) = pack2<T>(v.x * p.scale, v.y * p.scale);
  }
}

}  // namespace memeff::cuda::sm80
