// NaN and Inf in q, k, v, bias and dout on the CUDA backends (cuda, cuda_sm90, cuda_math, and the
// forward-only cuda_splitkv, whose backward is the fused one), bf16 and fp16: the cases and bounds
// of tests/unit/nonfinite_test.cpp (tests/common/nonfinite_case.h), forward on the device, then
// the backward from that forward's out and lse.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "common/call_helpers.h"
#include "common/nonfinite_case.h"
#include "cuda/device_tensor.h"
#include "memeff/attention.h"

namespace memeff {
namespace {

using test::DeviceTensor;
using test::NonFiniteCase;

test::NonFiniteRun run_on_device(const NonFiniteCase& c, test::NonFiniteInputs& inputs,
                                 const std::string& backend) {
  test::NonFiniteRun run(c.kc);
  DeviceTensor q(inputs.in.q), k(inputs.in.k), v(inputs.in.v), dout(inputs.dout());
  DeviceTensor out(run.out), lse(run.lse), dq(run.dq), dk(run.dk), dv(run.dv);
  std::optional<DeviceTensor> bias, dbias;
  if (inputs.in.bias) bias.emplace(*inputs.in.bias);
  if (run.dbias) dbias.emplace(*run.dbias);
  const AttentionArgs args =
      c.kc.args(q.view, k.view, v.view, bias ? std::optional(bias->view) : std::nullopt);
  const CallInfo f = forward(args, out.view, lse.view, test::only({backend}));
  EXPECT_EQ(f.backend, backend);
  BackwardTensors g{dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
  if (dbias) g.dbias = dbias->view;
  const bool forward_only = backend == "cuda_splitkv";
  const CallInfo b =
      backward(args, g, forward_only ? test::only({"cuda_sm90", "cuda"}) : test::only({backend}));
  if (!forward_only) EXPECT_EQ(b.backend, backend);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("kernel failed");
  out.copy_to(run.out);
  lse.copy_to(run.lse);
  dq.copy_to(run.dq);
  dk.copy_to(run.dk);
  dv.copy_to(run.dv);
  if (dbias) dbias->copy_to(*run.dbias);
  return run;
}

class CudaNonFinite : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  void SetUp() override {
    const std::string missing = test::gpu_backend_missing(std::get<0>(GetParam()));
    if (!missing.empty()) GTEST_SKIP() << missing;
  }
};

TEST_P(CudaNonFinite, EveryCaseWithinTheDocumentedBounds) {
  // Named copies, not structured bindings: clang 14 cannot capture those in a lambda.
  const std::string backend = std::get<0>(GetParam());
  const DType dtype = std::get<1>(GetParam());
  test::expect_every_nonfinite_case(
      backend, dtype, dtype == DType::bf16 ? 3e-2 : 1e-2,
      [&](const NonFiniteCase& c, test::NonFiniteInputs& inputs) {
        return run_on_device(c, inputs, backend);
      });
}

std::string name_of(const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
  return std::get<0>(info.param) + "_" + dtype_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaNonFinite,
                         ::testing::Combine(::testing::Values("cuda", "cuda_sm90", "cuda_math",
                                                              "cuda_splitkv"),
                                            ::testing::Values(DType::bf16, DType::f16)),
                         name_of);

}  // namespace
}  // namespace memeff
