// The gpu tests' fused-kernel cases on the host (CUDA-free; the device runs stay in tests/cuda):
// a case (shapes, mask, bias, dropout, dtypes, layout, scale, window, ALiBi, softcap, backward
// flags, backend), its inputs, and the double-precision reference's out, lse and gradients on the
// same rounded values.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/call_helpers.h"
#include "common/host_tensor.h"
#include "memeff/attention.h"

namespace memeff::test {

struct KernelCase {
  std::int64_t B = 1, Hq = 2, Hkv = 2, Lq = 64, Lk = 64, D = 64, Dv = -1;  // Dv -1: = D
  CausalMode causal = CausalMode::none;
  std::string bias = "none";  // "bhqk" with '1' for broadcast dims
  DType bias_dtype = DType::f32;
  double dropout = 0.0;
  DType dtype = DType::bf16;
  Layout layout = Layout::bhld;
  std::uint64_t seed = 1234, offset = 0;
  double scale = std::numeric_limits<double>::quiet_NaN();  // NaN: the default 1/sqrt(D)
  bool deterministic = false;  // Options::deterministic for the backward
  bool device_rng = false;     // the backward reads seed and offset from device memory
  std::string backend = "cuda";
  // Score modifiers (docs/window.md): the window, ALiBi slopes "none", "h" ([Hq]) or "bh"
  // ([B, Hq]), the softcap (0: off).
  Window window{};
  std::string alibi = "none";
  double softcap = 0.0;

  std::int64_t dv() const { return Dv < 0 ? D : Dv; }
  bool has_bias() const { return bias != "none"; }
  std::vector<std::int64_t> bias_shape() const { return test::bias_shape(bias, B, Hq, Lq, Lk); }
  std::vector<std::int64_t> slopes_shape() const {
    return alibi == "bh" ? std::vector<std::int64_t>{B, Hq} : std::vector<std::int64_t>{Hq};
  }
  // The call's arguments over these views, the mask drawn from seed at offset.
  AttentionArgs args(const TensorView& q, const TensorView& k, const TensorView& v,
                     std::optional<TensorView> bias_view,
                     std::optional<TensorView> slopes_view = std::nullopt) const {
    AttentionArgs a;
    a.q = q;
    a.k = k;
    a.v = v;
    a.bias = bias_view;
    if (!std::isnan(scale)) a.scale = scale;
    a.causal = causal;
    a.dropout_p = dropout;
    a.rng = {seed, offset};
    a.window = window;
    a.alibi_slopes = slopes_view;
    a.softcap = softcap;
    return a;
  }
  std::string describe() const {
    std::ostringstream os;
    os << backend << " " << dtype_name(dtype) << " B=" << B << " Hq=" << Hq << " Hkv=" << Hkv
       << " Lq=" << Lq << " Lk=" << Lk << " D=" << D << " Dv=" << dv()
       << " causal=" << causal_mode_name(causal) << " p=" << dropout << " bias=" << bias
       << (has_bias() ? std::string("/") + dtype_name(bias_dtype) : "")
       << (layout == Layout::blhd ? " blhd" : " bhld");
    if (!std::isnan(scale)) os << " scale=" << scale;
    if (window.bounded()) os << " window=" << window.left << "," << window.right;
    if (alibi != "none") os << " alibi=" << alibi;
    if (softcap > 0.0) os << " softcap=" << softcap;
    os << (deterministic ? " deterministic" : "") << (device_rng ? " device-rng" : "");
    return os.str();
  }
};

// A case's inputs: q, k, v (and dout, when asked for) uniform in [-1, 1), then the bias (when the
// case has one) in [-2, 2), then the ALiBi slopes (when it has them) in [0.01, 0.5), drawn in that
// order from data_seed.
struct KernelInputs {
  HostTensor q, k, v;
  std::optional<HostTensor> dout, bias, slopes;

  KernelInputs(const KernelCase& c, std::uint64_t data_seed, bool with_dout)
      : q(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
        k(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout),
        v(c.dtype, {c.B, c.Hkv, c.Lk, c.dv()}, c.layout) {
    std::mt19937_64 rng(data_seed);
    for (HostTensor* t : {&q, &k, &v}) fill_uniform(*t, rng, -1.0, 1.0);
    if (with_dout) {
      dout.emplace(c.dtype, std::vector<std::int64_t>{c.B, c.Hq, c.Lq, c.dv()}, c.layout);
      fill_uniform(*dout, rng, -1.0, 1.0);
    }
    if (c.has_bias()) {
      bias.emplace(c.bias_dtype, c.bias_shape());
      fill_uniform(*bias, rng, -2.0, 2.0);
    }
    if (c.alibi != "none") {
      slopes.emplace(DType::f32, c.slopes_shape());
      fill_uniform(*slopes, rng, 0.01, 0.5);  // ALiBi's slopes lie in (0, 1)
    }
  }
};

// The reference backend's results in double on the inputs' rounded values, with the case's mask
// (a test may pass a case of another seed to show that the mask matters). out, dq, dk, dv and
// dbias are fp64 [B, H, L, D]; lse is fp32, as the API's always is. The gradients are those of
// the unrounded out; they are computed only when the inputs have dout.
struct KernelReference {
  HostTensor out, lse, dq, dk, dv, dbias;

  KernelReference(const KernelCase& c, const KernelInputs& in)
      : out(DType::f64, {c.B, c.Hq, c.Lq, c.dv()}), lse(DType::f32, {c.B, c.Hq, c.Lq}) {
    const HostTensor q = converted(in.q, DType::f64), k = converted(in.k, DType::f64),
                     v = converted(in.v, DType::f64);
    std::optional<HostTensor> bias;
    if (in.bias) bias = converted(*in.bias, DType::f64);
    const AttentionArgs args =
        c.args(q.view, k.view, v.view, bias ? std::optional(bias->view) : std::nullopt,
               in.slopes ? std::optional(in.slopes->view) : std::nullopt);
    forward(args, out.view, lse.view, only({"reference"}));
    if (!in.dout) return;

    const HostTensor dout = converted(*in.dout, DType::f64);
    dq = HostTensor(DType::f64, {c.B, c.Hq, c.Lq, c.D});
    dk = HostTensor(DType::f64, {c.B, c.Hkv, c.Lk, c.D});
    dv = HostTensor(DType::f64, {c.B, c.Hkv, c.Lk, c.dv()});
    BackwardTensors g{dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
    if (in.bias) {
      dbias = HostTensor(DType::f64, c.bias_shape());
      g.dbias = dbias.view;
    }
    backward(args, g, only({"reference"}));
  }
};

}  // namespace memeff::test
