// The fused forwards (cuda: mma.sync, every sm80+ GPU; cuda_sm90: the Hopper kernels) against the
// double-precision reference on the same rounded inputs and the same dropout mask: the awkward
// lengths, head dims, causal alignments, bias broadcasts, GQA, BLHD strides, fp16 and bf16. Every
// test runs once per backend. Outputs are poisoned with NaN first, so unwritten elements fail.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "cuda/device_tensor.h"
#include "common/tolerance.h"
#include "memeff/attention.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::HostTensor;
using test::Layout;
using test::DeviceTensor;
using test::cuda_device_present;

// The same values in double (the reference then adds no rounding of its own).
HostTensor f64_copy(const HostTensor& t) { return test::converted(t, DType::f64); }

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

struct Case {
  std::string backend = "cuda";
  DType dtype = DType::bf16;
  std::int64_t B = 1, Hq = 2, Hkv = 2, Lq = 64, Lk = 64, D = 64, Dv = 64;
  CausalMode causal = CausalMode::none;
  double p = 0.0;
  std::string bias = "none";  // "bhqk" with '1' for broadcast dims
  DType bias_dtype = DType::f32;
  Layout layout = Layout::bhld;
  std::uint64_t seed = 1234, offset = 0;
  double scale = std::numeric_limits<double>::quiet_NaN();  // NaN: the default 1/sqrt(D)

  std::string describe() const {
    std::ostringstream os;
    os << backend << " " << dtype_name(dtype) << " B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " Lq=" << Lq
       << " Lk=" << Lk << " D=" << D << " Dv=" << Dv << " causal=" << causal_mode_name(causal)
       << " p=" << p << " bias=" << bias
       << (bias != "none" ? std::string("/") + dtype_name(bias_dtype) : "")
       << (layout == Layout::blhd ? " blhd" : " bhld");
    return os.str();
  }
};

struct Result {
  HostTensor out, lse, ref_out, ref_lse;
};

Result run_case(const Case& c, std::uint64_t data_seed) {
  std::mt19937_64 rng(data_seed);
  HostTensor q(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout);
  HostTensor k(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout);
  HostTensor v(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv}, c.layout);
  test::fill_uniform(q, rng, -1.0, 1.0);
  test::fill_uniform(k, rng, -1.0, 1.0);
  test::fill_uniform(v, rng, -1.0, 1.0);
  HostTensor bias;
  if (c.bias != "none") {
    bias = HostTensor(c.bias_dtype, {c.bias[0] == '1' ? 1 : c.B, c.bias[1] == '1' ? 1 : c.Hq,
                                     c.bias[2] == '1' ? 1 : c.Lq, c.Lk});
    test::fill_uniform(bias, rng, -2.0, 2.0);
  }

  Result r;
  r.out = HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.Dv}, c.layout);
  r.lse = HostTensor(DType::f32, {c.B, c.Hq, c.Lq});
  test::poison(r.out);
  test::poison(r.lse);

  DeviceTensor dq(q), dk(k), dv(v), dout(r.out), dlse(r.lse);
  std::optional<DeviceTensor> dbias;
  AttentionArgs args;
  args.q = dq.view;
  args.k = dk.view;
  args.v = dv.view;
  if (c.bias != "none") {
    dbias.emplace(bias);
    args.bias = dbias->view;
  }
  if (!std::isnan(c.scale)) args.scale = c.scale;
  args.causal = c.causal;
  args.dropout_p = c.p;
  args.rng.seed = c.seed;
  args.rng.offset = c.offset;
  Options opt;
  opt.backends = {c.backend};
  const CallInfo info = forward(args, dout.view, dlse.view, opt);
  EXPECT_EQ(info.backend, c.backend);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("kernel failed");
  dout.copy_to(r.out);
  dlse.copy_to(r.lse);

  // Reference on the same rounded values, in double.
  HostTensor q64 = f64_copy(q), k64 = f64_copy(k), v64 = f64_copy(v), bias64;
  AttentionArgs ref = args;
  ref.q = q64.view;
  ref.k = k64.view;
  ref.v = v64.view;
  if (c.bias != "none") {
    bias64 = f64_copy(bias);
    ref.bias = bias64.view;
  }
  r.ref_out = HostTensor(DType::f64, {c.B, c.Hq, c.Lq, c.Dv});
  r.ref_lse = HostTensor(DType::f32, {c.B, c.Hq, c.Lq});
  Options ref_opt;
  ref_opt.backends = {"reference"};
  forward(ref, r.ref_out.view, r.ref_lse.view, ref_opt);
  return r;
}

