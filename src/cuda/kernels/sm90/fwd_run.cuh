// Host side of one sm90 forward instantiation: the tile shape per head-dim bucket, dropout and
// bias turned into template arguments, the shared-memory opt-in and the launch. Included only by
// the per-instantiation files inst/fwd_*.cu (one dtype x head dim each).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/kernels/common/bias_row_repair.cuh"
#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/sm90/fwd_kernel.cuh"
#include "cuda/kernels/sm90/instances.h"
#include "cuda/kernels/sm90/kernel_setup.h"
#include "cuda/runtime/check.h"

namespace memeff::cuda::sm90 {

template <class T, class Tr, bool kDropout, BiasRead kBiasRead, bool kPacked = false,
          bool kMods = false>
void launch_forward_kernel(const ForwardTmaParams& params, int multiprocessors,
                           cudaStream_t stream) {
  auto kernel = attention_forward_kernel<T, Tr, kDropout, kBiasRead, kPacked, kMods>;
  constexpr int kSmem = Tr::template smem_bytes<kBiasRead>();
  static std::atomic<unsigned long long> prepared{0};
  setup_warp_specialized<Tr>(prepared, kernel, kSmem, "sm90 forward kernel");
  const ForwardParams& p = params.p;
  if (kPacked || (kMods && p.cu_seqlens_q != nullptr)) {
    // One CTA per (head, query tile): packed_tiles bounds the tiles of a head (the launcher's
    // varlen_tile_bound, 2^31 - 1 in all at most); CTAs past a head's last tile exit at once.
    const long long ctas = static_cast<long long>(params.packed_tiles) * p.Hq;
    if (ctas == 0) return;
    kernel<<<static_cast<unsigned>(ctas), Tr::kThreads, kSmem, stream>>>(params);
    check_launch("attention_forward_kernel launch");
    return;
  }
  // Work items: query block x batch·head (Family::forward_reasons bounds their count by 2^31 - 1).
  // Without a causal mask every item costs the same, so a persistent grid (one CTA per SM, each
  // walking items blockIdx.x + k·gridDim.x) stays in step: the next items' Q and K/V load under
  // the current ones' tails and the resident CTAs keep sharing a few heads' K/V in L2. Under a
  // causal mask the items' costs differ: walked statically, the persistent grid lost 10-37% on
  // the causal anchor shapes (H200; docs/benchmarks.md), so there each CTA of the persistent grid
  // takes its next item from a counter (item_counter, in the workspace: Family::forward), in the
  // order one CTA per item would have started them: bands of heads walked query block by query
  // block, heaviest first (common/block_order.h; a head's K and V, shared by the q heads of its
  // group, are what its items share in L2). Without it (a GPU of more than kMaxWalkCtas SMs),
  // such calls take one CTA per item, which the hardware hands out in the same order. Measured
  // beside one CTA per item (H100, docs/benchmarks.md): 1-15% faster on the causal anchor
  // shapes without dropout, most where items are short (a CTA no longer starts, fills its
  // pipeline and drains per item). A window bounded on both sides (a causal one with a left
  // bound) gives every item the same keys again but at the sequence's ends, so it takes the
  // static walk.
  const long long m_blocks = (p.Lq + Tr::kBlockM - 1) / Tr::kBlockM;
  const long long items = m_blocks * p.B * p.Hq;
  const long long sms = multiprocessors > 0 ? multiprocessors : 1;
  const bool vary = block_costs_vary(p);
  const bool dynamic =
      vary && items > sms && sms <= kMaxWalkCtas && params.item_counter != nullptr;
  const long long ctas = (!vary || dynamic) && items > sms ? sms : items;
  ForwardTmaParams tp = params;
  if (vary) {
    tp.head_band = static_cast<int>(
        grid_band_heads(static_cast<std::int64_t>(p.B) * p.Hq, m_blocks, sms,
                        p.Lk * (p.D + p.Dv) * std::int64_t{sizeof(T)} / std::max(p.group, 1)));
  }
  if (dynamic) {
    check_cuda(cudaMemsetAsync(tp.item_counter, 0, sizeof(int), stream),
               "cudaMemsetAsync(sm90 forward item counter)");
  } else {
    tp.item_counter = tp.item_slots = nullptr;
  }
  kernel<<<static_cast<unsigned>(ctas), Tr::kThreads, kSmem, stream>>>(tp);
  check_launch("attention_forward_kernel launch");
}

// f(std::integral_constant<BiasRead, read>{}): the run-time choice as a template argument.
template <class F>
void with_bias_read(BiasRead read, F&& f) {
  using R = BiasRead;
  switch (read) {
    case R::none:
      return f(std::integral_constant<R, R::none>{});
    case R::global:
      return f(std::integral_constant<R, R::global>{});
    case R::keys:
      return f(std::integral_constant<R, R::keys>{});
    case R::tiles:
      return f(std::integral_constant<R, R::tiles>{});
  }
}

template <class T, int kHeadDim>
void run_forward(const ForwardTmaParams& params, int multiprocessors, cudaStream_t stream) {
  using Tr = typename FwdConfig<kHeadDim>::Traits;
  using WideTr = typename FwdConfig<kHeadDim>::WideTraits;
  const ForwardParams& p = params.p;
  if constexpr (!std::is_void_v<WideTr>) {
    if (forward_takes_wide_tile(p, kHeadDim)) {  // the plain kernel without dropout or bias
      launch_forward_kernel<T, WideTr, false, BiasRead::none>(params, multiprocessors, stream);
      return;
    }
  }
  const bool bias = p.bias != nullptr;
  // A bias broadcast over queries (a key-padding mask) is staged in shared memory per key tile;
  // one the launcher described for TMA (16-bit, aligned strides) comes in tiles beside K and V.
  const BiasRead read = !bias                  ? BiasRead::none
                        : p.bias_stride.l == 0 ? BiasRead::keys
                        : params.bias_tiles    ? BiasRead::tiles
                                               : BiasRead::global;
  // ALiBi and the softcap run in the modifiers' kernels (fwd_kernel.cuh, kMods), dense or packed:
  // with a bias, the one that reads dropout and the bias at run time; without, one per dropout.
  // So does a dense window without a bias or over one read per score from global memory (the
  // plain dense kernels without a bias have no window code). Every other call, windowed or not,
  // takes its own instantiation.
  const int mods = p.mods.flags;
  const bool dense_window = (mods & ScoreMods::kWindow) && p.cu_seqlens_q == nullptr &&
                            (read == BiasRead::global || read == BiasRead::none);
  if ((mods & (ScoreMods::kAlibi | ScoreMods::kSoftcap)) || dense_window) {
    if (bias) {
      launch_forward_kernel<T, Tr, true, BiasRead::global, false, true>(params, multiprocessors,
                                                                        stream);
    } else if (p.has_dropout) {
      launch_forward_kernel<T, Tr, true, BiasRead::none, false, true>(params, multiprocessors,
                                                                      stream);
    } else {
      launch_forward_kernel<T, Tr, false, BiasRead::none, false, true>(params, multiprocessors,
                                                                       stream);
    }
  } else if (p.cu_seqlens_q != nullptr) {  // packed: no bias (the validators refuse one)
    p.has_dropout
        ? launch_forward_kernel<T, Tr, true, BiasRead::none, true>(params, multiprocessors, stream)
        : launch_forward_kernel<T, Tr, false, BiasRead::none, true>(params, multiprocessors,
                                                                    stream);
  } else {
    with_bias_read(read, [&](auto bias_read) {
      constexpr BiasRead kRead = decltype(bias_read)::value;
      p.has_dropout ? launch_forward_kernel<T, Tr, true, kRead>(params, multiprocessors, stream)
                    : launch_forward_kernel<T, Tr, false, kRead>(params, multiprocessors, stream);
    });
  }
  if (bias) {  // rows a NaN behind a -inf bias reached (common/bias_row_repair.cuh)
    launch_bias_row_repair<T>(p, stream);
    check_launch("bias_row_repair_kernel launch");
  }
}

}  // namespace memeff::cuda::sm90
