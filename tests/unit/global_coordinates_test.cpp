// AttentionArgs::q_start, k_start and kv_block (docs/context_parallel.md) on single calls: their
// validation and errors; the dispatcher's refusal for backends that do not implement them; a
// slice of the queries at its global rows reproduces those rows of the whole attention; the
// whole attention is the lse merge of key-block forwards and the sum of kv_block backwards taken
// with the whole out and lse (including rows that see one key of a block and more elsewhere);
// the cpu backend draws the map's mask at key starts off the 64-key blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/call_helpers.h"
#include "common/fake_backend.h"
#include "common/tolerance.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::Case;
using test::contains;
using test::expect_close;
using test::HostTensor;
using test::only;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The message of the invalid-argument error a call throws (a failure when it throws none).
std::string error_of(const std::function<void()>& call) {
  const test::Thrown thrown = test::thrown_by(call);
  if (thrown.error) {
    EXPECT_EQ(thrown.code, ErrorCode::invalid_argument) << thrown.message;
  } else {
    ADD_FAILURE() << "no error";
  }
  return thrown.message;
}

// `count` rows of dimension 2 from `start`, as a view of `t`'s memory.
TensorView rows(const TensorView& t, std::int64_t start, std::int64_t count) {
  TensorView v = t;
  v.shape[2] = count;
  v.data = static_cast<char*>(t.data) +
           start * t.stride[2] * static_cast<std::int64_t>(dtype_size(t.dtype));
  return v;
}
TensorView cols(const TensorView& t, std::int64_t start, std::int64_t count) {
  TensorView v = t;
  v.shape[3] = count;
  v.data = static_cast<char*>(t.data) + start * static_cast<std::int64_t>(dtype_size(t.dtype));
  return v;
}

// A dense copy of a view (rank 3 or 4) as a HostTensor of its dtype.
HostTensor copy_of(const TensorView& view) {
  std::vector<std::int64_t> shape(view.shape.begin(), view.shape.begin() + view.rank);
  HostTensor t(view.dtype, shape);
  const std::int64_t n = t.numel();
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t rest = flat, off = 0;
    for (int d = view.rank - 1; d >= 0; --d) {
      off += (rest % view.shape[d]) * view.stride[d];
      rest /= view.shape[d];
    }
    t.set(flat, load_element(view.data, view.dtype, off));
  }
  return t;
}

TEST(GlobalCoordinates, ValidationNamesTheArgument) {
  Case c({.Lq = 8, .Lk = 8}, 1);
  auto fwd = [&](const AttentionArgs& a) { forward(a, c.out.view, c.lse.view); };
  AttentionArgs a = c.args();
  a.q_start = -1;
  EXPECT_TRUE(contains(error_of([&] { fwd(a); }),
                       "argument `q_start`: expected a global position >= 0, got -1"));
  a = c.args();
  a.k_start = -5;
  EXPECT_TRUE(contains(error_of([&] { fwd(a); }), "argument `k_start`"));
  a = c.args();
  a.q_start = (std::int64_t{1} << 32) - 4;  // + 8 rows: past the dropout map's rows
  const std::string rows_error = error_of([&] { fwd(a); });
  EXPECT_TRUE(contains(rows_error, "argument `q_start`")) << rows_error;
  EXPECT_TRUE(contains(rows_error, "2^32 rows")) << rows_error;
  a.q_start = (std::int64_t{1} << 32) - 8;  // the last 8 rows: fine
  EXPECT_NO_THROW(fwd(a));
  a = c.args();
  a.k_start = (std::int64_t{1} << 36) - 7;
  EXPECT_TRUE(contains(error_of([&] { fwd(a); }), "2^36 keys"));
  a = c.args();
  a.causal = CausalMode::bottom_right;
  a.q_start = 8;
  EXPECT_TRUE(
      contains(error_of([&] { fwd(a); }), "argument `causal`: bottom_right is not defined"));
  a.q_start = 0;
  a.kv_block = true;  // a block of a larger attention has no bottom-right of its own either
  EXPECT_TRUE(contains(error_of([&] { fwd(a); }), "argument `causal`"));
}

