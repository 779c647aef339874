// Sliding windows, ALiBi and softcapping (docs/window.md) as a specification: which keys a row
// sees under each alignment, what ALiBi and the cap add to a score, the cpu backend against the
// reference with and without dropout on the awkward cases, empty rows, packed sequences, global
// coordinates, the FLOP count of a window, validation that names the argument, and the CUDA
// backends' reasons.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/bitwise.h"
#include "common/call_helpers.h"
#include "common/cpu_reference_check.h"
#include "common/host_tensor.h"
#include "common/packed_case.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::Case;
using test::Config;
using test::contains;
using test::HostTensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

Config windowed(std::int64_t Lq, std::int64_t Lk, CausalMode causal, Window window,
                double dropout = 0.0) {
  Config c;
  c.Lq = Lq;
  c.Lk = Lk;
  c.D = 32;
  c.causal = causal;
  c.window = window;
  c.dropout = dropout;
  return c;
}

// The diagonal key of query i: i + (Lk - Lq), except top_left causal: i.
std::int64_t shift_of(const Config& c) {
  return c.causal == CausalMode::top_left ? 0 : c.Lk - c.Lq;
}

// The rule of docs/window.md written out plainly for one (i, j).
bool sees(const Config& c, std::int64_t i, std::int64_t j) {
  const std::int64_t d = i + shift_of(c) - j;  // > 0: key before the diagonal
  if (c.causal != CausalMode::none && d < 0) return false;
  if (c.window.left >= 0 && d > c.window.left) return false;
  if (c.window.right >= 0 && -d > c.window.right) return false;
  return j >= 0 && j < c.Lk;
}

// V = I (Dv = Lk) makes out[b, h, i, j] the weight of key j in row i: the mask is visible.
TEST(Window, KeysSeenFollowTheRuleUnderEachAlignment) {
  for (CausalMode mode : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    for (Window w : {Window{3, 2}, Window{0, 0}, Window{-1, 1}, Window{2, -1}}) {
      Config c = windowed(9, 12, mode, w);
      c.Hq = c.Hkv = 1;
      c.Dv = c.Lk;
      c.dtype = DType::f64;
      Case t(c, 5);
      test::fill_identity(t.v);
      t.run_forward("reference");
      for (std::int64_t i = 0; i < c.Lq; ++i) {
        for (std::int64_t j = 0; j < c.Lk; ++j) {
          EXPECT_EQ(t.out.get(i * c.Lk + j) > 0.0, sees(c, i, j))
              << c.describe() << " query " << i << " key " << j;
        }
      }
    }
  }
}

// ALiBi is the bias -slope·|i + shift - j| (shift as the window's), never built: a call with
// slopes equals one with that bias, per head and per batch and head, with a bias on top.
TEST(Alibi, EqualsTheExplicitDistanceBias) {
  for (const char* per : {"h", "bh"}) {
    for (CausalMode mode : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
      Config c = windowed(7, 11, mode, Window{});
      c.B = 2;
      c.dtype = DType::f64;
      c.alibi = per;
      c.bias = "bhqk";
      Case with(c, 8);
      with.run_forward("reference");
      Config plain_cfg = c;
      plain_cfg.alibi = "none";
      Case plain(plain_cfg, 8);  // the same q, k, v and bias (the slopes are drawn last)
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t i = 0; i < c.Lq; ++i)
            for (std::int64_t j = 0; j < c.Lk; ++j) {
              const double slope = with.slopes->get(c.alibi == "bh" ? b * c.Hq + h : h);
              const std::int64_t idx = ((b * c.Hq + h) * c.Lq + i) * c.Lk + j;
              plain.bias->set(idx,
                              plain.bias->get(idx) - slope * std::abs(double(i + shift_of(c) - j)));
            }
      plain.run_forward("reference");
      test::expect_close(with.out, plain.out, {1e-12, 1e-12}, c.describe() + " out");
      test::expect_close(with.lse, plain.lse, {1e-5, 1e-6}, c.describe() + " lse");
    }
  }
}

