// Host side of one forward instantiation: the tile shape chosen per head-dim bucket, the
// dropout and packed-sequence switches turned into template arguments, the shared-memory opt-in
// and the launch.
// Included only by the per-instantiation files in src/cuda/inst/ (one dtype x head dim each).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/sm80/fwd_dispatch.cuh"
#include "cuda/sm80/fwd_kernel.cuh"
#include "memeff/error.h"

namespace memeff::cuda {

// Tile shapes per head-dim bucket (FlashAttention-2's choices for mma.sync):
//   64:  128 rows, 4 warps (32 rows each, Q in registers), 48 KB smem
//   128: 128 rows, 4 warps (32 rows each, Q from smem), 96 KB smem, 2 blocks per SM
//   256: 128 rows, 8 warps (16 rows each, Q from smem), 192 KB smem, 1 block per SM
// Measured on the H200 (bf16, anchor shapes, 2026-12-02): for hd64 and hd128, 8 warps x 16 rows
// was 25-35% slower (each warp re-reads all of K and V from smem) and 64-row blocks 10-25% slower.
template <int kHeadDim>
struct FwdConfig;
template <>
struct FwdConfig<64> {
  using Traits = FwdTraits<64, 128, 4, 2>;
};
template <>
struct FwdConfig<128> {
  using Traits = FwdTraits<128, 128, 4, 2>;
};
template <>
struct FwdConfig<256> {
  using Traits = FwdTraits<256, 128, 8, 1>;
};

template <class T, class Tr, bool kDropout, bool kVarlen>
void launch_forward_kernel(const ForwardParams& params, cudaStream_t stream) {
  auto kernel = attention_forward_kernel<T, Tr, kDropout, kVarlen>;
  // The dynamic shared-memory opt-in is per device; do it once per device and kernel.
  static std::atomic<unsigned long long> opted_in{0};
  once_per_device(opted_in, [&] {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Tr::kSmemBytes),
               "cudaFuncSetAttribute(forward kernel, max dynamic shared memory)");
  });
  dim3 grid;
  if constexpr (kVarlen) {
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
  check_cuda(cudaGetLastError(), "attention_forward_kernel launch");
}

template <class T, class Tr, bool kDropout>
void launch_forward_layout(const ForwardParams& params, cudaStream_t stream) {
  if (params.cu_seqlens_q != nullptr) {
    launch_forward_kernel<T, Tr, kDropout, true>(params, stream);
  } else {
    launch_forward_kernel<T, Tr, kDropout, false>(params, stream);
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

}  // namespace memeff::cuda
