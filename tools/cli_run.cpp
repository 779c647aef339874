// `memeff run`: the main job. Builds random inputs, runs forward and backward on the best
// available backend (or the one named), times them, and checks every output against the
// double-precision reference with the same dropout mask: on the whole problem, or, when the
// shape is large, on batch 0 and the first heads (an exact sub-problem, see check_plan()).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "cli_args.h"
#include "cli_commands.h"
#include "cli_context_parallel.h"
#include "cli_json.h"
#include "cli_problem.h"
#include "cli_tolerance.h"
#include "memeff/attention.h"
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
  // Packed sequences (--seqlens, --kv-seqlens): empty for a dense batch.
  std::vector<std::int64_t> seqlens, kv_seqlens;
  // Context parallelism (--context-parallel N and its --cp-* flags): 0 ranks for a plain run.
  ContextParallelRun cp;
  int context_parallel = 0;
};

std::vector<std::int64_t> parse_lengths(const std::string& flag, const std::string& text) {
  std::vector<std::int64_t> out;
  for (const std::string& part : split(text, ',')) out.push_back(parse_int(flag, part, 0));
  if (out.empty()) throw UsageError(flag + ": expected comma-separated lengths, got `" + text + "`");
  return out;
}

// Which part of the problem the reference recomputes. The dropout mask of head h of batch b is
// keyed by b·Hq + h and row i, column j are absolute, so a view of batch 0 and query heads
// [0, heads) (with their key/value heads [0, heads / group)) is a problem of its own whose mask,
// outputs and gradients are exactly those of the same elements of the full problem. dbias is
// exact too unless it sums over a batch or head left out (bias broadcast over B or H).
// When even one head group is too much work, only query rows [0, rows) are recomputed: a row's
// out, lse and dq depend on no other row. The keys the reference sees are cut to those the rows
// can see ([0, rows) top-left; [0, Lk - Lq + rows) bottom-right, which keeps the diagonal where
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
      heads = (parse_int("--check", rc.check, 1) + group - 1) / group * group;  // whole groups
    } else {
      heads = per_head > 0 ? static_cast<std::int64_t>(kFullCheckBudget / per_head) / group * group : c.Hq;
    }
    plan.heads = std::clamp<std::int64_t>(heads, group, c.Hq);
    if (!explicit_heads && per_head * static_cast<double>(plan.heads) > kFullCheckBudget) {
      // One head group is already too much: check a prefix of its rows (out, lse, dq).
      const double per_row = static_cast<double>(group) * static_cast<double>(c.lk()) * width;
      plan.rows = std::clamp<std::int64_t>(static_cast<std::int64_t>(kFullCheckBudget / per_row), 1, c.Lq);
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
  HostArray bias;
  if (c.bias.present) bias = box_as(d.bias_host, DType::f64, bias_box);
  HostArray out(DType::f64, Shape{o_dims}), lse(DType::f32, Shape{lse_dims}), dq(DType::f64, Shape{q_dims}),
      dk(DType::f64, Shape{k_dims}), dv(DType::f64, Shape{v_dims}), dbias;
  if (c.bias.present) dbias = HostArray(DType::f64, Shape{bias_box});

  const AttentionArgs args =
      make_args(c, q.view(), k.view(), v.view(), c.bias.present ? bias.view() : TensorView{});
  Options ref_options;
  ref_options.backends = {"reference"};
  forward(args, out.view(), lse.view(), ref_options);
  BackwardTensors g;
  g.dout = dout.view();
  g.out = out.view();
  g.lse = lse.view();
  g.dq = dq.view();
  g.dk = dk.view();
  g.dv = dv.view();
  if (c.bias.present) g.dbias = dbias.view();
  backward(args, g, ref_options);

  std::vector<CheckResult> results;
  auto add = [&](const char* name, const HostArray& actual, const HostArray& expected, bool gradient,
                 std::string note = "") {
    CheckResult r;
    r.name = name;
    r.cmp = compare_box(actual, expected);
    r.tol = check_tolerance(d.dtype, gradient);
    r.dims = expected.shape.dims;
    r.note = std::move(note);
    results.push_back(std::move(r));
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
        sdv(d.device, d.dtype, Shape{v_dims}), sdbias(d.device, d.dtype, Shape{bias_box});
    for (DeviceTensor* t : {&sdq, &sdk, &sdv, &sdbias}) t->buffer.fill_bytes(0xFF);
    BackwardTensors sg;
    sg.dout = d.dout.box_view(o_dims);
    sg.out = d.out.box_view(o_dims);
    sg.lse = d.lse.box_view(lse_dims);
    sg.dq = sdq.view();
    sg.dk = sdk.view();
    sg.dv = sdv.view();
    sg.dbias = sdbias.view();
    Options o = backend_options;
    o.workspace = nullptr;
    o.workspace_bytes = 0;
    Buffer ws(d.device, workspace_size(sub, Pass::backward, o));
    o.workspace = ws.data();
    o.workspace_bytes = ws.bytes();
    backward(sub, sg, o);
    synchronize(d.device);
    add("dbias", sdbias.download(), dbias, true, "backend rerun on the sampled heads");
  }
  return results;
}