// softcap·tanh(s / softcap) replaces the scaled score before the bias: with q·k = 0 (k = 0) the
// cap does nothing, and a cap far above every score changes nothing measurable.
TEST(Softcap, CapsTheScaledScoreBeforeTheBias) {
  Config c = windowed(5, 6, CausalMode::none, Window{});
  c.Hq = c.Hkv = 1;
  c.D = 2;
  c.Dv = c.Lk;
  c.dtype = DType::f64;
  c.softcap = 0.5;
  Case t(c, 3);
  test::fill_identity(t.v);
  for (std::int64_t e = 0; e < t.q.numel(); ++e) t.q.set(e, e % 2 ? 0.0 : 2.0);
  for (std::int64_t j = 0; j < c.Lk; ++j) {
    t.k.set(j * 2, double(j));  // s = 2j, capped to 0.5·tanh(4j)
    t.k.set(j * 2 + 1, 0.0);
  }
  AttentionArgs a = t.args();
  a.scale = 1.0;
  forward(a, t.out.view, t.lse.view, test::only({"reference"}));
  double sum = 0.0;
  for (std::int64_t j = 0; j < c.Lk; ++j) sum += std::exp(0.5 * std::tanh(4.0 * j));
  for (std::int64_t j = 0; j < c.Lk; ++j) {
    EXPECT_NEAR(t.out.get(j), std::exp(0.5 * std::tanh(4.0 * j)) / sum, 1e-14) << "key " << j;
  }
  EXPECT_NEAR(t.lse.get(0), std::log(sum), 1e-6);
}

class WindowCpuVsReference : public ::testing::TestWithParam<double> {};  // dropout p

TEST_P(WindowCpuVsReference, EachAlignmentWithWindowsThatCutTilesUnevenly) {
  const double p = GetParam();
  for (CausalMode mode : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    test::check_cpu_against_reference(windowed(150, 200, mode, Window{37, 5}, p));
    test::check_cpu_against_reference(windowed(200, 130, mode, Window{70, -1}, p));
    test::check_cpu_against_reference(windowed(130, 260, mode, Window{-1, 66}, p));
  }
}

// Longer than one forward query tile (240 rows) and several backward ones: the skipped key
// tiles of each query tile, and the skipped query tiles of each key tile, are the right ones.
TEST_P(WindowCpuVsReference, TilesOutsideTheWindowAreSkippedCorrectly) {
  const double p = GetParam();
  for (CausalMode mode : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    Config c = windowed(520, 600, mode, Window{37, 5}, p);
    c.Hq = c.Hkv = 1;
    c.D = 16;
    test::check_cpu_against_reference(c);
  }
}

TEST_P(WindowCpuVsReference, ZeroWidthWindowsAndRowsLeftEmpty) {
  const double p = GetParam();
  for (CausalMode mode : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    test::check_cpu_against_reference(windowed(70, 70, mode, Window{0, 0}, p));
    // More queries than keys: bottom-right alignment leaves the first rows without a key, and
    // a narrow window leaves rows at both ends of a top-left one without keys too.
    test::check_cpu_against_reference(windowed(140, 66, mode, Window{3, 2}, p));
  }
}

TEST_P(WindowCpuVsReference, AlibiPerHeadAndPerBatchAndHeadWithGqa) {
  const double p = GetParam();
  for (const char* per : {"h", "bh"}) {
    Config c = windowed(97, 140, CausalMode::bottom_right, Window{60, -1}, p);
    c.B = 2;
    c.Hq = 4;
    c.Hkv = 2;
    c.alibi = per;
    test::check_cpu_against_reference(c);
    c.window = Window{};
    c.causal = CausalMode::none;
    c.bias = "b1qk";
    test::check_cpu_against_reference(c);
  }
}

TEST_P(WindowCpuVsReference, SoftcapAloneAndWithBiasAndItsGradient) {
  const double p = GetParam();
  for (const char* bias : {"none", "bhqk", "1h1k"}) {
    Config c = windowed(80, 129, CausalMode::top_left, Window{}, p);
    c.bias = bias;
    c.softcap = 1.5;  // scores of normal inputs reach a few units: well inside the curve
    test::check_cpu_against_reference(c);
  }
  Config all = windowed(65, 190, CausalMode::none, Window{40, 40}, p);
  all.softcap = 2.0;
  all.alibi = "h";
  all.bias = "bh1k";
  all.dtype = DType::bf16;
  test::check_cpu_against_reference(all);
}

INSTANTIATE_TEST_SUITE_P(Dropout, WindowCpuVsReference, ::testing::Values(0.0, 0.2),
                         [](const auto& info) {
                           return info.param == 0.0 ? std::string("none") : std::string("p02");
                         });

