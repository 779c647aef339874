// The dropout RNG contract: Philox4x32 known answers (7 and 10 rounds), the contract version, the
// coordinate map of docs/dropout.md (a bijection between elements and call bytes, on absolute
// coordinates, 64-bit safe), the public mask functions, p quantization, and statistics of the keep
// decisions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "core/dropout_map.h"
#include "core/philox.h"
#include "memeff/dropout.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using detail::Philox4;

// Random123's published known-answer vectors for philox4x32 with 7 and 10 rounds.
struct PhiloxKat {
  std::uint32_t ctr[4], key[2], out[4];
};

template <int kRounds>
void expect_known_answers(const PhiloxKat (&kats)[3]) {
  for (const PhiloxKat& k : kats) {
    const Philox4 r =
        detail::philox4x32<kRounds>(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(r.x[w], k.out[w]) << kRounds << " rounds, counter " << std::hex << k.ctr[0]
                                  << " word " << w;
    }
  }
}

TEST(Philox, KnownAnswersTenRounds) {
  const PhiloxKat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  expect_known_answers<10>(kats);
}

TEST(Philox, KnownAnswersSevenRounds) {
  const PhiloxKat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
  };
  expect_known_answers<7>(kats);
}

// Version 2: the key from 10 rounds, the element calls from 7 (docs/dropout.md, "Versions").
TEST(DropoutMap, VersionTwoRoundCounts) {
  EXPECT_EQ(kDropoutContractVersion, 2);
  EXPECT_EQ(detail::kDropoutKeyRounds, 10);
  EXPECT_EQ(detail::kDropoutCallRounds, 7);
}

TEST(DropoutMap, ByteMapIsABijectionOnEveryBlock) {
  // Every column of a 64-column block has exactly one (class, byte), and back.
  for (std::uint64_t base :
       {std::uint64_t{0}, std::uint64_t{64} * 12345, detail::kDropoutMaxCols - 64}) {
    std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
    for (std::uint64_t j = base; j < base + 64; ++j) {
      const std::uint32_t cls = detail::dropout_col_class(j), byte = detail::dropout_byte_index(j);
      ASSERT_LT(cls, 4u);
      ASSERT_LT(byte, 16u);
      EXPECT_TRUE(seen.insert({cls, byte}).second) << "column " << j << " shares a byte";
      EXPECT_EQ(detail::dropout_byte_col(j >> 6, cls, byte), j);
    }
    EXPECT_EQ(seen.size(), 64u);
  }
}

TEST(DropoutMap, OneCallServesOneMmaFragmentRow) {
  // Lane class t of the m16n8 layout owns columns 8n + 2t + {0, 1}: all 16 in one call, byte 2n +
  // e.
  for (std::uint32_t t = 0; t < 4; ++t) {
    for (std::uint32_t n = 0; n < 8; ++n) {
      for (std::uint32_t e = 0; e < 2; ++e) {
        const std::uint64_t j = 64 * 7 + 8 * n + 2 * t + e;
        EXPECT_EQ(detail::dropout_col_class(j), t);
        EXPECT_EQ(detail::dropout_byte_index(j), 2 * n + e);
      }
    }
  }
}

// The documented counter layout, written out independently of dropout_map.h.
bool keep_by_doc(std::uint64_t seed, std::uint64_t offset, std::uint32_t threshold,
                 std::uint64_t bh, std::uint64_t i, std::uint64_t j) {
  const Philox4 k = detail::philox4x32<10>(std::uint32_t(offset), std::uint32_t(offset >> 32), 0, 0,
                                           std::uint32_t(seed), std::uint32_t(seed >> 32));
  const std::uint64_t c0 = (j / 64) * 4 + (j / 2) % 4;
  const Philox4 r = detail::philox4x32<7>(std::uint32_t(c0), std::uint32_t(i), std::uint32_t(bh),
                                          std::uint32_t(bh >> 32), k.x[0], k.x[1]);
  const std::uint64_t byte = 2 * ((j / 8) % 8) + j % 2;
  return ((r.x[byte / 4] >> (8 * (byte % 4))) & 0xFF) < threshold;
}

