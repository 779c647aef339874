// The reference backend: the naive definition of attention, every feature, accumulated in double.
// It is the oracle the other backends are tested against, and is itself checked against finite
// differences (ReferenceGradcheck in tests/unit/reference_test.cpp). Speed is not a goal;
// clarity is.
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

// One query row's softmax probabilities (normalized) and dropout multipliers.
struct Row {
  std::vector<double> p;        // softmax over visible keys; 0 where masked
  std::vector<double> cap_grad;  // d(capped score)/d(scaled score): 1 - tanh² with softcap, else 1
  std::vector<double> z;        // keep_scale or 0 (1 everywhere without dropout)
  std::vector<char> visible;    // the key is in the row's softmax (not masked, score not -inf)
  double lse = kNegInf;         // -inf when no key is visible; NaN when a score is NaN or +inf
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
    const std::int64_t rows = pb.B * pb.Hq * pb.Lq;
#pragma omp parallel for schedule(dynamic, 16)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t b = r / (pb.Hq * pb.Lq), h = (r / pb.Lq) % pb.Hq, i = r % pb.Lq;
      const Row row = compute_row(pb, args, b, h, i);
      static_cast<float*>(lse.data)[lse.offset(b, h, i)] = static_cast<float>(row.lse);
      const std::int64_t kvh = h / pb.group_size();
      for (std::int64_t e = 0; e < pb.Dv; ++e) {
        double acc = 0.0;
        // Every key the row sees counts, kept or dropped: 0·NaN is NaN (docs/api.md).
        for (std::int64_t j = 0; j < pb.Lk; ++j) {
          if (!row.visible[j]) continue;
          acc += row.p[j] * row.z[j] * load_as_double(args.v, args.v.offset(b, kvh, j, e));
        }
        store_from_double(out, out.offset(b, h, i, e), acc);
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
      std::vector<double> dp(static_cast<std::size_t>(pb.Lk)),
          dq_row(static_cast<std::size_t>(pb.D));
      for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (std::int64_t i = 0; i < pb.Lq; ++i) {
          // A key block of a larger attention (kv_block) takes P from the whole attention's lse
          // and D_i from its out: this block's keys are only part of the row's softmax.
          const double whole_lse = pb.kv_block ? load_as_double(g.lse, g.lse.offset(b, h, i)) : 0.0;
          const Row row = compute_row(pb, args, b, h, i, pb.kv_block ? &whole_lse : nullptr);
          // dP' = dO·Vᵀ for the row; D_i = Σ_j P_ij Z_ij dP'_ij (= rowsum(dO ∘ O) exactly).
          double di = 0.0;
          for (std::int64_t j = 0; j < pb.Lk; ++j) {
            dp[j] = 0.0;
            if (!row.visible[j]) continue;
            double acc = 0.0;
            for (std::int64_t e = 0; e < pb.Dv; ++e) {
              acc += load_as_double(g.dout, g.dout.offset(b, h, i, e)) *
                     load_as_double(v, v.offset(b, kvh, j, e));
            }
            dp[j] = acc;
            di += row.p[j] * row.z[j] * acc;
          }
          if (pb.kv_block) {
            di = 0.0;
            for (std::int64_t e = 0; e < pb.Dv; ++e) {
              di += load_as_double(g.dout, g.dout.offset(b, h, i, e)) *
                    load_as_double(g.out, g.out.offset(b, h, i, e));
            }
          }
          std::fill(dq_row.begin(), dq_row.end(), 0.0);
          for (std::int64_t j = 0; j < pb.Lk; ++j) {
            if (!row.visible[j]) continue;
            const double pz = row.p[j] * row.z[j];
            for (std::int64_t e = 0; e < pb.Dv; ++e) {
              dv[kv_index(b, kvh, j, pb.Dv) + e] +=
                  pz * load_as_double(g.dout, g.dout.offset(b, h, i, e));
            }
            // dS = P ∘ (Z ∘ dP' - D_i): the gradient of the score the bias is added to; the
            // scaled product q·k·scale gets it through the cap's derivative.
            const double ds_post = row.p[j] * (row.z[j] * dp[j] - di);
            if (dbias_view) dbias[dbias_index(b, h, i, j)] += ds_post;
            const double ds = ds_post * row.cap_grad[j];
            for (std::int64_t e = 0; e < pb.D; ++e) {
              dq_row[e] += pb.scale * ds * load_as_double(k, k.offset(b, kvh, j, e));
              dk[kv_index(b, kvh, j, pb.D) + e] +=
                  pb.scale * ds * load_as_double(q, q.offset(b, h, i, e));
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
  static Row compute_row(const Problem& pb, const AttentionArgs& args, std::int64_t b,
                         std::int64_t h, std::int64_t i, const double* whole_lse = nullptr) {
    const TensorView &q = args.q, &k = args.k;
    const std::int64_t kvh = h / pb.group_size();
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
    for (std::int64_t j = 0; j < pb.Lk; ++j) {
      if (j < keys.begin || j >= keys.end) continue;
      // A -inf bias removes the key whatever its score holds (docs/api.md): a NaN or Inf there
      // does not reach the row.
      const double bias =
          args.bias ? load_as_double(*args.bias, bias_offset(*args.bias, b, h, i, j)) : 0.0;
      if (bias == kNegInf) continue;
      double dot = 0.0;
      for (std::int64_t e = 0; e < pb.D; ++e) {
        dot += load_as_double(q, q.offset(b, h, i, e)) * load_as_double(k, k.offset(b, kvh, j, e));
      }
      double score = pb.scale * dot;
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
