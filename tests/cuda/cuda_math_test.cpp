// cuda_math against the reference backend with the same dropout mask: forward (out, lse) and
// backward (dq, dk, dv, dbias) on a small grid of awkward cases (fp32/bf16/fp16, causal both
// ways, bias broadcast each way, GQA/MQA, odd lengths, D 40 and 72, strided inputs, no keys);
// then sliding windows, ALiBi and the softcap (docs/window.md) against the double-precision
// reference: every causal alignment with windows that cut unevenly, wider than the sequence, of
// zero width and leaving rows without keys; ALiBi per head and per batch entry; the softcap
// alone and with a bias and its gradient; all with dropout, GQA and each dtype; NaN and Inf.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "common/tolerance.h"
#include "cuda/backward_check.h"
#include "cuda/device_tensor.h"
#include "cuda/forward_check.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::HostTensor;
using test::Layout;
using DeviceCopy = test::DeviceTensor;
using test::cuda_device_present;

enum class BiasKind { none, full, heads_keys /* [1,H,1,Lk] */, batch_rows /* [B,1,Lq,Lk] */, keys };

struct Case {
  DType dtype;
  std::int64_t B, Hq, Hkv, Lq, Lk, D, Dv;
  CausalMode causal;
  BiasKind bias;
  bool bias_fp32;
  double dropout;
  Layout layout = Layout::bhld;
  std::string name() const {
    char buf[200];
    std::snprintf(
        buf, sizeof buf,
        "%s B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld D=%lld Dv=%lld causal=%s bias=%d%s p=%.2f%s",
        dtype_name(dtype), (long long)B, (long long)Hq, (long long)Hkv, (long long)Lq,
        (long long)Lk, (long long)D, (long long)Dv, causal_mode_name(causal),
        static_cast<int>(bias), bias_fp32 ? "(fp32)" : "", dropout,
        layout == Layout::blhd ? " blhd" : "");
    return buf;
  }
};

using test::expect_close;

