// The fused forwards (cuda: mma.sync, every sm80+ GPU; cuda_sm90: the Hopper kernels) against the
// double-precision reference on the same rounded inputs and the same dropout mask: the awkward
// lengths, head dims, causal alignments, bias broadcasts, GQA, BLHD strides, scales, fp16 and
// bf16. Every test runs once per backend. Outputs are poisoned with NaN first, so unwritten
// elements fail. The cases and the reference are test::KernelCase (tests/common/kernel_case.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/call_helpers.h"
#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "common/tolerance.h"
#include "cuda/device_tensor.h"
#include "cuda/forward_check.h"
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

using Result = test::ForwardResult;

Result run_case(const KernelCase& c, std::uint64_t data_seed) {
  return test::run_forward_case(c, data_seed);
}

void expect_matches(const KernelCase& c, const Result& r) { test::expect_forward_matches(c, r); }

void check_case(const KernelCase& c, std::uint64_t data_seed = 7) {
  SCOPED_TRACE(c.describe());
  const Result r = run_case(c, data_seed);
  expect_matches(c, r);
}

class CudaForward : public test::PerBackend {
 protected:
  // The case on this test's backend.
  KernelCase make(KernelCase c) const {
    c.backend = GetParam();
    return c;
  }
};

TEST_P(CudaForward, AwkwardLengthsSquare) {
  for (std::int64_t L : {1, 17, 64, 65, 127, 129, 1013}) {
    check_case(make({.B = 2, .Hq = 3, .Hkv = 3, .Lq = L, .Lk = L}),
               100 + static_cast<std::uint64_t>(L));
  }
}

TEST_P(CudaForward, LongSequenceCausalDropout) {
  check_case(make({.Lq = 2048, .Lk = 2048, .D = 128, .causal = kTopLeft, .dropout = 0.1}));
}

TEST_P(CudaForward, HeadDimsBothDtypesUnequalLengths) {
  for (DType dt : {DType::bf16, DType::f16}) {
    for (std::int64_t D : {8, 40, 64, 80, 128, 256}) {
      check_case(make({.Lq = 129, .Lk = 200, .D = D, .dtype = dt}),
                 200 + static_cast<std::uint64_t>(D));
    }
  }
}

TEST_P(CudaForward, ValueHeadDimDiffersFromKeyHeadDim) {
  for (auto [D, Dv] : {std::pair<std::int64_t, std::int64_t>{40, 80}, {128, 64}, {64, 256}}) {
    check_case(make({.Lq = 70, .Lk = 150, .D = D, .Dv = Dv}));
  }
}

TEST_P(CudaForward, CausalBothAlignmentsWithDropoutOverManyKeyTiles) {
  for (CausalMode mode : {kTopLeft, kBottomRight}) {
    for (auto [Lq, Lk] :
         {std::pair<std::int64_t, std::int64_t>{200, 333}, {333, 200}, {257, 257}}) {
      for (std::int64_t D : {64, 128}) {
        KernelCase c = make({.Lq = Lq, .Lk = Lk, .D = D, .causal = mode, .dropout = 0.2});
        c.seed = 99;
        c.offset = 5;
        check_case(c, static_cast<std::uint64_t>(Lq * 7 + Lk + D));
      }
    }
  }
}

TEST_P(CudaForward, DropoutMatchesTheDocumentedMask) {
  // A large p makes any disagreement with dropout_mask (used by the reference) far exceed the
  // tolerance; several heads and batches exercise bh in the counter.
  for (DType dt : {DType::bf16, DType::f16}) {
    KernelCase c =
        make({.B = 2, .Hq = 3, .Hkv = 3, .Lq = 100, .Lk = 300, .dropout = 0.5, .dtype = dt});
    c.seed = 0xDEADBEEFull;
    c.offset = 1ull << 33;
    check_case(c);
  }
}

