// `memeff run`: the main job. Builds random inputs, runs forward and backward on the best
// available backend (or the one named), times them, and checks every output against the fp64
// reference with the same dropout mask, whole or on an exact sub-problem (see check_plan()).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_context_parallel.h"
#include "cli_json.h"
#include "cli_problem.h"
#include "cli_tolerance.h"
#include "memeff/attention.h"
#include "memeff/context_parallel.h"
#include "memeff/dropout.h"
#include "memeff/error.h"

namespace memeff::cli {

namespace {

// Reference work (Lq·Lk·(D+Dv) per head, summed) the check runs in full: the default problem,
// about 5 s of the double-precision reference on two cores.
constexpr double kFullCheckBudget = 2.0 * 8 * 512 * 512 * 128;

struct RunConfig {
  ShapeConfig shape;
  DeviceChoice device = DeviceChoice::automatic;
  std::string backend;
  std::int64_t iters = -1;  // default: 10 on cuda, 3 on cpu
  std::int64_t warmup = 1;
  std::string check = "auto";
  bool json = false;
  bool deterministic = false;  // Options::deterministic: the bitwise-repeatable backward
  // Packed sequences (--seqlens, --kv-seqlens): empty for a dense batch.
  std::vector<std::int64_t> seqlens, kv_seqlens;
  // Context parallelism (--context-parallel N and its --cp-* flags): 0 ranks for a plain run.
  ContextParallelRun cp;
  int context_parallel = 0;
};

// Which part of the problem the reference recomputes. The dropout mask of head h of batch b is
// keyed by b·Hq + h and row i, column j are absolute, so a view of batch 0 and query heads
// [0, heads) (with their key/value heads [0, heads / group)) is a problem of its own whose mask,
// outputs and gradients are exactly those of the same elements of the full problem. dbias is
// exact too unless it sums over a batch or head left out (bias broadcast over B or H).
// When even one head group is too much work, only query rows [0, rows) are recomputed: a row's
// out, lse and dq depend on no other row. The keys the reference sees are cut to those the rows
// can see ([0, rows) top_left; [0, Lk - Lq + rows) bottom_right, which keeps the diagonal where
// it is), so the sub-problem stays exact; dk, dv and dbias need every row and are not checked.
struct CheckPlan {
  bool enabled = true;
  bool full = true;
  std::int64_t batches = 0, heads = 0, kv_heads = 0, rows = 0, keys = 0;
  bool gradients = true;  // dk, dv, dbias checked (false: rows only)
  bool dbias_needs_rerun = false;
  std::string describe(const ShapeConfig& c) const {
    std::ostringstream os;
    if (!enabled) return "skipped (--check none)";
    if (full) {
      os << "all " << c.B * c.Hq << " heads";
    } else if (gradients) {
      os << "sampled: batch 0, query heads 0.." << heads - 1 << " (" << heads << " of " << c.B * c.Hq
         << " heads; --check full checks all)";
    } else {
      os << "sampled: batch 0, query heads 0.." << heads - 1 << ", query rows 0.." << rows - 1 << " of " << c.Lq
         << ": out, lse, dq (dk, dv, dbias need whole heads: --check " << heads << ")";
    }
    return os.str();
  }
};

CheckPlan check_plan(const RunConfig& rc) {
  const ShapeConfig& c = rc.shape;
  CheckPlan plan;
  plan.enabled = rc.check != "none";
  const double width = static_cast<double>(c.D + c.dv());
  const double per_head = static_cast<double>(c.Lq) * static_cast<double>(c.lk()) * width;
  const double total = per_head * static_cast<double>(c.B * c.Hq);
  const std::int64_t group = c.Hq / c.hkv();
  plan.batches = c.B;
  plan.heads = c.Hq;
  plan.rows = c.Lq;
  plan.keys = c.lk();
  const bool explicit_heads = rc.check != "auto" && rc.check != "full" && rc.check != "none";
  if (explicit_heads || (rc.check == "auto" && total > kFullCheckBudget)) {
    plan.full = false;
    plan.batches = std::min<std::int64_t>(c.B, 1);
    std::int64_t heads = 0;
    if (explicit_heads) {
      heads = (std::stoll(rc.check) + group - 1) / group * group;  // whole groups
    } else {
      heads = per_head > 0 ? static_cast<std::int64_t>(kFullCheckBudget / per_head) / group * group : c.Hq;
    }
    plan.heads = std::clamp<std::int64_t>(heads, group, c.Hq);
    if (!explicit_heads && per_head * static_cast<double>(plan.heads) > kFullCheckBudget) {
      // One head group is already too much: check a prefix of its rows (out, lse, dq).
      const double per_row = static_cast<double>(group) * static_cast<double>(c.lk()) * width;
      plan.rows = std::clamp<std::int64_t>(static_cast<std::int64_t>(kFullCheckBudget / per_row), 1, c.Lq);
      // A window or ALiBi aligned bottom-right (causal none or bottom_right) measures from
      // Lk - Lq, which a row prefix would move: such calls keep whole heads.
      const bool bottom_right_aligned =
          c.causal != CausalMode::top_left && (c.window.bounded() || c.alibi);
      if (bottom_right_aligned) plan.rows = c.Lq;
      if (plan.rows < c.Lq) {
        plan.gradients = false;
        if (c.causal == CausalMode::top_left) plan.keys = std::min(c.lk(), plan.rows);
        if (c.causal == CausalMode::bottom_right) {
          plan.keys = std::clamp<std::int64_t>(c.lk() - c.Lq + plan.rows, 0, c.lk());
        }
      }
    }
    if (plan.batches == c.B && plan.heads == c.Hq && plan.rows == c.Lq) plan.full = true;
  }
  plan.kv_heads = plan.heads / group;
  plan.dbias_needs_rerun = plan.gradients && !plan.full && c.bias.present &&
                           ((c.bias.bcast_b && c.B > plan.batches) || (c.bias.bcast_h && c.Hq > plan.heads));
  return plan;
}

struct CheckResult {
  std::string name;
  Comparison cmp;
  CheckTolerance tol;
  std::vector<std::int64_t> dims;
  std::string note;
  bool pass() const { return !cmp.nonfinite && cmp.max_abs <= tol.bound(cmp.max_ref); }
};

// One output of the backend (`actual`, of which `expected` holds the leading box) against the
// reference, with the tolerance of its dtype.
CheckResult check_output(const char* name, const HostArray& actual, const HostArray& expected,
                         DType dtype, bool gradient, std::string note = "") {
  return {name, compare_box(actual, expected), check_tolerance(dtype, gradient),
          expected.shape.dims, std::move(note)};
}

std::string format_sci(double v, int digits = 2) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*e", digits, v);
  return buf;
}

std::string format_g(double v, int digits = 3) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

// Runs the reference on the planned sub-problem and compares every output of the backend.
std::vector<CheckResult> check_against_reference(const AttentionData& d, const CheckPlan& plan,
                                                 const Options& backend_options) {
  const ShapeConfig& c = d.config;
  const std::int64_t nb = plan.batches, nh = plan.heads, nk = plan.kv_heads, Lq = plan.rows, Lk = plan.keys;
  const std::int64_t D = c.D, Dv = c.dv();
  const std::vector<std::int64_t> q_dims{nb, nh, Lq, D}, k_dims{nb, nk, Lk, D}, v_dims{nb, nk, Lk, Dv},
      o_dims{nb, nh, Lq, Dv}, lse_dims{nb, nh, Lq};
  std::vector<std::int64_t> bias_box = bias_dims(c);
  if (!c.bias.bcast_b) bias_box[0] = nb;
  if (!c.bias.bcast_h) bias_box[1] = nh;
  if (!c.bias.bcast_q) bias_box[2] = Lq;
  bias_box[3] = Lk;

  // The reference reads exact fp64 copies of the inputs the backend read and writes fp64.
  const HostArray q = box_as(d.q_host, DType::f64, q_dims), k = box_as(d.k_host, DType::f64, k_dims),
                  v = box_as(d.v_host, DType::f64, v_dims), dout = box_as(d.dout_host, DType::f64, o_dims);
  HostArray bias, slopes;
  if (c.bias.present) bias = box_as(d.bias_host, DType::f64, bias_box);
  if (c.alibi) slopes = box_as(d.slopes_host, DType::f32, {nh});  // heads 0..nh-1
  HostArray out(DType::f64, Shape{o_dims}), lse(DType::f32, Shape{lse_dims}), dq(DType::f64, Shape{q_dims}),
      dk(DType::f64, Shape{k_dims}), dv(DType::f64, Shape{v_dims}), dbias;
  if (c.bias.present) dbias = HostArray(DType::f64, Shape{bias_box});

  const AttentionArgs args =
      make_args(c, q.view(), k.view(), v.view(), c.bias.present ? bias.view() : TensorView{},
                c.alibi ? slopes.view() : TensorView{});
  Options ref_options;
  ref_options.backends = {"reference"};
  forward(args, out.view(), lse.view(), ref_options);
  backward(args,
           {dout.view(), out.view(), lse.view(), dq.view(), dk.view(), dv.view(),
            c.bias.present ? std::optional(dbias.view()) : std::nullopt},
           ref_options);

  std::vector<CheckResult> results;
  auto add = [&](const char* name, const HostArray& actual, const HostArray& expected,
                 bool gradient, std::string note = "") {
    results.push_back(check_output(name, actual, expected, d.dtype, gradient, std::move(note)));
  };
  add("out", d.out.download(), out, false);
  add("lse", d.lse.download(), lse, false);
  add("dq", d.dq.download(), dq, true);
  if (!plan.gradients) return results;  // row prefix: dk, dv, dbias are partial sums
  add("dk", d.dk.download(), dk, true);
  add("dv", d.dv.download(), dv, true);
  if (c.bias.present && !plan.dbias_needs_rerun) add("dbias", d.dbias.download(), dbias, true);
  if (c.bias.present && plan.dbias_needs_rerun) {
    // The backend's dbias sums over heads the reference did not run: rerun the backend's
    // backward on the same sub-problem (views of the same device data) and compare that.
    AttentionArgs sub = d.args();
    sub.q = d.q.box_view(q_dims);
    sub.k = d.k.box_view(k_dims);
    sub.v = d.v.box_view(v_dims);
    sub.bias = d.bias.box_view(bias_box);
    DeviceTensor sdq(d.device, d.dtype, Shape{q_dims}), sdk(d.device, d.dtype, Shape{k_dims}),
        sdv(d.device, d.dtype, Shape{v_dims}), sdbias(d.device, d.bias.dtype, Shape{bias_box});
    for (DeviceTensor* t : {&sdq, &sdk, &sdv, &sdbias}) t->buffer.fill_bytes(0xFF);
    const BackwardTensors sg{d.dout.box_view(o_dims),
                             d.out.box_view(o_dims),
                             d.lse.box_view(lse_dims),
                             sdq.view(),
                             sdk.view(),
                             sdv.view(),
                             sdbias.view()};
    const Buffer ws(d.device, workspace_size(sub, Pass::backward, backend_options));
    backward(sub, sg, with_workspace(backend_options, ws));
    synchronize(d.device);
    add("dbias", sdbias.download(), dbias, true, "backend rerun on the sampled heads");
  }
  return results;
}

// Both passes timed as `memeff run` times them: each pass gets the workspace it asks for (so
// nothing allocates inside the timed calls), warm-up (whose outputs are the ones checked), then
// `iters` calls per pass into the same buffers. Default iterations: 10 on cuda; on the CPU 3, or
// fewer when one forward+backward takes seconds (the reference backend).
struct TimedPasses {
  CallInfo fwd_info, bwd_info;
  std::int64_t iters = 0;
  PassRates rates;  // of the medians
  std::size_t ws_fwd = 0, ws_bwd = 0;
};

TimedPasses time_passes(const RunConfig& rc, Device device, const AttentionArgs& args,
                        const BackwardTensors& grads, const Options& options,
                        const std::string& what, double forward_flops) {
  TimedPasses t;
  t.ws_fwd = workspace_size(args, Pass::forward, options);
  t.ws_bwd = workspace_size(args, Pass::backward, options);
  const Buffer ws_f(device, t.ws_fwd), ws_b(device, t.ws_bwd);
  const Options fwd_options = with_workspace(options, ws_f),
                bwd_options = with_workspace(options, ws_b);
  if (!rc.json) {
    std::fprintf(stderr, "memeff run: %s on %s, warm-up\n", what.c_str(),
                 device_description(device).c_str());
  }
  Timer timer(device);
  double warmup_ms = 0.0;
  for (std::int64_t i = 0; i < std::max<std::int64_t>(rc.warmup, 1); ++i) {
    timer.start();
    t.fwd_info = forward(args, grads.out, grads.lse, fwd_options);
    t.bwd_info = backward(args, grads, bwd_options);
    warmup_ms = timer.stop();
  }
  synchronize(device);
  t.iters = rc.iters;
  if (t.iters <= 0) {
    t.iters = device.type == DeviceType::cuda
                  ? 10
                  : std::clamp<std::int64_t>(
                        static_cast<std::int64_t>(3000.0 / std::max(warmup_ms, 1.0)), 1, 3);
  }
  if (!rc.json) {
    std::fprintf(stderr, "memeff run: timing %lld iterations per pass\n",
                 static_cast<long long>(t.iters));
  }
  // Timing reruns both passes into the same buffers (deterministic inputs: the values repeat).
  std::vector<double> fwd_ms, bwd_ms;
  for (std::int64_t i = 0; i < t.iters; ++i) {
    timer.start();
    forward(args, grads.out, grads.lse, fwd_options);
    fwd_ms.push_back(timer.stop());
  }
  for (std::int64_t i = 0; i < t.iters; ++i) {
    timer.start();
    backward(args, grads, bwd_options);
    bwd_ms.push_back(timer.stop());
  }
  synchronize(device);
  t.rates = PassRates(forward_flops, median(fwd_ms), median(bwd_ms));
  return t;
}

// The checks as the JSON report gives them: max_abs_err (NaN when non-finite), tolerance and
// max_abs_ref, each an object keyed by output name.
void add_checks_json(Json& j, const std::vector<CheckResult>& checks) {
  Json errors = Json::object(), tolerances = Json::object(), refs = Json::object();
  for (const CheckResult& r : checks) {
    errors[r.name] = r.cmp.nonfinite ? std::nan("") : r.cmp.max_abs;
    tolerances[r.name] = r.tol.bound(r.cmp.max_ref);
    refs[r.name] = r.cmp.max_ref;
  }
  j["max_abs_err"] = errors;
  j["tolerance"] = tolerances;
  j["max_abs_ref"] = refs;
}

void print_checks(const std::vector<CheckResult>& checks) {
  for (const CheckResult& r : checks) {
    std::printf("    %-6s max abs err %-9s  tol %-9s (max |ref| %s)  %s", r.name.c_str(),
                r.cmp.nonfinite ? "non-finite" : format_sci(r.cmp.max_abs).c_str(),
                format_sci(r.tol.bound(r.cmp.max_ref)).c_str(), format_g(r.cmp.max_ref).c_str(),
                r.pass() ? "PASS" : "FAIL");
    if (!r.pass() && r.cmp.worst >= 0) {
      std::printf("  at %s", index_string(r.cmp.worst, r.dims).c_str());
    }
    if (!r.note.empty()) std::printf("  (%s)", r.note.c_str());
    std::printf("\n");
  }
}

// "q [2, 8, 512, 64]"
std::string dims_text(const char* name, const std::vector<std::int64_t>& dims) {
  std::string s = std::string(name) + " [";
  for (std::size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + "]";
}

// What a run reports, dense or packed; report() prints it as text or as one JSON object.
struct RunReport {
  std::string title;  // "run", "run (packed sequences)"
  Device device{};
  std::string device_note;  // why auto did not pick cuda
  DType dtype = DType::f32;
  Json shape;           // the problem's keys of the JSON report
  std::string problem;  // ... and its line of the text report
  std::string tensors;  // the tensors' shapes, for the text report
  TimedPasses timed;
  std::string check;  // what the check covered
  std::vector<CheckResult> checks;
};

// Prints the report; the exit status: 1 when a checked output fails.
int report(const RunConfig& rc, const RunReport& r) {
  const ShapeConfig& c = rc.shape;
  const TimedPasses& t = r.timed;
  bool pass = true;
  for (const CheckResult& k : r.checks) pass = pass && k.pass();
  const std::string where = device_description(r.device);
  if (rc.json) {
    Json j;
    j["backend"] = t.fwd_info.backend;
    j["backend_backward"] = t.bwd_info.backend;
    j["device"] = device_name(r.device);
    j["device_description"] = where;
    j["device_note"] = r.device_note;
    j["dtype"] = dtype_name(r.dtype);
    j.update(r.shape);
    j["p_effective"] = t.fwd_info.p_effective;
    j["seed"] = c.seed;
    j["offset"] = c.offset;
    j["iters"] = t.iters;
    j["deterministic"] = rc.deterministic;
    add_rates_json(j, t.rates, "tflops");
    j["workspace_fwd_bytes"] = static_cast<std::uint64_t>(t.ws_fwd);
    j["workspace_bwd_bytes"] = static_cast<std::uint64_t>(t.ws_bwd);
    j["check"] = r.check;
    add_checks_json(j, r.checks);
    j["pass"] = pass;
    std::printf("%s\n", json_text(j).c_str());
    return pass ? 0 : 1;
  }
  const DropoutThreshold dt = dropout_threshold(c.dropout);
  const PassRates& rates = t.rates;
  std::printf("memeff %s %s\n", version(), r.title.c_str());
  std::printf("  backend    %s (forward), %s (backward)\n", t.fwd_info.backend.c_str(),
              t.bwd_info.backend.c_str());
  std::printf("  device     %s%s\n", where.c_str(),
              r.device_note.empty() ? "" : ("  [" + r.device_note + "]").c_str());
  std::printf("  problem    %s\n", r.problem.c_str());
  std::printf("  shapes     %s\n", r.tensors.c_str());
  std::printf(
      "  dropout    p=%g  p_effective=%.7g (keep when byte < %u, scale %.6g)  seed=%llu "
      "offset=%llu\n",
      c.dropout, t.fwd_info.p_effective, dt.threshold, dt.keep_scale,
      static_cast<unsigned long long>(c.seed), static_cast<unsigned long long>(c.offset));
  std::printf("  forward    %10.3f ms  %8s TFLOP/s\n", rates.fwd_ms,
              format_g(rates.fwd_tflops).c_str());
  std::printf("  backward   %10.3f ms  %8s TFLOP/s%s\n", rates.bwd_ms,
              format_g(rates.bwd_tflops).c_str(), rc.deterministic ? "   (deterministic)" : "");
  std::printf("  fwd+bwd    %10.3f ms  %8s TFLOP/s   (median of %lld after %lld warm-up; %s)\n",
              rates.fwd_ms + rates.bwd_ms, format_g(rates.fwdbwd_tflops).c_str(),
              static_cast<long long>(t.iters),
              static_cast<long long>(std::max<std::int64_t>(rc.warmup, 1)),
              r.device.type == DeviceType::cuda ? "CUDA events" : "wall clock");
  std::printf("  check      %s\n", r.check.c_str());
  print_checks(r.checks);
  std::printf("  result     %s\n", rc.check == "none" ? "not checked" : pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

// The device a run asked for; says on stderr why auto did not pick cuda.
Device run_device(const RunConfig& rc, std::string& note) {
  const Device device = resolve_device(rc.device, &note);
  if (!note.empty() && !rc.json) std::fprintf(stderr, "memeff run: %s\n", note.c_str());
  return device;
}

Options run_options(const RunConfig& rc) {
  Options options;
  if (!rc.backend.empty()) options.backends = split(rc.backend, ',');
  options.deterministic = rc.deterministic;
  return options;
}

// `memeff run --seqlens`: packed variable-length sequences (AttentionArgs::packed). Random
// sequences of the given lengths are packed into q [total_q, Hq, D], k and v [total_k, Hkv, D|Dv];
// forward and backward run on the chosen backend and are checked against the reference on the
// packed call itself, or on its first sequences when the whole is too much work: a prefix of the
// sequences keeps every sequence's index s, hence its dropout mask, so it is an exact
// sub-problem. FLOPs count the real lengths.
int run_packed(const RunConfig& rc) {
  const ShapeConfig& c = rc.shape;
  if (c.bias.present) throw UsageError("--bias: not supported with --seqlens (packed sequences)");
  if (c.alibi) throw UsageError("--alibi: not with --seqlens (packed sequences) yet");
  const std::vector<std::int64_t>& lq = rc.seqlens;
  const std::vector<std::int64_t> lk = packed_key_lengths(rc.seqlens, rc.kv_seqlens);
  const std::int64_t S = static_cast<std::int64_t>(lq.size());
  std::vector<std::int64_t> cu_q(S + 1, 0), cu_k(S + 1, 0);
  std::int64_t max_q = 0, max_k = 0;
  for (std::int64_t s = 0; s < S; ++s) {
    cu_q[s + 1] = cu_q[s] + lq[s];
    cu_k[s + 1] = cu_k[s] + lk[s];
    max_q = std::max(max_q, lq[s]);
    max_k = std::max(max_k, lk[s]);
  }
  if (cu_q[S] > INT32_MAX || cu_k[S] > INT32_MAX) {
    throw UsageError("--seqlens: at most 2^31 - 1 packed rows (int32 offsets)");
  }
  RunReport r;
  r.title = "run (packed sequences)";
  r.device = run_device(rc, r.device_note);
  const Device device = r.device;
  const DType dtype = r.dtype = c.dtype_on(device.type);
  const std::int64_t Tq = cu_q[S], Tk = cu_k[S], Hq = c.Hq, Hkv = c.hkv(), D = c.D, Dv = c.dv();

  HostArray q_host(dtype, Shape{{Tq, Hq, D}}), k_host(dtype, Shape{{Tk, Hkv, D}}),
      v_host(dtype, Shape{{Tk, Hkv, Dv}}), dout_host(dtype, Shape{{Tq, Hq, Dv}});
  fill_normal(q_host, c.seed, 1);
  fill_normal(k_host, c.seed, 2);
  fill_normal(v_host, c.seed, 3);
  fill_normal(dout_host, c.seed, 4);
  HostArray cu_q_host(DType::i32, Shape{{S + 1}}), cu_k_host(DType::i32, Shape{{S + 1}});
  for (std::int64_t s = 0; s <= S; ++s) {
    cu_q_host.set(s, static_cast<double>(cu_q[s]));
    cu_k_host.set(s, static_cast<double>(cu_k[s]));
  }
  DeviceTensor q(device, dtype, q_host.shape), k(device, dtype, k_host.shape),
      v(device, dtype, v_host.shape), dout(device, dtype, dout_host.shape),
      out(device, dtype, dout_host.shape), lse(device, DType::f32, Shape{{Hq, Tq}}),
      dq(device, dtype, q_host.shape), dk(device, dtype, k_host.shape),
      dv(device, dtype, v_host.shape), cuq(device, DType::i32, cu_q_host.shape),
      cuk(device, DType::i32, cu_k_host.shape);
  q.upload(q_host);
  k.upload(k_host);
  v.upload(v_host);
  dout.upload(dout_host);
  cuq.upload(cu_q_host);
  cuk.upload(cu_k_host);
  for (DeviceTensor* t : {&out, &lse, &dq, &dk, &dv}) t->buffer.fill_bytes(0xFF);  // NaN

  AttentionArgs args = make_args(c, q.view(), k.view(), v.view(), TensorView{});
  PackedSequences packed;
  packed.cu_seqlens_q = cuq.view();
  packed.cu_seqlens_k = cuk.view();
  packed.max_seqlen_q = max_q;
  packed.max_seqlen_k = max_k;
  args.packed = packed;
  const BackwardTensors grads{dout.view(), out.view(), lse.view(), dq.view(), dk.view(), dv.view(),
                              std::nullopt};
  const Options options = run_options(rc);
  std::ostringstream lens;
  for (std::int64_t s = 0; s < S; ++s) {
    lens << (s ? "," : "") << lq[s];
    if (lk[s] != lq[s]) lens << "/" << lk[s];
  }
  std::ostringstream problem;
  problem << "packed S=" << S << " seqlens " << lens.str() << " (q/k where they differ) total "
          << Tq << "/" << Tk << " Hq=" << Hq << " Hkv=" << Hkv << " D=" << D << " Dv=" << Dv << " "
          << dtype_name(dtype) << " causal=" << causal_mode_name(c.causal)
          << " dropout=" << c.dropout;
  if (c.window.bounded()) problem << " window=" << c.window.left << "," << c.window.right;
  if (c.softcap > 0.0) problem << " softcap=" << c.softcap;
  r.problem = problem.str();
  r.tensors = dims_text("q", q.shape.dims) + "  " + dims_text("k", k.shape.dims) + "  " +
              dims_text("v", v.shape.dims) + "  " + dims_text("cu_seqlens", cuq.shape.dims);
  r.shape = {{"seqlens_q", lq},
             {"seqlens_k", lk},
             {"Hq", Hq},
             {"Hkv", Hkv},
             {"D", D},
             {"Dv", Dv},
             {"causal", causal_mode_name(c.causal)},
             {"dropout", c.dropout}};
  r.timed = time_passes(rc, device, args, grads, options, r.problem,
                        attention_flops_packed(lq, lk, Hq, D, c.causal, c.window));

  // The reference on the first `checked` sequences (all of them when within the budget).
  std::int64_t checked = 0;
  double work = 0.0;
  if (rc.check != "none") {
    for (; checked < S; ++checked) {
      const double w = static_cast<double>(lq[checked]) * static_cast<double>(lk[checked]) *
                       static_cast<double>((D + Dv) * Hq);
      if (checked > 0 && rc.check != "full" && work + w > kFullCheckBudget) break;
      work += w;
    }
  }
  if (checked > 0) {
    if (!rc.json) {
      std::fprintf(stderr, "memeff run: checking %lld of %lld sequences against the reference\n",
                   static_cast<long long>(checked), static_cast<long long>(S));
    }
    const std::int64_t tq = cu_q[checked], tk = cu_k[checked];
    const HostArray rq = box_as(q_host, DType::f64, {tq, Hq, D}),
                    rk = box_as(k_host, DType::f64, {tk, Hkv, D}),
                    rv = box_as(v_host, DType::f64, {tk, Hkv, Dv}),
                    rdout = box_as(dout_host, DType::f64, {tq, Hq, Dv});
    HostArray rout(DType::f64, Shape{{tq, Hq, Dv}}), rlse(DType::f32, Shape{{Hq, tq}}),
        rdq(DType::f64, Shape{{tq, Hq, D}}), rdk(DType::f64, Shape{{tk, Hkv, D}}),
        rdv(DType::f64, Shape{{tk, Hkv, Dv}});
    const HostArray rcu_q = box_as(cu_q_host, DType::i32, {checked + 1}),
                    rcu_k = box_as(cu_k_host, DType::i32, {checked + 1});
    AttentionArgs ra = make_args(c, rq.view(), rk.view(), rv.view(), TensorView{});
    PackedSequences rp;
    rp.cu_seqlens_q = rcu_q.view();
    rp.cu_seqlens_k = rcu_k.view();
    // The prefix's own maxima (validation wants them <= its total).
    rp.max_seqlen_q = *std::max_element(lq.begin(), lq.begin() + checked);
    rp.max_seqlen_k = *std::max_element(lk.begin(), lk.begin() + checked);
    ra.packed = rp;
    Options ro;
    ro.backends = {"reference"};
    forward(ra, rout.view(), rlse.view(), ro);
    backward(ra, {rdout.view(), rout.view(), rlse.view(), rdq.view(), rdk.view(), rdv.view(), std::nullopt},
             ro);
    // lse is [Hq, total_q]: the checked sequences are its first tq columns of every row, not a
    // leading box; compare it row by row.
    const HostArray lse_all = lse.download();
    HostArray lse_cut(DType::f32, Shape{{Hq, tq}});
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < tq; ++i) lse_cut.set(h * tq + i, lse_all.get(h * Tq + i));
    r.checks = {check_output("out", out.download(), rout, dtype, false),
                check_output("lse", lse_cut, rlse, dtype, false),
                check_output("dq", dq.download(), rdq, dtype, true),
                check_output("dk", dk.download(), rdk, dtype, true),
                check_output("dv", dv.download(), rdv, dtype, true)};
  }
  r.check = rc.check == "none"
                ? "skipped (--check none)"
                : (checked == S ? "all " + std::to_string(S) + " sequences"
                                : "sampled: the first " + std::to_string(checked) + " of " +
                                      std::to_string(S) + " sequences (--check full checks all)");
  return report(rc, r);
}

// A dense batch: the problem of make_attention_data, checked as check_plan() says.
int run_dense(const RunConfig& rc) {
  RunReport r;
  r.title = "run";
  r.device = run_device(rc, r.device_note);
  const AttentionData d = make_attention_data(rc.shape, r.device);
  const ShapeConfig& c = d.config;
  r.dtype = d.dtype;
  add_shape_json(r.shape, c);
  r.problem = c.describe(d.dtype);
  r.tensors = dims_text("q", d.q.shape.dims) + "  " + dims_text("k", d.k.shape.dims) + "  " +
              dims_text("v", d.v.shape.dims) +
              (c.bias.present ? "  " + dims_text("bias", d.bias.shape.dims) : "");
  const Options options = run_options(rc);
  r.timed = time_passes(rc, r.device, d.args(), d.grads(), options, r.problem, d.forward_flops());
  const CheckPlan plan = check_plan(rc);
  r.check = plan.describe(c);
  if (plan.enabled) {
    if (!rc.json) {
      std::fprintf(stderr, "memeff run: checking against the reference (%s)\n", r.check.c_str());
    }
    r.checks = check_against_reference(d, plan, options);
  }
  return report(rc, r);
}

int run(const RunConfig& rc, const std::vector<std::string>& args) {
  rc.shape.check();
  if (rc.context_parallel > 0) {
    if (!rc.seqlens.empty()) {
      throw UsageError("--context-parallel: not with --seqlens (packed sequences)");
    }
    if (rc.shape.has_score_modifiers()) {
      throw UsageError("--context-parallel: not with --window, --alibi or --softcap yet");
    }
    if (rc.deterministic) throw UsageError("--deterministic: not with --context-parallel yet");
    ContextParallelRun cp = rc.cp;
    cp.shape = rc.shape;
    cp.device = rc.device;
    cp.backend = rc.backend;
    cp.json = rc.json;
    cp.ranks = rc.context_parallel;
    cp.argv = args;
    return run_context_parallel(cp);
  }
  return rc.seqlens.empty() ? run_dense(rc) : run_packed(rc);
}

// --check: auto, full, none or a number of query heads.
CLI::Validator check_mode() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "auto" || text == "full" || text == "none" || integer(1)(text).empty()) {
          return "";
        }
        return "expected auto, full, none or a number of heads >= 1, got `" + text + "`";
      },
      "");
}

}  // namespace

