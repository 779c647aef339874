// The checks of a soak call (soak_check.h).
#include "soak_check.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "common/tolerance.h"
#include "memeff/attention.h"

namespace memeff::soak {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// f(index, flat) for every index of `dims` in row-major order.
template <class F>
void for_each_index(const std::vector<std::int64_t>& dims, F&& f) {
  std::int64_t total = 1;
  for (std::int64_t d : dims) total *= d;
  std::array<std::int64_t, 4> idx{};
  for (std::int64_t flat = 0; flat < total; ++flat) {
    f(idx, flat);
    for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < dims[static_cast<std::size_t>(d)]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
}

double element(const TensorView& v, const std::array<std::int64_t, 4>& idx) {
  return load_element(v.data, v.dtype, v.offset(idx[0], idx[1], idx[2], idx[3]));
}

std::string index_text(const std::array<std::int64_t, 4>& idx, int rank) {
  std::string s = "[";
  for (int d = 0; d < rank; ++d)
    s += (d ? ", " : "") + std::to_string(idx[static_cast<std::size_t>(d)]);
  return s + "]";
}

// A contiguous host tensor of `dims`.
HostCopy host_tensor(DType dtype, const std::vector<std::int64_t>& dims) {
  HostCopy h;
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;
  h.bytes.assign(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(dtype), 0);
  h.view = view_of(h.bytes.data(), dtype, Device::cpu(), dims);
  return h;
}

// The leading box `dims` of `v` as contiguous fp64 (exact for every input dtype).
HostCopy box_f64(const TensorView& v, const std::vector<std::int64_t>& dims) {
  HostCopy h = host_tensor(DType::f64, dims);
  auto* out = static_cast<double*>(h.view.data);
  for_each_index(dims, [&](const auto& idx, std::int64_t flat) { out[flat] = element(v, idx); });
  return h;
}

// The box of `actual` that `expected` (contiguous) holds, compared with max |a - e| <= bound.
Comparison compare_box(const char* name, const TensorView& actual, const TensorView& expected) {
  Comparison c;
  c.name = name;
  double worst = -1.0;
  for_each_index(shape_of(expected), [&](const auto& idx, std::int64_t flat) {
    const double a = element(actual, idx);
    const double e = load_element(expected.data, expected.dtype, flat);
    if (std::isfinite(e)) c.max_ref = std::max(c.max_ref, std::abs(e));
    if (std::isnan(a) || std::isnan(e) || ((std::isinf(a) || std::isinf(e)) && a != e)) {
      if (!c.nonfinite) c.where = index_text(idx, expected.rank);
      c.nonfinite = true;
      return;
    }
    if (std::isinf(a)) return;  // the same infinity on both sides (-inf lse of an empty row)
    const double diff = std::abs(a - e);
    if (diff > worst && !c.nonfinite) {
      worst = diff;
      c.where = index_text(idx, expected.rank);
    }
    c.max_abs = std::max(c.max_abs, diff);
  });
  return c;
}

double max_abs_of(const HostCopy& h) {
  double m = 0.0;
  for_each_index(shape_of(h.view), [&](const auto& idx, std::int64_t) {
    m = std::max(m, std::abs(element(h.view, idx)));
  });
  return m;
}

// The bias's box: its broadcast dimensions stay 1.
std::vector<std::int64_t> bias_box(const CallSpec& s, std::int64_t nb, std::int64_t nh,
                                   std::int64_t rows, std::int64_t keys) {
  const std::int64_t want[4] = {nb, nh, rows, keys};
  std::vector<std::int64_t> box = s.bias_shape();
  for (std::size_t d = 0; d < 4; ++d) {
    if (box[d] != 1 || d == 3) box[d] = want[d];
  }
  return box;
}

double factor(const CallSpec& s) { return s.backward ? 3.0 : 1.0; }

}  // namespace

HostCopy host_copy(const Output& output) {
  HostCopy h;
  if (!output.view.defined()) return h;
  h.bytes.resize(output.buffer.bytes());
  output.buffer.download(h.bytes.data(), h.bytes.size());
  h.view = output.view;
  h.view.data = h.bytes.data();
  h.view.device = Device::cpu();
  return h;
}

CallOutputs::CallOutputs(const CallTensors& t)
    : out(host_copy(t.out)),
      lse(host_copy(t.lse)),
      dq(host_copy(t.dq)),
      dk(host_copy(t.dk)),
      dv(host_copy(t.dv)),
      dbias(host_copy(t.dbias)) {}

std::string first_nonfinite(const CallOutputs& o) {
  const std::pair<const char*, const HostCopy*> all[] = {{"out", &o.out}, {"lse", &o.lse},
                                                         {"dq", &o.dq},   {"dk", &o.dk},
                                                         {"dv", &o.dv},   {"dbias", &o.dbias}};
  for (const auto& [name, copy] : all) {
    const TensorView& v = copy->view;
    if (!v.defined()) continue;
    const bool lse = copy == &o.lse;
    // Every byte of an output's buffer is an element of its view (contiguous or blhd), so the
    // scan reads the buffer straight through, testing the exponent bits.
    const std::int64_t n = v.numel();
    std::int64_t bad = -1;
    for (std::int64_t e = 0; e < n && bad < 0; ++e) {
      const unsigned char* p =
          copy->bytes.data() + e * static_cast<std::int64_t>(dtype_size(v.dtype));
      std::uint32_t bits = 0;
      switch (v.dtype) {
        case DType::f32:
          std::memcpy(&bits, p, 4);
          if ((bits & 0x7F800000u) == 0x7F800000u && !(lse && bits == 0xFF800000u)) bad = e;
          break;
        case DType::f16:
          std::memcpy(&bits, p, 2);
          if ((bits & 0x7C00u) == 0x7C00u) bad = e;
          break;
        case DType::bf16:
          std::memcpy(&bits, p, 2);
          if ((bits & 0x7F80u) == 0x7F80u) bad = e;
          break;
        default:
          if (!std::isfinite(load_element(copy->bytes.data(), v.dtype, e))) bad = e;
      }
    }
    if (bad < 0) continue;
    const double x = load_element(copy->bytes.data(), v.dtype, bad);
    std::string where;
    for_each_index(shape_of(v), [&](const auto& idx, std::int64_t) {
      if (where.empty() && v.offset(idx[0], idx[1], idx[2], idx[3]) == bad) {
        where = index_text(idx, v.rank);
      }
    });
    return std::string(name) + ": " +
           (std::isnan(x) ? "NaN"
            : x > 0       ? "+inf"
                          : "-inf") +
           " at " + where;
  }
  return "";
}

std::string CheckPlan::describe(const CallSpec& s) const {
  std::ostringstream os;
  if (whole) return "the whole call";
  if (s.packed) {
    os << "the first " << sequences << " of " << s.B << " sequences";
  } else if (kv_gradients) {
    os << "batch 0, query heads 0.." << heads - 1 << " of " << s.B << "x" << s.Hq;
  } else {
    os << "batch 0, query heads 0.." << heads - 1 << ", query rows 0.." << rows - 1
       << " (out, lse, dq)";
  }
  if (kv_gradients && !dbias && s.has_bias() && s.backward)
    os << ", dbias not checked (it sums outside)";
  return os.str();
}

std::optional<CheckPlan> plan_check(const CallSpec& s, double max_work) {
  CheckPlan p;
  const double width = static_cast<double>(s.D + s.Dv) * factor(s);
  if (s.packed) {
    for (; p.sequences < s.B; ++p.sequences) {
      const auto i = static_cast<std::size_t>(p.sequences);
      const double w = static_cast<double>(s.seqlens_q[i]) * static_cast<double>(s.seqlens_k[i]) *
                       static_cast<double>(s.Hq) * width;
      if (p.work + w > max_work) break;
      p.work += w;
    }
    if (p.sequences == 0) return std::nullopt;
    p.whole = p.sequences == s.B;
    return p;
  }
  const double per_head = static_cast<double>(s.Lq) * static_cast<double>(s.Lk) * width;
  const std::int64_t group = s.group();
  p.batches = s.B;
  p.heads = s.Hq;
  p.rows = s.Lq;
  p.keys = s.Lk;
  p.work = per_head * static_cast<double>(s.B * s.Hq);
  if (p.work <= max_work) return p;
  p.whole = false;
  p.batches = 1;
  p.heads =
      std::min<std::int64_t>(s.Hq, static_cast<std::int64_t>(max_work / per_head) / group * group);
  p.dbias = !(s.bias[0] == '1' && s.B > 1) && !(s.bias[1] == '1' && p.heads < s.Hq);
  if (p.heads >= group) {
    p.work = per_head * static_cast<double>(p.heads);
    return p;
  }
  // One group is too much: its first rows, with the keys they can see.
  p.heads = group;
  p.kv_gradients = false;
  p.dbias = false;
  const double per_row = static_cast<double>(group) * static_cast<double>(s.Lk) * width;
  p.rows = std::min<std::int64_t>(s.Lq, static_cast<std::int64_t>(max_work / per_row));
  if (p.rows < 1) return std::nullopt;
  if (s.causal == CausalMode::top_left) p.keys = std::min(s.Lk, p.rows);
  if (s.causal == CausalMode::bottom_right) {
    p.keys = std::clamp<std::int64_t>(s.Lk - s.Lq + p.rows, 0, s.Lk);
  }
  p.work = static_cast<double>(group * p.rows * p.keys) * width;
  return p;
}

double Comparison::ratio() const {
  if (nonfinite) return kInf;
  return bound > 0.0 ? max_abs / bound : (max_abs > 0.0 ? kInf : 0.0);
}

std::string Comparison::describe() const {
  std::ostringstream os;
  os << name << ": ";
  if (nonfinite) {
    os << "non-finite mismatch at " << where;
  } else {
    os << "max |diff| " << max_abs << " at " << where << ", bound " << bound << " (max |ref| "
       << max_ref << ")";
  }
  os << (pass() ? " ok" : " FAIL");
  return os.str();
}

std::vector<Comparison> check_against_reference(const CallSpec& s, const CallTensors& t,
                                                const CallOutputs& o, const CheckPlan& p) {
  // The boxes of q, k, v, out (and dout), lse and bias.
  std::vector<std::int64_t> q_box, k_box, v_box, o_box, lse_box, b_box;
  std::vector<std::int32_t> cu_q, cu_k;
  if (s.packed) {
    const auto n = static_cast<std::size_t>(p.sequences);
    const std::int64_t tq = t.cu_q_host[n], tk = t.cu_k_host[n];
    q_box = {tq, s.Hq, s.D};
    k_box = {tk, s.Hkv, s.D};
    v_box = {tk, s.Hkv, s.Dv};
    o_box = {tq, s.Hq, s.Dv};
    lse_box = {s.Hq, tq};
    cu_q.assign(t.cu_q_host.begin(), t.cu_q_host.begin() + static_cast<std::ptrdiff_t>(n) + 1);
    cu_k.assign(t.cu_k_host.begin(), t.cu_k_host.begin() + static_cast<std::ptrdiff_t>(n) + 1);
  } else {
    const std::int64_t kv_heads = p.heads / s.group();
    q_box = {p.batches, p.heads, p.rows, s.D};
    k_box = {p.batches, kv_heads, p.keys, s.D};
    v_box = {p.batches, kv_heads, p.keys, s.Dv};
    o_box = {p.batches, p.heads, p.rows, s.Dv};
    lse_box = {p.batches, p.heads, p.rows};
    if (s.has_bias()) b_box = bias_box(s, p.batches, p.heads, p.rows, p.keys);
  }
  const AttentionArgs& h = t.host_args;
  const HostCopy q = box_f64(h.q, q_box), k = box_f64(h.k, k_box), v = box_f64(h.v, v_box),
                 dout = box_f64(t.host_dout, o_box);
  HostCopy bias;
  if (s.has_bias()) bias = box_f64(*h.bias, b_box);
  AttentionArgs a = h;
  a.q = q.view;
  a.k = k.view;
  a.v = v.view;
  if (s.has_bias()) a.bias = bias.view;
  if (s.packed) {
    const std::vector<std::int64_t> n{static_cast<std::int64_t>(cu_q.size())};
    PackedSequences ps = *h.packed;
    ps.cu_seqlens_q.data = cu_q.data();
    ps.cu_seqlens_k.data = cu_k.data();
    ps.cu_seqlens_q.shape[0] = ps.cu_seqlens_k.shape[0] = n[0];
    ps.max_seqlen_q = ps.max_seqlen_k = 0;
    for (std::size_t i = 0; i + 1 < cu_q.size(); ++i) {
      ps.max_seqlen_q = std::max<std::int64_t>(ps.max_seqlen_q, cu_q[i + 1] - cu_q[i]);
      ps.max_seqlen_k = std::max<std::int64_t>(ps.max_seqlen_k, cu_k[i + 1] - cu_k[i]);
    }
    a.packed = ps;
  }
  HostCopy out = host_tensor(DType::f64, o_box), lse = host_tensor(DType::f32, lse_box);
  Options reference;
  reference.backends = {"reference"};
  forward(a, out.view, lse.view, reference);

  // The tolerances of the tests: the fused CUDA kernels' bar (tests/cuda/near_reference.h),
  // the cpu backend's per-dtype budgets with the reduction lengths (tests/unit/cpu_backend_test).
  const bool fused = s.device.type == DeviceType::cuda;
  const DType dt = s.dtype;
  const std::int64_t reduction = std::max(s.D, s.Lk);
  std::vector<Comparison> results;
  auto add = [&](const char* name, const HostCopy& actual, const HostCopy& expected,
                 const test::Tolerance& tol) {
    Comparison c = compare_box(name, actual.view, expected.view);
    c.bound = tol.bound(c.max_ref);
    results.push_back(c);
    return c;
  };
  const Comparison out_cmp =
      add("out", o.out, out,
          fused ? test::fused_kernel_tolerance(dt) : test::forward_tolerance(dt, reduction));
  const Comparison lse_cmp =
      add("lse", o.lse, lse,
          fused ? test::Tolerance{0.0, 0.0} : test::forward_tolerance(DType::f32, reduction));
  if (fused) {  // lse within 1e-3 · max(1, max |ref|) (expect_lse_near_reference)
    results.back().bound = 1e-3 * std::max(1.0, lse_cmp.max_ref);
  }
  if (!s.backward) return results;

  HostCopy dq = host_tensor(DType::f64, q_box), dk = host_tensor(DType::f64, k_box),
           dv = host_tensor(DType::f64, v_box), dbias;
  BackwardTensors g{dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
  if (s.has_bias()) {
    dbias = host_tensor(DType::f64, b_box);
    g.dbias = dbias.view;
  }
  backward(a, g, reference);

  // The tests run both backwards from the same out and lse; here the backend's backward read
  // its own forward's, so its D_i = rowsum(dO ∘ O) is off by dD_i = Σ_e dO_ie (O_ie - O_ref,ie)
  // (the rounding of the stored out included), computed here row by row, plus the error of its
  // sum: fp32 for the fused kernels, and for the cpu backend the 4u·Σ|dO ∘ O| that
  // cpu_backend_test allows. P·dD_i reaches dq through scale·k, dk through scale·q summed over a
  // key's rows (random signs: sqrt of their count, as cpu_backend_test widens) and dbias
  // through its sums.
  const double sum_error = 4.0 * (fused ? 0x1p-24 : test::unit_roundoff(dt));
  const auto* dout_v = static_cast<const double*>(dout.view.data);
  const auto* out_v = static_cast<const double*>(out.view.data);
  double d_err = 0.0, row_diff = 0.0, row_abs = 0.0;
  for_each_index(o_box, [&](const auto& idx, std::int64_t flat) {
    const double d = dout_v[flat], ref = out_v[flat];
    row_diff += d * (element(o.out.view, idx) - ref);
    row_abs += std::abs(d * ref);
    if ((flat + 1) % s.Dv == 0) {
      d_err = std::max(d_err, std::abs(row_diff) + sum_error * row_abs);
      row_diff = row_abs = 0.0;
    }
  });
  if (!std::isfinite(d_err)) d_err = 0.0;  // out is non-finite: the call fails already
  const double scale = s.scale.value_or(1.0 / std::sqrt(static_cast<double>(s.D)));
  const double column_rows = static_cast<double>(s.Lq * s.group());
  const double bias_sums = static_cast<double>(
      (s.bias[0] == '1' ? s.B : 1) * (s.bias[1] == '1' ? s.Hq : 1) * (s.bias[2] == '1' ? s.Lq : 1));
  test::Tolerance base =
      fused ? test::fused_kernel_tolerance(dt)
            : test::backward_tolerance(dt, std::max({s.D, s.Dv, s.Lk, s.Lq * s.group()}));
  base.rtol += lse_cmp.max_abs;  // P = exp(S - lse): a relative error of the lse's size
  const double cpu_extra = fused ? 0.0 : 64.0 * test::unit_roundoff(dt);  // as packed_test
  auto widened = [&](double extra) { return test::Tolerance{base.atol + extra, base.rtol}; };
  add("dq", o.dq, dq, widened(cpu_extra + scale * d_err * max_abs_of(k)));
  if (p.kv_gradients) {
    add("dk", o.dk, dk,
        widened(cpu_extra + scale * d_err * max_abs_of(q) * std::sqrt(column_rows)));
    add("dv", o.dv, dv, base);
  }
  if (s.has_bias() && p.dbias) add("dbias", o.dbias, dbias, widened(d_err * std::sqrt(bias_sums)));
  return results;
}

}  // namespace memeff::soak
