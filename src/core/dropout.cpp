// The public face of the dropout contract: quantizing p, and materializing any window of the
// mask from the same map the kernels use (core/dropout_map.h).
#include <cmath>
#include <string>

#include "core/dropout_map.h"
#include "memeff/dropout.h"
#include "memeff/error.h"

namespace memeff {
namespace {

void check_window(const MaskWindow& w) {
  auto bad = [](const char* field, std::int64_t value) {
    throw Error(ErrorCode::invalid_argument, std::string("argument `window.") + field +
                                                 "`: expected a non-negative value, got " +
                                                 std::to_string(value));
  };
  if (w.heads < 1) {
    throw Error(ErrorCode::invalid_argument,
                "argument `window.heads`: expected the number of query heads (>= 1), got " +
                    std::to_string(w.heads));
  }
  if (w.batch_begin < 0) bad("batch_begin", w.batch_begin);
  if (w.batch_count < 0) bad("batch_count", w.batch_count);
  if (w.head_begin < 0) bad("head_begin", w.head_begin);
  if (w.head_count < 0) bad("head_count", w.head_count);
  if (w.row_begin < 0) bad("row_begin", w.row_begin);
  if (w.rows < 0) bad("rows", w.rows);
  if (w.col_begin < 0) bad("col_begin", w.col_begin);
  if (w.cols < 0) bad("cols", w.cols);
  if (w.head_begin + w.head_count > w.heads) {
    throw Error(ErrorCode::invalid_argument,
                "argument `window.head_count`: heads [" + std::to_string(w.head_begin) + ", " +
                    std::to_string(w.head_begin + w.head_count) + ") exceed heads = " +
                    std::to_string(w.heads));
  }
  if (static_cast<std::uint64_t>(w.row_begin + w.rows) > detail::kDropoutMaxRows) {
    throw Error(ErrorCode::invalid_argument, "argument `window.rows`: rows beyond 2^32 are not addressable");
  }
  if (static_cast<std::uint64_t>(w.col_begin + w.cols) > detail::kDropoutMaxCols) {
    throw Error(ErrorCode::invalid_argument, "argument `window.cols`: columns beyond 2^36 are not addressable");
  }
}

// Calls `emit(index_in_window, keep)` for every element, one Philox call per 16 elements.
template <class Emit>
void for_each_decision(std::uint64_t seed, std::uint64_t offset, double p, const MaskWindow& w,
                       Emit&& emit) {
  check_window(w);
  const std::uint32_t threshold = dropout_threshold(p).threshold;
  const detail::DropoutKey key = detail::dropout_key(seed, offset);
  std::int64_t row_index = 0;
  for (std::int64_t b = w.batch_begin; b < w.batch_begin + w.batch_count; ++b) {
    for (std::int64_t h = w.head_begin; h < w.head_begin + w.head_count; ++h) {
      const auto bh = static_cast<std::uint64_t>(b) * static_cast<std::uint64_t>(w.heads) +
                      static_cast<std::uint64_t>(h);
      for (std::int64_t i = w.row_begin; i < w.row_begin + w.rows; ++i, ++row_index) {
        const auto col_end = static_cast<std::uint64_t>(w.col_begin + w.cols);
        for (std::uint64_t blk = static_cast<std::uint64_t>(w.col_begin) >> 6;
             blk * 64 < col_end; ++blk) {
          for (std::uint32_t cls = 0; cls < 4; ++cls) {
            const std::uint32_t bits = detail::dropout_keep_bits16(
                detail::dropout_call(key, bh, static_cast<std::uint64_t>(i), blk, cls), threshold);
            for (std::uint32_t byte = 0; byte < 16; ++byte) {
              const std::uint64_t j = detail::dropout_byte_col(blk, cls, byte);
              if (j < static_cast<std::uint64_t>(w.col_begin) || j >= col_end) continue;
              emit(row_index, static_cast<std::int64_t>(j) - w.col_begin, (bits >> byte) & 1u);
            }
          }
        }
      }
    }
  }
}

}  // namespace

DropoutThreshold dropout_threshold(double p) {
  if (!std::isfinite(p) || p < 0.0 || p >= 1.0) {
    throw Error(ErrorCode::invalid_argument,
                "argument `dropout_p`: expected a probability in [0, 1), got " + std::to_string(p));
  }
  constexpr long kByteValues = 256;  // an element is kept when its random byte is below t
  long t = std::lround(static_cast<double>(kByteValues) * (1.0 - p));
  if (t < 1) t = 1;
  if (t > kByteValues) t = kByteValues;
  DropoutThreshold d;
  d.threshold = static_cast<std::uint32_t>(t);
  d.p_effective = 1.0 - static_cast<double>(t) / kByteValues;
  d.keep_scale = static_cast<double>(kByteValues) / static_cast<double>(t);
  return d;
}

bool dropout_keep(std::uint64_t seed, std::uint64_t offset, double p, std::int64_t heads,
                  std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  MaskWindow w;
  w.heads = heads;
  w.batch_begin = b;
  w.head_begin = h;
  w.row_begin = i;
  w.rows = 1;
  w.col_begin = j;
  w.cols = 1;
  check_window(w);
  const std::uint32_t threshold = dropout_threshold(p).threshold;
  const auto bh = static_cast<std::uint64_t>(b) * static_cast<std::uint64_t>(heads) +
                  static_cast<std::uint64_t>(h);
  return detail::dropout_keep_element(detail::dropout_key(seed, offset), threshold, bh,
                                      static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(j));
}

void dropout_mask(std::uint64_t seed, std::uint64_t offset, double p, const MaskWindow& window,
                  std::uint8_t* keep) {
  if (keep == nullptr && window.rows * window.cols * window.batch_count * window.head_count != 0) {
    throw Error(ErrorCode::invalid_argument, "argument `keep`: null output for a non-empty window");
  }
  for_each_decision(seed, offset, p, window, [&](std::int64_t row, std::int64_t col, std::uint32_t k) {
    keep[row * window.cols + col] = static_cast<std::uint8_t>(k);
  });
}

void dropout_keep_bits(std::uint64_t seed, std::uint64_t offset, double p,
                       const MaskWindow& window, std::uint64_t* bits) {
  const std::int64_t words = (window.cols + 63) / 64;
  const std::int64_t total = words * window.rows * window.batch_count * window.head_count;
  if (bits == nullptr && total != 0) {
    throw Error(ErrorCode::invalid_argument, "argument `bits`: null output for a non-empty window");
  }
  for (std::int64_t w = 0; w < total; ++w) bits[w] = 0;
  for_each_decision(seed, offset, p, window, [&](std::int64_t row, std::int64_t col, std::uint32_t k) {
    bits[row * words + col / 64] |= static_cast<std::uint64_t>(k) << (col % 64);
  });
}

}  // namespace memeff
