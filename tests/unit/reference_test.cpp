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

#include "common/host_tensor.h"
#include "memeff/attention.h"
#include "memeff/dropout.h"

namespace memeff {
namespace {

using test::HostTensor;
using test::Layout;

struct Config {
  std::int64_t B = 1, Hq = 2, Hkv = 1, Lq = 5, Lk = 7, D = 4, Dv = 3;
  CausalMode causal = CausalMode::none;
  std::string bias = "none";  // "none" or a pattern like "bhqk", "1h1k"
  double dropout = 0.0;
  DType dtype = DType::f64;
  Layout layout = Layout::bhld;
  std::uint64_t seed = 1234, offset = 0;
};

// All tensors of one call, inputs random, outputs poisoned.
struct Case {
  Config cfg;
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  std::optional<HostTensor> bias, dbias;

  explicit Case(const Config& c, std::uint64_t data_seed = 7)
      : cfg(c),
        q(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
        k(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout),
        v(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv}, c.layout),
        out(c.dtype, {c.B, c.Hq, c.Lq, c.Dv}, c.layout),
        lse(DType::f32, {c.B, c.Hq, c.Lq}),
        dout(c.dtype, {c.B, c.Hq, c.Lq, c.Dv}, c.layout),
        dq(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
        dk(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout),
        dv(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv}, c.layout) {
    std::mt19937_64 rng(data_seed);
    test::fill_normal(q, rng);
    test::fill_normal(k, rng);
    test::fill_normal(v, rng);
    test::fill_normal(dout, rng);
    if (c.bias != "none") {
      const std::int64_t full[4] = {c.B, c.Hq, c.Lq, c.Lk};
      std::vector<std::int64_t> shape(4);
      for (int d = 0; d < 4; ++d) shape[d] = c.bias[d] == '1' ? 1 : full[d];
      bias.emplace(c.dtype, shape);
      dbias.emplace(c.dtype, shape);
      test::fill_normal(*bias, rng);
    }
    for (HostTensor* t : {&out, &lse, &dq, &dk, &dv}) test::poison(*t);
    if (dbias) test::poison(*dbias);
  }

  AttentionArgs args() const {
    AttentionArgs a;
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    if (bias) a.bias = bias->view;
    a.causal = cfg.causal;
    a.dropout_p = cfg.dropout;
    a.rng = {cfg.seed, cfg.offset};
    return a;
  }

  CallInfo run_forward() {
    Options o;
    o.backends = {"reference"};
    return forward(args(), out.view, lse.view, o);
  }
  void run_backward() {
    Options o;
    o.backends = {"reference"};
    BackwardTensors g{dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
    if (dbias) g.dbias = dbias->view;
    backward(args(), g, o);
  }
  // Σ out ∘ dout: the scalar whose gradient backward computes.
  double loss() {
    run_forward();
    double s = 0.0;
    for (std::int64_t i = 0; i < out.numel(); ++i) s += out.get(i) * dout.get(i);
    return s;
  }
};

void expect_no_nan(const HostTensor& t, const char* name) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_FALSE(std::isnan(t.get(i))) << name << " element " << i;
  }
}

TEST(Reference, HandComputedCase) {
  // q = [1, 0]; keys [1, 0], [0, 1]; scale 1: scores [1, 0].
  Config c;
  c.B = c.Hq = c.Hkv = 1;
  c.Lq = 1;
  c.Lk = 2;
  c.D = c.Dv = 2;
  Case t(c);
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
  Config c;
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.causal = CausalMode::bottom_right;
  c.dropout = 0.25;
  Case gqa(c);
  gqa.run_forward();
  Config m = c;
  m.Hkv = 4;
  Case mha(m);
  mha.q = gqa.q;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t j = 0; j < c.Lk; ++j) {
        for (std::int64_t d = 0; d < c.D; ++d)
          mha.k.set(((b * 4 + h) * c.Lk + j) * c.D + d, gqa.k.get(((b * 2 + h / 2) * c.Lk + j) * c.D + d));
        for (std::int64_t d = 0; d < c.Dv; ++d)
          mha.v.set(((b * 4 + h) * c.Lk + j) * c.Dv + d, gqa.v.get(((b * 2 + h / 2) * c.Lk + j) * c.Dv + d));
      }
  mha.run_forward();
  for (std::int64_t i = 0; i < gqa.out.numel(); ++i) ASSERT_DOUBLE_EQ(gqa.out.get(i), mha.out.get(i)) << i;
}

TEST(Reference, CausalAlignmentsAgreeOnSquareShapes) {
  Config c;
  c.Lq = c.Lk = 9;
  c.causal = CausalMode::top_left;
  Case tl(c);
  tl.run_forward();
  c.causal = CausalMode::bottom_right;
  Case br(c);
  br.run_forward();
  for (std::int64_t i = 0; i < tl.out.numel(); ++i) ASSERT_DOUBLE_EQ(tl.out.get(i), br.out.get(i));
  // Top-left: the first query sees only key 0, so its output is v[0].
  for (std::int64_t d = 0; d < c.Dv; ++d) EXPECT_NEAR(tl.out.get(d), tl.v.get(d), 1e-12);
}