TEST_P(CudaForward, BiasBroadcastEachWayBothDtypes) {
  for (const char* pattern : {"bhqk", "1hqk", "b1qk", "bh1k", "111k"}) {
    for (DType bias_dtype : {DType::f32, DType::bf16}) {
      KernelCase c = make({.B = 2, .Lq = 65, .Lk = 130, .bias = pattern, .bias_dtype = bias_dtype});
      c.causal = pattern[2] == '1' ? kBottomRight : CausalMode::none;
      c.dropout = pattern[0] == '1' ? 0.1 : 0.0;
      check_case(c);
    }
  }
}

TEST_P(CudaForward, GroupedAndMultiQueryAttention) {
  for (std::int64_t Hkv : {1, 2}) {
    const KernelCase c = make(
        {.B = 2, .Hq = 6, .Hkv = Hkv, .Lq = 90, .Lk = 190, .causal = kBottomRight, .dropout = 0.1});
    check_case(c);
  }
}

TEST_P(CudaForward, BlhdStridesBothDtypes) {
  for (DType dt : {DType::bf16, DType::f16}) {
    KernelCase c = make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 150, .Lk = 99, .D = 128, .bias = "1hqk"});
    c.causal = kTopLeft;
    c.dtype = dt;
    c.layout = Layout::blhd;
    check_case(c);
  }
}

TEST_P(CudaForward, NonPositiveAndLargeScales) {
  for (double scale : {-0.5, 0.0, 3.0}) {
    check_case(make({.Lq = 70, .Lk = 100, .causal = kTopLeft, .scale = scale}));
  }
}

TEST_P(CudaForward, NoKeysGiveZeroOutAndMinusInfLse) {
  const Result r = run_case(make({.Lq = 33, .Lk = 0}), 3);
  for (std::int64_t i = 0; i < r.out.numel(); ++i) ASSERT_EQ(r.out.get(i), 0.0) << "out " << i;
  for (std::int64_t i = 0; i < r.lse.numel(); ++i) {
    ASSERT_EQ(r.lse.get(i), -std::numeric_limits<double>::infinity()) << "lse " << i;
  }
}

TEST_P(CudaForward, BottomRightRowsWithoutKeysGiveZeroAndMinusInf) {
  const KernelCase c = make({.Lq = 200, .Lk = 70, .causal = kBottomRight, .dropout = 0.3});
  const Result r = run_case(c, 4);
  expect_matches(c, r);
  const std::int64_t empty_rows = c.Lq - c.Lk;  // query i sees keys j <= i - empty_rows
  for (std::int64_t h = 0; h < c.Hq; ++h) {
    for (std::int64_t i = 0; i < c.Lq; ++i) {
      const double lse = r.lse.get(h * c.Lq + i);
      if (i < empty_rows) {
        ASSERT_EQ(lse, -std::numeric_limits<double>::infinity()) << "h " << h << " row " << i;
        for (std::int64_t e = 0; e < c.dv(); ++e) {
          ASSERT_EQ(r.out.get((h * c.Lq + i) * c.dv() + e), 0.0) << "h " << h << " row " << i;
        }
      } else {
        ASSERT_TRUE(std::isfinite(lse)) << "h " << h << " row " << i;
      }
    }
  }
}

TEST_P(CudaForward, RefusesFp32WithAReason) {
  HostTensor q(DType::f32, {1, 1, 8, 64}), k(DType::f32, {1, 1, 8, 64}),
      v(DType::f32, {1, 1, 8, 64});
  HostTensor out(DType::f32, {1, 1, 8, 64}), lse(DType::f32, {1, 1, 8});
  DeviceTensor dq(q), dk(k), dv(v), dout(out), dlse(lse);
  const test::Thrown thrown = test::thrown_by([&] {
    forward(test::attention_args(dq, dk, dv), dout.view, dlse.view, test::only({GetParam()}));
  });
  ASSERT_TRUE(thrown.error) << "fp32 inputs were accepted by the " << GetParam() << " backend";
  EXPECT_EQ(thrown.code, ErrorCode::unsupported);
  EXPECT_TRUE(test::contains(thrown.message, "cuda_math")) << thrown.message;
}

