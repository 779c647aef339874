// The reference backend is the oracle, so it is checked on its own: a hand-computed case,
// structural identities (GQA = repeated heads, causal alignments, the dropout mask and its
// scaling seen through V = I), the edge semantics, and gradients against central finite
// differences in fp64 with dropout on (the mask is a fixed function of the coordinates).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/host_tensor.h"
#include "memeff/attention.h"
#include "memeff/dropout.h"

namespace memeff {
namespace {

using test::Case;
using test::Config;
using test::HostTensor;
using test::Layout;

// The reference's own small defaults: fp64, GQA 2:1, Lq != Lk, Dv != D, the mask of seed 1234
// from offset 0.
Config ref_config() {
  return {
      .Hkv = 1, .Lq = 5, .Lk = 7, .D = 4, .Dv = 3, .dtype = DType::f64, .seed = 1234, .offset = 0};
}

constexpr std::uint64_t kDataSeed = 7;

void expect_no_nan(const HostTensor& t, const char* name) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_FALSE(std::isnan(t.get(i))) << name << " element " << i;
  }
}

TEST(Reference, HandComputedCase) {
  // q = [1, 0]; keys [1, 0], [0, 1]; scale 1: scores [1, 0].
  Config c = ref_config();
  c.B = c.Hq = c.Hkv = 1;
  c.Lq = 1;
  c.Lk = 2;
  c.D = c.Dv = 2;
  Case t(c, kDataSeed);
  const double qv[] = {1, 0}, kv[] = {1, 0, 0, 1}, vv[] = {1, 2, 3, 4};
  for (int i = 0; i < 2; ++i) t.q.set(i, qv[i]);
  for (int i = 0; i < 4; ++i) t.k.set(i, kv[i]), t.v.set(i, vv[i]);
  AttentionArgs a = t.args();
  a.scale = 1.0;
  Options o;
  o.backends = {"reference"};
  forward(a, t.out.view, t.lse.view, o);
  const double e = std::exp(1.0), p0 = e / (e + 1), p1 = 1 / (e + 1);
  EXPECT_NEAR(t.out.get(0), p0 * 1 + p1 * 3, 1e-12);
  EXPECT_NEAR(t.out.get(1), p0 * 2 + p1 * 4, 1e-12);
  EXPECT_NEAR(t.lse.get(0), std::log(e + 1), 1e-6);  // lse is fp32
}

TEST(Reference, GqaEqualsRepeatedKeyValueHeads) {
  Config c = ref_config();
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.causal = CausalMode::bottom_right;
  c.dropout = 0.25;
  Case gqa(c, kDataSeed);
  gqa.run_forward("reference");
  Config m = c;
  m.Hkv = 4;
  Case mha(m, kDataSeed);
  mha.q = gqa.q;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t j = 0; j < c.Lk; ++j) {
        for (std::int64_t d = 0; d < c.D; ++d)
          mha.k.set(((b * 4 + h) * c.Lk + j) * c.D + d,
                    gqa.k.get(((b * 2 + h / 2) * c.Lk + j) * c.D + d));
        for (std::int64_t d = 0; d < c.Dv; ++d)
          mha.v.set(((b * 4 + h) * c.Lk + j) * c.Dv + d,
                    gqa.v.get(((b * 2 + h / 2) * c.Lk + j) * c.Dv + d));
      }
  mha.run_forward("reference");
  for (std::int64_t i = 0; i < gqa.out.numel(); ++i)
    ASSERT_DOUBLE_EQ(gqa.out.get(i), mha.out.get(i)) << i;
}

TEST(Reference, CausalAlignmentsAgreeOnSquareShapes) {
  Config c = ref_config();
  c.Lq = c.Lk = 9;
  c.causal = CausalMode::top_left;
  Case tl(c, kDataSeed);
  tl.run_forward("reference");
  c.causal = CausalMode::bottom_right;
  Case br(c, kDataSeed);
  br.run_forward("reference");
  for (std::int64_t i = 0; i < tl.out.numel(); ++i) ASSERT_DOUBLE_EQ(tl.out.get(i), br.out.get(i));
  // Top-left: the first query sees only key 0, so its output is v[0].
  for (std::int64_t d = 0; d < c.Dv; ++d) EXPECT_NEAR(tl.out.get(d), tl.v.get(d), 1e-12);
}

