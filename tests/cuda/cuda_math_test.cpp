// cuda_math against the reference backend with the same dropout mask: forward (out, lse) and
// backward (dq, dk, dv, dbias) on a small grid of awkward cases (fp32/bf16/fp16, causal both
// ways, bias broadcast each way, GQA/MQA, odd lengths, D 40 and 72, strided inputs, no keys).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/host_tensor.h"
#include "cuda/device_tensor.h"
#include "common/tolerance.h"
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

}  // namespace
}  // namespace memeff