// A window wider than every distance is no window: the cpu backend takes the same path and
// gives the same bits (out, lse and every gradient), with dropout and a bias.
TEST(WindowCpu, WiderThanTheSequenceIsBitwiseNoWindow) {
  for (CausalMode mode : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    Config c = windowed(100, 150, mode, Window{}, 0.1);
    c.bias = "1hqk";
    Case plain(c, 21);
    c.window = Window{150, 400};
    Case wide(c, 21);
    Options deterministic = test::only({"cpu"});
    deterministic.deterministic = true;  // dq sums its key blocks in a fixed order
    for (Case* t : {&plain, &wide}) {
      t->run_forward("cpu");
      backward(t->args(), t->grads(), deterministic);
    }
    const std::string what = c.describe();
    test::expect_bitwise_equal(wide.out, plain.out, what + " out");
    test::expect_bitwise_equal(wide.lse, plain.lse, what + " lse");
    test::expect_bitwise_equal(wide.dq, plain.dq, what + " dq");
    test::expect_bitwise_equal(wide.dk, plain.dk, what + " dk");
    test::expect_bitwise_equal(wide.dv, plain.dv, what + " dv");
    test::expect_bitwise_equal(*wide.dbias, *plain.dbias, what + " dbias");
  }
}

// Rows the window leaves without a key follow memeff's empty-row rule on both host backends:
// out = 0, lse = -inf, dq = 0, and no NaN anywhere.
TEST(WindowCpu, RowsWithoutKeysGiveZeroOutMinusInfLseAndZeroGradients) {
  Config c = windowed(90, 30, CausalMode::none, Window{1, 1}, 0.2);  // shift -60
  c.bias = "bhqk";
  for (const char* backend : {"reference", "cpu"}) {
    Case t(c, 4);
    t.run_forward(backend);
    t.run_backward(backend);
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      for (std::int64_t i = 0; i < c.Lq; ++i) {
        const bool empty = i + (c.Lk - c.Lq) + 1 < 0;
        const std::int64_t row = h * c.Lq + i;
        EXPECT_EQ(t.lse.get(row) == -kInf, empty) << backend << " h " << h << " i " << i;
        if (!empty) continue;
        for (std::int64_t e = 0; e < c.dv(); ++e) EXPECT_EQ(t.out.get(row * c.dv() + e), 0.0);
        for (std::int64_t e = 0; e < c.D; ++e) EXPECT_EQ(t.dq.get(row * c.D + e), 0.0);
      }
    }
    for (const HostTensor* x : {&t.out, &t.dq, &t.dk, &t.dv, &*t.dbias}) {
      EXPECT_FALSE(test::compare(*x, *x).nan) << backend;
    }
  }
}

// Packed sequences align each sequence's window and ALiBi with its own lengths, and per-sequence
// slopes [S, Hq] give sequence s row s: the packed call equals each sequence run alone.
TEST(WindowPacked, EachSequenceAlignsItsOwnWindowAndSlopes) {
  test::PackedConfig pc;
  pc.seqlens_q = {40, 1, 90, 0};
  pc.seqlens_k = {70, 5, 66, 3};
  pc.Hq = 4;
  pc.Hkv = 2;
  pc.causal = CausalMode::none;
  pc.dropout = 0.2;
  pc.window = Window{20, 3};
  pc.alibi = true;
  pc.softcap = 3.0;
  test::PackedCase ref(pc, 31), cpu(pc, 31);
  ref.run_forward("reference");
  cpu.run_forward("cpu");
  test::expect_close(cpu.out, ref.out, test::forward_tolerance(DType::f32, 90), "packed out");
  cpu.out = ref.out;
  cpu.lse = ref.lse;
  ref.run_backward("reference");
  cpu.run_backward("cpu");
  const test::Tolerance bt = test::backward_tolerance(DType::f32, 200);
  test::expect_close(cpu.dq, ref.dq, bt, "packed dq");
  test::expect_close(cpu.dk, ref.dk, bt, "packed dk");
  test::expect_close(cpu.dv, ref.dv, bt, "packed dv");

  // Sequence s alone (without dropout, whose packed mask is b = s's): a B = 1 call of its rows
  // with slopes [Hq] from row s gives its packed rows bit for bit.
  test::PackedConfig nodrop = pc;
  nodrop.dropout = 0.0;
  test::PackedCase packed(nodrop, 31);
  packed.run_forward("reference");
  for (std::int64_t s = 0; s < pc.sequences(); ++s) {
    const std::int64_t lq = ref.cu_q[s + 1] - ref.cu_q[s], lk = ref.cu_k[s + 1] - ref.cu_k[s];
    Config c;
    c.Hq = pc.Hq;
    c.Hkv = pc.Hkv;
    c.Lq = lq;
    c.Lk = lk;
    c.D = pc.D;
    c.window = pc.window;
    c.softcap = pc.softcap;
    c.alibi = "h";
    Case alone(c, 1);
    test::PackedCase::copy_rows(packed.q, packed.cu_q[s], lq, alone.q, 0);
    test::PackedCase::copy_rows(packed.k, packed.cu_k[s], lk, alone.k, 0);
    test::PackedCase::copy_rows(packed.v, packed.cu_k[s], lk, alone.v, 0);
    for (std::int64_t h = 0; h < pc.Hq; ++h) {
      alone.slopes->set(h, packed.slopes->get(s * pc.Hq + h));
    }
    alone.run_forward("reference");
    HostTensor rows = packed.out;
    test::PackedCase::gather_rows(alone.out, 0, lq, rows, packed.cu_q[s]);
    test::expect_bitwise_equal(rows, packed.out, "sequence " + std::to_string(s));
  }
}

