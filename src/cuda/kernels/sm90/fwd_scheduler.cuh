// The tile scheduler of the sm90 forward (fwd_kernel.cuh): the work items a CTA takes, each with
// its trip count over key tiles. Dense calls walk theirs from blockIdx.x, in steps of gridDim.x
// or taking each next one from a counter (persistent grids), or one CTA per item; the items come
// in bands of heads (common/block_order.h). A packed call's CTA takes the one item the varlen
// tile scheduler gives it (common/varlen.cuh).
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm90/fwd_traits.cuh"
#include "cuda/kernels/sm90/fwd_variant.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// One work item: batch·head, first query row, and the key tiles any of its rows sees:
// n_tiles of them from n_first (a window skips those before; the causal mask and the window
// those after).
struct WorkItem {
  int bh = 0;
  std::int64_t m0 = 0;
  int n_tiles = 0, n_first = 0;
};

// The key tiles query block m0 sees, in a work item: with the call's window (KeyMask) in the
// instantiations that have its code (kWindow), from key tile 0 in the others.
template <class Tr, bool kWindow>
__device__ __forceinline__ void set_key_tiles(WorkItem& w, const ForwardParams& p, std::int64_t Lk,
                                              std::int64_t shift) {
  if constexpr (kWindow) {
    const BlockRange tiles = KeyMask{is_causal(p), Lk, shift, p.mods.left_reach, p.mods.right_reach}
                                 .key_tile_range<Tr::kBlockM, Tr::kBlockN>(w.m0);
    w.n_tiles = tiles.count();
    w.n_first = tiles.begin;
  } else {
    w.n_tiles = KeyMask{is_causal(p), Lk, shift}.key_tiles<Tr::kBlockM, Tr::kBlockN>(w.m0);
  }
}

template <class Tr, bool kWindow>
__device__ __forceinline__ WorkItem work_item(const ForwardParams& p, int m_blocks, int head_band,
                                              int index) {
  const GridBlock<int> block = banded_block<int>(index, m_blocks, head_band);
  WorkItem w;
  w.bh = block.head;
  w.m0 = static_cast<std::int64_t>(m_blocks - 1 - block.position) * Tr::kBlockM;
  set_key_tiles<Tr, kWindow>(w, p, p.Lk, p.causal_shift);
  return w;
}

// A packed call's work item with its sequence. Plain members only: it crosses the CTA through a
// __shared__ variable.
struct PackedItem {
  int valid;                    // 0: the CTA's tile is past the last one of its head (it exits)
  int h, bh, n_tiles, n_first;  // bh = sequence·Hq + h: the dropout map's (b, h) with b = s
  std::int64_t m0;              // first query row of the block, inside the sequence
  std::int64_t q0, k0, Lq, Lk, causal_shift;  // the sequence (SeqSpan)
};

// The CTA's item: CTA x takes head x / tiles and tile x % tiles of the scheduler over
// cu_seqlens_q; the query blocks of a sequence are visited from the last to the first, as a dense
// head's are. Warp 0 runs the scheduler's scan, thread 0 shares the result, every thread of the
// CTA returns it. A CTA-wide barrier: call it from all threads, before the roles split.
template <class Tr>
__device__ __forceinline__ PackedItem packed_item_of_cta(const ForwardParams& p, int tiles) {
  // (Packed calls take no bias: every instantiation that runs them has the window's code.)
  __shared__ PackedItem slot;
  if (threadIdx.x < 32) {
    PackedItem it{};
    const int index = static_cast<int>(blockIdx.x), h = index / tiles;
    const VarlenTile tile =
        varlen_tile(p.cu_seqlens_q, p.B, p.total_q, p.Lq, Tr::kBlockM, index - h * tiles);
    if (tile.seq < p.B) {
      const SeqSpan span = seq_span(p, tile.seq);
      const std::int64_t m_blocks = (span.Lq + Tr::kBlockM - 1) / Tr::kBlockM;
      it.valid = 1;
      it.h = h;
      it.bh = tile.seq * p.Hq + h;
      it.m0 = (m_blocks - 1 - tile.block) * Tr::kBlockM;
      WorkItem w;
      w.m0 = it.m0;
      set_key_tiles<Tr, true>(w, p, span.Lk, span.causal_shift);
      it.n_tiles = w.n_tiles;
      it.n_first = w.n_first;
      it.q0 = span.q0;
      it.k0 = span.k0;
      it.Lq = span.Lq;
      it.Lk = span.Lk;
      it.causal_shift = span.causal_shift;
    }
    if (threadIdx.x == 0) slot = it;
  }
  __syncthreads();
  return slot;
}