TEST(Reference, DropoutMaskAndScalingSeenThroughIdentityValues) {
  // With V = I (Dv = Lk), out[i, j] = P_ij · Z_ij: dropout keeps P_ij · 256/t exactly where
  // dropout_mask says so, and zeroes the rest.
  Config c = ref_config();
  c.Hq = 3;
  c.Hkv = 3;
  c.Lq = 33;
  c.Lk = c.Dv = 70;  // two 64-column blocks
  c.causal = CausalMode::top_left;
  c.dropout = 0.3;
  c.offset = 9;
  Case drop(c, kDataSeed);
  test::fill_identity(drop.v);
  const CallInfo info = drop.run_forward("reference");
  EXPECT_DOUBLE_EQ(info.p_effective, dropout_threshold(0.3).p_effective);
  Case plain = drop;
  plain.cfg.dropout = 0.0;
  plain.run_forward("reference");
  std::vector<std::uint8_t> keep(3 * 33 * 70);
  dropout_mask(c.seed, c.offset, c.dropout, {.heads = 3, .head_count = 3, .rows = 33, .cols = 70},
               keep.data());
  const double scale = dropout_threshold(0.3).keep_scale;
  for (std::int64_t n = 0; n < drop.out.numel(); ++n) {
    ASSERT_NEAR(drop.out.get(n), keep[n] ? plain.out.get(n) * scale : 0.0, 1e-12) << n;
  }
  // lse does not depend on dropout.
  for (std::int64_t n = 0; n < drop.lse.numel(); ++n) ASSERT_EQ(drop.lse.get(n), plain.lse.get(n));
}

TEST(Reference, RowsThatSeeNoKeyGiveZeroOutMinusInfLseAndZeroGradients) {
  Config c = ref_config();
  c.Lq = 10;
  c.Lk = 4;  // bottom-right: queries 0..5 see no key
  c.causal = CausalMode::bottom_right;
  c.bias = "bhqk";
  c.dropout = 0.2;
  Case t(c, kDataSeed);
  t.run_forward("reference");
  t.run_backward("reference");
  for (std::int64_t h = 0; h < c.Hq; ++h) {
    for (std::int64_t i = 0; i < c.Lq; ++i) {
      const bool empty = i < c.Lq - c.Lk;
      const double lse = t.lse.get(h * c.Lq + i);
      EXPECT_EQ(std::isinf(lse) && lse < 0, empty) << "h " << h << " i " << i;
      for (std::int64_t d = 0; d < c.Dv && empty; ++d)
        EXPECT_EQ(t.out.get((h * c.Lq + i) * c.Dv + d), 0.0);
      for (std::int64_t d = 0; d < c.D && empty; ++d)
        EXPECT_EQ(t.dq.get((h * c.Lq + i) * c.D + d), 0.0);
      for (std::int64_t j = 0; j < c.Lk && empty; ++j)
        EXPECT_EQ(t.dbias->get((h * c.Lq + i) * c.Lk + j), 0.0);
    }
  }
  expect_no_nan(t.out, "out");
  expect_no_nan(t.dq, "dq");
  expect_no_nan(t.dk, "dk");
  expect_no_nan(t.dv, "dv");
  expect_no_nan(*t.dbias, "dbias");
}

TEST(Reference, NoKeysAtAll) {
  Config c = ref_config();
  c.Lk = 0;
  Case t(c, kDataSeed);
  t.run_forward("reference");
  t.run_backward("reference");
  for (std::int64_t n = 0; n < t.out.numel(); ++n) EXPECT_EQ(t.out.get(n), 0.0);
  for (std::int64_t n = 0; n < t.lse.numel(); ++n) EXPECT_EQ(t.lse.get(n), -INFINITY);
  for (std::int64_t n = 0; n < t.dq.numel(); ++n) EXPECT_EQ(t.dq.get(n), 0.0);
}

TEST(Reference, EmptyBatchOrQueriesAreNoOps) {
  Config c = ref_config();
  c.Lq = 0;
  Case t(c, kDataSeed);
  EXPECT_NO_THROW(t.run_forward("reference"));
  t.run_backward("reference");  // no queries: no gradient reaches k, v
  for (std::int64_t n = 0; n < t.dk.numel(); ++n) EXPECT_EQ(t.dk.get(n), 0.0);
  for (std::int64_t n = 0; n < t.dv.numel(); ++n) EXPECT_EQ(t.dv.get(n), 0.0);
  Config b = c;
  b.Lq = 5;
  b.B = 0;
  Case e(b, kDataSeed);
  EXPECT_NO_THROW(e.run_forward("reference"));
  EXPECT_NO_THROW(e.run_backward("reference"));
}

TEST(Reference, StridedInputsGiveTheSameResult) {
  Config c = ref_config();
  c.Hq = 4;
  c.Hkv = 2;
  c.bias = "b1qk";
  c.dropout = 0.1;
  Case contiguous(c, kDataSeed);
  Config s = c;
  s.layout = Layout::blhd;
  Case strided(s, kDataSeed);
  for (std::int64_t n = 0; n < contiguous.q.numel(); ++n) strided.q.set(n, contiguous.q.get(n));
  for (std::int64_t n = 0; n < contiguous.k.numel(); ++n) strided.k.set(n, contiguous.k.get(n));
  for (std::int64_t n = 0; n < contiguous.v.numel(); ++n) strided.v.set(n, contiguous.v.get(n));
  for (std::int64_t n = 0; n < contiguous.dout.numel(); ++n)
    strided.dout.set(n, contiguous.dout.get(n));
  *strided.bias = *contiguous.bias;
  contiguous.run_forward("reference");
  strided.run_forward("reference");
  contiguous.run_backward("reference");
  strided.run_backward("reference");
  for (auto [a, b] : {std::pair{&contiguous.out, &strided.out},
                      {&contiguous.dq, &strided.dq},
                      {&contiguous.dk, &strided.dk},
                      {&contiguous.dv, &strided.dv}}) {
    for (std::int64_t n = 0; n < a->numel(); ++n) ASSERT_DOUBLE_EQ(a->get(n), b->get(n)) << n;
  }
}