void check_case(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(seed);
  HostTensor q(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
      k(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout), v(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv}, c.layout),
      dout(c.dtype, {c.B, c.Hq, c.Lq, c.Dv}, c.layout);
  test::fill_uniform(q, rng, -2, 2);
  test::fill_uniform(k, rng, -2, 2);
  test::fill_uniform(v, rng);
  test::fill_uniform(dout, rng);
  std::vector<std::int64_t> bshape = {c.B, c.Hq, c.Lq, c.Lk};
  if (c.bias == BiasKind::heads_keys) bshape = {1, c.Hq, 1, c.Lk};
  if (c.bias == BiasKind::batch_rows) bshape = {c.B, 1, c.Lq, c.Lk};
  if (c.bias == BiasKind::keys) bshape = {1, 1, 1, c.Lk};
  HostTensor bias(c.bias_fp32 ? DType::f32 : c.dtype, bshape);
  test::fill_uniform(bias, rng);

  AttentionArgs host_args = test::attention_args(q, k, v);
  if (c.bias != BiasKind::none) host_args.bias = bias.view;
  host_args.causal = c.causal;
  host_args.dropout_p = c.dropout;
  host_args.rng = {seed * 7 + 1, 12345, nullptr, nullptr};

  // Reference.
  HostTensor out_ref(c.dtype, {c.B, c.Hq, c.Lq, c.Dv}), lse_ref(DType::f32, {c.B, c.Hq, c.Lq});
  const Options ref_opts = test::only({"reference"});
  forward(host_args, out_ref.view, lse_ref.view, ref_opts);
  HostTensor dq_ref(c.dtype, {c.B, c.Hq, c.Lq, c.D}), dk_ref(c.dtype, {c.B, c.Hkv, c.Lk, c.D}),
      dv_ref(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv}), dbias_ref(bias.view.dtype, bshape);
  BackwardTensors ref_grads{dout.view,   out_ref.view, lse_ref.view, dq_ref.view,
                            dk_ref.view, dv_ref.view,  std::nullopt};
  if (c.bias != BiasKind::none) ref_grads.dbias = dbias_ref.view;
  backward(host_args, ref_grads, ref_opts);

  // cuda_math on device copies, outputs poisoned.
  DeviceCopy dq_in(q), dk_in(k), dv_in(v), dbias_in(bias), ddout(dout);
  AttentionArgs dev_args = host_args;
  dev_args.q = dq_in.view;
  dev_args.k = dk_in.view;
  dev_args.v = dv_in.view;
  if (c.bias != BiasKind::none) dev_args.bias = dbias_in.view;
  HostTensor out(c.dtype, {c.B, c.Hq, c.Lq, c.Dv}), lse(DType::f32, {c.B, c.Hq, c.Lq});
  test::poison(out);
  test::poison(lse);
  DeviceCopy dout_t(out), dlse(lse);
  const Options opts = test::only({"cuda_math"});
  const CallInfo info = forward(dev_args, dout_t.view, dlse.view, opts);
  EXPECT_EQ(info.backend, "cuda_math");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dout_t.copy_to(out);
  dlse.copy_to(lse);
  const std::int64_t red = std::max(c.D, c.Lk);
  expect_close(out, out_ref, test::forward_tolerance(c.dtype, red), "out");
  expect_close(lse, lse_ref, test::forward_tolerance(DType::f32, red), "lse");

  HostTensor dq(c.dtype, {c.B, c.Hq, c.Lq, c.D}), dk(c.dtype, {c.B, c.Hkv, c.Lk, c.D}),
      dv(c.dtype, {c.B, c.Hkv, c.Lk, c.Dv}), dbias(bias.view.dtype, bshape);
  test::poison(dq);
  test::poison(dk);
  test::poison(dv);
  test::poison(dbias);
  DeviceCopy ddq(dq), ddk(dk), ddv(dv), ddbias(dbias);
  BackwardTensors grads{ddout.view, dout_t.view, dlse.view,   ddq.view,
                        ddk.view,   ddv.view,    std::nullopt};
  if (c.bias != BiasKind::none) grads.dbias = ddbias.view;
  EXPECT_EQ(backward(dev_args, grads, opts).backend, "cuda_math");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ddq.copy_to(dq);
  ddk.copy_to(dk);
  ddv.copy_to(dv);
  const std::int64_t bred = std::max({c.D, c.Lk, c.Lq * c.Hq / c.Hkv});
  expect_close(dq, dq_ref, test::backward_tolerance(c.dtype, bred), "dq");
  expect_close(dk, dk_ref, test::backward_tolerance(c.dtype, bred), "dk");
  expect_close(dv, dv_ref, test::backward_tolerance(c.dtype, bred), "dv");
  if (c.bias != BiasKind::none) {
    ddbias.copy_to(dbias);
    const std::int64_t summed = bias.numel() > 0 ? c.B * c.Hq * c.Lq * c.Lk / bias.numel() : 1;
    // dS reads D_i = rowsum(dO ∘ O) from the stored (input-dtype) out: an fp32 bias still gets
    // a gradient only as accurate as the inputs' dtype.
    expect_close(dbias, dbias_ref,
                 test::backward_tolerance(c.dtype, std::max<std::int64_t>(bred, summed)),
                 "dbias");
  }
}

