// Problems with an empty dimension on the reference and cpu backends, each found by the fuzz
// target (tests/fuzz): empty views may carry null pointers, huge sizes of empty dimensions must
// not size any allocation, and gradients that receive no contribution are zero, not unwritten.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/attention_case.h"
#include "memeff/attention.h"
#include "memeff/backend.h"

namespace memeff {
namespace {

using test::Case;
using test::Config;

// Both backends, forward then backward, on fresh copies of the same case, with every empty
// tensor given a null data pointer (as a caller may).
struct Pair {
  Case ref, cpu;
  explicit Pair(const Config& c) : ref(c, 5), cpu(c, 5) {
    for (Case* k : {&ref, &cpu}) {
      for (test::HostTensor* t :
           {&k->q, &k->k, &k->v, &k->out, &k->lse, &k->dout, &k->dq, &k->dk, &k->dv,
            k->bias ? &*k->bias : nullptr, k->dbias ? &*k->dbias : nullptr}) {
        if (t && t->numel() == 0) t->view.data = nullptr;
      }
    }
    ref.run_forward("reference");
    cpu.run_forward("reference");  // the backward of both reads the same out and lse
    ref.run_backward("reference");
    cpu.run_backward("cpu");
  }
};

void expect_all_zero(const test::HostTensor& t, const std::string& what) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_EQ(t.get(i), 0.0) << what << " element " << i;
  }
}

// Dv = 0: v, out and dout have no elements (null data); dq, dk and dbias are still written.
TEST(EmptyProblem, ZeroValueHeadDimWritesZeroGradients) {
  Pair p({.Lq = 5, .Lk = 9, .D = 4, .Dv = 0, .bias = "bhqk", .dropout = 0.2});
  EXPECT_EQ(p.cpu.v.view.data, nullptr);
  expect_all_zero(p.cpu.dq, "dq");
  expect_all_zero(p.cpu.dk, "dk");
  expect_all_zero(*p.cpu.dbias, "dbias");
  test::expect_close(p.cpu.dq, p.ref.dq, {0.0, 0.0}, "dq");
}

// Lk = 0 with a bias: dbias is empty (null data) and the cpu backward must not touch it.
TEST(EmptyProblem, NoKeysWithABiasGradient) {
  Pair p({.Lq = 6, .Lk = 0, .bias = "1h1k"});
  EXPECT_EQ(p.cpu.dbias->view.data, nullptr);
  expect_all_zero(p.cpu.dq, "dq");
  expect_all_zero(p.cpu.out, "out");
}

// B = 0 but a bias broadcast over the batch: its gradient is a sum over no batch, so 0.
TEST(EmptyProblem, NoBatchStillZeroesABroadcastBiasGradient) {
  for (const char* pattern : {"1hqk", "11qk", "111k"}) {
    SCOPED_TRACE(pattern);
    Pair p({.B = 0, .Lq = 3, .Lk = 4, .bias = pattern});
    ASSERT_GT(p.cpu.dbias->numel(), 0);
    expect_all_zero(*p.cpu.dbias, "cpu dbias");
    expect_all_zero(*p.ref.dbias, "reference dbias");
  }
}

// Views of an empty problem whose other sizes are huge: nothing may be sized by them.
struct HugeEmpty {
  AttentionArgs args;
  TensorView out, lse, dout, dq, dk, dv;
  HugeEmpty(std::int64_t B, std::int64_t Lq, std::int64_t Lk, std::int64_t D) {
    args.q = TensorView::contiguous(nullptr, DType::f32, {B, 2, Lq, D});
    args.k = TensorView::contiguous(nullptr, DType::f32, {B, 2, Lk, D});
    args.v = TensorView::contiguous(nullptr, DType::f32, {B, 2, Lk, 0});
    out = dout = TensorView::contiguous(nullptr, DType::f32, {B, 2, Lq, 0});
    lse = TensorView::contiguous(nullptr, DType::f32, {B, 2, Lq});
    dq = args.q;
    dk = args.k;
    dv = args.v;
  }
  void backward_on(const std::string& backend) {
    Options o;
    o.backends = {backend};
    backward(args, {dout, out, lse, dq, dk, dv, std::nullopt}, o);
  }
};

TEST(EmptyProblem, TheCpuBackendSizesNoWorkspaceByAnEmptyBatch) {
  HugeEmpty h(0, std::int64_t{1} << 31, 64, 512);  // group·Lq·D floats would be 4 TiB
  EXPECT_EQ(find_backend("cpu")->workspace_bytes(validate_inputs(h.args), Pass::backward), 0u);
  EXPECT_NO_THROW(h.backward_on("cpu"));
}

TEST(EmptyProblem, TheReferenceSizesNoRowScratchWithoutQueries) {
  HugeEmpty h(1, 0, std::int64_t{1} << 33, 0);  // a row of Lk doubles would be 64 GiB
  EXPECT_NO_THROW(h.backward_on("reference"));
}

}  // namespace
}  // namespace memeff
