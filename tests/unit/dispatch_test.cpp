// Dispatch as a specification: which backend runs for a table of argument sets, why the others
// do not, how the user's order (options > scoped guard > MEMEFF_BACKENDS > default) is obeyed,
// the error that lists every backend's reasons, explain()'s text and JSON, and the dispatch log.
#include "memeff/dispatch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/call_helpers.h"
#include "common/fake_backend.h"
#include "common/host_tensor.h"
#include "core/dispatch_decision.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::contains;
using test::HostTensor;
using test::only;
using Reasons = std::function<std::vector<std::string>(const Problem&, Pass)>;

// A backend that refuses by a rule and counts its calls; it computes nothing.
class FakeBackend final : public test::FakeBackend {
 public:
  FakeBackend(std::string name, DeviceType device, Reasons reasons, std::size_t workspace = 0)
      : test::FakeBackend(std::move(name), device),
        reasons_(std::move(reasons)),
        workspace_(workspace) {}
  std::vector<std::string> reasons_unsupported(const Problem& p, Pass pass) const override {
    return reasons_ ? reasons_(p, pass) : std::vector<std::string>{};
  }
  std::size_t workspace_bytes(const Problem&, Pass) const override { return workspace_; }

 private:
  Reasons reasons_;
  std::size_t workspace_;
};

// Registers fakes for one test and removes them afterwards.
class DispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("MEMEFF_BACKENDS");
    unsetenv("MEMEFF_AUTOTUNE");
    unsetenv("MEMEFF_LOG_DISPATCH");
    small_d = add(
        "fake_small_d", DeviceType::cpu,
        [](const Problem& p, Pass) {
          std::vector<std::string> r;
          if (p.D > 16) r.push_back("head dim D=" + std::to_string(p.D) + " > 16");
          return r;
        },
        1234);
    no_dropout = add(
        "fake_no_dropout", DeviceType::cpu,
        [](const Problem& p, Pass pass) {
          std::vector<std::string> r;
          if (p.has_dropout()) r.push_back("dropout is not supported");
          if (pass == Pass::backward && p.has_bias) r.push_back("no dbias in the backward");
          return r;
        },
        99);
    gpu = add("fake_gpu", DeviceType::cuda, nullptr);
  }
  void TearDown() override {
    for (const std::string& n : added) unregister_backend(n);
    unsetenv("MEMEFF_BACKENDS");
    unsetenv("MEMEFF_LOG_DISPATCH");
  }
  std::shared_ptr<FakeBackend> add(const std::string& name, DeviceType device, Reasons reasons,
                                   std::size_t workspace = 0) {
    auto b = std::make_shared<FakeBackend>(name, device, std::move(reasons), workspace);
    register_backend(b);
    added.push_back(name);
    return b;
  }

  std::shared_ptr<FakeBackend> small_d, no_dropout, gpu;
  std::vector<std::string> added;
};

struct Call {
  HostTensor q, k, v, out, lse, bias;
  double dropout = 0.0;
  bool with_bias = false;
  Call(std::int64_t D, std::int64_t Lq = 4, double p = 0.0, bool b = false)
      : q(DType::f32, {1, 2, Lq, D}),
        k(DType::f32, {1, 2, 5, D}),
        v(DType::f32, {1, 2, 5, 8}),
        out(DType::f32, {1, 2, Lq, 8}),
        lse(DType::f32, {1, 2, Lq}),
        bias(DType::f32, {1, 1, 1, 5}),
        dropout(p),
        with_bias(b) {}
  AttentionArgs args() const {
    AttentionArgs a = test::attention_args(q, k, v);
    a.dropout_p = dropout;
    if (with_bias) a.bias = bias.view;
    return a;
  }
};