TEST(CudaMath, MatchesTheReferenceWithTheSameMask) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  using CM = CausalMode;
  const std::vector<Case> cases = {
      {DType::f32, 2, 4, 2, 17, 33, 40, 40, CM::none, BiasKind::none, false, 0.0},
      {DType::f32, 2, 4, 4, 17, 33, 40, 24, CM::none, BiasKind::full, true, 0.2},
      {DType::bf16, 2, 4, 2, 65, 64, 72, 72, CM::top_left, BiasKind::full, true, 0.2},
      {DType::f16, 1, 4, 2, 65, 33, 72, 40, CM::bottom_right, BiasKind::heads_keys, false, 0.1},
      {DType::f32, 2, 6, 2, 64, 129, 72, 72, CM::bottom_right, BiasKind::batch_rows, true, 0.3,
       Layout::blhd},
      {DType::bf16, 2, 4, 4, 1, 1013, 40, 40, CM::none, BiasKind::keys, false, 0.1},
      {DType::f16, 1, 4, 1, 129, 65, 40, 40, CM::top_left, BiasKind::none, false, 0.0,
       Layout::blhd},
      {DType::f32, 1, 2, 2, 127, 127, 72, 40, CM::top_left, BiasKind::keys, true, 0.5},
  };
  std::uint64_t seed = 1;
  for (const Case& c : cases) check_case(c, seed++);
}

TEST(CudaMath, RowsWithoutKeysGiveZeroAndMinusInfinity) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  check_case({DType::f32, 1, 2, 2, 5, 0, 40, 40, CausalMode::none, BiasKind::none, false, 0.0}, 77);
  // bottom-right causal with Lq > Lk: the first rows see nothing.
  check_case(
      {DType::bf16, 1, 2, 1, 40, 9, 40, 40, CausalMode::bottom_right, BiasKind::none, false, 0.25},
      78);
}

TEST(CudaMath, RefusesWithReasons) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  std::shared_ptr<Backend> b = find_backend("cuda_math");
  ASSERT_NE(b, nullptr);
  Problem p;
  p.device = Device::cuda(0);
  p.dtype = DType::f64;
  p.B = 1, p.Hq = p.Hkv = 1, p.Lq = p.Lk = 8, p.D = p.Dv = 8;
  auto r = b->reasons_unsupported(p, Pass::forward);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].find("fp64"), std::string::npos) << r[0];
  p.dtype = DType::bf16;
  EXPECT_TRUE(b->reasons_unsupported(p, Pass::forward).empty());
  p.window_left = 3;  // the score modifiers take no reason (docs/window.md)
  p.has_alibi = true;
  p.softcap = 30.0;
  EXPECT_TRUE(b->reasons_unsupported(p, Pass::forward).empty());
  EXPECT_TRUE(b->reasons_unsupported(p, Pass::backward).empty());
  p.packed = true;  // packed calls are refused, modifiers or not
  r = b->reasons_unsupported(p, Pass::forward);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].find("packed sequences"), std::string::npos) << r[0];
  p.packed = false;
  p.B = 64, p.Hq = p.Hkv = 64, p.Lq = p.Lk = 1 << 20;  // petabytes of scores
  r = b->reasons_unsupported(p, Pass::backward);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].find("bytes of device memory"), std::string::npos) << r[0];
  EXPECT_NE(r[0].find("free on cuda:0"), std::string::npos) << r[0];
}

