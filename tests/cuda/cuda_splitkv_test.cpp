// The split-KV forward ("cuda_splitkv": few queries per kv head, the GQA group's heads packed
// into the MMA rows, keys spread over splits merged by their lse) against the double-precision
// reference on decode shapes: Lq 1, 2, 7, 16 over Lk 1, 63, 64, 65, 1000, 8192, GQA 1:1, 4:1,
// 8:1, causal none / top-left / bottom-right, dropout with the documented mask (checked element
// by element through the output), key-padding and general biases, bf16 and fp16, head dims 64
// and 128; rows without keys; sliding windows, ALiBi (per head, per batch and head) and softcaps
// (docs/window.md); the dispatcher taking it by default for such shapes and saying why; a
// caller's workspace; and the fused backward run on its out and lse.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "common/tolerance.h"
#include "cuda/device_tensor.h"
#include "cuda/forward_check.h"
#include "memeff/attention.h"
#include "memeff/dispatch.h"
#include "memeff/dropout.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::DeviceTensor;
using test::HostTensor;
using test::KernelCase;

constexpr const char* kSplit = "cuda_splitkv";
constexpr CausalMode kNone = CausalMode::none, kTopLeft = CausalMode::top_left,
                     kBottomRight = CausalMode::bottom_right;

class CudaSplitKv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  }
};

void check_case(KernelCase c, std::uint64_t data_seed) {
  c.backend = kSplit;
  SCOPED_TRACE(c.describe());
  test::expect_forward_matches(c, test::run_forward_case(c, data_seed));
}

// Every (Lq, Lk) pair of the decode grid under each causal mode; the GQA group, dropout, dtype
// and head dim rotate through their values so that each meets every length and every causal
// mode (a full product would be 1728 reference runs).
TEST_F(CudaSplitKv, DecodeGridMatchesTheReference) {
  const std::int64_t lqs[] = {1, 2, 7, 16};
  const std::int64_t lks[] = {1, 63, 64, 65, 1000, 8192};
  const std::int64_t groups[] = {1, 4, 8};
  const double dropouts[] = {0.0, 0.17};
  const DType dtypes[] = {DType::bf16, DType::f16};
  const std::int64_t dims[] = {64, 128};
  std::uint64_t n = 0;
  for (std::int64_t Lq : lqs) {
    for (std::int64_t Lk : lks) {
      for (CausalMode causal : {kNone, kTopLeft, kBottomRight}) {
        KernelCase c;
        c.B = 2;
        c.Hkv = 2;
        c.Hq = c.Hkv * groups[(n + n / 3) % 3];  // every group under every causal mode
        c.Lq = Lq;
        c.Lk = Lk;
        c.causal = causal;
        c.dropout = dropouts[(n / 3) % 2];
        c.dtype = dtypes[(n / 2) % 2];
        c.D = dims[(n / 5) % 2];
        c.seed = 77 + n;
        c.offset = n * 1000;
        check_case(c, 500 + n);
        ++n;
      }
    }
  }
}

TEST_F(CudaSplitKv, EveryGroupWithDropoutOverManySplits) {
  for (std::int64_t group : {1, 4, 8}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      check_case({.B = 1,
                  .Hq = 2 * group,
                  .Hkv = 2,
                  .Lq = 16,
                  .Lk = 8192,
                  .D = 128,
                  .causal = kBottomRight,
                  .dropout = 0.17,
                  .dtype = dt},
                 static_cast<std::uint64_t>(group));
    }
  }
}

TEST_F(CudaSplitKv, KeyPaddingAndGeneralBiasBothDtypes) {
  for (const char* pattern : {"b11k", "bhqk", "1h1k", "b1qk"}) {
    for (DType bias_dtype : {DType::f32, DType::bf16}) {
      KernelCase c{.B = 2,
                   .Hq = 8,
                   .Hkv = 2,
                   .Lq = 7,
                   .Lk = 1000,
                   .bias = pattern,
                   .bias_dtype = bias_dtype};
      c.causal = pattern[0] == 'b' ? kBottomRight : kNone;
      c.dropout = pattern[1] == 'h' ? 0.17 : 0.0;
      c.D = bias_dtype == DType::f32 ? 128 : 64;
      check_case(c, 31);
    }
  }
}

