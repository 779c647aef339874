// Packed variable-length sequences (AttentionArgs::packed) on the host: validation of the
// layout and of the offsets' values, the reference's packed run against the padded batch of the
// same sequences (one dropout mask: bit for bit), the cpu backend against the reference, and
// the edges (empty sequences, no sequences, strided views into a packed qkv buffer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/call_helpers.h"
#include "common/packed_case.h"
#include "common/tolerance.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::Case;
using test::expect_close;
using test::HostTensor;
using test::PackedCase;
using test::PackedConfig;

// Every element of `packed` rows equals the padded batch's rows, exactly.
void expect_rows_equal(const HostTensor& packed, const HostTensor& dense,
                       const std::vector<std::int32_t>& cu, const std::string& what) {
  HostTensor gathered = packed;
  for (std::int64_t i = 0; i < gathered.numel(); ++i) gathered.set(i, -12345.0);
  for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
    PackedCase::gather_rows(dense, static_cast<std::int64_t>(s), cu[s + 1] - cu[s], gathered,
                            cu[s]);
  }
  const test::Diff d = test::compare(packed, gathered);
  EXPECT_FALSE(d.nan) << what << ": NaN or non-finite mismatch at " << d.where(packed);
  EXPECT_EQ(d.max_abs, 0.0) << what << ": differs from the padded batch at " << d.where(packed);
}

void expect_lse_equal(const PackedCase& pc, const Case& pad) {
  const std::int64_t H = pc.cfg.Hq;
  for (std::int64_t s = 0; s < pc.cfg.sequences(); ++s) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t i = 0; i < pc.cu_q[s + 1] - pc.cu_q[s]; ++i) {
        const double a = pc.lse.get(h * pc.Tq + pc.cu_q[s] + i);
        const double b = pad.lse.get((s * H + h) * pad.cfg.Lq + i);
        ASSERT_TRUE(a == b || (std::isinf(a) && std::isinf(b) && a < 0 && b < 0))
            << "lse of sequence " << s << " head " << h << " row " << i << ": " << a << " vs " << b;
      }
    }
  }
}

std::vector<PackedConfig> mixed_configs() {
  std::vector<PackedConfig> out;
  PackedConfig a{.seqlens_q = {17, 1, 0, 65, 130}, .Hq = 4, .Hkv = 2, .D = 24, .Dv = 16};
  for (CausalMode m : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    for (double p : {0.0, 0.3}) {
      a.causal = m;
      a.dropout = p;
      out.push_back(a);
    }
  }
  // Keys of other lengths than the queries, per sequence.
  PackedConfig b{.seqlens_q = {5, 70, 3, 0}, .seqlens_k = {9, 66, 0, 4}, .dropout = 0.2};
  for (CausalMode m : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    b.causal = m;
    out.push_back(b);
  }
  return out;
}

TEST(PackedReference, EqualsThePaddedBatchBitForBit) {
  for (const PackedConfig& c : mixed_configs()) {
    SCOPED_TRACE(c.describe());
    PackedCase pc(c, 21);
    Case pad = pc.padded();
    pc.run_forward("reference");
    pad.run_forward("reference");
    expect_rows_equal(pc.out, pad.out, pc.cu_q, "out");
    expect_lse_equal(pc, pad);
    pc.run_backward("reference");
    pad.run_backward("reference");
    expect_rows_equal(pc.dq, pad.dq, pc.cu_q, "dq");
    expect_rows_equal(pc.dk, pad.dk, pc.cu_k, "dk");
    expect_rows_equal(pc.dv, pad.dv, pc.cu_k, "dv");
  }
}

