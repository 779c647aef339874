// The order in which a grid of one CTA per (head, block) hands its blocks to the GPU: in bands of
// heads, each band block position by block position.
//
// The hardware starts CTAs in the order of their linear index and gives the next one to whichever
// SM frees up first: list scheduling, whose last waves decide the time. Under a causal mask the
// blocks of a head differ in cost (the backward's key block 0 sees every query block, the last one
// a few; the forward's last query block sees every key tile, the first one a few). Walking head by
// head, heaviest block first in each head, keeps the CTAs resident at a time on a few heads, whose
// K and V (forward) or Q and dO (backward) they share in L2, but every head's heavy blocks then
// start after the previous head's light ones, and the grid ends with the last heads' heavy blocks
// started late beside idle SMs. Walking a band of heads position by position (position 0 of each
// head of the band, then position 1, ...) starts the heavy blocks of a band together and lets its
// light ones fill in: with bands of two waves' blocks at least, a model of the scheduler (blocks
// costing their visible tiles) puts the gain at 1-35% on the causal anchor and GQA grids. A
// band's heads share L2 as a head's blocks do, so bands are no wider than a share of it; on an
// H100 the GQA backwards gained 15-32% and the widest band measured (32 heads' K and V, the gpt-2k
// causal forward) lost 2% (docs/benchmarks.md).
//
// A band of 1 is the head-by-head walk.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/hostdevice.h"
#include "cuda/kernels/common/params.h"

namespace memeff::cuda {

template <class I>
struct GridBlock {
  I head = 0;      // 0 .. heads - 1
  I position = 0;  // 0 .. per_head - 1: the block's place in its head (0: the heaviest)
};

// The (head, position) of linear index `index` in [0, heads·per_head) when bands of `band` heads
// (band divides heads) are walked one after the other, each position by position: index =
// (head / band)·band·per_head + position·band + head % band. Every head's positions come in
// increasing index order (a block waiting on the position before it in its head never waits on a
// CTA not yet started: the deterministic backward's turns); band 1 gives head = index / per_head,
// position = index % per_head. I: an integer type that holds heads·per_head. (The backward's
// grids spell the same order in three dimensions, (band, per_head, heads / band), and need no
// division.)
template <class I>
MEMEFF_HD GridBlock<I> banded_block(I index, I per_head, I band) {
  const I band_blocks = band * per_head;
  const I in_band = index % band_blocks;
  return {index / band_blocks * band + in_band % band, in_band / band};
}

// The band for a grid of heads x per_head blocks when `wave` CTAs run at once (SMs times CTAs per
// SM): the narrowest divisor of `heads` whose band holds two waves of blocks, among those whose
// heads' `head_bytes` (what every block of a head reads: K and V, or Q and dO) fit kBandL2Bytes;
// without such a divisor, the widest that fits. 1 (head by head) when nothing is known.
inline constexpr std::int64_t kBandL2Bytes = std::int64_t{32} << 20;  // of 50 MB on H100/H200
inline std::int64_t grid_band_heads(std::int64_t heads, std::int64_t per_head, std::int64_t wave,
                                    std::int64_t head_bytes) {
  if (heads < 1 || per_head < 1 || wave < 1) return 1;
  const std::int64_t cap =
      head_bytes > 0 ? std::max<std::int64_t>(1, kBandL2Bytes / head_bytes) : heads;
  std::int64_t widest = 1;  // (bands beyond 1024 heads are never narrower than two waves)
  for (std::int64_t d = 1; d <= std::min({heads, cap, std::int64_t{1024}}); ++d) {
    if (heads % d != 0) continue;
    if (d * per_head >= 2 * wave) return d;
    widest = d;
  }
  return widest;
}

// The band of a dense backward grid (B·Hkv heads of key_blocks blocks, `wave` CTAs at once,
// elements of elem_bytes): 1 (head by head) where the key blocks cost alike; else
// grid_band_heads over what each block of a head reads, the Q and dO of its kv head's group.
inline int backward_band_heads(const BackwardParams& p, std::int64_t key_blocks, std::int64_t wave,
                               int elem_bytes) {
  if (!block_costs_vary(p)) return 1;
  return static_cast<int>(grid_band_heads(static_cast<std::int64_t>(p.B) * p.Hkv, key_blocks, wave,
                                          p.group * p.Lq * (p.D + p.Dv) * elem_bytes));
}

// The steps of a backward CTA (one key block): `group` query heads times the query blocks
// [m_begin, m_begin + m_count) that see its keys. By default head by head, each from the first
// query block. The deterministic mode adds each query block's dQ in turns, key block by key block
// in ascending order (the order their CTAs start), and under a right bound (a causal mask, a
// window's right side) key block n's walk starts at the query block its first key meets, which
// blocks 0..n-1 reach only after their earlier ones: walked from the first, block n waited there
// for all of them, and the group's later heads stacked the waits. Walked from the last query
// block, the group's heads inside each (from_last), every key block that reaches a query block of
// a head reaches it after the same number of steps (they all end at the last block), so the turns
// cost each block its predecessors' adds, not their steps.
struct BackwardWalk {
  int m_begin = 0, m_count = 0, group = 1;
  bool from_last = false;
  MEMEFF_HD int head(int item) const { return from_last ? item % group : item / m_count; }
  MEMEFF_HD int block(int item) const {
    return from_last ? m_begin + m_count - 1 - item / group : m_begin + item % m_count;
  }
};

// Whether the deterministic backward walks from the last query block (BackwardWalk::from_last).
inline bool deterministic_walk_from_last(const BackwardParams& p) {
  return p.deterministic && (is_causal(p) || p.mods.right_reach < ScoreMods::kUnbounded);
}

}  // namespace memeff::cuda
