// The split-KV forward's host interface (splitkv.h): its reasons, the split count and workspace
// of a call (over the keys its window leaves visible), and the pick of the dtype x head-dim
// instantiation.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels/common/instances.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm80/splitkv.h"
#include "memeff/error.h"

namespace memeff::cuda::sm80 {
namespace {

using SplitKvHeadDims = HeadDims<64, 128>;

// A split count qualifies when its grid fills its last wave at least this fraction as well as the
// best split count does (the fill of a grid: its CTAs over the slots of the waves it takes).
constexpr double kWaveFillShare = 0.85;
constexpr std::int64_t kKeyBlock = 64;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::int64_t splitkv_split_count(std::int64_t base, std::int64_t key_blocks, std::int64_t wave) {
  if (key_blocks <= 0 || base <= 0) return 1;
  wave = std::max<std::int64_t>(wave, 1);
  // Split counts that cut the blocks into equal runs with none left over: s for which
  // ceil(key_blocks / ceil(key_blocks / s)) == s (the others launch that many CTAs anyway).
  const std::int64_t most = std::min<std::int64_t>(key_blocks, kSplitKvMaxSplits);
  auto fill = [&](std::int64_t s) {
    const std::int64_t ctas = base * s;
    return static_cast<double>(ctas) / static_cast<double>(ceil_div(ctas, wave) * wave);
  };
  auto exact = [&](std::int64_t s) { return ceil_div(key_blocks, ceil_div(key_blocks, s)) == s; };
  double best = 0.0;
  for (std::int64_t s = 1; s <= most; ++s) {
    if (exact(s)) best = std::max(best, fill(s));
  }
  for (std::int64_t s = 1; s <= most; ++s) {
    if (exact(s) && fill(s) >= kWaveFillShare * best) return s;
  }
  return most;  // not reached: the best one qualifies
}

SplitKvPlan SplitKv::plan(const ForwardParams& p, const DeviceCaps& dev, int ctas_per_sm) {
  SplitKvPlan plan;
  const std::int64_t rows = static_cast<std::int64_t>(p.group) * p.Lq;
  plan.row_blocks = static_cast<int>(std::max<std::int64_t>(1, ceil_div(rows, kSplitKvRows)));
  // Keys some query sees: under a causal mask the last query's diagonal bounds them; a window
  // also the first query's left side (the splits then cover the visible blocks only, so a short
  // window over a long cache gets as many CTAs as its keys fill).
  std::int64_t key_end = p.Lk;
  if (is_causal(p)) key_end = std::min(key_end, p.Lq + p.causal_shift);
  std::int64_t first_block = 0;
  if (p.mods.flags & ScoreMods::kWindow) {
    const detail::KeySpan keys = splitkv_key_span(p, 0, p.Lq - 1);
    key_end = keys.size() > 0 ? keys.end : 0;
    first_block = keys.size() > 0 ? keys.begin / kKeyBlock : 0;
  }
  key_end = std::max<std::int64_t>(key_end, 0);
  const std::int64_t key_blocks = ceil_div(key_end, kKeyBlock) - first_block;
  plan.key_blocks = static_cast<int>(key_blocks);
  plan.first_block = static_cast<int>(first_block);
  const std::int64_t base = static_cast<std::int64_t>(plan.row_blocks) * p.B * p.Hkv;
  const std::int64_t splits = splitkv_split_count(
      base, key_blocks, std::max(dev.multiprocessors, 1) * std::int64_t{std::max(ctas_per_sm, 1)});
  if (key_blocks > 0) plan.blocks_per_split = static_cast<int>(ceil_div(key_blocks, splits));
  plan.splits = static_cast<int>(splits);
  const std::int64_t rows_total = static_cast<std::int64_t>(p.B) * p.Hq * p.Lq;
  auto rounded = [](std::int64_t floats) {
    return static_cast<std::size_t>(ceil_div(floats * 4, 256) * 256);
  };
  plan.lse_offset = rounded(splits * rows_total * p.Dv);
  plan.workspace_bytes = plan.lse_offset + rounded(splits * rows_total);
  return plan;
}

std::vector<std::string> SplitKv::forward_reasons(const ForwardParams& p, const DeviceCaps& dev) {
  std::vector<std::string> reasons;
  if (dev.major < 8) {
    reasons.push_back(
        "needs compute capability 8.0 or newer (mma.sync bf16, cp.async); device has " +
        std::to_string(dev.major) + "." + std::to_string(dev.minor));
  }
  add_common_reasons(reasons, p, kLargestHeadDim);
  add_score_modifier_reasons(reasons, p);  // the softcap's range, as the fused kernels'
  if (packed_layout(p)) {
    reasons.push_back(
        "packed (varlen) calls: the split-KV forward runs dense batches only (cuda and cuda_sm90 "
        "run them)");
    return reasons;
  }
  if (p.Lk > kMaxGridX || p.Lq > kMaxGridX) reasons.push_back("Lq and Lk must be below 2^31");
  if (reasons.empty()) {
    // The most CTAs a plan can launch on any device: the most splits (the combine: a CTA per row).
    const SplitKvPlan pl = plan(p, dev, 1);
    const std::int64_t most_splits = std::clamp<std::int64_t>(pl.key_blocks, 1, kSplitKvMaxSplits);
    const std::int64_t ctas = static_cast<std::int64_t>(pl.row_blocks) * most_splits * p.B * p.Hkv;
    const std::int64_t rows_total = static_cast<std::int64_t>(p.B) * p.Hq * p.Lq;
    if (ctas > kMaxGridX || rows_total > kMaxGridX) {
      reasons.push_back("B·Hq·Lq = " + std::to_string(rows_total) +
                        " rows exceed the grid's 2^31 - 1 blocks");
    }
  }
  return reasons;
}

void SplitKv::forward(const ForwardParams& p, void* workspace, ElemType type, const DeviceCaps& dev,
                      cudaStream_t stream) {
  if (p.Lq == 0 || p.B == 0 || p.Hq == 0) return;
  SplitKvPlan plan = SplitKv::plan(p, dev, SplitKv::ctas_per_sm(p, type));
  if (workspace == nullptr) {
    throw Error(ErrorCode::invalid_argument,
                "argument `workspace`: the cuda_splitkv forward needs " +
                    std::to_string(plan.workspace_bytes) + " bytes, got a null pointer");
  }
  plan.o_partial = static_cast<float*>(workspace);
  plan.lse_partial =
      reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + plan.lse_offset);
  const int bucket = SplitKvHeadDims::bucket_of(std::max(p.D, p.Dv));
  const bool ran = switch_instance(SplitKvHeadDims{}, type, bucket, [&](auto inst) {
    using I = decltype(inst);
    run_splitkv_forward<typename I::T, I::kHeadDim>(p, plan, dev.major >= 9, stream);
  });
  if (!ran) {
    throw Error(ErrorCode::unsupported, "cuda_splitkv forward: head dims D = " +
                                            std::to_string(p.D) + ", Dv = " + std::to_string(p.Dv) +
                                            " have no kernel (multiples of 8 up to 128)");
  }
}

int SplitKv::ctas_per_sm(const ForwardParams& p, ElemType type) {
  int n = 1;
  switch_instance(SplitKvHeadDims{}, type, SplitKvHeadDims::bucket_of(std::max(p.D, p.Dv)),
                  [&](auto inst) {
                    using I = decltype(inst);
                    n = splitkv_ctas_per_sm<typename I::T, I::kHeadDim>(p);
                  });
  return n;
}

}  // namespace memeff::cuda::sm80
