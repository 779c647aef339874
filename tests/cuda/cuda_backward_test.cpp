// The fused backwards (the mma.sync `cuda` kernels and the Hopper `cuda_sm90` ones) against the
// double-precision reference backward on the same rounded inputs and the same dropout mask:
// awkward lengths, Lq != Lk, head dims, causal both ways with dropout over many key tiles
// (PyTorch PR #103704's bug), bias broadcasts with dbias, GQA, BLHD strides, fp16 and bf16, seeds
// from device memory, rows that see a single key, and bitwise repeatable deterministic mode.
// Gradients are poisoned with NaN first, so unwritten elements fail. The cases and the reference
// are test::KernelCase (tests/common/kernel_case.h); the bar is test::fused_kernel_tolerance.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/attention_case.h"
#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "cuda/backward_check.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels/sm80/family.h"
#include "cuda/kernels/sm90/family.h"
#include "memeff/attention.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::DeviceTensor;
using test::HostTensor;
using test::KernelCase;
using test::Layout;

constexpr CausalMode kTopLeft = CausalMode::top_left, kBottomRight = CausalMode::bottom_right;

// The backward's case helpers (cuda/backward_check.h) under this file's names.
using test::bitwise_equal;
using test::BwdProblem;
using test::expect_grads_match;
using test::Grads;
Grads run_cuda(const KernelCase& c, const BwdProblem& pr) { return test::run_backward_case(c, pr); }
bool within(const test::Diff& d, DType dtype) { return test::within_fused_tolerance(d, dtype); }
void expect_close(const KernelCase& c, const char* name, const HostTensor& actual,
                  const HostTensor& ref) {
  test::expect_grad_close(c, name, actual, ref);
}
void check_case(const KernelCase& c, std::uint64_t data_seed = 11) {
  test::check_backward_case(c, data_seed);
}

class CudaBackward : public test::PerBackend {
 protected:
  // The case on this test's backend.
  KernelCase make(KernelCase c) const {
    c.backend = GetParam();
    return c;
  }
};

TEST_P(CudaBackward, AwkwardLengthsSquare) {
  for (std::int64_t L : {1, 17, 64, 65, 127, 129}) {
    check_case(make({.B = 2, .Lq = L, .Lk = L}), 100 + static_cast<std::uint64_t>(L));
  }
  check_case(make({.Hq = 1, .Hkv = 1, .Lq = 1013, .Lk = 1013}), 1013);
}

TEST_P(CudaBackward, QueryAndKeyLengthsDiffer) {
  const std::int64_t pairs[][2] = {{17, 129}, {129, 17}, {1, 300}, {300, 65}, {64, 1013}};
  for (const auto& [Lq, Lk] : pairs) {
    for (CausalMode causal : {CausalMode::none, kTopLeft, kBottomRight}) {
      check_case(make({.Lq = Lq, .Lk = Lk, .causal = causal}),
                 static_cast<std::uint64_t>(Lq * 7 + Lk));
    }
  }
}

TEST_P(CudaBackward, HeadDims) {
  const std::int64_t dims[][2] = {{8, 8},     {40, 40}, {64, 64},  {80, 80}, {128, 128},
                                  {256, 256}, {40, 72}, {128, 64}, {64, 200}};
  for (const auto& [D, Dv] : dims) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      KernelCase c =
          make({.Lq = 97, .Lk = 150, .D = D, .Dv = Dv, .causal = kBottomRight, .dropout = 0.1});
      c.dtype = dtype;
      check_case(c, static_cast<std::uint64_t>(D * 1000 + Dv));
    }
  }
}

