// The dispatcher behind forward, backward, workspace_size and explain (the registry is in
// registry.cpp, the texts it produces in dispatch_report.cpp, the hot path's memory of decisions
// in decision_cache.cpp). explain() and every call that logs or autotunes go through decide():
// resolve the order, collect every backend's reasons, choose (first eligible, or the autotuned
// winner). The hot path (PreparedCall, which forward and backward use) asks the per-thread cache
// first and, on a miss without log or autotune, walks the same order to the first eligible
// backend, which is decide()'s choice too; so what explain() says is exactly what a call does.
#include "core/dispatch_decision.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/decision_cache.h"
#include "core/visible_keys.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using detail::device_type_name;
using detail::format_ms;
using detail::join;
using detail::log_decision;
using detail::registry_snapshot;
using detail::throw_unsupported;

// The ScopedBackends of this thread, outermost first.
thread_local std::vector<std::vector<std::string>> t_guard_stack;

// MEMEFF_BACKENDS as a list of registered names; empty when unset or blank. A name that is not
// registered is an error naming the variable (a typo must not silently change the order).
std::vector<std::string> env_backends(const std::vector<std::shared_ptr<Backend>>& registered) {
  const char* raw = std::getenv("MEMEFF_BACKENDS");
  if (!raw) return {};
  std::vector<std::string> names;
  std::string item;
  std::istringstream in(raw);
  while (std::getline(in, item, ',')) {
    const auto first = item.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    const auto last = item.find_last_not_of(" \t");
    names.push_back(item.substr(first, last - first + 1));
  }
  std::vector<std::string> known;
  for (const auto& b : registered) known.push_back(b->name());
  for (const std::string& name : names) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw Error(ErrorCode::invalid_argument,
                  "MEMEFF_BACKENDS=\"" + std::string(raw) + "\": \"" + name +
                      "\" is not a registered backend; registered backends: " + join(known));
    }
  }
  return names;
}

// Every reason `backend` cannot run the problem, the device mismatch included.
std::vector<std::string> reasons_for(const Backend& backend, const Problem& problem, Pass pass) {
  if (backend.device_type() != problem.device.type) {
    return {std::string("runs on ") + device_type_name(backend.device_type()) +
            ", the tensors are on " + device_name(problem.device)};
  }
  std::vector<std::string> reasons;
  if (problem.has_global_coordinates() && !backend.supports_global_coordinates()) {
    // A backend that ignores q_start/k_start/kv_block would run the call as a standalone
    // attention: a wrong mask, not an error.
    reasons.push_back(
        "global coordinates (q_start, k_start) and kv_block calls: not supported by this backend "
        "(Backend::supports_global_coordinates)");
  }
  try {
    std::vector<std::string> own = backend.reasons_unsupported(problem, pass);
    reasons.insert(reasons.end(), own.begin(), own.end());
  } catch (const std::exception& e) {
    reasons.push_back(std::string("could not check the problem: ") + e.what());
  }
  return reasons;
}

}  // namespace

ScopedBackends::ScopedBackends(std::vector<std::string> order) {
  if (order.empty()) {
    throw Error(ErrorCode::invalid_argument,
                "argument `order` of ScopedBackends: expected at least one backend name");
  }
  t_guard_stack.push_back(std::move(order));
}

ScopedBackends::~ScopedBackends() { t_guard_stack.pop_back(); }