// On a tiny and a mid-sized shape, autotuning times every eligible CUDA backend (cuda_math, cuda
// and, on compute capability 9.0, cuda_sm90) and keeps the fastest (the measurements behind the
// CUDA default order; docs/benchmarks.md).
TEST(CudaMath, AutotuneKeepsTheFastestEligibleBackend) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  char cache_dir[] = "/tmp/memeff-cuda-math-test-XXXXXX";  // keep the user's cache untouched
  ASSERT_NE(mkdtemp(cache_dir), nullptr);
  setenv("MEMEFF_CACHE_DIR", cache_dir, 1);
  autotune_reset_memory();
  for (std::int64_t L : {32, 512}) {
    HostTensor q(DType::bf16, {8, 16, L, 64}), o(DType::bf16, {8, 16, L, 64}),
        l(DType::f32, {8, 16, L});
    DeviceCopy dq(q), dk(q), dv(q), dout(o), dl(l);
    AttentionArgs a = test::attention_args(dq, dk, dv);
    a.dropout_p = 0.1;
    const Options opts = test::only({"cuda_math"});
    for (int w = 0; w < 3; ++w) forward(a, dout.view, dl.view, opts);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    constexpr int kRuns = 20;
    for (int r = 0; r < kRuns; ++r) forward(a, dout.view, dl.view, opts);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        kRuns;
    std::printf("cuda_math forward bf16 B=8 H=16 L=%lld D=64 p=0.1: %.3f ms\n", (long long)L, ms);
    const Explanation ex = explain(a, Pass::forward);
    std::printf("default dispatch for L=%lld: %s\n", (long long)L, ex.to_string().c_str());
    Options tune;
    tune.autotune = true;
    std::printf("autotuned forward for L=%lld: %s\n", (long long)L,
                forward(a, dout.view, dl.view, tune).backend.c_str());
    const Explanation tuned = explain(a, Pass::forward, tune);
    std::printf("%s\n", tuned.to_string().c_str());
    std::vector<std::string> eligible, timed;
    for (const BackendReport& r : ex.backends) {
      if (r.eligible) eligible.push_back(r.name);
    }
    for (const CandidateTime& t : tuned.timings) timed.push_back(t.backend);
    std::sort(eligible.begin(), eligible.end());
    std::sort(timed.begin(), timed.end());
    ASSERT_GE(eligible.size(), 2u) << "cuda and cuda_math are eligible on every sm80+ device";
    EXPECT_EQ(timed, eligible) << "autotune must time exactly the eligible backends";
    const auto fastest = std::min_element(
        tuned.timings.begin(), tuned.timings.end(),
        [](const CandidateTime& x, const CandidateTime& y) { return x.ms < y.ms; });
    EXPECT_EQ(tuned.chosen, fastest->backend);
    for (const CandidateTime& t : tuned.timings) EXPECT_GT(t.ms, 0.0) << t.backend;
  }
  autotune_reset_memory();
  unsetenv("MEMEFF_CACHE_DIR");
  std::filesystem::remove_all(cache_dir);
}

// ---------------------------------------------------------------------------------------------
// Window, ALiBi and softcap (docs/window.md), once per dtype (fp32, fp16, bf16): test::KernelCase
// cases on cuda_math against the double-precision reference on the same rounded inputs and
// dropout mask. The forward's out within cuda_math's forward tolerance, lse within 2e-5 and -inf
// exactly where the reference has it (cuda/forward_check.h); the backward from the reference's
// out and lse (cuda/backward_check.h) with the gradients within cuda_math's backward tolerance,
// the bar check_case holds above.

using test::KernelCase;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr CausalMode kModes[] = {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right};

class CudaMathModifiers : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  }
  // The case on cuda_math in the test's dtype, with the window.
  KernelCase math(KernelCase c, Window window = {}) const {
    c.backend = "cuda_math";
    c.dtype = GetParam();
    c.window = window;
    return c;
  }
};

test::Tolerance gradient_tolerance(const KernelCase& c) {
  return test::backward_tolerance(c.dtype, std::max({c.D, c.Lk, c.Lq * c.Hq / c.Hkv}));
}

// Whether elements [begin, begin + count) of t (logical order) are all exactly 0.
bool all_zero(const HostTensor& t, std::int64_t begin, std::int64_t count) {
  for (std::int64_t x = begin; x < begin + count; ++x) {
    if (t.get(x) != 0.0) return false;
  }
  return true;
}

// What check_modified ran: the forward's result and the reference's, the backward's gradients
// and the reference's.
struct Checked {
  test::ForwardResult forward;
  test::BwdProblem problem;
  test::Grads grads;
};

