// Host side of one sm90 forward instantiation: the tile shape per head-dim bucket, dropout and
// bias turned into template arguments, the shared-memory opt-in and the launch. Included only by
// the per-instantiation files inst/fwd_*.cu (one dtype x head dim each).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "cuda/kernels/common/bias_row_repair.cuh"
#include "cuda/kernels/sm90/fwd_kernel.cuh"
#include "cuda/kernels/sm90/instances.h"
#include "cuda/kernels/sm90/kernel_setup.h"
#include "cuda/runtime/check.h"

namespace memeff::cuda::sm90 {

template <class T, class Tr, bool kDropout, bool kBias, bool kPacked = false,
          bool kKeyBias = false>
void launch_forward_kernel(const ForwardTmaParams& params, int multiprocessors,
                           cudaStream_t stream) {
  auto kernel = attention_forward_kernel<T, Tr, kDropout, kBias, kPacked, kKeyBias>;
  constexpr int kSmem = Tr::kSmemBytes;
  static std::atomic<unsigned long long> prepared{0};
  setup_warp_specialized<Tr>(prepared, kernel, "sm90 forward kernel");
  const ForwardParams& p = params.p;
  if constexpr (kPacked) {
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
  // causal mask the items' costs differ, and one CTA per item lets the hardware hand the next
  // item to whichever SM frees up first (measured on the H200: the persistent grid lost 10-37% on
  // the causal anchor shapes and won 15% on bert-base; docs/benchmarks.md).
  const long long items = (p.Lq + Tr::kBlockM - 1) / Tr::kBlockM * p.B * p.Hq;
  const long long sms = multiprocessors > 0 ? multiprocessors : 1;
  const long long ctas = !is_causal(p) && items > sms ? sms : items;
  kernel<<<static_cast<unsigned>(ctas), Tr::kThreads, kSmem, stream>>>(params);
  check_launch("attention_forward_kernel launch");
}

template <class T, int kHeadDim>
void run_forward(const ForwardTmaParams& params, int multiprocessors, cudaStream_t stream) {
  using Tr = typename FwdConfig<kHeadDim>::Traits;
  const bool bias = params.p.bias != nullptr;
  if (params.p.cu_seqlens_q != nullptr) {  // packed: no bias (the validators refuse one)
    params.p.has_dropout
        ? launch_forward_kernel<T, Tr, true, false, true>(params, multiprocessors, stream)
        : launch_forward_kernel<T, Tr, false, false, true>(params, multiprocessors, stream);
    return;
  }
  // A bias broadcast over queries (a key-padding mask) is staged in shared memory per key tile.
  const bool key_bias = bias && params.p.bias_stride.l == 0;
  if (params.p.has_dropout) {
    if (key_bias) {
      launch_forward_kernel<T, Tr, true, true, false, true>(params, multiprocessors, stream);
    } else {
      bias ? launch_forward_kernel<T, Tr, true, true>(params, multiprocessors, stream)
           : launch_forward_kernel<T, Tr, true, false>(params, multiprocessors, stream);
    }
  } else {
    if (key_bias) {
      launch_forward_kernel<T, Tr, false, true, false, true>(params, multiprocessors, stream);
    } else {
      bias ? launch_forward_kernel<T, Tr, false, true>(params, multiprocessors, stream)
           : launch_forward_kernel<T, Tr, false, false>(params, multiprocessors, stream);
    }
  }
  if (bias) {  // rows a NaN behind a -inf bias reached (common/bias_row_repair.cuh)
    launch_bias_row_repair<T>(params.p, stream);
    check_launch("bias_row_repair_kernel launch");
  }
}

}  // namespace memeff::cuda::sm90