FlagParser make_parser(RunConfig& rc) {
  FlagParser p("memeff run",
               "Runs forward and backward attention on random inputs with the best available backend\n"
               "(the GPU when the build has CUDA and a device is present, else the CPU; the dispatcher's\n"
               "default order picks the backend), times both passes, and checks out, lse, dq, dk, dv and\n"
               "dbias against the double-precision `reference` backend with the same dropout mask.\n"
               "Exits with 1 when an error exceeds its tolerance.");
  p.add({"--device", "DEV", "cpu, cuda or auto (default auto: cuda when present)",
         [&rc](const std::string& v) { rc.device = parse_device("--device", v); }});
  p.add({"--backend", "LIST", "allow only these backends, comma-separated in priority order\n(Options::backends), e.g. cuda, cpu, reference, cuda,cuda_math",
         [&rc](const std::string& v) { rc.backend = v; }});
  add_shape_flags(p, rc.shape);
  p.add({"--iters", "N", "timed iterations per pass; the median is reported\n(default 10 on cuda; 3 on cpu, 1 when a pass takes seconds)",
         [&rc](const std::string& v) { rc.iters = parse_int("--iters", v, 1); }});
  p.add({"--warmup", "N", "untimed iterations before timing (default 1)",
         [&rc](const std::string& v) { rc.warmup = parse_int("--warmup", v, 0); }});
  p.add({"--check", "MODE",
         "auto (default: the whole problem when small, else batch 0 and the first heads),\n"
         "full (every head), none (timing only), or N: batch 0 and the first N query heads\n"
         "(rounded up to whole GQA groups)",
         [&rc](const std::string& v) {
           if (v != "auto" && v != "full" && v != "none") parse_int("--check", v, 1);  // N heads
           rc.check = v;
         }});
  p.add({"--json", "", "print one JSON object instead of the text report",
         [&rc](const std::string&) { rc.json = true; }});
  p.add({"--seqlens", "L1,L2,..",
         "packed variable-length sequences of these query lengths (cu_seqlens): q [total, Hq, D],\n"
         "each sequence attends within itself; B, Lq and Lk are then ignored, a bias is refused",
         [&rc](const std::string& v) { rc.seqlens = parse_lengths("--seqlens", v); }});
  p.add({"--kv-seqlens", "L1,L2,..",
         "key lengths of the packed sequences (default: the query lengths)",
         [&rc](const std::string& v) { rc.kv_seqlens = parse_lengths("--kv-seqlens", v); }});
  p.add({"--context-parallel", "N",
         "ring attention over N ranks (docs/context_parallel.md): each rank holds a slice of the\n"
         "queries and keys; checked rank by rank against the single-device run on the same\n"
         "backends. cpu: every rank in this process (local ring); cuda: one process per GPU over\n"
         "NCCL (started here, or by torchrun-style RANK/WORLD_SIZE/LOCAL_RANK)",
         [&rc](const std::string& v) {
           rc.context_parallel = static_cast<int>(parse_int("--context-parallel", v, 1));
           if (rc.context_parallel > 4096) {
             throw UsageError("--context-parallel: at most 4096 ranks, got " + v);
           }
         }});
  p.add({"--cp-layout", "L",
         "auto (zigzag when causal, else contiguous), contiguous or zigzag (2N chunks; rank r\n"
         "holds chunks r and 2N-1-r)",
         [&rc](const std::string& v) { rc.cp.layout = v; }});
  p.add({"--cp-transport", "T",
         "auto (local on cpu; nccl on cuda with N > 1), local (every rank in this process, also\n"
         "on one GPU) or nccl (one process per GPU)",
         [&rc](const std::string& v) { rc.cp.transport = v; }});
  p.add({"--nccl-id-file", "PATH",
         "where rank 0 writes the NCCL unique id for the others (default $MEMEFF_NCCL_ID_FILE, or\n"
         "a temporary file when this program starts the ranks itself)",
         [&rc](const std::string& v) { rc.cp.id_file = v; }});
  p.add_section(
      "defaults: B=2 Hq=Hkv=8 Lq=Lk=512 D=Dv=64, bf16 on cuda / fp32 on cpu, causal top-left,\n"
      "dropout 0.1, no bias, seed 0, offset 0.\n"
      "FLOPs: forward 4*B*Hq*Lq*Lk*D (halved when causal), backward 2.5x the forward.\n"
      "check: inputs are N(0,1) rounded to the dtype; the reference recomputes in fp64 from the same\n"
      "values. Large shapes are checked on batch 0 and the first query heads: the dropout mask is\n"
      "keyed by b*Hq+h, so that prefix is an exact sub-problem (dbias, when it sums over heads\n"
      "outside it, is compared with the backend rerun on the sub-problem). When one head group is\n"
      "too large, out, lse and dq are checked on its first query rows (dk, dv, dbias: --check N).\n" +
      std::string(tolerance_help()));
  return p;
}