// Forward, then backward, each against the reference; the results, for further checks.
Checked check_modified(const KernelCase& c, std::uint64_t data_seed) {
  SCOPED_TRACE(c.describe());
  Checked run{test::run_forward_case(c, data_seed), test::BwdProblem(c, data_seed), {}};
  test::expect_forward_matches(c, run.forward);
  run.grads = test::run_backward_case(c, run.problem);
  const test::KernelReference& ref = run.problem.ref;
  const test::Tolerance tol = gradient_tolerance(c);
  expect_close(run.grads.dq, ref.dq, tol, c.describe() + ": dq");
  expect_close(run.grads.dk, ref.dk, tol, c.describe() + ": dk");
  expect_close(run.grads.dv, ref.dv, tol, c.describe() + ": dv");
  if (run.grads.dbias) {
    // A broadcast bias sums dS over the rows it covers.
    const std::int64_t summed = c.B * c.Hq * c.Lq * c.Lk / run.grads.dbias->numel();
    const std::int64_t red = std::max({c.D, c.Lk, c.Lq * c.Hq / c.Hkv, summed});
    expect_close(*run.grads.dbias, ref.dbias, test::backward_tolerance(c.dtype, red),
                 c.describe() + ": dbias");
  }
  return run;
}

// Windows bounded on the left, on the right, on both, under each alignment, on lengths where
// the diagonal runs off the keys (Lq > Lk), short of them (Lq < Lk) and square; dropout in two
// cases of three, head dims 40 and 72, each bias pattern (in the inputs' dtype or fp32) and
// strided inputs in turn.
TEST_P(CudaMathModifiers, EachAlignmentWithWindowsThatCutUnevenly) {
  std::vector<KernelCase> cases;
  for (const Window w : {Window{37, 5}, Window{70, -1}, Window{-1, 66}, Window{200, 3},
                         Window{0, 130}}) {
    for (CausalMode mode : kModes) {
      cases.push_back(math({.Lq = 150, .Lk = 200, .causal = mode}, w));
      cases.push_back(math({.Lq = 200, .Lk = 130, .causal = mode}, w));
      cases.push_back(math({.Lq = 77, .Lk = 77, .causal = mode}, w));
    }
  }
  const char* biases[] = {"none", "bhqk", "b11k", "1hqk"};
  for (std::size_t n = 0; n < cases.size(); ++n) {
    KernelCase& c = cases[n];
    c.D = n % 2 ? 40 : 72;
    c.dropout = n % 3 ? 0.15 : 0.0;
    c.bias = biases[n % 4];
    c.bias_dtype = (n / 4) % 2 ? DType::f32 : c.dtype;
    c.layout = n % 5 == 0 ? Layout::blhd : Layout::bhld;
    check_modified(c, n + 1);
  }
}

// A window wider than every distance bounds nothing: the same bits as the call without it. One
// of width zero shows each row its diagonal key alone, whose softmax is 1 whatever the score: dS
// is exactly 0 (core/visible_keys.h), so dq, dk and dbias are exactly 0, with the softcap too,
// and dv is the rows' dO (times the keep scale or 0).
TEST_P(CudaMathModifiers, WiderThanTheSequenceAndZeroWidth) {
  for (const Window wide : {Window{5000, 5000}, Window{1000, -1}, Window{-1, 700}}) {
    for (CausalMode mode : kModes) {
      const KernelCase c =
          math({.B = 2, .Lq = 300, .Lk = 260, .causal = mode, .dropout = 0.1}, wide);
      const Checked run = check_modified(c, 40);
      const test::ForwardResult plain = test::run_forward_case(math(c), 40);
      EXPECT_TRUE(test::bitwise_equal(run.forward.out, plain.out)) << c.describe() << ": out";
      EXPECT_TRUE(test::bitwise_equal(run.forward.lse, plain.lse)) << c.describe() << ": lse";
    }
  }
  for (double p : {0.0, 0.2}) {
    KernelCase c = math({.B = 2, .Lq = 200, .Lk = 200, .bias = "bhqk", .dropout = p}, {0, 0});
    c.bias_dtype = c.dtype;
    c.softcap = p > 0.0 ? 2.0 : 0.0;
    const Checked run = check_modified(c, 42);
    const test::Grads& g = run.grads;
    EXPECT_TRUE(all_zero(g.dq, 0, g.dq.numel())) << c.describe() << ": dq";
    EXPECT_TRUE(all_zero(g.dk, 0, g.dk.numel())) << c.describe() << ": dk";
    EXPECT_TRUE(all_zero(*g.dbias, 0, g.dbias->numel())) << c.describe() << ": dbias";
  }
}