TEST(GlobalCoordinates, PackedCallsRefuseThem) {
  HostTensor q(DType::f32, {6, 2, 8}), k(DType::f32, {6, 2, 8}), v(DType::f32, {6, 2, 8});
  HostTensor out(DType::f32, {6, 2, 8}), lse(DType::f32, {2, 6});
  HostTensor cu(DType::i32, {3});
  cu.set(0, 0);
  cu.set(1, 2);
  cu.set(2, 6);
  AttentionArgs a = test::attention_args(q, k, v);
  a.packed = PackedSequences{cu.view, cu.view, 4, 4};
  a.k_start = 64;
  EXPECT_TRUE(contains(error_of([&] { forward(a, out.view, lse.view); }),
                       "argument `k_start`: not supported with packed sequences"));
}

TEST(GlobalCoordinates, BackendsThatDoNotImplementThemAreRefusedWithAReason) {
  // Backends that predate the fields (test::FakeBackend keeps Backend's default, false): they
  // would run the call as a standalone attention.
  register_backend(std::make_shared<test::FakeBackend>("old_cpu", DeviceType::cpu));
  register_backend(std::make_shared<test::FakeBackend>("old_gpu", DeviceType::cuda));
  Case c({}, 2);
  AttentionArgs a = c.args();
  EXPECT_TRUE(explain(a, Pass::forward, only({"old_cpu"})).backends.at(0).eligible);  // no starts
  a.k_start = 64;
  Explanation ex = explain(a, Pass::forward, only({"old_cpu", "cpu"}));
  ASSERT_FALSE(ex.backends.at(0).eligible);
  EXPECT_TRUE(contains(ex.backends.at(0).reasons.at(0), "Backend::supports_global_coordinates"));
  EXPECT_EQ(ex.chosen, "cpu");
  EXPECT_EQ(explain(a, Pass::forward, only({"reference"})).chosen, "reference");
  // The same call on a (pretend) GPU: a kv_block call alone is refused as well.
  AttentionArgs g = a;
  for (TensorView* t : {&g.q, &g.k, &g.v}) t->device = Device::cuda(0);
  g.k_start = 0;
  g.kv_block = true;
  ex = explain(g, Pass::backward, only({"old_gpu"}));
  ASSERT_FALSE(ex.backends.at(0).eligible);
  EXPECT_TRUE(contains(ex.backends.at(0).reasons.at(0), "Backend::supports_global_coordinates"))
      << ex.backends.at(0).reasons.at(0);
  unregister_backend("old_cpu");
  unregister_backend("old_gpu");
}

// The CUDA backends take block calls (they are compiled everywhere and a call on a pretend GPU
// is explained without one): what they refuse is named. With dropout, the fused kernels' key
// starts off the 64-key blocks (cuda_math takes any start); nothing about global coordinates
// themselves.
TEST(GlobalCoordinates, CudaBackendsNameWhatTheyRefuse) {
  const std::vector<std::string> registered = backend_names();
  Case c({.D = 64, .dropout = 0.1, .dtype = DType::bf16}, 7);
  AttentionArgs a = c.args();
  for (TensorView* t : {&a.q, &a.k, &a.v}) t->device = Device::cuda(0);
  int seen = 0;
  for (const std::string name : {"cuda", "cuda_sm90", "cuda_math"}) {
    if (std::find(registered.begin(), registered.end(), name) == registered.end()) continue;
    ++seen;
    for (const std::int64_t k_start : {std::int64_t{100}, std::int64_t{128}}) {
      a.k_start = k_start;
      const Explanation ex = explain(a, Pass::backward, only({name}));
      std::string all;
      for (const auto& report : ex.backends) {
        if (report.name != name) continue;
        for (const std::string& r : report.reasons) all += r + "\n";
      }
      const std::string what = name + " k_start " + std::to_string(k_start) + ":\n" + all;
      EXPECT_FALSE(contains(all, "supports_global_coordinates")) << what;
      EXPECT_EQ(contains(all, "multiple of 64"), name != "cuda_math" && k_start % 64 != 0) << what;
    }
  }
  if (seen == 0) GTEST_SKIP() << "built without the CUDA backends";
}

