// The producer of the sm90 forward (fwd_kernel.cuh): the one thread of warpgroup 0 that issues
// every TMA load of the CTA's work items, each completing on its "full" mbarrier once the
// consumers' arrivals on the "empty" one free its buffer.
#pragma once

#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/sm90/fwd_scheduler.cuh"
#include "cuda/kernels/sm90/fwd_smem.cuh"
#include "cuda/kernels/sm90/fwd_traits.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// Per work item: its index into the next Q buffer's item slot and its Q into the buffer, then K
// (with the bias tile, kBiasTiles) and V of each key tile it visits, from the last to the first,
// into the K/V ring that runs on across items; after the last item, the end of the walk into the
// next slot.
template <class V>
__device__ __forceinline__ void load_forward_tiles(const ForwardTmaParams& tp,
                                                   const ForwardSmem<V>& smem,
                                                   const ForwardScheduler<V>& scheduler) {
  using Tr = typename V::Tr;
  constexpr int kStages = Tr::kStages, kBlockN = Tr::kBlockN, kQStages = V::kQStages;
  const ForwardParams& p = tp.p;
  const bool packed_call = scheduler.packed_call;
  const PackedItem& packed = scheduler.packed;
  prefetch_tensor_map(&tp.q);
  prefetch_tensor_map(&tp.k);
  prefetch_tensor_map(&tp.v);
  if constexpr (V::kBiasTiles) prefetch_tensor_map(&tp.bias);
  // One K or V tile: the kDBlocks 64-column boxes of keys [row, row + kBlockN) of kv head kvh.
  auto load_kv = [&](std::uint32_t dst, const CUtensorMap* map, std::uint32_t full, int row,
                     int kvh, int b) {
#pragma unroll
    for (int db = 0; db < Tr::kDBlocks; ++db) {
      tma_load_4d(dst + db * Tr::kKVBlockBytes, map, full, 64 * db, row, kvh, b);
    }
  };
  int kv = 0;  // K/V tiles loaded so far: the ring position
  for (int index = scheduler.first_item(), local = 0;; ++local) {
    // The consumers are done with the Q this buffer held (kQStages items ago) and with its item.
    // They learn the new one (or the end of the walk) from their own count (static walk) or the
    // buffer's slot (dynamic), and its Q (or the end) by the buffer's q_full arrival.
    const int qs = local % kQStages;
    mbar_wait(smem.q_empty(qs), ((local / kQStages) & 1) ^ 1);
    scheduler.tell(qs, index);
    if (index == ForwardScheduler<V>::kEndOfWalk) {
      mbar_arrive(smem.q_full(qs));
      break;
    }
    const WorkItem w = scheduler.item_at(index);
    // Map coordinates: dense (b, h, row); packed (0, h, packed row), the sequence's first
    // query and key rows added (int32: total rows are at most 2^31 - 1).
    const int b = packed_call ? 0 : w.bh / p.Hq, h = packed_call ? packed.h : w.bh % p.Hq;
    const int kvh = h / p.group;
    const int k_row0 = packed_call ? static_cast<int>(packed.k0) : 0;
    mbar_arrive_expect_tx(smem.q_full(qs), Tr::kQBytes);
    const int q_row = static_cast<int>(w.m0 + (packed_call ? packed.q0 : 0));
#pragma unroll
    for (int db = 0; db < Tr::kDBlocks; ++db) {
      tma_load_4d(smem.sQ + qs * Tr::kQBytes + db * Tr::kQBlockBytes, &tp.q, smem.q_full(qs),
                  64 * db, q_row, h, b);
    }
    for (int it = 0; it < w.n_tiles; ++it, ++kv) {
      const int n_first = V::kWindowCode ? w.n_first : 0;
      const int row = k_row0 + (n_first + w.n_tiles - 1 - it) * kBlockN, s = kv % kStages;
      const std::uint32_t phase = (kv / kStages) & 1;
      mbar_wait(smem.k_empty(s), phase ^ 1);
      mbar_arrive_expect_tx(smem.k_full(s), Tr::kKVBytes);
      load_kv(smem.sK + s * Tr::kKVBytes, &tp.k, smem.k_full(s), row, kvh, b);
      if constexpr (V::kBiasTiles) {
        // The tile's bias entries: keys [row, row + kBlockN) of the block's query rows, in
        // boxes of 64 keys (dense calls only: row is the key). A broadcast dimension of the
        // bias has one index, 0; TMA zero-fills rows past Lq and keys past Lk.
        const int bias_h = p.bias_stride.h != 0 ? h : 0, bias_b = p.bias_stride.b != 0 ? b : 0;
        mbar_wait(smem.b_empty(s), phase ^ 1);
        mbar_arrive_expect_tx(smem.b_full(s), Tr::kBiasTileBytes);
#pragma unroll
        for (int kb = 0; kb < kBlockN / 64; ++kb) {
          tma_load_4d(smem.sB + s * Tr::kBiasTileBytes + kb * Tr::kBiasBoxBytes, &tp.bias,
                      smem.b_full(s), row + 64 * kb, q_row, bias_h, bias_b);
        }
      }
      mbar_wait(smem.v_empty(s), phase ^ 1);
      mbar_arrive_expect_tx(smem.v_full(s), Tr::kKVBytes);
      load_kv(smem.sV + s * Tr::kKVBytes, &tp.v, smem.v_full(s), row, kvh, b);
    }
    // The next item once this one's loads are issued: a CTA takes it from the dynamic walk's
    // counter about when its consumers reach this item's last key tiles.
    index = scheduler.next_item(index);
  }
}

}  // namespace memeff::cuda::sm90
