// The check every cpu-backend test makes: forward and backward of the cpu backend against the
// reference on the same inputs (out, lse, dq, dk, dv and dbias), with the per-dtype tolerances of
// common/tolerance.h and the allowance for the cpu backend's D_i taken on the stored out.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/attention_case.h"
#include "common/tolerance.h"
#include "memeff/attention.h"

namespace memeff::test {

// Forward and backward of the cpu backend against the reference on the same inputs.
inline void check_cpu_against_reference(const Config& c, bool with_backward = true) {
  SCOPED_TRACE(c.describe());
  static std::uint64_t data_seed = 1000;
  ++data_seed;
  Case ref(c, data_seed), cpu(c, data_seed);
  ref.run_forward("reference");
  const CallInfo info = cpu.run_forward("cpu");
  EXPECT_EQ(info.backend, "cpu");
  const std::int64_t fwd_red = std::max(c.D, c.Lk);
  const test::Tolerance ft = test::forward_tolerance(c.dtype, fwd_red);
  expect_close(cpu.out, ref.out, ft, "out");
  // lse is fp32 in both; the cpu backend's scores carry fp32 error over D terms.
  expect_close(cpu.lse, ref.lse, test::forward_tolerance(DType::f32, fwd_red), "lse");
  if (!with_backward) return;
  // Both backwards read the reference's out and lse, so only the backward itself differs.
  cpu.out = ref.out;
  cpu.lse = ref.lse;
  ref.run_backward("reference");
  cpu.run_backward("cpu");
  const test::Tolerance bt =
      test::backward_tolerance(c.dtype, std::max({c.D, c.dv(), c.Lk, c.Lq * (c.Hq / c.Hkv)}));
  // The cpu backend takes D_i = rowsum(dO ∘ O) from the stored (rounded) out, FlashAttention-2
  // style; the reference sums P∘Z∘dP exactly. That costs about u · Σ|dO||O| in dS, which matters
  // where the gradient itself cancels to ~0 (a row with one visible key): allow it explicitly.
  double d_err = 0.0, max_q = 0.0, max_k = 0.0;
  for (std::int64_t row = 0; row < c.B * c.Hq * c.Lq; ++row) {
    double sum = 0.0;
    for (std::int64_t e = 0; e < c.dv(); ++e) {
      sum += std::abs(ref.dout.get(row * c.dv() + e) * ref.out.get(row * c.dv() + e));
    }
    d_err = std::max(d_err, 4.0 * test::unit_roundoff(c.dtype) * sum);
  }
  for (std::int64_t i = 0; i < ref.q.numel(); ++i) max_q = std::max(max_q, std::abs(ref.q.get(i)));
  for (std::int64_t i = 0; i < ref.k.numel(); ++i) max_k = std::max(max_k, std::abs(ref.k.get(i)));
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  auto widen = [](test::Tolerance t, double extra) {
    return test::Tolerance{t.atol + extra, t.rtol};
  };
  expect_close(cpu.dq, ref.dq, widen(bt, d_err * scale * max_k), "dq");
  expect_close(cpu.dk, ref.dk,
               widen(bt, d_err * scale * max_q * std::sqrt(double(c.Lq * (c.Hq / c.Hkv)))), "dk");
  expect_close(cpu.dv, ref.dv, bt, "dv");
  if (c.bias != "none") expect_close(*cpu.dbias, *ref.dbias, widen(bt, d_err), "dbias");
}

}  // namespace memeff::test