TEST_F(CudaSplitKv, BlhdStridesScalesAndUnequalHeadDims) {
  KernelCase blhd{.B = 2, .Hq = 8, .Hkv = 2, .Lq = 2, .Lk = 3000, .D = 128, .bias = "b11k"};
  blhd.layout = test::Layout::blhd;
  check_case(blhd, 41);
  for (double scale : {-0.5, 0.0, 3.0}) {
    KernelCase c{.Hq = 4, .Hkv = 1, .Lq = 1, .Lk = 700, .causal = kTopLeft};
    c.scale = scale;
    check_case(c, 42);
  }
  check_case({.Hq = 4, .Hkv = 2, .Lq = 3, .Lk = 900, .D = 40, .Dv = 128}, 43);
  check_case({.Hq = 4, .Hkv = 2, .Lq = 3, .Lk = 900, .D = 128, .Dv = 64}, 44);
}

TEST_F(CudaSplitKv, RowsWithoutKeysGiveZeroAndMinusInf) {
  // Bottom-right with Lq > Lk: query i sees keys j <= i - (Lq - Lk); the first rows see none, in
  // every split. Lk = 0: no key at all.
  for (auto [Lq, Lk] : {std::pair<std::int64_t, std::int64_t>{16, 7}, {7, 1}, {16, 0}}) {
    KernelCase c{.B = 2,
                 .Hq = 8,
                 .Hkv = 2,
                 .Lq = Lq,
                 .Lk = Lk,
                 .causal = kBottomRight,
                 .dropout = 0.17,
                 .backend = kSplit};
    const test::ForwardResult r = test::run_forward_case(c, 9);
    test::expect_forward_matches(c, r);
    const std::int64_t empty_rows = Lq - Lk;
    for (std::int64_t bh = 0; bh < c.B * c.Hq; ++bh) {
      for (std::int64_t i = 0; i < empty_rows; ++i) {
        ASSERT_EQ(r.lse.get(bh * Lq + i), -std::numeric_limits<double>::infinity())
            << c.describe() << " (b·Hq + h) " << bh << " row " << i;
        for (std::int64_t e = 0; e < c.dv(); ++e) {
          ASSERT_EQ(r.out.get((bh * Lq + i) * c.dv() + e), 0.0)
              << c.describe() << " (b·Hq + h) " << bh << " row " << i;
        }
      }
    }
  }
}

// The dropout mask element by element, on every instantiation (bf16 and fp16, head dims 64 and
// 128): q = 0 makes every score 0, a key-padding bias leaves a window of W = D keys
// [w0, w0 + W) visible and v is the identity on it, so out[h, i, e] is
// keep(h, i, w0 + e)·keep_scale/W: zero exactly where the documented mask drops (v is 0 on the
// window's other keys, and the padded keys weigh exactly 0). Windows on and off the 64-key
// blocks, inside one split and across splits.
TEST_F(CudaSplitKv, DropoutMaskIsTheDocumentedOneElementByElement) {
  const std::int64_t Hq = 8, Hkv = 2, Lq = 3, Lk = 5000;
  const double p = 0.17;
  const std::uint64_t seed = 0xC0FFEEull, offset = (1ull << 33) + 5;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (std::int64_t D : {64, 128}) {
      const double kept = dropout_threshold(p).keep_scale / static_cast<double>(D);
      for (std::int64_t w0 :
           {std::int64_t{0}, std::int64_t{448}, std::int64_t{1000}, std::int64_t{2497}, Lk - D}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " D " + std::to_string(D) + " window " +
                     std::to_string(w0));
        auto in_window = [&](std::int64_t j) { return j >= w0 && j < w0 + D; };
        HostTensor q(dtype, {1, Hq, Lq, D}), k(dtype, {1, Hkv, Lk, D}), v(dtype, {1, Hkv, Lk, D}),
            bias(DType::f32, {1, 1, 1, Lk});
        std::mt19937_64 rng(static_cast<std::uint64_t>(w0));
        test::fill_uniform(k, rng, -1.0, 1.0);
        for (std::int64_t i = 0; i < q.numel(); ++i) q.set(i, 0.0);
        for (std::int64_t h = 0; h < Hkv; ++h) {
          for (std::int64_t j = 0; j < Lk; ++j) {
            for (std::int64_t e = 0; e < D; ++e) {
              v.set((h * Lk + j) * D + e, in_window(j) ? (j - w0 == e ? 1.0 : 0.0) : 0.5);
            }
          }
        }
        for (std::int64_t j = 0; j < Lk; ++j) {
          bias.set(j, in_window(j) ? 0.0 : -std::numeric_limits<double>::infinity());
        }
        HostTensor out(dtype, {1, Hq, Lq, D}), lse(DType::f32, {1, Hq, Lq});
        test::poison(out);
        DeviceTensor dq(q), dk(k), dv(v), dbias(bias), dout(out), dlse(lse);
        AttentionArgs args = test::attention_args(dq, dk, dv);
        args.bias = dbias.view;
        args.dropout_p = p;
        args.rng = {seed, offset};
        EXPECT_EQ(forward(args, dout.view, dlse.view, test::only({kSplit})).backend, kSplit);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        dout.copy_to(out);
        std::int64_t dropped = 0;
        for (std::int64_t h = 0; h < Hq; ++h) {
          for (std::int64_t i = 0; i < Lq; ++i) {
            for (std::int64_t e = 0; e < D; ++e) {
              const bool keep = dropout_keep(seed, offset, p, Hq, 0, h, i, w0 + e);
              const double got = out.get((h * Lq + i) * D + e);
              // Kept: keep_scale/W to the dtype's precision (the splits' weights round in
              // fp32); dropped: exactly 0.
              ASSERT_TRUE(keep ? std::abs(got - kept) <= 1e-2 * kept : got == 0.0)
                  << "head " << h << " query " << i << " key " << w0 + e << ": out " << got
                  << ", the mask " << (keep ? "keeps" : "drops") << " it";
              dropped += keep ? 0 : 1;
            }
          }
        }
        EXPECT_GT(dropped, 0);  // 24·D draws at p = 0.17
      }
    }
  }
}