// Query row q_start + i against key k_start + j: a block of a larger top-left attention with a
// window and ALiBi sees and weighs what the whole attention's rows do.
TEST(WindowGlobalCoordinates, TopLeftBlocksUseGlobalPositions) {
  for (const char* backend : {"reference", "cpu"}) {
    Config whole_cfg = windowed(100, 100, CausalMode::top_left, Window{30, -1}, 0.2);
    whole_cfg.alibi = "h";
    whole_cfg.softcap = 4.0;
    Case whole(whole_cfg, 17);
    whole.run_forward(backend);
    // Rows 60..99 against every key, computed alone with q_start = 60.
    Config part_cfg = whole_cfg;
    part_cfg.Lq = 40;
    Case part(part_cfg, 17);
    for (std::int64_t h = 0; h < whole_cfg.Hq; ++h)
      for (std::int64_t i = 0; i < 40; ++i)
        for (std::int64_t e = 0; e < whole_cfg.D; ++e)
          part.q.set((h * 40 + i) * whole_cfg.D + e,
                     whole.q.get((h * 100 + 60 + i) * whole_cfg.D + e));
    part.k = whole.k;
    part.v = whole.v;
    part.slopes = whole.slopes;
    AttentionArgs a = part.args();
    a.q_start = 60;
    forward(a, part.out.view, part.lse.view, test::only({backend}));
    for (std::int64_t h = 0; h < whole_cfg.Hq; ++h)
      for (std::int64_t i = 0; i < 40; ++i)
        for (std::int64_t e = 0; e < whole_cfg.D; ++e) {
          const double got = part.out.get((h * 40 + i) * whole_cfg.D + e);
          const double want = whole.out.get((h * 100 + 60 + i) * whole_cfg.D + e);
          ASSERT_NEAR(got, want, 1e-5) << backend << " h " << h << " row " << 60 + i;
        }
  }
}

TEST(WindowFlops, CountsExactlyTheVisiblePairs) {
  // 4 x 4, left 1, right 0, no causal (shift 0): rows see 1, 2, 2, 2 keys.
  EXPECT_EQ(visible_pairs(4, 4, CausalMode::none, Window{1, 0}), 7);
  EXPECT_EQ(visible_pairs(4, 4, CausalMode::none, Window{}), 16);
  EXPECT_EQ(visible_pairs(5, 5, CausalMode::top_left, Window{}), 15);
  EXPECT_EQ(visible_pairs(5, 5, CausalMode::top_left, Window{0, 9}), 5);  // causal caps right
  EXPECT_EQ(visible_pairs(6, 3, CausalMode::bottom_right, Window{}), 6);  // 3 rows empty
  for (CausalMode mode : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    for (Window w : {Window{37, 5}, Window{0, 0}, Window{-1, 3}, Window{500, 500}}) {
      Config c = windowed(50, 80, mode, w);
      std::int64_t count = 0;
      for (std::int64_t i = 0; i < c.Lq; ++i)
        for (std::int64_t j = 0; j < c.Lk; ++j) count += sees(c, i, j);
      EXPECT_EQ(visible_pairs(50, 80, mode, w), count) << c.describe();
      EXPECT_EQ(attention_flops(2, 3, 50, 80, 16, mode, w), 4.0 * 2 * 3 * 16 * double(count));
    }
  }
  // Without a bounded window the convention stays: halved when causal.
  EXPECT_EQ(attention_flops(1, 1, 8, 8, 4, CausalMode::top_left, Window{}),
            attention_flops(1, 1, 8, 8, 4, CausalMode::top_left));
  EXPECT_EQ(attention_flops_packed({4, 6}, {4, 6}, 1, 2, CausalMode::none, Window{0, 0}),
            4.0 * 2 * (4 + 6));
}