// Rows whose window holds no key (the diagonal far before the keys, or past them) give out = 0,
// lse = -inf and dq = 0, never NaN, while their neighbours' rows are right; with ALiBi too.
TEST_P(CudaMathModifiers, RowsWithoutAVisibleKey) {
  const KernelCase shapes[] = {
      math({.Lq = 300, .Lk = 100}, {1, 1}),                             // rows 0..198 see nothing
      math({.Lq = 150, .Lk = 40, .causal = CausalMode::top_left}, {2, 0}),  // rows past 41
      math({.Lq = 260, .Lk = 70, .causal = CausalMode::bottom_right}, {5, 0})};
  std::uint64_t seed = 50;
  for (KernelCase c : shapes) {
    for (const char* alibi : {"none", "bh"}) {
      c.alibi = alibi;
      c.dropout = c.alibi == "none" ? 0.0 : 0.1;
      SCOPED_TRACE(c.describe());
      const Checked run = check_modified(c, ++seed);
      const std::int64_t rows = c.B * c.Hq * c.Lq;
      std::int64_t empty = 0;
      for (std::int64_t row = 0; row < rows; ++row) {
        if (run.forward.ref.lse.get(row) != -kInf) continue;
        ++empty;
        EXPECT_TRUE(all_zero(run.forward.out, row * c.dv(), c.dv())) << "out row " << row;
        EXPECT_TRUE(all_zero(run.grads.dq, row * c.D, c.D)) << "dq row " << row;
      }
      EXPECT_GT(empty, 0) << c.describe() << ": the shape leaves no row without keys";
    }
  }
}

// ALiBi's slopes per head ([Hq]) and per batch entry and head ([B, Hq]) with GQA (4 query heads
// a key/value head), with and without a window, under each alignment, with dropout and each bias
// pattern.
TEST_P(CudaMathModifiers, AlibiPerHeadAndPerBatchWithGqa) {
  std::vector<KernelCase> cases;
  for (CausalMode mode : kModes) {
    for (const char* bias : {"none", "b1qk", "1h1k", "bhqk"}) {
      cases.push_back(math({.B = 2, .Hq = 8, .Hkv = 2, .Lq = 90, .Lk = 130, .causal = mode,
                            .bias = bias, .dropout = 0.1}));
    }
  }
  for (std::size_t n = 0; n < 2 * cases.size(); ++n) {
    KernelCase c = cases[n % cases.size()];
    c.alibi = n < cases.size() ? "h" : "bh";
    c.bias_dtype = c.bias == "b1qk" ? DType::f32 : c.dtype;
    if (n % 2) c.window = Window{40, 20};
    check_modified(c, 60 + n);
  }
}

