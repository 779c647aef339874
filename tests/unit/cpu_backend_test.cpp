// The cpu backend against the reference on awkward shapes (every feature, fp32/bf16/fp16), its
// dropout mask against memeff::dropout_mask (through the outputs and directly), its vector
// kernels (Philox bit for bit, exp, products) against scalar ones, and its memory bound at 16k.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/allocation_count.h"
#include "common/attention_case.h"
#include "common/cpu_reference_check.h"
#include "common/host_tensor.h"
#include "common/tolerance.h"
#include "core/dropout_map.h"
#include "core/philox.h"
#include "cpu/simd_kernels.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dropout.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::Case;
using test::Config;
using test::expect_close;
using test::HostTensor;
using test::Layout;

void check_against_reference(const Config& c, bool with_backward = true) {
  test::check_cpu_against_reference(c, with_backward);
}

Config make(std::int64_t Lq, std::int64_t Lk, std::int64_t D, DType dtype) {
  Config c;
  c.Lq = Lq;
  c.Lk = Lk;
  c.D = D;
  c.dtype = dtype;
  return c;
}

class CpuVsReference : public ::testing::TestWithParam<DType> {};

TEST_P(CpuVsReference, LengthsAndHeadDims) {
  const DType t = GetParam();
  check_against_reference(make(1, 1, 8, t));
  check_against_reference(make(17, 17, 40, t));
  check_against_reference(make(64, 65, 64, t));
  check_against_reference(make(65, 127, 80, t));
  check_against_reference(make(129, 64, 16, t));
  Config wide = make(33, 70, 256, t);
  wide.Hq = wide.Hkv = 1;
  check_against_reference(wide);
  Config dv = make(40, 129, 128, t);
  dv.Dv = 24;  // Dv != D
  dv.Hq = dv.Hkv = 1;
  check_against_reference(dv);
}

TEST_P(CpuVsReference, CausalBothWaysWithDropoutOverSeveralKeyTiles) {
  const DType t = GetParam();
  for (CausalMode mode : {CausalMode::top_left, CausalMode::bottom_right}) {
    for (auto [Lq, Lk] : {std::pair<int, int>{127, 129}, {129, 65}, {65, 200}, {1, 130}}) {
      Config c = make(Lq, Lk, 64, t);
      c.causal = mode;
      c.dropout = 0.2;
      check_against_reference(c);
    }
  }
}

TEST_P(CpuVsReference, BiasBroadcastEachWayWithGradient) {
  const DType t = GetParam();
  for (const char* pattern : {"bhqk", "1hqk", "b1qk", "bh1k", "111k", "11qk"}) {
    Config c = make(33, 70, 40, t);
    c.B = 2;
    c.Hq = 2;
    c.Hkv = 1;
    c.bias = pattern;
    c.causal = CausalMode::bottom_right;
    c.dropout = 0.1;
    check_against_reference(c);
  }
}

TEST_P(CpuVsReference, GqaAndStridedBlhdInputs) {
  const DType t = GetParam();
  Config c = make(65, 129, 64, t);
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.layout = Layout::blhd;
  c.causal = CausalMode::top_left;
  c.dropout = 0.15;
  c.bias = "b1qk";
  check_against_reference(c);
  Config mqa = make(17, 64, 32, t);
  mqa.Hq = 3;
  mqa.Hkv = 1;
  mqa.layout = Layout::blhd;
  check_against_reference(mqa);
}

TEST(CpuBackend, Length1013WithEverythingOn) {
  Config c = make(1013, 1013, 64, DType::f32);
  c.Hq = c.Hkv = 1;
  c.causal = CausalMode::top_left;
  c.dropout = 0.1;
  c.bias = "111k";
  check_against_reference(c);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuVsReference, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CpuBackend, Fp16Cases) {
  Config a = make(65, 127, 64, DType::f16);
  a.causal = CausalMode::bottom_right;
  a.dropout = 0.1;
  a.bias = "1hqk";
  check_against_reference(a);
  Config b = make(17, 33, 80, DType::f16);
  b.Hq = 4;
  b.Hkv = 1;
  check_against_reference(b);
}