TEST(WindowValidation, BadValuesNameTheirArgument) {
  Case t(windowed(8, 8, CausalMode::none, Window{}), 1);
  auto forward_error = [&](const AttentionArgs& a) {
    return test::error_message([&] { forward(a, t.out.view, t.lse.view, test::only({"cpu"})); });
  };
  AttentionArgs a = t.args();
  a.window = Window{-2, 0};
  EXPECT_TRUE(contains(forward_error(a), "argument `window`")) << forward_error(a);
  a.window = Window{0, -7};
  EXPECT_TRUE(contains(forward_error(a), "argument `window`"));
  for (double bad : {-1.0, std::nan(""), kInf}) {
    a = t.args();
    a.softcap = bad;
    EXPECT_TRUE(contains(forward_error(a), "argument `softcap`")) << bad;
  }
  HostTensor slopes_f64(DType::f64, {2}), slopes_3(DType::f32, {3}), slopes_bh(DType::f32, {2, 2}),
      slopes_rank3(DType::f32, {1, 1, 2});
  for (const HostTensor* bad : {&slopes_f64, &slopes_3, &slopes_bh, &slopes_rank3}) {
    a = t.args();
    a.alibi_slopes = bad->view;
    EXPECT_TRUE(contains(forward_error(a), "argument `alibi_slopes`"))
        << bad->view.describe() << ": " << forward_error(a);
  }
  HostTensor on_gpu(DType::f32, {2});
  on_gpu.view.device = Device::cuda(0);
  a = t.args();
  a.alibi_slopes = on_gpu.view;
  EXPECT_TRUE(contains(forward_error(a), "argument `alibi_slopes`"));
  // Bottom-right alignment (causal none or bottom_right) needs the whole attention's lengths.
  for (CausalMode mode : {CausalMode::none, CausalMode::bottom_right}) {
    a = t.args();
    a.causal = mode;
    a.window = Window{4, 0};
    a.k_start = 8;
    EXPECT_TRUE(contains(forward_error(a),
                         mode == CausalMode::none ? "argument `window`" : "argument `causal`"));
  }
  HostTensor slopes(DType::f32, {2});
  a = t.args();
  a.alibi_slopes = slopes.view;
  a.q_start = 8;
  EXPECT_TRUE(contains(forward_error(a), "argument `alibi_slopes`")) << forward_error(a);
  a.causal = CausalMode::top_left;  // top_left takes global coordinates
  EXPECT_EQ(forward_error(a), "");
}

// A backend without the features (a plug-in: every built-in CUDA backend has them now) refuses
// them by name, one reason each; the CUDA backends (built here or not) take all three
// (docs/window.md), cuda_splitkv's forward included, and name none of them in the dispatcher's
// explanation.
TEST(WindowBackends, KernelsWithoutTheFeaturesSayWhich) {
  Problem p;
  EXPECT_TRUE(score_modifier_reasons(p, "plugin_attention").empty());
  p.window_left = 4;
  p.has_alibi = true;
  p.softcap = 30.0;
  const std::vector<std::string> r = score_modifier_reasons(p, "plugin_attention");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_TRUE(contains(r[0], "window: not in the plugin_attention kernels yet"));
  EXPECT_TRUE(contains(r[1], "alibi_slopes: not in the plugin_attention kernels yet"));
  EXPECT_TRUE(contains(r[2], "softcap: not in the plugin_attention kernels yet"));

  const std::vector<std::string> registered = backend_names();
  Config c = windowed(16, 16, CausalMode::top_left, Window{8, 0});
  c.dtype = DType::bf16;
  c.D = 64;
  c.softcap = 50.0;
  Case t(c, 2);
  AttentionArgs a = t.args();
  for (TensorView* v : {&a.q, &a.k, &a.v}) v->device = Device::cuda(0);
  int seen = 0;
  for (const std::string name : {"cuda", "cuda_sm90", "cuda_splitkv", "cuda_math"}) {
    if (std::find(registered.begin(), registered.end(), name) == registered.end()) continue;
    ++seen;
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const Explanation ex = explain(a, pass, test::only({name}));
      std::string all;
      for (const auto& report : ex.backends) {
        if (report.name != name) continue;
        for (const std::string& reason : report.reasons) all += reason + "\n";
      }
      EXPECT_FALSE(contains(all, "window")) << name << ": " << all;
      EXPECT_FALSE(contains(all, "alibi")) << name << ": " << all;
      EXPECT_FALSE(contains(all, "softcap")) << name << ": " << all;
      EXPECT_FALSE(contains(all, "kernels yet")) << name << ": " << all;
    }
  }
  if (seen == 0) GTEST_SKIP() << "built without the CUDA backends";
}

