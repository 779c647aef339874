// Packed variable-length calls for tests (AttentionArgs::packed): host tensors of a packed batch
// built from per-sequence lengths, the offsets, runs on a named backend, and the same sequences as
// a padded batch (B = S, padded to the longest) whose padding and per-sequence causal masks are
// an additive -inf bias, so the two runs draw one dropout mask and compute the same thing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/attention_case.h"
#include "common/call_helpers.h"
#include "common/host_tensor.h"
#include "memeff/attention.h"

namespace memeff::test {

struct PackedConfig {
  std::vector<std::int64_t> seqlens_q = {}, seqlens_k = {};  // same count; k empty: as q
  std::int64_t Hq = 2, Hkv = 2, D = 32, Dv = -1;             // Dv -1: = D
  CausalMode causal = CausalMode::none;
  double dropout = 0.0;
  DType dtype = DType::f32;
  std::uint64_t seed = 7, offset = 11;
  Window window{};     // docs/window.md: aligned per sequence
  bool alibi = false;  // slopes [S, Hq]: per sequence and head
  double softcap = 0.0;

  std::int64_t dv() const { return Dv < 0 ? D : Dv; }
  const std::vector<std::int64_t>& lens_k() const {
    return seqlens_k.empty() ? seqlens_q : seqlens_k;
  }
  std::int64_t sequences() const { return static_cast<std::int64_t>(seqlens_q.size()); }
  std::string describe() const {
    std::string s = std::string(dtype_name(dtype)) + " Hq" + std::to_string(Hq) + " Hkv" +
                    std::to_string(Hkv) + " D" + std::to_string(D) + " Dv" + std::to_string(dv()) +
                    " causal " + causal_mode_name(causal) + " p " + std::to_string(dropout) + " q";
    for (auto l : seqlens_q) s += " " + std::to_string(l);
    s += " k";
    for (auto l : lens_k()) s += " " + std::to_string(l);
    if (window.bounded()) {
      s += " window " + std::to_string(window.left) + "," + std::to_string(window.right);
    }
    if (alibi) s += " alibi";
    if (softcap > 0) s += " softcap " + std::to_string(softcap);
    return s;
  }
};

inline std::vector<std::int32_t> cumulative(const std::vector<std::int64_t>& lens) {
  std::vector<std::int32_t> cu(lens.size() + 1, 0);
  for (std::size_t s = 0; s < lens.size(); ++s)
    cu[s + 1] = cu[s] + static_cast<std::int32_t>(lens[s]);
  return cu;
}

// AttentionArgs::packed over host offsets (which must outlive it).
inline PackedSequences packed_sequences(const std::vector<std::int32_t>& cu_q,
                                        const std::vector<std::int32_t>& cu_k, std::int64_t max_q,
                                        std::int64_t max_k) {
  auto offsets = [](const std::vector<std::int32_t>& cu) {
    return TensorView::contiguous(const_cast<std::int32_t*>(cu.data()), DType::i32,
                                  {static_cast<std::int64_t>(cu.size())});
  };
  PackedSequences p;
  p.cu_seqlens_q = offsets(cu_q);
  p.cu_seqlens_k = offsets(cu_k);
  p.max_seqlen_q = max_q;
  p.max_seqlen_k = max_k;
  return p;
}

struct PackedCase {
  PackedConfig cfg;
  std::vector<std::int32_t> cu_q, cu_k;
  std::int64_t Tq = 0, Tk = 0, max_q = 0, max_k = 0;
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  std::optional<HostTensor> slopes;  // [S, Hq] when cfg.alibi

  PackedCase(const PackedConfig& c, std::uint64_t data_seed)
      : cfg(c), cu_q(cumulative(c.seqlens_q)), cu_k(cumulative(c.lens_k())) {
    Tq = cu_q.back();
    Tk = cu_k.back();
    for (auto l : c.seqlens_q) max_q = std::max(max_q, l);
    for (auto l : c.lens_k()) max_k = std::max(max_k, l);
    q = HostTensor(c.dtype, {Tq, c.Hq, c.D});
    k = HostTensor(c.dtype, {Tk, c.Hkv, c.D});
    v = HostTensor(c.dtype, {Tk, c.Hkv, c.dv()});
    out = HostTensor(c.dtype, {Tq, c.Hq, c.dv()});
    lse = HostTensor(DType::f32, {c.Hq, Tq});
    dout = HostTensor(c.dtype, {Tq, c.Hq, c.dv()});
    dq = HostTensor(c.dtype, {Tq, c.Hq, c.D});
    dk = HostTensor(c.dtype, {Tk, c.Hkv, c.D});
    dv = HostTensor(c.dtype, {Tk, c.Hkv, c.dv()});
    std::mt19937_64 rng(data_seed);
    fill_normal(q, rng);
    fill_normal(k, rng);
    fill_normal(v, rng);
    fill_normal(dout, rng);
    if (c.alibi) {
      slopes.emplace(DType::f32, std::vector<std::int64_t>{c.sequences(), c.Hq});
      fill_uniform(*slopes, rng, 0.01, 0.5);
    }
    poison_outputs();
  }
  void poison_outputs() {
    for (HostTensor* t : {&out, &lse, &dq, &dk, &dv}) poison(*t);
  }