Command add_run_command(CLI::App& program) {
  auto rc = std::make_shared<RunConfig>();
  CLI::App* app = program.add_subcommand(
      "run", R"(forward + backward on random inputs: timings, TFLOP/s, errors vs the reference

Runs forward and backward attention on random inputs with the best available backend
(the GPU when the build has CUDA and a device is present, else the CPU; the dispatcher's
default order picks the backend), times both passes, and checks out, lse, dq, dk, dv and
dbias against the double-precision `reference` backend with the same dropout mask.
Exits with 1 when an error exceeds its tolerance.
)");
  add_device(*app, rc->device, "default auto: cuda when present");
  app->add_option("--backend", rc->backend,
                  "allow only these backends, comma-separated in priority order\n"
                  "(Options::backends), e.g. cuda, cpu, reference, cuda,cuda_math")
      ->type_name("LIST");
  add_shape_flags(*app, rc->shape);
  add_checked(*app, "--iters", rc->iters, "N", integer(1),
              "timed iterations per pass; the median is reported\n"
              "(default 10 on cuda; 3 on cpu, 1 when a pass takes seconds)");
  add_checked(*app, "--warmup", rc->warmup, "N", integer(0),
              "untimed iterations before timing (default 1)");
  add_checked(*app, "--check", rc->check, "MODE", check_mode(),
              "auto (default: the whole problem when small, else batch 0 and the first heads),\n"
              "full (every head), none (timing only), or N: batch 0 and the first N query heads\n"
              "(rounded up to whole GQA groups)");
  app->add_flag("--json", rc->json, "print one JSON object instead of the text report");
  app->add_flag("--deterministic", rc->deterministic,
                "run the bitwise-repeatable backward (Options::deterministic)");
  add_packed_flags(
      *app, rc->seqlens, rc->kv_seqlens,
      "packed variable-length sequences of these query lengths (cu_seqlens): q [total, Hq, D],\n"
      "each sequence attends within itself; B, Lq and Lk are then ignored, a bias is refused");
  add_checked(
      *app, "--context-parallel", rc->context_parallel, "N", integer(1, 4096),
      "ring attention over N ranks (docs/context_parallel.md): each rank holds a slice of the\n"
      "queries and keys; checked rank by rank against the single-device run on the same\n"
      "backends. cpu: every rank in this process (local ring); cuda: one process per GPU over\n"
      "NCCL (started here, or by torchrun-style RANK/WORLD_SIZE/LOCAL_RANK)");
  add_name(*app, "--cp-layout", rc->cp.layout,
           {"auto", cp::layout_name(cp::Layout::contiguous), cp::layout_name(cp::Layout::zigzag)},
           "auto (zigzag when causal, else contiguous), contiguous or zigzag (2N chunks; rank r\n"
           "holds chunks r and 2N-1-r)");
  add_name(*app, "--cp-transport", rc->cp.transport, {"auto", "local", "nccl"},
           "auto (local on cpu; nccl on cuda with N > 1), local (every rank in this process, also\n"
           "on one GPU) or nccl (one process per GPU)");
  app->add_option(
         "--nccl-id-file", rc->cp.id_file,
         "where rank 0 writes the NCCL unique id for the others (default $MEMEFF_NCCL_ID_FILE, or\n"
         "a temporary file when this program starts the ranks itself); in a directory only you\n"
         "can write, e.g. from `mktemp -d` (docs/context_parallel.md, \"The NCCL id file\")")
      ->type_name("PATH");
  app->footer(
      R"(defaults: B=2 Hq=Hkv=8 Lq=Lk=512 D=Dv=64, bf16 on cuda / fp32 on cpu, causal top_left,
dropout 0.1, no bias, seed 0, offset 0.
FLOPs: )" +
      flops_help() + R"( the forward.
check: inputs are N(0,1) rounded to the dtype; the reference recomputes in fp64 from the same
values. Large shapes are checked on batch 0 and the first query heads: the dropout mask is
keyed by b*Hq+h, so that prefix is an exact sub-problem (dbias, when it sums over heads
outside it, is compared with the backend rerun on the sub-problem). When one head group is
too large, out, lse and dq are checked on its first query rows (dk, dv, dbias: --check N).
)" + tolerance_help());
  return {app, [rc](const std::vector<std::string>& args) { return run(*rc, args); }};
}

}  // namespace memeff::cli
