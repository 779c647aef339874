// Host side of one backward instantiation: tile shapes per head-dim bucket, workspace carving,
// and the launch sequence preprocess -> main kernel -> converts (deterministic mode replaces the
// one big main launch by a fixed sequence of launches so every fp32 atomic lands in one order).
// Included only by the per-instantiation files src/cuda/inst/bwd_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/sm80/bwd_dispatch.cuh"
#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/check.h"
#include "memeff/error.h"

namespace memeff::cuda {

// Tile shapes per head-dim bucket (keys per CTA, queries per step, CTAs per SM):
//   64:  64 keys (4 warps), 64 queries, 2 CTAs per SM (255 registers, no spills). H200, bf16,
//        2026-12-03, against the previous 128 keys x 32 queries (128 registers, 48 bytes spilled)
//        in one run: backward 6.7% faster on bert-base 32x12x512, 5.2% on 4x32x4096 causal,
//        0.7% on 8x16x2048, 30% on 2x8x1024 causal (twice the CTAs). 128 keys x 64 queries x 1
//        CTA: 2.5% faster than this shape on 8x16x2048, up to 2% slower on the other three.
//   128: 128 keys (8 warps), 64 queries, ~157 KB smem, 1 CTA per SM
//   256: 64 keys (4 warps), 16 queries; correct, not tuned (dK/dV accumulators of 256 floats
//        per thread spill: 828 bytes; 32 queries spilled 1632)
template <int kHeadDim>
struct BwdConfig;
template <>
struct BwdConfig<64> {
  using Traits = BwdTraits<64, 64, 64, 2>;
};
template <>
struct BwdConfig<128> {
  using Traits = BwdTraits<128, 128, 64, 1>;
};
template <>
struct BwdConfig<256> {
  using Traits = BwdTraits<256, 64, 16, 1>;
};

inline unsigned bwd_grid_1d(std::int64_t work, int per_block) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, 65535));
}

// The main kernel's launches for a dense batch: one grid of (key blocks, B·Hkv), or, deterministic,
// one launch per key block: each dq_accum element then receives one atomic per launch, in
// key-block order. A dbias reduced across CTAs (over B, or over H across kv heads) also needs one
// CTA per launch.
template <class T, class Tr>
void launch_backward_dense(const BackwardParams& p, const BwdLaunchExtra& extra_in,
                           bool dbias_cross_cta, cudaStream_t stream) {
  auto kernel = attention_backward_kernel<T, Tr, false>;
  static std::atomic<unsigned long long> opted_in{0};
  once_per_device(opted_in, [&] {
    check_cuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes),
        "cudaFuncSetAttribute(backward kernel, max dynamic shared memory)");
  });
  BwdLaunchExtra extra = extra_in;
  const int key_blocks = static_cast<int>((p.Lk + Tr::kBc - 1) / Tr::kBc);
  const int heads = p.B * p.Hkv;
  if (!p.deterministic) {
    kernel<<<dim3(key_blocks, heads), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, extra);
    check_cuda(cudaGetLastError(), "attention_backward_kernel launch");
    return;
  }
  for (int n = 0; n < key_blocks; ++n) {
    extra.key_block_base = n;
    if (!dbias_cross_cta) {
      extra.head_base = 0;
      kernel<<<dim3(1, heads), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, extra);
      check_cuda(cudaGetLastError(), "attention_backward_kernel launch");
    } else {
      for (int y = 0; y < heads; ++y) {
        extra.head_base = y;
        kernel<<<dim3(1, 1), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, extra);
        check_cuda(cudaGetLastError(), "attention_backward_kernel launch");
      }
    }
  }
}

