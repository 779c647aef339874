// The reference backend: the naive definition of attention, every feature, accumulated in double.
// It is the oracle the other backends are tested against, and is itself checked against finite
// differences (ReferenceGradcheck in tests/unit/reference_test.cpp). Clarity is the goal; for
// speed, only what leaves every bit as the plain loops give it: each head's operands converted to
// double once, and four dot products at a time (row_dots), each summed in the same order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/builtin_backends.h"
#include "core/numeric.h"
#include "core/packed.h"
#include "core/score_modifiers.h"
#include "memeff/backend.h"
#include "memeff/dropout.h"

namespace memeff::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kPosInf = std::numeric_limits<double>::infinity();

// Index of the bias element that (b, h, i, j) reads, in the bias view's own coordinates.
std::int64_t bias_offset(const TensorView& bias, std::int64_t b, std::int64_t h, std::int64_t i,
                         std::int64_t j) {
  return bias.offset(bias.shape[0] == 1 ? 0 : b, bias.shape[1] == 1 ? 0 : h,
                     bias.shape[2] == 1 ? 0 : i, j);
}

// Rows [0, rows) of head (b, h) of a 4-D view as doubles, row-major [rows, cols]: the operands
// the loops below read many times, converted once (the same values load_as_double gives).
std::vector<double> head_as_double(const TensorView& t, std::int64_t b, std::int64_t h,
                                   std::int64_t rows, std::int64_t cols) {
  std::vector<double> m(static_cast<std::size_t>(rows * cols));
  if (cols == 0) return m;  // a huge Lk of keys with no elements costs nothing
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c)
      m[r * cols + c] = load_as_double(t, t.offset(b, h, r, c));
  }
  return m;
}
// Row i of head (b, h), cols elements, as doubles.
void row_as_double(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t i,
                   std::int64_t cols, std::vector<double>& row) {
  row.resize(static_cast<std::size_t>(cols));
  for (std::int64_t c = 0; c < cols; ++c) row[c] = load_as_double(t, t.offset(b, h, i, c));
}

// out[r] = Σ_e x[e]·m[r·len + e] for rows [begin, end) of m, each sum in order of e, as a plain
// loop adds it; four rows at a time, so the four chains of additions overlap (a single chain
// waits on each addition's latency). The same bits as one row after the other.
void row_dots(const double* x, const double* m, std::int64_t len, std::int64_t begin,
              std::int64_t end, double* out) {
  std::int64_t r = begin;
  for (; r + 4 <= end; r += 4) {
    const double *m0 = m + r * len, *m1 = m0 + len, *m2 = m1 + len, *m3 = m2 + len;
    double d0 = 0.0, d1 = 0.0, d2 = 0.0, d3 = 0.0;
    for (std::int64_t e = 0; e < len; ++e) {
      d0 += x[e] * m0[e];
      d1 += x[e] * m1[e];
      d2 += x[e] * m2[e];
      d3 += x[e] * m3[e];
    }
    out[r] = d0;
    out[r + 1] = d1;
    out[r + 2] = d2;
    out[r + 3] = d3;
  }
  for (; r < end; ++r) {
    double d = 0.0;
    for (std::int64_t e = 0; e < len; ++e) d += x[e] * m[r * len + e];
    out[r] = d;
  }
}

// One query row's softmax probabilities (normalized) and dropout multipliers.
struct Row {
  std::vector<double> p;         // softmax over visible keys; 0 where masked
  std::vector<double> cap_grad;  // d(capped score)/d(scaled score): 1 - tanh² with softcap, else 1
  std::vector<double> z;         // keep_scale or 0 (1 everywhere without dropout)
  std::vector<char> visible;     // the key is in the row's softmax (not masked, score not -inf)
  double lse = kNegInf;          // -inf when no key is visible; NaN when a score is NaN or +inf
  bool empty = true;
};

class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }
  DeviceType device_type() const override { return DeviceType::cpu; }
  std::vector<std::string> reasons_unsupported(const Problem&, Pass) const override { return {}; }
  bool supports_global_coordinates() const override { return true; }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    if (pb.packed) return forward_per_sequence(*this, pb, args, out, lse, options);
    // Tasks of up to kRowsPerTask rows of one query head, each with its kv head's K and V as
    // doubles; every row is computed alone, so the result does not depend on the threads.
    constexpr std::int64_t kRowsPerTask = 32;
    const std::int64_t chunks = (pb.Lq + kRowsPerTask - 1) / kRowsPerTask;
    const std::int64_t tasks = pb.B * pb.Hq * chunks;
