// The one rule every backend (CPU and CUDA) uses for which keys a query row sees, and for rows
// that see a single key: their softmax is 1 whatever the score, so their dS is exactly 0, where
// P·(Z·dP − D) would leave the rounding of D = rowsum(dO ∘ O) taken on the stored output.
// Query i sees key j iff j < Lk, with a causal mask j <= i + causal_shift, and with a sliding
// window i + shift - left <= j <= i + shift + right (docs/window.md).
#pragma once

#include <cstdint>

#include "core/hostdevice.h"

namespace memeff::detail {

MEMEFF_HD bool sees_one_key(std::int64_t i, std::int64_t Lk, bool causal,
                            std::int64_t causal_shift) {
  const std::int64_t causal_count = i + causal_shift + 1;  // keys 0 .. i + shift
  return (causal && causal_count < Lk ? causal_count : Lk) == 1;
}

// Keys [begin, end) of one query row; end <= begin when it sees none.
struct KeySpan {
  std::int64_t begin = 0, end = 0;
  MEMEFF_HD std::int64_t size() const { return end > begin ? end - begin : 0; }
};

// The keys query row i sees: 0 <= j < Lk, and i + shift - left <= j <= i + shift + right for the
// window sides that are >= 0 (-1: unbounded), with right capped at 0 when causal (shift is then
// the causal shift). Sides are at most Problem::kWindowCap, so nothing overflows.
MEMEFF_HD KeySpan visible_key_span(std::int64_t i, std::int64_t Lk, bool causal, std::int64_t shift,
                                   std::int64_t left, std::int64_t right) {
  if (causal) right = 0;  // unbounded or not, a causal row sees nothing past its diagonal
  const std::int64_t diagonal = i + shift;
  KeySpan span{0, Lk};
  if (left >= 0 && diagonal - left > span.begin) span.begin = diagonal - left;
  if (right >= 0 && diagonal + right + 1 < span.end) span.end = diagonal + right + 1;
  return span;
}

// The keys some query row of i_first..i_last (i_first <= i_last) sees, under the same rule: a
// row's span only moves right with i, so the first row's start and the last row's end bound them.
MEMEFF_HD KeySpan visible_key_span_of_rows(std::int64_t i_first, std::int64_t i_last,
                                           std::int64_t Lk, bool causal, std::int64_t shift,
                                           std::int64_t left, std::int64_t right) {
  return {visible_key_span(i_first, Lk, causal, shift, left, right).begin,
          visible_key_span(i_last, Lk, causal, shift, left, right).end};
}

}  // namespace memeff::detail