// Gradient check by central differences of Σ out ∘ dout, in fp64: up to `samples_per_tensor`
// elements of q, k, v and the bias each.
void gradcheck(const Config& cfg, int samples_per_tensor = 24) {
  SCOPED_TRACE(cfg.describe());
  Case t(cfg, kDataSeed);
  t.run_forward("reference");
  t.run_backward("reference");
  std::mt19937_64 pick(99);
  const double h = 1e-6;
  auto check = [&](HostTensor& input, const HostTensor& grad, const char* name) {
    const std::int64_t n = input.numel();
    for (int s = 0; s < std::min<std::int64_t>(samples_per_tensor, n); ++s) {
      const std::int64_t idx = n <= samples_per_tensor ? s : static_cast<std::int64_t>(pick() % n);
      const double x = input.get(idx);
      input.set(idx, x + h);
      const double up = t.loss("reference");
      input.set(idx, x - h);
      const double down = t.loss("reference");
      input.set(idx, x);
      const double numeric = (up - down) / (2 * h);
      const double analytic = grad.get(idx);
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << name << " element " << idx;
    }
  };
  check(t.q, t.dq, "q");
  check(t.k, t.dk, "k");
  check(t.v, t.dv, "v");
  if (t.bias) check(*t.bias, *t.dbias, "bias");
}

// The gradcheck grid: each row a whole call, run in fp64 with the mask of seed 1234.
struct GradcheckCase {
  const char* name;
  Config cfg;
};

// clang-format off
const GradcheckCase kGradcheckCases[] = {
    {"SingleElement", {.Hkv = 1, .Lq = 1, .Lk = 1, .D = 4, .Dv = 3}},
    {"OddLengthCausalDropoutFullBias", {.Hkv = 1, .Lq = 17, .Lk = 17, .D = 5, .Dv = 4,
                                        .causal = CausalMode::top_left, .bias = "bhqk",
                                        .dropout = 0.3}},
    {"SixtyFiveBottomRightBroadcastBias", {.Hkv = 1, .Lq = 65, .Lk = 65, .D = 3, .Dv = 3,
                                           .causal = CausalMode::bottom_right, .bias = "1h1k",
                                           .dropout = 0.2}},
    // The case PyTorch PR #103704 got wrong (tile-relative RNG): many keys, causal, dropout.
    {"CausalDropoutWithMoreKeysThanOneTile", {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 7, .Lk = 129,
                                              .D = 4, .Dv = 6, .causal = CausalMode::bottom_right,
                                              .bias = "b11k", .dropout = 0.1,
                                              .layout = Layout::blhd, .offset = 1ull << 33}},
    {"MoreQueriesThanKeysWithEmptyRows", {.Hkv = 1, .Lq = 20, .Lk = 9, .D = 4, .Dv = 3,
                                          .causal = CausalMode::bottom_right, .bias = "11qk",
                                          .dropout = 0.5}},
    {"MultiQueryNoMask", {.Hq = 3, .Hkv = 1, .Lq = 6, .Lk = 11, .D = 4, .Dv = 3, .bias = "bh1k"}},
    // docs/window.md: the cap's derivative reaches q and k, dbias takes the capped score's.
    {"SoftcapWithFullBiasAndDropout", {.Hkv = 1, .Lq = 9, .Lk = 13, .D = 4, .Dv = 3,
                                       .bias = "bhqk", .dropout = 0.2, .softcap = 0.8}},
    {"AlibiPerBatchHeadWithBiasAndWindow", {.B = 2, .Hkv = 1, .Lq = 11, .Lk = 15, .D = 4, .Dv = 3,
                                            .causal = CausalMode::top_left, .bias = "b1qk",
                                            .dropout = 0.1, .window = {4, -1}, .alibi = "bh"}},
    {"WindowAlibiSoftcapWithoutCausal", {.Hq = 2, .Hkv = 1, .Lq = 12, .Lk = 9, .D = 4, .Dv = 3,
                                         .bias = "11qk", .window = {2, 3}, .alibi = "h",
                                         .softcap = 1.5}},
};
// clang-format on

class ReferenceGradcheck : public ::testing::TestWithParam<GradcheckCase> {};

TEST_P(ReferenceGradcheck, MatchesCentralDifferences) {
  Config c = GetParam().cfg;
  c.dtype = DType::f64;
  c.seed = 1234;
  gradcheck(c);
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceGradcheck, ::testing::ValuesIn(kGradcheckCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace memeff