const BackendReport* report_of(const Explanation& ex, const std::string& name) {
  for (const BackendReport& r : ex.backends) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

TEST_F(DispatchTest, ChoicesAndReasonsForATableOfArgumentSets) {
  const std::vector<std::string> order = {"fake_gpu", "fake_small_d", "fake_no_dropout"};
  struct Row {
    std::int64_t D;
    double p;
    bool bias;
    Pass pass;
    const char* chosen;  // "" when none qualifies
  } rows[] = {
      {8, 0.0, false, Pass::forward, "fake_small_d"},
      {32, 0.0, false, Pass::forward, "fake_no_dropout"},
      {8, 0.1, false, Pass::forward, "fake_small_d"},
      {32, 0.1, false, Pass::forward, ""},
      {32, 0.0, true, Pass::forward, "fake_no_dropout"},
      {32, 0.0, true, Pass::backward, ""},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE("D=" + std::to_string(row.D) + " p=" + std::to_string(row.p) +
                 " bias=" + std::to_string(row.bias));
    Call c(row.D, 4, row.p, row.bias);
    const Explanation ex = explain(c.args(), row.pass, only(order));
    EXPECT_EQ(ex.chosen, row.chosen);
    EXPECT_EQ(ex.order, order);
    EXPECT_EQ(ex.order_source, "options");
    const BackendReport* g = report_of(ex, "fake_gpu");
    ASSERT_NE(g, nullptr);
    EXPECT_FALSE(g->eligible);
    ASSERT_EQ(g->reasons.size(), 1u);
    EXPECT_TRUE(contains(g->reasons[0], "runs on cuda, the tensors are on cpu")) << g->reasons[0];
    const BackendReport* s = report_of(ex, "fake_small_d");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->eligible, row.D <= 16);
    if (row.D > 16) {
      EXPECT_EQ(s->reasons, std::vector<std::string>{"head dim D=32 > 16"});
    }
    const BackendReport* n = report_of(ex, "fake_no_dropout");
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->eligible, row.p == 0.0 && !(row.bias && row.pass == Pass::backward));
    if (*row.chosen) {
      EXPECT_TRUE(contains(ex.reason, "user restriction (options)")) << ex.reason;
    } else {
      EXPECT_EQ(ex.reason, "no backend qualifies");
    }
  }
}

TEST_F(DispatchTest, ForwardRunsTheChosenBackendAndReportsIt) {
  Call c(32);
  const CallInfo info =
      forward(c.args(), c.out.view, c.lse.view, only({"fake_small_d", "fake_no_dropout"}));
  EXPECT_EQ(info.backend, "fake_no_dropout");
  EXPECT_EQ(no_dropout->forward_calls, 1);
  EXPECT_EQ(small_d->forward_calls, 0);
  EXPECT_EQ(workspace_size(c.args(), Pass::forward, only({"fake_small_d", "fake_no_dropout"})),
            99u);
  Call c8(8);
  EXPECT_EQ(workspace_size(c8.args(), Pass::forward, only({"fake_small_d", "fake_no_dropout"})),
            1234u);
}

TEST_F(DispatchTest, TheErrorListsEveryBackendWithItsReasons) {
  Call c(32, 4, 0.1);
  try {
    forward(c.args(), c.out.view, c.lse.view, only({"fake_small_d", "fake_no_dropout", "nope"}));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_TRUE(contains(m, "fake_small_d: head dim D=32 > 16")) << m;
    EXPECT_TRUE(contains(m, "fake_no_dropout: dropout is not supported")) << m;
    EXPECT_TRUE(contains(m, "nope: not a registered backend of this build")) << m;
    EXPECT_TRUE(contains(m, "fake_gpu: not in the backend list of options; runs on cuda")) << m;
    EXPECT_TRUE(contains(m, "reference: not in the backend list of options")) << m;
    EXPECT_TRUE(contains(m, "D=32")) << m;
  }
  EXPECT_EQ(small_d->forward_calls + no_dropout->forward_calls, 0);
}

TEST_F(DispatchTest, DefaultOrderIsTheDeviceHeuristicThenOtherBackendsOfTheDevice) {
  Call c(8);
  const Explanation ex = explain(c.args(), Pass::forward);
  EXPECT_EQ(ex.order_source, "default");
  ASSERT_GE(ex.order.size(), 4u);
  EXPECT_EQ(ex.order[0], "cpu");
  EXPECT_EQ(ex.order[1], "reference");
  EXPECT_NE(std::find(ex.order.begin(), ex.order.end(), "fake_small_d"), ex.order.end());
  EXPECT_EQ(std::find(ex.order.begin(), ex.order.end(), "fake_gpu"), ex.order.end());
  // The choice is the first eligible name of the order.
  std::string first;
  for (const std::string& n : ex.order) {
    const BackendReport* r = report_of(ex, n);
    if (r && r->eligible) {
      first = n;
      break;
    }
  }
  EXPECT_EQ(ex.chosen, first);
  EXPECT_TRUE(contains(ex.reason, "first eligible in the default order")) << ex.reason;
  EXPECT_TRUE(report_of(ex, "fake_gpu") && !report_of(ex, "fake_gpu")->eligible);
}