void expect_matches(const Case& c, const Result& r) {
  const test::Diff d = test::compare(r.out, r.ref_out);
  const test::Tolerance tol = test::forward_tolerance(c.dtype, std::max(c.D, c.Lk));
  EXPECT_FALSE(d.nan) << c.describe() << ": NaN or non-finite mismatch in out at " << d.where(r.out);
  EXPECT_LE(d.max_abs, tol.bound(d.max_ref))
      << c.describe() << ": out differs by " << d.max_abs << " (max |ref| " << d.max_ref
      << ") at " << d.where(r.out);
  // lse: fp32 from fp32 scores; -inf exactly where the reference has it.
  double worst = 0.0;
  std::int64_t worst_i = -1;
  for (std::int64_t i = 0; i < r.lse.numel(); ++i) {
    const double a = r.lse.get(i), e = r.ref_lse.get(i);
    if (std::isinf(e) || std::isinf(a) || std::isnan(a)) {
      EXPECT_EQ(a, e) << c.describe() << ": lse[" << i << "]";
      continue;
    }
    const double err = std::abs(a - e) / (1.0 + std::abs(e));
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LE(worst, 2e-5) << c.describe() << ": lse differs at flat index " << worst_i;
}

void check_case(const Case& c, std::uint64_t data_seed = 7) {
  SCOPED_TRACE(c.describe());
  const Result r = run_case(c, data_seed);
  expect_matches(c, r);
}

class CudaForward : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string missing = test::gpu_backend_missing(GetParam());
    if (!missing.empty()) GTEST_SKIP() << missing;
  }
  // A case on this test's backend.
  Case make() const {
    Case c;
    c.backend = GetParam();
    return c;
  }
};

TEST_P(CudaForward, AwkwardLengthsSquare) {
  for (std::int64_t L : {1, 17, 64, 65, 127, 129, 1013}) {
    Case c = make();
    c.B = 2;
    c.Hq = c.Hkv = 3;
    c.Lq = c.Lk = L;
    check_case(c, 100 + static_cast<std::uint64_t>(L));
  }
}

TEST_P(CudaForward, LongSequenceCausalDropout) {
  Case c = make();
  c.Hq = c.Hkv = 2;
  c.Lq = c.Lk = 2048;
  c.D = c.Dv = 128;
  c.causal = CausalMode::top_left;
  c.p = 0.1;
  check_case(c);
}

TEST_P(CudaForward, HeadDimsBothDtypesUnequalLengths) {
  for (DType dt : {DType::bf16, DType::f16}) {
    for (std::int64_t D : {8, 40, 64, 80, 128, 256}) {
      Case c = make();
      c.dtype = dt;
      c.Lq = 129;
      c.Lk = 200;
      c.D = c.Dv = D;
      check_case(c, 200 + static_cast<std::uint64_t>(D));
    }
  }
}

TEST_P(CudaForward, ValueHeadDimDiffersFromKeyHeadDim) {
  for (auto [D, Dv] : {std::pair<std::int64_t, std::int64_t>{40, 80}, {128, 64}, {64, 256}}) {
    Case c = make();
    c.Lq = 70;
    c.Lk = 150;
    c.D = D;
    c.Dv = Dv;
    check_case(c);
  }
}