// Options::deterministic: the backward is bitwise repeatable. Each thread sums its key blocks'
// dQ into a partial; given to whichever thread is free (the default), the blocks land on other
// threads from call to call and dq's rounding changes; round-robin they do not. Four threads on
// any machine (oversubscribed on small ones, where the race is likelier still).
TEST(CpuBackend, DeterministicBackwardIsBitwiseRepeatable) {
  Config c = make(300, 1000, 64, DType::f32);
  c.Hq = 2;
  c.Hkv = 1;
  c.causal = CausalMode::top_left;
  c.dropout = 0.1;
  Case cs(c, 3);
  cs.run_forward("cpu");
  Options o = test::only({"cpu"});
  o.deterministic = true;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(4);
  std::vector<std::uint8_t> first;
  for (int call = 0; call < 6; ++call) {
    test::poison(cs.dq);
    backward(cs.args(), cs.grads(), o);
    if (call == 0) {
      first = cs.dq.storage;
    } else {
      EXPECT_EQ(cs.dq.storage, first) << "call " << call << ": dq differs from the first call's";
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST(CpuBackend, EmptyRowsAndEmptyCalls) {
  // Bottom-right with Lq > Lk: the first Lq - Lk rows see nothing: out 0, lse -inf, dq 0.
  Config c = make(70, 5, 16, DType::f32);
  c.causal = CausalMode::bottom_right;
  c.dropout = 0.3;
  check_against_reference(c);
  Case t(c, 5);
  t.run_forward("cpu");
  t.run_backward("cpu");
  for (std::int64_t i = 0; i < 65; ++i) {
    EXPECT_EQ(t.lse.get(i), -std::numeric_limits<double>::infinity()) << "row " << i;
    for (std::int64_t e = 0; e < c.D; ++e) {
      ASSERT_EQ(t.out.get(i * c.D + e), 0.0) << "out row " << i;
      ASSERT_EQ(t.dq.get(i * c.D + e), 0.0) << "dq row " << i;
    }
  }
  // Lq = 0: backward must still zero dk, dv and dbias.
  Config z = make(0, 9, 8, DType::f32);
  z.bias = "111k";
  Case e(z, 6);
  e.run_forward("cpu");
  e.run_backward("cpu");
  for (const HostTensor* g : {&e.dk, &e.dv, &*e.dbias}) {
    for (std::int64_t i = 0; i < g->numel(); ++i) ASSERT_EQ(g->get(i), 0.0) << "element " << i;
  }
  // Lk = 0: out 0, lse -inf, dq 0.
  Case k0(make(3, 0, 8, DType::bf16), 7);
  k0.run_forward("cpu");
  k0.run_backward("cpu");
  for (std::int64_t i = 0; i < k0.out.numel(); ++i) ASSERT_EQ(k0.out.get(i), 0.0);
  for (std::int64_t i = 0; i < k0.dq.numel(); ++i) ASSERT_EQ(k0.dq.get(i), 0.0);
  for (std::int64_t i = 0; i < k0.lse.numel(); ++i) ASSERT_TRUE(std::isinf(k0.lse.get(i)));
}

TEST(CpuBackend, RefusesFp64WithAReason) {
  auto cpu = find_backend("cpu");
  ASSERT_TRUE(cpu);
  Problem p;
  p.B = p.Hq = p.Hkv = 1;
  p.Lq = p.Lk = 4;
  p.D = p.Dv = 8;
  p.dtype = DType::f64;
  const auto why = cpu->reasons_unsupported(p, Pass::forward);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_NE(why[0].find("fp64"), std::string::npos);
  p.dtype = DType::bf16;
  EXPECT_TRUE(cpu->reasons_unsupported(p, Pass::backward).empty());
}

// With V = I (Lk <= Dv) out[i][j] = P_ij·Z_ij: zero exactly where the mask dropped (i, j).
TEST(CpuBackend, DropoutMaskSeenThroughOutputsEqualsDropoutMask) {
  Config c = make(70, 130, 16, DType::f32);
  c.Dv = 144;
  c.B = 2;
  c.Hq = 2;
  c.Hkv = 1;
  c.dropout = 0.4;
  c.seed = 0x1234567890ABCDEFull;
  c.offset = 77;
  Case t(c, 11);
  test::fill_identity(t.v);
  t.run_forward("cpu");
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(c.B * c.Hq * c.Lq * c.Lk));
  dropout_mask(c.seed, c.offset, c.dropout,
               {.heads = c.Hq, .batch_count = c.B, .head_count = c.Hq, .rows = c.Lq, .cols = c.Lk},
               keep.data());
  std::int64_t dropped = 0;
  for (std::int64_t bhi = 0; bhi < c.B * c.Hq * c.Lq; ++bhi) {
    for (std::int64_t j = 0; j < c.Lk; ++j) {
      const bool kept = t.out.get(bhi * c.dv() + j) != 0.0;
      ASSERT_EQ(kept, keep[static_cast<std::size_t>(bhi * c.Lk + j)] != 0)
          << "row " << bhi << " column " << j;
      dropped += !kept;
    }
    for (std::int64_t e = c.Lk; e < c.dv(); ++e) ASSERT_EQ(t.out.get(bhi * c.dv() + e), 0.0);
  }
  const double rate = static_cast<double>(dropped) / static_cast<double>(keep.size());
  EXPECT_NEAR(rate, 0.4, 0.03);
}

constexpr detail::CpuIsa kAllIsas[] = {detail::CpuIsa::scalar, detail::CpuIsa::avx2,
                                       detail::CpuIsa::avx512};
constexpr detail::CpuIsa kVectorIsas[] = {detail::CpuIsa::avx2, detail::CpuIsa::avx512};

// The vector keep-bit generator against the public packed mask, word for word, far out in rows,
// columns and heads.
TEST(CpuKernels, KeepMasksEqualDropoutKeepBits) {
  const std::uint64_t seed = 42, offset = 1ull << 40;
  for (double p : {0.1, 0.5, 0.9}) {
    const DropoutThreshold t = dropout_threshold(p);
    const detail::DropoutKey key = detail::dropout_key(seed, offset);
    // Rows up to 2^32, three 64-column blocks far out.
    MaskWindow w{.heads = 5, .batch_begin = 3, .head_begin = 4, .rows = 37, .cols = 64 * 3};
    w.row_begin = 4000000000;
    w.col_begin = 64 * 1000003;
    std::vector<std::uint64_t> bits(static_cast<std::size_t>(w.rows * 3));
    dropout_keep_bits(seed, offset, p, w, bits.data());
    const std::uint64_t bh = 3 * 5 + 4;
    for (detail::CpuIsa isa : kAllIsas) {
      if (!detail::cpu_supports(isa)) continue;
      const detail::CpuKernels& k = detail::cpu_kernels(isa);
      for (int cb = 0; cb < 3; ++cb) {
        std::vector<std::uint64_t> masks(static_cast<std::size_t>(w.rows));
        k.keep_masks64(key, bh, static_cast<std::uint64_t>(w.row_begin), static_cast<int>(w.rows),
                       static_cast<std::uint64_t>(w.col_begin / 64 + cb), t.threshold,
                       masks.data());
        for (std::int64_t r = 0; r < w.rows; ++r) {
          ASSERT_EQ(masks[r], bits[static_cast<std::size_t>(r * 3 + cb)])
              << k.name << " p " << p << " row " << r << " block " << cb;
        }
      }
    }
  }
}

TEST(CpuKernels, VectorPhiloxMatchesScalarBitForBit) {
  std::mt19937_64 rng(3);
  const int n = 1003;  // not a multiple of the vector width
  std::vector<std::uint32_t> c[4], out(4 * n);
  for (auto& v : c) {
    v.resize(n);
    for (auto& x : v) x = static_cast<std::uint32_t>(rng());
  }
  c[0][0] = c[1][0] = c[2][0] = c[3][0] = 0;
  for (detail::CpuIsa isa : kAllIsas) {
    if (!detail::cpu_supports(isa)) continue;
    for (auto [k0, k1] :
         {std::pair<std::uint32_t, std::uint32_t>{0u, 0u}, {0xDEADBEEFu, 0x12345u}}) {
      detail::cpu_kernels(isa).philox(c[0].data(), c[1].data(), c[2].data(), c[3].data(), k0, k1, n,
                                      out.data());
      for (int t = 0; t < n; ++t) {
        const detail::Philox4 r = detail::philox4x32<detail::kDropoutCallRounds>(
            c[0][t], c[1][t], c[2][t], c[3][t], k0, k1);
        for (int w = 0; w < 4; ++w)
          ASSERT_EQ(out[4 * t + w], r.x[w]) << "call " << t << " word " << w;
      }
    }
    // Known answer of 7 rounds (the dropout calls'): counter 0, key 0.
    detail::cpu_kernels(isa).philox(c[0].data(), c[1].data(), c[2].data(), c[3].data(), 0, 0, 1,
                                    out.data());
    EXPECT_EQ(out[0], 0x5f6fb709u);
    EXPECT_EQ(out[1], 0x0d893f64u);
    EXPECT_EQ(out[2], 0x4f121f81u);
    EXPECT_EQ(out[3], 0x4f730a48u);
  }
}

TEST(CpuKernels, FastExpIsAccurateZeroBelowRangeAndNaNForNaN) {
  std::vector<float> x, y;
  for (float v = -87.0f; v < 88.0f; v += 0.01173f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, -100.0f, -1e30f,
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  while (x.size() % 8) x.push_back(0.5f);
  y.resize(x.size());
  int tested = 0;
  for (detail::CpuIsa isa : kVectorIsas) {
    if (!detail::cpu_supports(isa)) continue;
    ++tested;
    const auto& k = detail::cpu_kernels(isa);
    std::fill(y.begin(), y.end(), -1.0f);
    k.exp(x.data(), y.data(), static_cast<int>(x.size()));
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) {  // a NaN score stays NaN (docs/api.md: nothing hidden)
        EXPECT_TRUE(std::isnan(y[i])) << k.name << " exp(NaN) = " << y[i];
        continue;
      }
      if (x[i] < -87.4f) {
        EXPECT_EQ(y[i], 0.0f) << k.name << " x " << x[i];
        continue;
      }
      const double e = std::exp(static_cast<double>(x[i]));
      ASSERT_LE(std::abs(y[i] - e), 4e-7 * e) << k.name << " x " << x[i];
    }
  }
  if (tested == 0) GTEST_SKIP() << "no vector instruction set on this CPU";
  if (detail::cpu_supports(detail::CpuIsa::avx2) && detail::cpu_supports(detail::CpuIsa::avx512)) {
    std::vector<float> y2(x.size()), y5(x.size());
    detail::cpu_kernels(detail::CpuIsa::avx2).exp(x.data(), y2.data(), static_cast<int>(x.size()));
    detail::cpu_kernels(detail::CpuIsa::avx512)
        .exp(x.data(), y5.data(), static_cast<int>(x.size()));
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(y2[i]) && std::isnan(y5[i])) continue;  // NaN payloads may differ
      ASSERT_EQ(std::memcmp(&y2[i], &y5[i], sizeof(float)), 0)
          << "avx2 and avx512 exp differ at x " << x[i] << ": " << y2[i] << " vs " << y5[i];
    }
  }
}

