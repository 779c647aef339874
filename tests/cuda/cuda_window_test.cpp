// Sliding windows, ALiBi and softcapping on both fused kernel families (docs/window.md), the
// Hopper kernels (cuda_sm90) and the mma.sync ones (cuda), against the double-precision reference
// on the same rounded inputs and dropout mask, forward and backward (the backward for the head
// dims each has with these: cuda_sm90 up to 128, cuda up to 256): every causal alignment with windows that
// cut tiles unevenly, windows wider than the sequence, zero-width ones, rows left without a key;
// ALiBi per head and per batch; the softcap alone and with each way the kernels read a bias (and
// its gradient); all of them with dropout, GQA, both dtypes and every head dim; the deterministic
// backward with a window; a narrow window over long sequences against the reference (its speed
// is the benchmark's, docs/benchmarks.md); and head dim 256, whose backward with these only cuda
// has (16 queries per step). Packed sequences and global coordinates have theirs in cuda_packed_test.cpp
// and cuda_global_coordinates_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "cuda/backward_check.h"
#include "cuda/device_tensor.h"
#include "cuda/forward_check.h"
#include "memeff/attention.h"

namespace memeff {
namespace {

using test::BwdProblem;
using test::DeviceTensor;
using test::HostTensor;
using test::KernelCase;

constexpr CausalMode kNone = CausalMode::none, kTopLeft = CausalMode::top_left,
                     kBottomRight = CausalMode::bottom_right;
constexpr CausalMode kModes[] = {kNone, kTopLeft, kBottomRight};

class CudaWindow : public test::PerBackend {
 protected:
  KernelCase make(KernelCase c) const {
    c.backend = GetParam();
    return c;
  }
  // The largest head dim of the backend's backward with a window, ALiBi or a softcap: cuda_sm90's
  // stops at 128 (its wide tile for 129-256 takes none of them), cuda's at 256.
  static std::int64_t backward_head_dims(const KernelCase& c) {
    return c.backend == "cuda_sm90" ? 128 : 256;
  }
  static bool has_backward(const KernelCase& c) {
    return std::max(c.D, c.dv()) <= backward_head_dims(c);
  }
  // Forward, then (for head dims the backward has) backward, each against the reference.
  static void check(const KernelCase& c, std::uint64_t data_seed) {
    SCOPED_TRACE(c.describe());
    test::expect_forward_matches(c, test::run_forward_case(c, data_seed));
    if (has_backward(c)) test::check_backward_case(c, data_seed);
  }
  // The backward of a call whose rows each see one key (a zero-width window, with a bias): their
  // softmax is 1 whatever the score, so dS is exactly 0 (core/visible_keys.h): dq, dk and dbias
  // exactly 0, and dv the rows' dO (dropped) against the reference.
  static void expect_single_key_gradients(const KernelCase& c, std::uint64_t data_seed) {
    const BwdProblem pr(c, data_seed);
    const test::Grads got = test::run_backward_case(c, pr);
    for (std::int64_t i = 0; i < got.dq.numel(); ++i) ASSERT_EQ(got.dq.get(i), 0.0) << "dq " << i;
    for (std::int64_t i = 0; i < got.dk.numel(); ++i) ASSERT_EQ(got.dk.get(i), 0.0) << "dk " << i;
    ASSERT_TRUE(got.dbias.has_value());
    for (std::int64_t i = 0; i < got.dbias->numel(); ++i) {
      ASSERT_EQ(got.dbias->get(i), 0.0) << "dbias " << i;
    }
    test::expect_grad_close(c, "dv", got.dv, pr.ref.dv);
  }
};

// Windows bounded on the left, on the right, on both, narrower and wider than a key tile (128
// keys in cuda_sm90, 64 in cuda's forward), under each alignment, on lengths that end mid-tile;
// dropout in every other case, head dims 64 and 128, both dtypes and the biases cuda_sm90 reads
// each its own way (none, 16-bit tiles, a key-padding bias, an fp32 one read per score) in turn.
TEST_P(CudaWindow, EachAlignmentWithWindowsThatCutTilesUnevenly) {
  const Window windows[] = {{37, 5}, {70, -1}, {-1, 66}, {200, 3}, {0, 130}};
  const std::int64_t lengths[][2] = {{150, 200}, {200, 130}, {333, 333}};
  const char* biases[] = {"none", "bhqk", "b11k", "1hqk"};
  std::uint64_t seed = 1;
  for (CausalMode mode : kModes) {
    for (const Window& w : windows) {
      for (const auto& [Lq, Lk] : lengths) {
        KernelCase c = make({.Hq = 2, .Hkv = 2, .Lq = Lq, .Lk = Lk, .causal = mode});
        c.window = w;
        c.D = seed % 2 ? 64 : 128;
        c.dtype = seed % 3 ? DType::bf16 : DType::f16;
        c.dropout = seed % 2 ? 0.1 : 0.0;
        c.bias = biases[seed % 4];
        c.bias_dtype = seed % 4 == 3 ? DType::f32 : c.dtype;
        check(c, ++seed);
      }
    }
  }
}

// A window wider than every distance bounds nothing; one of width zero shows each row its
// diagonal key alone, whose softmax is 1 whatever the score: dS is exactly 0 there, so dq, dk and
// dbias are exactly 0 (core/visible_keys.h), and dv is the rows' dO.
TEST_P(CudaWindow, WiderThanTheSequenceAndZeroWidth) {
  for (CausalMode mode : kModes) {
    for (const Window& w : {Window{5000, 5000}, Window{1000, -1}, Window{-1, 700}}) {
      KernelCase c = make({.B = 2, .Lq = 300, .Lk = 260, .causal = mode, .dropout = 0.1});
      c.window = w;
      check(c, 40);
    }
  }
  for (double p : {0.0, 0.2}) {  // a 16-bit bias (cuda_sm90: in tiles), then an fp32 one
    KernelCase c = make({.B = 2, .Lq = 200, .Lk = 200, .bias = "bhqk", .dropout = p});
    c.bias_dtype = p == 0.0 ? c.dtype : DType::f32;
    c.window = Window{0, 0};
    SCOPED_TRACE(c.describe());
    test::expect_forward_matches(c, test::run_forward_case(c, 41));
    expect_single_key_gradients(c, 42);
  }
}

// Rows whose window holds no key (the diagonal far before the keys, or past them) give out = 0,
// lse = -inf and dq = 0, never NaN, while their neighbours' rows are right.
TEST_P(CudaWindow, RowsWithoutAVisibleKey) {
  struct Shape {
    std::int64_t Lq, Lk;
    CausalMode causal;
    Window window;
  };
  const Shape shapes[] = {{300, 100, kNone, {1, 1}},    // shift -200: rows 0..198 see nothing
                          {150, 40, kTopLeft, {2, 0}},  // rows past 41 see nothing
                          {260, 70, kBottomRight, {5, 0}}};
  for (const Shape& sh : shapes) {
    for (double p : {0.0, 0.1}) {
      KernelCase c = make({.Lq = sh.Lq, .Lk = sh.Lk, .causal = sh.causal, .dropout = p});
      c.window = sh.window;
      SCOPED_TRACE(c.describe());
      const test::ForwardResult r = test::run_forward_case(c, 50);
      test::expect_forward_matches(c, r);
      const BwdProblem pr(c, 51);
      const test::Grads got = test::run_backward_case(c, pr);
      test::expect_grads_match(c, got, pr.ref);
      int empty_rows = 0;
      for (std::int64_t row = 0; row < c.B * c.Hq * c.Lq; ++row) {
        if (r.ref.lse.get(row) != -std::numeric_limits<double>::infinity()) continue;
        ++empty_rows;
        for (std::int64_t e = 0; e < c.dv(); ++e) {
          ASSERT_EQ(r.out.get(row * c.dv() + e), 0.0) << "out row " << row;
        }
        for (std::int64_t e = 0; e < c.D; ++e) {
          ASSERT_EQ(got.dq.get(row * c.D + e), 0.0) << "dq row " << row;
        }
      }
      EXPECT_GT(empty_rows, 0) << "the shape leaves no row without keys";
    }
  }
}

// ALiBi's slopes per head ([Hq]) and per batch entry and head ([B, Hq]) with GQA, with and
// without a window, under each alignment, with dropout and with each way of reading a bias.
TEST_P(CudaWindow, AlibiPerHeadAndPerBatchWithGqa) {
  std::uint64_t seed = 60;
  for (const char* per : {"h", "bh"}) {
    for (CausalMode mode : kModes) {
      for (const char* bias : {"none", "b1qk", "1h1k", "bhqk"}) {
        KernelCase c = make({.B = 2, .Hq = 8, .Hkv = 2, .Lq = 190, .Lk = 270, .causal = mode,
                             .bias = bias, .dropout = 0.1});
        c.alibi = per;
        c.bias_dtype = std::string(bias) == "b1qk" ? DType::f32 : c.dtype;
        c.window = seed % 2 ? Window{90, 20} : Window{};
        check(c, ++seed);
      }
    }
  }
}

// The softcap where it saturates (0.5 with scale 1) and where it hardly bends (30), alone and
// over a bias read each way (16-bit tiles, fp32 per score, a key-padding bias), with dropout,
// both dtypes, and its gradient through dbias.
TEST_P(CudaWindow, SoftcapAloneAndWithEachBiasRead) {
  std::uint64_t seed = 80;
  for (double cap : {0.5, 30.0}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      for (const char* bias : {"none", "bhqk", "b11k"}) {
        for (DType bias_dtype : {dtype, DType::f32}) {
          if (std::string(bias) == "none" && bias_dtype == DType::f32) continue;
          KernelCase c = make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 170, .Lk = 230, .bias = bias,
                               .bias_dtype = bias_dtype, .dropout = 0.1, .dtype = dtype});
          c.softcap = cap;
          c.scale = cap < 1.0 ? 1.0 : std::numeric_limits<double>::quiet_NaN();
          c.causal = seed % 3 == 0 ? kBottomRight : kNone;
          check(c, ++seed);
        }
      }
    }
  }
}