TEST_P(CudaForward, CausalBothAlignmentsWithDropoutOverManyKeyTiles) {
  for (CausalMode mode : {CausalMode::top_left, CausalMode::bottom_right}) {
    for (auto [Lq, Lk] : {std::pair<std::int64_t, std::int64_t>{200, 333}, {333, 200}, {257, 257}}) {
      for (std::int64_t D : {64, 128}) {
        Case c = make();
        c.Lq = Lq;
        c.Lk = Lk;
        c.D = c.Dv = D;
        c.causal = mode;
        c.p = 0.2;
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
    Case c = make();
    c.dtype = dt;
    c.B = 2;
    c.Hq = c.Hkv = 3;
    c.Lq = 100;
    c.Lk = 300;
    c.p = 0.5;
    c.seed = 0xDEADBEEFull;
    c.offset = 1ull << 33;
    check_case(c);
  }
}

TEST_P(CudaForward, BiasBroadcastEachWayBothDtypes) {
  for (const char* pattern : {"bhqk", "1hqk", "b1qk", "bh1k", "111k"}) {
    for (DType bias_dtype : {DType::f32, DType::bf16}) {
      Case c = make();
      c.B = 2;
      c.Hq = c.Hkv = 2;
      c.Lq = 65;
      c.Lk = 130;
      c.bias = pattern;
      c.bias_dtype = bias_dtype;
      c.causal = pattern[2] == '1' ? CausalMode::bottom_right : CausalMode::none;
      c.p = pattern[0] == '1' ? 0.1 : 0.0;
      check_case(c);
    }
  }
}

TEST_P(CudaForward, GroupedAndMultiQueryAttention) {
  for (std::int64_t Hkv : {1, 2}) {
    Case c = make();
    c.B = 2;
    c.Hq = 6;
    c.Hkv = Hkv;
    c.Lq = 90;
    c.Lk = 190;
    c.causal = CausalMode::bottom_right;
    c.p = 0.1;
    check_case(c);
  }
}

TEST_P(CudaForward, BlhdStridesBothDtypes) {
  for (DType dt : {DType::bf16, DType::f16}) {
    Case c = make();
    c.dtype = dt;
    c.layout = Layout::blhd;
    c.B = 2;
    c.Hq = 4;
    c.Hkv = 2;
    c.Lq = 150;
    c.Lk = 99;
    c.D = c.Dv = 128;
    c.causal = CausalMode::top_left;
    c.bias = "1hqk";
    check_case(c);
  }
}

TEST_P(CudaForward, NonPositiveAndLargeScales) {
  for (double scale : {-0.5, 0.0, 3.0}) {
    Case c = make();
    c.Lq = 70;
    c.Lk = 100;
    c.scale = scale;
    c.causal = CausalMode::top_left;
    check_case(c);
  }
}

TEST_P(CudaForward, NoKeysGiveZeroOutAndMinusInfLse) {
  Case c = make();
  c.Lq = 33;
  c.Lk = 0;
  const Result r = run_case(c, 3);
  for (std::int64_t i = 0; i < r.out.numel(); ++i) ASSERT_EQ(r.out.get(i), 0.0) << "out " << i;
  for (std::int64_t i = 0; i < r.lse.numel(); ++i) {
    ASSERT_EQ(r.lse.get(i), -std::numeric_limits<double>::infinity()) << "lse " << i;
  }
}

TEST_P(CudaForward, BottomRightRowsWithoutKeysGiveZeroAndMinusInf) {
  Case c = make();
  c.Lq = 200;
  c.Lk = 70;
  c.causal = CausalMode::bottom_right;
  c.p = 0.3;
  const Result r = run_case(c, 4);
  expect_matches(c, r);
  const std::int64_t empty_rows = c.Lq - c.Lk;  // query i sees keys j <= i - empty_rows
  for (std::int64_t h = 0; h < c.Hq; ++h) {
    for (std::int64_t i = 0; i < c.Lq; ++i) {
      const double lse = r.lse.get(h * c.Lq + i);
      if (i < empty_rows) {
        ASSERT_EQ(lse, -std::numeric_limits<double>::infinity()) << "h " << h << " row " << i;
        for (std::int64_t e = 0; e < c.Dv; ++e) {
          ASSERT_EQ(r.out.get((h * c.Lq + i) * c.Dv + e), 0.0) << "h " << h << " row " << i;
        }
      } else {
        ASSERT_TRUE(std::isfinite(lse)) << "h " << h << " row " << i;
      }
    }
  }
}

TEST_P(CudaForward, RefusesFp32WithAReason) {
  HostTensor q(DType::f32, {1, 1, 8, 64}), k(DType::f32, {1, 1, 8, 64}), v(DType::f32, {1, 1, 8, 64});
  HostTensor out(DType::f32, {1, 1, 8, 64}), lse(DType::f32, {1, 1, 8});
  DeviceTensor dq(q), dk(k), dv(v), dout(out), dlse(lse);
  AttentionArgs args;
  args.q = dq.view;
  args.k = dk.view;
  args.v = dv.view;
  Options opt;
  opt.backends = {GetParam()};
  try {
    forward(args, dout.view, dlse.view, opt);
    FAIL() << "fp32 inputs were accepted by the " << GetParam() << " backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("cuda_math"), std::string::npos) << e.what();
  }
}

TEST_P(CudaForward, EveryHeadDimBucketAndItsNeighbours) {
  // Multiples of 8 on both sides of each bucket (64, 96, 128, 256): padding inside the tile, a
  // second 64-column block that is partly outside the tensor, Dv != D.
  for (auto [D, Dv] : {std::pair<std::int64_t, std::int64_t>{16, 16}, {56, 56}, {72, 72}, {88, 96},
                       {96, 96}, {104, 104}, {136, 136}, {192, 192}, {248, 248}, {96, 160},
                       {256, 64}}) {
    Case c = make();
    c.B = 1;
    c.Hq = c.Hkv = 2;
    c.Lq = 150;
    c.Lk = 260;
    c.D = D;
    c.Dv = Dv;
    c.causal = CausalMode::bottom_right;
    c.p = 0.15;
    check_case(c, static_cast<std::uint64_t>(D * 1000 + Dv));
  }
}

TEST_P(CudaForward, ManyKeyTilesEachWayWithDropoutAndBias) {
  // More key tiles than the shared-memory ring has stages, in both causal modes, so every stage
  // is refilled several times; a full bias on top.
  for (CausalMode mode : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    for (std::int64_t D : {64, 128, 256}) {
      Case c = make();
      c.Lq = 300;
      c.Lk = 1100;
      c.D = c.Dv = D;
      c.causal = mode;
      c.p = 0.1;
      c.bias = D == 128 ? "bhqk" : "none";
      check_case(c, static_cast<std::uint64_t>(D) + 17 * static_cast<std::uint64_t>(mode));
    }
  }
}

TEST_P(CudaForward, MoreWorkItemsThanMultiprocessors) {
  // Several query blocks per SM (the persistent sm90 grid walks more than one work item per CTA):
  // bottom-right causal with Lq - Lk > 128 gives whole blocks that see no key between blocks that
  // do, so the K/V ring, the Q buffer and the ping-pong turns carry across items of every kind.
  {
    Case c = make();
    c.B = 2;
    c.Hq = 64;
    c.Hkv = 16;
    c.Lq = 400;
    c.Lk = 200;
    c.causal = CausalMode::bottom_right;
    c.p = 0.1;
    check_case(c, 71);
  }
  {
    Case c = make();
    c.B = 2;
    c.Hq = c.Hkv = 40;
    c.Lq = c.Lk = 256;
    c.D = c.Dv = 128;
    c.bias = "b1qk";
    c.p = 0.1;
    check_case(c, 72);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaForward, ::testing::Values("cuda", "cuda_sm90"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

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
  AttentionArgs args;
  args.q = dq.view;
  args.k = dk.view;
  args.v = dv.view;
  args.dropout_p = 0.1;
  EXPECT_EQ(forward(args, dout.view, dlse.view).backend, "cuda_sm90");
  const Explanation ex = explain(args, Pass::backward);
  EXPECT_EQ(ex.chosen, "cuda_sm90") << "the backward runs on the Hopper kernels too";
}

}  // namespace
}  // namespace memeff