// Every vector table computes the same tile products as the scalar one, including the column
// and row tails of each register block (n a multiple of 16, any m and k).
TEST(CpuKernels, VectorProductMatchesScalar) {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd;
  int tested = 0;
  for (detail::CpuIsa isa : kVectorIsas) {
    if (!detail::cpu_supports(isa)) continue;
    ++tested;
    for (auto [m, n, k] : {std::tuple<int, int, int>{1, 16, 1},
                           {7, 32, 13},
                           {64, 64, 64},
                           {13, 48, 80},
                           {5, 80, 3},
                           {12, 16, 64}}) {
      const int lda = k + 3, ldb = n + 16, ldc = n + 16;
      std::vector<float> a(m * lda), b(k * ldb), c1(m * ldc, 1.0f), c2(m * ldc, 1.0f);
      for (auto& v : a) v = nd(rng);
      for (auto& v : b) v = nd(rng);
      // The same left factor stored transposed (k×m, leading dimension m + 5) for gemm_at.
      const int ldat = m + 5;
      std::vector<float> at(k * ldat, 0.0f), c3(m * ldc, 1.0f);
      for (int i = 0; i < m; ++i)
        for (int p = 0; p < k; ++p) at[p * ldat + i] = a[i * lda + p];
      for (bool acc : {false, true}) {
        detail::cpu_kernels(detail::CpuIsa::scalar)
            .gemm(m, n, k, a.data(), lda, b.data(), ldb, c1.data(), ldc, acc);
        detail::cpu_kernels(isa).gemm(m, n, k, a.data(), lda, b.data(), ldb, c2.data(), ldc, acc);
        detail::cpu_kernels(isa).gemm_at(m, n, k, at.data(), ldat, b.data(), ldb, c3.data(), ldc,
                                         acc);
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < ldc; ++j) {
            ASSERT_NEAR(c1[i * ldc + j], c2[i * ldc + j], 1e-4 * std::sqrt(k))
                << detail::cpu_isa_name(isa) << " m " << m << " n " << n << " k " << k << " at "
                << i << "," << j;
            ASSERT_NEAR(c1[i * ldc + j], c3[i * ldc + j], 1e-4 * std::sqrt(k))
                << detail::cpu_isa_name(isa) << " gemm_at m " << m << " n " << n << " k " << k
                << " at " << i << "," << j;
          }
      }
    }
  }
  if (tested == 0) GTEST_SKIP() << "no vector instruction set on this CPU";
}