// The CTA's work items. Dense calls walk m_blocks·B·Hq of them (the launcher bounds the count by
// 2^31 - 1) from item blockIdx.x: statically in steps of gridDim.x, or dynamically, the producer
// taking each next item from the launcher's counter (ForwardTmaParams::item_counter) once it has
// issued the current one's loads, so the CTA that runs ahead takes more. A packed CTA has its one
// item, index 0, taken before the roles split (packed_item_of_cta). The producer walks the items
// (first_item, then next_item until it gives kEndOfWalk) and arrives on a Q buffer's q_full once
// more after the last one; the consumers take each Q buffer's item from their own count
// (static; then wait for its Q) or from the buffer's slot in global memory (dynamic; they wait
// for its Q after reading it: item_after).
template <class V>
struct ForwardScheduler {
  using Tr = typename V::Tr;
  static constexpr int kEndOfWalk = -1;

  const ForwardTmaParams& tp;
  const bool packed_call;    // the params' packing (a constant outside the modifiers' kernels)
  const PackedItem& packed;  // packed_call: the CTA's item and its sequence
  const int m_blocks, items;
  int* const counter;  // the dynamic walk's (dense calls), else null
  int* const slots;    // the dynamic walk: this CTA's item per Q buffer

  __device__ __forceinline__ ForwardScheduler(const ForwardTmaParams& tp, bool packed_call,
                                              const PackedItem& packed)
      : tp(tp),
        packed_call(packed_call),
        packed(packed),
        m_blocks(packed_call ? 0 : static_cast<int>((tp.p.Lq + Tr::kBlockM - 1) / Tr::kBlockM)),
        items(packed_call ? 1 : m_blocks * tp.p.B * tp.p.Hq),
        counter(packed_call ? nullptr : tp.item_counter),
        slots(counter != nullptr ? tp.item_slots + blockIdx.x * kMaxQStages : nullptr) {}

  // The CTA's first item (the grid never has more CTAs than items).
  __device__ __forceinline__ int first_item() const {
    return packed_call ? 0 : static_cast<int>(blockIdx.x);
  }
  // The static walk's item after `index`.
  __device__ __forceinline__ int counted_next(int index) const {
    if (packed_call) return kEndOfWalk;
    const std::int64_t next = std::int64_t{index} + gridDim.x;
    return next < items ? static_cast<int>(next) : kEndOfWalk;
  }
  // The producer's next item: from the counter (dynamic) or counted.
  __device__ __forceinline__ int next_item(int index) const {
    if (counter == nullptr) return counted_next(index);
    const std::int64_t next = std::int64_t{atomicAdd(counter, 1)} + gridDim.x;
    return next < items ? static_cast<int>(next) : kEndOfWalk;
  }
  // The dynamic walk's slots hold an item, kSlotEnd (the end of the walk) or kSlotEmpty (as the
  // producer clears them before the CTA-wide barrier that starts the roles). A CTA's items
  // increase, so a slot's next value is greater than the last item the consumers took: they
  // poll the slot (relaxed loads; it carries nothing else) until it is, which needs no barrier
  // and lets them read it ahead, while their last item's epilogue runs.
  static constexpr int kSlotEmpty = INT_MIN, kSlotEnd = INT_MAX;
  __device__ __forceinline__ bool dynamic() const { return slots != nullptr; }
  __device__ __forceinline__ void clear_slots() const {
    if (slots != nullptr) {
      for (int s = 0; s < kMaxQStages; ++s) slots[s] = kSlotEmpty;
    }
  }
  // The producer tells the consumers the item (or kEndOfWalk) of Q buffer qs, before its loads.
  __device__ __forceinline__ void tell(int qs, int index) const {
    if (slots != nullptr) st_relaxed(slots + qs, index == kEndOfWalk ? kSlotEnd : index);
  }
  // A consumer's look at slot qs (dynamic walk).
  __device__ __forceinline__ int peek(int qs) const { return ld_relaxed(slots + qs); }
  // The item of slot qs after `taken` (the consumers' last item, -1 before the first), polling
  // from `seen`, a value read earlier (dynamic walk): an item or kEndOfWalk.
  __device__ __forceinline__ int item_after(int qs, int seen, int taken) const {
    while (seen <= taken) seen = ld_relaxed(slots + qs);
    return seen == kSlotEnd ? kEndOfWalk : seen;
  }

  __device__ __forceinline__ WorkItem item_at(int index) const {
    return item_of(packed_call, packed, tp.p, m_blocks, tp.head_band, index);
  }
  // item_at from values the caller holds: the consumers call it with their copies (through `this`
  // the modifiers' kernels got other register assignments).
  static __device__ __forceinline__ WorkItem item_of(bool packed_call, const PackedItem& packed,
                                                     const ForwardParams& p, int m_blocks,
                                                     int head_band, int index) {
    return packed_call ? WorkItem{packed.bh, packed.m0, packed.n_tiles, packed.n_first}
                       : work_item<Tr, V::kWindowCode>(p, m_blocks, head_band, index);
  }
};

}  // namespace memeff::cuda::sm90
