// Packed sequences as the kernels see them (params.h: cu_seqlens_q/k), shared by both kernel
// families: where sequence b's rows start and how long it is, and the tile scheduler that maps
// a flat CTA index to (sequence, row block) so long sequences get many CTAs and a sequence of
// length 1 gets exactly one, never a grid row of idle ones.
//
// Offsets come from the caller's memory and may be unchecked (PackedSequences::check_offsets):
// every value is clamped into [0, total] and every length into [0, max_seqlen], so a kernel never
// addresses a row outside the packed tensors or a block past the grid it was sized for.
#pragma once

#include <cstdint>

#include "core/hostdevice.h"
#include "cuda/kernels/common/params.h"

namespace memeff::cuda {

// Whether params describe packed sequences (grids and workspaces differ). With views, the
// offsets' pointers say it; params filled from a Problem alone (dispatch, workspace sizes) have
// none, but a packed problem brings its row counts (dense ones leave them at 0), and a packed
// call without rows has no work that either reading could size differently.
MEMEFF_HD bool packed_layout(const ForwardParams& p) {
  return p.cu_seqlens_q != nullptr || p.total_q > 0 || p.total_k > 0;
}

// One sequence (dense calls: one batch entry) in the kernels' terms.
struct SeqSpan {
  std::int64_t q0 = 0, k0 = 0;    // packed row of its first query and first key (0 when dense)
  std::int64_t Lq = 0, Lk = 0;    // its lengths
  std::int64_t causal_shift = 0;  // query i's diagonal key is i + causal_shift (params.h)
};

MEMEFF_HD std::int64_t clamp_row(std::int64_t v, std::int64_t lo, std::int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Start and length of entry b of an offsets array, clamped as the header says.
MEMEFF_HD void packed_range(const int* cu, int b, std::int64_t total, std::int64_t max_len,
                            std::int64_t& start, std::int64_t& len) {
  start = clamp_row(cu[b], 0, total);
  const std::int64_t end = clamp_row(cu[b + 1], start, total);
  len = clamp_row(end - start, 0, max_len);
}

MEMEFF_HD SeqSpan seq_span(const ForwardParams& p, int b) {
  SeqSpan s;
  if (p.cu_seqlens_q == nullptr) {
    s.Lq = p.Lq;
    s.Lk = p.Lk;
    s.causal_shift = p.causal_shift;
    return s;
  }
  packed_range(p.cu_seqlens_q, b, p.total_q, p.Lq, s.q0, s.Lq);
  packed_range(p.cu_seqlens_k, b, p.total_k, p.Lk, s.k0, s.Lk);
  // Bottom-right alignment (causal bottom_right, and none for the window and ALiBi) per sequence;
  // top-left: 0 (packed calls have no global coordinates).
  s.causal_shift = p.causal == Causal::top_left ? 0 : s.Lk - s.Lq;
  return s;
}

// The scheduler numbers tiles sequence by sequence: sequence s owns ceil(len_s / block_rows)
// consecutive tiles (len_s from `cu`, clamped). A launch needs at most this many CTAs per head
// (sum of ceil(len_s / block_rows) <= (total + S·(block_rows - 1)) / block_rows, and <= S tiles of
// the longest sequence); CTAs past the last tile find no tile and return.
inline std::int64_t varlen_tile_bound(std::int64_t total, std::int64_t S, std::int64_t max_len,
                                      int block_rows) {
  const std::int64_t by_total = (total + S * (block_rows - 1)) / block_rows;
  const std::int64_t by_max = S * ((max_len + block_rows - 1) / block_rows);
  return by_total < by_max ? by_total : by_max;
}

struct VarlenTile {
  int seq = 0;    // the sequence; S when the tile index is past the last tile
  int block = 0;  // the row block inside it
};

// Sequential form (host tests, and the meaning of the warp form below).
MEMEFF_HD VarlenTile varlen_tile_serial(const int* cu, int S, std::int64_t total,
                                        std::int64_t max_len, int block_rows, std::int64_t t) {
  for (int s = 0; s < S; ++s) {
    std::int64_t start = 0, len = 0;
    packed_range(cu, s, total, max_len, start, len);
    const std::int64_t tiles = (len + block_rows - 1) / block_rows;
    if (t < tiles) return {s, static_cast<int>(t)};
    t -= tiles;
  }
  return {S, 0};
}

#if defined(__CUDACC__)
// The same, computed by all 32 lanes of a warp together (each gets the answer): 32 sequences per
// step with a warp scan, so a CTA finds its tile in ceil(S / 32) steps of coalesced loads.
__device__ __forceinline__ VarlenTile varlen_tile(const int* cu, int S, std::int64_t total,
                                                  std::int64_t max_len, int block_rows,
                                                  std::int64_t t) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int base = 0; base < S; base += 32) {
    const int s = base + lane;
    std::int64_t tiles = 0;
    if (s < S) {
      std::int64_t start = 0, len = 0;
      packed_range(cu, s, total, max_len, start, len);
      tiles = (len + block_rows - 1) / block_rows;
    }
    std::int64_t incl = tiles;  // inclusive prefix over the lanes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const std::int64_t up = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += up;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, t < incl);
    if (hit != 0) {
      const int first = __ffs(hit) - 1;
      const std::int64_t before = __shfl_sync(0xffffffffu, incl - tiles, first);
      return {base + first, static_cast<int>(t - before)};
    }
    t -= __shfl_sync(0xffffffffu, incl, 31);
  }
  return {S, 0};
}
#endif

}  // namespace memeff::cuda
