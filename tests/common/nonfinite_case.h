// NaN and Inf in the data: the semantics of docs/api.md ("Non-finite inputs") as a test oracle.
// A case is a test::KernelCase whose inputs get NaN or ±Inf planted at chosen elements; the
// oracle computes, in double, out, lse and the gradients twice:
//   - tight: every sum runs over the keys a row sees (not removed by the causal mask or a -inf
//     bias), kept or dropped; products with a non-finite value are not skipped (0·NaN = NaN),
//     except that dV takes 0 where dropout drops a key of a NaN row. What is non-finite here
//     must be non-finite on every backend (nothing hidden).
//   - loose: the sums run over every key, masked ones too, with probability 0 there (NaN where
//     the row's lse is NaN), as a matrix product over whole tiles does, dropped keys of a NaN row
//     give NaN·0 = NaN in dV, and a key holding a NaN or Inf may spoil its own dk and dv. What is
//     finite here must be finite on every backend and equal to the oracle's value (nothing
//     invented).
// Between the two, a backend may give either: PyTorch's math path gives NaN, a tiled kernel gives
// NaN where the key's tile is computed for the row's tile.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "memeff/dropout.h"

namespace memeff::test {

// One planted value: tensor "q", "k", "v", "bias" or "dout", element [b, h, i, e] (logical
// indices of that tensor's own shape), and the value.
struct Plant {
  std::string tensor;
  std::int64_t b, h, i, e;
  double value;
};

struct NonFiniteCase {
  std::string name;
  KernelCase kc;
  std::vector<Plant> plants;
  bool minus_inf_key_padding = false;  // bias column Lk - 3 is -inf for every row (needs a bias)
  std::int64_t minus_inf_bias_row = -1;  // >= 0: this row's bias is -inf at every key ("bhqk")
  bool reaches_nothing = false;        // the plants must reach no output
};

// The inputs of a case: KernelInputs with dout, the -inf key padding, then the plants.
struct NonFiniteInputs {
  KernelInputs in;
  HostTensor& dout() { return *in.dout; }