// The tests below run on each host backend.
class GlobalCoordinatesOnHost : public ::testing::TestWithParam<std::string> {};

// Rows [a, a + m) of the whole attention, computed alone with q_start = a against every key,
// are those rows of the whole: the mask and the causal diagonal follow the global row.
TEST_P(GlobalCoordinatesOnHost, AQuerySliceAtItsGlobalRowsIsThoseRowsOfTheWhole) {
  const std::string backend = GetParam();
  for (CausalMode causal : {CausalMode::none, CausalMode::top_left}) {
    const test::Config cfg{.Lq = 150, .Lk = 150, .D = 24, .causal = causal, .dropout = 0.4};
    Case whole(cfg, 3);
    whole.run_forward(backend);
    whole.run_backward(backend);
    const std::int64_t a = 70, m = 50;
    AttentionArgs args = whole.args();
    args.q = rows(whole.q.view, a, m);
    args.q_start = a;
    HostTensor out(DType::f32, {1, cfg.Hq, m, cfg.D}), lse(DType::f32, {1, cfg.Hq, m});
    HostTensor dq(DType::f32, {1, cfg.Hq, m, cfg.D}), dk = whole.dk, dv = whole.dv;
    forward(args, out.view, lse.view, only({backend}));
    const HostTensor want_out = copy_of(rows(whole.out.view, a, m));
    const HostTensor want_lse = copy_of(rows(whole.lse.view, a, m));
    const std::string what = backend + " " + causal_mode_name(causal);
    const test::Diff d_out = test::compare(out, want_out), d_lse = test::compare(lse, want_lse);
    // Row by row the same arithmetic: bit for bit.
    EXPECT_EQ(d_out.max_abs, 0.0) << what << " out at " << d_out.where(out);
    EXPECT_EQ(d_lse.max_abs, 0.0) << what << " lse at " << d_lse.where(lse);
    EXPECT_FALSE(d_out.nan || d_lse.nan) << what;
    // The backward of the slice: dq of those rows (its own out and lse are the whole's rows).
    const HostTensor dout_rows = copy_of(rows(whole.dout.view, a, m));
    backward(args, {dout_rows.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt},
             only({backend}));
    expect_close(dq, copy_of(rows(whole.dq.view, a, m)),
                 test::backward_tolerance(DType::f32, cfg.Lk), what + " dq");
  }
}

