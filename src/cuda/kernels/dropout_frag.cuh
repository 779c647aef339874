// Dropout keep-bits for MMA accumulator fragments, in both orientations, from the one map of
// src/core/dropout_map.h (docs/dropout.md). The column (or key) tile must start on a multiple of
// 64 in absolute coordinates; rows may start anywhere.
//
//   S  (rows = queries, forward):  one Philox call per lane per row per 64 columns, all 16 bytes
//                                  used: lane (g, t) owns columns 8n + 2t + e = class t, byte 2n + e.
//   Sᵀ (rows = keys, backward):    lanes g and g^1 (lane ^ 4) hold the same two queries and the
//                                  two byte parities of the same two calls: each computes one call
//                                  and they swap the other half with one shuffle.
// Cost: one Philox4x32-10 call per 16 elements per lane in both orientations.
#pragma once

#include <cstdint>

#include "core/dropout_map.h"

namespace memeff::cuda {

// Keep bits of one call with threshold in [1, 255]: bit k set when byte k < threshold.
// (threshold 256 means no dropout; callers skip the whole path then.)
__device__ __forceinline__ std::uint32_t keep_bits16_fast(const detail::Philox4& r,
                                                          std::uint32_t threshold) {
  const std::uint32_t thr4 = threshold * 0x01010101u;
  std::uint32_t bits = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    // __vcmpltu4: 0xFF in each byte where r < thr; keep one bit per byte and gather the four
    // bits into a nibble with one multiply (no carries: partial sums stay below 16).
    const std::uint32_t lt = __vcmpltu4(r.x[w], thr4) & 0x01010101u;
    bits |= ((lt * 0x01020408u) >> 24) << (4 * w);
  }
  return bits;
}

// S orientation. Keep bits for the accumulators of rows `row` (absolute query index) over the 64
// columns starting at 64·col_block64, for lane class t = lane % 4: bit 2n + e is column
// 64·col_block64 + 8n + 2t + e, i.e. C-fragment element e (or 2 + e for row g + 8) of n8 tile n.
__device__ __forceinline__ std::uint32_t keep_bits_s(detail::DropoutKey key, std::uint32_t threshold,
                                                     std::uint64_t bh, std::uint64_t row,
                                                     std::uint64_t col_block64, int lane) {
  return keep_bits16_fast(detail::dropout_call(key, bh, row, col_block64, lane & 3), threshold);
}

// Sᵀ orientation. A warp's accumulators for 64 keys (four m16 tiles, keys 64·key_block64 + 16m +
// 8h + g) by 8 queries (one n8 tile, queries query0 + 2t + e, query0 a multiple of 8). Returns
// bit 8e + 2m + h for C-fragment element 2h + e of m16 tile m. All 32 lanes must call it.
__device__ __forceinline__ std::uint32_t keep_bits_st(detail::DropoutKey key, std::uint32_t threshold,
                                                      std::uint64_t bh, std::uint64_t query0,
                                                      std::uint64_t key_block64, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int parity = g & 1;  // this lane's keys have j % 2 == parity; it computes query e = parity
  const std::uint32_t bits = keep_bits16_fast(
      detail::dropout_call(key, bh, query0 + 2 * t + parity, key_block64, g >> 1), threshold);
  // Split the 16 bits by byte parity: byte 2s + p holds key 8s + p' of the block (s = 2m + h).
  std::uint32_t even = 0, odd = 0;
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    even |= ((bits >> (2 * s)) & 1u) << s;
    odd |= ((bits >> (2 * s + 1)) & 1u) << s;
  }
  const std::uint32_t mine = parity ? odd : even;   // my keys, query e = parity
  const std::uint32_t theirs = parity ? even : odd;  // partner's keys, query e = parity
  const std::uint32_t received = __shfl_xor_sync(0xFFFFFFFFu, theirs, 4);  // my keys, query 1 - parity
  return parity ? (received | (mine << 8)) : (mine | (received << 8));
}

}  // namespace memeff::cuda