// A row that sees exactly one key has softmax 1 whatever its score, so dS = 0 exactly: with
// Lk = 1 every dk and dbias element is exactly 0 (computed as P·(Z·dP − D) it would be the
// rounding residue of D taken on the stored output, up to about 4 here with dropout's 256/230),
// and with a top-left causal mask so is dbias of row 0. dv and dq still match the reference.
TEST_P(CudaBackward, SingleVisibleKeyGivesExactlyZeroDs) {
  for (double p : {0.0, 0.2}) {
    const KernelCase c = make({.B = 2, .Lq = 77, .Lk = 1, .bias = "bhqk", .dropout = p});
    SCOPED_TRACE(c.describe());
    const BwdProblem pr(c, 21);
    const Grads got = run_cuda(c, pr);
    for (std::int64_t i = 0; i < got.dk.numel(); ++i)
      ASSERT_EQ(got.dk.get(i), 0.0) << "dk[" << i << "]";
    for (std::int64_t i = 0; i < got.dbias->numel(); ++i) {
      ASSERT_EQ(got.dbias->get(i), 0.0) << "dbias[" << i << "]";
    }
    expect_close(c, "dv", got.dv, pr.ref.dv);
    expect_close(c, "dq", got.dq, pr.ref.dq);
  }
  const KernelCase c =
      make({.Lq = 200, .Lk = 200, .causal = kTopLeft, .bias = "bhqk", .dropout = 0.2});
  SCOPED_TRACE(c.describe());
  const BwdProblem pr(c, 22);
  const Grads got = run_cuda(c, pr);
  for (std::int64_t bh = 0; bh < c.B * c.Hq; ++bh) {  // element (b, h, 0, 0), row-major
    EXPECT_EQ(got.dbias->get(bh * c.Lq * c.Lk), 0.0) << "dbias[b·h = " << bh << ", 0, 0]";
  }
  expect_close(c, "dbias", *got.dbias, pr.ref.dbias);
  expect_close(c, "dk", got.dk, pr.ref.dk);
}

// PyTorch PR #103704: with causal masking and dropout, gradients went wrong once the keys span
// more than one tile, because the RNG was indexed relative to the tile. Our map uses absolute
// (i, j); the keys here span 2 to 16 tiles of every bucket, in both causal alignments.
TEST_P(CudaBackward, CausalDropoutAcrossKeyTiles) {
  for (std::int64_t Lk : {65, 129, 300, 1013}) {
    for (CausalMode causal : {kTopLeft, kBottomRight}) {
      for (std::int64_t Lq : {Lk, std::int64_t{100}}) {
        KernelCase c = make({.Lq = Lq, .Lk = Lk, .causal = causal, .dropout = 0.2});
        c.D = Lk == 300 ? 128 : 64;
        c.seed = 99 + static_cast<std::uint64_t>(Lk);
        c.offset = 12345;
        check_case(c, static_cast<std::uint64_t>(Lk + Lq));
      }
    }
  }
}

// The comparison above can tell masks apart: the reference with another seed disagrees.
TEST_P(CudaBackward, DropoutMaskMatters) {
  const KernelCase c = make({.Lq = 129, .Lk = 300, .causal = kTopLeft, .dropout = 0.2});
  KernelCase other_seed = c;
  other_seed.seed = c.seed + 1;
  const BwdProblem same(c, 5);
  const test::KernelReference other(other_seed, same.in);
  const Grads got = run_cuda(c, same);
  EXPECT_TRUE(within(test::compare(got.dv, same.ref.dv), c.dtype)) << c.describe();
  EXPECT_FALSE(within(test::compare(got.dv, other.dv), c.dtype))
      << c.describe() << ": another seed's gradients also pass; the test cannot see the mask";
  EXPECT_FALSE(within(test::compare(got.dq, other.dq), c.dtype)) << c.describe();
}

TEST_P(CudaBackward, BiasBroadcastsWithDbias) {
  // Patterns broadcast over queries (..1k) take the Hopper kernel's read-once-per-block path.
  for (const char* pattern : {"bhqk", "1hqk", "b1qk", "bh1k", "11qk", "1h1k", "b11k", "111k"}) {
    for (DType bias_dtype : {DType::f32, DType::bf16}) {
      for (double dropout : {0.1, 0.0}) {
        KernelCase c = make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 200, .causal = kTopLeft,
                             .dropout = dropout});
        c.bias = pattern;
        c.bias_dtype = bias_dtype;
        check_case(c, 77);
      }
    }
  }
}