namespace detail {

// Whether a CUDA forward is decode-like (few query rows per kv head over many keys), where the
// split-KV forward beats the fused kernels; `why` says so with the numbers. The fused forwards
// tile 128 query rows of one head per CTA: with group·Lq rows per kv head at most
// kSplitKvMaxRows, most MMA rows are padding, each kv head's K/V is read once per query head,
// and only B·Hq CTAs run. Thresholds to be tuned from bench/splitkv_decode.sh (issue 24).
constexpr std::int64_t kSplitKvMaxRows = 64;         // Lq·Hq/Hkv
constexpr std::int64_t kSplitKvMinKeys = 512;        // below, one fused CTA per head is short
constexpr std::int64_t kSplitKvMaxFusedCtas = 4096;  // above, the fused grid fills the GPU
// Without GQA the fused forward reads each K/V once too, and a grid of a few waves is as fast:
// measured on an H100, 16 x 16 heads, one query over 4096 keys, hd 64 (256 fused CTAs) ran in
// 0.104 ms fused and 0.111 ms split (docs/benchmarks.md), so one query head per kv head takes the
// split path only while the fused grid is under one wave of an H100's 132 SMs.
constexpr std::int64_t kSplitKvMhaMaxFusedCtas = 128;
// The keys the heuristic counts: Lk, or with a sliding window those some query of the call sees
// (the first query's left edge to the last one's right edge): both the fused and the split-KV
// forward visit only those, so a short window over a long cache is a short call.
std::int64_t split_kv_keys(const Problem& p) {
  if (!p.has_window()) return p.Lk;
  return visible_key_span_of_rows(0, p.Lq - 1, p.Lk, p.causal != CausalMode::none,
                                  p.position_shift(), p.window_left, p.window_right)
      .size();
}
bool prefers_split_kv(const Problem& p, std::string& why) {
  if (p.packed || p.Hkv <= 0 || p.Lq <= 0) return false;
  const std::int64_t rows = p.Lq * p.group_size();
  const std::int64_t fused_ctas = p.B * p.Hq * ((p.Lq + 127) / 128);
  const std::int64_t keys = split_kv_keys(p);
  if (rows > kSplitKvMaxRows || keys < kSplitKvMinKeys || fused_ctas > kSplitKvMaxFusedCtas ||
      (p.group_size() == 1 && fused_ctas > kSplitKvMhaMaxFusedCtas)) {
    return false;
  }
  const std::string over =
      p.has_window() ? std::to_string(keys) +
                           " keys the window leaves visible (Lk = " + std::to_string(p.Lk) + ")"
                     : "Lk = " + std::to_string(p.Lk);
  why = "few queries per kv head (Lq·Hq/Hkv = " + std::to_string(rows) +
        " <= " + std::to_string(kSplitKvMaxRows) + " rows over " + over +
        " >= " + std::to_string(kSplitKvMinKeys) + " keys; the fused forwards would launch " +
        std::to_string(fused_ctas) + " CTAs of 128 rows): the split-KV forward first, then ";
  return true;
}

HeuristicOrder default_order(const Problem& problem, Pass pass) {
  HeuristicOrder h;
  if (problem.device.type == DeviceType::cuda) {
    // The Hopper-native kernels ("cuda_sm90": TMA, wgmma, warp specialization) lead where they
    // run (compute capability 9.0; above head dim 128 the backward without a bias or modifiers);
    // then the fused mma.sync kernels ("cuda"), which never materialize Lq×Lk and beat cuda_math
    // on every shape measured, down to 32×32 scores (docs/benchmarks.md: 0.011 ms against
    // cuda_math's 0.143 ms forward on the H200). cuda_math (cuBLAS + softmax kernel, fp32 Lq×Lk
    // buffers) is the fallback for what the fused kernels refuse (fp32 inputs, head dims they do
    // not instantiate, misaligned strides). The split-KV forward ("cuda_splitkv", forward only)
    // leads for decode-like forwards and is last otherwise. MEMEFF_AUTOTUNE=1 measures each shape
    // instead.
    h.order = {"cuda_sm90", "cuda", "cuda_math"};
    h.why = "Hopper kernels first, then the mma.sync kernels, cuda_math as the fallback";
    std::string split_why;
    if (pass == Pass::forward && prefers_split_kv(problem, split_why)) {
      h.order.insert(h.order.begin(), "cuda_splitkv");
      h.why = split_why + h.why;
    } else {
      h.order.push_back("cuda_splitkv");
      h.why += "; cuda_splitkv last (" +
               std::string(pass == Pass::forward ? "it leads only for few queries per kv head"
                                                 : "forward only") +
               ")";
    }
  } else {
    // The tiled cpu backend first; the double-precision reference supports everything and is
    // the last resort.
    h.order = {"cpu", "reference"};
    h.why = "tiled cpu backend first, the reference as the fallback";
  }
  // Other backends registered for this device (plug-ins, tests' fakes) come after the built-ins.
  for (const auto& b : registry_snapshot()) {
    if (b->device_type() == problem.device.type &&
        std::find(h.order.begin(), h.order.end(), b->name()) == h.order.end()) {
      h.order.push_back(b->name());
    }
  }
  return h;
}

ResolvedOrder resolve_order(const Problem& problem, Pass pass, const Options& options,
                            const std::vector<std::shared_ptr<Backend>>& registered) {
  ResolvedOrder r;
  if (!options.backends.empty()) {
    r.order = options.backends;
    r.source = "options";
  } else if (!t_guard_stack.empty()) {
    r.order = t_guard_stack.back();
    r.source = "scoped guard";
  } else if (std::vector<std::string> env = env_backends(registered); !env.empty()) {
    r.order = std::move(env);
    r.source = "MEMEFF_BACKENDS";
  } else {
    HeuristicOrder h = default_order(problem, pass);
    r.order = std::move(h.order);
    r.heuristic_why = std::move(h.why);
    r.source = "default";
  }
  return r;
}

Decision decide(const Problem& problem, Pass pass, const Options& options) {
  const std::vector<std::shared_ptr<Backend>> registered = registry_snapshot();
  Decision d;
  Explanation& ex = d.explanation;
  ex.problem = problem;
  ex.pass = pass;

  ResolvedOrder resolved = resolve_order(problem, pass, options, registered);
  ex.order = std::move(resolved.order);
  ex.order_source = std::move(resolved.source);
  const std::string heuristic_why = std::move(resolved.heuristic_why);
  const bool user = ex.order_source != "default";

  auto lookup = [&](const std::string& name) -> std::shared_ptr<Backend> {
    for (const auto& b : registered) {
      if (b->name() == name) return b;
    }
    return nullptr;
  };
  std::vector<std::string> walked;  // dedup: a name listed twice is walked once
  std::vector<std::string> skipped;
  for (const std::string& name : ex.order) {
    if (std::find(walked.begin(), walked.end(), name) != walked.end()) continue;
    walked.push_back(name);
    BackendReport report;
    report.name = name;
    if (std::shared_ptr<Backend> backend = lookup(name)) {
      report.reasons = reasons_for(*backend, problem, pass);
      if (report.reasons.empty()) d.eligible.push_back(backend);
    } else {
      report.reasons = {"not a registered backend of this build"};
    }
    report.eligible = report.reasons.empty();
    if (!report.eligible && d.eligible.empty()) skipped.push_back(name);
    ex.backends.push_back(std::move(report));
  }
  // Registered backends outside the order: reported too, with why they were not walked.
  for (const auto& backend : registered) {
    if (std::find(walked.begin(), walked.end(), backend->name()) != walked.end()) continue;
    BackendReport report;
    report.name = backend->name();
    std::vector<std::string> own = reasons_for(*backend, problem, pass);
    if (user) {
      report.reasons.push_back("not in the backend list of " + ex.order_source);
    } else if (own.empty()) {
      report.reasons.push_back("not in the default order");
    }
    report.reasons.insert(report.reasons.end(), own.begin(), own.end());
    ex.backends.push_back(std::move(report));
  }

  if (d.eligible.empty()) {
    ex.reason = "no backend qualifies";
    return d;
  }
  d.backend = d.eligible.front();
  ex.chosen = d.backend->name();
  std::string why = user ? "user restriction (" + ex.order_source +
                               "): first eligible in the "
                               "given order"
                         : "first eligible in the default order (" + heuristic_why + ")";
  if (!skipped.empty()) why += "; skipped " + join(skipped) + " (see their reasons)";

  ex.autotune = autotune_enabled(options);
  if (ex.autotune) {
    std::vector<std::string> names;
    for (const auto& b : d.eligible) names.push_back(b->name());
    ex.key = tune_key(problem, pass, d.eligible);
    if (d.eligible.size() == 1) {
      why += "; autotune: only one candidate, nothing to time";
    } else if (std::optional<TuneEntry> hit = autotune_lookup(ex.key);
               hit && lookup(hit->backend) &&
               std::find(names.begin(), names.end(), hit->backend) != names.end()) {
      d.backend = lookup(hit->backend);
      ex.chosen = hit->backend;
      ex.timings = hit->candidates;
      std::vector<std::string> parts;
      for (const CandidateTime& c : hit->candidates)
        parts.push_back(c.backend + " " + format_ms(c.ms));
      why = "autotune result (remembered): fastest of " + join(parts);
    } else {
      d.tune_pending = true;
      why += "; autotune is on: the first call with this shape times " + join(names) +
             " and keeps the fastest";
    }
  }
  ex.reason = why;
  return d;
}

void finish_tune(Decision& d, const Problem& problem, Pass pass, const Options& options,
                 const PassRunner& run) {
  Explanation& ex = d.explanation;
  const TuneOutcome outcome = autotune_time(problem, pass, ex.key, d.eligible, options, run);
  if (!outcome.entry.backend.empty()) {
    autotune_record(outcome.entry);
    for (const auto& b : d.eligible) {
      if (b->name() == outcome.entry.backend) d.backend = b;
    }
    ex.chosen = outcome.entry.backend;
    ex.timings = outcome.entry.candidates;
    std::vector<std::string> parts;
    for (const CandidateTime& c : ex.timings) parts.push_back(c.backend + " " + format_ms(c.ms));
    ex.reason = "autotune result: fastest of " + join(parts) + " (median of " +
                std::to_string(kAutotuneRepeats) + " after " + std::to_string(kAutotuneWarmups) +
                " warm-ups)";
    if (!outcome.failures.empty()) ex.reason += "; failed while timed: " + join(outcome.failures);
  } else {
    ex.reason += "; autotune: every candidate failed while timed (" + join(outcome.failures) +
                 "), keeping the first";
  }
  d.tune_pending = false;
}

namespace {

// MEMEFF_BACKENDS when it names anything: items are split at ',' and trimmed of blanks, so a
// text of only ',', ' ' and '\t' is as if unset (env_backends agrees).
const char* env_order_text() {
  const char* raw = std::getenv("MEMEFF_BACKENDS");
  if (!raw || raw[std::strspn(raw, ", \t")] == '\0') return nullptr;
  return raw;
}

// The order a call walks, named without being built (decide() builds it in the same priority).
OrderRef order_ref(const Options& options) {
  if (!options.backends.empty()) return {OrderSource::options, &options.backends, nullptr};
  if (!t_guard_stack.empty()) return {OrderSource::scoped_guard, &t_guard_stack.back(), nullptr};
  if (const char* env = env_order_text()) return {OrderSource::environment, nullptr, env};
  return {};
}

// decide()'s choice without its report: the first backend of the order with no reasons, or null.
std::shared_ptr<Backend> first_eligible(const Problem& problem, Pass pass, const Options& options) {
  const std::vector<std::shared_ptr<Backend>> registered = registry_snapshot();
  const ResolvedOrder resolved = resolve_order(problem, pass, options, registered);
  for (const std::string& name : resolved.order) {
    for (const auto& backend : registered) {
      if (backend->name() != name) continue;
      if (reasons_for(*backend, problem, pass).empty()) return backend;
      break;
    }
  }
  return nullptr;
}

std::size_t largest_workspace(const Decision& d, const Problem& problem, Pass pass) {
  std::size_t bytes = 0;
  for (const auto& b : d.eligible) bytes = std::max(bytes, b->workspace_bytes(problem, pass));
  return bytes;
}

}  // namespace
}  // namespace detail