// The CUDA default order: the Hopper kernels, then the mma.sync fused kernels on every shape
// (measured faster down to 32×32 scores), cuda_math third and the split-KV forward last; shapes,
// dtypes and flags outside the decode rule do not change it (MEMEFF_AUTOTUNE is what adapts to a
// shape), while the device does.
TEST_F(DispatchTest, CudaHeuristicPutsTheHopperThenTheFusedKernelsFirstOnEveryShape) {
  Problem base;
  base.device = Device::cuda(0);
  base.B = 2, base.Hq = base.Hkv = 8, base.Lq = base.Lk = 512, base.D = base.Dv = 64;
  const std::vector<std::string> order = detail::default_order(base).order;
  ASSERT_GE(order.size(), 4u);
  EXPECT_EQ(order[0], "cuda_sm90");
  EXPECT_EQ(order[1], "cuda");
  EXPECT_EQ(order[2], "cuda_math");
  EXPECT_EQ(order[3], "cuda_splitkv");
  EXPECT_NE(std::find(order.begin(), order.end(), "fake_gpu"), order.end());
  EXPECT_EQ(std::find(order.begin(), order.end(), "fake_small_d"), order.end());
  const std::vector<std::function<void(Problem&)>> variations = {
      [](Problem& p) { p.Lq = p.Lk = 1; },
      [](Problem& p) { p.Lq = p.Lk = 16; },
      [](Problem& p) { p.Lq = 65, p.Lk = 4096; },
      [](Problem& p) { p.D = p.Dv = 256; },
      [](Problem& p) { p.dtype = DType::bf16; },
      [](Problem& p) { p.causal = CausalMode::bottom_right; },
      [](Problem& p) { p.dropout = dropout_threshold(0.1); },
  };
  for (const auto& vary : variations) {
    Problem p = base;
    vary(p);
    EXPECT_EQ(detail::default_order(p).order, order) << p.describe();
    EXPECT_EQ(detail::default_order(p, Pass::backward).order, order) << p.describe();
  }
  Problem on_cpu = base;
  on_cpu.device = Device::cpu();
  EXPECT_EQ(detail::default_order(on_cpu).order.at(0), "cpu");
}