// ALiBi and the softcap without a bias (on cuda_sm90: kernels with dropout, and the backward's
// cap, fixed at compile time), with and without dropout, with ALiBi, the cap or both, a window in
// every other case, GQA, head dims 64 and 128 and both dtypes.
TEST_P(CudaWindow, ModifiersWithoutABiasWithAndWithoutDropoutAndCap) {
  std::uint64_t seed = 90;
  for (double p : {0.0, 0.1}) {
    for (const char* mods : {"alibi", "softcap", "both"}) {
      for (std::int64_t D : {64, 128}) {
        KernelCase c = make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 210, .Lk = 250, .D = D,
                             .dropout = p, .dtype = seed % 2 ? DType::bf16 : DType::f16});
        if (std::string(mods) != "softcap") c.alibi = seed % 3 ? "h" : "bh";
        if (std::string(mods) != "alibi") c.softcap = seed % 2 ? 5.0 : 30.0;
        c.causal = kModes[seed % 3];
        if (seed % 2 == 0) c.window = Window{70, 9};
        check(c, ++seed);
      }
    }
  }
}

// All three at once with a bias, dropout and GQA, on every head dim the forward has (96: a
// bucket of cuda_sm90's, padded to 128 in cuda's; the backward where the backend has it), both
// dtypes.
TEST_P(CudaWindow, EverythingTogetherEachHeadDim) {
  std::uint64_t seed = 100;
  for (std::int64_t D : {64, 96, 128, 256}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      KernelCase c = make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 260, .Lk = 300, .D = D,
                           .causal = kBottomRight, .bias = "1hqk", .dropout = 0.1, .dtype = dtype});
      c.bias_dtype = dtype;
      c.window = Window{45, 10};
      c.alibi = "bh";
      c.softcap = 5.0;
      check(c, ++seed);
    }
  }
}