// Both passes timed as `memeff run` times them: each pass gets the workspace it asks for (so
// nothing allocates inside the timed calls), warm-up (whose outputs are the ones checked), then
// `iters` calls per pass into the same buffers. Default iterations: 10 on cuda; on the CPU 3, or
// fewer when one forward+backward takes seconds (the reference backend).
struct TimedPasses {
  CallInfo fwd_info, bwd_info;
  std::int64_t iters = 0;
  double fwd_ms = 0.0, bwd_ms = 0.0;  // medians
  std::size_t ws_fwd = 0, ws_bwd = 0;
};

TimedPasses time_passes(const RunConfig& rc, Device device, const AttentionArgs& args,
                        const BackwardTensors& grads, const Options& options,
                        const std::string& what) {
  TimedPasses t;
  Options fwd_options = options, bwd_options = options;
  t.ws_fwd = workspace_size(args, Pass::forward, options);
  t.ws_bwd = workspace_size(args, Pass::backward, options);
  Buffer ws_f(device, t.ws_fwd), ws_b(device, t.ws_bwd);
  fwd_options.workspace = ws_f.data();
  fwd_options.workspace_bytes = t.ws_fwd;
  bwd_options.workspace = ws_b.data();
  bwd_options.workspace_bytes = t.ws_bwd;
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
  t.fwd_ms = median(fwd_ms);
  t.bwd_ms = median(bwd_ms);
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

// `memeff run --seqlens`: packed variable-length sequences (AttentionArgs::packed). Random
// sequences of the given lengths are packed into q [total_q, Hq, D], k and v [total_k, Hkv, D|Dv];
// forward and backward run on the chosen backend and are checked against the reference on the
// packed call itself, or on its first sequences when the whole is too much work: a prefix of the
// sequences keeps every sequence's index s, hence its dropout mask, so it is an exact
// sub-problem.
int run_packed(const RunConfig& rc) {
  const ShapeConfig& c = rc.shape;
  if (c.bias.present) throw UsageError("--bias: not supported with --seqlens (packed sequences)");
  const std::vector<std::int64_t>& lq = rc.seqlens;
  const std::vector<std::int64_t>& lk = rc.kv_seqlens.empty() ? rc.seqlens : rc.kv_seqlens;
  if (lk.size() != lq.size()) {
    throw UsageError("--kv-seqlens: expected " + std::to_string(lq.size()) +
                     " lengths (one per --seqlens entry), got " + std::to_string(lk.size()));
  }
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
  std::string device_note;
  const Device device = resolve_device(rc.device, &device_note);
  if (!device_note.empty() && !rc.json) std::fprintf(stderr, "memeff run: %s\n", device_note.c_str());
  const DType dtype = c.dtype_on(device.type);
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
  Options options;
  if (!rc.backend.empty()) options.backends = split(rc.backend, ',');
  std::ostringstream lens;
  for (std::int64_t s = 0; s < S; ++s) {
    lens << (s ? "," : "") << lq[s];
    if (lk[s] != lq[s]) lens << "/" << lk[s];
  }
  std::ostringstream problem;
  problem << "packed S=" << S << " seqlens " << lens.str() << " (q/k where they differ) total "
          << Tq << "/" << Tk << " Hq=" << Hq << " Hkv=" << Hkv << " D=" << D << " Dv=" << Dv << " "
          << dtype_name(dtype) << " causal=" << causal_flag_name(c.causal)
          << " dropout=" << c.dropout;
  const std::string where = device_description(device);
  const TimedPasses timed = time_passes(rc, device, args, grads, options, problem.str());
  const CallInfo &fwd_info = timed.fwd_info, &bwd_info = timed.bwd_info;
  const std::int64_t iters = timed.iters;
  const double t_f = timed.fwd_ms, t_b = timed.bwd_ms;
  const double flops = attention_flops_packed(lq, lk, Hq, D, c.causal);
  const double fwd_tflops = t_f > 0 ? flops / t_f / 1e9 : 0.0;
  const double bwd_tflops = t_b > 0 ? 2.5 * flops / t_b / 1e9 : 0.0;

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
  std::vector<CheckResult> checks;
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
    rp.max_seqlen_q = max_q;
    rp.max_seqlen_k = max_k;
    for (std::int64_t s = 0; s < checked; ++s) {  // the prefix's own maxima (validation wants them <= total)
      rp.max_seqlen_q = s == 0 ? lq[s] : std::max(rp.max_seqlen_q, lq[s]);
      rp.max_seqlen_k = s == 0 ? lk[s] : std::max(rp.max_seqlen_k, lk[s]);
    }
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
    auto add = [&](const char* name, const HostArray& actual, const HostArray& expected,
                   bool gradient) {
      CheckResult r;
      r.name = name;
      r.cmp = compare_box(actual, expected);
      r.tol = check_tolerance(dtype, gradient);
      r.dims = expected.shape.dims;
      checks.push_back(std::move(r));
    };
    add("out", out.download(), rout, false);
    add("lse", lse_cut, rlse, false);
    add("dq", dq.download(), rdq, true);
    add("dk", dk.download(), rdk, true);
    add("dv", dv.download(), rdv, true);
  }
  bool pass = true;
  for (const CheckResult& r : checks) pass = pass && r.pass();
  const std::string check_text =
      rc.check == "none"
          ? "skipped (--check none)"
          : (checked == S ? "all " + std::to_string(S) + " sequences"
                          : "sampled: the first " + std::to_string(checked) + " of " +
                                std::to_string(S) + " sequences (--check full checks all)");

  if (rc.json) {
    Json j;
    j["backend"] = fwd_info.backend;
    j["backend_backward"] = bwd_info.backend;
    j["device"] = device_name(device);
    j["dtype"] = dtype_name(dtype);
    j["seqlens_q"] = lq;
    j["seqlens_k"] = lk;
    j["Hq"] = Hq;
    j["Hkv"] = Hkv;
    j["D"] = D;
    j["Dv"] = Dv;
    j["causal"] = causal_flag_name(c.causal);
    j["dropout"] = c.dropout;
    j["p_effective"] = fwd_info.p_effective;
    j["seed"] = c.seed;
    j["offset"] = c.offset;
    j["iters"] = iters;
    j["fwd_ms"] = t_f;
    j["bwd_ms"] = t_b;
    j["fwd_tflops"] = fwd_tflops;
    j["bwd_tflops"] = bwd_tflops;
    j["check"] = check_text;
    add_checks_json(j, checks);
    j["pass"] = pass;
    std::printf("%s\n", json_text(j).c_str());
    return pass ? 0 : 1;
  }
  std::printf("memeff %s run (packed sequences)\n", version());
  std::printf("  backend    %s (forward), %s (backward)\n", fwd_info.backend.c_str(),
              bwd_info.backend.c_str());
  std::printf("  device     %s%s\n", where.c_str(),
              device_note.empty() ? "" : ("  [" + device_note + "]").c_str());
  std::printf("  problem    %s\n", problem.str().c_str());
  std::printf("  shapes     q [%lld, %lld, %lld]  k [%lld, %lld, %lld]  v [%lld, %lld, %lld]  "
              "cu_seqlens [%lld]\n",
              static_cast<long long>(Tq), static_cast<long long>(Hq), static_cast<long long>(D),
              static_cast<long long>(Tk), static_cast<long long>(Hkv), static_cast<long long>(D),
              static_cast<long long>(Tk), static_cast<long long>(Hkv), static_cast<long long>(Dv),
              static_cast<long long>(S + 1));
  std::printf("  forward    %10.3f ms  %8s TFLOP/s\n", t_f, format_g(fwd_tflops).c_str());
  std::printf("  backward   %10.3f ms  %8s TFLOP/s   (FLOPs of the real lengths; median of %lld)\n",
              t_b, format_g(bwd_tflops).c_str(), static_cast<long long>(iters));
  std::printf("  check      %s\n", check_text.c_str());
  print_checks(checks);
  std::printf("  result     %s\n", rc.check == "none" ? "not checked" : pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  RunConfig rc;
  FlagParser parser = make_parser(rc);
  parser.parse(argv);
  rc.shape.check();
  if (!rc.kv_seqlens.empty() && rc.seqlens.empty()) {
    throw UsageError("--kv-seqlens: needs --seqlens (the query lengths)");
  }
  if (rc.context_parallel > 0) {
    if (!rc.seqlens.empty()) {
      throw UsageError("--context-parallel: not with --seqlens (packed sequences)");
    }
    ContextParallelRun cp = rc.cp;
    cp.shape = rc.shape;
    cp.device = rc.device;
    cp.backend = rc.backend;
    cp.json = rc.json;
    cp.ranks = rc.context_parallel;
    cp.argv = argv;
    return run_context_parallel(cp);
  }
  if (!rc.seqlens.empty()) return run_packed(rc);

  std::string device_note;
  const Device device = resolve_device(rc.device, &device_note);
  if (!device_note.empty() && !rc.json) std::fprintf(stderr, "memeff run: %s\n", device_note.c_str());

  AttentionData d = make_attention_data(rc.shape, device);
  const ShapeConfig& c = d.config;
  const AttentionArgs args = d.args();
  const BackwardTensors grads = d.grads();
  Options options;
  if (!rc.backend.empty()) options.backends = split(rc.backend, ',');

  const std::string where = device_description(device);
  const TimedPasses timed = time_passes(rc, device, args, grads, options, c.describe(d.dtype));
  const CallInfo &fwd_info = timed.fwd_info, &bwd_info = timed.bwd_info;
  const std::int64_t iters = timed.iters;
  const std::size_t ws_fwd = timed.ws_fwd, ws_bwd = timed.ws_bwd;
  const double t_f = timed.fwd_ms, t_b = timed.bwd_ms;
  const double flops = d.forward_flops();
  const double fwd_tflops = t_f > 0 ? flops / t_f / 1e9 : 0.0;
  const double bwd_tflops = t_b > 0 ? 2.5 * flops / t_b / 1e9 : 0.0;
  const double fb_tflops = t_f + t_b > 0 ? 3.5 * flops / (t_f + t_b) / 1e9 : 0.0;

  const CheckPlan plan = check_plan(rc);
  std::vector<CheckResult> checks;
  if (plan.enabled) {
    if (!rc.json) {
      std::fprintf(stderr, "memeff run: checking against the reference (%s)\n", plan.describe(c).c_str());
    }
    checks = check_against_reference(d, plan, options);
  }
  bool pass = true;
  for (const CheckResult& r : checks) pass = pass && r.pass();

  const DropoutThreshold dt = dropout_threshold(c.dropout);
  if (rc.json) {
    Json j;
    j["backend"] = fwd_info.backend;
    j["backend_backward"] = bwd_info.backend;
    j["device"] = device_name(device);
    j["device_description"] = where;
    j["device_note"] = device_note;
    j["dtype"] = dtype_name(d.dtype);
    add_shape_json(j, c);
    j["p_effective"] = fwd_info.p_effective;
    j["seed"] = c.seed;
    j["offset"] = c.offset;
    j["iters"] = iters;
    j["fwd_ms"] = t_f;
    j["bwd_ms"] = t_b;
    j["fwd_tflops"] = fwd_tflops;
    j["bwd_tflops"] = bwd_tflops;
    j["tflops"] = fb_tflops;
    j["workspace_fwd_bytes"] = static_cast<std::uint64_t>(ws_fwd);
    j["workspace_bwd_bytes"] = static_cast<std::uint64_t>(ws_bwd);
    j["check"] = plan.describe(c);
    add_checks_json(j, checks);
    j["pass"] = pass;
    std::printf("%s\n", json_text(j).c_str());
    return pass ? 0 : 1;
  }

  std::printf("memeff %s run\n", version());
  std::printf("  backend    %s (forward), %s (backward)\n", fwd_info.backend.c_str(), bwd_info.backend.c_str());
  std::printf("  device     %s%s\n", where.c_str(), device_note.empty() ? "" : ("  [" + device_note + "]").c_str());
  std::printf("  problem    %s\n", c.describe(d.dtype).c_str());
  std::printf("  shapes     q [%lld, %lld, %lld, %lld]  k [%lld, %lld, %lld, %lld]  v [%lld, %lld, %lld, %lld]",
              static_cast<long long>(c.B), static_cast<long long>(c.Hq), static_cast<long long>(c.Lq),
              static_cast<long long>(c.D), static_cast<long long>(c.B), static_cast<long long>(c.hkv()),
              static_cast<long long>(c.lk()), static_cast<long long>(c.D), static_cast<long long>(c.B),
              static_cast<long long>(c.hkv()), static_cast<long long>(c.lk()), static_cast<long long>(c.dv()));
  if (c.bias.present) {
    const auto bd = bias_dims(c);
    std::printf("  bias [%lld, %lld, %lld, %lld]", static_cast<long long>(bd[0]), static_cast<long long>(bd[1]),
                static_cast<long long>(bd[2]), static_cast<long long>(bd[3]));
  }
  std::printf("\n  dropout    p=%g  p_effective=%.7g (keep when byte < %u, scale %.6g)  seed=%llu offset=%llu\n",
              c.dropout, fwd_info.p_effective, dt.threshold, dt.keep_scale, static_cast<unsigned long long>(c.seed),
              static_cast<unsigned long long>(c.offset));
  std::printf("  forward    %10.3f ms  %8s TFLOP/s\n", t_f, format_g(fwd_tflops).c_str());
  std::printf("  backward   %10.3f ms  %8s TFLOP/s\n", t_b, format_g(bwd_tflops).c_str());
  std::printf("  fwd+bwd    %10.3f ms  %8s TFLOP/s   (median of %lld after %lld warm-up; %s)\n", t_f + t_b,
              format_g(fb_tflops).c_str(), static_cast<long long>(iters),
              static_cast<long long>(std::max<std::int64_t>(rc.warmup, 1)),
              device.type == DeviceType::cuda ? "CUDA events" : "wall clock");
  std::printf("  check      %s\n", plan.describe(c).c_str());
  print_checks(checks);
  std::printf("  result     %s\n", !plan.enabled ? "not checked" : pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace memeff::cli
