// Philox4x32-R (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) with the
// Random123 constants. One call maps a 128-bit counter and a 64-bit key to 128 random bits.
// Shared verbatim by the CPU backends and the CUDA kernels, so the bits are the same everywhere.
// The dropout contract (dropout_map.h) says how many rounds each of its calls takes.
#pragma once

#include <cstdint>

#include "core/hostdevice.h"

namespace memeff::detail {

struct Philox4 {
  std::uint32_t x[4];
};

inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;  // round multipliers
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;  // key schedule (golden ratio, sqrt 3 - 1)
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;

MEMEFF_HD std::uint32_t mulhi32(std::uint32_t a, std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
#endif
}

// kRounds rounds of counter c0..c3 under key k0 (low word) and k1 (high word).
template <int kRounds>
MEMEFF_HD Philox4 philox4x32(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2, std::uint32_t c3,
                             std::uint32_t k0, std::uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < kRounds; ++round) {
    const std::uint32_t hi0 = mulhi32(kPhiloxM0, c0);
    const std::uint32_t lo0 = kPhiloxM0 * c0;
    const std::uint32_t hi1 = mulhi32(kPhiloxM1, c2);
    const std::uint32_t lo1 = kPhiloxM1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

}  // namespace memeff::detail