TEST_P(CudaForward, EveryHeadDimBucketAndItsNeighbours) {
  // Multiples of 8 on both sides of each bucket (64, 96, 128, 256): padding inside the tile, a
  // second 64-column block that is partly outside the tensor, Dv != D.
  const std::int64_t dims[][2] = {{16, 16},   {56, 56},   {72, 72},   {88, 96},
                                  {96, 96},   {104, 104}, {136, 136}, {192, 192},
                                  {248, 248}, {96, 160},  {256, 64}};
  for (const auto& [D, Dv] : dims) {
    const KernelCase c =
        make({.Lq = 150, .Lk = 260, .D = D, .Dv = Dv, .causal = kBottomRight, .dropout = 0.15});
    check_case(c, static_cast<std::uint64_t>(D * 1000 + Dv));
  }
}

TEST_P(CudaForward, ManyKeyTilesEachWayWithDropoutAndBias) {
  // More key tiles than the shared-memory ring has stages, in both causal modes, so every stage
  // is refilled several times; a full bias on top.
  for (CausalMode mode : {CausalMode::none, kTopLeft, kBottomRight}) {
    for (std::int64_t D : {64, 128, 256}) {
      KernelCase c = make({.Lq = 300, .Lk = 1100, .D = D, .causal = mode, .dropout = 0.1});
      c.bias = D == 128 ? "bhqk" : "none";
      check_case(c, static_cast<std::uint64_t>(D) + 17 * static_cast<std::uint64_t>(mode));
    }
  }
}

TEST_P(CudaForward, ManyKeyTilesAndItemsWithAKeyPaddingBias) {
  // A bias broadcast over queries (the Hopper forward stages it in shared memory, one key tile
  // ahead): many key tiles in each causal mode and head dim, a partial last tile, and more work
  // items than SMs so the staging buffers carry across items (the non-finite cases have the
  // -inf entries of a padding mask).
  for (CausalMode mode : {CausalMode::none, kTopLeft, kBottomRight}) {
    for (std::int64_t D : {64, 128, 256}) {
      KernelCase c = make({.Lq = 300, .Lk = 1100, .D = D, .causal = mode, .dropout = 0.1});
      c.bias = D == 128 ? "1h1k" : "b11k";
      check_case(c, static_cast<std::uint64_t>(D) + 19 * static_cast<std::uint64_t>(mode) + 5);
    }
  }
  KernelCase many = make({.B = 3, .Hq = 48, .Hkv = 12, .Lq = 200, .Lk = 333, .dropout = 0.1});
  many.bias = "b11k";
  check_case(many, 73);
  many.dropout = 0.0;
  check_case(many, 74);
}

TEST_P(CudaForward, SixteenBitBiasOverQueriesEveryHeadDimCausalModeAndBroadcast) {
  // A bias in the inputs' dtype that varies over queries, with row strides TMA can describe (Lk
  // a multiple of 8): the Hopper forward loads it in tiles beside K and V. Partial query blocks
  // and key tiles (zero-filled by TMA), every broadcast of B and H, each head-dim bucket, both
  // causal alignments, dropout, and more work items than SMs so the bias ring carries across
  // items; Lk = 130 (not describable) keeps the per-score path.
  int seed = 300;
  for (std::int64_t D : {64, 96, 128, 256}) {
    for (const char* pattern : {"bhqk", "1hqk", "b1qk", "11qk"}) {
      for (DType dt : {DType::bf16, DType::f16}) {
        KernelCase c = make({.B = 2,
                             .Hq = 3,
                             .Hkv = 3,
                             .Lq = 300,
                             .Lk = 1104,
                             .D = D,
                             .bias = pattern,
                             .bias_dtype = dt});
        c.dtype = dt;
        c.causal = D == 96 ? kTopLeft : D == 256 ? kBottomRight : CausalMode::none;
        c.dropout = pattern[0] == '1' ? 0.1 : 0.0;
        check_case(c, static_cast<std::uint64_t>(++seed));
      }
    }
  }
  for (std::int64_t Lk : {8, 128, 200, 130}) {
    KernelCase c = make({.B = 2, .Lq = 65, .Lk = Lk, .bias = "bhqk", .bias_dtype = DType::bf16});
    check_case(c, static_cast<std::uint64_t>(++seed));
  }
  KernelCase many = make({.B = 3, .Hq = 48, .Hkv = 12, .Lq = 200, .Lk = 336, .dropout = 0.1});
  many.bias = "1hqk";
  many.bias_dtype = many.dtype;
  check_case(many, 75);
  many.causal = kTopLeft;
  many.dropout = 0.0;
  check_case(many, 76);
}