TEST(DropoutMap, HugeCoordinatesFollowTheDocumentedCounter) {
  // Rows near 2^31 and 2^32, B·H near 2^32 and beyond, columns near 2^36, 64-bit offsets:
  // no tensor is allocated, the map is evaluated where int32 arithmetic would wrap.
  const std::int64_t heads = 65536;
  const struct {
    std::int64_t b, h, i, j;
  } coords[] = {{0, 0, 0, 0},
                {65535, 65535, (1ll << 31) - 1, 5},
                {65536, 0, (1ll << 31), 1ll << 31},
                {65535, 65534, (1ll << 32) - 1, (1ll << 36) - 1},
                {70000, 3, (1ll << 31) + 17, (1ll << 33) + 64 + 3}};
  for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{1} << 40, ~std::uint64_t{0}}) {
    for (const auto& c : coords) {
      const std::uint64_t bh = std::uint64_t(c.b) * heads + std::uint64_t(c.h);
      EXPECT_EQ(dropout_keep(0x0123456789ABCDEFull, offset, 0.5, heads, c.b, c.h, c.i, c.j),
                keep_by_doc(0x0123456789ABCDEFull, offset, 128, bh, c.i, c.j))
          << "b " << c.b << " h " << c.h << " i " << c.i << " j " << c.j;
    }
  }
  // bh >= 2^32 reaches the fourth counter word: heads 2^32 apart must differ somewhere.
  MaskWindow w{.rows = 4, .cols = 256};
  std::vector<std::uint8_t> low(1024), high(1024);
  w.batch_begin = 7;
  dropout_mask(1, 2, 0.5, w, low.data());
  w.batch_begin = 7 + (1ll << 32);
  dropout_mask(1, 2, 0.5, w, high.data());
  EXPECT_NE(low, high);
}

TEST(DropoutMask, WindowsAgreeWithSingleElements) {
  // Rows straddle 2^31; columns start off the 64-column blocks and span several.
  MaskWindow w{.heads = 3, .batch_begin = 1, .batch_count = 2, .head_begin = 1, .head_count = 2};
  w.row_begin = (1ll << 31) - 3;
  w.rows = 6;
  w.col_begin = 37;
  w.cols = 150;
  std::vector<std::uint8_t> keep(2 * 2 * 6 * 150);
  std::vector<std::uint64_t> bits(2 * 2 * 6 * 3);
  dropout_mask(99, 5, 0.3, w, keep.data());
  dropout_keep_bits(99, 5, 0.3, w, bits.data());
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < 6; ++i) {
        for (std::int64_t j = 0; j < 150; ++j, ++n) {
          const bool expect = dropout_keep(99, 5, 0.3, 3, 1 + b, 1 + h, w.row_begin + i, 37 + j);
          ASSERT_EQ(keep[n] != 0, expect) << "b " << b << " h " << h << " i " << i << " j " << j;
          const std::int64_t row = (b * 2 + h) * 6 + i;
          ASSERT_EQ(((bits[row * 3 + j / 64] >> (j % 64)) & 1) != 0, expect);
        }
      }
}

TEST(DropoutMask, IsAPureFunctionOfItsCoordinates) {
  // The same element drawn through different windows (chunking) gives the same decision.
  const MaskWindow whole{.heads = 2, .head_count = 2, .rows = 70, .cols = 200};
  std::vector<std::uint8_t> all(2 * 70 * 200);
  dropout_mask(7, 11, 0.2, whole, all.data());
  const MaskWindow part{
      .heads = 2, .head_begin = 1, .row_begin = 33, .rows = 20, .col_begin = 65, .cols = 90};
  std::vector<std::uint8_t> some(20 * 90);
  dropout_mask(7, 11, 0.2, part, some.data());
  for (int i = 0; i < 20; ++i)
    for (int j = 0; j < 90; ++j)
      ASSERT_EQ(some[i * 90 + j], all[(70 + 33 + i) * 200 + 65 + j]) << i << "," << j;
}

TEST(DropoutThreshold, QuantizesToBytes) {
  EXPECT_EQ(dropout_threshold(0.0).threshold, 256u);
  EXPECT_DOUBLE_EQ(dropout_threshold(0.0).keep_scale, 1.0);
  const DropoutThreshold d = dropout_threshold(0.1);  // 256·0.9 = 230.4 -> 230
  EXPECT_EQ(d.threshold, 230u);
  EXPECT_DOUBLE_EQ(d.p_effective, 26.0 / 256.0);
  EXPECT_DOUBLE_EQ(d.keep_scale, 256.0 / 230.0);
  EXPECT_EQ(dropout_threshold(0.5).threshold, 128u);
  EXPECT_EQ(dropout_threshold(0.9999).threshold, 1u);  // clamped: something is always kept
  for (double bad : {-0.1, 1.0, 2.0, std::nan(""), static_cast<double>(INFINITY)}) {
    try {
      dropout_threshold(bad);
      ADD_FAILURE() << "accepted p = " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("dropout_p"), std::string::npos) << e.what();
    }
  }
}

TEST(DropoutMask, RejectsBadWindows) {
  MaskWindow w{.head_begin = 1, .rows = 4, .cols = 4};  // heads = 1: head 1 does not exist
  std::vector<std::uint8_t> keep(16);
  EXPECT_THROW(dropout_mask(0, 0, 0.1, w, keep.data()), Error);
  w.head_begin = 0;
  w.rows = -1;
  EXPECT_THROW(dropout_mask(0, 0, 0.1, w, keep.data()), Error);
  w.rows = 4;
  EXPECT_THROW(dropout_mask(0, 0, 0.1, w, nullptr), Error);
}