// The deterministic backward with a window: a query block's dQ is added by the key blocks the
// window lets in, in their order from the first of them; two runs give the same bits, with a
// bias whose gradient sums across CTAs, with ALiBi, with the softcap, and without any (also
// without dropout); on every head dim the backend's backward has.
TEST_P(CudaWindow, DeterministicBackwardWithAWindowIsBitwiseRepeatable) {
  std::uint64_t seed = 120;
  for (std::int64_t D : {64, 128, 256}) {
    for (const char* variant : {"plain", "p0", "11qk", "alibi", "softcap"}) {
      KernelCase c = make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 600, .Lk = 520, .D = D, .dropout = 0.1,
                           .deterministic = true});
      c.window = Window{100, 20};
      if (std::string(variant) == "p0") c.dropout = 0.0;
      if (std::string(variant) == "11qk") c.bias = "11qk";
      if (std::string(variant) == "alibi") c.alibi = "h";
      if (std::string(variant) == "softcap") c.softcap = 5.0;
      if (!has_backward(c)) continue;
      SCOPED_TRACE(c.describe());
      const BwdProblem pr(c, ++seed);
      const test::Grads first = test::run_backward_case(c, pr);
      const test::Grads second = test::run_backward_case(c, pr);
      EXPECT_TRUE(test::bitwise_equal(first.dq, second.dq)) << "dq differs between runs";
      EXPECT_TRUE(test::bitwise_equal(first.dk, second.dk)) << "dk differs between runs";
      EXPECT_TRUE(test::bitwise_equal(first.dv, second.dv)) << "dv differs between runs";
      if (c.has_bias()) {
        EXPECT_TRUE(test::bitwise_equal(*first.dbias, *second.dbias)) << "dbias differs";
      }
      test::expect_grads_match(c, first, pr.ref);
    }
  }
}