TEST_P(CudaBackward, SixteenBitBiasOverQueriesManyBlocksEachHeadDim) {
  // A bias in the inputs' dtype that varies over queries, with row strides TMA can describe: the
  // Hopper backward loads it with each step's Q and dO into the step's dS buffer. Several query
  // and key blocks (both dS buffers reused many times), a GQA group, both causal alignments,
  // dropout, the bias gradient, fp16, and the deterministic mode.
  int seed = 400;
  for (std::int64_t D : {64, 128}) {
    for (const char* pattern : {"bhqk", "11qk"}) {
      for (CausalMode mode : {CausalMode::none, kTopLeft, kBottomRight}) {
        KernelCase c = make({.B = 2, .Hq = 6, .Hkv = 2, .Lq = 300, .Lk = 520, .D = D,
                             .causal = mode, .dropout = mode == kTopLeft ? 0.0 : 0.1});
        c.bias = pattern;
        c.bias_dtype = c.dtype;
        check_case(c, static_cast<std::uint64_t>(++seed));
      }
    }
  }
  KernelCase half = make({.B = 2, .Hq = 4, .Hkv = 4, .Lq = 130, .Lk = 264, .D = 128,
                          .causal = kBottomRight, .dropout = 0.1, .dtype = DType::f16});
  half.bias = "1hqk";
  half.bias_dtype = DType::f16;
  check_case(half, 431);
  half.deterministic = true;
  check_case(half, 432);
}

TEST_P(CudaBackward, GroupedQueryHeads) {
  for (std::int64_t Hkv : {2, 1}) {
    KernelCase c = make(
        {.B = 2, .Hq = 8, .Hkv = Hkv, .Lq = 65, .Lk = 190, .causal = kBottomRight, .dropout = 0.1});
    c.bias = "1h1k";
    check_case(c, 31 + static_cast<std::uint64_t>(Hkv));
  }
}

TEST_P(CudaBackward, BlhdStridesAndHalf) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (std::int64_t D : {64, 128}) {
      KernelCase c =
          make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 129, .Lk = 127, .D = D, .causal = kTopLeft});
      c.bias = "b1qk";
      c.bias_dtype = dtype;
      c.dropout = 0.15;
      c.dtype = dtype;
      c.layout = Layout::blhd;
      check_case(c, 55 + static_cast<std::uint64_t>(D));
    }
  }
}

TEST_P(CudaBackward, SeedAndOffsetFromDeviceMemory) {
  KernelCase c = make({.Lq = 100, .Lk = 200, .dropout = 0.25});
  c.seed = 0x1234567890ull;
  c.offset = (std::uint64_t{1} << 40) + 3;
  c.device_rng = true;
  check_case(c, 9);
}

// Deterministic mode: two runs give the same bits (dq and broadcast dbias accumulate across
// CTAs), and the result still matches the reference. Under a causal mask each CTA walks its
// query blocks from the last (common/block_order.h's BackwardWalk), without one from the first;
// "11qk" and "bh1k" sum dbias across CTAs, one CTA per launch. Both head-dim buckets of the
// Hopper tile: its writer warps add each step's dQ staged in the dO and dS buffers (64 x 64 of
// 128 queries by 128 keys at head dim 64, the whole of 64 by 128 at head dim 128). With and
// without dropout, and a 16-bit "1hqk" bias that comes in tiles: the deterministic mode has its
// own instantiation of each kernel.
TEST_P(CudaBackward, DeterministicIsBitwiseRepeatable) {
  struct Case {
    const char* pattern;
    CausalMode causal;
    std::int64_t D;
    double dropout;
  };
  const Case cases[] = {
      {"none", kBottomRight, 64, 0.1},      {"none", kBottomRight, 128, 0.0},
      {"none", kTopLeft, 128, 0.1},         {"none", CausalMode::none, 64, 0.0},
      {"none", CausalMode::none, 128, 0.1}, {"11qk", kBottomRight, 64, 0.1},
      {"bh1k", kBottomRight, 128, 0.0},     {"1hqk", CausalMode::none, 128, 0.0},
      {"1hqk", kTopLeft, 64, 0.1}};
  for (const auto& [pattern, causal, D, dropout] : cases) {
    KernelCase c = make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 300, .Lk = 260, .D = D,
                         .causal = causal, .bias = pattern});
    if (std::string(pattern) == "1hqk") c.bias_dtype = c.dtype;
    c.dropout = dropout;
    c.deterministic = true;
    SCOPED_TRACE(c.describe());
    const BwdProblem pr(c, 3);
    const Grads first = run_cuda(c, pr);
    const Grads second = run_cuda(c, pr);
    EXPECT_TRUE(bitwise_equal(first.dq, second.dq)) << "dq differs between runs";
    EXPECT_TRUE(bitwise_equal(first.dk, second.dk)) << "dk differs between runs";
    EXPECT_TRUE(bitwise_equal(first.dv, second.dv)) << "dv differs between runs";
    if (c.has_bias()) {
      EXPECT_TRUE(bitwise_equal(*first.dbias, *second.dbias)) << "dbias differs between runs";
    }
    expect_grads_match(c, first, pr.ref);
  }
}