#pragma omp parallel for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / (pb.Hq * chunks), h = (task / chunks) % pb.Hq;
      const std::int64_t kvh = h / pb.group_size();
      const std::vector<double> k_head = head_as_double(args.k, b, kvh, pb.Lk, pb.D);
      const std::vector<double> v_head = head_as_double(args.v, b, kvh, pb.Lk, pb.Dv);
      std::vector<double> q_row, acc(static_cast<std::size_t>(pb.Dv));
      const std::int64_t i0 = task % chunks * kRowsPerTask;
      for (std::int64_t i = i0; i < std::min(i0 + kRowsPerTask, pb.Lq); ++i) {
        row_as_double(args.q, b, h, i, pb.D, q_row);
        const Row row = compute_row(pb, args, b, h, i, q_row, k_head);
        static_cast<float*>(lse.data)[lse.offset(b, h, i)] = static_cast<float>(row.lse);
        // Every key the row sees counts, kept or dropped: 0·NaN is NaN (docs/api.md).
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::int64_t j = 0; j < pb.Lk; ++j) {
          if (!row.visible[j]) continue;
          const double* v_row = v_head.data() + j * pb.Dv;
          for (std::int64_t e = 0; e < pb.Dv; ++e) acc[e] += row.p[j] * row.z[j] * v_row[e];
        }
        for (std::int64_t e = 0; e < pb.Dv; ++e)
          store_from_double(out, out.offset(b, h, i, e), acc[e]);
      }
    }
  }

  void backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g,
                const Options& options) override {
    if (pb.packed) return backward_per_sequence(*this, pb, args, g, options);
    const TensorView &q = args.q, &k = args.k, &v = args.v;
    // Gradients of k, v and bias collect contributions from many rows: accumulate in double.
    std::vector<double> dk(static_cast<std::size_t>(pb.B * pb.Hkv * pb.Lk * pb.D), 0.0);
    std::vector<double> dv(static_cast<std::size_t>(pb.B * pb.Hkv * pb.Lk * pb.Dv), 0.0);
    const TensorView* dbias_view = g.dbias ? &*g.dbias : nullptr;
    std::vector<double> dbias;
    if (dbias_view) dbias.assign(static_cast<std::size_t>(dbias_view->numel()), 0.0);
    auto kv_index = [&](std::int64_t b, std::int64_t kvh, std::int64_t j, std::int64_t width) {
      return ((b * pb.Hkv + kvh) * pb.Lk + j) * width;
    };
    auto dbias_index = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
      const TensorView& db = *dbias_view;
      const std::int64_t bb = db.shape[0] == 1 ? 0 : b, hh = db.shape[1] == 1 ? 0 : h,
                         ii = db.shape[2] == 1 ? 0 : i;
      return ((bb * db.shape[1] + hh) * db.shape[2] + ii) * db.shape[3] + j;
    };

    // One task per (batch, kv head): it owns that kv head's dk and dv rows and the dq rows of its
    // query heads, and adds their contributions in the order of a serial loop over (b, h, i), so
    // the gradients are the same bits on any number of threads. A dbias that two tasks would add
    // to (broadcast over the batch, or over the heads of different kv heads) keeps one thread.
    // Row scratch only when there are rows: Lq = 0 with a huge Lk allocates nothing.
    const std::int64_t group = pb.group_size();
    const bool dbias_shared = dbias_view && ((dbias_view->shape[0] == 1 && pb.B > 1) ||
                                             (dbias_view->shape[1] == 1 && pb.Hkv > 1));
    const std::int64_t tasks = pb.Lq > 0 && group > 0 ? pb.B * pb.Hkv : 0;
