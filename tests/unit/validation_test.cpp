// Argument validation: every malformed call is refused with memeff::Error naming the argument,
// what was expected and what was given, before any backend runs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "common/call_helpers.h"
#include "common/host_tensor.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::HostTensor;
using Fragments = std::initializer_list<const char*>;

// Runs `f`, expects memeff::Error with the code, and every fragment in its message.
void expect_error(const std::function<void()>& f, ErrorCode code, Fragments fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const char* frag : fragments) {
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos)
          << "message lacks \"" << frag << "\": " << e.what();
    }
  }
}

// Each validation entry point refusing a call as an invalid argument, naming every fragment.
void expect_forward_refused(const AttentionArgs& a, const TensorView& out, const TensorView& lse,
                            Fragments fragments) {
  expect_error([&] { validate_forward(a, out, lse); }, ErrorCode::invalid_argument, fragments);
}
void expect_backward_refused(const AttentionArgs& a, const BackwardTensors& g,
                             Fragments fragments) {
  expect_error([&] { validate_backward(a, g); }, ErrorCode::invalid_argument, fragments);
}
void expect_inputs_refused(const AttentionArgs& a, Fragments fragments) {
  expect_error([&] { validate_inputs(a); }, ErrorCode::invalid_argument, fragments);
}

// A well-formed GQA call: q [2, 4, 8, 16], k [2, 2, 10, 16], v [2, 2, 10, 12].
struct Call {
  HostTensor q{DType::f32, {2, 4, 8, 16}}, k{DType::f32, {2, 2, 10, 16}},
      v{DType::f32, {2, 2, 10, 12}}, out{DType::f32, {2, 4, 8, 12}}, lse{DType::f32, {2, 4, 8}};
  AttentionArgs args() const { return test::attention_args(q, k, v); }
  // The forward with these arguments and this call's out and lse is refused.
  void expect_refused(const AttentionArgs& a, Fragments fragments) const {
    expect_forward_refused(a, out.view, lse.view, fragments);
  }
  // The same with one input (q, k, v or bias) replaced by `t`.
  template <typename Input>
  void expect_refused_with(Input AttentionArgs::*input, const HostTensor& t,
                           Fragments fragments) const {
    AttentionArgs a = args();
    a.*input = t.view;
    expect_refused(a, fragments);
  }
};

TEST(Validation, AcceptsAWellFormedGqaCall) {
  Call c;
  const Problem p = validate_forward(c.args(), c.out.view, c.lse.view);
  EXPECT_EQ(p.B, 2);
  EXPECT_EQ(p.Hq, 4);
  EXPECT_EQ(p.Hkv, 2);
  EXPECT_EQ(p.group_size(), 2);
  EXPECT_EQ(p.Lq, 8);
  EXPECT_EQ(p.Lk, 10);
  EXPECT_EQ(p.D, 16);
  EXPECT_EQ(p.Dv, 12);
  EXPECT_DOUBLE_EQ(p.scale, 0.25);
}

TEST(Validation, WrongRank) {
  Call c;
  AttentionArgs a = c.args();
  a.k = TensorView::contiguous(c.k.view.data, DType::f32, {2, 20, 16});
  c.expect_refused(a, {"`k`", "rank 4", "rank 3"});
}

TEST(Validation, MismatchedSizes) {
  Call c;
  c.expect_refused_with(&AttentionArgs::k, HostTensor(DType::f32, {2, 2, 10, 8}),
                        {"`k`", "dimension 3", "16", "got 8"});
  c.expect_refused_with(&AttentionArgs::v, HostTensor(DType::f32, {2, 2, 11, 12}),
                        {"`v`", "dimension 2", "got 11"});
  c.expect_refused_with(&AttentionArgs::k, HostTensor(DType::f32, {3, 2, 10, 16}),
                        {"`k`", "batch", "got 3"});
  HostTensor out_bad(DType::f32, {2, 4, 8, 16});
  expect_forward_refused(c.args(), out_bad.view, c.lse.view,
                         {"`out`", "head dim of v", "12", "got 16"});
  HostTensor lse_bad(DType::f32, {2, 4, 9});
  expect_forward_refused(c.args(), c.out.view, lse_bad.view, {"`lse`", "[2, 4, 8]"});
}

TEST(Validation, HeadsMustGroup) {
  Call c;
  AttentionArgs a = c.args();
  HostTensor k3(DType::f32, {2, 3, 10, 16}), v3(DType::f32, {2, 3, 10, 12});
  a.k = k3.view;
  a.v = v3.view;
  c.expect_refused(a, {"`k`", "Hkv = 3", "Hq = 4"});
}

TEST(Validation, BiasMustBroadcast) {
  Call c;
  AttentionArgs a = c.args();
  HostTensor ok(DType::f32, {1, 4, 1, 10});
  a.bias = ok.view;
  const Problem p = validate_forward(a, c.out.view, c.lse.view);
  EXPECT_EQ(p.bias_pattern(), "1h1k");
  c.expect_refused_with(&AttentionArgs::bias, HostTensor(DType::f32, {2, 3, 8, 10}),
                        {"`bias`", "broadcastable", "dimension 1"});
  // Keys never broadcast.
  c.expect_refused_with(&AttentionArgs::bias, HostTensor(DType::f32, {1, 1, 1, 1}),
                        {"`bias`", "dimension 3"});
  c.expect_refused_with(&AttentionArgs::bias, HostTensor(DType::f16, {1, 1, 1, 10}),
                        {"`bias`", "fp16"});
}