TEST(PackedReference, DropoutDrawsTheMaskOfBatchIndexS) {
  // One sequence per position: sequence s must draw batch s's mask, not batch 0's. Two packed
  // sequences of equal inputs give different outputs with dropout, the same without.
  const PackedConfig c{.seqlens_q = {33, 33}, .dropout = 0.5};
  PackedCase pc(c, 5);
  for (std::int64_t t = 0; t < 33; ++t) {  // sequence 1 := sequence 0
    for (HostTensor* x : {&pc.q, &pc.k, &pc.v}) {
      const std::int64_t row = x->view.shape[1] * x->view.shape[2];
      for (std::int64_t e = 0; e < row; ++e) x->set((33 + t) * row + e, x->get(t * row + e));
    }
  }
  pc.run_forward("reference");
  const std::int64_t row = c.Hq * c.D;
  double diff = 0.0;
  for (std::int64_t e = 0; e < 33 * row; ++e)
    diff += std::abs(pc.out.get(e) - pc.out.get(33 * row + e));
  EXPECT_GT(diff, 0.0);
  pc.cfg.dropout = 0.0;
  pc.run_forward("reference");
  diff = 0.0;
  for (std::int64_t e = 0; e < 33 * row; ++e)
    diff += std::abs(pc.out.get(e) - pc.out.get(33 * row + e));
  EXPECT_EQ(diff, 0.0);
}

class PackedCpu : public ::testing::TestWithParam<DType> {};

