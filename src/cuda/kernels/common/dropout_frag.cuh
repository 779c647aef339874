// Dropout keep-bits for MMA accumulator fragments, in both orientations, from the one map of
// src/core/dropout_map.h (docs/dropout.md). The column (or key) tile must start on a multiple of
// 64 in absolute coordinates; rows may start anywhere.
//
//   S  (rows = queries, forward):  one Philox call per lane per row per 64 columns, all 16 bytes
//                                  used: lane (g, t) owns columns 8n + 2t + e = class t, byte 2n +
//                                  e.
//   Sᵀ (rows = keys, backward):    lanes g and g^1 (lane ^ 4) hold the same two queries and the
//                                  two byte parities of the same two calls: each computes one call
//                                  and they swap the other half with one shuffle.
// Cost: one Philox call (7 rounds, dropout_map.h) per 16 elements per lane in both orientations.
#pragma once

#include <cstdint>

#include "core/dropout_map.h"
#include "cuda/kernels/common/params.h"

namespace memeff::cuda {

// The Philox key of a call's mask: seed and offset from the params, or from device memory where
// the params point there (CUDA-graph replays).
__device__ __forceinline__ detail::DropoutKey dropout_key_of(const ForwardParams& p) {
  const std::uint64_t seed = p.seed_ptr ? *p.seed_ptr : p.seed;
  const std::uint64_t offset = p.offset_ptr ? *p.offset_ptr : p.offset;
  return detail::dropout_key(seed, offset);
}

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

// Per byte of x: most significant bit set where byte < the matching byte of t4 (unsigned), with
// t4_low = t4 & 0x7F7F7F7F. SWAR: compare the low 7 bits with a borrow-free subtraction, then
// resolve with the top bits. Compiles to a few LOP3/IADD, cheaper than __vcmpltu4 + bit gathering.
__device__ __forceinline__ std::uint32_t bytes_below(std::uint32_t x, std::uint32_t t4,
                                                     std::uint32_t t4_low) {
  const std::uint32_t d = (x | 0x80808080u) - t4_low;  // msb: (x & 0x7F) >= (t & 0x7F)
  return ((~x & t4) | (~(x ^ t4) & ~d)) & 0x80808080u;
}

// prmt.b32 with sign replication: selector nibbles 8..B copy the msb of byte 0..3 into a byte.
__device__ __forceinline__ std::uint32_t spread_msb(std::uint32_t x, std::uint32_t selector) {
  std::uint32_t y;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(y) : "r"(x), "r"(selector));
  return y;
}

// The threshold in the SWAR form bytes_below takes: every byte = threshold (< 256 with dropout).
struct KeepThreshold {
  std::uint32_t t4, t4_low;
  __device__ __forceinline__ explicit KeepThreshold(std::uint32_t threshold)
      : t4(threshold * 0x01010101u), t4_low((threshold * 0x01010101u) & 0x7F7F7F7Fu) {}
};

// S orientation, applied to P already in 16-bit pairs (pk[n][hh] = columns 8n + 2t + 0/1 of row
// half hh). `keep` holds bytes_below of the four words of the call of one row (half hh) and the
// 64-column block starting at n8 tile 8·c: byte 2n + e decides column 8n + 2t + e of the block
// (word n / 2, bytes 2·(n % 2) + e). A dropped element's half-word is cleared.
template <int kNT>
__device__ __forceinline__ void apply_keep_words(std::uint32_t (&pk)[kNT][2], int c, int hh,
                                                 const std::uint32_t (&keep)[4]) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    pk[8 * c + 2 * w][hh] &= spread_msb(keep[w], 0x9988u);
    pk[8 * c + 2 * w + 1][hh] &= spread_msb(keep[w], 0xBBAAu);
  }
}
// The keep words of one call (what apply_keep_words takes).
__device__ __forceinline__ void keep_words(const detail::Philox4& r, KeepThreshold thr,
                                           std::uint32_t (&keep)[4]) {
#pragma unroll
  for (int w = 0; w < 4; ++w) keep[w] = bytes_below(r.x[w], thr.t4, thr.t4_low);
}
// Both steps from the call itself.
template <int kNT>
__device__ __forceinline__ void drop_packed(std::uint32_t (&pk)[kNT][2], int c, int hh,
                                            const detail::Philox4& r, KeepThreshold thr) {
  std::uint32_t keep[4];
  keep_words(r, thr, keep);
  apply_keep_words(pk, c, hh, keep);
}
// S orientation. Keep bits for the accumulators of rows `row` (absolute query index) over the 64
// columns starting at 64·col_block64, for lane class t = lane % 4: bit 2n + e is column
// 64·col_block64 + 8n + 2t + e, i.e. C-fragment element e (or 2 + e for row g + 8) of n8 tile n.
__device__ __forceinline__ std::uint32_t keep_bits_s(detail::DropoutKey key,
                                                     std::uint32_t threshold, std::uint64_t bh,
                                                     std::uint64_t row, std::uint64_t col_block64,
                                                     int lane) {
  return keep_bits16_fast(detail::dropout_call(key, bh, row, col_block64, lane & 3), threshold);
}

// Sᵀ orientation. A warp's accumulators for 64 keys (four m16 tiles, keys 64·key_block64 + 16m +
// 8h + g) by 8 queries (one n8 tile, queries query0 + 2t + e, query0 a multiple of 8). Returns
// bit 8e + 2m + h for C-fragment element 2h + e of m16 tile m. All 32 lanes must call it.
__device__ __forceinline__ std::uint32_t keep_bits_st(detail::DropoutKey key,
                                                      std::uint32_t threshold, std::uint64_t bh,
                                                      std::uint64_t query0,
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
  const std::uint32_t mine = parity ? odd : even;    // my keys, query e = parity
  const std::uint32_t theirs = parity ? even : odd;  // partner's keys, query e = parity
  const std::uint32_t received =
      __shfl_xor_sync(0xFFFFFFFFu, theirs, 4);  // my keys, query 1 - parity
  return parity ? (received | (mine << 8)) : (mine | (received << 8));
}

}  // namespace memeff::cuda