// One attention computed as key blocks at uneven starts (37 and 101: off the 64-key blocks):
// forward partials merged through lse, backward blocks with kv_block and the whole out and lse.
void check_key_blocks(const std::string& backend, DType dtype, CausalMode causal,
                      const std::string& bias) {
  test::Config cfg{.Hq = 4, .Hkv = 2, .Lq = 140, .Lk = 140, .D = 24, .Dv = 16, .dropout = 0.3};
  cfg.causal = causal;
  cfg.bias = bias;
  cfg.dtype = dtype;
  Case whole(cfg, 4);
  whole.run_forward(backend);
  whole.run_backward(backend);
  const std::vector<std::int64_t> starts = {0, 37, 101, cfg.Lk};
  const Options o = only({backend});
  // Forward: merge partial (out, lse) of each block, row by row in double.
  const std::int64_t rows_total = cfg.B * cfg.Hq * cfg.Lq;
  std::vector<double> m_lse(rows_total, kNegInf), m_out(rows_total * cfg.Dv, 0.0);
  // Backward: gradients summed over the blocks.
  HostTensor dq_sum(dtype, {1, cfg.Hq, cfg.Lq, cfg.D}), dk_all = whole.dk, dv_all = whole.dv;
  std::vector<double> dq_acc(dq_sum.numel(), 0.0);
  std::optional<HostTensor> dbias_all;
  if (whole.dbias) dbias_all = *whole.dbias;
  for (std::size_t blk = 0; blk + 1 < starts.size(); ++blk) {
    const std::int64_t k0 = starts[blk], kn = starts[blk + 1] - k0;
    AttentionArgs a = whole.args();
    a.k = rows(whole.k.view, k0, kn);
    a.v = rows(whole.v.view, k0, kn);
    a.k_start = k0;
    if (whole.bias) a.bias = cols(whole.bias->view, k0, kn);
    HostTensor out(dtype, {1, cfg.Hq, cfg.Lq, cfg.Dv}), lse(DType::f32, {1, cfg.Hq, cfg.Lq});
    forward(a, out.view, lse.view, o);
    for (std::int64_t r = 0; r < rows_total; ++r) {
      const double l = lse.get(r);
      if (l == kNegInf) continue;
      const double hi = std::max(l, m_lse[r]);
      const double merged = hi + std::log(std::exp(l - hi) + std::exp(m_lse[r] - hi));
      for (std::int64_t e = 0; e < cfg.Dv; ++e) {
        double& acc = m_out[r * cfg.Dv + e];
        acc = (m_lse[r] == kNegInf ? 0.0 : acc * std::exp(m_lse[r] - merged)) +
              out.get(r * cfg.Dv + e) * std::exp(l - merged);
      }
      m_lse[r] = merged;
    }
    a.kv_block = true;
    HostTensor dq(dtype, {1, cfg.Hq, cfg.Lq, cfg.D});
    BackwardTensors g{whole.dout.view,
                      whole.out.view,
                      whole.lse.view,
                      dq.view,
                      rows(dk_all.view, k0, kn),
                      rows(dv_all.view, k0, kn),
                      std::nullopt};
    if (dbias_all) g.dbias = cols(dbias_all->view, k0, kn);
    backward(a, g, o);
    for (std::int64_t i = 0; i < dq.numel(); ++i) dq_acc[i] += dq.get(i);
  }
  HostTensor out_merged(dtype, {1, cfg.Hq, cfg.Lq, cfg.Dv}),
      lse_merged(DType::f32, {1, cfg.Hq, cfg.Lq});
  for (std::int64_t i = 0; i < out_merged.numel(); ++i) out_merged.set(i, m_out[i]);
  for (std::int64_t r = 0; r < rows_total; ++r) lse_merged.set(r, m_lse[r]);
  for (std::int64_t i = 0; i < dq_sum.numel(); ++i) dq_sum.set(i, dq_acc[i]);
  const std::string what =
      backend + " " + dtype_name(dtype) + " " + causal_mode_name(causal) + " bias " + bias;
  const auto ftol = test::forward_tolerance(dtype, cfg.Lk),
             btol = test::backward_tolerance(dtype, cfg.Lk);
  expect_close(out_merged, whole.out, {2 * ftol.atol, 2 * ftol.rtol}, what + " out");
  expect_close(lse_merged, whole.lse, ftol, what + " lse");
  expect_close(dq_sum, whole.dq, {2 * btol.atol, 2 * btol.rtol}, what + " dq");
  expect_close(dk_all, whole.dk, btol, what + " dk");
  expect_close(dv_all, whole.dv, btol, what + " dv");
  if (dbias_all) expect_close(*dbias_all, *whole.dbias, btol, what + " dbias");
}