TEST_P(PackedCpu, MatchesTheReference) {
  for (PackedConfig c : mixed_configs()) {
    c.dtype = GetParam();
    SCOPED_TRACE(c.describe());
    PackedCase ref(c, 31), cpu(c, 31);
    ref.run_forward("reference");
    EXPECT_EQ(cpu.run_forward("cpu").backend, "cpu");
    const std::int64_t red = std::max<std::int64_t>(c.D, ref.max_k);
    expect_close(cpu.out, ref.out, test::forward_tolerance(c.dtype, red), "out");
    expect_close(cpu.lse, ref.lse, test::forward_tolerance(DType::f32, red), "lse");
    cpu.out = ref.out;
    cpu.lse = ref.lse;
    ref.run_backward("reference");
    cpu.run_backward("cpu");
    // As the dense comparison (cpu_backend_test.cpp), with room for D_i from the rounded out.
    const test::Tolerance bt =
        test::backward_tolerance(c.dtype, std::max({c.D, ref.max_k, ref.max_q * (c.Hq / c.Hkv)}));
    const test::Tolerance wide{bt.atol + 64 * test::unit_roundoff(c.dtype), bt.rtol};
    expect_close(cpu.dq, ref.dq, wide, "dq");
    expect_close(cpu.dk, ref.dk, wide, "dk");
    expect_close(cpu.dv, ref.dv, bt, "dv");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PackedCpu, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(PackedCpuViews, StridedViewsIntoAPackedQkvBuffer) {
  // q, k, v as slices of one [T, 3, H, D] buffer (the layout of a fused qkv projection).
  const PackedConfig c{.seqlens_q = {40, 7, 90}, .causal = CausalMode::top_left, .dropout = 0.1};
  PackedCase ref(c, 8);
  const std::int64_t T = ref.Tq, H = c.Hq, D = c.D;
  HostTensor qkv(DType::f32, {T, 3, H, D});
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        const std::int64_t src = (t * H + h) * D + d;
        qkv.set(((t * 3 + 0) * H + h) * D + d, ref.q.get(src));
        qkv.set(((t * 3 + 1) * H + h) * D + d, ref.k.get(src));
        qkv.set(((t * 3 + 2) * H + h) * D + d, ref.v.get(src));
      }
  auto slice = [&](int which) {
    return TensorView::strided(static_cast<float*>(qkv.view.data) + which * H * D, DType::f32,
                               {T, H, D}, {3 * H * D, D, 1});
  };
  ref.run_forward("reference");
  PackedCase cpu(c, 8);
  AttentionArgs a = cpu.args();
  a.q = slice(0);
  a.k = slice(1);
  a.v = slice(2);
  forward(a, cpu.out.view, cpu.lse.view, test::only({"cpu"}));
  expect_close(cpu.out, ref.out, test::forward_tolerance(DType::f32, 90), "out");
}

class PackedEdges : public ::testing::TestWithParam<std::string> {};

TEST_P(PackedEdges, EmptySequencesAndNoSequences) {
  const std::string backend = GetParam();
  // Sequence 0: keys but no queries; 1: queries but no keys; 2: neither.
  PackedCase pc({.seqlens_q = {0, 3, 0}, .seqlens_k = {4, 0, 0}, .dropout = 0.2}, 3);
  pc.run_forward(backend);
  for (std::int64_t i = 0; i < pc.out.numel(); ++i) ASSERT_EQ(pc.out.get(i), 0.0);
  for (std::int64_t i = 0; i < pc.lse.numel(); ++i) ASSERT_TRUE(std::isinf(pc.lse.get(i)));
  pc.run_backward(backend);
  for (HostTensor* g : {&pc.dq, &pc.dk, &pc.dv})
    for (std::int64_t i = 0; i < g->numel(); ++i) ASSERT_EQ(g->get(i), 0.0);

  PackedCase empty({}, 3);  // S = 0: cu_seqlens = [0], empty tensors
  EXPECT_NO_THROW(empty.run_forward(backend));
  EXPECT_NO_THROW(empty.run_backward(backend));
}

INSTANTIATE_TEST_SUITE_P(HostBackends, PackedEdges, ::testing::Values("reference", "cpu"),
                         test::backend_name);

TEST(PackedValidation, OffsetsAndShapesAreNamed) {
  const PackedConfig c{.seqlens_q = {4, 6}};
  auto forward_with = [&](auto&& edit) {
    PackedCase pc(c, 1);
    AttentionArgs a = pc.args();
    HostTensor out = pc.out, lse = pc.lse;
    std::vector<std::int32_t> cu_q = pc.cu_q, cu_k = pc.cu_k;
    a.packed->cu_seqlens_q.data = cu_q.data();
    a.packed->cu_seqlens_k.data = cu_k.data();
    edit(a, cu_q, cu_k, out, lse);
    return test::error_message([&] { forward(a, out.view, lse.view); });
  };
  using V = std::vector<std::int32_t>;
  auto has = test::contains;
  EXPECT_TRUE(has(forward_with([](auto&, V& q, V&, auto&, auto&) { q[0] = 1; }), "`cu_seqlens_q`"));
  EXPECT_TRUE(has(forward_with([](auto&, V& q, V&, auto&, auto&) { q[2] = 3; }), "non-decreasing"));
  EXPECT_TRUE(has(forward_with([](auto&, V&, V& k, auto&, auto&) { k[2] = 9; }), "`cu_seqlens_k`"));
  EXPECT_TRUE(
      has(forward_with([](AttentionArgs& a, V&, V&, auto&, auto&) { a.packed->max_seqlen_q = 5; }),
          "`max_seqlen_q`"));
  EXPECT_TRUE(has(forward_with([](AttentionArgs& a, V&, V&, auto&, auto&) {
                    a.packed->cu_seqlens_k.shape[0] = 2;
                  }),
                  "`cu_seqlens_k`"));
  EXPECT_TRUE(has(forward_with([](AttentionArgs& a, V&, V&, auto&, auto&) {
                    a.packed->cu_seqlens_q.dtype = DType::f32;
                  }),
                  "`cu_seqlens_q`: expected dtype int32"));
  EXPECT_TRUE(has(forward_with([](AttentionArgs& a, V&, V&, auto&, auto&) { a.q.rank = 4; }),
                  "`q`: expected rank 3"));
  EXPECT_TRUE(has(forward_with([](AttentionArgs&, V&, V&, auto&, HostTensor& lse) {
                    lse = HostTensor(DType::f32, {1, 2, 10});
                  }),
                  "`lse`"));
  HostTensor bias(DType::f32, {1, 1, 1, 10});
  EXPECT_TRUE(has(forward_with([&](AttentionArgs& a, V&, V&, auto&, auto&) { a.bias = bias.view; }),
                  "`bias`: not supported with packed sequences"));
  EXPECT_EQ(forward_with([](auto&, V&, V&, auto&, auto&) {}), "");
}

TEST(PackedFlops, SumOfTheSequences) {
  EXPECT_EQ(attention_flops_packed({3, 5}, {4, 6}, 2, 8, CausalMode::none),
            attention_flops(1, 2, 3, 4, 8, CausalMode::none) +
                attention_flops(1, 2, 5, 6, 8, CausalMode::none));
  EXPECT_THROW(attention_flops_packed({3}, {4, 6}, 2, 8, CausalMode::none), Error);
}

}  // namespace
}  // namespace memeff
