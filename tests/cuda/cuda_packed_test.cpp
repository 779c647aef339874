// Packed variable-length sequences on the fused CUDA backends (`cuda`, `cuda_sm90`): forward and
// backward against the double-precision reference on the same rounded inputs and the same mask
// (mixed lengths with empty, single-row and multi-tile sequences, keys of other lengths, causal
// both ways per sequence, dropout, GQA, head dims 64 and 128); the packed run against the dense
// batch of the same equal-length sequences (one mask: bit for bit); deterministic mode; the
// offsets checked on the device's copy, and unchecked bad offsets staying inside the tensors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "common/packed_case.h"
#include "cuda/device_tensor.h"
#include "cuda/near_reference.h"
#include "memeff/attention.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using test::DeviceTensor;
using test::HostTensor;
using test::PackedCase;
using test::PackedConfig;

// Device copies of a packed case's tensors, offsets and ALiBi slopes.
struct DevicePacked : test::DeviceTensors {
  DeviceTensor cu_q, cu_k;
  std::optional<DeviceTensor> slopes;
  PackedSequences packed;

  static HostTensor offsets(const std::vector<std::int32_t>& cu) {
    HostTensor t(DType::i32, {static_cast<std::int64_t>(cu.size())});
    for (std::size_t i = 0; i < cu.size(); ++i) t.set(static_cast<std::int64_t>(i), cu[i]);
    return t;
  }
  explicit DevicePacked(const PackedCase& c)
      : DeviceTensors(c), cu_q(offsets(c.cu_q)), cu_k(offsets(c.cu_k)) {
    if (c.slopes) slopes.emplace(*c.slopes);
    packed = c.packed();
    packed.cu_seqlens_q = cu_q.view;
    packed.cu_seqlens_k = cu_k.view;
  }
  AttentionArgs args(const PackedCase& c) const {
    AttentionArgs a = c.args();
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    a.packed = packed;
    if (slopes) a.alibi_slopes = slopes->view;
    return a;
  }
  CallInfo forward_on(const std::string& backend, const PackedCase& c) {
    return memeff::forward(args(c), out.view, lse.view, test::only({backend}));
  }
  CallInfo backward_on(const std::string& backend, const PackedCase& c, bool deterministic) {
    Options o = test::only({backend});
    o.deterministic = deterministic;
    return memeff::backward(
        args(c), {dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt}, o);
  }
};

// The reference's forward and backward on the same rounded inputs, in double.
struct Reference {
  PackedCase r;
  explicit Reference(const PackedCase& c) : r(with_dtype(c.cfg, DType::f64), 1) {
    r.q = test::converted(c.q, DType::f64);
    r.k = test::converted(c.k, DType::f64);
    r.v = test::converted(c.v, DType::f64);
    r.dout = test::converted(c.dout, DType::f64);
    r.slopes = c.slopes;
    r.run_forward("reference");
    r.run_backward("reference");
  }
  static PackedConfig with_dtype(PackedConfig c, DType d) {
    c.dtype = d;
    return c;
  }
};

class CudaPacked : public test::PerBackend {
 protected:
  // Forward (out, lse) and backward (dq, dk, dv) of the backend against the reference.
  void check(const PackedConfig& c, bool deterministic = false) {
    SCOPED_TRACE(GetParam() + " " + c.describe() + (deterministic ? " deterministic" : ""));
    PackedCase pc(c, 77);
    const Reference ref(pc);
    DevicePacked dev(pc);
    EXPECT_EQ(dev.forward_on(GetParam(), pc).backend, GetParam());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    test::expect_near_reference(dev.out.to_host(pc.out), ref.r.out, c.dtype, "out");
    test::expect_lse_near_reference(dev.lse.to_host(pc.lse), ref.r.lse);
    // The backward reads the reference's out (rounded) so that only the backward differs.
    dev.out.upload(test::converted(ref.r.out, c.dtype));
    EXPECT_EQ(dev.backward_on(GetParam(), pc, deterministic).backend, GetParam());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    test::expect_near_reference(dev.dq.to_host(pc.dq), ref.r.dq, c.dtype, "dq");
    test::expect_near_reference(dev.dk.to_host(pc.dk), ref.r.dk, c.dtype, "dk");
    test::expect_near_reference(dev.dv.to_host(pc.dv), ref.r.dv, c.dtype, "dv");
  }
};