// The keep-mask multiply and the fused softmax rows (forward and backward) of every vector table
// against the scalar table, with the valid prefix ending inside and at the edges of a vector.
TEST(CpuKernels, VectorRowStepsMatchScalar) {
  std::mt19937_64 rng(17);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const auto& ref = detail::cpu_kernels(detail::CpuIsa::scalar);
  int tested = 0;
  for (detail::CpuIsa isa : kVectorIsas) {
    if (!detail::cpu_supports(isa)) continue;
    ++tested;
    const auto& k = detail::cpu_kernels(isa);
    std::vector<float> x1(64), x2;
    for (auto& v : x1) v = nd(rng);
    x2 = x1;
    const std::uint64_t keep = 0x8000F00F0FF0A5C3ull;
    ref.apply_keep64(x1.data(), keep, 1.25f);
    k.apply_keep64(x2.data(), keep, 1.25f);
    for (int c = 0; c < 64; ++c) ASSERT_EQ(x1[c], x2[c]) << k.name << " col " << c;
    // The fused rows: the forward's online-softmax step and the backward's softmax gradient,
    // with the valid prefix ending inside and at the edges of a vector, with and without bias.
    for (int valid : {1, 5, 8, 15, 16, 17, 33, 63, 64}) {
      for (bool with_bias : {false, true}) {
        std::vector<float> s1(64), bias(64), o1(48), dp(64);
        for (auto& v : s1) v = nd(rng);
        for (auto& v : bias) v = nd(rng);
        for (auto& v : o1) v = nd(rng);
        for (auto& v : dp) v = nd(rng);
        const float* b = with_bias ? bias.data() : nullptr;
        const std::string where =
            std::string(k.name) + " valid " + std::to_string(valid) + (with_bias ? " bias" : "");
        for (float m0 : {-std::numeric_limits<float>::infinity(), 0.5f, 9.0f}) {
          std::vector<float> s2 = s1, o2 = o1, sa = s1, oa = o1;
          float m1 = m0, l1 = 2.0f, m2 = m0, l2 = 2.0f;
          ref.online_softmax64(sa.data(), 0.37f, b, valid, &m1, &l1, oa.data(), 48);
          k.online_softmax64(s2.data(), 0.37f, b, valid, &m2, &l2, o2.data(), 48);
          ASSERT_EQ(m1, m2) << where << " m0 " << m0;
          ASSERT_NEAR(l1, l2, 2e-6f * std::abs(l1)) << where << " m0 " << m0;
          for (int c = 0; c < 64; ++c) ASSERT_NEAR(sa[c], s2[c], 1e-6f) << where << " col " << c;
          for (int e = 0; e < 48; ++e)
            ASSERT_NEAR(oa[e], o2[e], 1e-6f * (1.0f + std::abs(oa[e]))) << where << " o " << e;
        }
        for (bool dropout : {false, true}) {
          const float lse = 1.7f, dd = 0.3f;
          std::vector<float> p1 = s1, p2 = s1, ds1(64), ds2(64);
          ref.softmax_grad64(p1.data(), dp.data(), ds1.data(), 0.37f, b, valid, lse, dd, keep,
                             1.25f, dropout);
          k.softmax_grad64(p2.data(), dp.data(), ds2.data(), 0.37f, b, valid, lse, dd, keep, 1.25f,
                           dropout);
          for (int c = 0; c < 64; ++c) {
            ASSERT_NEAR(p1[c], p2[c], 1e-6f * (1.0f + std::abs(p1[c]))) << where << " pz col " << c;
            ASSERT_NEAR(ds1[c], ds2[c], 1e-5f * (1.0f + std::abs(ds1[c])))
                << where << " ds col " << c;
            if (c >= valid || (dropout && !((keep >> c) & 1u))) {
              ASSERT_EQ(p2[c], 0.0f) << where << " col " << c << " must be 0";
            }
          }
        }
      }
    }
  }
  if (tested == 0) GTEST_SKIP() << "no vector instruction set on this CPU";
}

