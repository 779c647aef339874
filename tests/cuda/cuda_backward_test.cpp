// The fused backwards (the mma.sync `cuda` kernels and the Hopper `cuda_sm90` ones) against the
// double-precision reference backward on the same rounded inputs and the same dropout mask:
// awkward lengths, Lq != Lk, head dims, causal both ways with dropout over many key tiles
// (PyTorch PR #103704's bug), bias broadcasts with dbias, GQA, BLHD strides, fp16 and bf16, seeds
// from device memory, rows that see a single key, and bitwise repeatable deterministic mode.
// Gradients are poisoned with NaN first, so unwritten elements fail.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/host_tensor.h"
#include "cuda/device_tensor.h"
#include "cuda/kernels/sm80/family.h"
#include "cuda/kernels/sm90/family.h"
#include "memeff/attention.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::cuda_device_present;
using test::DeviceTensor;
using test::HostTensor;
using test::Layout;

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
  bool deterministic = false;
  bool device_rng = false;  // seed and offset from device memory

  std::string describe() const {
    std::ostringstream os;
    os << backend << " " << dtype_name(dtype) << " B=" << B << " Hq=" << Hq << " Hkv=" << Hkv
       << " Lq=" << Lq << " Lk=" << Lk << " D=" << D << " Dv=" << Dv
       << " causal=" << causal_mode_name(causal) << " p=" << p << " bias=" << bias
       << (bias != "none" ? std::string("/") + dtype_name(bias_dtype) : "")
       << (layout == Layout::blhd ? " blhd" : " bhld") << (deterministic ? " deterministic" : "")
       << (device_rng ? " device-rng" : "");
    return os.str();
  }
};

// Inputs, the reference's gradients (double) and the cuda backend's (storage dtype).
struct Grads {
  HostTensor dq, dk, dv, dbias;
};
struct BwdProblem {
  HostTensor q, k, v, bias, dout, out, lse;
  Grads ref;
};

BwdProblem make_problem(const Case& c, std::uint64_t data_seed, std::uint64_t ref_seed) {
  std::mt19937_64 rng(data_seed);
  BwdProblem pr;
  pr.q = HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout);
  pr.k = HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout);
  pr.v = HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv}, c.layout);
  pr.dout = HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.Dv}, c.layout);
  test::fill_uniform(pr.q, rng, -1.0, 1.0);
  test::fill_uniform(pr.k, rng, -1.0, 1.0);
  test::fill_uniform(pr.v, rng, -1.0, 1.0);
  test::fill_uniform(pr.dout, rng, -1.0, 1.0);
  if (c.bias != "none") {
    pr.bias = HostTensor(c.bias_dtype, {c.bias[0] == '1' ? 1 : c.B, c.bias[1] == '1' ? 1 : c.Hq,
                                        c.bias[2] == '1' ? 1 : c.Lq, c.Lk});
    test::fill_uniform(pr.bias, rng, -2.0, 2.0);
  }
  // Reference forward and backward on the same rounded values, in double.
  HostTensor q64 = test::converted(pr.q, DType::f64), k64 = test::converted(pr.k, DType::f64),
             v64 = test::converted(pr.v, DType::f64), dout64 = test::converted(pr.dout, DType::f64),
             bias64;
  AttentionArgs args;
  args.q = q64.view;
  args.k = k64.view;
  args.v = v64.view;
  if (c.bias != "none") {
    bias64 = test::converted(pr.bias, DType::f64);
    args.bias = bias64.view;
  }
  args.causal = c.causal;
  args.dropout_p = c.p;
  args.rng.seed = ref_seed;
  args.rng.offset = c.offset;
  HostTensor out64(DType::f64, {c.B, c.Hq, c.Lq, c.Dv});
  pr.lse = HostTensor(DType::f32, {c.B, c.Hq, c.Lq});
  Options ref_opt;
  ref_opt.backends = {"reference"};
  forward(args, out64.view, pr.lse.view, ref_opt);
  pr.out = test::converted(out64, c.dtype, c.layout);

  pr.ref.dq = HostTensor(DType::f64, {c.B, c.Hq, c.Lq, c.D});
  pr.ref.dk = HostTensor(DType::f64, {c.B, c.Hkv, c.Lk, c.D});
  pr.ref.dv = HostTensor(DType::f64, {c.B, c.Hkv, c.Lk, c.Dv});
  BackwardTensors g;
  g.dout = dout64.view;
  g.out = out64.view;
  g.lse = pr.lse.view;
  g.dq = pr.ref.dq.view;
  g.dk = pr.ref.dk.view;
  g.dv = pr.ref.dv.view;
  if (c.bias != "none") {
    std::vector<std::int64_t> shape(pr.bias.view.shape.begin(), pr.bias.view.shape.begin() + 4);
    pr.ref.dbias = HostTensor(DType::f64, shape);
    g.dbias = pr.ref.dbias.view;
  }
  backward(args, g, ref_opt);
  return pr;
}

