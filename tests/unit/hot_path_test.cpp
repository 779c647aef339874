// The hot path as a specification: a repeated call signature is decided once per thread (the
// backends' checks are not asked again), backends after the chosen one are never asked, anything
// the decision depends on (shape, dtype, alignment class, pass, order, registry, environment,
// log and autotune settings) makes a new decision, a PreparedCall's workspace size and run share
// one decision, and a decided call allocates no host memory in the dispatcher.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/allocation_count.h"
#include "common/call_helpers.h"
#include "common/fake_backend.h"
#include "common/host_tensor.h"
#include "common/packed_case.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::HostTensor;
using test::only;

// A backend that refuses by a rule, counts what the dispatcher asks of it and computes nothing.
class CountingBackend final : public test::FakeBackend {
 public:
  using Rule = bool (*)(const Problem&);  // true: refuse
  CountingBackend(std::string name, Rule refuse, std::size_t workspace)
      : FakeBackend(std::move(name)), refuse_(refuse), workspace_(workspace) {}
  std::vector<std::string> reasons_unsupported(const Problem& p, Pass) const override {
    ++reasons_calls;
    if (refuse_ && refuse_(p)) return {"refused by its rule"};
    return {};
  }
  std::size_t workspace_bytes(const Problem&, Pass) const override { return workspace_; }
  void forward(const Problem& p, const AttentionArgs& a, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    FakeBackend::forward(p, a, out, lse, options);
    last_workspace = options.workspace;
  }
  void backward(const Problem& p, const AttentionArgs& a, const BackwardTensors& g,
                const Options& options) override {
    FakeBackend::backward(p, a, g, options);
    last_workspace = options.workspace;
  }
  mutable std::atomic<int> reasons_calls{0};
  void* last_workspace = nullptr;

 private:
  Rule refuse_;
  std::size_t workspace_;
};

struct Call {
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  Call(DType dtype, std::int64_t Lq)
      : q(dtype, {1, 2, Lq, 8}),
        k(dtype, {1, 2, 5, 8}),
        v(dtype, {1, 2, 5, 8}),
        out(dtype, {1, 2, Lq, 8}),
        lse(DType::f32, {1, 2, Lq}),
        dout(dtype, {1, 2, Lq, 8}),
        dq(dtype, {1, 2, Lq, 8}),
        dk(dtype, {1, 2, 5, 8}),
        dv(dtype, {1, 2, 5, 8}) {}
  AttentionArgs args() const { return test::attention_args(q, k, v); }
  BackwardTensors grads() const {
    return {dout.view, out.view, lse.view, dq.view, dk.view, dv.view, {}};
  }
  CallInfo forward(const Options& o = {}) const {
    return memeff::forward(args(), out.view, lse.view, o);
  }
  CallInfo backward(const Options& o = {}) const { return memeff::backward(args(), grads(), o); }
};

class HotPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"MEMEFF_BACKENDS", "MEMEFF_AUTOTUNE", "MEMEFF_LOG_DISPATCH"}) unsetenv(v);
    // first refuses misaligned views (the "strides class" of a signature), second takes anything
    first = add(
        "hot_first", [](const Problem& p) { return !p.vector_aligned; }, 64);
    second = add("hot_second", nullptr, 32);
  }
  void TearDown() override {
    for (const std::string& n : added) unregister_backend(n);
    for (const char* v : {"MEMEFF_BACKENDS", "MEMEFF_AUTOTUNE", "MEMEFF_LOG_DISPATCH"}) unsetenv(v);
  }
  std::shared_ptr<CountingBackend> add(const std::string& name, CountingBackend::Rule refuse,
                                       std::size_t workspace) {
    auto b = std::make_shared<CountingBackend>(name, refuse, workspace);
    register_backend(b);
    added.push_back(name);
    return b;
  }
  std::shared_ptr<CountingBackend> first, second;
  std::vector<std::string> added;
};

TEST_F(HotPathTest, ARepeatedSignatureIsDecidedOnceAndLaterBackendsAreNeverAsked) {
  const Options order = only({"hot_first", "hot_second"});
  Call c(DType::f32, 4);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.forward(order).backend, "hot_first");
  EXPECT_EQ(first->reasons_calls, 1);
  EXPECT_EQ(first->forward_calls, 3);
  EXPECT_EQ(second->reasons_calls, 0) << "a backend after the choice was asked";
  // The backward is a signature of its own; explain() still asks every backend.
  for (int i = 0; i < 2; ++i) EXPECT_EQ(c.backward(order).backend, "hot_first");
  EXPECT_EQ(first->reasons_calls, 2);
  const Explanation ex = explain(c.args(), Pass::forward, order);
  EXPECT_EQ(ex.chosen, "hot_first");
  EXPECT_EQ(second->reasons_calls, 1);
  EXPECT_EQ(ex.backends.size(), backend_names().size());
}