// The main kernel's launches for packed sequences: over the key tiles of every sequence (the
// scheduler's grid, sized from the row count so that no host read of the offsets is needed), or,
// deterministic, one launch per key block index with one CTA per sequence, so that each dq_accum
// element receives one atomic per launch, in key-block order, as in the dense launches (an
// equal-length packed call then gives the dense batch's bits).
template <class T, class Tr>
void launch_backward_packed(const BackwardParams& p, const BwdLaunchExtra& extra_in,
                            cudaStream_t stream) {
  auto kernel = attention_backward_kernel<T, Tr, true>;
  static std::atomic<unsigned long long> opted_in{0};
  once_per_device(opted_in, [&] {
    check_cuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes),
        "cudaFuncSetAttribute(packed backward kernel, max dynamic shared memory)");
  });
  BwdLaunchExtra extra = extra_in;
  if (!p.deterministic) {
    const std::int64_t tiles = varlen_tile_bound(p.total_k, p.B, p.Lk, Tr::kBc);
    if (tiles == 0) return;
    kernel<<<dim3(static_cast<unsigned>(tiles), p.Hkv), Tr::kThreads, Tr::kSmemBytes, stream>>>(
        p, extra);
    check_cuda(cudaGetLastError(), "attention_backward_kernel (packed) launch");
    return;
  }
  extra.seq_per_cta = true;
  const std::int64_t key_blocks = (p.Lk + Tr::kBc - 1) / Tr::kBc;
  for (std::int64_t n = 0; n < key_blocks; ++n) {
    extra.key_block_base = static_cast<int>(n);
    kernel<<<dim3(p.B, p.Hkv), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, extra);
    check_cuda(cudaGetLastError(), "attention_backward_kernel (packed) launch");
  }
}

// The launch sequence for one tile shape (the benchmark also calls it with candidate shapes).
template <class T, class Tr>
void run_backward_with(BackwardParams p, void* workspace, cudaStream_t stream) {
  const BwdWorkspace ws = backward_workspace_layout(p);
  auto* base = static_cast<unsigned char*>(workspace);
  p.softmax_d = reinterpret_cast<float*>(base + ws.softmax_d);
  p.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  BwdLaunchExtra extra;
  extra.dbias_mode = ws.dbias_mode;
  extra.dbias_accum = ws.dbias_mode == 2 ? reinterpret_cast<float*>(base + ws.dbias_accum) : nullptr;

  // 1. softmax_d, zeroed accumulators (and a zeroed dbias where it is written tile by tile).
  const WorkspaceRows wr = workspace_rows(p);
  const std::int64_t rows = wr.batches * p.Hq * wr.rows;
  bwd_preprocess_kernel<T><<<bwd_grid_1d(rows, 8), 256, 0, stream>>>(
      p, extra.dbias_accum, ws.dbias_accum_elems);
  check_cuda(cudaGetLastError(), "bwd_preprocess_kernel launch");
  const std::int64_t dbias_elems =
      static_cast<std::int64_t>(p.dbias_shape[0]) * p.dbias_shape[1] * p.dbias_shape[2] * p.Lk;
  if (ws.dbias_mode == 1) {  // causal-skipped tiles are never visited: start from zeros
    bwd_convert_dbias_kernel<T><<<bwd_grid_1d(dbias_elems, 256), 256, 0, stream>>>(p, nullptr);
    check_cuda(cudaGetLastError(), "bwd_convert_dbias_kernel (zero) launch");
  }

  // 2. main kernel.
  if (p.cu_seqlens_k != nullptr) {
    launch_backward_packed<T, Tr>(p, extra, stream);
  } else {
    launch_backward_dense<T, Tr>(p, extra, ws.dbias_mode == 2 && dbias_reduced_across_ctas(p),
                                 stream);
  }

  // 3. dq (and a reduced dbias) in the output dtype.
  bwd_convert_dq_kernel<T><<<bwd_grid_1d(rows * (p.D / 2), 256), 256, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "bwd_convert_dq_kernel launch");
  if (ws.dbias_mode == 2) {
    bwd_convert_dbias_kernel<T><<<bwd_grid_1d(dbias_elems, 256), 256, 0, stream>>>(
        p, extra.dbias_accum);
    check_cuda(cudaGetLastError(), "bwd_convert_dbias_kernel launch");
  }
}

template <class T, int kHeadDim>
void run_backward(BackwardParams p, void* workspace, cudaStream_t stream) {
  run_backward_with<T, typename BwdConfig<kHeadDim>::Traits>(p, workspace, stream);
}

}  // namespace memeff::cuda