// Runs the case's backend's backward on device copies of the problem's inputs.
Grads run_cuda(const Case& c, const BwdProblem& pr) {
  Grads out;
  out.dq = HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout);
  out.dk = HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout);
  out.dv = HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv}, c.layout);
  test::poison(out.dq);
  test::poison(out.dk);
  test::poison(out.dv);
  DeviceTensor q(pr.q), k(pr.k), v(pr.v), dout(pr.dout), o(pr.out), lse(pr.lse), dq(out.dq),
      dk(out.dk), dv(out.dv);
  std::optional<DeviceTensor> bias, dbias;
  AttentionArgs args;
  args.q = q.view;
  args.k = k.view;
  args.v = v.view;
  if (c.bias != "none") {
    bias.emplace(pr.bias);
    args.bias = bias->view;
    out.dbias = HostTensor(pr.bias);
    test::poison(out.dbias);
    dbias.emplace(out.dbias);
  }
  args.causal = c.causal;
  args.dropout_p = c.p;
  std::uint64_t* rng_dev = nullptr;
  if (c.device_rng) {
    const std::uint64_t vals[2] = {c.seed, c.offset};
    if (cudaMalloc(&rng_dev, sizeof vals) != cudaSuccess ||
        cudaMemcpy(rng_dev, vals, sizeof vals, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("device rng state");
    }
    args.rng.seed = c.seed ^ 0xDEADBEEFull;  // must be ignored
    args.rng.offset = c.offset + 977;
    args.rng.device_seed = rng_dev;
    args.rng.device_offset = rng_dev + 1;
  } else {
    args.rng.seed = c.seed;
    args.rng.offset = c.offset;
  }
  BackwardTensors g;
  g.dout = dout.view;
  g.out = o.view;
  g.lse = lse.view;
  g.dq = dq.view;
  g.dk = dk.view;
  g.dv = dv.view;
  if (dbias) g.dbias = dbias->view;
  Options opt;
  opt.backends = {c.backend};
  opt.deterministic = c.deterministic;
  const CallInfo info = backward(args, g, opt);
  EXPECT_EQ(info.backend, c.backend);
  const cudaError_t err = cudaDeviceSynchronize();
  if (rng_dev) cudaFree(rng_dev);
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("kernel failed: ") + cudaGetErrorString(err));
  dq.copy_to(out.dq);
  dk.copy_to(out.dk);
  dv.copy_to(out.dv);
  if (dbias) dbias->copy_to(out.dbias);
  return out;
}

// Relative tolerance (to max |reference|) per storage dtype: one rounding of dS and of the
// output plus fp32 accumulation.
double rel_tolerance(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 5e-3; }

bool within(const test::Diff& d, DType dtype) {
  return !d.nan && d.max_abs <= 1e-5 + rel_tolerance(dtype) * d.max_ref;
}

void expect_close(const Case& c, const char* name, const HostTensor& actual,
                  const HostTensor& ref) {
  test::expect_close(actual, ref, test::Tolerance{1e-5, rel_tolerance(c.dtype)},
                     c.describe() + ": " + name);
}

void check_case(const Case& c, std::uint64_t data_seed = 11) {
  SCOPED_TRACE(c.describe());
  const BwdProblem pr = make_problem(c, data_seed, c.seed);
  const Grads got = run_cuda(c, pr);
  expect_close(c, "dq", got.dq, pr.ref.dq);
  expect_close(c, "dk", got.dk, pr.ref.dk);
  expect_close(c, "dv", got.dv, pr.ref.dv);
  if (c.bias != "none") expect_close(c, "dbias", got.dbias, pr.ref.dbias);
}

bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  return a.storage.size() == b.storage.size() &&
         std::memcmp(a.storage.data(), b.storage.data(), a.storage.size()) == 0;
}

class CudaBackward : public ::testing::TestWithParam<std::string> {
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
  // Whether this backend has a kernel for these head dims (the Hopper backward: up to 128).
  bool runs_head_dims(std::int64_t D, std::int64_t Dv) const {
    return GetParam() != "cuda_sm90" || (D <= 128 && Dv <= 128);
  }
};