// Lq = Lk = 16384: the backend's extra memory is its workspace (O(threads · tile)), nothing that
// grows like Lq·Lk; a backward at 4096 adds only per-thread dQ partials (O(threads · Lq · D)).
TEST(CpuBackend, MemoryStaysLinearAt16k) {
  if (!test::allocation_counting()) GTEST_SKIP() << "allocation counting is off in this build";
  const int threads = omp_get_max_threads();
  Config c = make(16384, 16384, 64, DType::f32);
  c.Hq = c.Hkv = 1;
  c.causal = CausalMode::top_left;  // half the work; the same buffers
  c.dropout = 0.1;
  Case t(c, 21);
  const std::size_t ws = workspace_size(t.args(), Pass::forward, test::only({"cpu"}));
  EXPECT_LE(ws, static_cast<std::size_t>(threads) * (256u << 10)) << "forward workspace " << ws;
  std::size_t allocated = 0;
  {
    test::AllocationCount count;
    t.run_forward("cpu");
    allocated = count.bytes();
  }
  const std::size_t score_bytes = std::size_t{16384} * 16384 * 4;
  EXPECT_LE(allocated, ws + (64u << 10)) << "allocated beyond the workspace";
  // Each thread's share stays below a thousandth of the Lq·Lk score matrix (the workspace is
  // per thread, so the total grows with the thread count, never with Lq·Lk).
  EXPECT_LT(allocated / static_cast<std::size_t>(threads) * 1000, score_bytes)
      << threads << " threads";
  // Spot-check rows against a direct double-precision computation of the same definition.
  const auto drop = dropout_threshold(c.dropout);
  for (std::int64_t i : {0, 5000, 16383}) {
    std::vector<double> s(static_cast<std::size_t>(i + 1));
    double m = -INFINITY;
    for (std::int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (std::int64_t e = 0; e < c.D; ++e) dot += t.q.get(i * c.D + e) * t.k.get(j * c.D + e);
      s[j] = dot / 8.0;
      m = std::max(m, s[j]);
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    for (std::int64_t e = 0; e < 4; ++e) {
      double o = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        if (dropout_keep(c.seed, c.offset, c.dropout, 1, 0, 0, i, j))
          o += s[j] * t.v.get(j * c.D + e);
      }
      o *= drop.keep_scale / sum;
      EXPECT_NEAR(t.out.get(i * c.D + e), o, 1e-4) << "row " << i << " col " << e;
    }
    EXPECT_NEAR(t.lse.get(i), m + std::log(sum), 1e-4);
  }

  Config cb = make(4096, 4096, 64, DType::f32);
  cb.Hq = cb.Hkv = 1;
  cb.dropout = 0.1;
  Case tb(cb, 22);
  tb.run_forward("cpu");
  const std::size_t wsb = workspace_size(tb.args(), Pass::backward, test::only({"cpu"}));
  EXPECT_LE(wsb, static_cast<std::size_t>(threads) * ((512u << 10) + 4096u * 64 * 4));
  {
    test::AllocationCount count;
    tb.run_backward("cpu");
    EXPECT_LE(count.bytes(), wsb + (64u << 10));
  }
  for (const HostTensor* g : {&tb.dq, &tb.dk, &tb.dv}) {
    for (std::int64_t i = 0; i < g->numel(); i += 97) ASSERT_TRUE(std::isfinite(g->get(i)));
  }
}

TEST(CpuBackend, UsesCallerWorkspaceAndRejectsASmallOne) {
  Config c = make(100, 150, 40, DType::bf16);
  c.dropout = 0.2;
  Case t(c, 31);
  Options o = test::only({"cpu"});
  const std::size_t ws = workspace_size(t.args(), Pass::forward, o);
  std::vector<std::uint8_t> buf(ws);
  o.workspace = buf.data();
  o.workspace_bytes = ws;
  {
    test::AllocationCount count;
    forward(t.args(), t.out.view, t.lse.view, o);
    if (test::allocation_counting()) {
      EXPECT_LT(count.bytes(), 16u << 10) << "allocated although a workspace was given";
    }
  }
  Case r(c, 31);
  r.run_forward("reference");
  expect_close(t.out, r.out, test::forward_tolerance(c.dtype, 150), "out");
  o.workspace_bytes = ws / 2;
  EXPECT_THROW(forward(t.args(), t.out.view, t.lse.view, o), Error);
}

}  // namespace
}  // namespace memeff
