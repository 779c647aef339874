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

// At most this many splits: the combine reads every split's lse per row, one per thread of its
// CTA (splitkv_combine_kernel).
inline constexpr int kSplitKvMaxSplits = 128;
// Threads of a combine CTA (one row): one per split's lse.
inline constexpr int kSplitKvCombineThreads = 128;

// The plan's split count for `base` CTAs per split (row blocks x batches x kv heads) over
// `key_blocks` 64-key blocks, on a GPU holding `wave` CTAs at once (SMs x CTAs per SM). Of the
// counts that cut the blocks into equal non-empty runs (at most kSplitKvMaxSplits), the smallest
// whose grid fills its last wave at least 85% as well as the best count's does: the fewest splits
// (the least partial output to combine, the longest runs per CTA) that leave no wave's tail
// mostly idle. 1 when there is no block.
std::int64_t splitkv_split_count(std::int64_t base, std::int64_t key_blocks, std::int64_t wave);

struct SplitKv {
  static constexpr const char* kBackend = "cuda_splitkv";
  // Head dims D, Dv: multiples of 8 up to this (64 and 128 buckets).
  static constexpr int kLargestHeadDim = 128;
  static std::vector<std::string> forward_reasons(const ForwardParams& p, const DeviceCaps& dev);
  // The cut of a call on a device with dev.multiprocessors SMs, each holding `ctas_per_sm` CTAs
  // of the call's kernel at once (pointers unset). The split count is the smallest whose grid
  // fills its last wave of CTAs nearly as well as any split count can (see the definition).
  static SplitKvPlan plan(const ForwardParams& p, const DeviceCaps& dev, int ctas_per_sm);
  // How many CTAs of the kernel that runs `p` an SM of the current device holds at once (the
  // occupancy calculator's answer, asked once per kernel); at least 1.
  static int ctas_per_sm(const ForwardParams& p, ElemType type);
  // Runs a non-empty call (B·Hq·Lq > 0) whose params passed the reasons; `workspace` holds
  // plan(p, dev, ctas_per_sm(p, type)).workspace_bytes, 16-byte aligned. With compute capability
  // 9.0 or newer the combine is launched as a programmatic dependent of the splits' kernel.
  static void forward(const ForwardParams& p, void* workspace, ElemType type, const DeviceCaps& dev,
                      cudaStream_t stream);
};

// One instantiation's launches (splitkv_run.cuh; inst/splitkv_*.cu), plan's pointers set: a call
// with a window, ALiBi or a softcap (p.mods.flags != 0) runs the modifiers' kernels. `chained`:
// launch the combine as a programmatic dependent (compute capability 9.0 and newer).
template <class T, int kHeadDim>
void run_splitkv_forward(const ForwardParams& p, const SplitKvPlan& plan, bool chained,
                         cudaStream_t stream);
// The resident CTAs per SM of the kernel run_splitkv_forward launches for `p`.
template <class T, int kHeadDim>
int splitkv_ctas_per_sm(const ForwardParams& p);

}  // namespace memeff::cuda::sm80