// Slopes [B, Hq] whose batch stride is 0 (one row repeated) are the slopes [Hq]: forward and
// backward give the same bits. A reading of a batch entry's slopes at offsets from the shape,
// not the view's strides, would take other (here out-of-range) values.
TEST_P(CudaMathModifiers, PerBatchSlopesWithBatchStrideZeroAreThePerHeadOnes) {
  KernelCase c = math({.B = 3, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 90,
                       .causal = CausalMode::bottom_right, .dropout = 0.1},
                      {30, -1});
  c.alibi = "h";
  check_modified(c, 7);  // the per-head call is the reference's
  const test::KernelInputs in(c, 7, /*with_dout=*/true);
  DeviceCopy q(in.q), k(in.k), v(in.v), dout(*in.dout), slopes(*in.slopes);
  TensorView repeated = slopes.view;  // [B, Hq] over the same Hq floats
  repeated.rank = 2;
  repeated.shape = {c.B, c.Hq, 0, 0};
  repeated.stride = {0, 1, 0, 0};
  // out, lse, dq, dk and dv of a call with the given slopes.
  auto run = [&](const TensorView& slope_view) {
    std::vector<HostTensor> r = {
        HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.D}), HostTensor(DType::f32, {c.B, c.Hq, c.Lq}),
        HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.D}), HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.D}),
        HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.D})};
    for (HostTensor& t : r) test::poison(t);
    DeviceCopy out(r[0]), lse(r[1]), dq(r[2]), dk(r[3]), dv(r[4]);
    const AttentionArgs a = c.args(q.view, k.view, v.view, std::nullopt, slope_view);
    EXPECT_EQ(forward(a, out.view, lse.view, test::only({"cuda_math"})).backend, "cuda_math");
    const BackwardTensors g{dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
    EXPECT_EQ(backward(a, g, test::only({"cuda_math"})).backend, "cuda_math");
    test::cuda_check(cudaDeviceSynchronize(), "cuda_math");
    const DeviceCopy* from[] = {&out, &lse, &dq, &dk, &dv};
    for (std::size_t t = 0; t < r.size(); ++t) from[t]->copy_to(r[t]);
    return r;
  };
  const std::vector<HostTensor> per_head = run(slopes.view), per_batch = run(repeated);
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (std::size_t t = 0; t < per_head.size(); ++t) {
    EXPECT_TRUE(test::bitwise_equal(per_head[t], per_batch[t])) << names[t];
  }
}

// The softcap where it saturates (0.5 with scale 1), where it bends (2) and where it hardly does
// (30), alone and under a bias (per score or per key; in the inputs' dtype or fp32) whose
// gradient takes dS before the cap's derivative, with dropout and each alignment in turn.
TEST_P(CudaMathModifiers, SoftcapAloneAndWithABiasAndItsGradient) {
  std::vector<KernelCase> cases;
  for (const char* bias : {"none", "bhqk", "b11k"}) {
    KernelCase c = math({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 70, .Lk = 110, .bias = bias,
                         .dropout = 0.1});
    c.bias_dtype = c.dtype;
    cases.push_back(c);
    if (c.has_bias() && c.dtype != DType::f32) {
      c.bias_dtype = DType::f32;
      cases.push_back(c);
    }
  }
  std::uint64_t seed = 80;
  for (double cap : {0.5, 2.0, 30.0}) {
    for (KernelCase c : cases) {
      c.softcap = cap;
      c.scale = cap < 1.0 ? 1.0 : std::numeric_limits<double>::quiet_NaN();
      c.causal = kModes[seed % 3];
      check_modified(c, ++seed);
    }
  }
}

// All three at once with a bias and its gradient, dropout and GQA, head dims from 40 to 256
// (cuda_math has no head-dim limit), strided inputs and Dv != D.
TEST_P(CudaMathModifiers, EverythingTogetherEachHeadDim) {
  std::uint64_t seed = 100;
  for (std::int64_t D : {40, 64, 128, 256}) {
    KernelCase c = math({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 130, .Lk = 150, .D = D,
                         .Dv = D == 40 ? 24 : -1, .causal = kModes[seed % 3], .bias = "1hqk",
                         .dropout = 0.1},
                        {45, 10});
    c.bias_dtype = c.dtype;
    c.layout = D == 128 ? Layout::blhd : Layout::bhld;
    c.alibi = "bh";
    c.softcap = 5.0;
    check_modified(c, ++seed);
  }
}