  NonFiniteInputs(const NonFiniteCase& c, std::uint64_t data_seed)
      : in(c.kc, data_seed, /*with_dout=*/true) {
    if (c.minus_inf_key_padding) {
      HostTensor& bias = *in.bias;
      const auto& s = bias.view.shape;
      for (std::int64_t b = 0; b < s[0]; ++b)
        for (std::int64_t h = 0; h < s[1]; ++h)
          for (std::int64_t i = 0; i < s[2]; ++i)
            bias.set(((b * s[1] + h) * s[2] + i) * s[3] + (s[3] - 3),
                     -std::numeric_limits<double>::infinity());
    }
    if (c.minus_inf_bias_row >= 0) {
      HostTensor& bias = *in.bias;
      const auto& s = bias.view.shape;
      for (std::int64_t b = 0; b < s[0]; ++b)
        for (std::int64_t h = 0; h < s[1]; ++h)
          for (std::int64_t j = 0; j < s[3]; ++j)
            bias.set(((b * s[1] + h) * s[2] + c.minus_inf_bias_row) * s[3] + j,
                     -std::numeric_limits<double>::infinity());
    }
    for (const Plant& p : c.plants) {
      HostTensor& t = p.tensor == "q"      ? in.q
                      : p.tensor == "k"    ? in.k
                      : p.tensor == "v"    ? in.v
                      : p.tensor == "bias" ? *in.bias
                                           : *in.dout;
      const auto& s = t.view.shape;
      t.set(((p.b * s[1] + p.h) * s[2] + p.i) * s[3] + p.e, p.value);
    }
  }
};

// out, lse and the gradients in double, logical row-major [b, h, i, e] (lse [b, h, i]; dbias
// the bias's shape).
struct OracleResult {
  std::vector<double> out, lse, dq, dk, dv, dbias;
};

inline OracleResult nonfinite_oracle(const KernelCase& c, const KernelInputs& in, bool loose) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::int64_t B = c.B, Hq = c.Hq, Hkv = c.Hkv, Lq = c.Lq, Lk = c.Lk, D = c.D, Dv = c.dv();
  const std::int64_t G = Hq / Hkv;
  const double scale = std::isnan(c.scale) ? 1.0 / std::sqrt(static_cast<double>(D)) : c.scale;
  const std::int64_t shift = c.causal == CausalMode::bottom_right ? Lk - Lq : 0;
  const double keep_scale = c.dropout > 0.0 ? dropout_threshold(c.dropout).keep_scale : 1.0;
  // Dense copies in logical order (HostTensor::get per element would dominate the run time).
  auto dense = [](const HostTensor& t) {
    std::vector<double> d(static_cast<std::size_t>(t.numel()));
    for (std::int64_t x = 0; x < t.numel(); ++x) d[static_cast<std::size_t>(x)] = t.get(x);
    return d;
  };
  const std::vector<double> qd = dense(in.q), kd = dense(in.k), vd = dense(in.v),
                            dod = dense(*in.dout);
  const std::vector<double> biasd = in.bias ? dense(*in.bias) : std::vector<double>{};
  const double* qp = qd.data();
  const double* kp = kd.data();
  const double* vp = vd.data();
  const double* dop = dod.data();
  std::array<std::int64_t, 4> bshape{1, 1, 1, 1};
  if (in.bias) bshape = in.bias->view.shape;
  auto bias_index = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
    return (((bshape[0] == 1 ? 0 : b) * bshape[1] + (bshape[1] == 1 ? 0 : h)) * bshape[2] +
            (bshape[2] == 1 ? 0 : i)) *
               bshape[3] +
           j;
  };

  OracleResult r;
  r.out.assign(B * Hq * Lq * Dv, 0.0);
  r.lse.assign(B * Hq * Lq, 0.0);
  r.dq.assign(B * Hq * Lq * D, 0.0);
  r.dk.assign(B * Hkv * Lk * D, 0.0);
  r.dv.assign(B * Hkv * Lk * Dv, 0.0);
  if (in.bias) r.dbias.assign(in.bias->numel(), 0.0);

  std::vector<std::uint8_t> keep(Lq * Lk, 1);
  std::vector<double> s(Lk), p(Lk);
  std::vector<char> visible(Lk);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kvh = h / G;
      if (c.dropout > 0.0) {
        MaskWindow w;
        w.heads = Hq;
        w.batch_begin = b;
        w.head_begin = h;
        w.rows = Lq;
        w.cols = Lk;
        dropout_mask(c.seed, c.offset, c.dropout, w, keep.data());
      }
      for (std::int64_t i = 0; i < Lq; ++i) {
        bool any = false, bad = false;
        double m = -kInf;
        for (std::int64_t j = 0; j < Lk; ++j) {
          visible[j] = c.causal == CausalMode::none || j <= i + shift;
          // A -inf bias removes the key whatever the score holds.
          const double bias = in.bias ? biasd[bias_index(b, h, i, j)] : 0.0;
          if (bias == -kInf) visible[j] = false;
          if (!visible[j]) continue;
          double dot = 0.0;
          const double* qr = qp + ((b * Hq + h) * Lq + i) * D;
          const double* kr = kp + ((b * Hkv + kvh) * Lk + j) * D;
          for (std::int64_t e = 0; e < D; ++e) dot += qr[e] * kr[e];
          s[j] = scale * dot + bias;
          if (s[j] == -kInf) {  // a -inf score weighs 0, as a masked key does
            visible[j] = false;
            continue;
          }
          any = true;
          if (std::isnan(s[j]) || s[j] == kInf) bad = true;
          if (!bad) m = std::max(m, s[j]);
        }
        double lse = -kInf;
        if (!any) {
          std::fill(p.begin(), p.end(), 0.0);
        } else if (bad) {
          for (std::int64_t j = 0; j < Lk; ++j) p[j] = visible[j] || loose ? std::nan("") : 0.0;
          lse = std::nan("");
        } else {
          double sum = 0.0;
          for (std::int64_t j = 0; j < Lk; ++j) sum += visible[j] ? std::exp(s[j] - m) : 0.0;
          for (std::int64_t j = 0; j < Lk; ++j) p[j] = visible[j] ? std::exp(s[j] - m) / sum : 0.0;
          lse = m + std::log(sum);
        }
        r.lse[(b * Hq + h) * Lq + i] = lse;
        auto z = [&](std::int64_t j) { return keep[i * Lk + j] ? keep_scale : 0.0; };
        auto counts = [&](std::int64_t j) { return loose || visible[j]; };
        // out = Σ_j P·Z·v over the keys that count; D_i = dO·out.
        const double* qr = qp + ((b * Hq + h) * Lq + i) * D;
        const double* dor = dop + ((b * Hq + h) * Lq + i) * Dv;
        double* outr = r.out.data() + ((b * Hq + h) * Lq + i) * Dv;
        double* dqr = r.dq.data() + ((b * Hq + h) * Lq + i) * D;
        for (std::int64_t j = 0; j < Lk; ++j) {
          if (!counts(j)) continue;
          const double* vr = vp + ((b * Hkv + kvh) * Lk + j) * Dv;
          for (std::int64_t e = 0; e < Dv; ++e) outr[e] += p[j] * z(j) * vr[e];
        }
        double di = 0.0;
        for (std::int64_t e = 0; e < Dv; ++e) di += dor[e] * outr[e];
        for (std::int64_t j = 0; j < Lk; ++j) {
          if (!counts(j)) continue;
          const double* vr = vp + ((b * Hkv + kvh) * Lk + j) * Dv;
          const double* kr = kp + ((b * Hkv + kvh) * Lk + j) * D;
          double* dvr = r.dv.data() + ((b * Hkv + kvh) * Lk + j) * Dv;
          double* dkr = r.dk.data() + ((b * Hkv + kvh) * Lk + j) * D;
          double dp = 0.0;
          for (std::int64_t e = 0; e < Dv; ++e) dp += dor[e] * vr[e];
          const double ds = p[j] * (z(j) * dp - di);
          // dV takes P∘Z; where dropout drops a NaN row's key, the loose bound has NaN·0 = NaN
          // (the math path), the tight one 0 (a kernel that clears dropped probabilities).
          const double pz = !loose && z(j) == 0.0 ? 0.0 : p[j] * z(j);
          for (std::int64_t e = 0; e < Dv; ++e) dvr[e] += pz * dor[e];
          for (std::int64_t e = 0; e < D; ++e) {
            dkr[e] += scale * ds * qr[e];
            dqr[e] += scale * ds * kr[e];
          }
          if (in.bias) r.dbias[bias_index(b, h, i, j)] += ds;
        }
      }
    }
  }
  if (loose) {
    // A key holding a NaN or Inf may make its own dk and dv non-finite even where no row sees
    // it: a tiled kernel's padded query rows (past Lq) meet it in the last query tile.
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t kvh = 0; kvh < Hkv; ++kvh)
        for (std::int64_t j = 0; j < Lk; ++j) {
          const double* kr = kp + ((b * Hkv + kvh) * Lk + j) * D;
          const double* vr = vp + ((b * Hkv + kvh) * Lk + j) * Dv;
          bool bad = false;
          for (std::int64_t e = 0; e < D; ++e) bad = bad || !std::isfinite(kr[e]);
          for (std::int64_t e = 0; e < Dv; ++e) bad = bad || !std::isfinite(vr[e]);
          if (!bad) continue;
          std::fill_n(r.dk.begin() + ((b * Hkv + kvh) * Lk + j) * D, D, std::nan(""));
          std::fill_n(r.dv.begin() + ((b * Hkv + kvh) * Lk + j) * Dv, Dv, std::nan(""));
        }
  }
  return r;
}