TEST(Reference, DropoutMaskAndScalingSeenThroughIdentityValues) {
  // With V = I (Dv = Lk), out[i, j] = P_ij · Z_ij: dropout keeps P_ij · 256/t exactly where
  // dropout_mask says so, and zeroes the rest.
  Config c;
  c.Hq = 3;
  c.Hkv = 3;
  c.Lq = 33;
  c.Lk = c.Dv = 70;  // two 64-column blocks
  c.causal = CausalMode::top_left;
  c.dropout = 0.3;
  c.offset = 9;
  Case drop(c);
  for (std::int64_t h = 0; h < 3; ++h)
    for (std::int64_t j = 0; j < 70; ++j)
      for (std::int64_t e = 0; e < 70; ++e) drop.v.set((h * 70 + j) * 70 + e, j == e ? 1.0 : 0.0);
  const CallInfo info = drop.run_forward();
  EXPECT_DOUBLE_EQ(info.p_effective, dropout_threshold(0.3).p_effective);
  Case plain = drop;
  plain.cfg.dropout = 0.0;
  plain.run_forward();
  MaskWindow w;
  w.heads = 3;
  w.head_count = 3;
  w.rows = 33;
  w.cols = 70;
  std::vector<std::uint8_t> keep(3 * 33 * 70);
  dropout_mask(c.seed, c.offset, c.dropout, w, keep.data());
  const double scale = dropout_threshold(0.3).keep_scale;
  for (std::int64_t n = 0; n < drop.out.numel(); ++n) {
    ASSERT_NEAR(drop.out.get(n), keep[n] ? plain.out.get(n) * scale : 0.0, 1e-12) << n;
  }
  // lse does not depend on dropout.
  for (std::int64_t n = 0; n < drop.lse.numel(); ++n) ASSERT_EQ(drop.lse.get(n), plain.lse.get(n));
}

TEST(Reference, RowsThatSeeNoKeyGiveZeroOutMinusInfLseAndZeroGradients) {
  Config c;
  c.Lq = 10;
  c.Lk = 4;  // bottom-right: queries 0..5 see no key
  c.causal = CausalMode::bottom_right;
  c.bias = "bhqk";
  c.dropout = 0.2;
  Case t(c);
  t.run_forward();
  t.run_backward();
  for (std::int64_t h = 0; h < c.Hq; ++h) {
    for (std::int64_t i = 0; i < c.Lq; ++i) {
      const bool empty = i < c.Lq - c.Lk;
      const double lse = t.lse.get(h * c.Lq + i);
      EXPECT_EQ(std::isinf(lse) && lse < 0, empty) << "h " << h << " i " << i;
      for (std::int64_t d = 0; d < c.Dv && empty; ++d) EXPECT_EQ(t.out.get((h * c.Lq + i) * c.Dv + d), 0.0);
      for (std::int64_t d = 0; d < c.D && empty; ++d) EXPECT_EQ(t.dq.get((h * c.Lq + i) * c.D + d), 0.0);
      for (std::int64_t j = 0; j < c.Lk && empty; ++j) EXPECT_EQ(t.dbias->get((h * c.Lq + i) * c.Lk + j), 0.0);
    }
  }
  expect_no_nan(t.out, "out");
  expect_no_nan(t.dq, "dq");
  expect_no_nan(t.dk, "dk");
  expect_no_nan(t.dv, "dv");
  expect_no_nan(*t.dbias, "dbias");
}

TEST(Reference, NoKeysAtAll) {
  Config c;
  c.Lk = 0;
  Case t(c);
  t.run_forward();
  t.run_backward();
  for (std::int64_t n = 0; n < t.out.numel(); ++n) EXPECT_EQ(t.out.get(n), 0.0);
  for (std::int64_t n = 0; n < t.lse.numel(); ++n) EXPECT_EQ(t.lse.get(n), -INFINITY);
  for (std::int64_t n = 0; n < t.dq.numel(); ++n) EXPECT_EQ(t.dq.get(n), 0.0);
}

TEST(Reference, EmptyBatchOrQueriesAreNoOps) {
  Config c;
  c.Lq = 0;
  Case t(c);
  EXPECT_NO_THROW(t.run_forward());
  t.run_backward();  // no queries: no gradient reaches k, v
  for (std::int64_t n = 0; n < t.dk.numel(); ++n) EXPECT_EQ(t.dk.get(n), 0.0);
  for (std::int64_t n = 0; n < t.dv.numel(); ++n) EXPECT_EQ(t.dv.get(n), 0.0);
  Config b = c;
  b.Lq = 5;
  b.B = 0;
  Case e(b);
  EXPECT_NO_THROW(e.run_forward());
  EXPECT_NO_THROW(e.run_backward());
}