// The rows the reference leaves without a key (lse -inf) must give out = 0 and lse = -inf
// exactly (every split of such a row is empty); returns how many there are.
std::int64_t expect_empty_rows_exact(const KernelCase& c, const test::ForwardResult& r) {
  std::int64_t empty = 0;
  for (std::int64_t row = 0; row < c.B * c.Hq * c.Lq; ++row) {
    if (r.ref.lse.get(row) != -std::numeric_limits<double>::infinity()) continue;
    ++empty;
    EXPECT_EQ(r.lse.get(row), -std::numeric_limits<double>::infinity()) << "row " << row;
    for (std::int64_t e = 0; e < c.dv(); ++e) {
      EXPECT_EQ(r.out.get(row * c.dv() + e), 0.0) << "row " << row << " column " << e;
    }
  }
  return empty;
}

// Sliding windows on decode shapes (docs/window.md): with bottom-right alignment (W - 1, 0) is a
// decode step's last W keys; windows that cut the cache inside and across 64-key blocks and
// splits, bounded on one or both sides, wider than Lk, of width zero; each alignment, the GQA
// groups, dropout, both dtypes and head dims in turn, with one to several row blocks.
TEST_F(CudaSplitKv, WindowsOnDecodeShapesMatchTheReference) {
  const Window windows[] = {{255, 0},   {1000, 0},      {63, 64}, {-1, 5},
                            {300, 300}, {20000, 20000}, {0, 0}};
  const std::int64_t lqs[] = {1, 7, 16};
  const std::int64_t lks[] = {1000, 8192};
  const std::int64_t groups[] = {1, 4, 8};
  std::uint64_t n = 0;
  for (const Window& w : windows) {
    for (std::int64_t Lq : lqs) {
      for (std::int64_t Lk : lks) {
        for (CausalMode causal : {kNone, kTopLeft, kBottomRight}) {
          KernelCase c{.B = 2, .Hkv = 2, .Lq = Lq, .Lk = Lk, .causal = causal};
          c.Hq = c.Hkv * groups[(n + n / 3) % 3];
          c.window = w;
          c.dropout = n % 2 ? 0.17 : 0.0;
          c.dtype = (n / 2) % 2 ? DType::f16 : DType::bf16;
          c.D = (n / 5) % 2 ? 128 : 64;
          c.seed = 900 + n;
          c.offset = n * 64;
          check_case(c, 1300 + n);
          ++n;
        }
      }
    }
  }
}

