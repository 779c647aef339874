// The split-KV forward's host logic, which needs no device: how a call is cut into key splits
// (every split a non-empty run of whole 64-key blocks covering exactly the blocks some query
// sees, a window's included, enough CTAs for the SMs, the workspace that holds the partial
// outputs) and what it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"
#include "cuda/kernels/sm80/splitkv.h"

namespace memeff::cuda {
namespace {

using sm80::SplitKv;
using sm80::SplitKvPlan;

ForwardParams decode_params(int B, int Hq, int Hkv, std::int64_t Lq, std::int64_t Lk, int D) {
  ForwardParams p;
  p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.group = Hq / Hkv;
  p.Lq = Lq, p.Lk = Lk, p.D = p.Dv = D;
  return p;
}

bool contains(const std::vector<std::string>& reasons, const std::string& part) {
  return std::any_of(reasons.begin(), reasons.end(),
                     [&](const std::string& r) { return r.find(part) != std::string::npos; });
}

TEST(SplitKvPlan, SplitsAreNonEmptyRunsOfWholeBlocksOverTheVisibleKeys) {
  for (int sms : {1, 16, 132}) {
    for (int per_sm : {1, 3, 4}) {
      for (std::int64_t Lq : {1, 7, 16, 100}) {
        for (std::int64_t Lk : {0, 1, 63, 64, 65, 1000, 8192, 100000}) {
          for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
            ForwardParams p = decode_params(2, 8, 2, Lq, Lk, 128);
            p.causal = causal;
            p.causal_shift = causal == Causal::bottom_right ? Lk - Lq : 0;
            const SplitKvPlan plan = SplitKv::plan(p, {9, 0, sms}, per_sm);
            SCOPED_TRACE("SMs " + std::to_string(sms) + " x " + std::to_string(per_sm) + " Lq " +
                         std::to_string(Lq) + " Lk " + std::to_string(Lk) + " causal " +
                         std::to_string(static_cast<int>(causal)));
            // The blocks some query sees, by brute force over the last query's diagonal.
            std::int64_t key_end = 0;
            for (std::int64_t i = 0; i < Lq; ++i) {
              const std::int64_t end =
                  causal == Causal::none ? Lk : std::min(Lk, i + p.causal_shift + 1);
              key_end = std::max(key_end, end);
            }
            EXPECT_EQ(plan.key_blocks, (key_end + 63) / 64);
            EXPECT_EQ(plan.row_blocks, (4 * Lq + 15) / 16);
            ASSERT_GE(plan.splits, 1);
            if (plan.key_blocks == 0) {
              EXPECT_EQ(plan.splits, 1);
            } else {
              // Split s owns [s·bps, min((s + 1)·bps, key_blocks)): the last one is non-empty and
              // nothing is left over.
              EXPECT_LT(static_cast<std::int64_t>(plan.splits - 1) * plan.blocks_per_split,
                        plan.key_blocks);
              EXPECT_GE(static_cast<std::int64_t>(plan.splits) * plan.blocks_per_split,
                        plan.key_blocks);
              EXPECT_LE(plan.splits, 128);
              // The split count is the rule's for this grid (its fill: SplitCountFillsTheLastWave).
              const std::int64_t base = static_cast<std::int64_t>(plan.row_blocks) * p.B * p.Hkv;
              EXPECT_EQ(plan.splits, sm80::splitkv_split_count(base, plan.key_blocks,
                                                               std::int64_t{sms} * per_sm));
            }
            const std::size_t rows = static_cast<std::size_t>(p.B) * p.Hq * Lq;
            EXPECT_GE(plan.lse_offset, plan.splits * rows * p.Dv * 4);
            EXPECT_EQ(plan.lse_offset % 256, 0u);
            EXPECT_GE(plan.workspace_bytes, plan.lse_offset + plan.splits * rows * 4);
          }
        }
      }
    }
  }
}

// The split count's rule, by brute force over every count: the chosen one cuts the blocks into
// equal non-empty runs, its grid fills its last wave at least 85% as well as the best count's,
// and no smaller count does.
TEST(SplitKvPlan, SplitCountFillsTheLastWave) {
  auto ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  for (std::int64_t wave : {1, 132, 396, 528}) {
    for (std::int64_t base : {1, 2, 8, 31, 64, 100, 256, 396, 512, 1000, 5000}) {
      for (std::int64_t blocks : {1, 2, 7, 16, 64, 100, 128, 129, 512, 4096}) {
        SCOPED_TRACE("wave " + std::to_string(wave) + " base " + std::to_string(base) + " blocks " +
                     std::to_string(blocks));
        const std::int64_t s = sm80::splitkv_split_count(base, blocks, wave);
        auto exact = [&](std::int64_t n) { return ceil_div(blocks, ceil_div(blocks, n)) == n; };
        auto fill = [&](std::int64_t n) {
          return static_cast<double>(base * n) /
                 static_cast<double>(ceil_div(base * n, wave) * wave);
        };
        ASSERT_GE(s, 1);
        ASSERT_LE(s, std::min<std::int64_t>(blocks, 128));
        EXPECT_TRUE(exact(s));
        double best = 0.0;
        for (std::int64_t n = 1; n <= std::min<std::int64_t>(blocks, 128); ++n) {
          if (exact(n)) best = std::max(best, fill(n));
        }
        EXPECT_GE(fill(s), 0.85 * best);
        for (std::int64_t n = 1; n < s; ++n) {
          if (exact(n)) EXPECT_LT(fill(n), 0.85 * best) << n << " splits";
        }
      }
    }
  }
  // No block: one split (it writes its rows' empty partials).
  EXPECT_EQ(sm80::splitkv_split_count(64, 0, 396), 1);
}

TEST(SplitKvPlan, TheDecodeStepsOfIssue24FillOneWaveOfAnH100) {
  // B = 8, 32 query heads on 8 kv heads, one query over 8192 keys, three CTAs per SM (head dim
  // 128's shared memory): 64 (batch, kv head) pairs of one 16-row block; 128 key blocks cut into
  // 6 splits of 22 blocks, 384 CTAs in one wave of 396 (four CTAs per SM as the target once
  // gave 9 splits, 576 CTAs: a wave and a half).
  const SplitKvPlan plan = SplitKv::plan(decode_params(8, 32, 8, 1, 8192, 128), {9, 0, 132}, 3);
  EXPECT_EQ(plan.row_blocks, 1);
  EXPECT_EQ(plan.key_blocks, 128);
  EXPECT_EQ(plan.splits, 6);
  EXPECT_EQ(plan.blocks_per_split, 22);
  // Partial outputs: 6 splits x 256 rows x (128 + 1) floats.
  EXPECT_EQ(plan.workspace_bytes, 6u * 256 * 128 * 4 + 6u * 256 * 4);
  // One batch over 32768 keys: 8 pairs, 512 blocks in 40 splits of 13, 320 CTAs in one wave (the
  // best count, 47 splits of 11, fills 376 of its 396 slots; 40 is the first within 85% of it).
  const SplitKvPlan one = SplitKv::plan(decode_params(1, 32, 8, 1, 32768, 128), {9, 0, 132}, 3);
  EXPECT_EQ(one.splits, 40);
  EXPECT_EQ(one.blocks_per_split, 13);
}

// With a sliding window the splits cover the blocks some query's window reaches, from the first
// query's left edge (first_block) to the last query's right edge, by brute force over the rows;
// none when the window leaves every row without a key.
TEST(SplitKvPlan, WithAWindowSplitsCoverTheBlocksItLeavesVisible) {
  struct Window {
    std::int64_t left, right;  // kUnbounded: no bound
  };
  constexpr std::int64_t kFree = ScoreMods::kUnbounded;
  for (std::int64_t Lq : {1, 7, 16}) {
    for (std::int64_t Lk : {1, 64, 1000, 8192}) {
      for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
        for (const Window w : {Window{0, 0}, Window{255, 0}, Window{1000, kFree}, Window{kFree, 5},
                               Window{63, 64}, Window{20000, 20000}}) {
          for (std::int64_t shift : {std::int64_t{0}, Lk - Lq, std::int64_t{-40}}) {
            if (causal == Causal::bottom_right && shift != Lk - Lq) continue;
            ForwardParams p = decode_params(2, 8, 2, Lq, Lk, 64);
            p.causal = causal;
            p.causal_shift = shift;
            p.mods.flags = ScoreMods::kWindow;
            p.mods.left_reach = w.left;
            p.mods.right_reach = causal == Causal::none ? w.right : 0;
            const SplitKvPlan plan = SplitKv::plan(p, {9, 0, 132}, 3);
            SCOPED_TRACE("Lq " + std::to_string(Lq) + " Lk " + std::to_string(Lk) + " causal " +
                         std::to_string(static_cast<int>(causal)) + " shift " +
                         std::to_string(shift) + " window " + std::to_string(w.left) + "," +
                         std::to_string(w.right));
            std::int64_t first = Lk, end = 0;
            for (std::int64_t i = 0; i < Lq; ++i) {
              for (std::int64_t j = 0; j < Lk; ++j) {
                const bool seen = j >= i + shift - p.mods.left_reach &&
                                  j <= i + shift + p.mods.right_reach &&
                                  (causal == Causal::none || j <= i + shift);
                if (seen) first = std::min(first, j), end = std::max(end, j + 1);
              }
            }
            if (end == 0) {
              EXPECT_EQ(plan.key_blocks, 0);
              EXPECT_EQ(plan.splits, 1);
              continue;
            }
            EXPECT_EQ(plan.first_block, first / 64);
            EXPECT_EQ(plan.key_blocks, (end + 63) / 64 - first / 64);
            EXPECT_LT(static_cast<std::int64_t>(plan.splits - 1) * plan.blocks_per_split,
                      plan.key_blocks);
            EXPECT_GE(static_cast<std::int64_t>(plan.splits) * plan.blocks_per_split,
                      plan.key_blocks);
          }
        }
      }
    }
  }
  // A decode step's window (1023, 0), bottom-right over 8192 keys: its last 1024 keys, blocks
  // 112..127, in 6 splits of 3 blocks at three CTAs per SM, as the 128 blocks of the same call
  // without the window are in 6 splits of 22: the splits follow the blocks the window leaves.
  ForwardParams p = decode_params(8, 32, 8, 1, 8192, 128);
  p.causal = Causal::bottom_right;
  p.causal_shift = 8191;
  p.mods.flags = ScoreMods::kWindow;
  p.mods.left_reach = 1023;
  p.mods.right_reach = 0;
  const SplitKvPlan plan = SplitKv::plan(p, {9, 0, 132}, 3);
  EXPECT_EQ(plan.first_block, 112);
  EXPECT_EQ(plan.key_blocks, 16);
  EXPECT_EQ(plan.splits, 6);
  EXPECT_EQ(plan.blocks_per_split, 3);
  // The key span a row block's queries see (the modifiers' kernel cuts its split to it).
  const detail::KeySpan keys = sm80::splitkv_key_span(p, 0, 0);
  EXPECT_EQ(keys.begin, 8192 - 1024);
  EXPECT_EQ(keys.end, 8192);
}