TEST_P(CudaPacked, MixedLengthsEveryMaskWithDropout) {
  PackedConfig c{.seqlens_q = {17, 1, 0, 300, 64, 65, 129}, .Hq = 4, .Hkv = 2, .D = 64};
  c.dtype = DType::bf16;
  for (CausalMode m : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    for (double p : {0.0, 0.2}) {
      c.causal = m;
      c.dropout = p;
      check(c);
    }
  }
}

TEST_P(CudaPacked, KeysOfOtherLengthsHeadDim128Fp16) {
  PackedConfig c{.seqlens_q = {5, 200, 3, 0, 127}, .seqlens_k = {190, 66, 0, 4, 130}, .Hkv = 1};
  c.D = 128;
  c.dropout = 0.1;
  c.dtype = DType::f16;
  for (CausalMode m : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    c.causal = m;
    check(c);
  }
}

TEST_P(CudaPacked, DeterministicBackwardIsRepeatableAndCorrect) {
  PackedConfig c{.seqlens_q = {700, 33, 260}, .Hq = 4, .Hkv = 1, .D = 64, .dropout = 0.1};
  c.causal = CausalMode::top_left;
  c.dtype = DType::bf16;
  check(c, /*deterministic=*/true);
  PackedCase pc(c, 5);
  DevicePacked dev(pc);
  dev.forward_on(GetParam(), pc);
  dev.backward_on(GetParam(), pc, true);
  const auto dq1 = dev.dq.bytes_on_host(), dk1 = dev.dk.bytes_on_host();
  dev.backward_on(GetParam(), pc, true);
  EXPECT_EQ(dq1, dev.dq.bytes_on_host());
  EXPECT_EQ(dk1, dev.dk.bytes_on_host());
}

// Sequences of one length packed, against the dense batch [S, H, L, D] of the same rows: the
// tiles see the same numbers in the same order and the same mask (b = s), so the forward is
// bit for bit equal, and so is the deterministic backward.
TEST_P(CudaPacked, EqualLengthsEqualTheDenseBatchBitForBit) {
  PackedConfig c{.seqlens_q = {192, 192, 192}, .Hq = 4, .Hkv = 2, .D = 64};
  c.causal = CausalMode::bottom_right;
  c.dropout = 0.25;
  c.dtype = DType::bf16;
  PackedCase pc(c, 9);
  DevicePacked dev(pc);
  dev.forward_on(GetParam(), pc);
  dev.backward_on(GetParam(), pc, true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Dense views of the same packed memory: [S, H, L, D] with strides (L·H·D, D, H·D, 1).
  const std::int64_t S = 3, L = 192, H = c.Hq, G = c.Hkv, D = c.D;
  auto dense = [&](const DeviceTensor& t, std::int64_t heads) {
    return TensorView::strided(t.data, c.dtype, {S, heads, L, D}, {L * heads * D, D, heads * D, 1},
                               Device::cuda(0));
  };
  HostTensor out2 = pc.out, lse2(DType::f32, {S, H, L}), dq2 = pc.dq, dk2 = pc.dk, dv2 = pc.dv;
  DeviceTensor o2(out2), l2(lse2), dq2d(dq2), dk2d(dk2), dv2d(dv2);
  AttentionArgs a;
  a.q = dense(dev.q, H);
  a.k = dense(dev.k, G);
  a.v = dense(dev.v, G);
  a.causal = c.causal;
  a.dropout_p = c.dropout;
  a.rng = {c.seed, c.offset};
  Options o = test::only({GetParam()});
  o.deterministic = true;
  forward(a, dense(o2, H), l2.view, o);
  backward(a,
           {dense(dev.dout, H), dense(o2, H), l2.view, dense(dq2d, H), dense(dk2d, G),
            dense(dv2d, G), std::nullopt},
           o);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dev.out.bytes_on_host(), o2.bytes_on_host()) << "out";
  EXPECT_EQ(dev.dq.bytes_on_host(), dq2d.bytes_on_host()) << "dq";
  EXPECT_EQ(dev.dk.bytes_on_host(), dk2d.bytes_on_host()) << "dk";
  EXPECT_EQ(dev.dv.bytes_on_host(), dv2d.bytes_on_host()) << "dv";
  // lse: packed [H, S·L] against dense [S, H, L].
  const HostTensor lp = dev.lse.to_host(pc.lse), ld = l2.to_host(lse2);
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < L; ++i)
        ASSERT_EQ(lp.get(h * S * L + s * L + i), ld.get((s * H + h) * L + i))
            << "lse s=" << s << " h=" << h << " i=" << i;
}

