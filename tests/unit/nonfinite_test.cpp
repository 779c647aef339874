// NaN and Inf in q, k, v, bias and dout on the host backends (reference, cpu), forward and the
// backward from that forward's out and lse: every entry the data makes non-finite is non-finite,
// no entry it cannot reach is, and the finite entries equal the oracle's
// (tests/common/nonfinite_case.h states the two bounds; docs/api.md the semantics). The CUDA
// backends run the same cases in tests/cuda/cuda_nonfinite_test.cpp.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <tuple>

#include "common/call_helpers.h"
#include "common/nonfinite_case.h"
#include "memeff/attention.h"

namespace memeff {
namespace {

using test::NonFiniteCase;

test::NonFiniteRun run_on_host(const NonFiniteCase& c, test::NonFiniteInputs& inputs,
                               const std::string& backend) {
  test::NonFiniteRun run(c.kc);
  const AttentionArgs args = c.kc.args(inputs.in.q.view, inputs.in.k.view, inputs.in.v.view,
                                       inputs.in.bias ? std::optional(inputs.in.bias->view)
                                                      : std::nullopt);
  const CallInfo f = forward(args, run.out.view, run.lse.view, test::only({backend}));
  EXPECT_EQ(f.backend, backend);
  BackwardTensors g{inputs.dout().view, run.out.view, run.lse.view, run.dq.view, run.dk.view,
                    run.dv.view, std::nullopt};
  if (run.dbias) g.dbias = run.dbias->view;
  const CallInfo b = backward(args, g, test::only({backend}));
  EXPECT_EQ(b.backend, backend);
  return run;
}

class HostNonFinite : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(HostNonFinite, EveryCaseWithinTheDocumentedBounds) {
  // Named copies, not structured bindings: clang 14 cannot capture those in a lambda.
  const std::string backend = std::get<0>(GetParam());
  const DType dtype = std::get<1>(GetParam());
  const double rtol = dtype == DType::f32 ? 1e-4 : dtype == DType::bf16 ? 3e-2 : 1e-2;
  test::expect_every_nonfinite_case(
      backend, dtype, rtol, [&](const NonFiniteCase& c, test::NonFiniteInputs& inputs) {
        return run_on_host(c, inputs, backend);
      });
}

std::string name_of(const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
  return std::get<0>(info.param) + "_" + dtype_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, HostNonFinite,
                         ::testing::Combine(::testing::Values("reference", "cpu"),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         name_of);

}  // namespace
}  // namespace memeff