TEST(SplitKvReasons, NameWhatItDoesNotRun) {
  const DeviceCaps hopper{9, 0, 132};
  EXPECT_TRUE(SplitKv::forward_reasons(decode_params(2, 8, 2, 1, 4096, 128), hopper).empty());
  EXPECT_TRUE(SplitKv::forward_reasons(decode_params(2, 8, 2, 1, 4096, 64), hopper).empty());
  EXPECT_TRUE(contains(SplitKv::forward_reasons(decode_params(2, 8, 2, 1, 4096, 256), hopper),
                       "head dim D = 256"));
  EXPECT_TRUE(contains(SplitKv::forward_reasons(decode_params(2, 8, 2, 1, 4096, 128), {7, 5, 40}),
                       "compute capability 8.0"));
  ForwardParams packed = decode_params(2, 8, 2, 1, 4096, 128);
  static const int offsets[3] = {0, 1, 2};
  packed.cu_seqlens_q = packed.cu_seqlens_k = offsets;
  packed.total_q = 2, packed.total_k = 8192;
  EXPECT_TRUE(contains(SplitKv::forward_reasons(packed, hopper), "packed"));
  ForwardParams gqa = decode_params(2, 8, 3, 1, 4096, 128);
  gqa.group = 2;
  EXPECT_TRUE(contains(SplitKv::forward_reasons(gqa, hopper), "multiple of Hkv"));
  // Windows, ALiBi and softcaps run; a softcap whose factors fp32 cannot hold as normal numbers
  // is named, as by the fused kernels.
  ForwardParams mods = decode_params(2, 8, 2, 1, 4096, 128);
  mods.mods.flags = ScoreMods::kWindow | ScoreMods::kAlibi | ScoreMods::kSoftcap;
  mods.mods.left_reach = 255;
  mods.mods.right_reach = 0;
  mods.mods.softcap_in = 0.0025f, mods.mods.softcap_out = 400.0f, mods.mods.softcap_exp2 = 0.0072f;
  EXPECT_TRUE(SplitKv::forward_reasons(mods, hopper).empty());
  mods.mods.softcap_in = 1e-45f;
  EXPECT_TRUE(contains(SplitKv::forward_reasons(mods, hopper), "outside fp32's normal range"));
}

}  // namespace
}  // namespace memeff::cuda