// Rows whose window holds no key, in every split: the diagonal before the first key (Lq > Lk
// without a causal mask puts it at i - (Lq - Lk)), or past the last (top-left with a window
// right of the diagonal only); they give out 0 and lse -inf exactly, their neighbours the
// reference's.
TEST_F(CudaSplitKv, WindowsLeavingRowsWithoutKeys) {
  struct Shape {
    std::int64_t Lq, Lk;
    CausalMode causal;
    Window window;
  };
  const Shape shapes[] = {{16, 9, kNone, {0, 0}},          // rows 0..6 see nothing
                          {16, 12, kBottomRight, {1, 0}},  // rows 0..3 see nothing
                          {16, 70, kNone, {2, 0}},         // shift 54: every row sees keys
                          {9, 600, kTopLeft, {3, 0}},      // rows see keys i - 3 .. i
                          {16, 5, kNone, {-1, 0}}};        // rows 0..10 see nothing
  std::uint64_t n = 0;
  for (const Shape& sh : shapes) {
    for (double p : {0.0, 0.17}) {
      KernelCase c{.B = 2,
                   .Hq = 8,
                   .Hkv = 2,
                   .Lq = sh.Lq,
                   .Lk = sh.Lk,
                   .causal = sh.causal,
                   .dropout = p,
                   .backend = kSplit};
      c.window = sh.window;
      c.dtype = n % 2 ? DType::f16 : DType::bf16;
      c.D = n % 3 ? 64 : 128;
      SCOPED_TRACE(c.describe());
      const test::ForwardResult r = test::run_forward_case(c, 70 + n);
      test::expect_forward_matches(c, r);
      const std::int64_t empty = expect_empty_rows_exact(c, r);
      const std::int64_t expected = sh.Lq > sh.Lk ? (sh.Lq - sh.Lk) * c.B * c.Hq : 0;
      if (sh.window.left == 0 || sh.window.left == -1) {
        EXPECT_EQ(empty, expected);
      } else {
        EXPECT_EQ(empty, sh.causal == kBottomRight ? 4 * c.B * c.Hq : 0);
      }
      ++n;
    }
  }
}

// ALiBi slopes per head ([Hq]) and per batch entry and head ([B, Hq]): a CTA's rows are the
// queries of several heads of a GQA group, each with its own slope; with and without a window,
// each alignment, with dropout and with a bias.
TEST_F(CudaSplitKv, AlibiPerHeadAndPerBatchWithGqa) {
  std::uint64_t n = 0;
  for (const char* alibi : {"h", "bh"}) {
    for (std::int64_t group : {1, 4, 8}) {
      for (CausalMode causal : {kNone, kTopLeft, kBottomRight}) {
        KernelCase c{.B = 2,
                     .Hq = 2 * group,
                     .Hkv = 2,
                     .Lq = n % 2 ? 3 : 1,
                     .Lk = n % 3 ? 3000 : 700,
                     .causal = causal};
        c.alibi = alibi;
        if (n % 2) c.window = Window{400, causal == kNone ? 20 : -1};
        c.dropout = (n / 2) % 2 ? 0.17 : 0.0;
        c.dtype = (n / 3) % 2 ? DType::f16 : DType::bf16;
        c.D = (n / 4) % 2 ? 128 : 64;
        if (n % 5 == 0) c.bias = "b11k";
        c.seed = 40 + n;
        check_case(c, 2000 + n);
        ++n;
      }
    }
  }
}

// The softcap on q·k before the scale and the bias (Gemma-2): caps that bend most scores (the
// scale 1 leaves q·k's spread of a few units) and one that bends few, alone, with each bias read
// and a window, with and without dropout, both dtypes and head dims.
TEST_F(CudaSplitKv, SoftcapAloneWithABiasAndAWindow) {
  std::uint64_t n = 0;
  for (double cap : {0.7, 3.0, 30.0}) {
    for (const char* bias : {"none", "b11k", "bhqk"}) {
      KernelCase c{.B = 2, .Hq = 8, .Hkv = 2, .Lq = 2, .Lk = 2500, .causal = kBottomRight};
      c.scale = 1.0;
      c.softcap = cap;
      c.bias = bias;
      c.bias_dtype = n % 2 ? DType::f32 : DType::bf16;
      if (n % 3 == 1) c.window = Window{511, 0};
      c.dropout = n % 2 ? 0.17 : 0.0;
      c.dtype = (n / 2) % 2 ? DType::f16 : DType::bf16;
      if (c.bias_dtype != DType::f32) c.bias_dtype = c.dtype;
      c.D = (n / 3) % 2 ? 128 : 64;
      c.seed = 60 + n;
      check_case(c, 3000 + n);
      ++n;
    }
  }
}