TEST_F(HotPathTest, ShapeDtypeAndAlignmentClassEachMakeTheirOwnDecision) {
  const Options order = only({"hot_first", "hot_second"});
  Call a(DType::f32, 4), b(DType::f32, 6), h(DType::f16, 4);
  EXPECT_EQ(a.forward(order).backend, "hot_first");
  EXPECT_EQ(b.forward(order).backend, "hot_first");
  EXPECT_EQ(h.forward(order).backend, "hot_first");
  EXPECT_EQ(first->reasons_calls, 3);
  // q one element past a 16-byte boundary: not vector aligned, so hot_first refuses it.
  HostTensor wide(DType::f32, {1, 2, 4, 9});
  AttentionArgs misaligned = a.args();
  misaligned.q = TensorView::strided(static_cast<float*>(wide.view.data) + 1, DType::f32,
                                     {1, 2, 4, 8}, {72, 36, 9, 1});
  EXPECT_EQ(forward(misaligned, a.out.view, a.lse.view, order).backend, "hot_second");
  EXPECT_EQ(a.forward(order).backend, "hot_first");  // both remembered, neither asked again
  EXPECT_EQ(forward(misaligned, a.out.view, a.lse.view, order).backend, "hot_second");
  EXPECT_EQ(first->reasons_calls, 4);
  EXPECT_EQ(second->reasons_calls, 1);
}

// A packed call is a signature apart from the dense call of the same sizes (B = S, Lq and Lk the
// maximum lengths), and so is each count of packed rows (a packed pass's workspace may scale
// with it): a backend that refuses packed calls is never handed one by a remembered decision.
TEST_F(HotPathTest, PackedCallsAndTheirRowCountsEachMakeTheirOwnDecision) {
  auto dense_only = add(
      "hot_dense_only", [](const Problem& p) { return p.packed; }, 16);
  const Options order = only({"hot_dense_only", "hot_first"});
  Call dense(DType::f32, 4);  // [1, 2, 4, 8] queries, 5 keys
  EXPECT_EQ(dense.forward(order).backend, "hot_dense_only");
  auto packed_forward = [&](const test::PackedCase& pc) {
    return forward(pc.args(), pc.out.view, pc.lse.view, order).backend;
  };
  // One sequence: the dense call's B, H, Lq, Lk, D and Dv, packed.
  const test::PackedCase one({.seqlens_q = {4}, .seqlens_k = {5}, .D = 8}, 1);
  EXPECT_EQ(packed_forward(one), "hot_first");
  EXPECT_EQ(dense.forward(order).backend, "hot_dense_only");
  EXPECT_EQ(dense_only->reasons_calls, 2);
  EXPECT_EQ(first->reasons_calls, 1);
  EXPECT_EQ(packed_forward(one), "hot_first");  // remembered
  EXPECT_EQ(first->reasons_calls, 1);
  // Two sequences, the same maxima, other row counts: decided again.
  const test::PackedCase a({.seqlens_q = {4, 2}, .seqlens_k = {5, 5}, .D = 8}, 1),
      b({.seqlens_q = {4, 4}, .seqlens_k = {5, 3}, .D = 8}, 1);
  EXPECT_EQ(packed_forward(a), "hot_first");
  EXPECT_EQ(packed_forward(b), "hot_first");
  EXPECT_EQ(first->reasons_calls, 3);
}