TEST_P(CudaBackward, AwkwardLengthsSquare) {
  for (std::int64_t L : {1, 17, 64, 65, 127, 129}) {
    Case c = make();
    c.B = 2;
    c.Hq = c.Hkv = 2;
    c.Lq = c.Lk = L;
    check_case(c, 100 + static_cast<std::uint64_t>(L));
  }
  Case big = make();
  big.Hq = big.Hkv = 1;
  big.Lq = big.Lk = 1013;
  check_case(big, 1013);
}

TEST_P(CudaBackward, QueryAndKeyLengthsDiffer) {
  const std::int64_t pairs[][2] = {{17, 129}, {129, 17}, {1, 300}, {300, 65}, {64, 1013}};
  for (const auto& lens : pairs) {
    for (CausalMode causal : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
      Case c = make();
      c.Lq = lens[0];
      c.Lk = lens[1];
      c.causal = causal;
      check_case(c, static_cast<std::uint64_t>(lens[0] * 7 + lens[1]));
    }
  }
}

TEST_P(CudaBackward, HeadDims) {
  const std::int64_t dims[][2] = {{8, 8},     {40, 40}, {64, 64},  {80, 80}, {128, 128},
                                  {256, 256}, {40, 72}, {128, 64}, {64, 200}};
  for (const auto& d : dims) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      Case c = make();
      c.dtype = dtype;
      c.D = d[0];
      c.Dv = d[1];
      c.Lq = 97;
      c.Lk = 150;
      c.causal = CausalMode::bottom_right;
      c.p = 0.1;
      if (!runs_head_dims(c.D, c.Dv)) continue;  // RefusesHeadDimsAbove128 checks the reason
      check_case(c, static_cast<std::uint64_t>(d[0] * 1000 + d[1]));
    }
  }
}

// A row that sees exactly one key has softmax 1 whatever its score, so dS = 0 exactly: with
// Lk = 1 every dk and dbias element is exactly 0 (computed as P·(Z·dP − D) it would be the
// rounding residue of D taken on the stored output, up to about 4 here with dropout's 256/230),
// and with a top-left causal mask so is dbias of row 0. dv and dq still match the reference.
TEST_P(CudaBackward, SingleVisibleKeyGivesExactlyZeroDs) {
  for (double p : {0.0, 0.2}) {
    Case c = make();
    c.B = 2;
    c.Hq = c.Hkv = 2;
    c.Lq = 77;
    c.Lk = 1;
    c.p = p;
    c.bias = "bhqk";
    SCOPED_TRACE(c.describe());
    const BwdProblem pr = make_problem(c, 21, c.seed);
    const Grads got = run_cuda(c, pr);
    for (std::int64_t i = 0; i < got.dk.numel(); ++i)
      ASSERT_EQ(got.dk.get(i), 0.0) << "dk[" << i << "]";
    for (std::int64_t i = 0; i < got.dbias.numel(); ++i) {
      ASSERT_EQ(got.dbias.get(i), 0.0) << "dbias[" << i << "]";
    }
    expect_close(c, "dv", got.dv, pr.ref.dv);
    expect_close(c, "dq", got.dq, pr.ref.dq);
  }
  Case c = make();
  c.Lq = c.Lk = 200;
  c.causal = CausalMode::top_left;
  c.p = 0.2;
  c.bias = "bhqk";
  SCOPED_TRACE(c.describe());
  const BwdProblem pr = make_problem(c, 22, c.seed);
  const Grads got = run_cuda(c, pr);
  for (std::int64_t bh = 0; bh < c.B * c.Hq; ++bh) {  // element (b, h, 0, 0), row-major
    EXPECT_EQ(got.dbias.get(bh * c.Lq * c.Lk), 0.0) << "dbias[b·h = " << bh << ", 0, 0]";
  }
  expect_close(c, "dbias", got.dbias, pr.ref.dbias);
  expect_close(c, "dk", got.dk, pr.ref.dk);
}

// PyTorch PR #103704: with causal masking and dropout, gradients went wrong once the keys span
// more than one tile, because the RNG was indexed relative to the tile. Our map uses absolute
// (i, j); the keys here span 2 to 16 tiles of every bucket, in both causal alignments.
TEST_P(CudaBackward, CausalDropoutAcrossKeyTiles) {
  for (std::int64_t Lk : {65, 129, 300, 1013}) {
    for (CausalMode causal : {CausalMode::top_left, CausalMode::bottom_right}) {
      for (std::int64_t Lq : {Lk, std::int64_t{100}}) {
        Case c = make();
        c.Lq = Lq;
        c.Lk = Lk;
        c.causal = causal;
        c.p = 0.2;
        c.D = c.Dv = Lk == 300 ? 128 : 64;
        c.seed = 99 + static_cast<std::uint64_t>(Lk);
        c.offset = 12345;
        check_case(c, static_cast<std::uint64_t>(Lk + Lq));
      }
    }
  }
}