// Counts kept elements of a window.
std::int64_t kept(std::uint64_t seed, std::uint64_t offset, double p, const MaskWindow& w,
                  std::vector<std::uint8_t>& keep) {
  keep.resize(static_cast<std::size_t>(w.batch_count * w.head_count * w.rows * w.cols));
  dropout_mask(seed, offset, p, w, keep.data());
  std::int64_t n = 0;
  for (std::uint8_t k : keep) n += k;
  return n;
}

TEST(DropoutStatistics, KeepRatePassesABinomialTest) {
  const MaskWindow w{.heads = 4, .head_count = 4, .rows = 256, .cols = 1000};  // cols: not 64·n
  std::vector<std::uint8_t> keep;
  for (double p : {0.01, 0.1, 0.5, 0.9}) {
    const double q = 1.0 - dropout_threshold(p).p_effective;
    const double n = 4.0 * 256 * 1000;
    const double k = static_cast<double>(kept(2024, 3, p, w, keep));
    const double z = (k - n * q) / std::sqrt(n * q * (1 - q));
    EXPECT_LT(std::abs(z), 5.0) << "p " << p << " kept " << k << " of " << n;
    // Each of the 16 byte positions of a call carries its share: none is biased.
    for (std::uint32_t byte = 0; byte < 16; ++byte) {
      double kb = 0, nb = 0;
      for (std::int64_t r = 0; r < 4 * 256; ++r)
        for (std::int64_t j = 0; j < 1000; ++j)
          if (detail::dropout_byte_index(static_cast<std::uint64_t>(j)) == byte) {
            kb += keep[r * 1000 + j];
            nb += 1;
          }
      const double zb = (kb - nb * q) / std::sqrt(nb * q * (1 - q));
      EXPECT_LT(std::abs(zb), 5.0) << "p " << p << " byte " << byte;
    }
  }
}

// Pearson correlation of two 0/1 vectors.
double correlation(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  double sa = 0, sb = 0, sab = 0, saa = 0, sbb = 0;
  const double n = static_cast<double>(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    sa += a[i];
    sb += b[i];
    sab += a[i] * b[i];
    saa += a[i] * a[i];
    sbb += b[i] * b[i];
  }
  const double cov = sab / n - (sa / n) * (sb / n);
  return cov / std::sqrt((saa / n - (sa / n) * (sa / n)) * (sbb / n - (sb / n) * (sb / n)));
}

TEST(DropoutStatistics, MasksAreUncorrelatedAcrossOffsetsSeedsHeadsRowsAndColumns) {
  const double p = 0.5;
  const MaskWindow w{.heads = 8, .head_begin = 2, .rows = 256, .cols = 512};
  std::vector<std::uint8_t> base, other;
  kept(5, 100, p, w, base);
  const double limit = 5.0 / std::sqrt(static_cast<double>(base.size()));  // 5 sigma

  kept(5, 101, p, w, other);
  EXPECT_LT(std::abs(correlation(base, other)), limit) << "offsets 100 / 101";
  kept(6, 100, p, w, other);
  EXPECT_LT(std::abs(correlation(base, other)), limit) << "seeds 5 / 6";
  MaskWindow w2 = w;
  w2.head_begin = 3;
  kept(5, 100, p, w2, other);
  EXPECT_LT(std::abs(correlation(base, other)), limit) << "heads 2 / 3";
  w2 = w;
  w2.batch_begin = 1;
  kept(5, 100, p, w2, other);
  EXPECT_LT(std::abs(correlation(base, other)), limit) << "batches 0 / 1";

  // Neighbouring rows and columns within one mask (shifted copies of the same draw): columns
  // j and j+1 share a Philox call, j and j+2 are different calls, j and j+64 another block.
  auto shifted_corr = [&](std::int64_t drow, std::int64_t dcol) {
    std::vector<std::uint8_t> a, b;
    for (std::int64_t i = 0; i + drow < w.rows; ++i)
      for (std::int64_t j = 0; j + dcol < w.cols; ++j) {
        a.push_back(base[i * w.cols + j]);
        b.push_back(base[(i + drow) * w.cols + j + dcol]);
      }
    return correlation(a, b);
  };
  for (auto [dr, dc] : {std::pair{1, 0}, {0, 1}, {0, 2}, {0, 8}, {0, 64}, {1, 1}}) {
    EXPECT_LT(std::abs(shifted_corr(dr, dc)), limit) << "shift rows " << dr << " cols " << dc;
  }
}

}  // namespace
}  // namespace memeff