TEST_F(HotPathTest, OrderRegistryEnvironmentAndGuardChangesAreObeyed) {
  Call c(DType::f32, 4);
  EXPECT_EQ(c.forward(only({"hot_first", "hot_second"})).backend, "hot_first");
  EXPECT_EQ(c.forward(only({"hot_second", "hot_first"})).backend, "hot_second");
  EXPECT_EQ(c.forward(only({"hot_later", "hot_second"})).backend, "hot_second");
  add("hot_later", nullptr, 0);  // registering drops remembered decisions
  EXPECT_EQ(c.forward(only({"hot_later", "hot_second"})).backend, "hot_later");
  unregister_backend("hot_later");
  EXPECT_EQ(c.forward(only({"hot_later", "hot_second"})).backend, "hot_second");

  setenv("MEMEFF_BACKENDS", "hot_second", 1);
  EXPECT_EQ(c.forward().backend, "hot_second");
  setenv("MEMEFF_BACKENDS", "hot_first,hot_second", 1);
  EXPECT_EQ(c.forward().backend, "hot_first");
  {
    ScopedBackends guard({"hot_second"});
    EXPECT_EQ(c.forward().backend, "hot_second");
  }
  EXPECT_EQ(c.forward().backend, "hot_first");
  setenv("MEMEFF_BACKENDS", "hot_first,no_such_backend", 1);
  EXPECT_THROW(c.forward(), Error);  // every call, not only the first
  EXPECT_THROW(c.forward(), Error);
  unsetenv("MEMEFF_BACKENDS");
  EXPECT_EQ(c.forward().backend, "cpu");  // the default order again
}

TEST_F(HotPathTest, NoBackendStillListsEveryReasonEachTime) {
  Call c(DType::f32, 4);
  HostTensor wide(DType::f32, {1, 2, 4, 9});
  AttentionArgs misaligned = c.args();
  misaligned.q = TensorView::strided(static_cast<float*>(wide.view.data) + 1, DType::f32,
                                     {1, 2, 4, 8}, {72, 36, 9, 1});
  for (int i = 0; i < 2; ++i) {
    try {
      forward(misaligned, c.out.view, c.lse.view, only({"hot_first"}));
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported);
      EXPECT_NE(std::string(e.what()).find("hot_first: refused by its rule"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(HotPathTest, TurningTheLogOnLogsADecisionAlreadyRemembered) {
  const Options order = only({"hot_first", "hot_second"});
  Call c(DType::f32, 11);
  c.forward(order);
  setenv("MEMEFF_LOG_DISPATCH", "1", 1);
  ::testing::internal::CaptureStderr();
  c.forward(order);
  c.forward(order);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("memeff: dispatch forward"), std::string::npos) << err;
  EXPECT_NE(err.find("Lq=11"), std::string::npos) << err;
  EXPECT_EQ(err.find("memeff: dispatch", err.find("memeff: dispatch") + 1), std::string::npos)
      << "logged twice: " << err;
}

TEST_F(HotPathTest, APreparedCallsWorkspaceAndRunShareOneDecision) {
  Call c(DType::f32, 4);
  PreparedCall call =
      PreparedCall::forward(c.args(), c.out.view, c.lse.view, only({"hot_first", "hot_second"}));
  EXPECT_EQ(call.backend(), "hot_first");
  EXPECT_EQ(call.workspace_bytes(), 64u);
  EXPECT_EQ(call.problem().Lq, 4);
  alignas(16) unsigned char scratch[64];
  const CallInfo info = call.run(scratch, sizeof scratch);
  EXPECT_EQ(info.backend, "hot_first");
  EXPECT_EQ(first->last_workspace, scratch);
  EXPECT_EQ(first->reasons_calls, 1);
  PreparedCall back = PreparedCall::backward(c.args(), c.grads(), only({"hot_second"}));
  EXPECT_EQ(back.workspace_bytes(), 32u);
  EXPECT_EQ(workspace_size(c.args(), Pass::backward, only({"hot_second"})), 32u);
  back.run();
  EXPECT_EQ(second->backward_calls, 1);
  EXPECT_EQ(second->last_workspace, nullptr);  // none given: the backend would allocate its own
  // Bad arguments are refused when the call is prepared, naming the argument.
  AttentionArgs bad = c.args();
  bad.dropout_p = 1.5;
  EXPECT_THROW(PreparedCall::forward(bad, c.out.view, c.lse.view), Error);
}

TEST_F(HotPathTest, ADecidedCallAllocatesNoHostMemory) {
  if (!test::allocation_counting()) GTEST_SKIP() << "allocation counting is off in this build";
  Call c(DType::f32, 4);
  c.forward();  // the default order: decided (and run) once here; below only decided
  c.backward();
  std::size_t allocations = 0;
  {
    test::AllocationCount count;
    for (int i = 0; i < 10; ++i) {
      PreparedCall f = PreparedCall::forward(c.args(), c.out.view, c.lse.view, {});
      PreparedCall b = PreparedCall::backward(c.args(), c.grads(), {});
      EXPECT_EQ(f.backend(), "cpu");
      EXPECT_EQ(b.backend(), "cpu");
    }
    allocations = count.calls();
  }
  EXPECT_EQ(allocations, 0u);
}

}  // namespace
}  // namespace memeff
