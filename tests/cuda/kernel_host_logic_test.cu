// Host-side logic of the CUDA kernel families that needs no device, so CI runs it: the mask
// policy's trip counts against a brute-force walk of the mask, the head-dim buckets, the dbias
// plan, the reasons every fused family shares (the softcap's range among them) and which calls
// the forwards ask a workspace for.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels/common/block_order.h"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"
#include "cuda/kernels/sm80/family.h"
#include "cuda/kernels/sm90/family.h"
#include "cuda/kernels/sm90/fwd_traits.cuh"

namespace memeff::cuda {
namespace {

// Whether query row i sees key j (the rule KeyMask states).
bool sees(std::int64_t i, std::int64_t j, std::int64_t Lk, bool causal, std::int64_t shift) {
  return j < Lk && (!causal || j <= i + shift);
}

TEST(KeyMask, TripCountsCoverExactlyTheVisibleTiles) {
  constexpr int kBlockM = 16, kBlockN = 8;
  for (bool causal : {false, true}) {
    for (std::int64_t Lk : {0, 1, 7, 8, 9, 40}) {
      for (std::int64_t shift : {-50, -9, -1, 0, 3, 8, 33}) {
        const KeyMask mask{causal, Lk, shift};
        for (std::int64_t m0 : {0, 16, 48}) {
          // The last key tile with a key some row of [m0, m0 + kBlockM) sees, plus one.
          int want = 0;
          for (std::int64_t j = 0; j < Lk; ++j) {
            for (std::int64_t i = m0; i < m0 + kBlockM; ++i) {
              if (sees(i, j, Lk, causal, shift)) want = static_cast<int>(j / kBlockN) + 1;
            }
          }
          EXPECT_EQ((mask.key_tiles<kBlockM, kBlockN>(m0)), want)
              << "causal " << causal << " Lk " << Lk << " shift " << shift << " m0 " << m0;
        }
        const int m_blocks = 5;
        for (std::int64_t n0 : {0, 8, 24, 64}) {
          // The first query block with a row that sees key n0.
          int want = m_blocks;
          for (int m = m_blocks - 1; m >= 0; --m) {
            for (std::int64_t i = m * kBlockM; i < (m + 1) * kBlockM; ++i) {
              if (!causal || n0 <= i + shift) want = m;
            }
          }
          EXPECT_EQ(mask.first_query_block<kBlockM>(n0, m_blocks), want)
              << "causal " << causal << " shift " << shift << " n0 " << n0;
        }
      }
    }
  }
}

// The rule with a window (docs/window.md): reaches left and right around the diagonal i + shift,
// ScoreMods::kUnbounded for a side without a bound; causal caps the right one at 0.
bool sees(std::int64_t i, std::int64_t j, std::int64_t Lk, bool causal, std::int64_t shift,
          std::int64_t left, std::int64_t right) {
  const std::int64_t d = i + shift;
  return j >= 0 && j < Lk && j >= d - left && j <= d + (causal ? 0 : right);
}

// Every combination of the window's trip counts, tile tests, masks and single-key rows against a
// brute-force walk of the rule, on small tiles, for bounded and unbounded sides and shifts that
// put the diagonal before, inside and after the keys.
TEST(KeyMaskWindow, TripCountsTilesAndRowsFollowTheRule) {
  constexpr int kBlockM = 16, kBlockN = 8;
  constexpr std::int64_t kNone = ScoreMods::kUnbounded;
  const int m_blocks = 6;
  for (bool causal : {false, true}) {
    for (std::int64_t Lk : {0, 1, 7, 8, 9, 40}) {
      for (std::int64_t shift : {-50, -9, -1, 0, 3, 8, 33}) {
        for (std::int64_t left :
             {std::int64_t{0}, std::int64_t{1}, std::int64_t{5}, std::int64_t{17}, kNone}) {
          for (std::int64_t right : {std::int64_t{0}, std::int64_t{2}, std::int64_t{9}, kNone}) {
            const KeyMask mask{causal, Lk, shift, left, right};
            auto rule = [&](std::int64_t i, std::int64_t j) {
              return sees(i, j, Lk, causal, shift, left, right);
            };
            const std::string what = "causal " + std::to_string(causal) + " Lk " +
                                     std::to_string(Lk) + " shift " + std::to_string(shift) +
                                     " left " + std::to_string(left) + " right " +
                                     std::to_string(right);
            // Does query block m see a key of key tile n?
            auto block_sees_tile = [&](int m, int n) {
              for (std::int64_t i = m * kBlockM; i < (m + 1) * kBlockM; ++i)
                for (std::int64_t j = n * kBlockN; j < (n + 1) * kBlockN; ++j)
                  if (rule(i, j)) return true;
              return false;
            };
            const int key_blocks = static_cast<int>((Lk + kBlockN - 1) / kBlockN);
            for (int m = 0; m < m_blocks; ++m) {
              const std::int64_t m0 = m * kBlockM;
              const BlockRange tiles = mask.key_tile_range<kBlockM, kBlockN>(m0);
              for (int n = 0; n < key_blocks + 2; ++n) {
                const bool in = n >= tiles.begin && n < tiles.end;
                EXPECT_EQ(in, block_sees_tile(m, n)) << what << " m " << m << " tile " << n;
                // A tile needs the element mask unless every (row, key) of it is visible.
                bool all = true;
                for (std::int64_t i = m0; i < m0 + kBlockM; ++i)
                  for (std::int64_t j = n * kBlockN; j < (n + 1) * kBlockN; ++j) all &= rule(i, j);
                EXPECT_EQ((mask.tile_needs_mask<kBlockM, kBlockN>(m0, n * kBlockN)), !all)
                    << what << " m " << m << " tile " << n;
              }
            }
            // The backward's range of query blocks per key block: the same pairs, so the key
            // blocks adding into query block m's dQ are the run [first tile, end) of m's range
            // (the deterministic turns count from its first).
            for (int n = 0; n < key_blocks; ++n) {
              const BlockRange blocks = mask.query_blocks<kBlockM, kBlockN>(n * kBlockN, m_blocks);
              for (int m = 0; m < m_blocks; ++m) {
                const bool in = m >= blocks.begin && m < blocks.end;
                EXPECT_EQ(in, block_sees_tile(m, n)) << what << " key block " << n << " m " << m;
              }
            }
            for (std::int64_t i = -3; i < 40; ++i) {
              const detail::KeySpan keys = mask.keys_of_row(i);
              std::int64_t count = 0;
              for (std::int64_t j = 0; j < Lk; ++j) {
                count += rule(i, j);
                if (rule(i, j)) EXPECT_TRUE(j >= keys.begin && j < keys.end) << what;
              }
              EXPECT_EQ(keys.size(), count) << what << " row " << i;
            }
            for (std::int64_t j = 0; j < Lk; ++j) {
              const detail::KeySpan rows = mask.rows_of_key(j);
              for (std::int64_t i = -60; i < 60; ++i) {
                EXPECT_EQ(i >= rows.begin && i < rows.end, rule(i, j))
                    << what << " key " << j << " row " << i;
              }
            }
            // Single-key columns of a 16-tile fragment (columns 8n + e) from a few first rows.
            for (std::int64_t i0 : {-140, -70, -9, 0, 6, 31}) {
              const std::uint32_t bits = mask.single_key_rows<16>(i0);
              for (int c2 = 0; c2 < 32; ++c2) {
                const std::int64_t i = i0 + 8 * (c2 / 2) + (c2 & 1);
                EXPECT_EQ((bits >> c2) & 1u, mask.keys_of_row(i).size() == 1 ? 1u : 0u)
                    << what << " row " << i;
              }
            }
          }
        }
      }
    }
  }
}

// The deterministic backward's walk under a right bound (BackwardWalk from the last query block):
// at every (head, query block), the key blocks that reach it (their query_blocks ranges) reach it
// after a number of steps that does not fall with the key block, so the turns, taken in ascending
// key blocks, follow the order in which equally fast CTAs arrive: none waits for a block that
// arrives after it, only for the adds of those before it.
TEST(BackwardWalk, FromTheLastKeyBlocksReachAQueryBlockInTurnOrder) {
  constexpr int kBlockM = 16, kBlockN = 8;
  constexpr std::int64_t kNone = ScoreMods::kUnbounded;
  const int m_blocks = 6, group = 3;
  for (bool causal : {false, true}) {
    for (std::int64_t Lk : {1, 9, 40, 100}) {
      for (std::int64_t shift : {-9, 0, 3, 33}) {
        for (std::int64_t left : {std::int64_t{5}, std::int64_t{17}, kNone}) {
          for (std::int64_t right : {std::int64_t{0}, std::int64_t{9}, kNone}) {
            if (!causal && right == kNone) continue;  // no right bound: walked from the first
            const KeyMask mask{causal, Lk, shift, left, right};
            const int key_blocks = static_cast<int>((Lk + kBlockN - 1) / kBlockN);
            // arrival[hg][m]: the step at which the last key block seen so far reached (hg, m).
            std::vector<int> arrival(group * m_blocks, -1);
            for (int n = 0; n < key_blocks; ++n) {
              const BlockRange r =
                  mask.query_blocks<kBlockM, kBlockN>(std::int64_t{n} * kBlockN, m_blocks);
              const BackwardWalk walk{r.begin, r.count(), group, true};
              for (int item = 0; item < r.count() * group; ++item) {
                int& last = arrival[walk.head(item) * m_blocks + walk.block(item)];
                EXPECT_GE(item, last) << "causal " << causal << " Lk " << Lk << " shift " << shift
                                      << " left " << left << " right " << right << " key block "
                                      << n << " head " << walk.head(item) << " block "
                                      << walk.block(item);
                last = item;
              }
            }
          }
        }
      }
    }
  }
}

TEST(HeadDims, TheSmallestBucketThatHoldsTheHeadDim) {
  using Dims = HeadDims<64, 96, 128, 256>;
  EXPECT_EQ(Dims::largest, 256);
  EXPECT_EQ(Dims::bucket_of(8), 64);
  EXPECT_EQ(Dims::bucket_of(64), 64);
  EXPECT_EQ(Dims::bucket_of(72), 96);
  EXPECT_EQ(Dims::bucket_of(136), 256);
  EXPECT_EQ(Dims::bucket_of(264), 0);
}

BackwardParams params_with_dbias(int dB, int dH, int dL, bool given) {
  BackwardParams p;
  p.B = 2;
  p.Hq = p.Hkv = 4;
  p.Lq = 16;
  p.Lk = 24;
  p.dbias_shape[0] = dB;
  p.dbias_shape[1] = dH;
  p.dbias_shape[2] = dL;
  static float storage;
  p.dbias = given ? &storage : nullptr;
  return p;
}

TEST(DbiasPlan, FullExtentIsDirectAndABroadcastIsReducedThroughAnAccumulator) {
  const DbiasPlan full = dbias_plan(params_with_dbias(2, 4, 16, true));
  EXPECT_EQ(full.mode, DbiasMode::direct);
  EXPECT_EQ(full.accum_elems, 0);
  EXPECT_EQ(full.reserved_elems, 0);

  const DbiasPlan rows = dbias_plan(params_with_dbias(2, 1, 1, true));  // over heads and queries
  EXPECT_EQ(rows.mode, DbiasMode::reduced);
  EXPECT_EQ(rows.accum_elems, 2 * 1 * 1 * 24);
  EXPECT_EQ(rows.reserved_elems, rows.accum_elems);

  // Sized before dbias exists (workspace_size with the problem alone): reserved, not used.
  const DbiasPlan sizing = dbias_plan(params_with_dbias(1, 4, 16, false));
  EXPECT_EQ(sizing.mode, DbiasMode::none);
  EXPECT_EQ(sizing.accum_elems, 0);
  EXPECT_EQ(sizing.reserved_elems, 4 * 16 * 24);

  EXPECT_EQ(dbias_plan(params_with_dbias(0, 0, 0, false)).mode, DbiasMode::none);
}

std::string joined(const std::vector<std::string>& reasons) {
  std::string all;
  for (const std::string& r : reasons) all += r + "\n";
  return all;
}

TEST(CommonReasons, NameEachCheckThatFails) {
  BackwardParams p;
  p.B = 1;
  p.Hq = 6;
  p.Hkv = 4;  // not a divisor
  p.group = 1;
  p.D = 36;    // not a multiple of 8
  p.Dv = 136;  // past the largest bucket
  alignas(16) static char buffer[64];
  p.q = buffer + 4;  // misaligned
  p.dq = buffer + 8;
  p.k_stride.l = 12;  // not a multiple of 8 elements
  p.dk_stride.h = 3;  // odd
  std::vector<std::string> reasons;
  add_common_reasons(reasons, p, 128, " (TMA)", 2);
  const std::string all = joined(reasons);
  EXPECT_NE(all.find("head dim D = 36 is not a multiple of 8 up to 128"), std::string::npos) << all;
  EXPECT_NE(all.find("value head dim Dv = 136"), std::string::npos) << all;
  EXPECT_NE(all.find("q, k, v and out must start on 16-byte boundaries (TMA)"), std::string::npos)
      << all;
  EXPECT_NE(all.find("dout, dq, dk and dv must start on 16-byte boundaries"), std::string::npos)
      << all;
  EXPECT_NE(all.find("k strides (0, 0, 12)"), std::string::npos) << all;
  EXPECT_NE(all.find("dk strides (0, 3, 0) are not all even"), std::string::npos) << all;
  EXPECT_NE(all.find("GQA group"), std::string::npos) << all;
  EXPECT_EQ(reasons.size(), 7u) << all;

  BackwardParams ok;
  ok.B = ok.Hq = ok.Hkv = ok.group = 1;
  ok.D = ok.Dv = 128;
  reasons.clear();
  add_common_reasons(reasons, ok, 128, "", 8);
  EXPECT_TRUE(reasons.empty()) << joined(reasons);
}

// The softcap's factors scale / softcap and softcap / scale (ScoreMods) must be normal fp32
// numbers: a cap that puts one outside the range is refused with a reason that names it, by the
// shared check and by the sm80 family's forward and backward, which take every other modifier.
TEST(CommonReasons, ASoftcapOutsideFp32sNormalRangeIsNamed) {
  BackwardParams p;
  p.B = p.Hq = p.Hkv = p.group = 1;
  p.Lq = p.Lk = 128;
  p.D = p.Dv = 64;
  p.mods.flags = ScoreMods::kSoftcap | ScoreMods::kAlibi | ScoreMods::kWindow;
  p.mods.left_reach = 16;
  p.mods.softcap_in = 0.125f;  // scale / softcap
  p.mods.softcap_out = 8.0f;
  p.mods.softcap_exp2 = 0.125f * 2.0f * 1.4426950408889634f;
  std::vector<std::string> reasons;
  add_score_modifier_reasons(reasons, p);
  EXPECT_TRUE(reasons.empty()) << joined(reasons);
  const DeviceCaps ampere{8, 0, 108};
  EXPECT_TRUE(sm80::Family::kScoreModifiers);
  EXPECT_TRUE(sm80::Family::forward_reasons(p, ampere).empty())
      << joined(sm80::Family::forward_reasons(p, ampere));
  EXPECT_TRUE(sm80::Family::backward_reasons(p, ampere).empty())
      << joined(sm80::Family::backward_reasons(p, ampere));

  p.mods.softcap_in = 1e38f;  // a cap of scale·1e-38: its inverse is below fp32's normal range
  p.mods.softcap_out = 1e-38f;
  p.mods.softcap_exp2 = 1e38f * 2.0f * 1.4426950408889634f;
  add_score_modifier_reasons(reasons, p);
  ASSERT_EQ(reasons.size(), 1u) << joined(reasons);
  EXPECT_NE(reasons[0].find("softcap / scale"), std::string::npos) << reasons[0];
  EXPECT_NE(reasons[0].find("outside fp32's normal range"), std::string::npos) << reasons[0];
  EXPECT_EQ(joined(sm80::Family::forward_reasons(p, ampere)), reasons[0] + "\n");
  EXPECT_EQ(joined(sm80::Family::backward_reasons(p, ampere)), reasons[0] + "\n");
}

// Head dim 64's plain forward without dropout takes three consumer warpgroups (192-row items)
// where those items cover Lq with at most 1/8 more rows than 128-row ones, and under a causal
// mask only from 2048 queries on; its Q box follows.
TEST(ForwardTile, HeadDim64TakesThreeConsumersWhereTheirItemsFillTheRows) {
  ForwardParams p;
  p.B = 32;
  p.Hq = p.Hkv = 16;
  p.Lq = p.Lk = 384;
  p.D = p.Dv = 64;
  EXPECT_TRUE(sm90::forward_takes_wide_tile(p, 64)) << "two items of 192 rows exactly";
  EXPECT_EQ(sm90::forward_tile(64, true).block_m, 192);
  EXPECT_EQ(sm90::forward_tile(64).block_m, 128);
  EXPECT_EQ(sm90::forward_tile(128, true).block_m, 128) << "no wide tile at head dim 128";
  EXPECT_FALSE(sm90::forward_takes_wide_tile(p, 128));
  for (auto [Lq, wide] : {std::pair<std::int64_t, bool>{197, false}, {129, true}, {512, true},
                          {640, false}, {1000, true}, {1013, true}, {65, false}}) {
    p.Lq = Lq;
    EXPECT_EQ(sm90::forward_takes_wide_tile(p, 64), wide) << "Lq = " << Lq;
  }
  p.Lq = 384;
  p.has_dropout = true;
  EXPECT_FALSE(sm90::forward_takes_wide_tile(p, 64)) << "dropout keeps two consumers";
  p.has_dropout = false;
  const float bias = 0.0f;
  p.bias = &bias;
  EXPECT_FALSE(sm90::forward_takes_wide_tile(p, 64)) << "so does a bias";
  p.bias = nullptr;
  p.mods.flags = ScoreMods::kWindow;
  EXPECT_FALSE(sm90::forward_takes_wide_tile(p, 64)) << "and the modifiers' kernels";
  p.mods.flags = 0;
  p.causal = Causal::top_left;
  p.Lq = p.Lk = 1024;
  EXPECT_FALSE(sm90::forward_takes_wide_tile(p, 64)) << "causal below 2048 queries";
  p.Lq = p.Lk = 4096;
  EXPECT_TRUE(sm90::forward_takes_wide_tile(p, 64));
  const int cu_seqlens[2] = {0, 4096};
  p.cu_seqlens_q = cu_seqlens;
  EXPECT_FALSE(sm90::forward_takes_wide_tile(p, 64)) << "packed calls keep two consumers";
}

// The sm90 forward asks for a workspace (its dynamic walk's counter and slots) exactly where its
// items differ in cost: a causal mask or a window bounded on one side, dense calls only; the
// sm80 forward never does.
TEST(ForwardWorkspace, Sm90HoldsTheDynamicWalkWhereItemCostsDiffer) {
  ForwardParams p;
  p.B = 2;
  p.Hq = p.Hkv = 8;
  p.Lq = p.Lk = 1024;
  p.D = p.Dv = 64;
  EXPECT_EQ(sm90::Family::forward_workspace_bytes(p), 0u) << "every item costs the same";
  p.causal = Causal::top_left;
  const std::size_t walk = sm90::Family::forward_workspace_bytes(p);
  EXPECT_GE(walk, 16u) << "the counter";
  EXPECT_EQ(walk % 16, 0u) << "what follows a workspace piece stays 16-byte aligned";
  p.causal = Causal::bottom_right;
  EXPECT_EQ(sm90::Family::forward_workspace_bytes(p), walk);
  EXPECT_EQ(sm80::Family::forward_workspace_bytes(p), 0u);
  p.mods.flags = ScoreMods::kWindow;
  p.mods.left_reach = 256;  // bounded on both sides: every item sees as many keys
  EXPECT_EQ(sm90::Family::forward_workspace_bytes(p), 0u);
  p.causal = Causal::none;
  p.mods.right_reach = 0;  // a window bounded on both sides without the causal mask
  EXPECT_EQ(sm90::Family::forward_workspace_bytes(p), 0u);
  p.mods.left_reach = ScoreMods::kUnbounded;  // only on the right
  EXPECT_EQ(sm90::Family::forward_workspace_bytes(p), walk);
  p.total_q = p.total_k = 2048;  // packed: one CTA per item, no walk
  EXPECT_EQ(sm90::Family::forward_workspace_bytes(p), 0u);
}

}  // namespace
}  // namespace memeff::cuda