// Several key blocks, query blocks and GQA heads per CTA at once, both dtypes, with dropout: the
// shapes the Hopper kernel's pipelines (Q/dO ring, dS double buffer, dQ staging) cycle through.
TEST_P(CudaBackward, ManyBlocksGroupedWithDropout) {
  for (std::int64_t D : {64, 128}) {
    for (CausalMode causal : {CausalMode::none, kBottomRight}) {
      KernelCase c =
          make({.B = 2, .Hq = 6, .Hkv = 2, .Lq = 600, .Lk = 520, .D = D, .causal = causal});
      c.dropout = 0.1;
      c.dtype = D == 64 ? DType::f16 : DType::bf16;
      check_case(c, 500 + static_cast<std::uint64_t>(D));
    }
  }
}

// The persistent grid (head dim 64's kernel without dropout, no causal mask, three or more query
// blocks per tile and more tiles than SMs: bwd_run.cuh): one CTA per SM takes every gridDim.x-th
// (key block, head), so a CTA walks tiles of different heads, batches and key blocks (ragged last
// ones) one after another, its Q/dO ring going on across them and its dK, dV leaving through the
// K, V buffers the next tile reloads. 192 tiles (GQA), and 576 tiles whose last query block has 4
// rows (about four per CTA). With dropout, and with two query blocks (197 queries), the same
// shapes take one CTA per tile.
TEST_P(CudaBackward, PersistentGridTakesEveryTileOnce) {
  for (double dropout : {0.0, 0.15}) {
    KernelCase c = make({.B = 4, .Hq = 12, .Hkv = 6, .Lq = 333, .Lk = 900, .D = 64});
    c.dropout = dropout;
    c.dtype = DType::bf16;
    check_case(c, 730);
  }
  for (const std::int64_t Lq : {260, 197}) {
    KernelCase c = make({.B = 4, .Hq = 16, .Hkv = 16, .Lq = Lq, .Lk = 1100, .D = 64});
    check_case(c, 740 + static_cast<std::uint64_t>(Lq));
  }
}

// Causal grids in bands of heads (common/block_order.h): 16 (batch, kv) heads of 33 key blocks
// (Lk 4200: the backward's grid, bands of 8 on a 132-SM card) or 32 (batch, query) heads of 33
// query blocks (Lq 4200: the forward's, which the case runs first), each band walked block by
// block. Every block must still run once, and the deterministic mode's turns must still come in
// order (out of order, a turn waits forever).
TEST_P(CudaBackward, CausalGridsInBandsOfHeads) {
  for (const auto& [Lq, Lk] : {std::pair<std::int64_t, std::int64_t>{64, 4200}, {4200, 64}}) {
    KernelCase c = make({.B = 4, .Hq = 8, .Hkv = 4, .Lq = Lq, .Lk = Lk, .causal = kBottomRight});
    c.dropout = 0.1;
    check_case(c, 700);
    c.causal = kTopLeft;
    c.deterministic = true;
    check_case(c, 710);
  }
}

