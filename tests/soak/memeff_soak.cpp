// The soak run: thousands of random attention calls through the public API (shapes, GQA groups,
// causal modes, dropout, bias, packed sequences, layouts, workspaces; forward only or forward
// and backward) on the named backends, with every output scanned for NaN and infinities, every
// K-th call checked against the `reference` backend, and device memory and host RSS read after a
// warm-up and at the end: a failure or growth beyond a small slack exits 1, naming the call with
// every drawn parameter and the command line that replays it. docs/testing.md describes it.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_args.h"
#include "cli_device.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"
#include "memeff/error.h"
#include "soak_call.h"
#include "soak_check.h"

namespace memeff::soak {

namespace {

using Clock = std::chrono::steady_clock;

struct SoakConfig {
  std::string backends = "auto";
  std::int64_t calls = 10000;
  std::int64_t check_every = 10;
  std::uint64_t seed = 1;
  std::int64_t max_seconds = 0;  // 0: no limit
  Limits limits;
  bool small = false;
  std::int64_t warmup = 100;
  std::int64_t slack_mib = 64;
  double check_max_work = 1 << 24;
  std::optional<std::int64_t> replay;
  std::int64_t max_failures = 10;
  bool verbose = false;
};

// The limits of --small: short calls that a CPU soaks through quickly.
constexpr Limits kSmall{64, 64, 1 << 14, 2, 2};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Resident host memory (/proc/self/statm), after handing freed heap pages back to the system so
// that only live memory counts; 0 where /proc is missing.
double rss_mib() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  std::ifstream statm("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0.0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// Free device memory of cuda:0 after the queued work; 0 without a CUDA backend in the run.
double device_free_mib(bool cuda) {
  if (!cuda) return 0.0;
  cli::synchronize(Device::cuda(0));
  return static_cast<double>(cli::device_free_bytes(Device::cuda(0))) / (1 << 20);
}

// A reason with its numbers replaced by '#', so that reasons of one kind are counted together.
std::string reason_kind(const std::string& reason) {
  std::string s;
  for (char c : reason) {
    if (c >= '0' && c <= '9') {
      if (s.empty() || s.back() != '#') s += '#';
    } else {
      s += c;
    }
  }
  return s;
}

// The backends of --backend; "auto": cuda and cuda_sm90 where the dispatcher would run them on
// cuda:0 (a small bf16 problem, explained without running), else cpu.
std::vector<std::string> resolve_backends(const std::string& text) {
  if (text != "auto") {
    std::vector<std::string> names = cli::split(text, ',');
    for (const std::string& name : names) {
      if (!find_backend(name)) {
        std::string known;
        for (const std::string& b : backend_names()) known += (known.empty() ? "" : ", ") + b;
        throw cli::UsageError("--backend: unknown backend `" + name + "` (this build has " + known +
                              ")");
      }
      if (find_backend(name)->device_type() == DeviceType::cuda) {
        const cli::CudaStatus cuda = cli::cuda_status();
        if (!cuda.why_not.empty()) {
          throw Error(ErrorCode::cuda_error, "--backend " + name + ": " + cuda.why_not);
        }
      }
    }
    return names;
  }
  if (!cli::cuda_status().why_not.empty()) return {"cpu"};
  alignas(256) static unsigned char placeholder[3][256];
  AttentionArgs a;
  const std::vector<std::int64_t> dims{1, 1, 64, 64};
  a.q = view_of(placeholder[0], DType::bf16, Device::cuda(0), dims);
  a.k = view_of(placeholder[1], DType::bf16, Device::cuda(0), dims);
  a.v = view_of(placeholder[2], DType::bf16, Device::cuda(0), dims);
  std::vector<std::string> names;
  for (const char* name : {"cuda", "cuda_sm90"}) {
    Options o;
    o.backends = {name};
    if (find_backend(name) && explain(a, Pass::backward, o).chosen == name) names.push_back(name);
  }
  if (names.empty())
    throw Error(ErrorCode::unsupported, "--backend auto: no fused CUDA backend runs on cuda:0");
  return names;
}

// What the run saw, for the progress lines and the summary.
struct Tally {
  std::int64_t calls = 0, backward = 0, packed = 0, bias = 0, dropout = 0, blhd = 0, misaligned = 0,
               deterministic = 0, caller_workspace = 0;
  std::map<std::string, std::int64_t> backends, dtypes, causal;
  std::int64_t redraws = 0;
  std::map<std::string, std::int64_t> redraw_reasons;
  std::int64_t checks = 0, partial_checks = 0, deferred_checks = 0;
  std::map<std::string, std::pair<double, std::uint64_t>> worst;  // output -> (err/bound, call)
  std::int64_t failures = 0;
  double call_seconds = 0.0, check_seconds = 0.0;

  void count(const CallSpec& s) {
    ++calls;
    backward += s.backward;
    packed += s.packed;
    bias += s.has_bias();
    dropout += s.dropout > 0.0;
    blhd += s.blhd;
    misaligned += s.misaligned;
    deterministic += s.deterministic;
    caller_workspace += s.caller_workspace;
    ++backends[s.backend];
    ++dtypes[dtype_name(s.dtype)];
    ++causal[causal_mode_name(s.causal)];
  }
};

std::string counts_text(const std::map<std::string, std::int64_t>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k + " " + std::to_string(v);
  return s;
}

// Under AddressSanitizer freed memory waits in a quarantine of up to 256 MiB, and under
// ThreadSanitizer shadow memory and per-thread histories grow with what was touched, so RSS grows
// without a leak: the host criterion is skipped there (LeakSanitizer checks leaks at exit).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kRssMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kRssMeaningful = false;
#else
constexpr bool kRssMeaningful = true;
#endif
#else
constexpr bool kRssMeaningful = true;
#endif

// The memory readings after the warm-up and now.
struct Memory {
  bool cuda = false;
  bool measured = false;  // the baseline is taken
  double device_base = 0.0, rss_base = 0.0;
  double device_now = 0.0, rss_now = 0.0;
  double device_drop() const { return device_base - device_now; }
  double rss_growth() const { return rss_now - rss_base; }
  void baseline() {
    device_base = device_now = device_free_mib(cuda);
    rss_base = rss_now = rss_mib();
    measured = true;
  }
  void read() {
    device_now = device_free_mib(cuda);
    rss_now = rss_mib();
  }
  std::string text() const {
    char buf[200];
    if (!measured) return "memory: baseline after the warm-up";
    std::string device;
    if (cuda) {
      std::snprintf(buf, sizeof buf, "device free %.1f MiB (%+.1f MiB), ", device_now,
                    device_now - device_base);
      device = buf;
    }
    std::snprintf(buf, sizeof buf, "%shost RSS %.1f MiB (%+.1f MiB%s)", device.c_str(), rss_now,
                  rss_growth(), kRssMeaningful ? "" : ", not judged under AddressSanitizer");
    return buf;
  }
};

class Soak {
 public:
  Soak(const SoakConfig& cfg, std::vector<std::string> backends, std::string replay_command)
      : cfg_(cfg),
        backends_(std::move(backends)),
        replay_command_(std::move(replay_command)),
        pools_(cfg.seed, 5 * cfg.limits.max_elements + cfg.limits.max_elements / 2 + 64) {
    for (const std::string& name : backends_) {
      if (find_backend(name)->device_type() != DeviceType::cuda) continue;
      memory_.cuda = true;
      for (DType dtype : {DType::f32, DType::f16, DType::bf16})
        pools_.prepare(dtype, Device::cuda(0));
    }
  }

  int run() {
    const Clock::time_point t0 = Clock::now();
    const std::int64_t first = cfg_.replay.value_or(0);
    const std::int64_t end = cfg_.replay ? first + 1 : cfg_.calls;
    const std::int64_t progress_every = std::max<std::int64_t>(1, cfg_.calls / 10);
    bool check_due = false;
    std::string stopped;
    if (!cfg_.replay && cfg_.warmup == 0) memory_.baseline();
    for (std::int64_t i = first; i < end; ++i) {
      if (cfg_.max_seconds > 0 && seconds_since(t0) > static_cast<double>(cfg_.max_seconds)) {
        stopped = "stopped by --max-seconds " + std::to_string(cfg_.max_seconds) + " after " +
                  std::to_string(tally_.calls) + " calls";
        break;
      }
      check_due = check_due || cfg_.replay || i % cfg_.check_every == 0;
      const bool stop = !one_call(static_cast<std::uint64_t>(i), check_due);
      if (!cfg_.replay && tally_.calls == cfg_.warmup) memory_.baseline();
      if (!cfg_.replay && (tally_.calls % progress_every == 0 || stop)) progress(t0);
      if (stop) {
        stopped = device_lost_ ? "stopped: a CUDA error leaves the device unusable"
                               : "stopped after " + std::to_string(tally_.failures) + " failures";
        break;
      }
    }
    bool memory_ok = true;
    if (memory_.measured && !device_lost_) {
      memory_.read();
      memory_ok = memory_.device_drop() <= static_cast<double>(cfg_.slack_mib) &&
                  (!kRssMeaningful || memory_.rss_growth() <= static_cast<double>(cfg_.slack_mib));
    }
    summary(seconds_since(t0), stopped, memory_ok);
    return tally_.failures == 0 && memory_ok ? 0 : 1;
  }

 private:
  // Draws call `index` (redrawing what its backend cannot run), runs it, scans it and checks it
  // when due. False when the run must stop.
  bool one_call(std::uint64_t index, bool& check_due) {
    std::mt19937_64 gen = call_generator(cfg_.seed, index);
    std::optional<CallSpec> spec;
    std::optional<CallTensors> t;
    Options options;
    for (int attempt = 0; attempt < 1000 && !spec; ++attempt) {
      CallSpec s = draw_call(backends_, cfg_.limits, pools_.elements(), index, gen);
      CallTensors candidate(s, pools_);
      options = Options{};
      options.backends = {s.backend};
      options.deterministic = s.deterministic;
      std::string why;
      try {
        for (Pass pass : {Pass::forward, Pass::backward}) {
          if (pass == Pass::backward && !s.backward) break;
          const Explanation ex = explain(candidate.args, pass, options);
          if (ex.chosen == s.backend) continue;
          for (const BackendReport& r : ex.backends) {
            if (r.name == s.backend && !r.reasons.empty()) why = r.reasons.front();
          }
          if (why.empty()) why = "not chosen: " + ex.reason;
          break;
        }
      } catch (const Error& e) {
        return fail(s, std::string("explain() refused the drawn call: ") + e.what(), {});
      }
      if (why.empty()) {
        spec = std::move(s);
        t.emplace(std::move(candidate));
      } else {
        ++tally_.redraws;
        ++tally_.redraw_reasons[reason_kind(why)];
        if (cfg_.verbose) std::printf("redraw %s: %s\n", s.describe().c_str(), why.c_str());
      }
    }
    if (!spec)
      throw Error(ErrorCode::internal, "soak: call " + std::to_string(index) +
                                           ": 1000 redraws, none runs on the backends asked for");
    const CallSpec& s = *spec;
    tally_.count(s);
    if (cfg_.verbose || cfg_.replay) std::printf("%s\n", s.describe().c_str());

    const Clock::time_point c0 = Clock::now();
    std::optional<CallOutputs> outputs;
    try {
      t->allocate_outputs(s);
      std::vector<std::string> wrong;
      auto run_pass = [&](Pass pass) {
        Options o = options;
        cli::Buffer workspace;
        if (s.caller_workspace) {
          workspace = cli::Buffer(s.device, workspace_size(t->args, pass, o));
          o.workspace = workspace.data();
          o.workspace_bytes = workspace.bytes();
        }
        const CallInfo info = pass == Pass::forward ? forward(t->args, t->out.view, t->lse.view, o)
                                                    : backward(t->args, t->grads(), o);
        if (info.backend != s.backend) {
          wrong.push_back(std::string(pass == Pass::forward ? "forward" : "backward") + " ran on " +
                          info.backend);
        }
        if (s.device.type == DeviceType::cuda) cli::synchronize(s.device);
      };
      run_pass(Pass::forward);
      if (s.backward) run_pass(Pass::backward);
      outputs.emplace(*t);
      tally_.call_seconds += seconds_since(c0);
      if (!wrong.empty())
        return fail(s, "the dispatcher did not honour Options::backends: " + wrong.front(), {});
    } catch (const Error& e) {
      tally_.call_seconds += seconds_since(c0);
      device_lost_ = e.code() == ErrorCode::cuda_error;
      return fail(s, std::string(error_code_name(e.code())) + ": " + e.what(), {}) && !device_lost_;
    }

    const std::string nonfinite = first_nonfinite(*outputs);
    if (!nonfinite.empty() || check_due) {
      // A call with a value no correct call writes is compared in full (or as much as 16x the
      // budget allows), whatever the sampling.
      const double budget = cfg_.check_max_work * (nonfinite.empty() ? 1.0 : 16.0);
      const std::optional<CheckPlan> plan = plan_check(s, budget);
      if (!plan) {
        ++tally_.deferred_checks;  // too large to check: the next call is checked instead
        if (cfg_.verbose || cfg_.replay) {
          std::printf("  not checked: larger than --check-max-work %g\n", budget);
        }
      } else {
        check_due = false;
        const Clock::time_point k0 = Clock::now();
        std::vector<Comparison> results;
        try {
          results = check_against_reference(s, *t, *outputs, *plan);
        } catch (const Error& e) {
          return fail(s, std::string("the reference check threw: ") + e.what(), {});
        }
        tally_.check_seconds += seconds_since(k0);
        ++tally_.checks;
        tally_.partial_checks += !plan->whole;
        bool pass = nonfinite.empty();
        for (const Comparison& c : results) {
          pass = pass && c.pass();
          auto& w = tally_.worst[c.name];
          if (c.ratio() > w.first || w.second == 0) w = {c.ratio(), s.index};
        }
        if (cfg_.verbose || cfg_.replay) {
          std::printf("  checked %s\n", plan->describe(s).c_str());
          for (const Comparison& c : results) std::printf("    %s\n", c.describe().c_str());
        }
        if (!pass) {
          return fail(s,
                      nonfinite.empty() ? "differs from the reference (" + plan->describe(s) + ")"
                                        : nonfinite,
                      results);
        }
        return true;
      }
    }
    if (!nonfinite.empty()) return fail(s, nonfinite + " (too large to compare)", {});
    return true;
  }

  // Reports a failed call; false when the run must stop (too many failures).
  bool fail(const CallSpec& s, const std::string& what, const std::vector<Comparison>& results) {
    ++tally_.failures;
    std::fprintf(stderr, "soak: FAIL %s\n  %s\n", s.describe().c_str(), what.c_str());
    for (const Comparison& c : results) std::fprintf(stderr, "    %s\n", c.describe().c_str());
    std::fprintf(stderr, "  replay: %s --replay %llu\n", replay_command_.c_str(),
                 static_cast<unsigned long long>(s.index));
    return tally_.failures < cfg_.max_failures;
  }

  void progress(Clock::time_point t0) {
    if (memory_.measured && !device_lost_) memory_.read();
    std::fprintf(stderr,
                 "soak: %lld/%lld calls, %lld checks, %lld failures, %lld redraws, %.1f s; %s\n",
                 static_cast<long long>(tally_.calls), static_cast<long long>(cfg_.calls),
                 static_cast<long long>(tally_.checks), static_cast<long long>(tally_.failures),
                 static_cast<long long>(tally_.redraws), seconds_since(t0), memory_.text().c_str());
  }

  void summary(double seconds, const std::string& stopped, bool memory_ok) {
    const Tally& t = tally_;
    std::printf(
        "memeff soak: %lld calls on %s in %.1f s (calls %.1f s, reference checks %.1f s)%s\n",
        static_cast<long long>(t.calls), counts_text(t.backends).c_str(), seconds, t.call_seconds,
        t.check_seconds, stopped.empty() ? "" : ("; " + stopped).c_str());
    std::printf(
        "  drawn      %lld fwd+bwd, %lld packed, %lld bias, %lld dropout, %lld blhd, %lld "
        "misaligned, "
        "%lld deterministic, %lld caller workspace\n",
        static_cast<long long>(t.backward), static_cast<long long>(t.packed),
        static_cast<long long>(t.bias), static_cast<long long>(t.dropout),
        static_cast<long long>(t.blhd), static_cast<long long>(t.misaligned),
        static_cast<long long>(t.deterministic), static_cast<long long>(t.caller_workspace));
    std::printf("  dtypes     %s; causal %s\n", counts_text(t.dtypes).c_str(),
                counts_text(t.causal).c_str());
    std::printf("  redraws    %lld (the backend refused the drawn call)\n",
                static_cast<long long>(t.redraws));
    std::vector<std::pair<std::int64_t, std::string>> reasons;
    for (const auto& [why, n] : t.redraw_reasons) reasons.emplace_back(n, why);
    std::sort(reasons.rbegin(), reasons.rend());
    for (std::size_t i = 0; i < reasons.size() && i < 8; ++i) {
      std::printf("    %6lld  %s\n", static_cast<long long>(reasons[i].first),
                  reasons[i].second.c_str());
    }
    std::printf(
        "  checks     %lld against the reference (%lld on a sub-problem; %lld deferred: too "
        "large)\n",
        static_cast<long long>(t.checks), static_cast<long long>(t.partial_checks),
        static_cast<long long>(t.deferred_checks));
    std::string worst;
    for (const auto& [name, w] : t.worst) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s%s %.3g (call %llu)", worst.empty() ? "" : ", ",
                    name.c_str(), w.first, static_cast<unsigned long long>(w.second));
      worst += buf;
    }
    if (!worst.empty()) std::printf("  worst err/tolerance  %s\n", worst.c_str());
    if (memory_.measured) {
      std::printf("  memory     after %lld warm-up calls and at the end: %s; slack %lld MiB: %s\n",
                  static_cast<long long>(cfg_.warmup), memory_.text().c_str(),
                  static_cast<long long>(cfg_.slack_mib), memory_ok ? "ok" : "GROWTH");
    } else if (!cfg_.replay) {
      std::printf("  memory     not measured (%lld calls, warm-up %lld)\n",
                  static_cast<long long>(t.calls), static_cast<long long>(cfg_.warmup));
    }
    std::printf("  failures   %lld\n  result     %s\n", static_cast<long long>(t.failures),
                t.failures == 0 && memory_ok ? "PASS" : "FAIL");
  }