  PackedSequences packed() const { return packed_sequences(cu_q, cu_k, max_q, max_k); }
  AttentionArgs args() const {
    AttentionArgs a = attention_args(q, k, v);
    a.causal = cfg.causal;
    a.dropout_p = cfg.dropout;
    a.rng = {cfg.seed, cfg.offset};
    a.packed = packed();
    a.window = cfg.window;
    if (slopes) a.alibi_slopes = slopes->view;
    a.softcap = cfg.softcap;
    return a;
  }
  CallInfo run_forward(const std::string& backend) {
    return forward(args(), out.view, lse.view, only({backend}));
  }
  CallInfo run_backward(const std::string& backend) {
    return backward(args(),
                    {dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt},
                    only({backend}));
  }

  // The padded batch: B = S, Lq = max_q, Lk = max_k, [B, H, L, D]; rows past a sequence's
  // length are zero, and a [B, 1, Lq, Lk] bias of 0 / -inf holds the padding and causal masks.
  Case padded() const {
    Config c;
    c.B = cfg.sequences();
    c.Hq = cfg.Hq;
    c.Hkv = cfg.Hkv;
    c.Lq = max_q;
    c.Lk = max_k;
    c.D = cfg.D;
    c.Dv = cfg.dv();
    c.dropout = cfg.dropout;
    c.dtype = cfg.dtype;
    c.seed = cfg.seed;
    c.offset = cfg.offset;
    c.bias = "b1qk";
    Case p(c, 1);
    for (HostTensor* t : {&p.q, &p.k, &p.v, &p.dout}) {
      for (std::int64_t i = 0; i < t->numel(); ++i) t->set(i, 0.0);
    }
    const double inf = std::numeric_limits<double>::infinity();
    for (std::int64_t s = 0; s < c.B; ++s) {
      const std::int64_t lq = cu_q[s + 1] - cu_q[s], lk = cu_k[s + 1] - cu_k[s];
      copy_rows(q, cu_q[s], lq, p.q, s);
      copy_rows(k, cu_k[s], lk, p.k, s);
      copy_rows(v, cu_k[s], lk, p.v, s);
      copy_rows(dout, cu_q[s], lq, p.dout, s);
      const std::int64_t shift = cfg.causal == CausalMode::bottom_right ? lk - lq : 0;
      for (std::int64_t i = 0; i < max_q; ++i) {
        for (std::int64_t j = 0; j < max_k; ++j) {
          const bool visible =
              i < lq && j < lk && (cfg.causal == CausalMode::none || j <= i + shift);
          p.bias->set((s * max_q + i) * max_k + j, visible ? 0.0 : -inf);
        }
      }
    }
    return p;
  }

  // Rows [row0, row0 + rows) of a packed [T, H, X] tensor into batch b of a padded [B, H, L, X].
  static void copy_rows(const HostTensor& packed, std::int64_t row0, std::int64_t rows,
                        HostTensor& dense, std::int64_t b) {
    for_each_row_element(packed, row0, rows, dense, b,
                         [&](std::int64_t p, std::int64_t d) { dense.set(d, packed.get(p)); });
  }
  // The inverse: batch b's first `rows` rows of a padded tensor into packed rows from row0.
  static void gather_rows(const HostTensor& dense, std::int64_t b, std::int64_t rows,
                          HostTensor& packed, std::int64_t row0) {
    for_each_row_element(packed, row0, rows, dense, b,
                         [&](std::int64_t p, std::int64_t d) { packed.set(p, dense.get(d)); });
  }
  // f(packed index, padded index) for every element of those rows.
  template <typename F>
  static void for_each_row_element(const HostTensor& packed, std::int64_t row0, std::int64_t rows,
                                   const HostTensor& dense, std::int64_t b, F&& f) {
    const std::int64_t H = packed.view.shape[1], X = packed.view.shape[2];
    const std::int64_t L = dense.view.shape[2];
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t x = 0; x < X; ++x)
          f(((row0 + r) * H + h) * X + x, ((b * H + h) * L + r) * X + x);
  }
};

}  // namespace memeff::test