TEST(Reference, StridedInputsGiveTheSameResult) {
  Config c;
  c.Hq = 4;
  c.Hkv = 2;
  c.bias = "b1qk";
  c.dropout = 0.1;
  Case contiguous(c);
  Config s = c;
  s.layout = Layout::blhd;
  Case strided(s);
  for (std::int64_t n = 0; n < contiguous.q.numel(); ++n) strided.q.set(n, contiguous.q.get(n));
  for (std::int64_t n = 0; n < contiguous.k.numel(); ++n) strided.k.set(n, contiguous.k.get(n));
  for (std::int64_t n = 0; n < contiguous.v.numel(); ++n) strided.v.set(n, contiguous.v.get(n));
  for (std::int64_t n = 0; n < contiguous.dout.numel(); ++n) strided.dout.set(n, contiguous.dout.get(n));
  *strided.bias = *contiguous.bias;
  contiguous.run_forward();
  strided.run_forward();
  contiguous.run_backward();
  strided.run_backward();
  for (auto [a, b] : {std::pair{&contiguous.out, &strided.out}, {&contiguous.dq, &strided.dq},
                      {&contiguous.dk, &strided.dk}, {&contiguous.dv, &strided.dv}}) {
    for (std::int64_t n = 0; n < a->numel(); ++n) ASSERT_DOUBLE_EQ(a->get(n), b->get(n)) << n;
  }
}

// Gradient check by central differences of Σ out ∘ dout, in fp64.
void gradcheck(const Config& cfg, int samples_per_tensor = 24) {
  SCOPED_TRACE(::testing::Message() << "B " << cfg.B << " Hq " << cfg.Hq << " Hkv " << cfg.Hkv
                                    << " Lq " << cfg.Lq << " Lk " << cfg.Lk << " D " << cfg.D
                                    << " Dv " << cfg.Dv << " causal "
                                    << causal_mode_name(cfg.causal) << " bias " << cfg.bias
                                    << " dropout " << cfg.dropout);
  Case t(cfg);
  t.run_forward();
  t.run_backward();
  std::mt19937_64 pick(99);
  const double h = 1e-6;
  auto check = [&](HostTensor& input, const HostTensor& grad, const char* name) {
    const std::int64_t n = input.numel();
    for (int s = 0; s < std::min<std::int64_t>(samples_per_tensor, n); ++s) {
      const std::int64_t idx = n <= samples_per_tensor ? s : static_cast<std::int64_t>(pick() % n);
      const double x = input.get(idx);
      input.set(idx, x + h);
      const double up = t.loss();
      input.set(idx, x - h);
      const double down = t.loss();
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

TEST(ReferenceGradcheck, SingleElement) {
  Config c;
  c.Lq = c.Lk = 1;
  gradcheck(c);
}

TEST(ReferenceGradcheck, OddLengthCausalDropoutFullBias) {
  Config c;
  c.Lq = c.Lk = 17;
  c.D = 5;
  c.Dv = 4;
  c.causal = CausalMode::top_left;
  c.bias = "bhqk";
  c.dropout = 0.3;
  gradcheck(c);
}

TEST(ReferenceGradcheck, SixtyFiveBottomRightBroadcastBias) {
  Config c;
  c.Lq = c.Lk = 65;
  c.D = c.Dv = 3;
  c.causal = CausalMode::bottom_right;
  c.bias = "1h1k";
  c.dropout = 0.2;
  gradcheck(c);
}

TEST(ReferenceGradcheck, CausalDropoutWithMoreKeysThanOneTile) {
  // The case PyTorch PR #103704 got wrong (tile-relative RNG): many keys, causal, dropout.
  Config c;
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.Lq = 7;
  c.Lk = 129;
  c.D = 4;
  c.Dv = 6;
  c.causal = CausalMode::bottom_right;
  c.bias = "b11k";
  c.dropout = 0.1;
  c.layout = Layout::blhd;
  c.offset = 1ull << 33;
  gradcheck(c);
}

TEST(ReferenceGradcheck, MoreQueriesThanKeysWithEmptyRows) {
  Config c;
  c.Lq = 20;
  c.Lk = 9;
  c.causal = CausalMode::bottom_right;
  c.bias = "11qk";
  c.dropout = 0.5;
  gradcheck(c);
}

TEST(ReferenceGradcheck, MultiQueryNoMask) {
  Config c;
  c.Hq = 3;
  c.Hkv = 1;
  c.Lq = 6;
  c.Lk = 11;
  c.bias = "bh1k";
  gradcheck(c);
}

}  // namespace
}  // namespace memeff
