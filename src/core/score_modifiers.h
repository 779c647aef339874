// The host backends' reading of AttentionArgs::window, alibi_slopes and softcap (docs/window.md):
// which keys a row sees, the ALiBi slope of a (b, h) and the distance it multiplies, and the cap.
// The reference and cpu backends both read them here, so the two cannot disagree on the rule.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/visible_keys.h"
#include "memeff/attention.h"
#include "memeff/backend.h"

namespace memeff::detail {

// The keys query row i of the call sees (causal mask and window; the bias's -inf aside).
inline KeySpan row_keys(const Problem& pb, std::int64_t i) {
  return visible_key_span(i, pb.Lk, pb.causal != CausalMode::none, pb.position_shift(),
                          pb.window_left, pb.window_right);
}

// Query rows [begin, end) that see at least one key of [j0, j1): the rows whose span meets it.
// Spans move right by one key per row, so these are a range.
inline KeySpan rows_seeing(const Problem& pb, std::int64_t j0, std::int64_t j1) {
  const bool causal = pb.causal != CausalMode::none;
  const std::int64_t right = causal ? 0 : pb.window_right, shift = pb.position_shift();
  KeySpan rows{0, pb.Lq};
  // Row i's last key i + shift + right must reach j0; its first key i + shift - left stay < j1.
  if (right >= 0) rows.begin = std::max<std::int64_t>(rows.begin, j0 - shift - right);
  if (pb.window_left >= 0) {
    rows.end = std::min<std::int64_t>(rows.end, j1 - 1 - shift + pb.window_left + 1);
  }
  return rows;
}

// The ALiBi slope of batch element b (the call's own index) and query head h; 0 without ALiBi.
inline float alibi_slope(const Problem& pb, const AttentionArgs& args, std::int64_t b,
                         std::int64_t h) {
  if (!pb.has_alibi) return 0.0f;
  const TensorView& s = *args.alibi_slopes;
  const float* data = static_cast<const float*>(s.data);
  return pb.alibi_per_batch ? data[b * s.stride[0] + h * s.stride[1]] : data[h * s.stride[0]];
}

// |i + shift - j|: the distance ALiBi multiplies by -slope.
inline std::int64_t alibi_distance(const Problem& pb, std::int64_t i, std::int64_t j) {
  const std::int64_t d = i + pb.position_shift() - j;
  return d < 0 ? -d : d;
}

}  // namespace memeff::detail