TEST_P(CudaForward, MoreWorkItemsThanMultiprocessors) {
  // Several query blocks per SM (the persistent sm90 grid walks more than one work item per CTA):
  // bottom-right causal with Lq - Lk > 128 gives whole blocks that see no key between blocks that
  // do, so the K/V ring, the Q buffer and the ping-pong turns carry across items of every kind.
  const KernelCase many_heads = make(
      {.B = 2, .Hq = 64, .Hkv = 16, .Lq = 400, .Lk = 200, .causal = kBottomRight, .dropout = 0.1});
  check_case(many_heads, 71);
  KernelCase head_dim_128 =
      make({.B = 2, .Hq = 40, .Hkv = 40, .Lq = 256, .Lk = 256, .D = 128, .dropout = 0.1});
  head_dim_128.bias = "b1qk";
  check_case(head_dim_128, 72);
  // Items whose costs differ (a causal mask, a one-sided window): the sm90 grid's CTAs take each
  // item after their first from a counter, so a CTA's items are not known in advance; every head
  // dim bucket, with and without dropout, a key-padding bias and bias tiles, and a right-bounded
  // window (the modifiers' kernels) with items that see no key at the end of the grid.
  std::uint64_t seed = 80;
  for (std::int64_t D : {64, 96, 128, 256}) {
    KernelCase causal = make({.B = 2, .Hq = 32, .Hkv = 8, .Lq = 520, .Lk = 520, .D = D,
                              .causal = kTopLeft, .dropout = D == 96 ? 0.1 : 0.0});
    check_case(causal, ++seed);
  }
  KernelCase padded = make({.B = 3, .Hq = 48, .Hkv = 48, .Lq = 300, .Lk = 300,
                            .causal = kTopLeft, .dropout = 0.1});
  padded.bias = "b11k";
  check_case(padded, ++seed);
  padded.bias = "1hqk";
  padded.bias_dtype = padded.dtype;
  padded.dropout = 0.0;
  check_case(padded, ++seed);
  KernelCase window = make({.B = 2, .Hq = 40, .Hkv = 10, .Lq = 700, .Lk = 384, .D = 128});
  window.window = {.left = -1, .right = 0};
  window.causal = kBottomRight;
  check_case(window, ++seed);
}

TEST_P(CudaForward, HeadDim64WideTileMatchesTheReference) {
  // Head dim 64 without dropout or bias takes the sm90 forward's three-consumer tile (192-row
  // items) where those items fill the rows (sm90::forward_takes_wide_tile): exact items over
  // more items than SMs, a last item partly past Lq with Lk != Lq, GQA, fp16, and long causal
  // calls of both alignments, bottom-right with rows that see no key.
  KernelCase exact = make({.B = 4, .Hq = 16, .Hkv = 16, .Lq = 576, .Lk = 576});
  check_case(exact, 77);
  KernelCase tail = make({.B = 2, .Hq = 6, .Hkv = 2, .Lq = 1000, .Lk = 777, .D = 48});
  check_case(tail, 78);
  tail.dtype = DType::f16;
  check_case(tail, 79);
  KernelCase causal = make({.B = 1, .Hq = 4, .Hkv = 1, .Lq = 2048, .Lk = 2048, .causal = kTopLeft});
  check_case(causal, 80);
  KernelCase bottom_right =
      make({.B = 1, .Hq = 3, .Hkv = 3, .Lq = 2300, .Lk = 2100, .causal = kBottomRight});
  check_case(bottom_right, 81);
}

