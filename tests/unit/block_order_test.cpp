// The grids' order (cuda/kernels/common/block_order.h): every (head, position) exactly once, head
// by head for a band of one head, each head's positions in increasing order, a band position by
// position, the backward's three-dimensional grid in the same order; and the band rule (two
// waves, a divisor of the heads, bounded by the L2 share).
#include "cuda/kernels/common/block_order.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace memeff::cuda {
namespace {

TEST(GridOrder, EveryBlockOnceAndEachHeadInAscendingOrder) {
  for (std::int64_t heads : {1, 2, 6, 12, 16}) {
    for (std::int64_t per_head : {1, 2, 5, 16}) {
      for (std::int64_t band = 1; band <= heads; ++band) {
        if (heads % band != 0) continue;
        SCOPED_TRACE(testing::Message() << heads << " heads x " << per_head << ", band " << band);
        std::vector<int> seen(static_cast<std::size_t>(heads * per_head), 0);
        std::vector<std::int64_t> last(static_cast<std::size_t>(heads), -1);
        for (std::int64_t index = 0; index < heads * per_head; ++index) {
          const GridBlock<std::int64_t> b = banded_block(index, per_head, band);
          ASSERT_GE(b.head, 0);
          ASSERT_LT(b.head, heads);
          ASSERT_GE(b.position, 0);
          ASSERT_LT(b.position, per_head);
          ++seen[static_cast<std::size_t>(b.head * per_head + b.position)];
          // A head's blocks start in ascending position: the deterministic backward's turns
          // (key block n waits for n - 1 of its head) never wait on a CTA not started yet.
          EXPECT_EQ(b.position, last[static_cast<std::size_t>(b.head)] + 1);
          last[static_cast<std::size_t>(b.head)] = b.position;
          if (band == 1) {
            EXPECT_EQ(b.head, index / per_head);
            EXPECT_EQ(b.position, index % per_head);
          }
          // The backward's grid (band, per_head, heads / band) starts CTA (x, y, z) at linear
          // index x + band·(y + per_head·z) and gives it key block y of head z·band + x.
          const std::int64_t x = index % band, y = index / band % per_head,
                             z = index / (band * per_head);
          EXPECT_EQ(z * band + x, b.head);
          EXPECT_EQ(y, b.position);
        }
        for (int n : seen) EXPECT_EQ(n, 1);
      }
    }
  }
}

TEST(GridOrder, ABandGoesPositionByPosition) {
  // 4 heads of 3 blocks in bands of 2: heads {0, 1} interleaved, then heads {2, 3}.
  const int want[12][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2},
                           {2, 0}, {3, 0}, {2, 1}, {3, 1}, {2, 2}, {3, 2}};
  for (int index = 0; index < 12; ++index) {
    const GridBlock<int> b = banded_block<int>(index, 3, 2);
    EXPECT_EQ(b.head, want[index][0]) << index;
    EXPECT_EQ(b.position, want[index][1]) << index;
  }
}

TEST(GridOrder, BandIsTheNarrowestDivisorHoldingTwoWavesWithinTheL2Share) {
  constexpr std::int64_t kMiB = std::int64_t{1} << 20;
  auto band = [](std::int64_t heads, std::int64_t per_head, std::int64_t head_bytes) {
    return grid_band_heads(heads, per_head, 132, head_bytes);
  };
  EXPECT_EQ(band(32, 8, 1 * kMiB), 32);    // 264 / 8 = 33 > 32: the widest
  EXPECT_EQ(band(128, 16, 1 * kMiB), 32);  // 17 rounds up to the divisor 32
  EXPECT_EQ(band(16, 32, 8 * kMiB), 4);    // 9 for the waves; 32 MiB / 8 MiB
  EXPECT_EQ(band(64, 16, 2 * kMiB), 16);   // 17 -> 32 wanted, 16 fit
  EXPECT_EQ(band(8, 1000, 1 * kMiB), 1);   // one head's blocks fill the waves
  EXPECT_EQ(band(8, 16, 100 * kMiB), 1);   // one head's data is past the share
  EXPECT_EQ(band(13, 4, 1 * kMiB), 13);    // a prime count: all or one
  EXPECT_EQ(band(13, 4, 4 * kMiB), 1);
  EXPECT_EQ(band(128, 16, 0), 32);  // nothing read per head: the waves alone
  EXPECT_EQ(band(0, 8, kMiB), 1);
  EXPECT_EQ(band(4, 0, kMiB), 1);
  EXPECT_EQ(grid_band_heads(4, 8, 0, kMiB), 1);  // no wave
}