// Checks one tensor of a backend's result against the tight and loose oracles: non-finite where
// the tight one is, finite where the loose one is, and near the oracle's value where finite.
// Returns the number of entries the tight oracle makes non-finite (so a case can assert that its
// plant reached something).
inline std::int64_t expect_nonfinite_semantics(const HostTensor& got,
                                               const std::vector<double>& tight,
                                               const std::vector<double>& loose, double rtol,
                                               const std::string& what) {
  EXPECT_EQ(got.numel(), static_cast<std::int64_t>(tight.size())) << what;
  double max_ref = 0.0;
  for (std::size_t x = 0; x < tight.size(); ++x)
    if (std::isfinite(loose[x])) max_ref = std::max(max_ref, std::abs(tight[x]));
  const double bound = 1e-5 + rtol * max_ref;
  std::int64_t must = 0, hidden = 0, invented = 0, off = 0;
  std::int64_t first_hidden = -1, first_invented = -1, worst = -1;
  double worst_err = 0.0;
  for (std::int64_t x = 0; x < got.numel(); ++x) {
    const double g = got.get(x), t = tight[x], l = loose[x];
    if (!std::isfinite(t)) {
      ++must;
      if (std::isfinite(g) && hidden++ == 0) first_hidden = x;
    } else if (std::isfinite(l)) {
      if (!std::isfinite(g)) {
        if (invented++ == 0) first_invented = x;
      } else if (t == -std::numeric_limits<double>::infinity() || std::abs(g - t) > bound) {
        if (std::abs(g - t) > worst_err || std::isnan(g - t)) worst_err = std::abs(g - t), worst = x;
        ++off;
      }
    }
  }
  EXPECT_EQ(hidden, 0) << what << ": " << hidden << " of " << must
                       << " entries the data makes non-finite are finite, first at flat index "
                       << first_hidden << " = " << (first_hidden >= 0 ? got.get(first_hidden) : 0);
  EXPECT_EQ(invented, 0) << what << ": " << invented
                         << " entries no non-finite input reaches are non-finite, first at flat "
                            "index "
                         << first_invented;
  EXPECT_EQ(off, 0) << what << ": " << off << " finite entries differ from the oracle by more than "
                    << bound << ", worst at flat index " << worst << ": got "
                    << (worst >= 0 ? got.get(worst) : 0) << ", expected "
                    << (worst >= 0 ? tight[worst] : 0);
  return must;
}