// Autotune's state between choose() and run(): the full decision, whose candidates run() times.
struct PreparedCall::PendingTune {
  detail::Decision decision;
};

PreparedCall::PreparedCall(Pass pass, const AttentionArgs& args, Options options)
    : pass_(pass), args_(args), options_(std::move(options)) {}

PreparedCall::PreparedCall(PreparedCall&&) noexcept = default;
PreparedCall& PreparedCall::operator=(PreparedCall&&) noexcept = default;
PreparedCall::~PreparedCall() = default;

// The hot path: the cached decision of this signature, else the first eligible backend (or, with
// the log or autotune on, the full decision, logged), remembered for the next call.
void PreparedCall::choose(bool may_tune) {
  using namespace detail;
  const OrderRef order = order_ref(options_);
  const bool tune = autotune_enabled(options_);
  const bool log = log_dispatch_enabled();
  const DecisionKey key = decision_key(problem_, pass_, order, tune, log);
  if (const CachedDecision* hit = cached_decision(key, order)) {
    backend_ = hit->backend;
    workspace_bytes_ = hit->workspace_bytes;
    return;
  }
  const std::uint64_t generation = decision_generation();
  if (!tune && !log) {
    backend_ = first_eligible(problem_, pass_, options_);
    if (!backend_) throw_unsupported(decide(problem_, pass_, options_).explanation);
  } else {
    Decision d = decide(problem_, pass_, options_);
    if (!d.backend) throw_unsupported(d.explanation);
    backend_ = d.backend;
    if (d.tune_pending) {
      workspace_bytes_ = largest_workspace(d, problem_, pass_);
      if (may_tune) {
        pending_ = std::make_unique<PendingTune>(PendingTune{std::move(d)});
      } else {
        log_decision(d.explanation);  // nothing to time with: the first eligible runs
      }
      return;  // remembered once a tune has chosen
    }
    log_decision(d.explanation);
  }
  workspace_bytes_ = backend_->workspace_bytes(problem_, pass_);
  remember_decision(key, order, {backend_, workspace_bytes_}, generation);
}