// The comparison above can tell masks apart: the reference with another seed disagrees.
TEST_P(CudaBackward, DropoutMaskMatters) {
  Case c = make();
  c.Lq = 129;
  c.Lk = 300;
  c.causal = CausalMode::top_left;
  c.p = 0.2;
  const BwdProblem same = make_problem(c, 5, c.seed);
  const BwdProblem other = make_problem(c, 5, c.seed + 1);
  const Grads got = run_cuda(c, same);
  EXPECT_TRUE(within(test::compare(got.dv, same.ref.dv), c.dtype)) << c.describe();
  EXPECT_FALSE(within(test::compare(got.dv, other.ref.dv), c.dtype))
      << c.describe() << ": another seed's gradients also pass; the test cannot see the mask";
  EXPECT_FALSE(within(test::compare(got.dq, other.ref.dq), c.dtype)) << c.describe();
}

TEST_P(CudaBackward, BiasBroadcastsWithDbias) {
  for (const char* pattern : {"bhqk", "1hqk", "b1qk", "bh1k", "11qk", "1h1k", "b11k", "111k"}) {
    for (DType bias_dtype : {DType::f32, DType::bf16}) {
      Case c = make();
      c.B = 2;
      c.Hq = 4;
      c.Hkv = 2;
      c.Lq = 70;
      c.Lk = 200;
      c.bias = pattern;
      c.bias_dtype = bias_dtype;
      c.causal = CausalMode::top_left;
      c.p = 0.1;
      check_case(c, 77);
    }
  }
}

TEST_P(CudaBackward, GroupedQueryHeads) {
  for (std::int64_t Hkv : {2, 1}) {
    Case c = make();
    c.B = 2;
    c.Hq = 8;
    c.Hkv = Hkv;
    c.Lq = 65;
    c.Lk = 190;
    c.causal = CausalMode::bottom_right;
    c.p = 0.1;
    c.bias = "1h1k";
    check_case(c, 31 + static_cast<std::uint64_t>(Hkv));
  }
}

TEST_P(CudaBackward, BlhdStridesAndHalf) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (std::int64_t D : {64, 128}) {
      Case c = make();
      c.dtype = dtype;
      c.layout = Layout::blhd;
      c.B = 2;
      c.Hq = 4;
      c.Hkv = 2;
      c.Lq = 129;
      c.Lk = 127;
      c.D = c.Dv = D;
      c.causal = CausalMode::top_left;
      c.p = 0.15;
      c.bias = "b1qk";
      c.bias_dtype = dtype;
      check_case(c, 55 + static_cast<std::uint64_t>(D));
    }
  }
}

TEST_P(CudaBackward, SeedAndOffsetFromDeviceMemory) {
  Case c = make();
  c.Lq = 100;
  c.Lk = 200;
  c.p = 0.25;
  c.seed = 0x1234567890ull;
  c.offset = (std::uint64_t{1} << 40) + 3;
  c.device_rng = true;
  check_case(c, 9);
}

// Deterministic mode: two runs give the same bits (dq and broadcast dbias accumulate across
// CTAs), and the result still matches the reference.
TEST_P(CudaBackward, DeterministicIsBitwiseRepeatable) {
  for (const char* pattern : {"none", "11qk", "bh1k"}) {
    Case c = make();
    c.B = 2;
    c.Hq = 4;
    c.Hkv = 2;
    c.Lq = 300;
    c.Lk = 260;
    c.causal = CausalMode::bottom_right;
    c.p = 0.1;
    c.bias = pattern;
    c.deterministic = true;
    SCOPED_TRACE(c.describe());
    const BwdProblem pr = make_problem(c, 3, c.seed);
    const Grads first = run_cuda(c, pr);
    const Grads second = run_cuda(c, pr);
    EXPECT_TRUE(bitwise_equal(first.dq, second.dq)) << "dq differs between runs";
    EXPECT_TRUE(bitwise_equal(first.dk, second.dk)) << "dk differs between runs";
    EXPECT_TRUE(bitwise_equal(first.dv, second.dv)) << "dv differs between runs";
    if (c.bias != "none") {
      EXPECT_TRUE(bitwise_equal(first.dbias, second.dbias)) << "dbias differs between runs";
    }
    expect_close(c, "dq", first.dq, pr.ref.dq);
    expect_close(c, "dk", first.dk, pr.ref.dk);
    expect_close(c, "dv", first.dv, pr.ref.dv);
    if (c.bias != "none") expect_close(c, "dbias", first.dbias, pr.ref.dbias);
  }
}

