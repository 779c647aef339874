// The dropout RNG contract (docs/dropout.md): which Philox call and which byte of it decide
// element (b, h, i, j). Defined on absolute coordinates only, so every backend, tile shape and
// thread layout draws the same mask, and the backward regenerates it from either orientation.
//
//   key      = first two words of Philox-10(counter = {lo(offset), hi(offset), 0, 0}, key = seed)
//   call     = Philox-7(counter, key)
//   counter  = {4·(j / 64) + (j / 2) % 4,  i,  lo(bh),  hi(bh)}      bh = b·Hq + h
//   byte     = 2·((j / 8) % 8) + j % 2   of the 16 output bytes (word byte / 4, little-endian)
//   keep     = byte value < threshold,   threshold = round(256·(1 - p)) in [1, 256]
//
// One call therefore covers one query row and the 16 columns of a 64-column block that share
// (j mod 8) / 2: exactly the 16 accumulator elements a thread owns per row in the m16n8 MMA
// layout across a 64-wide tile.
#pragma once

#include <cstdint>

#include "core/hostdevice.h"
#include "core/philox.h"
#include "memeff/dropout.h"

namespace memeff::detail {

// Version 2 of the contract (kDropoutContractVersion): the per-element calls take 7 rounds
// (version 1 took 10; docs/dropout.md, "Versions", has the statistical tests behind the change).
// The key, drawn once per call of the API, keeps 10.
static_assert(kDropoutContractVersion == 2, "the round counts below are version 2's");
inline constexpr int kDropoutKeyRounds = 10;
inline constexpr int kDropoutCallRounds = 7;

// Coordinates the map can address: rows below 2^32 and columns below 2^36.
inline constexpr std::uint64_t kDropoutMaxRows = std::uint64_t{1} << 32;
inline constexpr std::uint64_t kDropoutMaxCols = std::uint64_t{1} << 36;

struct DropoutKey {
  std::uint32_t k0, k1;
};

MEMEFF_HD DropoutKey dropout_key(std::uint64_t seed, std::uint64_t offset) {
  const Philox4 r = philox4x32<kDropoutKeyRounds>(
      static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(offset >> 32), 0u, 0u,
      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  return DropoutKey{r.x[0], r.x[1]};
}

// Column class of j: which quarter of each 8-column group (the MMA fragment's column pair).
MEMEFF_HD std::uint32_t dropout_col_class(std::uint64_t j) {
  return static_cast<std::uint32_t>((j >> 1) & 3u);
}

// Byte of the call that decides column j (0..15).
MEMEFF_HD std::uint32_t dropout_byte_index(std::uint64_t j) {
  return static_cast<std::uint32_t>(((j >> 3) & 7u) * 2u + (j & 1u));
}

// Column of byte `byte` in the call (col_block64, col_class): the inverse of the two above.
MEMEFF_HD std::uint64_t dropout_byte_col(std::uint64_t col_block64, std::uint32_t col_class,
                                         std::uint32_t byte) {
  return col_block64 * 64u + (byte >> 1) * 8u + col_class * 2u + (byte & 1u);
}

// The Philox call holding the bytes of row i, 64-column block `col_block64` (j / 64) and column
// class `col_class` ((j / 2) % 4), for flattened head bh = b·Hq + h.
MEMEFF_HD Philox4 dropout_call(DropoutKey key, std::uint64_t bh, std::uint64_t i,
                               std::uint64_t col_block64, std::uint32_t col_class) {
  return philox4x32<kDropoutCallRounds>(
      static_cast<std::uint32_t>(col_block64 * 4u + col_class), static_cast<std::uint32_t>(i),
      static_cast<std::uint32_t>(bh), static_cast<std::uint32_t>(bh >> 32), key.k0, key.k1);
}

// The 16 keep decisions of one call: bit k is set when byte k < threshold (1..256).
MEMEFF_HD std::uint32_t dropout_keep_bits16(const Philox4& r, std::uint32_t threshold) {
  std::uint32_t bits = 0;
  for (int word = 0; word < 4; ++word) {
    for (int b = 0; b < 4; ++b) {
      const std::uint32_t byte = (r.x[word] >> (8 * b)) & 0xFFu;
      bits |= static_cast<std::uint32_t>(byte < threshold) << (word * 4 + b);
    }
  }
  return bits;
}

// Keep decision of one element (slow path: one Philox call per element).
MEMEFF_HD bool dropout_keep_element(DropoutKey key, std::uint32_t threshold, std::uint64_t bh,
                                    std::uint64_t i, std::uint64_t j) {
  const Philox4 r = dropout_call(key, bh, i, j >> 6, dropout_col_class(j));
  const std::uint32_t byte_index = dropout_byte_index(j);
  const std::uint32_t byte = (r.x[byte_index >> 2] >> (8 * (byte_index & 3u))) & 0xFFu;
  return byte < threshold;
}

}  // namespace memeff::detail