// Window, ALiBi (slopes [S, Hq]) and the softcap (docs/window.md; both backends run them) align
// with each sequence's own lengths: a window alone (cuda_sm90: the packed instantiations; cuda:
// the modifiers' kernels, packed at run time), with ALiBi and a cap (the score modifiers'
// kernels), each causal mode, dropout, GQA, empty and single-row sequences and keys of other
// lengths; then a zero-width window in fp16 at head dim 128, deterministic; then ALiBi without
// dropout, with and without the cap.
TEST_P(CudaPacked, WindowAlibiAndSoftcapPerSequence) {
  PackedConfig c{.seqlens_q = {17, 1, 0, 300, 129, 65},
                 .seqlens_k = {40, 5, 3, 290, 129, 200},
                 .Hq = 4,
                 .Hkv = 2,
                 .D = 64};
  c.dtype = DType::bf16;
  c.dropout = 0.1;
  for (CausalMode m : {CausalMode::none, CausalMode::top_left, CausalMode::bottom_right}) {
    c.causal = m;
    c.window = Window{37, 5};
    c.alibi = false;
    c.softcap = 0.0;
    check(c);
    c.alibi = true;
    c.softcap = 3.0;
    check(c);
  }
  c.D = 128;
  c.dtype = DType::f16;
  c.causal = CausalMode::none;
  c.window = Window{0, 0};
  c.softcap = 0.0;
  check(c, /*deterministic=*/true);
  // Without dropout, ALiBi alone and then with the cap (the modifiers' kernels without a bias
  // fix dropout, and the backward's the cap, at compile time).
  c.dropout = 0.0;
  c.window = Window{};
  c.alibi = true;
  check(c);
  c.softcap = 3.0;
  check(c);
}

TEST_P(CudaPacked, BadOffsetsOnTheDeviceAreNamed) {
  PackedCase pc({.seqlens_q = {10, 20}, .D = 64, .dtype = DType::bf16}, 2);
  DevicePacked dev(pc);
  const std::int32_t bad[3] = {0, 25, 30};  // decreasing lengths are fine; 25 > max_seqlen_q
  test::cuda_check(cudaMemcpy(dev.cu_q.data, bad, sizeof bad, cudaMemcpyHostToDevice), "copy");
  try {
    dev.forward_on(GetParam(), pc);
    ADD_FAILURE() << "bad offsets accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seqlen_q"), std::string::npos) << e.what();
  }
  // Unchecked, offsets past the tensors are clamped into them: no fault, no write outside.
  const std::int32_t wild[3] = {0, 1 << 20, -5};
  test::cuda_check(cudaMemcpy(dev.cu_q.data, wild, sizeof wild, cudaMemcpyHostToDevice), "copy");
  dev.packed.check_offsets = false;
  EXPECT_NO_THROW(dev.forward_on(GetParam(), pc));
  EXPECT_NO_THROW(dev.backward_on(GetParam(), pc, false));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaPacked, ::testing::Values("cuda", "cuda_sm90"),
                         test::backend_name);

}  // namespace
}  // namespace memeff
