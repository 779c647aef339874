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
    for (std::int64_t Lq : {1, 7, 16, 100}) {
      for (std::int64_t Lk : {0, 1, 63, 64, 65, 1000, 8192, 100000}) {
        for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
          ForwardParams p = decode_params(2, 8, 2, Lq, Lk, 128);
          p.causal = causal;
          p.causal_shift = causal == Causal::bottom_right ? Lk - Lq : 0;
          const SplitKvPlan plan = SplitKv::plan(p, {9, 0, sms});
          SCOPED_TRACE("SMs " + std::to_string(sms) + " Lq " + std::to_string(Lq) + " Lk " +
                       std::to_string(Lk) + " causal " + std::to_string(static_cast<int>(causal)));
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
            // About four CTAs per SM (at least half of them after rounding to equal splits),
            // unless the keys run out of blocks or the splits reach their cap first.
            const std::int64_t base = static_cast<std::int64_t>(plan.row_blocks) * p.B * p.Hkv;
            const std::int64_t reachable = base * std::min(plan.key_blocks, 128);
            EXPECT_GE(2 * base * plan.splits, std::min<std::int64_t>(4 * sms, reachable))
                << plan.splits << " splits";
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

TEST(SplitKvPlan, TheDecodeStepOfIssue24FillsAnH100) {
  // B = 8, 32 query heads on 8 kv heads, one query over 8192 keys: 64 (batch, kv head) pairs of
  // one 16-row block; 128 key blocks cut into 9 splits of 15 blocks, 576 CTAs on 132 SMs.
  const SplitKvPlan plan = SplitKv::plan(decode_params(8, 32, 8, 1, 8192, 128), {9, 0, 132});
  EXPECT_EQ(plan.row_blocks, 1);
  EXPECT_EQ(plan.key_blocks, 128);
  EXPECT_EQ(plan.splits, 9);
  EXPECT_EQ(plan.blocks_per_split, 15);
  // Partial outputs: 9 splits x 256 rows x (128 + 1) floats.
  EXPECT_EQ(plan.workspace_bytes, 9u * 256 * 128 * 4 + 9u * 256 * 4);
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
            const SplitKvPlan plan = SplitKv::plan(p, {9, 0, 132});
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
  // 112..127, cut into as many splits as 16 blocks give (the same call without the window has
  // 128 blocks in 9 splits).
  ForwardParams p = decode_params(8, 32, 8, 1, 8192, 128);
  p.causal = Causal::bottom_right;
  p.causal_shift = 8191;
  p.mods.flags = ScoreMods::kWindow;
  p.mods.left_reach = 1023;
  p.mods.right_reach = 0;
  const SplitKvPlan plan = SplitKv::plan(p, {9, 0, 132});
  EXPECT_EQ(plan.first_block, 112);
  EXPECT_EQ(plan.key_blocks, 16);
  EXPECT_EQ(plan.splits, 8);
  EXPECT_EQ(plan.blocks_per_split, 2);
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