TEST(Validation, DtypesMustAgree) {
  Call c;
  c.expect_refused_with(&AttentionArgs::k, HostTensor(DType::bf16, {2, 2, 10, 16}),
                        {"`k`", "fp32", "bf16"});
  HostTensor lse64(DType::f64, {2, 4, 8});
  expect_forward_refused(c.args(), c.out.view, lse64.view, {"`lse`", "fp32", "fp64"});
}

TEST(Validation, DropoutAndScaleRanges) {
  Call c;
  AttentionArgs a = c.args();
  a.dropout_p = 1.0;
  c.expect_refused(a, {"`dropout_p`", "[0, 1)"});
  a.dropout_p = -0.5;
  c.expect_refused(a, {"`dropout_p`"});
  a.dropout_p = 0.0;
  a.scale = std::nan("");
  c.expect_refused(a, {"`scale`", "finite"});
  a.scale = INFINITY;
  c.expect_refused(a, {"`scale`"});
}

TEST(Validation, NullDataWithElements) {
  Call c;
  AttentionArgs a = c.args();
  a.v.data = nullptr;
  c.expect_refused(a, {"`v`", "null"});
  // A view with zero elements may have null data.
  HostTensor q0(DType::f32, {2, 4, 0, 16}), out0(DType::f32, {2, 4, 0, 12}),
      lse0(DType::f32, {2, 4, 0});
  a = c.args();
  a.q = q0.view;
  a.q.data = nullptr;
  EXPECT_NO_THROW(validate_forward(a, out0.view, lse0.view));
}

TEST(Validation, MixedDevices) {
  Call c;
  AttentionArgs a = c.args();
  a.v.device = Device::cuda(0);
  c.expect_refused(a, {"`v`", "cpu", "cuda:0"});
  TensorView out = c.out.view;
  out.device = Device::cuda(1);
  expect_forward_refused(c.args(), out, c.lse.view, {"`out`", "cuda:1"});
}

TEST(Validation, LastDimensionMustBeContiguous) {
  Call c;
  AttentionArgs a = c.args();
  a.q.stride = {512, 128, 16, 2};
  a.q.shape[3] = 8;
  c.expect_refused(a, {"`q`", "contiguous last dimension", "stride 2"});
}

TEST(Validation, OutputsMustNotAliasInputs) {
  Call c;
  // out written over v. Both start in one buffer of out's size, so out's bytes past v's end are
  // the buffer's own: no other allocation the heap happened to place after v (q or k, which the
  // check would name first) lies under out.
  HostTensor shared(DType::f32, {2, 4, 8, 12});
  AttentionArgs a = c.args();
  a.v.data = shared.view.data;
  TensorView out = c.out.view;
  out.data = shared.view.data;
  expect_forward_refused(a, out, c.lse.view, {"`out`", "`v`"});
  // Gradients must not overlap each other either.
  HostTensor dout(DType::f32, {2, 4, 8, 12}), dq(DType::f32, {2, 4, 8, 16}),
      dk(DType::f32, {2, 2, 10, 16}), dv(DType::f32, {2, 2, 10, 12});
  BackwardTensors g{dout.view, c.out.view, c.lse.view, dq.view, dk.view, dv.view, std::nullopt};
  EXPECT_NO_THROW(validate_backward(c.args(), g));
  g.dv.data = dk.view.data;
  expect_backward_refused(c.args(), g, {"`dk`", "`dv`"});
  g.dv = dv.view;
  g.dq.data = c.q.view.data;
  expect_backward_refused(c.args(), g, {"`dq`", "`q`"});
}

TEST(Validation, DbiasNeedsABiasOfTheSameShape) {
  Call c;
  HostTensor dout(DType::f32, {2, 4, 8, 12}), dq(DType::f32, {2, 4, 8, 16}),
      dk(DType::f32, {2, 2, 10, 16}), dv(DType::f32, {2, 2, 10, 12}), db(DType::f32, {1, 4, 8, 10});
  BackwardTensors g{dout.view, c.out.view, c.lse.view, dq.view, dk.view, dv.view, db.view};
  expect_backward_refused(c.args(), g, {"`dbias`", "no bias"});
  AttentionArgs a = c.args();
  HostTensor bias(DType::f32, {2, 4, 8, 10});
  a.bias = bias.view;
  expect_backward_refused(a, g, {"`dbias`", "dimension 0", "got 1"});
}