// Head dims 129-256 (cuda_sm90: the wide tile, bwd_wide_kernel.cuh, 64 keys per CTA and 64
// queries per step split between its warpgroups): many key and query blocks of each GQA head
// with dropout under both causal alignments, head dims padded up to 256 (160, 192) and D != Dv,
// odd lengths, fp16, and the deterministic mode bitwise repeatable.
TEST_P(CudaBackward, WideHeadDims) {
  std::uint64_t seed = 800;
  for (CausalMode causal : {CausalMode::none, kTopLeft, kBottomRight}) {
    KernelCase c = make({.B = 2, .Hq = 6, .Hkv = 2, .Lq = 300, .Lk = 270, .D = 256,
                         .causal = causal, .dropout = causal == kTopLeft ? 0.0 : 0.1});
    c.dtype = causal == kBottomRight ? DType::f16 : DType::bf16;
    check_case(c, ++seed);
  }
  const std::int64_t dims[][2] = {{160, 160}, {192, 128}, {136, 256}};
  for (const auto& [D, Dv] : dims) {
    check_case(make({.Lq = 77, .Lk = 200, .D = D, .Dv = Dv, .causal = kTopLeft, .dropout = 0.2}),
               ++seed);
  }
  KernelCase c = make(
      {.B = 2, .Hq = 4, .Hkv = 1, .Lq = 330, .Lk = 260, .D = 256, .causal = kBottomRight});
  c.dropout = 0.1;
  c.deterministic = true;
  SCOPED_TRACE(c.describe());
  const BwdProblem pr(c, ++seed);
  const Grads first = run_cuda(c, pr);
  const Grads second = run_cuda(c, pr);
  EXPECT_TRUE(bitwise_equal(first.dq, second.dq)) << "dq differs between runs";
  EXPECT_TRUE(bitwise_equal(first.dk, second.dk)) << "dk differs between runs";
  EXPECT_TRUE(bitwise_equal(first.dv, second.dv)) << "dv differs between runs";
  expect_grads_match(c, first, pr.ref);
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaBackward, ::testing::Values("cuda", "cuda_sm90"),
                         test::backend_name);

// On compute capability 9.0 the default order runs the backward on cuda_sm90 where it has a
// tile (every head dim up to 256; above 128 the wide tile, without a bias), and on the mma.sync
// kernels otherwise, saying why.
TEST(CudaBackwardDispatch, HopperBackwardByDefaultWhereItHasATile) {
  if (!test::cuda_device_is_sm90()) GTEST_SKIP() << "needs compute capability 9.0";
  for (std::int64_t D : {64, 96, 128, 256}) {
    for (bool with_bias : {false, true}) {
      KernelCase c{.Lq = 130, .Lk = 130, .D = D, .dropout = 0.1};
      if (with_bias) c.bias = "b11k";
      const BwdProblem pr(c, 1);
      DeviceTensor q(pr.in.q), k(pr.in.k), v(pr.in.v), dout(*pr.in.dout), o(pr.out),
          lse(pr.ref.lse);
      std::optional<DeviceTensor> bias;
      if (with_bias) bias.emplace(*pr.in.bias);
      HostTensor hq(c.dtype, {c.B, c.Hq, c.Lq, c.D}), hk(c.dtype, {c.B, c.Hkv, c.Lk, c.D}),
          hv(c.dtype, {c.B, c.Hkv, c.Lk, c.dv()});
      DeviceTensor dq(hq), dk(hk), dv(hv);
      const AttentionArgs args =
          c.args(q.view, k.view, v.view,
                 bias ? std::optional<TensorView>(bias->view) : std::nullopt);
      std::optional<DeviceTensor> dbias;
      if (with_bias) dbias.emplace(HostTensor(c.bias_dtype, c.bias_shape()));
      const CallInfo info = backward(
          args, {dout.view, o.view, lse.view, dq.view, dk.view, dv.view,
                 dbias ? std::optional<TensorView>(dbias->view) : std::nullopt});
      const bool hopper = D <= 128 || !with_bias;
      EXPECT_EQ(info.backend, hopper ? "cuda_sm90" : "cuda") << "D = " << D << " bias "
                                                             << with_bias;
      if (!hopper) {
        const std::string text = explain(args, Pass::backward).to_string();
        EXPECT_NE(text.find("wide tile, which takes no bias"), std::string::npos) << text;
      }
    }
  }
}

