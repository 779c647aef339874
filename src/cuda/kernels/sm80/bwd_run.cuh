// Host side of one sm80 backward instantiation: workspace carving and the launch sequence
// zeroing -> preprocess -> main kernel -> conversions (deterministic mode replaces the one big
// main launch by a fixed sequence of launches so every fp32 atomic lands in one order). Calls
// with a window, ALiBi or a softcap take the modifiers' main kernel (bwd_kernel.cuh, kMods).
// Included only by the per-instantiation files inst/bwd_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/bwd_prepost.cuh"
#include "cuda/kernels/sm80/bwd_kernel.cuh"
#include "cuda/kernels/sm80/bwd_prepost.cuh"
#include "cuda/kernels/sm80/bwd_traits.cuh"
#include "cuda/kernels/sm80/instances.h"
#include "cuda/runtime/check.h"

namespace memeff::cuda::sm80 {

// The main kernel's launches for a dense batch: one grid of (key blocks, B·Hkv), or, deterministic,
// one launch per key block: each dq_accum element then receives one atomic per launch, in
// key-block order. A dbias reduced across CTAs (over B, or over H across kv heads) also needs one
// CTA per launch.
template <class T, class Tr, bool kBias, bool kMods = false>
void launch_backward_dense(const BackwardParams& p, const BwdLaunchExtra& extra_in,
                           bool dbias_cross_cta, int multiprocessors, cudaStream_t stream) {
  auto kernel = attention_backward_kernel<T, Tr, false, kBias, kMods>;
  static std::atomic<unsigned long long> opted_in{0};
  opt_in_shared_memory(opted_in, kernel, Tr::kSmemBytes, "sm80 backward kernel");
  BwdLaunchExtra extra = extra_in;
  const int key_blocks = static_cast<int>((p.Lk + Tr::kBlockN - 1) / Tr::kBlockN);
  const int heads = p.B * p.Hkv;
  if (!p.deterministic) {
    // Where the key blocks' costs differ (the causal mask: block 0 sees every query block), bands
    // of heads walked key block by key block (common/block_order.h; each head's Q and dO are what
    // its blocks share in L2).
    static std::atomic<int> per_sm{0};  // CTAs per SM (the first device's; a scheduling hint)
    const std::int64_t wave = static_cast<std::int64_t>(std::max(multiprocessors, 1)) *
                              resident_ctas_per_sm(per_sm, kernel, Tr::kThreads, Tr::kSmemBytes);
    const int band = backward_band_heads(p, key_blocks, wave, sizeof(T));
    const dim3 grid(band, key_blocks, heads / band);
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, extra);
    check_launch("attention_backward_kernel launch");
    return;
  }
  for (int n = 0; n < key_blocks; ++n) {
    extra.key_block_base = n;
    if (!dbias_cross_cta) {
      extra.head_base = 0;
      kernel<<<dim3(1, 1, heads), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, extra);
      check_launch("attention_backward_kernel launch");
    } else {
      for (int y = 0; y < heads; ++y) {
        extra.head_base = y;
        kernel<<<dim3(1, 1), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, extra);
        check_launch("attention_backward_kernel launch");
      }
    }
  }
}

// The main kernel's launches for packed sequences: over the key tiles of every sequence (the
// scheduler's grid, sized from the row count so that no host read of the offsets is needed), or,
// deterministic, one launch per key block index with one CTA per sequence, so that each dq_accum
// element receives one atomic per launch, in key-block order, as in the dense launches (an
// equal-length packed call then gives the dense batch's bits). The modifiers' kernel is the one
// of dense calls too, packed at run time (kMods).
template <class T, class Tr, bool kMods = false>
void launch_backward_packed(const BackwardParams& p, const BwdLaunchExtra& extra_in,
                            cudaStream_t stream) {
  auto kernel = kMods ? attention_backward_kernel<T, Tr, false, true, true>
                      : attention_backward_kernel<T, Tr, true, false>;
  static std::atomic<unsigned long long> opted_in{0};
  opt_in_shared_memory(opted_in, kernel, Tr::kSmemBytes, "sm80 packed backward kernel");
  BwdLaunchExtra extra = extra_in;
  if (!p.deterministic) {
    const std::int64_t tiles = varlen_tile_bound(p.total_k, p.B, p.Lk, Tr::kBlockN);
    if (tiles == 0) return;
    kernel<<<dim3(static_cast<unsigned>(tiles), p.Hkv), Tr::kThreads, Tr::kSmemBytes, stream>>>(
        p, extra);
    check_launch("attention_backward_kernel (packed) launch");
    return;
  }
  extra.seq_per_cta = true;
  const std::int64_t key_blocks = (p.Lk + Tr::kBlockN - 1) / Tr::kBlockN;
  for (std::int64_t n = 0; n < key_blocks; ++n) {
    extra.key_block_base = static_cast<int>(n);
    kernel<<<dim3(p.B, p.Hkv), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, extra);
    check_launch("attention_backward_kernel (packed) launch");
  }
}