// A window far narrower than the keys on long sequences: the key tiles outside it are skipped
// (forward) and the query blocks outside it too (backward), and what remains is right: out,
// lse and the gradients against the reference, Lk = 4096 with windows of 128 keys.
TEST_P(CudaWindow, NarrowWindowOnLongSequencesMatchesTheReference) {
  for (CausalMode mode : {kTopLeft, kNone}) {
    KernelCase c =
        make({.Hq = 2, .Hkv = 1, .Lq = 4096, .Lk = 4096, .causal = mode, .dropout = 0.1});
    c.window = mode == kTopLeft ? Window{127, 0} : Window{64, 63};
    check(c, 140);
  }
  KernelCase c = make({.Hq = 2, .Hkv = 2, .Lq = 1000, .Lk = 4096, .D = 128});
  c.window = Window{128, 0};  // bottom-right alignment: the rows' keys end at the last key
  c.alibi = "h";
  check(c, 141);
}

// Head dim 256, whose backward with a window only cuda has (64 keys by 16 queries a step, so a window cuts
// many query blocks of a key block): windows that cut the steps unevenly under each alignment,
// with dropout, ALiBi, a softcap and a bias with its gradient; then a zero-width window, whose
// rows see one key each: dq, dk and dbias (summed over the batch) exactly 0 and dv the rows'
// dropped dO. On cuda_sm90 the forwards alone.
TEST_P(CudaWindow, HeadDim256WithAWindowAndDropout) {
  std::uint64_t seed = 160;
  for (CausalMode mode : kModes) {
    for (const Window& w : {Window{21, 3}, Window{90, -1}}) {
      KernelCase c = make({.B = 2, .Hq = 4, .Hkv = 2, .Lq = 140, .Lk = 173, .D = 256,
                           .causal = mode, .dropout = 0.15});
      c.window = w;
      c.dtype = seed % 2 ? DType::bf16 : DType::f16;
      if (seed % 3 == 0) {
        c.alibi = "bh";
        c.softcap = 8.0;
        c.bias = "bhqk";
        c.bias_dtype = c.dtype;
      }
      check(c, ++seed);
    }
  }
  KernelCase c = make({.B = 2, .Lq = 90, .Lk = 90, .D = 256, .bias = "1hqk", .dropout = 0.2});
  c.bias_dtype = DType::f32;
  c.window = Window{0, 0};
  SCOPED_TRACE(c.describe());
  test::expect_forward_matches(c, test::run_forward_case(c, 170));
  if (has_backward(c)) expect_single_key_gradients(c, 171);
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaWindow, ::testing::Values("cuda_sm90", "cuda"),
                         test::backend_name);

}  // namespace
}  // namespace memeff