// Decode-like forwards (few query rows per kv head: Lq·Hq/Hkv <= 64, over Lk >= 512 keys, with a
// fused grid that does not fill the GPU by itself, under one wave without GQA; with a window, the
// keys it leaves visible count) put the split-KV forward first and say why;
// their backward keeps the fused order (the split path is forward only), and packed calls,
// short key ranges and wide query groups keep the fused kernels first.
TEST_F(DispatchTest, CudaHeuristicPutsTheSplitKvForwardFirstForFewQueriesPerKvHead) {
  Problem decode;
  decode.device = Device::cuda(0);
  decode.B = 8, decode.Hq = 32, decode.Hkv = 8, decode.Lq = 1, decode.Lk = 8192;
  decode.D = decode.Dv = 128;
  decode.dtype = DType::bf16;
  const detail::HeuristicOrder h = detail::default_order(decode, Pass::forward);
  ASSERT_GE(h.order.size(), 4u);
  EXPECT_EQ(h.order[0], "cuda_splitkv");
  EXPECT_EQ(h.order[1], "cuda_sm90");
  EXPECT_TRUE(contains(h.why, "Lq·Hq/Hkv = 4")) << h.why;
  EXPECT_TRUE(contains(h.why, "Lk = 8192")) << h.why;
  EXPECT_TRUE(contains(h.why, "256 CTAs")) << h.why;
  EXPECT_EQ(detail::default_order(decode, Pass::backward).order.at(0), "cuda_sm90");
  // With a window it counts the keys some query sees, and says so.
  Problem windowed = decode;
  windowed.causal = CausalMode::bottom_right;
  windowed.window_left = 1023;
  const detail::HeuristicOrder hw = detail::default_order(windowed, Pass::forward);
  EXPECT_EQ(hw.order.at(0), "cuda_splitkv");
  EXPECT_TRUE(contains(hw.why, "1024 keys the window leaves visible (Lk = 8192) >= 512")) << hw.why;
  EXPECT_TRUE(contains(detail::default_order(decode, Pass::backward).why, "forward only"));

  const std::vector<std::pair<const char*, std::function<void(Problem&)>>> taken = {
      {"16 queries over 32768 keys, group 4", [](Problem& p) { p.Lq = 16, p.Lk = 32768; }},
      {"64 rows exactly", [](Problem& p) { p.Lq = 8, p.Hkv = 4; }},
      {"512 keys exactly", [](Problem& p) { p.Lk = 512; }},
      {"no GQA, 32 heads", [](Problem& p) { p.B = 1, p.Hq = p.Hkv = 32, p.Lk = 32768; }},
      {"chunked prefill", [](Problem& p) { p.Lq = 4, p.causal = CausalMode::bottom_right; }},
      {"dropout", [](Problem& p) { p.dropout = dropout_threshold(0.1); }},
      {"a window of the last 512 keys",
       [](Problem& p) { p.causal = CausalMode::bottom_right, p.window_left = 511; }},
      {"a window wider than the keys",
       [](Problem& p) { p.window_left = p.window_right = 1 << 20; }},
      {"ALiBi and a softcap", [](Problem& p) { p.has_alibi = true, p.softcap = 30.0; }},
  };
  for (const auto& [what, vary] : taken) {
    Problem p = decode;
    vary(p);
    EXPECT_EQ(detail::default_order(p, Pass::forward).order.at(0), "cuda_splitkv") << what;
  }
  const std::vector<std::pair<const char*, std::function<void(Problem&)>>> not_taken = {
      {"68 rows", [](Problem& p) { p.Lq = 17; }},
      {"511 keys", [](Problem& p) { p.Lk = 511; }},
      {"packed", [](Problem& p) { p.packed = true; }},
      {"a fused grid of 8192 CTAs", [](Problem& p) { p.B = 256; }},
      {"no GQA, 256 heads", [](Problem& p) { p.B = 16, p.Hq = p.Hkv = 16, p.D = p.Dv = 64; }},
      {"a window of the last 511 keys",
       [](Problem& p) { p.causal = CausalMode::bottom_right, p.window_left = 510; }},
      {"a window of 101 keys", [](Problem& p) { p.window_left = 50, p.window_right = 50; }},
  };
  for (const auto& [what, vary] : not_taken) {
    Problem p = decode;
    vary(p);
    const std::vector<std::string> order = detail::default_order(p, Pass::forward).order;
    EXPECT_EQ(order.at(0), "cuda_sm90") << what;
    EXPECT_EQ(order.at(3), "cuda_splitkv") << what;
  }
}

TEST_F(DispatchTest, ScopedGuardsNestAndOptionsStillWin) {
  Call c(8);
  EXPECT_EQ(explain(c.args(), Pass::forward).order_source, "default");
  {
    ScopedBackends outer({"fake_no_dropout"});
    Explanation ex = explain(c.args(), Pass::forward);
    EXPECT_EQ(ex.order_source, "scoped guard");
    EXPECT_EQ(ex.chosen, "fake_no_dropout");
    {
      ScopedBackends inner({"fake_small_d", "fake_no_dropout"});
      ex = explain(c.args(), Pass::forward);
      EXPECT_EQ(ex.chosen, "fake_small_d");
      EXPECT_EQ(ex.order, (std::vector<std::string>{"fake_small_d", "fake_no_dropout"}));
      // Options on the call beat the innermost guard.
      EXPECT_EQ(explain(c.args(), Pass::forward, only({"fake_no_dropout"})).chosen,
                "fake_no_dropout");
      EXPECT_EQ(forward(c.args(), c.out.view, c.lse.view).backend, "fake_small_d");
    }
    EXPECT_EQ(explain(c.args(), Pass::forward).chosen, "fake_no_dropout");
    // Guards are per thread: another thread sees the default order.
    std::string other;
    std::thread t([&] { other = explain(c.args(), Pass::forward).order_source; });
    t.join();
    EXPECT_EQ(other, "default");
  }
  EXPECT_EQ(explain(c.args(), Pass::forward).order_source, "default");
  EXPECT_THROW(ScopedBackends({}), Error);
}