// lse: the same, with -inf (a row that sees no key) required exactly where the oracle has it.
inline std::int64_t expect_lse_semantics(const HostTensor& got, const std::vector<double>& tight,
                                         const std::vector<double>& loose, const std::string& what) {
  std::int64_t must = 0;
  for (std::int64_t x = 0; x < got.numel(); ++x) {
    const double g = got.get(x), t = tight[x];
    if (std::isnan(t)) {
      ++must;
      EXPECT_TRUE(std::isnan(g)) << what << "[" << x << "] = " << g << ", expected NaN";
    } else if (t == -std::numeric_limits<double>::infinity()) {
      EXPECT_EQ(g, t) << what << "[" << x << "]: a row that sees no key";
    } else if (!std::isnan(loose[x])) {
      EXPECT_NEAR(g, t, 1e-3 * std::max(1.0, std::abs(t))) << what << "[" << x << "]";
    }
  }
  return must;
}

// A backend's results of a case: out and lse of its forward, then the gradients of its backward
// from that out and lse.
struct NonFiniteRun {
  HostTensor out, lse, dq, dk, dv;
  std::optional<HostTensor> dbias;

  // Host tensors shaped for case `c`, filled with a finite sentinel: an element a backend does
  // not write is then a wrong finite value, which the value check reports.
  explicit NonFiniteRun(const KernelCase& c)
      : out(c.dtype, {c.B, c.Hq, c.Lq, c.dv()}, c.layout),
        lse(DType::f32, {c.B, c.Hq, c.Lq}),
        dq(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
        dk(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout),
        dv(c.dtype, {c.B, c.Hkv, c.Lk, c.dv()}, c.layout) {
    if (c.has_bias()) dbias.emplace(c.bias_dtype, c.bias_shape());
    for (HostTensor* t : {&out, &lse, &dq, &dk, &dv}) fill_value(*t, 1234.5);
    if (dbias) fill_value(*dbias, 1234.5);
  }
};

// Every output of `run` against the oracle; asserts that the plants reached what they must.
inline void expect_nonfinite_case(const NonFiniteCase& c, const NonFiniteInputs& inputs,
                                  const NonFiniteRun& run, double rtol) {
  const OracleResult tight = nonfinite_oracle(c.kc, inputs.in, false);
  const OracleResult loose = nonfinite_oracle(c.kc, inputs.in, true);
  std::int64_t reached = expect_nonfinite_semantics(run.out, tight.out, loose.out, rtol, "out");
  reached += expect_lse_semantics(run.lse, tight.lse, loose.lse, "lse");
  const double grad_rtol = 2.0 * rtol;
  reached += expect_nonfinite_semantics(run.dq, tight.dq, loose.dq, grad_rtol, "dq");
  reached += expect_nonfinite_semantics(run.dk, tight.dk, loose.dk, grad_rtol, "dk");
  reached += expect_nonfinite_semantics(run.dv, tight.dv, loose.dv, grad_rtol, "dv");
  if (run.dbias) {
    reached += expect_nonfinite_semantics(*run.dbias, tight.dbias, loose.dbias, grad_rtol, "dbias");
  }
  // Every case plants something that must show, or must not show anywhere.
  if (c.reaches_nothing) {
    EXPECT_EQ(reached, 0) << "a value no row sees reached an output";
  } else {
    EXPECT_GT(reached, 0) << "the planted values reach no output: the case tests nothing";
  }
}

// Every case of nonfinite_cases(dtype) on `backend`: `run(case, inputs)` returns the backend's
// NonFiniteRun (forward, then the backward from its out and lse), held to the oracle within rtol.
template <class Run>
void expect_every_nonfinite_case(const std::string& backend, DType dtype, double rtol, Run&& run);

// The cases every backend runs (with `dtype` and lengths that cross the fused kernels' tiles).
inline std::vector<NonFiniteCase> nonfinite_cases(DType dtype) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto base = [&](CausalMode causal, double dropout, const std::string& bias) {
    KernelCase k;
    k.B = 2;
    k.Hq = 2;
    k.Hkv = 2;
    k.Lq = 150;
    k.Lk = 200;
    k.D = 64;
    k.causal = causal;
    k.dropout = dropout;
    k.bias = bias;
    k.bias_dtype = dtype;
    k.dtype = dtype;
    k.seed = 77;
    k.offset = 5;
    return k;
  };
  constexpr CausalMode none = CausalMode::none, top_left = CausalMode::top_left,
                       bottom_right = CausalMode::bottom_right;
  std::vector<NonFiniteCase> cases;
  cases.push_back({"nan_in_q", base(none, 0.0, "none"), {{"q", 1, 0, 37, 5, nan}}});
  cases.push_back({"nan_in_q_causal_dropout", base(top_left, 0.2, "none"),
                   {{"q", 0, 1, 140, 0, nan}, {"q", 1, 1, 3, 63, nan}, {"q", 1, 0, 0, 1, nan}}});
  cases.push_back({"nan_in_k_seen_by_later_rows", base(top_left, 0.0, "none"),
                   {{"k", 0, 1, 70, 9, nan}}});
  cases.push_back({"plus_inf_in_k", base(bottom_right, 0.1, "none"), {{"k", 1, 0, 130, 2, inf}}});
  cases.push_back({"minus_inf_in_q", base(none, 0.0, "none"), {{"q", 0, 0, 64, 7, -inf}}});
  cases.push_back({"nan_in_v_causal_dropout", base(bottom_right, 0.3, "none"),
                   {{"v", 0, 0, 120, 11, nan}}});
  cases.push_back({"inf_in_v", base(none, 0.0, "none"), {{"v", 1, 1, 3, 0, inf}}});
  cases.push_back({"nan_in_dout", base(top_left, 0.1, "none"), {{"dout", 1, 0, 90, 4, nan}}});
  cases.push_back({"nan_and_inf_in_bias", base(none, 0.0, "bhqk"),
                   {{"bias", 0, 1, 10, 150, nan}, {"bias", 1, 0, 140, 3, inf}}});
  // A key masked for every row by a -inf bias column never reaches anything, whatever it holds.
  NonFiniteCase padded{"key_masked_by_bias_holds_nan", base(none, 0.1, "b11k"),
                       {{"k", 0, 0, 197, 1, nan}, {"k", 1, 1, 197, 2, inf}}, true};
  padded.reaches_nothing = true;
  cases.push_back(padded);
  // A row a -inf bias masks at every key sees none, with a NaN in its q or behind the mask; a NaN
  // key the other rows see makes them NaN.
  NonFiniteCase bias_row{"row_masked_by_bias_nan_query", base(none, 0.0, "bhqk"),
                         {{"q", 0, 0, 37, 5, nan}, {"k", 1, 1, 60, 2, nan}}};
  bias_row.minus_inf_bias_row = 37;
  cases.push_back(bias_row);
  // Keys no row sees under a top-left causal mask (Lk > Lq: keys 150..199) never reach out, lse,
  // dq or another key's gradients, whatever they hold.
  NonFiniteCase unseen{"keys_no_row_sees_hold_nan", base(top_left, 0.0, "none"),
                       {{"k", 0, 1, 170, 0, nan}, {"v", 1, 0, 180, 3, inf}, {"k", 1, 1, 199, 5, inf}}};
  unseen.reaches_nothing = true;
  cases.push_back(unseen);
  // Rows that see no key (bottom-right, Lq > Lk) stay 0 with lse -inf, NaN in q or not.
  NonFiniteCase no_keys{"rows_without_keys", base(bottom_right, 0.0, "none"),
                        {{"q", 0, 0, 2, 0, nan}, {"q", 1, 1, 180, 3, nan}}};
  no_keys.kc.Lq = 200;
  no_keys.kc.Lk = 150;
  cases.push_back(no_keys);
  NonFiniteCase gqa{"nan_in_k_grouped_heads", base(top_left, 0.0, "none"),
                    {{"k", 1, 0, 20, 30, nan}}};
  gqa.kc.Hq = 4;
  cases.push_back(gqa);
  return cases;
}

template <class Run>
void expect_every_nonfinite_case(const std::string& backend, DType dtype, double rtol, Run&& run) {
  for (NonFiniteCase c : nonfinite_cases(dtype)) {
    c.kc.backend = backend;
    SCOPED_TRACE(c.name + ": " + c.kc.describe());
    NonFiniteInputs inputs(c, 11);
    const NonFiniteRun result = run(c, inputs);
    expect_nonfinite_case(c, inputs, result, rtol);
  }
}

}  // namespace memeff::test