TEST_P(CudaForward, CausalWorkspaceIsTheCallersOrItsOwn) {
  // The sm90 forward of a causal call asks for a workspace (its walk's counter); one without a
  // causal mask does not. A caller's workspace of that size serves it, a smaller one is named.
  if (GetParam() != std::string("cuda_sm90") || !test::cuda_device_is_sm90()) {
    GTEST_SKIP() << "the Hopper forward's workspace";
  }
  HostTensor q(DType::bf16, {2, 40, 384, 64}), k(DType::bf16, {2, 40, 384, 64}),
      v(DType::bf16, {2, 40, 384, 64});
  HostTensor out(DType::bf16, {2, 40, 384, 64}), lse(DType::f32, {2, 40, 384});
  std::mt19937_64 rng(9);
  for (HostTensor* t : {&q, &k, &v}) test::fill_uniform(*t, rng);
  DeviceTensor dq(q), dk(k), dv(v), dout(out), dlse(lse);
  AttentionArgs args = test::attention_args(dq, dk, dv);
  Options opt = test::only({"cuda_sm90"});
  EXPECT_EQ(workspace_size(args, Pass::forward, opt), 0u) << "no causal mask";
  args.causal = kTopLeft;
  const std::size_t bytes = workspace_size(args, Pass::forward, opt);
  ASSERT_GT(bytes, 0u) << "the causal walk's counter";
  EXPECT_EQ(forward(args, dout.view, dlse.view, opt).backend, "cuda_sm90");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint8_t> own = dout.bytes_on_host();
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0x7F, bytes), cudaSuccess);  // whatever it held before
  opt.workspace = ws;
  opt.workspace_bytes = bytes;
  for (int repeat = 0; repeat < 3; ++repeat) {
    EXPECT_EQ(forward(args, dout.view, dlse.view, opt).backend, "cuda_sm90");
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dout.bytes_on_host() == own) << "the items' results do not depend on their CTA";
  }
  opt.workspace_bytes = bytes - 1;
  const test::Thrown small = test::thrown_by([&] { forward(args, dout.view, dlse.view, opt); });
  EXPECT_TRUE(small.error && test::contains(small.message, "workspace_bytes")) << small.message;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(ws);
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaForward, ::testing::Values("cuda", "cuda_sm90"),
                         test::backend_name);

TEST(CudaDispatch, HopperForwardRunsByDefaultOnComputeCapability90) {
  if (!test::cuda_device_is_sm90()) GTEST_SKIP() << "needs compute capability 9.0";
  HostTensor q(DType::bf16, {1, 2, 64, 64}), k(DType::bf16, {1, 2, 64, 64}),
      v(DType::bf16, {1, 2, 64, 64});
  HostTensor out(DType::bf16, {1, 2, 64, 64}), lse(DType::f32, {1, 2, 64});
  std::mt19937_64 rng(5);
  test::fill_uniform(q, rng);
  test::fill_uniform(k, rng);
  test::fill_uniform(v, rng);
  DeviceTensor dq(q), dk(k), dv(v), dout(out), dlse(lse);
  AttentionArgs args = test::attention_args(dq, dk, dv);
  args.dropout_p = 0.1;
  EXPECT_EQ(forward(args, dout.view, dlse.view).backend, "cuda_sm90");
  const Explanation ex = explain(args, Pass::backward);
  EXPECT_EQ(ex.chosen, "cuda_sm90") << "the backward runs on the Hopper kernels too";
}

}  // namespace
}  // namespace memeff
