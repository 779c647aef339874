// The sm90 backward's dQ (bwd_kernel.cuh) on its way to the fp32 workspace: a consumer
// warpgroup's fragments added by 16-byte reductions or staged in shared memory for one bulk
// reduction, and the deterministic mode's turns on a chunk's counter and its writer warps.
#pragma once

#include <cstdint>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/sm90/bwd_traits.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// A consumer warpgroup's dQ of one step, kHalfDT / 8 blocks of 64 x 64 (wgmma accumulators, n8
// tile j of block j / 8), added to the workspace chunks from `chunks` on: float4 number f·128 +
// thread of a chunk holds n8 tile f of that chunk (bwd_convert_dq_kernel's order), by 16-byte
// reductions (red_add_f32x4) issued straight from the registers.
template <int kHalfDT>
__device__ __forceinline__ void add_dq_fragments(float* chunks, const float (&dq)[kHalfDT][4],
                                                 int ctid) {
#pragma unroll
  for (int j = 0; j < kHalfDT; ++j) {
    float* dst = chunks + (j / 8) * (64 * 64) + ((j % 8) * 128 + ctid) * 4;
    red_add_f32x4(dst, dq[j][0], dq[j][1], dq[j][2], dq[j][3]);
  }
}

// The deterministic mode's staging of a consumer warpgroup's dQ of one step (64 x 64, kHalfDT = 8)
// in shared memory, in the workspace chunk's order (add_dq_fragments), for one bulk reduction.
template <int kHalfDT>
__device__ __forceinline__ void stage_dq_fragments(unsigned char* stage,
                                                   const float (&dq)[kHalfDT][4], int ctid) {
  static_assert(kHalfDT == 8, "one 64 x 64 chunk");
#pragma unroll
  for (int j = 0; j < kHalfDT; ++j) {
    *reinterpret_cast<float4*>(stage + ((j * 128 + ctid) << 4)) =
        make_float4(dq[j][0], dq[j][1], dq[j][2], dq[j][3]);
  }
}

// Where a consumer warpgroup's staged dQ goes (the deterministic mode): its workspace chunk and
// its turn there. Plain members only: it lives in shared memory.
struct DqSlot {
  std::int64_t chunk;
  int turn;
  int pad;
};

// The deterministic mode's turns on a dQ chunk's counter `turn`: wait until it reads `my_turn`
// (with at_least: until it has reached it, for counters that may skip a turn: packed calls, whose
// unchecked offsets may let two sequences share chunks), and pass the turn on (raising the
// counter monotonically with at_least).
__device__ __forceinline__ void wait_dq_turn(const int* turn, int my_turn, bool at_least) {
  if (at_least) {
    while (ld_acquire(turn) < my_turn) {
    }
  } else {
    while (ld_acquire(turn) != my_turn) {
    }
  }
}
__device__ __forceinline__ void pass_dq_turn(int* turn, int my_turn, bool at_least) {
  if (at_least) {
    red_release_max(turn, my_turn + 1);
  } else {
    st_release(turn, my_turn + 1);
  }
}

// The deterministic mode's dQ writer w (lane 0 of producer warp w + 1): for each of the CTA's
// `items` steps, once consumer warpgroup w has staged its dQ of the step (staged(s, w) of stage
// s; the chunk and turn in dq_slot(s, w), the fragments at dq_stage(it, w)), waits for the
// chunk's turn, adds it with one bulk reduction, frees the stage (empty(s)) once the reduction has
// read it and passes the turn on once its writes are performed. The consumers go on meanwhile.
template <class Tr, class Staged, class Slot, class Stage, class Empty>
__device__ __forceinline__ void write_staged_dq(const BackwardTmaParams& tp,
                                                const BackwardParams& p, int w, int items,
                                                bool at_least, Staged&& staged, Slot&& dq_slot,
                                                Stage&& dq_stage, Empty&& empty) {
  for (int it = 0; it < items; ++it) {
    const int s = it % Tr::kStages;
    mbar_wait(staged(s, w), (it / Tr::kStages) & 1);
    const std::int64_t chunk = dq_slot(s, w)->chunk;
    const int my_turn = dq_slot(s, w)->turn;
    int* const turn = tp.dq_turn + chunk;
    wait_dq_turn(turn, my_turn, at_least);
    fence_proxy_async_global();  // the previous adder's writes before this reduction
    bulk_reduce_add_f32(p.dq_accum + chunk * Tr::kDqFloats, dq_stage(it, w), Tr::kDqFloats * 4);
    bulk_commit();
    bulk_wait_read<0>();
    mbar_arrive(empty(s));
    bulk_wait<0>();
    fence_proxy_async_global();  // the reduction's writes before the release
    pass_dq_turn(turn, my_turn, at_least);
  }
}

// A step's dQ epilogue: a consumer warpgroup's dQ (add_dq_fragments) into the workspace chunks
// from `chunks` on. In the deterministic mode the key blocks that add into a chunk take turns on
// its counter `turn`: thread 0 waits for `my_turn` (wait_dq_turn), the warpgroup adds, makes its
// reductions visible, and thread 0 passes the turn on. `barrier`: the warpgroup's named barrier.
template <int kHalfDT>
__device__ __forceinline__ void add_dq_in_turn(float* chunks, const float (&dq)[kHalfDT][4],
                                               bool deterministic, int* turn, int my_turn,
                                               bool at_least, int barrier, int ctid) {
  if (deterministic) {
    if (ctid == 0) wait_dq_turn(turn, my_turn, at_least);
    named_bar_sync(barrier, 128);
  }
  add_dq_fragments(chunks, dq, ctid);
  if (deterministic) {
    __threadfence();
    named_bar_sync(barrier, 128);
    if (ctid == 0) pass_dq_turn(turn, my_turn, at_least);
  }
}

}  // namespace memeff::cuda::sm90