// A backward grid's band: head by head where the key blocks cost alike (no causal mask), else
// over the Q and dO of a kv head's group (here 4 query heads of 1024 rows of 64 + 64 halves).
TEST(GridOrder, BackwardBandFollowsTheCausalMaskAndTheGroupsData) {
  BackwardParams p;
  p.B = 8;
  p.Hq = 16;
  p.Hkv = 4;
  p.group = 4;
  p.Lq = p.Lk = 1024;
  p.D = p.Dv = 64;
  EXPECT_EQ(backward_band_heads(p, 8, 132, 2), 1);
  p.causal = Causal::top_left;
  EXPECT_EQ(backward_band_heads(p, 8, 132, 2), grid_band_heads(32, 8, 132, 4 * 1024 * 128 * 2));
  EXPECT_EQ(backward_band_heads(p, 8, 132, 2), 32);
}

// A backward CTA's walk: every (head of the group, query block) once, head by head from the first
// query block, or from the last query block with the group's heads inside each; the deterministic
// mode walks from the last under a right bound (a causal mask or a window's right side).
TEST(BackwardWalk, EveryStepOnceInEitherOrder) {
  for (int m_begin : {0, 3}) {
    for (int m_count : {1, 2, 7}) {
      for (int group : {1, 4}) {
        for (bool from_last : {false, true}) {
          SCOPED_TRACE(testing::Message() << m_begin << " + " << m_count << " blocks, group "
                                          << group << (from_last ? ", from the last" : ""));
          const BackwardWalk walk{m_begin, m_count, group, from_last};
          std::vector<int> seen(static_cast<std::size_t>(m_count * group), 0);
          for (int item = 0; item < m_count * group; ++item) {
            const int hg = walk.head(item), m = walk.block(item);
            ASSERT_GE(hg, 0);
            ASSERT_LT(hg, group);
            ASSERT_GE(m, m_begin);
            ASSERT_LT(m, m_begin + m_count);
            ++seen[static_cast<std::size_t>(hg * m_count + m - m_begin)];
            if (item == 0) continue;
            const int prev_hg = walk.head(item - 1), prev_m = walk.block(item - 1);
            if (from_last) {  // blocks downwards, the heads of one block in a row
              EXPECT_TRUE(m == prev_m ? hg == prev_hg + 1 : m == prev_m - 1 && hg == 0);
            } else {  // heads in a row, each its blocks upwards
              EXPECT_TRUE(hg == prev_hg ? m == prev_m + 1 : hg == prev_hg + 1 && m == m_begin);
            }
          }
          for (int n : seen) EXPECT_EQ(n, 1);
        }
      }
    }
  }
  BackwardParams p;
  p.causal = Causal::top_left;
  EXPECT_FALSE(deterministic_walk_from_last(p));  // not deterministic: no turns
  p.deterministic = true;
  EXPECT_TRUE(deterministic_walk_from_last(p));
  p.causal = Causal::bottom_right;
  EXPECT_TRUE(deterministic_walk_from_last(p));
  p.causal = Causal::none;
  EXPECT_FALSE(deterministic_walk_from_last(p));
  p.mods.left_reach = 256;  // a left bound alone: every key block's walk starts at query block 0
  EXPECT_FALSE(deterministic_walk_from_last(p));
  p.mods.right_reach = 0;
  EXPECT_TRUE(deterministic_walk_from_last(p));
}

}  // namespace
}  // namespace memeff::cuda