// Everything at once on every instantiation: a window, ALiBi per batch and head, the cap, a bias
// and dropout, GQA 8 with 16 queries (8 row blocks per kv head, each seeing its own key range),
// bottom-right and unaligned windows, over keys cut in many splits (top-left at global positions:
// cuda_global_coordinates_test.cpp, which runs cuda_splitkv too).
TEST_F(CudaSplitKv, EverythingTogetherOnEveryInstantiation) {
  std::uint64_t n = 0;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (std::int64_t D : {64, 128}) {
      for (CausalMode causal : {kNone, kBottomRight}) {
        KernelCase c{.B = 2, .Hq = 16, .Hkv = 2, .Lq = 16, .Lk = 5000, .D = D, .causal = causal};
        c.bias = "1hqk";
        c.bias_dtype = c.dtype = dtype;
        c.dropout = 0.17;
        c.window = causal == kNone ? Window{700, 300} : Window{700, 0};
        c.alibi = "bh";
        c.softcap = 20.0;
        c.seed = 80 + n;
        check_case(c, 4000 + n);
        ++n;
      }
    }
  }
}

// One decode step on the device, bf16: 2 x 8 query heads on 2 kv heads, one query of head dim
// 128 over Lk keys, inputs uniform in [-1, 1).
struct DecodeStep {
  DeviceTensor q, k, v, out, lse;
  static HostTensor random(DType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
    HostTensor t(dtype, std::move(shape));
    test::fill_uniform(t, rng, -1.0, 1.0);
    return t;
  }
  DecodeStep(std::int64_t Lk, std::mt19937_64 rng)
      : q(random(DType::bf16, {2, 8, 1, 128}, rng)),
        k(random(DType::bf16, {2, 2, Lk, 128}, rng)),
        v(random(DType::bf16, {2, 2, Lk, 128}, rng)),
        out(HostTensor(DType::bf16, {2, 8, 1, 128})),
        lse(HostTensor(DType::f32, {2, 8, 1})) {}
};

// The dispatcher counts the keys a window leaves visible: a decode step whose window holds 1024
// keys of 8192 takes the split-KV forward by default and says so; one whose window holds 128
// keys takes the fused kernels (which visit only those keys too).
TEST_F(CudaSplitKv, DispatcherCountsTheKeysAWindowLeavesVisible) {
  const DecodeStep step(8192, std::mt19937_64(5));
  AttentionArgs args = test::attention_args(step.q, step.k, step.v);
  args.causal = kBottomRight;
  args.window = Window{1023, 0};
  args.softcap = 30.0;
  const Explanation ex = explain(args, Pass::forward);
  EXPECT_EQ(ex.chosen, kSplit);
  EXPECT_NE(ex.reason.find("1024 keys the window leaves visible (Lk = 8192)"), std::string::npos)
      << ex.reason;
  EXPECT_EQ(forward(args, step.out.view, step.lse.view).backend, kSplit);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  args.window = Window{127, 0};
  EXPECT_NE(explain(args, Pass::forward).chosen, kSplit);
}

AttentionArgs decode_args(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v) {
  AttentionArgs args = test::attention_args(q, k, v);
  args.dropout_p = 0.1;
  args.causal = kBottomRight;
  return args;
}

TEST_F(CudaSplitKv, DispatcherTakesItByDefaultForFewQueriesPerKvHeadAndSaysWhy) {
  HostTensor q(DType::bf16, {2, 8, 1, 128}), k(DType::bf16, {2, 2, 2048, 128}),
      v(DType::bf16, {2, 2, 2048, 128}), out(DType::bf16, {2, 8, 1, 128}),
      lse(DType::f32, {2, 8, 1});
  std::mt19937_64 rng(3);
  for (HostTensor* t : {&q, &k, &v}) test::fill_uniform(*t, rng, -1.0, 1.0);
  DeviceTensor dq(q), dk(k), dv(v), dout(out), dlse(lse);
  const AttentionArgs args = decode_args(dq, dk, dv);

  const Explanation ex = explain(args, Pass::forward);
  EXPECT_EQ(ex.chosen, kSplit);
  EXPECT_EQ(ex.order_source, "default");
  EXPECT_NE(ex.reason.find("few queries per kv head"), std::string::npos) << ex.reason;
  EXPECT_EQ(forward(args, dout.view, dlse.view).backend, kSplit);
  EXPECT_NE(explain(args, Pass::backward).chosen, kSplit) << "forward only";

  // Avoided by naming the others; a caller's workspace of workspace_size's bytes serves it.
  EXPECT_NE(forward(args, dout.view, dlse.view, test::only({"cuda_sm90", "cuda"})).backend, kSplit);
  const std::size_t bytes = workspace_size(args, Pass::forward);
  ASSERT_GT(bytes, 0u) << "the splits' partial outputs";
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
  Options with_ws;
  with_ws.workspace = ws;
  with_ws.workspace_bytes = bytes;
  EXPECT_EQ(forward(args, dout.view, dlse.view, with_ws).backend, kSplit);
  with_ws.workspace_bytes = bytes - 16;
  const test::Thrown small = test::thrown_by([&] { forward(args, dout.view, dlse.view, with_ws); });
  EXPECT_TRUE(small.error && test::contains(small.message, "workspace_bytes")) << small.message;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(ws);

  // A long prompt (many query rows per kv head) stays on the fused kernels.
  HostTensor q_long(DType::bf16, {2, 8, 512, 128}), out_long(DType::bf16, {2, 8, 512, 128}),
      lse_long(DType::f32, {2, 8, 512});
  DeviceTensor dq_long(q_long), dout_long(out_long), dlse_long(lse_long);
  EXPECT_NE(explain(decode_args(dq_long, dk, dv), Pass::forward).chosen, kSplit);
}

