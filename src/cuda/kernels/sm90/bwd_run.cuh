// Host side of one sm90 backward instantiation: the launch sequence zeroing -> preprocess ->
// main kernel -> dq (and dbias) conversion, with dropout and bias turned into template
// arguments. Included only by the per-instantiation files inst/bwd_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/bwd_prepost.cuh"
#include "cuda/kernels/sm90/bwd_kernel.cuh"
#include "cuda/kernels/sm90/bwd_prepost.cuh"
#include "cuda/kernels/sm90/instances.h"
#include "cuda/kernels/sm90/kernel_setup.h"
#include "cuda/runtime/check.h"

namespace memeff::cuda::sm90 {

// How the main kernel is launched: dbias_cross_cta (deterministic, a dbias summed across CTAs:
// one CTA per launch), the SMs (the grid's order), the stream.
struct BackwardLaunch {
  bool dbias_cross_cta = false;
  int multiprocessors = 1;
  cudaStream_t stream = nullptr;
};

// What every key block adds into, zeroed: the dq accumulator (unless the preprocess zeroes it:
// `accum_in_preprocess`) and, in the deterministic mode, the turn counters.
inline void zero_dq_accumulators(const BackwardTmaParams& tp, const BackwardWorkspace& ws,
                                 cudaStream_t stream, bool accum_in_preprocess = false) {
  if (!accum_in_preprocess) {
    check_cuda(cudaMemsetAsync(tp.p.dq_accum, 0, static_cast<std::size_t>(ws.dq_accum_floats) * 4,
                               stream),
               "cudaMemsetAsync(dq accumulator)");
  }
  if (tp.p.deterministic) {
    check_cuda(cudaMemsetAsync(tp.dq_turn, 0, static_cast<std::size_t>(ws.dq_turns) * 4, stream),
               "cudaMemsetAsync(dq turn counters)");
  }
}

// The preprocess's factor on delta: with dropout delta is divided by keep_scale (times the keep
// probability t/256, exactly), as the main kernels want it.
inline float delta_scale_of(const BackwardParams& p) {
  return p.has_dropout ? static_cast<float>(p.keep_threshold) / 256.0f : 1.0f;
}

// kDet: the deterministic mode's instantiation (bwd_kernel.cuh), as p.deterministic says.
template <class T, class Tr, bool kDet, bool kDropout, bool kBias, bool kPacked = false,
          bool kBiasTiles = false, bool kMods = false, ModsCap kCap = ModsCap::run_time,
          bool kAlibi = true>
void launch_backward_kernel(BackwardTmaParams tp, const BackwardLaunch& launch) {
  const cudaStream_t stream = launch.stream;
  auto kernel = attention_backward_kernel<T, Tr, kDropout, kBias, kPacked, kBiasTiles, kMods, kCap,
                                          kAlibi, kDet>;
  constexpr int kSmem = Tr::kSmemBytes;
  static std::atomic<unsigned long long> prepared{0};
  setup_warp_specialized<Tr>(prepared, kernel, kSmem, "sm90 backward kernel");
  const BackwardParams& p = tp.p;
  // The deterministic turns' walk (common/block_order.h), on every grid below.
  tp.walk_from_last = deterministic_walk_from_last(p);
  if (kPacked || (kMods && p.cu_seqlens_q != nullptr)) {
    // (key tile, kv head): the scheduler's bound over cu_seqlens_k (Family::backward_reasons
    // keeps it below 2^31); CTAs past the last tile exit at once. A packed call has no bias, so
    // never the one-CTA launches below.
    const std::int64_t tiles = varlen_tile_bound(p.total_k, p.B, p.Lk, Tr::kBlockN);
    if (tiles == 0) return;
    kernel<<<dim3(static_cast<unsigned>(tiles), p.Hkv), Tr::kThreads, kSmem, stream>>>(tp);
    check_launch("attention_backward_kernel launch");
    return;
  }
  const int key_blocks = static_cast<int>((p.Lk + Tr::kBlockN - 1) / Tr::kBlockN);
  const int heads = p.B * p.Hkv;
  if constexpr (backward_persists<Tr, kDropout, kBias, kPacked, kBiasTiles, kMods, kDet>()) {
    // Every key block costs the same without a causal mask (windows take the modifiers'
    // kernels): one CTA per SM walks the tiles, each loading its next tile's first Q and dO
    // while it writes this one's dK and dV. Measured on the H100 (docs/benchmarks.md): 4-6%
    // faster from three query blocks per tile (384 and 512 queries, 2048), 6% slower with two
    // (197 queries), where a tile's two steps leave little to hide the next tile's loads under;
    // those take one CTA per tile.
    const std::int64_t tiles = static_cast<std::int64_t>(key_blocks) * heads;
    const int sms = std::max(launch.multiprocessors, 1);
    const std::int64_t query_blocks = (p.Lq + Tr::kBlockM - 1) / Tr::kBlockM;
    if (!is_causal(p) && tiles > sms && tiles <= INT_MAX && query_blocks >= 3) {
      tp.persist_tiles = static_cast<int>(tiles);
      tp.persist_key_blocks = key_blocks;
      kernel<<<dim3(static_cast<unsigned>(sms)), Tr::kThreads, kSmem, stream>>>(tp);
      check_launch("attention_backward_kernel launch");
      return;
    }
  }
  if (!launch.dbias_cross_cta) {
    // Where the key blocks' costs differ (the causal mask: block 0 sees every query block), bands
    // of heads walked key block by key block (common/block_order.h; one CTA per SM: setmaxnreg's
    // split takes the register file; each head's Q and dO are what its blocks share in L2). The
    // deterministic mode's turns stay in launch order: a head's key blocks start in ascending
    // order (and walk their query blocks from the last under a right bound: BackwardWalk).
    const int band =
        backward_band_heads(p, key_blocks, std::max(launch.multiprocessors, 1), sizeof(T));
    kernel<<<dim3(band, key_blocks, heads / band), Tr::kThreads, kSmem, stream>>>(tp);
    check_launch("attention_backward_kernel launch");
    return;
  }
  // Deterministic mode with a dbias summed across CTAs (over the batch, or over heads of
  // different kv heads): one CTA per launch, in a fixed order, so its fp32 atomics land in one
  // order. Slow, and only for that combination.
  for (int n = 0; n < key_blocks; ++n) {
    for (int y = 0; y < heads; ++y) {
      tp.key_block_base = n;
      tp.head_base = y;
      kernel<<<dim3(1, 1), Tr::kThreads, kSmem, stream>>>(tp);
      check_launch("attention_backward_kernel launch");
    }
  }
}

template <class T, int kHeadDim>
void run_backward(BackwardTmaParams tp, const BackwardWorkspace& ws, int multiprocessors,
                  cudaStream_t stream) {
  using Tr = typename BwdConfig<kHeadDim>::Traits;
  using TileTr = typename BwdConfig<kHeadDim>::BiasTileTraits;  // the same tile, a 2-step ring
  BackwardParams& p = tp.p;
  const bool packed = p.cu_seqlens_q != nullptr;
  const std::int64_t heads = packed ? p.Hq : static_cast<std::int64_t>(p.B) * p.Hq;

  // 1. Zeroed accumulators: dq (every key block adds into it), the deterministic turn counters,
  //    a reduced dbias, and dbias itself where it is written tile by tile (causally skipped
  //    tiles are never visited). A dense call's dq accumulator is zeroed by the preprocess
  //    below, which reads dO anyway, instead of by a memset.
  const bool zero_in_preprocess = !packed;
  zero_dq_accumulators(tp, ws, stream, zero_in_preprocess);
  if (ws.dbias.mode == DbiasMode::reduced) {
    check_cuda(cudaMemsetAsync(tp.dbias_accum, 0,
                               static_cast<std::size_t>(ws.dbias.accum_elems) * 4, stream),
               "cudaMemsetAsync(dbias accumulator)");
  }
  if (ws.dbias.mode == DbiasMode::direct) launch_convert_dbias<T>(p, nullptr, stream);

  // 2. delta and lse·log2(e), padded to whole query blocks. With dropout delta is divided by
  //    keep_scale (times the keep probability t/256, exactly), as the main kernel wants it.
  const float delta_scale = delta_scale_of(p);
  const unsigned head_blocks = static_cast<unsigned>(std::min(heads, kMaxGridY));
  // Packed: the query tiles of the scheduler (the whole padded workspace blocks of each tile).
  const unsigned q_tiles = static_cast<unsigned>(tp.packed_q_tiles);
  if (!packed) {
    PreprocessRows rows{heads, ws.lq_pad, p.Lq};
    if (zero_in_preprocess) {  // [B·Hq][lq_pad rows][kHeadDim] floats, whatever their order
      rows.zero = p.dq_accum;
      rows.zero_cols = kHeadDim;
    }
    launch_bwd_preprocess<T>(p, p.softmax_d, tp.lse_log2, rows, delta_scale, stream);
  } else if (q_tiles > 0) {
    auto preprocess_packed = [&](auto kernel) {
      kernel<<<dim3(q_tiles, head_blocks), 256, 0, stream>>>(p, tp.lse_log2, ws.m_blocks,
                                                             delta_scale);
      check_launch("bwd_preprocess_packed_kernel launch");
    };
    p.Dv <= 64 ? preprocess_packed(bwd_preprocess_packed_kernel<T, 8, Tr::kBlockM>)
               : preprocess_packed(bwd_preprocess_packed_kernel<T, 16, Tr::kBlockM>);
  }

  // 3. The main kernel.
  const bool dbias_cross_cta =
      p.deterministic && ws.dbias.mode == DbiasMode::reduced && dbias_reduced_across_ctas(p);
  const BackwardLaunch launch{dbias_cross_cta, multiprocessors, stream};
  const bool bias = p.bias != nullptr;
  // A bias the launcher described for TMA (16-bit, varying over queries) comes in tiles.
  const bool tiles = bias && tp.bias_tiles;
  // ALiBi and the softcap run in the modifiers' kernels (bwd_kernel.cuh, kMods), dense or packed:
  // with a bias, the one that reads dropout, the bias and the cap at run time; without, one with
  // the cap (dropout at run time) and one per dropout without it. So does a dense window without
  // a bias or with one read per score (the plain dense kernels have no window code); alone (no
  // bias, ALiBi or cap), in the kernels without ALiBi's term (kAlibi false).
  // Each has its deterministic instantiation (kDet), for p.deterministic.
  const int mods = p.mods.flags;
  const bool dense_window = (mods & ScoreMods::kWindow) && !packed && !tiles;
  auto main_kernel = [&](auto deterministic) {
    constexpr bool kDet = decltype(deterministic)::value;
    if ((mods & (ScoreMods::kAlibi | ScoreMods::kSoftcap)) || dense_window) {
      constexpr ModsCap kOn = ModsCap::on, kOff = ModsCap::off;
      if (bias) {
        launch_backward_kernel<T, Tr, kDet, true, true, false, false, true>(tp, launch);
      } else if (mods & ScoreMods::kSoftcap) {
        launch_backward_kernel<T, Tr, kDet, true, false, false, false, true, kOn>(tp, launch);
      } else if (!(mods & ScoreMods::kAlibi)) {  // the window alone
        p.has_dropout
            ? launch_backward_kernel<T, Tr, kDet, true, false, false, false, true, kOff, false>(
                  tp, launch)
            : launch_backward_kernel<T, Tr, kDet, false, false, false, false, true, kOff, false>(
                  tp, launch);
      } else if (p.has_dropout) {
        launch_backward_kernel<T, Tr, kDet, true, false, false, false, true, kOff>(tp, launch);
      } else {
        launch_backward_kernel<T, Tr, kDet, false, false, false, false, true, kOff>(tp, launch);
      }
    } else if (packed) {  // no bias (the validators refuse one)
      p.has_dropout ? launch_backward_kernel<T, Tr, kDet, true, false, true>(tp, launch)
                    : launch_backward_kernel<T, Tr, kDet, false, false, true>(tp, launch);
    } else if (p.has_dropout) {
      tiles  ? launch_backward_kernel<T, TileTr, kDet, true, true, false, true>(tp, launch)
      : bias ? launch_backward_kernel<T, Tr, kDet, true, true>(tp, launch)
             : launch_backward_kernel<T, Tr, kDet, true, false>(tp, launch);
    } else {
      tiles  ? launch_backward_kernel<T, TileTr, kDet, false, true, false, true>(tp, launch)
      : bias ? launch_backward_kernel<T, Tr, kDet, false, true>(tp, launch)
             : launch_backward_kernel<T, Tr, kDet, false, false>(tp, launch);
    }
  };
  p.deterministic ? main_kernel(std::true_type{}) : main_kernel(std::false_type{});

  // 4. dq (and a reduced dbias) in the output dtype.
  const float dq_scale = p.has_dropout ? p.scale * p.keep_scale : p.scale;
  if (packed) {
    if (q_tiles > 0) {
      bwd_convert_dq_kernel<T, Tr::kBlockM, Tr::kDqSplitRows, true>
          <<<dim3(2 * q_tiles, head_blocks), 256, 0, stream>>>(p, p.dq_accum, ws.m_blocks,
                                                               dq_scale);
    }
  } else {
    bwd_convert_dq_kernel<T, Tr::kBlockM, Tr::kDqSplitRows>
        <<<dim3(2 * ws.m_blocks, head_blocks), 256, 0, stream>>>(p, p.dq_accum, ws.m_blocks,
                                                                 dq_scale);
  }
  check_launch("bwd_convert_dq_kernel launch");
  if (ws.dbias.mode == DbiasMode::reduced) launch_convert_dbias<T>(p, tp.dbias_accum, stream);
}

}  // namespace memeff::cuda::sm90