TEST_F(DispatchTest, EnvironmentOrderAndItsErrorForUnknownNames) {
  Call c(8);
  setenv("MEMEFF_BACKENDS", " fake_no_dropout , fake_small_d", 1);
  Explanation ex = explain(c.args(), Pass::forward);
  EXPECT_EQ(ex.order_source, "MEMEFF_BACKENDS");
  EXPECT_EQ(ex.order, (std::vector<std::string>{"fake_no_dropout", "fake_small_d"}));
  EXPECT_EQ(ex.chosen, "fake_no_dropout");
  {
    ScopedBackends guard({"fake_small_d"});
    EXPECT_EQ(explain(c.args(), Pass::forward).chosen, "fake_small_d");  // guard beats env
  }
  setenv("MEMEFF_BACKENDS", "fake_small_d,not_a_backend", 1);
  try {
    forward(c.args(), c.out.view, c.lse.view);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(contains(e.what(), "MEMEFF_BACKENDS")) << e.what();
    EXPECT_TRUE(contains(e.what(), "\"not_a_backend\" is not a registered backend")) << e.what();
    EXPECT_TRUE(contains(e.what(), "reference")) << e.what();
  }
  EXPECT_EQ(small_d->forward_calls, 0);
  setenv("MEMEFF_BACKENDS", "", 1);  // blank: as if unset
  EXPECT_EQ(explain(c.args(), Pass::forward).order_source, "default");
}

TEST_F(DispatchTest, ExplanationTextAndJson) {
  Call c(32);
  const Explanation ex =
      explain(c.args(), Pass::backward, only({"fake_small_d", "fake_no_dropout"}));
  const std::string text = ex.to_string();
  EXPECT_TRUE(contains(text, "backward")) << text;
  EXPECT_TRUE(contains(text, "order (options): fake_small_d, fake_no_dropout")) << text;
  EXPECT_TRUE(contains(text, "not eligible: head dim D=32 > 16")) << text;
  EXPECT_TRUE(contains(text, "chosen: fake_no_dropout (user restriction (options)")) << text;
  const auto doc = nlohmann::json::parse(ex.to_json(), nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << ex.to_json();
  EXPECT_EQ(doc.at("chosen"), "fake_no_dropout");
  EXPECT_EQ(doc.at("pass"), "backward");
  EXPECT_EQ(doc.at("order_source"), "options");
  EXPECT_EQ(doc.at("problem").at("D"), 32);
  bool saw_small_d = false;
  for (const auto& b : doc.at("backends")) {
    if (b.at("name") != "fake_small_d") continue;
    saw_small_d = true;
    EXPECT_FALSE(b.at("eligible").get<bool>());
    EXPECT_EQ(b.at("reasons").at(0), "head dim D=32 > 16");
  }
  EXPECT_TRUE(saw_small_d);
  // No backend: chosen is null in JSON and "none" in text.
  Call bad(32, 4, 0.1);
  const Explanation none = explain(bad.args(), Pass::forward, only({"fake_small_d"}));
  EXPECT_TRUE(none.chosen.empty());
  EXPECT_TRUE(nlohmann::json::parse(none.to_json()).at("chosen").is_null());
  EXPECT_TRUE(contains(none.to_string(), "chosen: none")) << none.to_string();
}

TEST_F(DispatchTest, LogDispatchPrintsEachDecisionOncePerShape) {
  setenv("MEMEFF_LOG_DISPATCH", "1", 1);
  Call a(8, 3), b(8, 7);
  ::testing::internal::CaptureStderr();
  forward(a.args(), a.out.view, a.lse.view, only({"fake_no_dropout"}));
  forward(a.args(), a.out.view, a.lse.view, only({"fake_no_dropout"}));
  forward(b.args(), b.out.view, b.lse.view, only({"fake_no_dropout"}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  std::size_t lines = 0;
  for (std::size_t at = err.find("memeff: dispatch"); at != std::string::npos;
       at = err.find("memeff: dispatch", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 2u) << err;
  EXPECT_TRUE(contains(err, "Lq=3")) << err;
  EXPECT_TRUE(contains(err, "Lq=7")) << err;
  EXPECT_TRUE(contains(err, "-> fake_no_dropout")) << err;
  EXPECT_EQ(no_dropout->forward_calls, 3);
}

}  // namespace
}  // namespace memeff