// A bias with scale <= 0: the fused backwards clamp a score before the bias, which needs a
// positive scale, so they refuse it with a reason and the default order runs cuda_math, whose
// gradients match the reference (its -inf entries masking whatever the score holds).
TEST(CudaBackwardDispatch, ABiasWithANonPositiveScaleRunsOnCudaMath) {
  if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  for (double scale : {-0.5, 0.0}) {
    const KernelCase c{.Lq = 70, .Lk = 90, .bias = "b11k", .scale = scale};
    SCOPED_TRACE(c.describe());
    const BwdProblem pr(c, 3);
    DeviceTensor q(pr.in.q), k(pr.in.k), v(pr.in.v), dout(*pr.in.dout), o(pr.out), lse(pr.ref.lse);
    DeviceTensor bias(*pr.in.bias);
    HostTensor hq(c.dtype, {c.B, c.Hq, c.Lq, c.D}), hk(c.dtype, {c.B, c.Hkv, c.Lk, c.D}),
        hv(c.dtype, {c.B, c.Hkv, c.Lk, c.dv()});
    DeviceTensor dq(hq), dk(hk), dv(hv);
    const AttentionArgs args = c.args(q.view, k.view, v.view, bias.view);
    const std::string text = explain(args, Pass::backward).to_string();
    EXPECT_NE(text.find("needs a positive scale"), std::string::npos) << text;
    const CallInfo info =
        backward(args, {dout.view, o.view, lse.view, dq.view, dk.view, dv.view, {}});
    EXPECT_EQ(info.backend, "cuda_math");
    Grads got{hq, hk, hv, std::nullopt};
    dq.copy_to(got.dq);
    dk.copy_to(got.dk);
    dv.copy_to(got.dv);
    expect_grads_match(c, got, pr.ref);
  }
}

// The parameters of a one-head 16 × 16 call with these head dims.
cuda::BackwardParams one_head_params(int D, int Dv) {
  cuda::BackwardParams p;
  p.B = 1;
  p.Hq = p.Hkv = 1;
  p.group = 1;
  p.Lq = p.Lk = 16;
  p.D = D;
  p.Dv = Dv;
  return p;
}

// Sizes the kernels cannot take are refused with a reason, not run.
TEST(CudaBackwardReasons, RefusesWhatItCannotRun) {
  cuda::BackwardParams p = one_head_params(36, 264);
  const std::vector<std::string> reasons = cuda::sm80::Family::backward_reasons(p, {7, 5});
  ASSERT_EQ(reasons.size(), 3u);
  EXPECT_NE(reasons[0].find("8.0"), std::string::npos) << reasons[0];
  EXPECT_NE(reasons[1].find("D = 36"), std::string::npos) << reasons[1];
  EXPECT_NE(reasons[2].find("Dv = 264"), std::string::npos) << reasons[2];
  p.D = p.Dv = 64;
  EXPECT_TRUE(cuda::sm80::Family::backward_reasons(p, {9, 0}).empty());
  p.q_stride.l = 68;  // not a multiple of 8 elements
  EXPECT_EQ(cuda::sm80::Family::backward_reasons(p, {9, 0}).size(), 1u);
}

