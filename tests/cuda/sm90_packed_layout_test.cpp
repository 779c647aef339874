// The Hopper backward's packed workspace layout on the host (no device needed): the tile
// scheduler (src/cuda/kernels/common/varlen.cuh, its serial form) hands every query or key block of
// every sequence to exactly one CTA within the grid's bound; each sequence's workspace blocks
// (packed_block0, src/cuda/kernels/sm90/bwd_traits.cuh) are its own, inside the per-head region
// that backward_workspace_layout sizes; and with unchecked, wild offsets every block and row the
// kernels would touch stays inside the tensors and the workspace.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm90/bwd_traits.cuh"

namespace memeff::cuda {
namespace {

std::vector<int> offsets_of(const std::vector<int>& lens) {
  std::vector<int> cu(lens.size() + 1, 0);
  for (std::size_t s = 0; s < lens.size(); ++s) cu[s + 1] = cu[s] + lens[s];
  return cu;
}

BackwardParams packed_params(const std::vector<int>& cu, int max_len, int Hq) {
  BackwardParams p;
  p.B = static_cast<int>(cu.size()) - 1;
  p.Hq = Hq;
  p.Hkv = Hq;
  p.Lq = p.Lk = max_len;
  p.D = p.Dv = 64;
  p.cu_seqlens_q = p.cu_seqlens_k = cu.data();
  p.total_q = p.total_k = cu.back() > 0 ? cu.back() : 0;
  return p;
}

// What the kernels touch for one packed call with query blocks of block_m rows: every tile
// below the bound, its sequence's span and workspace block. `exact`: offsets are valid, so each
// (sequence, block) must come exactly once.
void check_layout(const std::vector<int>& cu, std::int64_t total, int max_len, int block_m,
                  bool exact) {
  const int S = static_cast<int>(cu.size()) - 1;
  BackwardParams p = packed_params(cu, max_len, 3);
  p.total_q = p.total_k = total;
  const int bucket = block_m == 128 ? 64 : 128;  // the backward's tiles: (64, 128), (128, 64)
  ASSERT_EQ(sm90::backward_block_m(bucket), block_m);
  const sm90::BackwardWorkspace ws = sm90::backward_workspace_layout(p, bucket);
  ASSERT_EQ(ws.m_blocks, total / block_m + S);
  // The fragment-order dQ chunks (two of 64 x 64 per block) and lse/delta rows of all heads fit.
  EXPECT_GE(ws.dq_accum_floats, static_cast<std::int64_t>(p.Hq) * ws.m_blocks * 2 * 64 * 64);
  EXPECT_GE(ws.lq_pad * p.Hq, static_cast<std::int64_t>(p.Hq) * ws.m_blocks * block_m);

  const std::int64_t tiles = varlen_tile_bound(total, S, max_len, block_m);
  std::set<std::pair<int, int>> seen;
  std::set<std::int64_t> blocks;
  for (std::int64_t t = 0; t < tiles; ++t) {
    const VarlenTile tile = varlen_tile_serial(cu.data(), S, total, max_len, block_m, t);
    if (tile.seq >= S) continue;
    const SeqSpan span = seq_span(p, tile.seq);
    ASSERT_GE(span.q0, 0);
    ASSERT_LE(span.q0 + span.Lq, total) << "sequence " << tile.seq;
    ASSERT_LT(static_cast<std::int64_t>(tile.block) * block_m, span.Lq) << "tile " << t;
    const std::int64_t block = sm90::packed_block0(span.q0, tile.seq, block_m) + tile.block;
    ASSERT_GE(block, 0);
    ASSERT_LT(block, ws.m_blocks) << "sequence " << tile.seq << " block " << tile.block;
    if (exact) {
      EXPECT_TRUE(seen.insert({tile.seq, tile.block}).second) << "tile " << t << " repeated";
      EXPECT_TRUE(blocks.insert(block).second) << "workspace block " << block << " shared";
    }
  }
  if (exact) {
    std::size_t expected = 0;
    for (int s = 0; s < S; ++s) expected += (cu[s + 1] - cu[s] + block_m - 1) / block_m;
    EXPECT_EQ(seen.size(), expected) << "tiles left out";
  }
}

TEST(Sm90PackedLayout, EveryBlockOnceInItsOwnWorkspaceRegion) {
  const std::vector<std::vector<int>> cases = {
      {17, 1, 0, 300, 64, 65, 129},  // the gpu test's mixed lengths
      {192, 192, 192},
      {0, 0, 5},
      {128},
      {1},
      {127, 129, 0, 0, 256, 63},
  };
  for (const auto& lens : cases) {
    const std::vector<int> cu = offsets_of(lens);
    int max_len = 0;
    for (int l : lens) max_len = l > max_len ? l : max_len;
    for (int block_m : {64, 128}) {
      SCOPED_TRACE("block_m " + std::to_string(block_m) + ", " + std::to_string(lens.size()) +
                   " sequences, total " + std::to_string(cu.back()));
      check_layout(cu, cu.back(), max_len, block_m, /*exact=*/true);
    }
  }
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> lens(1 + rng() % 70);
    int max_len = 0;
    for (int& l : lens) {
      l = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % 400);
      max_len = l > max_len ? l : max_len;
    }
    const std::vector<int> cu = offsets_of(lens);
    for (int block_m : {64, 128}) check_layout(cu, cu.back(), max_len, block_m, /*exact=*/true);
  }
}

// Unchecked offsets (PackedSequences::check_offsets = false): anything, clamped by seq_span.
// Sequences may then overlap or be cut, but nothing the kernels address leaves the tensors or the
// workspace.
TEST(Sm90PackedLayout, WildOffsetsStayInside) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int S = 1 + static_cast<int>(rng() % 20);
    const std::int64_t total = rng() % 600;
    const int max_len = static_cast<int>(rng() % 300);
    std::vector<int> cu(S + 1);
    for (int& v : cu) {
      const unsigned pick = rng() % 4;
      v = pick == 0   ? -static_cast<int>(rng() % 1000)
          : pick == 1 ? static_cast<int>(rng() % (1u << 30))
                      : static_cast<int>(rng() % (total + 1));
    }
    for (int block_m : {64, 128}) check_layout(cu, total, max_len, block_m, /*exact=*/false);
  }
}

}  // namespace
}  // namespace memeff::cuda