// Several key blocks, query blocks and GQA heads per CTA at once, both dtypes, with dropout: the
// shapes the Hopper kernel's pipelines (Q/dO ring, dS double buffer, dQ staging) cycle through.
TEST_P(CudaBackward, ManyBlocksGroupedWithDropout) {
  for (std::int64_t D : {64, 128}) {
    for (CausalMode causal : {CausalMode::none, CausalMode::bottom_right}) {
      Case c = make();
      c.B = 2;
      c.Hq = 6;
      c.Hkv = 2;
      c.Lq = 600;
      c.Lk = 520;
      c.D = c.Dv = D;
      c.causal = causal;
      c.p = 0.1;
      c.dtype = D == 64 ? DType::f16 : DType::bf16;
      check_case(c, 500 + static_cast<std::uint64_t>(D));
    }
  }
}

// On compute capability 9.0 the default order runs the backward on cuda_sm90 where it has a
// tile, and on the mma.sync kernels otherwise (head dims above 128), saying why.
TEST(CudaBackwardDispatch, HopperBackwardByDefaultWhereItHasATile) {
  if (!test::cuda_device_is_sm90()) GTEST_SKIP() << "needs compute capability 9.0";
  for (std::int64_t D : {64, 96, 128, 256}) {
    Case c;
    c.D = c.Dv = D;
    c.Lq = c.Lk = 130;
    c.p = 0.1;
    const BwdProblem pr = make_problem(c, 1, c.seed);
    DeviceTensor q(pr.q), k(pr.k), v(pr.v), dout(pr.dout), o(pr.out), lse(pr.lse);
    HostTensor hq(c.dtype, {c.B, c.Hq, c.Lq, c.D}), hk(c.dtype, {c.B, c.Hkv, c.Lk, c.D}),
        hv(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv});
    DeviceTensor dq(hq), dk(hk), dv(hv);
    AttentionArgs args;
    args.q = q.view;
    args.k = k.view;
    args.v = v.view;
    args.dropout_p = c.p;
    args.rng.seed = c.seed;
    const CallInfo info =
        backward(args, {dout.view, o.view, lse.view, dq.view, dk.view, dv.view, {}});
    EXPECT_EQ(info.backend, D <= 128 ? "cuda_sm90" : "cuda") << "D = " << D;
    if (D > 128) {
      const std::string text = explain(args, Pass::backward).to_string();
      EXPECT_NE(text.find("up to 128"), std::string::npos) << text;
    }
  }
}

// Sizes the kernels cannot take are refused with a reason, not run.
TEST(CudaBackwardReasons, RefusesWhatItCannotRun) {
  cuda::BackwardParams p;
  p.B = 1;
  p.Hq = p.Hkv = 1;
  p.group = 1;
  p.Lq = p.Lk = 16;
  p.D = 36;
  p.Dv = 264;
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

TEST(CudaBackwardReasons, HopperRefusesWhatItCannotRun) {
  cuda::BackwardParams p;
  p.B = 1;
  p.Hq = p.Hkv = 1;
  p.group = 1;
  p.Lq = p.Lk = 16;
  p.D = 64;
  p.Dv = 256;
  std::vector<std::string> reasons = cuda::sm90::Family::backward_reasons(p, {8, 0});
  ASSERT_GE(reasons.size(), 2u);
  const std::string all = [&] {
    std::string joined;
    for (const std::string& r : reasons) joined += r + "\n";
    return joined;
  }();
  EXPECT_NE(all.find("9.0"), std::string::npos) << all;
  EXPECT_NE(all.find("Dv = 256"), std::string::npos) << all;
  p.Dv = 64;
  if (cuda::sm90::kernels_built())
    EXPECT_TRUE(cuda::sm90::Family::backward_reasons(p, {9, 0}).empty());
  p.dq_stride.l = 68;  // not a multiple of 8 elements
  reasons = cuda::sm90::Family::backward_reasons(p, {9, 0});
  ASSERT_FALSE(reasons.empty());
  EXPECT_NE(reasons.back().find("dq strides"), std::string::npos) << reasons.back();
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaBackward, ::testing::Values("cuda", "cuda_sm90"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace memeff