PreparedCall PreparedCall::forward(const AttentionArgs& args, const TensorView& out,
                                   const TensorView& lse, Options options) {
  PreparedCall call(Pass::forward, args, std::move(options));
  call.problem_ = validate_forward(args, out, lse);
  call.out_ = out;
  call.lse_ = lse;
  const Problem& p = call.problem_;
  call.compute_ = p.B * p.Hq * p.Lq != 0;
  // Timing a candidate runs it on the caller's own out and lse; the winner's run overwrites them.
  call.choose(call.compute_ && p.Lk != 0);
  return call;
}

PreparedCall PreparedCall::backward(const AttentionArgs& args, const BackwardTensors& grads,
                                    Options options) {
  PreparedCall call(Pass::backward, args, std::move(options));
  call.problem_ = validate_backward(args, grads);
  call.grads_ = grads;
  const Problem& p = call.problem_;
  // The backward is timed on its own (its key says pass=backward) and writes only dq, dk, dv and
  // dbias, which the winner's run overwrites. Since every backend's out and lse are the same
  // function, the fastest forward and the fastest backward may differ and still pair up.
  call.choose(p.B * p.Hq * p.Lq * p.Lk != 0);
  return call;
}

std::string PreparedCall::backend() const { return backend_->name(); }

CallInfo PreparedCall::run(void* workspace, std::size_t workspace_bytes) {
  if (workspace != nullptr) {
    options_.workspace = workspace;
    options_.workspace_bytes = workspace_bytes;
  }
  if (pending_) {
    detail::Decision& d = pending_->decision;
    const detail::PassRunner runner = [&](Backend& backend, const Options& o) {
      if (pass_ == Pass::forward) {
        backend.forward(problem_, args_, out_, lse_, o);
      } else {
        backend.backward(problem_, args_, grads_, o);
      }
    };
    detail::finish_tune(d, problem_, pass_, options_, runner);
    detail::log_decision(d.explanation);
    backend_ = d.backend;
    workspace_bytes_ = backend_->workspace_bytes(problem_, pass_);
    pending_.reset();
    // Remembered under the generation after autotune_record (which starts a new one).
    const detail::OrderRef order = detail::order_ref(options_);
    const detail::DecisionKey key =
        detail::decision_key(problem_, pass_, order, true, detail::log_dispatch_enabled());
    detail::remember_decision(key, order, {backend_, workspace_bytes_},
                              detail::decision_generation());
  }
  CallInfo info;
  info.backend = backend_->name();
  info.p_effective = problem_.dropout.p_effective;
  if (!compute_) return info;
  if (pass_ == Pass::forward) {
    backend_->forward(problem_, args_, out_, lse_, options_);
  } else {
    backend_->backward(problem_, args_, grads_, options_);
  }
  return info;
}

Explanation explain(const AttentionArgs& args, Pass pass, const Options& options) {
  const Problem problem = validate_inputs(args);
  return detail::decide(problem, pass, options).explanation;
}

CallInfo forward(const AttentionArgs& args, const TensorView& out, const TensorView& lse,
                 const Options& options) {
  return PreparedCall::forward(args, out, lse, options).run();
}

CallInfo backward(const AttentionArgs& args, const BackwardTensors& grads, const Options& options) {
  return PreparedCall::backward(args, grads, options).run();
}

std::size_t workspace_size(const AttentionArgs& args, Pass pass, const Options& options) {
  // The decision of the pass these arguments make, without its output views: validate_inputs
  // yields the Problem a forward or backward of them would yield (outputs only add checks).
  PreparedCall call(pass, args, options);
  call.problem_ = validate_inputs(args);
  call.choose(false);  // a tune still to come: the largest need of the candidates
  return call.workspace_bytes();
}

}  // namespace memeff