// The launch sequence for one tile shape (the benchmark also calls it with candidate shapes).
template <class T, class Tr>
void run_backward_with(BackwardParams p, void* workspace, int multiprocessors,
                       cudaStream_t stream) {
  const BackwardWorkspace ws = backward_workspace_layout(p);
  auto* base = static_cast<unsigned char*>(workspace);
  p.softmax_d = reinterpret_cast<float*>(base + ws.softmax_d);
  p.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  BwdLaunchExtra extra;
  extra.dbias_mode = ws.dbias.mode;
  extra.dbias_accum = ws.dbias.mode == DbiasMode::reduced
                          ? reinterpret_cast<float*>(base + ws.dbias_accum)
                          : nullptr;
  const WorkspaceRows wr = workspace_rows(p);
  const std::int64_t rows = wr.batches * p.Hq * wr.rows;

  // 1. Zeroed accumulators: dq (every key block adds into it), a reduced dbias, and dbias itself
  //    where it is written tile by tile (causally skipped tiles are never visited).
  check_cuda(
      cudaMemsetAsync(p.dq_accum, 0, static_cast<std::size_t>(rows) * p.D * sizeof(float), stream),
      "cudaMemsetAsync(dq accumulator)");
  if (extra.dbias_accum != nullptr) {
    check_cuda(
        cudaMemsetAsync(extra.dbias_accum, 0,
                        static_cast<std::size_t>(ws.dbias.accum_elems) * sizeof(float), stream),
        "cudaMemsetAsync(dbias accumulator)");
  }
  if (ws.dbias.mode == DbiasMode::direct) launch_convert_dbias<T>(p, nullptr, stream);

  // 2. softmax_d = rowsum(dO ∘ O), one per workspace row.
  launch_bwd_preprocess<T>(p, p.softmax_d, nullptr,
                           PreprocessRows{wr.batches * p.Hq, wr.rows, wr.rows}, 1.0f, stream);

  // 3. The main kernel: the modifiers' one for a window, ALiBi or a softcap, dense or packed.
  const bool mods = p.mods.flags != 0;
  if (p.cu_seqlens_k != nullptr) {
    mods ? launch_backward_packed<T, Tr, true>(p, extra, stream)
         : launch_backward_packed<T, Tr>(p, extra, stream);
  } else {
    const bool cross_cta = ws.dbias.mode == DbiasMode::reduced && dbias_reduced_across_ctas(p);
    if (mods) {
      launch_backward_dense<T, Tr, true, true>(p, extra, cross_cta, multiprocessors, stream);
    } else if (p.bias != nullptr) {
      launch_backward_dense<T, Tr, true>(p, extra, cross_cta, multiprocessors, stream);
    } else {
      launch_backward_dense<T, Tr, false>(p, extra, cross_cta, multiprocessors, stream);
    }
  }

  // 4. dq (and a reduced dbias) in the output dtype.
  bwd_convert_dq_kernel<T><<<prepost_blocks(rows * (p.D / 2), 256), 256, 0, stream>>>(p);
  check_launch("bwd_convert_dq_kernel launch");
  if (ws.dbias.mode == DbiasMode::reduced) launch_convert_dbias<T>(p, extra.dbias_accum, stream);
}

template <class T, int kHeadDim>
void run_backward(BackwardParams p, void* workspace, int multiprocessors, cudaStream_t stream) {
  run_backward_with<T, typename BwdConfig<kHeadDim>::Traits>(p, workspace, multiprocessors, stream);
}

}  // namespace memeff::cuda::sm80
