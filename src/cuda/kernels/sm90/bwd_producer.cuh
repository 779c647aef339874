// The sm90 backward's producer (bwd_kernel.cuh): one thread of warpgroup 0 loads each step's Q
// and dO tiles (and with bias tiles the step's bias entries) by TMA into the kStages-deep ring.
#pragma once

#include <cstdint>

#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/sm90/bwd_traits.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// The steps of the CTA's tiles, in the walk's order: step it of a tile (ring step step0 + it over
// the CTA's tiles) waits for its stage to be empty, then loads query block walk.block(it) of head
// kvh·group + walk.head(it): Q and dO into sq(s) and sdo(s), and with kBiasTiles the bias entries
// of the block's queries by the tile's keys into dS buffer s (at base + kOffDs), all counted on
// full(s). b, kvh and n0 are the kernel's, which next_tile() moves to the CTA's next tile (false
// once there is none). Packed calls (q0: the sequence's first row) load from the maps' batch 0.
template <class Tr, bool kBiasTiles, class SQ, class SDo, class Full, class Empty, class NextTile>
__device__ __forceinline__ void load_backward_steps(
    const BackwardTmaParams& tp, const BackwardParams& p, const BackwardWalk& walk, int items,
    const int& b, const int& kvh, const std::int64_t& n0, bool packed_call, int q0,
    std::uint32_t base, SQ&& sq, SDo&& sdo, Full&& full, Empty&& empty, NextTile&& next_tile) {
  constexpr int kStages = Tr::kStages, kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN;
  prefetch_tensor_map(&tp.q);
  prefetch_tensor_map(&tp.dout);
  if constexpr (kBiasTiles) prefetch_tensor_map(&tp.bias);
  int step0 = 0;  // the ring's steps of the CTA's earlier tiles (kPersist)
  do {
    for (int it = 0; it < items; ++it) {
      const int s = (step0 + it) % kStages;
      const std::uint32_t phase = ((step0 + it) / kStages) & 1;
      const int hg = walk.head(it), m = walk.block(it);
      const int h = kvh * p.group + hg;
      mbar_wait(empty(s), phase ^ 1);
      mbar_arrive_expect_tx(full(s), 2 * Tr::kQBytes + (kBiasTiles ? Tr::kDsBytes : 0));
      // Packed maps are [1, Hq, total_q, D]: the sequence's first row added, batch 0.
      const int row = m * kBlockM + (packed_call ? q0 : 0), batch = packed_call ? 0 : b;
#pragma unroll
      for (int db = 0; db < Tr::kDBlocks; ++db) {
        tma_load_4d(sq(s) + db * Tr::kQBlockBytes, &tp.q, full(s), 64 * db, row, h, batch);
        tma_load_4d(sdo(s) + db * Tr::kQBlockBytes, &tp.dout, full(s), 64 * db, row, h, batch);
      }
      if constexpr (kBiasTiles) {
        // The step's bias entries into dS buffer s, which is free: the consumers arrive on
        // empty(s) only after step it - 2's dQ products, the last reader of that buffer. Box
        // (qb, w): queries 64·qb .. 64·qb + 63 of the block by the 64 keys of warpgroup w, a
        // query per 128-byte row, in warpgroup w's rows of the buffer (its dS goes there later:
        // it reads its bias first). A broadcast dimension has one index, 0; TMA zero-fills
        // queries past Lq and keys past Lk.
        const int bias_h = p.bias_stride.h != 0 ? h : 0, bias_b = p.bias_stride.b != 0 ? b : 0;
        const std::uint32_t ds = base + Tr::kOffDs + s * Tr::kDsBytes;
#pragma unroll
        for (int qb = 0; qb < kBlockM / 64; ++qb)
#pragma unroll
          for (int w = 0; w < Tr::kConsumers; ++w) {
            tma_load_4d(ds + qb * (kBlockN * 128) + w * 64 * 128, &tp.bias, full(s),
                        static_cast<int>(n0) + 64 * w, row + 64 * qb, bias_h, bias_b);
          }
      }
    }
    step0 += items;
  } while (next_tile());
}

}  // namespace memeff::cuda::sm90
