// The dropout mask as a user-visible function: the keep decision of element (b, h, i, j) for a
// given seed, offset and p is the same on every backend and device, so it can be materialized
// here, in chunks, to see exactly which elements an attention call dropped. docs/dropout.md
// states the map from coordinates to Philox counters.
#pragma once

#include <cstdint>

namespace memeff {

// The version of the mask's definition (docs/dropout.md, "Versions"). A (seed, offset, p) gives
// the same mask everywhere within one version; a new version changes which elements are dropped,
// so masks recorded under another version are not reproduced. 2: the per-element Philox calls
// take 7 rounds (1: 10).
inline constexpr int kDropoutContractVersion = 2;

// p is quantized to 8 bits: an element is kept when its random byte is below `threshold`,
// threshold = round(256·(1 - p)) clamped to [1, 256]; kept values are scaled by 256/threshold.
struct DropoutThreshold {
  std::uint32_t threshold = 256;  // 1..256; 256 keeps everything (p = 0)
  double p_effective = 0.0;       // 1 - threshold/256
  double keep_scale = 1.0;        // 256 / threshold
};

// Throws memeff::Error naming `dropout_p` unless 0 <= p < 1 and finite.
DropoutThreshold dropout_threshold(double p);

// A window of the [B, H, Lq, Lk] mask. `heads` is the number of query heads of the call (the
// mask of head h of batch b is keyed by b·heads + h). Rows [row_begin, row_begin + rows) and
// columns [col_begin, col_begin + cols) of heads [head_begin, head_begin + head_count) of
// batches [batch_begin, batch_begin + batch_count).
struct MaskWindow {
  std::int64_t heads = 1;
  std::int64_t batch_begin = 0, batch_count = 1;
  std::int64_t head_begin = 0, head_count = 1;
  std::int64_t row_begin = 0, rows = 0;
  std::int64_t col_begin = 0, cols = 0;
};

// Keep decision of one element.
bool dropout_keep(std::uint64_t seed, std::uint64_t offset, double p, std::int64_t heads,
                  std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j);

// Fills keep[batch][head][row][col] (dense, row-major over the window) with 1 for kept elements
// and 0 for dropped ones. Works on any window size; callers chunk large masks by windows.
void dropout_mask(std::uint64_t seed, std::uint64_t offset, double p, const MaskWindow& window,
                  std::uint8_t* keep);

// The same decisions packed as bits: for each (batch, head, row) of the window,
// ceil(cols / 64) words; bit c % 64 of word c / 64 is column col_begin + c.
void dropout_keep_bits(std::uint64_t seed, std::uint64_t offset, double p,
                       const MaskWindow& window, std::uint64_t* bits);

}  // namespace memeff