TEST(Validation, UnsupportedDeviceIsReportedByTheDispatcher) {
  // A CUDA tensor with no CUDA backend able to take it: an `unsupported` error listing reasons.
  HostTensor q(DType::f32, {1, 1, 4, 8}), k(DType::f32, {1, 1, 4, 8}), v(DType::f32, {1, 1, 4, 8}),
      out(DType::f32, {1, 1, 4, 8}), lse(DType::f32, {1, 1, 4});
  AttentionArgs a = test::attention_args(q, k, v);
  TensorView o_view = out.view, l_view = lse.view;
  for (TensorView* t : {&a.q, &a.k, &a.v, &o_view, &l_view}) t->device = Device::cuda(0);
  expect_error([&] { forward(a, o_view, l_view, test::only({"reference"})); },
               ErrorCode::unsupported, {"reference", "runs on cpu"});
}

TEST(Validation, ReportsWhetherViewsAllowSixteenByteVectors) {
  // Row strides of 16 fp32 (64 bytes) are aligned; D = 3 gives 12-byte rows, which are not.
  HostTensor q(DType::f32, {1, 2, 8, 16}), k(DType::f32, {1, 2, 8, 16}),
      v(DType::f32, {1, 2, 8, 16}), out(DType::f32, {1, 2, 8, 16}), lse(DType::f32, {1, 2, 8});
  AttentionArgs a = test::attention_args(q, k, v);
  EXPECT_TRUE(validate_forward(a, out.view, lse.view).vector_aligned);
  HostTensor q3(DType::f32, {1, 2, 8, 3}), k3(DType::f32, {1, 2, 8, 3});
  a.q = q3.view;
  a.k = k3.view;
  EXPECT_FALSE(validate_forward(a, out.view, lse.view).vector_aligned);
  a.q = q.view;
  a.k = k.view;
  TensorView shifted = out.view;  // one element past a 16-byte boundary
  shifted.data = static_cast<float*>(out.view.data) + 1;
  shifted.shape[2] = 7;
  HostTensor out_ok(DType::f32, {1, 2, 7, 16}), lse7(DType::f32, {1, 2, 7});
  HostTensor q7(DType::f32, {1, 2, 7, 16});
  a.q = q7.view;
  EXPECT_TRUE(validate_forward(a, out_ok.view, lse7.view).vector_aligned);
  EXPECT_FALSE(validate_forward(a, shifted, lse7.view).vector_aligned);
}

// Found by tests/fuzz: a rank beyond TensorView::kMaxRank made the message itself read past the
// shape array; the error names the argument and the rank instead.
TEST(Validation, RankBeyondTheMaximumIsNamedWithoutReadingPastTheShape) {
  Call c;
  AttentionArgs a = c.args();
  a.k.rank = 9;
  expect_inputs_refused(a, {"argument `k`", "expected rank 4", "invalid rank 9"});
  a.k.rank = -3;
  expect_inputs_refused(a, {"argument `k`", "invalid rank -3"});
  EXPECT_EQ(a.k.numel(), 0);
}

// Found by tests/fuzz: sizes or strides whose offsets overflow int64 (signed overflow in the
// element count and the aliasing extents).
TEST(Validation, OffsetsThatOverflowAreRefused) {
  Call c;
  AttentionArgs a = c.args();
  a.q.shape = {std::int64_t{1} << 40, std::int64_t{1} << 40, 8, 16};
  expect_inputs_refused(a, {"argument `q`", "overflow 64-bit offsets"});
  a = c.args();
  a.v.stride[1] = std::numeric_limits<std::int64_t>::max() / 3;
  expect_inputs_refused(a, {"argument `v`", "overflow 64-bit offsets"});
  EXPECT_EQ((TensorView{nullptr,
                        DType::f32,
                        {},
                        4,
                        {std::int64_t{1} << 40, std::int64_t{1} << 40, 1 << 20, 1},
                        {}}
                 .numel()),
            std::numeric_limits<std::int64_t>::max());
}

// Found by tests/fuzz (UBSan: misaligned float loads in the reference backend).
TEST(Validation, DataNotAlignedToItsElementIsRefused) {
  Call c;
  AttentionArgs a = c.args();
  a.k.data = static_cast<char*>(a.k.data) + 2;
  expect_inputs_refused(a, {"argument `k`", "aligned to its element size (4 bytes for fp32)"});
}

TEST(Validation, OutputsWhoseElementsOverlapAreRefused) {
  Call c;
  TensorView out = c.out.view;
  out.stride[2] = 0;  // every query row writes the same memory
  expect_forward_refused(c.args(), out, c.lse.view, {"argument `out`", "overlap in memory"});
  TensorView lse = c.lse.view;
  lse.stride[1] = 3;  // heads step less than a head's 8 rows
  expect_forward_refused(c.args(), c.out.view, lse, {"argument `lse`", "overlap in memory"});
  TensorView reversed = c.out.view;  // a negative stride is fine when elements stay distinct
  reversed.data = static_cast<float*>(reversed.data) + 7 * reversed.stride[2];
  reversed.stride[2] = -reversed.stride[2];
  EXPECT_NO_THROW(validate_forward(c.args(), reversed, c.lse.view));
}

TEST(Validation, AnUnknownDeviceTypeIsRefused) {
  Call c;
  AttentionArgs a = c.args();
  a.q.device.type = static_cast<DeviceType>(7);
  expect_inputs_refused(a, {"argument `q`", "expected a cpu or cuda device"});
}

}  // namespace
}  // namespace memeff