#pragma omp parallel for schedule(dynamic, 1) if (!dbias_shared)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / pb.Hkv, kvh = task % pb.Hkv;
      const std::vector<double> k_head = head_as_double(k, b, kvh, pb.Lk, pb.D);
      const std::vector<double> v_head = head_as_double(v, b, kvh, pb.Lk, pb.Dv);
      std::vector<double> dp(static_cast<std::size_t>(pb.Lk)),
          dq_row(static_cast<std::size_t>(pb.D)), q_row, dout_row;
      for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (std::int64_t i = 0; i < pb.Lq; ++i) {
          // A key block of a larger attention (kv_block) takes P from the whole attention's lse
          // and D_i from its out: this block's keys are only part of the row's softmax.
          const double whole_lse = pb.kv_block ? load_as_double(g.lse, g.lse.offset(b, h, i)) : 0.0;
          row_as_double(q, b, h, i, pb.D, q_row);
          row_as_double(g.dout, b, h, i, pb.Dv, dout_row);
          const Row row =
              compute_row(pb, args, b, h, i, q_row, k_head, pb.kv_block ? &whole_lse : nullptr);
          // dP' = dO·Vᵀ for the row; D_i = Σ_j P_ij Z_ij dP'_ij (= rowsum(dO ∘ O) exactly).
          // Only keys in the row's span can be visible (the others' dp is zeroed below).
          double di = 0.0;
          const KeySpan keys = row_keys(pb, i);
          row_dots(dout_row.data(), v_head.data(), pb.Dv, std::max<std::int64_t>(keys.begin, 0),
                   std::min(keys.end, pb.Lk), dp.data());
          for (std::int64_t j = 0; j < pb.Lk; ++j) {
            if (!row.visible[j]) {
              dp[j] = 0.0;
              continue;
            }
            di += row.p[j] * row.z[j] * dp[j];
          }
          if (pb.kv_block) {
            di = 0.0;
            for (std::int64_t e = 0; e < pb.Dv; ++e) {
              di += dout_row[e] * load_as_double(g.out, g.out.offset(b, h, i, e));
            }
          }
          std::fill(dq_row.begin(), dq_row.end(), 0.0);
          for (std::int64_t j = 0; j < pb.Lk; ++j) {
            if (!row.visible[j]) continue;
            const double pz = row.p[j] * row.z[j];
            double* dv_row = dv.data() + kv_index(b, kvh, j, pb.Dv);
            for (std::int64_t e = 0; e < pb.Dv; ++e) dv_row[e] += pz * dout_row[e];
            // dS = P ∘ (Z ∘ dP' - D_i): the gradient of the score the bias is added to; the
            // scaled product q·k·scale gets it through the cap's derivative.
            const double ds_post = row.p[j] * (row.z[j] * dp[j] - di);
            if (dbias_view) dbias[dbias_index(b, h, i, j)] += ds_post;
            const double ds = ds_post * row.cap_grad[j];
            const double* k_row = k_head.data() + j * pb.D;
            double* dk_row = dk.data() + kv_index(b, kvh, j, pb.D);
            for (std::int64_t e = 0; e < pb.D; ++e) {
              dq_row[e] += pb.scale * ds * k_row[e];
              dk_row[e] += pb.scale * ds * q_row[e];
            }
          }
          for (std::int64_t e = 0; e < pb.D; ++e) {
            store_from_double(g.dq, g.dq.offset(b, h, i, e), dq_row[e]);
          }
        }
      }
    }
    // dk and dv have no elements when D = Dv = 0, however large Lk is (a legal 2^33, say).
    const std::int64_t kv_batches = pb.D + pb.Dv > 0 ? pb.B : 0;
    for (std::int64_t b = 0; b < kv_batches; ++b) {
      for (std::int64_t kvh = 0; kvh < pb.Hkv; ++kvh) {
        for (std::int64_t j = 0; j < pb.Lk; ++j) {
          for (std::int64_t e = 0; e < pb.D; ++e) {
            store_from_double(g.dk, g.dk.offset(b, kvh, j, e), dk[kv_index(b, kvh, j, pb.D) + e]);
          }
          for (std::int64_t e = 0; e < pb.Dv; ++e) {
            store_from_double(g.dv, g.dv.offset(b, kvh, j, e), dv[kv_index(b, kvh, j, pb.Dv) + e]);
          }
        }
      }
    }
    if (dbias_view) {
      const TensorView& db = *dbias_view;
      for (std::int64_t b = 0; b < db.shape[0]; ++b)
        for (std::int64_t h = 0; h < db.shape[1]; ++h)
          for (std::int64_t i = 0; i < db.shape[2]; ++i)
            for (std::int64_t j = 0; j < db.shape[3]; ++j)
              store_from_double(db, db.offset(b, h, i, j), dbias[dbias_index(b, h, i, j)]);
    }
  }

 private:
  // Row i of (b, h). With `whole_lse` (a kv_block backward) P is exp(s - *whole_lse), the
  // probabilities of the whole attention restricted to this block's keys, not renormalized.
  // q_row: the row's query (D doubles); k_head: its kv head's keys as head_as_double gives them.
  static Row compute_row(const Problem& pb, const AttentionArgs& args, std::int64_t b,
                         std::int64_t h, std::int64_t i, const std::vector<double>& q_row,
                         const std::vector<double>& k_head, const double* whole_lse = nullptr) {
    Row row;
    row.p.assign(static_cast<std::size_t>(pb.Lk), 0.0);
    row.z.assign(static_cast<std::size_t>(pb.Lk), 1.0);
    row.visible.assign(static_cast<std::size_t>(pb.Lk), 0);
    row.cap_grad.assign(static_cast<std::size_t>(pb.Lk), 1.0);
    std::vector<double> s(static_cast<std::size_t>(pb.Lk), kNegInf);
    // The maximum of the visible scores; NaN when one is NaN or +inf (then so is every P).
    double m = kNegInf;
    bool any = false;
    const KeySpan keys = row_keys(pb, i);  // causal mask and window
    const double slope = alibi_slope(pb, args, b, h);
    std::vector<double> dot(static_cast<std::size_t>(pb.Lk));  // q·k of the keys in the span
    row_dots(q_row.data(), k_head.data(), pb.D, std::max<std::int64_t>(keys.begin, 0),
             std::min(keys.end, pb.Lk), dot.data());
    for (std::int64_t j = 0; j < pb.Lk; ++j) {
      if (j < keys.begin || j >= keys.end) continue;
      // A -inf bias removes the key whatever its score holds (docs/api.md): a NaN or Inf there
      // does not reach the row.
      const double bias =
          args.bias ? load_as_double(*args.bias, bias_offset(*args.bias, b, h, i, j)) : 0.0;
      if (bias == kNegInf) continue;
      double score = pb.scale * dot[j];
      if (pb.has_softcap()) {  // Gemma-2's order: cap the scaled product, then add the rest
        const double t = std::tanh(score / pb.softcap);
        score = pb.softcap * t;
        row.cap_grad[j] = 1.0 - t * t;
      }
      if (pb.has_alibi) {
        score -= static_cast<double>(slope) * static_cast<double>(alibi_distance(pb, i, j));
      }
      s[j] = score + bias;
      if (s[j] == kNegInf) continue;  // weight 0, as a masked key
      row.visible[static_cast<std::size_t>(j)] = 1;
      any = true;
      if (std::isnan(s[j]) || s[j] == kPosInf) m = std::numeric_limits<double>::quiet_NaN();
      if (!std::isnan(m)) m = std::max(m, s[j]);
    }
    if (!any) return row;  // no visible key: p = 0, lse = -inf
    if (whole_lse) {
      if (*whole_lse == kNegInf) return row;  // the row sees no key anywhere: p = 0
      for (std::int64_t j = 0; j < pb.Lk; ++j) {
        row.p[j] = row.visible[j] ? std::exp(s[j] - *whole_lse) : 0.0;
      }
      row.lse = *whole_lse;
    } else {
      double sum = 0.0;
      for (std::int64_t j = 0; j < pb.Lk; ++j) {
        row.p[j] = row.visible[j] ? std::exp(s[j] - m) : 0.0;
        sum += row.p[j];
      }
      for (double& pj : row.p) pj /= sum;
      row.lse = m + std::log(sum);
    }
    row.empty = false;
    if (pb.has_dropout() && pb.Lk > 0) {
      MaskWindow w;  // at the global coordinates of the row and the keys
      w.heads = pb.Hq;
      w.batch_begin = pb.rng_batch0 + b;
      w.head_begin = h;
      w.row_begin = pb.q_start + i;
      w.rows = 1;
      w.col_begin = pb.k_start;
      w.cols = pb.Lk;
      std::vector<std::uint8_t> keep(static_cast<std::size_t>(pb.Lk));
      dropout_mask(args.rng.seed, args.rng.offset, pb.dropout_p, w, keep.data());
      for (std::int64_t j = 0; j < pb.Lk; ++j) row.z[j] = keep[j] ? pb.dropout.keep_scale : 0.0;
    }
    return row;
  }
};

}  // namespace

std::shared_ptr<Backend> make_reference_backend() { return std::make_shared<ReferenceBackend>(); }

}  // namespace memeff::detail
