// The one rule every backend (CPU and CUDA) uses for rows that see a single key: their softmax is
// 1 whatever the score, so their dS is exactly 0, where P·(Z·dP − D) would leave the rounding of
// D = rowsum(dO ∘ O) taken on the stored output. Query i sees key j iff j < Lk and, with a causal
// mask, j <= i + causal_shift.
#pragma once

#include <cstdint>

#include "core/hostdevice.h"

namespace memeff::detail {

MEMEFF_HD bool sees_one_key(std::int64_t i, std::int64_t Lk, bool causal,
                            std::int64_t causal_shift) {
  const std::int64_t causal_count = i + causal_shift + 1;  // keys 0 .. i + shift
  return (causal && causal_count < Lk ? causal_count : Lk) == 1;
}

}  // namespace memeff::detail