// NaN and Inf as the reference has them (docs/api.md): a NaN in key j0 reaches exactly the rows
// whose window holds j0 (their out and lse are NaN) and no other row; with the softcap an
// infinite product is capped to ±softcap, so a query row holding +Inf stays finite (without the
// cap its +inf score makes it NaN). Forward only: the backward's bounds are the loose ones of
// tests/common/nonfinite_case.h.
TEST_P(CudaMathModifiers, NonFiniteInputsReachTheRowsThatSeeThem) {
  const std::int64_t j0 = 20, inf_row = 50;
  for (double cap : {0.0, 1.0}) {
    KernelCase c = math({.B = 1, .Hq = 2, .Hkv = 1, .Lq = 64, .Lk = 64,
                         .causal = CausalMode::top_left, .dropout = 0.1},
                        {5, 0});
    c.alibi = "h";
    c.softcap = cap;
    SCOPED_TRACE(c.describe());
    test::KernelInputs in(c, 9, /*with_dout=*/false);
    in.k.set(j0 * c.D + 3, std::numeric_limits<double>::quiet_NaN());  // key j0 of the kv head
    for (std::int64_t j = 0; j < c.Lk; ++j) in.k.set(j * c.D, j % 2 ? 0.5 : -0.5);
    in.q.set((c.Lq + inf_row) * c.D, kInf);  // head 1: q·k is ±inf at every key
    // The reference on the host tensors, cuda_math on device copies.
    HostTensor ref_out(c.dtype, {c.B, c.Hq, c.Lq, c.D}), ref_lse(DType::f32, {c.B, c.Hq, c.Lq});
    forward(c.args(in.q.view, in.k.view, in.v.view, std::nullopt, in.slopes->view), ref_out.view,
            ref_lse.view, test::only({"reference"}));
    HostTensor out = ref_out, lse = ref_lse;
    test::poison(out);
    test::poison(lse);
    DeviceCopy q(in.q), k(in.k), v(in.v), slopes(*in.slopes), d_out(out), d_lse(lse);
    const AttentionArgs a = c.args(q.view, k.view, v.view, std::nullopt, slopes.view);
    EXPECT_EQ(forward(a, d_out.view, d_lse.view, test::only({"cuda_math"})).backend, "cuda_math");
    test::cuda_check(cudaDeviceSynchronize(), "cuda_math forward");
    d_out.copy_to(out);
    d_lse.copy_to(lse);
    const double bound = test::forward_tolerance(c.dtype, std::max(c.D, c.Lk)).bound(1.0);
    int nan_rows = 0;
    for (std::int64_t row = 0; row < c.Hq * c.Lq; ++row) {
      const std::int64_t h = row / c.Lq, i = row % c.Lq;
      const bool want_nan = (i >= j0 && i <= j0 + 5) || (h == 1 && i == inf_row && cap == 0.0);
      const std::string where = "head " + std::to_string(h) + " row " + std::to_string(i);
      ASSERT_EQ(std::isnan(ref_lse.get(row)), want_nan) << "reference lse, " << where;
      ASSERT_EQ(std::isnan(lse.get(row)), want_nan) << "lse, " << where;
      nan_rows += want_nan;
      for (std::int64_t e = 0; e < c.D; ++e) {
        const double got = out.get(row * c.D + e), want = ref_out.get(row * c.D + e);
        if (want_nan) {
          ASSERT_TRUE(std::isnan(got)) << "out, " << where << " dim " << e;
        } else {
          ASSERT_LE(std::abs(got - want), bound)
              << "out, " << where << " dim " << e << ": " << got << " vs " << want;
        }
      }
      if (!want_nan) {
        const double ref = ref_lse.get(row);
        EXPECT_NEAR(lse.get(row), ref, 2e-5 * (1.0 + std::abs(ref))) << "lse, " << where;
      }
    }
    EXPECT_EQ(nan_rows, 2 * 6 + (cap == 0.0 ? 1 : 0));
  }
}

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return dtype_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaMathModifiers,
                         ::testing::Values(DType::f32, DType::f16, DType::bf16), dtype_param_name);

}  // namespace
}  // namespace memeff