TEST_F(CudaSplitKv, RefusesWhatItDoesNotRunWithReasons) {
  HostTensor q(DType::bf16, {1, 4, 1, 256}), k(DType::bf16, {1, 1, 600, 256}),
      v(DType::bf16, {1, 1, 600, 256}), out(DType::bf16, {1, 4, 1, 256}),
      lse(DType::f32, {1, 4, 1});
  DeviceTensor dq(q), dk(k), dv(v), dout(out), dlse(lse);
  const test::Thrown hd256 = test::thrown_by([&] {
    forward(test::attention_args(dq, dk, dv), dout.view, dlse.view, test::only({kSplit}));
  });
  EXPECT_TRUE(hd256.error && test::contains(hd256.message, "head dim D = 256")) << hd256.message;
  // Default dispatch passes it by, to a backend that runs head dim 256.
  EXPECT_NE(forward(test::attention_args(dq, dk, dv), dout.view, dlse.view).backend, kSplit);
}

// The fused backward (default order) on the split forward's out and lse: gradients as the
// reference's, since both forwards compute the same out and lse.
TEST_F(CudaSplitKv, FusedBackwardAfterTheSplitForwardMatchesTheReference) {
  const KernelCase cases[] = {
      {.B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lk = 1000, .D = 128, .dropout = 0.17},
      {.B = 1, .Hq = 8, .Hkv = 1, .Lq = 7, .Lk = 2000, .causal = kBottomRight, .dropout = 0.17},
      {.B = 2,
       .Hq = 4,
       .Hkv = 4,
       .Lq = 16,
       .Lk = 700,
       .D = 128,
       .causal = kTopLeft,
       .bias = "b11k",
       .dtype = DType::f16},
  };
  for (const KernelCase& c : cases) {
    SCOPED_TRACE(c.describe());
    const test::KernelInputs in(c, 21, /*with_dout=*/true);
    const test::KernelReference ref(c, in);
    HostTensor out(c.dtype, {c.B, c.Hq, c.Lq, c.dv()}), lse(DType::f32, {c.B, c.Hq, c.Lq});
    HostTensor gq = in.q, gk = in.k, gv = in.v;
    for (HostTensor* g : {&out, &lse, &gq, &gk, &gv}) test::poison(*g);
    DeviceTensor q(in.q), k(in.k), v(in.v), dout(*in.dout), o(out), l(lse), dq(gq), dk(gk), dv(gv);
    std::optional<DeviceTensor> bias;
    if (in.bias) bias.emplace(*in.bias);
    const AttentionArgs args =
        c.args(q.view, k.view, v.view, bias ? std::optional(bias->view) : std::nullopt);
    EXPECT_EQ(forward(args, o.view, l.view, test::only({kSplit})).backend, kSplit);
    const BackwardTensors g{dout.view, o.view, l.view, dq.view, dk.view, dv.view, std::nullopt};
    EXPECT_NE(backward(args, g).backend, kSplit);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dq.copy_to(gq);
    dk.copy_to(gk);
    dv.copy_to(gv);
    const test::Tolerance tol = test::fused_kernel_tolerance(c.dtype);
    test::expect_close(gq, ref.dq, tol, c.describe() + ": dq");
    test::expect_close(gk, ref.dk, tol, c.describe() + ": dk");
    test::expect_close(gv, ref.dv, tol, c.describe() + ": dv");
  }
}

}  // namespace
}  // namespace memeff