TEST_P(GlobalCoordinatesOnHost, KeyBlocksMergeIntoTheWholeAttention) {
  for (CausalMode causal : {CausalMode::none, CausalMode::top_left}) {
    check_key_blocks(GetParam(), DType::f32, causal, causal == CausalMode::none ? "bhqk" : "none");
  }
}

// A diagonal block's first row sees exactly one of its keys but every key before the block too:
// without kv_block's rule the single-key shortcut would zero that row's dS (caught by dq above);
// here the block's dk of that key is checked directly against the whole's, on both backends.
TEST_P(GlobalCoordinatesOnHost, KvBlockRowsThatSeeOneKeyOfTheBlockStillHaveGradients) {
  const std::string backend = GetParam();
  Case whole({.Hq = 1, .Hkv = 1, .Lq = 8, .Lk = 8, .D = 16, .causal = CausalMode::top_left}, 5);
  whole.run_forward(backend);
  whole.run_backward(backend);
  // Block: rows 4..7 against keys 4..7 (diagonal); row 4 sees key 4 only in it.
  AttentionArgs a = whole.args();
  a.q = rows(whole.q.view, 4, 4);
  a.k = rows(whole.k.view, 4, 4);
  a.v = rows(whole.v.view, 4, 4);
  a.q_start = 4;
  a.k_start = 4;
  a.kv_block = true;
  HostTensor dq(DType::f32, {1, 1, 4, 16}), dk(DType::f32, {1, 1, 4, 16}),
      dv(DType::f32, {1, 1, 4, 16});
  HostTensor out = copy_of(rows(whole.out.view, 4, 4)), lse = copy_of(rows(whole.lse.view, 4, 4)),
             dout = copy_of(rows(whole.dout.view, 4, 4));
  backward(a, {dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt},
           only({backend}));
  // Key 7 is seen by row 7 only, which is in this block: its dk is the whole's.
  double dk7 = 0.0;
  for (int e = 0; e < 16; ++e)
    dk7 = std::max(dk7, std::fabs(dk.get(3 * 16 + e) - whole.dk.get(7 * 16 + e)));
  EXPECT_LT(dk7, 1e-5) << backend;
  double row4 = 0.0;  // row 4's dq from key 4 alone: nonzero (the row sees keys 0..4)
  for (int e = 0; e < 16; ++e) row4 = std::max(row4, std::fabs(dq.get(e)));
  EXPECT_GT(row4, 1e-4) << backend << ": dS of a row that sees one key of the block was zeroed";
}

INSTANTIATE_TEST_SUITE_P(HostBackends, GlobalCoordinatesOnHost,
                         ::testing::Values("reference", "cpu"), test::backend_name);

// The cpu backend's keep-bits at key starts off the 64-key dropout blocks (two words spliced)
// are the map's: same outputs as the reference at several starts, with p large enough that a
// wrong mask could not pass; the last (k_start, q_start) pair reaches the map's last rows.
TEST(GlobalCoordinates, CpuMaskAtUnalignedKeyStartsIsTheMaps) {
  for (const std::int64_t k_start : {std::int64_t{1}, std::int64_t{63}, std::int64_t{64},
                                     std::int64_t{100}, (std::int64_t{1} << 33) + 5}) {
    const std::int64_t q_start = k_start == 1 ? (std::int64_t{1} << 32) - 20 : 1000;
    const test::Config cfg{.Lq = 20, .Lk = 130, .D = 16, .dropout = 0.5};
    Case ref(cfg, 6), cpu(cfg, 6);
    for (Case* c : {&ref, &cpu}) {
      AttentionArgs a = c->args();
      a.k_start = k_start;
      a.q_start = q_start;
      forward(a, c->out.view, c->lse.view, only({c == &ref ? "reference" : "cpu"}));
    }
    expect_close(cpu.out, ref.out, test::forward_tolerance(DType::f32, cfg.Lk),
                 "k_start " + std::to_string(k_start) + " q_start " + std::to_string(q_start));
  }
}

}  // namespace
}  // namespace memeff
