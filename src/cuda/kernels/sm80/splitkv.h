// The split-KV forward (splitkv_kernel.cuh) as the "cuda_splitkv" backend sees it: its reasons,
// the plan of a call (how many key splits, its workspace) and the launch. An mma.sync kernel of
// the sm80 family (it reuses the family's tile loads), with a host interface of its own since it
// has no backward: the fused backward of cuda_sm90 or cuda runs after it (same out and lse).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/hostdevice.h"
#include "core/visible_keys.h"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"

namespace memeff::cuda::sm80 {

// Rows (query heads of a GQA group x queries) per CTA: one m16 tile, so a decode step with a
// group of 4 wastes 12 of 16 MMA rows instead of 124 of 128.
inline constexpr int kSplitKvRows = 16;

// How one call is cut: grid = row_blocks · splits · B · Hkv CTAs; split s owns the 64-key blocks
// first_block + [s·blocks_per_split, min((s + 1)·blocks_per_split, key_blocks)) and writes its
// rows' partial output and lse to the workspace ([splits][B·Hq·Lq][Dv] fp32 and [splits][B·Hq·Lq]
// fp32). first_block is 0 but with a window (ScoreMods::kWindow), whose left side can hide the
// first keys from every query: only the modifiers' kernel reads it (the others start at block 0).
struct SplitKvPlan {
  int row_blocks = 1;        // ceil(group·Lq / kSplitKvRows)
  int key_blocks = 0;        // 64-key blocks some query sees
  int splits = 1;            // every split non-empty when key_blocks > 0
  int blocks_per_split = 0;  // ceil(key_blocks / splits)
  float* o_partial = nullptr;
  float* lse_partial = nullptr;
  std::size_t lse_offset = 0;  // bytes from the workspace's start to lse_partial
  std::size_t workspace_bytes = 0;
  int first_block = 0;  // last, so the fields above keep their offsets in the kernels' params
};

// The keys [begin, end) some query of i_first..i_last (i_first <= i_last) sees under Lk, the
// causal mask and the window (ScoreMods; its sides are kUnbounded without one), by
// core/visible_keys.h's rule. Empty (end <= begin) when none does. The plan's key blocks (all
// queries) and the modifiers' kernel's (the queries of its row block) are its 64-key blocks.
MEMEFF_HD detail::KeySpan splitkv_key_span(const ForwardParams& p, std::int64_t i_first,
                                           std::int64_t i_last) {
  return detail::visible_key_span_of_rows(i_first, i_last, p.Lk, is_causal(p), p.causal_shift,
                                          p.mods.left_reach, p.mods.right_reach);
}

struct SplitKv {
  static constexpr const char* kBackend = "cuda_splitkv";
  // Head dims D, Dv: multiples of 8 up to this (64 and 128 buckets).
  static constexpr int kLargestHeadDim = 128;
  static std::vector<std::string> forward_reasons(const ForwardParams& p, const DeviceCaps& dev);
  // The cut of a call on a device with dev.multiprocessors SMs (pointers unset).
  static SplitKvPlan plan(const ForwardParams& p, const DeviceCaps& dev);
  // Runs a non-empty call (B·Hq·Lq > 0) whose params passed the reasons; `workspace` holds
  // plan(p, dev).workspace_bytes, 16-byte aligned.
  static void forward(const ForwardParams& p, void* workspace, ElemType type, const DeviceCaps& dev,
                      cudaStream_t stream);
};

// One instantiation's launches (splitkv_run.cuh; inst/splitkv_*.cu), plan's pointers set: a call
// with a window, ALiBi or a softcap (p.mods.flags != 0) runs the modifiers' kernels.
template <class T, int kHeadDim>
void run_splitkv_forward(const ForwardParams& p, const SplitKvPlan& plan, cudaStream_t stream);

}  // namespace memeff::cuda::sm80
