// A fused-kernel forward case run on the device and checked against the double-precision
// reference (test::KernelCase): out and lse copied back after NaN poisoning, out within the
// forward tolerance, lse within 2e-5 relative and -inf exactly where the reference has it. Shared
// by the fused forwards' tests and the split-KV forward's.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>

#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "common/tolerance.h"
#include "cuda/device_tensor.h"
#include "memeff/attention.h"

namespace memeff::test {

// The backend's out and lse (copied back from the device) and the reference's.
struct ForwardResult {
  HostTensor out, lse;
  KernelReference ref;
};

// Runs the case on its backend (and only there: the call must report it) with `options`' other
// fields.
inline ForwardResult run_forward_case(const KernelCase& c, std::uint64_t data_seed,
                                      Options options = {}) {
  const KernelInputs in(c, data_seed, /*with_dout=*/false);
  HostTensor out(c.dtype, {c.B, c.Hq, c.Lq, c.dv()}, c.layout), lse(DType::f32, {c.B, c.Hq, c.Lq});
  poison(out);
  poison(lse);
  DeviceTensor q(in.q), k(in.k), v(in.v), d_out(out), d_lse(lse);
  std::optional<DeviceTensor> bias, slopes;
  if (in.bias) bias.emplace(*in.bias);
  if (in.slopes) slopes.emplace(*in.slopes);
  const AttentionArgs args =
      c.args(q.view, k.view, v.view, bias ? std::optional(bias->view) : std::nullopt,
             slopes ? std::optional(slopes->view) : std::nullopt);
  options.backends = {c.backend};
  const CallInfo info = forward(args, d_out.view, d_lse.view, options);
  EXPECT_EQ(info.backend, c.backend);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("kernel failed");
  d_out.copy_to(out);
  d_lse.copy_to(lse);
  return {out, lse, KernelReference(c, in)};
}

inline void expect_forward_matches(const KernelCase& c, const ForwardResult& r) {
  expect_close(r.out, r.ref.out, forward_tolerance(c.dtype, std::max(c.D, c.Lk)),
               c.describe() + ": out");
  // lse: fp32 from fp32 scores; -inf exactly where the reference has it.
  double worst = 0.0;
  std::int64_t worst_i = -1;
  for (std::int64_t i = 0; i < r.lse.numel(); ++i) {
    const double a = r.lse.get(i), e = r.ref.lse.get(i);
    if (std::isinf(e) || std::isinf(a) || std::isnan(a)) {
      EXPECT_EQ(a, e) << c.describe() << ": lse[" << i << "]";
      continue;
    }
    const double err = std::abs(a - e) / (1.0 + std::abs(e));
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LE(worst, 2e-5) << c.describe() << ": lse differs at flat index " << worst_i;
}

}  // namespace memeff::test
