// One attention call's tensors for CPU-side tests: a Config (shapes, mask, bias pattern,
// dropout, dtype, layout), fresh random inputs, poisoned outputs, and runs on a named backend.
// The comparison every backend test uses, expect_close, is in common/tolerance.h.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/call_helpers.h"
#include "common/host_tensor.h"
#include "common/tolerance.h"
#include "memeff/attention.h"

namespace memeff::test {

// The shape of a bias of pattern "bhqk" ('1' where it broadcasts) over [B, Hq, Lq, Lk].
inline std::vector<std::int64_t> bias_shape(const std::string& pattern, std::int64_t B,
                                            std::int64_t Hq, std::int64_t Lq, std::int64_t Lk) {
  const std::int64_t full[4] = {B, Hq, Lq, Lk};
  std::vector<std::int64_t> shape(4);
  for (int d = 0; d < 4; ++d) shape[d] = pattern[d] == '1' ? 1 : full[d];
  return shape;
}

struct Config {
  std::int64_t B = 1, Hq = 2, Hkv = 2, Lq = 17, Lk = 17, D = 40, Dv = -1;  // Dv -1: = D
  CausalMode causal = CausalMode::none;
  std::string bias = "none";  // "none" or a pattern like "bhqk", "1h1k"
  double dropout = 0.0;
  DType dtype = DType::f32;
  Layout layout = Layout::bhld;
  std::uint64_t seed = 99, offset = 3;
  Window window{};             // docs/window.md
  std::string alibi = "none";  // "none", "h" (slopes [Hq]) or "bh" (slopes [B, Hq])
  double softcap = 0.0;

  std::int64_t dv() const { return Dv < 0 ? D : Dv; }
  std::string describe() const {
    return std::string(dtype_name(dtype)) + " B" + std::to_string(B) + " Hq" + std::to_string(Hq) +
           " Hkv" + std::to_string(Hkv) + " Lq" + std::to_string(Lq) + " Lk" + std::to_string(Lk) +
           " D" + std::to_string(D) + " Dv" + std::to_string(dv()) + " causal " +
           causal_mode_name(causal) + " bias " + bias + " p " + std::to_string(dropout) +
           (layout == Layout::blhd ? " blhd" : " bhld") +
           (window.bounded()
                ? " window " + std::to_string(window.left) + "," + std::to_string(window.right)
                : "") +
           (alibi != "none" ? " alibi " + alibi : "") +
           (softcap > 0 ? " softcap " + std::to_string(softcap) : "");
  }
};

// All tensors of one call: inputs random (a function of data_seed), outputs poisoned.
struct Case {
  Config cfg;
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  std::optional<HostTensor> bias, dbias;
  std::optional<HostTensor> slopes;  // ALiBi, fp32

  Case(const Config& c, std::uint64_t data_seed)
      : cfg(c),
        q(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
        k(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout),
        v(c.dtype, {c.B, c.Hkv, c.Lk, c.dv()}, c.layout),
        out(c.dtype, {c.B, c.Hq, c.Lq, c.dv()}, c.layout),
        lse(DType::f32, {c.B, c.Hq, c.Lq}),
        dout(c.dtype, {c.B, c.Hq, c.Lq, c.dv()}, c.layout),
        dq(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
        dk(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout),
        dv(c.dtype, {c.B, c.Hkv, c.Lk, c.dv()}, c.layout) {
    std::mt19937_64 rng(data_seed);
    test::fill_normal(q, rng);
    test::fill_normal(k, rng);
    test::fill_normal(v, rng);
    test::fill_normal(dout, rng);
    if (c.bias != "none") {
      const std::vector<std::int64_t> shape = bias_shape(c.bias, c.B, c.Hq, c.Lq, c.Lk);
      bias.emplace(c.dtype, shape);
      dbias.emplace(c.dtype, shape);
      test::fill_normal(*bias, rng);
    }
    if (c.alibi != "none") {
      slopes.emplace(DType::f32, c.alibi == "bh" ? std::vector<std::int64_t>{c.B, c.Hq}
                                                 : std::vector<std::int64_t>{c.Hq});
      test::fill_uniform(*slopes, rng, 0.01, 0.5);  // ALiBi's slopes lie in (0, 1)
    }
    poison_outputs();
  }
  void poison_outputs() {
    for (HostTensor* t : {&out, &lse, &dq, &dk, &dv}) test::poison(*t);
    if (dbias) test::poison(*dbias);
  }

  AttentionArgs args() const {
    AttentionArgs a = test::attention_args(q, k, v);
    if (bias) a.bias = bias->view;
    a.causal = cfg.causal;
    a.dropout_p = cfg.dropout;
    a.rng = {cfg.seed, cfg.offset};
    a.window = cfg.window;
    if (slopes) a.alibi_slopes = slopes->view;
    a.softcap = cfg.softcap;
    return a;
  }
  // The backward's tensors: dout, this case's out and lse, and the gradients.
  BackwardTensors grads() const {
    BackwardTensors g{dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
    if (dbias) g.dbias = dbias->view;
    return g;
  }
  CallInfo run_forward(const std::string& backend) {
    return forward(args(), out.view, lse.view, only({backend}));
  }
  CallInfo run_backward(const std::string& backend) {
    return backward(args(), grads(), only({backend}));
  }
  // Σ out ∘ dout after a forward on `backend`: the scalar whose gradient backward computes.
  double loss(const std::string& backend) {
    run_forward(backend);
    double s = 0.0;
    for (std::int64_t i = 0; i < out.numel(); ++i) s += out.get(i) * dout.get(i);
    return s;
  }
};

}  // namespace memeff::test