// A dense call's key blocks are the grid's y (common/block_order.h): more than 65535 of them are
// refused by name; packed calls have no such bound.
TEST(CudaBackwardReasons, DenseGridsHoldAtMost65535KeyBlocks) {
  cuda::BackwardParams p = one_head_params(64, 64);
  for (bool hopper : {false, true}) {
    SCOPED_TRACE(hopper ? "cuda_sm90" : "cuda");
    auto reasons = [&] {
      return hopper ? cuda::sm90::Family::backward_reasons(p, {9, 0})
                    : cuda::sm80::Family::backward_reasons(p, {9, 0});
    };
    p.Lk = std::int64_t{65535} * 64;  // the fewest keys per CTA of either family
    for (const std::string& r : reasons()) EXPECT_EQ(r.find("key blocks"), std::string::npos) << r;
    p.Lk = std::int64_t{65536} * 128 + 1;
    std::string all;
    for (const std::string& r : reasons()) all += r + "\n";
    EXPECT_NE(all.find("Lk = 8388609 exceeds the grid's 65535 key blocks"), std::string::npos)
        << all;
  }
}

// The wide tile (head dims 129-256) takes the plain dense step only: a bias, a score modifier or
// packed sequences are refused by name (the `cuda` backend runs them); its key blocks are 64
// keys, so a dense grid's bound is 65535·64 keys.
TEST(CudaBackwardReasons, WideTileTakesThePlainDenseStepOnly) {
  if (!cuda::sm90::kernels_built()) GTEST_SKIP() << "no sm_90a code in this build";
  cuda::BackwardParams p = one_head_params(160, 256);
  EXPECT_TRUE(cuda::sm90::Family::backward_reasons(p, {9, 0}).empty());
  auto all = [&] {
    std::string text;
    for (const std::string& r : cuda::sm90::Family::backward_reasons(p, {9, 0})) text += r + "\n";
    return text;
  };
  float bias = 0.0f;
  p.bias = &bias;
  EXPECT_NE(all().find("head dims above 128 (D = 160, Dv = 256) run on the wide tile, which takes "
                       "no bias"),
            std::string::npos)
      << all();
  p.bias = nullptr;
  p.dbias_shape[0] = p.dbias_shape[1] = 1;  // params from the problem alone: its dbias's shape
  p.dbias_shape[2] = 16;
  EXPECT_NE(all().find("takes no bias"), std::string::npos) << all();
  p.dbias_shape[0] = p.dbias_shape[1] = p.dbias_shape[2] = 0;
  p.mods.flags = cuda::ScoreMods::kAlibi;
  EXPECT_NE(all().find("takes no window, ALiBi or softcap"), std::string::npos) << all();
  p.mods.flags = 0;
  p.Lk = std::int64_t{65535} * 64;
  EXPECT_TRUE(cuda::sm90::Family::backward_reasons(p, {9, 0}).empty()) << all();
  p.Lk += 1;
  EXPECT_NE(all().find("65535 key blocks of 64 keys"), std::string::npos) << all();
  p.D = p.Dv = 128;  // the 128-key tile
  EXPECT_TRUE(cuda::sm90::Family::backward_reasons(p, {9, 0}).empty()) << all();
}

TEST(CudaBackwardReasons, HopperRefusesWhatItCannotRun) {
  cuda::BackwardParams p = one_head_params(64, 264);
  std::vector<std::string> reasons = cuda::sm90::Family::backward_reasons(p, {8, 0});
  ASSERT_GE(reasons.size(), 2u);
  std::string all;
  for (const std::string& r : reasons) all += r + "\n";
  EXPECT_NE(all.find("9.0"), std::string::npos) << all;
  EXPECT_NE(all.find("Dv = 264"), std::string::npos) << all;
  p.Dv = 64;
  if (cuda::sm90::kernels_built()) {
    EXPECT_TRUE(cuda::sm90::Family::backward_reasons(p, {9, 0}).empty());
  }
  p.dq_stride.l = 68;  // not a multiple of 8 elements
  reasons = cuda::sm90::Family::backward_reasons(p, {9, 0});
  ASSERT_FALSE(reasons.empty());
  EXPECT_NE(reasons.back().find("dq strides"), std::string::npos) << reasons.back();
}

}  // namespace
}  // namespace memeff