  SoakConfig cfg_;
  std::vector<std::string> backends_;
  std::string replay_command_;
  InputPools pools_;
  Tally tally_;
  Memory memory_;
  bool device_lost_ = false;  // a CUDA error: no further call (or memory reading) can run
};

int soak_main(int argc, char** argv) {
  // Every kernel image is loaded when the CUDA context starts, so that device memory after the
  // warm-up does not grow as kernels are first used (the runtime's default loads them lazily).
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  SoakConfig cfg;
  std::optional<std::int64_t> max_len, max_head_dim, max_elements, max_kv_heads, max_batch;
  CLI::App app(
      "memeff_soak: random attention calls on the named backends, sampled checks against "
      "the reference, device and host memory before and after",
      "memeff_soak");
  app.add_option(
         "--backend", cfg.backends,
         "backends, comma-separated; each call picks one at random (default auto: cuda and\n"
         "cuda_sm90 where they run on cuda:0, else cpu)")
      ->type_name("LIST");
  using cli::add_checked;
  using cli::integer;
  add_checked(app, "--calls", cfg.calls, "N", integer(1), "calls to make (default 10000)");
  add_checked(app, "--check-every", cfg.check_every, "K", integer(1),
              "compare every K-th call with the reference (default 10; a call too large for\n"
              "--check-max-work passes the check on to the next); calls with a NaN or an infinity\n"
              "in their outputs are always compared");
  add_checked(app, "--seed", cfg.seed, "S", cli::unsigned64(),
              "the run's seed: call i draws from (S, i), inputs from S (default 1)");
  add_checked(app, "--max-seconds", cfg.max_seconds, "T", integer(0),
              "stop drawing calls after T seconds (default 0: no limit)");
  add_checked(app, "--max-len", max_len, "L", integer(1, 1 << 20),
              "longest Lq, Lk and packed sequence (default 1024; --small 64)");
  add_checked(app, "--max-head-dim", max_head_dim, "D", integer(1, 1024),
              "largest D and Dv (default 256; --small 64)");
  add_checked(app, "--max-elements", max_elements, "N", integer(1 << 12, std::int64_t{1} << 28),
              "largest tensor in elements; larger draws shrink (default 4194304; --small 16384)");
  add_checked(app, "--max-kv-heads", max_kv_heads, "H", integer(1, 64),
              "most kv heads; Hq = Hkv x group, group 1, 2, 4 or 8 (default 4; --small 2)");
  add_checked(app, "--max-batch", max_batch, "B", integer(1, 64),
              "largest batch (packed: up to B + 2 sequences) (default 4; --small 2)");
  app.add_flag("--small", cfg.small, "small calls for a quick CPU soak (CI)");
  add_checked(app, "--warmup", cfg.warmup, "N", integer(0),
              "calls before the memory baseline is read (default 100)");
  add_checked(app, "--mem-slack-mib", cfg.slack_mib, "M", integer(0),
              "allowed drop of free device memory and growth of host RSS (default 64)");
  add_checked(app, "--check-max-work", cfg.check_max_work, "W", cli::finite_number(),
              "largest reference check, in Lq*Lk*(D+Dv) summed over heads, x3 with the backward\n"
              "(default 16777216: about 0.1 s; a larger call checks a leading sub-problem)");
  add_checked(app, "--replay", cfg.replay, "I", integer(0),
              "run only call I (as drawn with the same --seed and limits), checked, verbosely");
  add_checked(app, "--max-failures", cfg.max_failures, "N", integer(1),
              "stop after N failures (default 10)");
  app.add_flag("--verbose", cfg.verbose, "print every call (and redraw) on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (cfg.small) cfg.limits = kSmall;
    if (max_len) cfg.limits.max_len = *max_len;
    if (max_head_dim) cfg.limits.max_head_dim = *max_head_dim;
    if (max_elements) cfg.limits.max_elements = *max_elements;
    if (max_kv_heads) cfg.limits.max_kv_heads = *max_kv_heads;
    if (max_batch) cfg.limits.max_batch = *max_batch;
    const std::vector<std::string> backends = resolve_backends(cfg.backends);
    std::string list;
    for (const std::string& b : backends) list += (list.empty() ? "" : ",") + b;
    const Limits& l = cfg.limits;
    const std::string replay =
        std::string(argv[0]) + " --backend " + list + " --seed " + std::to_string(cfg.seed) +
        " --max-len " + std::to_string(l.max_len) + " --max-head-dim " +
        std::to_string(l.max_head_dim) + " --max-elements " + std::to_string(l.max_elements) +
        " --max-kv-heads " + std::to_string(l.max_kv_heads) + " --max-batch " +
        std::to_string(l.max_batch);
    std::fprintf(
        stderr, "soak: %lld calls on %s, seed %llu, check every %lld; %s\n",
        static_cast<long long>(cfg.replay ? 1 : cfg.calls), list.c_str(),
        static_cast<unsigned long long>(cfg.seed), static_cast<long long>(cfg.check_every),
        cli::device_description(find_backend(backends.front())->device_type() == DeviceType::cuda
                                    ? Device::cuda(0)
                                    : Device::cpu())
            .c_str());
    Soak soak(cfg, backends, replay);
    return soak.run();
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "memeff_soak: error: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "memeff_soak: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memeff_soak: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

}  // namespace memeff::soak

int main(int argc, char** argv) { return memeff::soak::soak_main(argc, argv); }