// A bf16 problem on CUDA tensors, B = 2, Hq = 4 on Hkv = 2, bottom-right, with the window and
// ALiBi slopes per batch entry and head.
Problem bf16_cuda_problem_with_modifiers(std::int64_t Lq, std::int64_t Lk, std::int64_t D,
                                         Window window) {
  Problem p;
  p.device = Device::cuda(0);
  p.dtype = DType::bf16;
  p.B = 2, p.Hq = 4, p.Hkv = 2, p.Lq = Lq, p.Lk = Lk, p.D = p.Dv = D;
  p.causal = CausalMode::bottom_right;
  p.window_left = window.left;
  p.window_right = window.right;
  p.has_alibi = true;
  p.alibi_per_batch = true;
  return p;
}

// cuda_splitkv's forward takes the window, ALiBi (per batch entry and head) and a softcap: none
// of them is among its reasons (on a machine without a GPU, the device's alone; the kernel's own
// reasons, the softcap's range among them, are in tests/cuda/splitkv_plan_test.cpp).
TEST(WindowBackends, SplitKvTakesThem) {
  const std::shared_ptr<Backend> split = find_backend("cuda_splitkv");
  if (!split) GTEST_SKIP() << "built without the CUDA backends";
  Problem p = bf16_cuda_problem_with_modifiers(1, 4096, 128, {1023, 0});
  p.Hq = 8;
  for (double cap : {0.0, 30.0}) {
    p.softcap = cap;
    std::string all;
    for (const std::string& r : split->reasons_unsupported(p, Pass::forward)) all += r + "\n";
    EXPECT_FALSE(contains(all, "window")) << all;
    EXPECT_FALSE(contains(all, "alibi")) << all;
    EXPECT_FALSE(contains(all, "softcap")) << cap << ": " << all;
  }
}

// cuda_math takes the window, ALiBi (per head or per batch entry) and any softcap fp32 holds as a
// normal number, and names the softcap when fp32 cannot hold it (0, a subnormal or infinity
// would leave the cap off or make it NaN); packed calls it refuses as before, window or not.
TEST(WindowBackends, CudaMathTakesThemAndNamesASoftcapOutsideFp32) {
  const std::shared_ptr<Backend> math = find_backend("cuda_math");
  if (!math) GTEST_SKIP() << "built without the CUDA backends";
  Problem p = bf16_cuda_problem_with_modifiers(40, 70, 64, {5, 3});
  auto reasons_text = [&](Pass pass) {
    std::string all;
    for (const std::string& r : math->reasons_unsupported(p, pass)) all += r + "\n";
    return all;
  };
  for (double cap : {0.0, 30.0, 1e-30, 1e30}) {
    p.softcap = cap;
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const std::string all = reasons_text(pass);
      // Without a GPU the only reason left is the device's.
      EXPECT_FALSE(contains(all, "window")) << all;
      EXPECT_FALSE(contains(all, "alibi")) << all;
      EXPECT_FALSE(contains(all, "softcap")) << cap << ": " << all;
    }
  }
  for (double cap : {1e-50, 1e39}) {
    p.softcap = cap;
    const std::string all = reasons_text(Pass::backward);
    EXPECT_TRUE(contains(all, "softcap = ")) << cap << ": " << all;
    EXPECT_TRUE(contains(all, "outside fp32's normal range")) << cap << ": " << all;
  }
  p.softcap = 0.0;
  p.packed = true;
  const std::string packed = reasons_text(Pass::forward);
  EXPECT_TRUE(contains(packed, "packed sequences")) << packed;
}

}  // namespace
}  // namespace memeff
