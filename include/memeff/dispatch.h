// Backend selection that explains itself and obeys the user: explain() reports every backend's
// eligibility and why the choice was made; ScopedBackends restricts/reorders backends for the
// current thread (nestable, like torch.nn.attention.sdpa_kernel); autotuning times the eligible
// candidates once per shape key and remembers the winner in memory and in a cache file.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "memeff/attention.h"
#include "memeff/backend.h"

namespace memeff {

// One candidate's measured time (median of the timed repeats), from autotuning.
struct CandidateTime {
  std::string backend;
  double ms = 0.0;
};

struct BackendReport {
  std::string name;
  bool eligible = false;
  std::vector<std::string> reasons;  // empty when eligible
};

struct Explanation {
  Problem problem;
  Pass pass = Pass::forward;
  std::vector<std::string> order;  // the priority order walked
  std::string order_source;        // "options", "scoped guard", "MEMEFF_BACKENDS" or "default"
  std::vector<BackendReport> backends;
  std::string chosen;  // empty when no backend qualifies
  std::string reason;  // why `chosen` won: priority, heuristic, user restriction or autotune result
  bool autotune = false;  // autotuning is on for this call (Options or MEMEFF_AUTOTUNE)
  std::string key;        // the autotune key of this call (set when autotune is on)
  std::vector<CandidateTime> timings;  // the measured candidates when the choice is a tune result

  std::string to_string() const;  // human-readable, several lines
  std::string to_json() const;    // one JSON object
};

// What forward/backward would do for these arguments, without running anything.
Explanation explain(const AttentionArgs& args, Pass pass, const Options& options = {});

// One pass, decided once: building it validates the arguments and chooses the backend, so the
// workspace size and the run share one decision (a framework takes the workspace from its own
// allocator in between). forward() and backward() are this in one step. Decisions are remembered
// per thread by call signature (sizes, dtypes, device, flags, bias pattern, alignment class,
// pass, backend order, autotune and log settings), so a repeated call skips the backends' checks
// and the dispatcher's texts; explain() and MEMEFF_LOG_DISPATCH still say everything.
// The views are copied; the memory they point to must stay valid until run() returns.
class PreparedCall {
 public:
  // Throw what forward() and backward() throw: bad arguments, or no backend qualifies.
  static PreparedCall forward(const AttentionArgs& args, const TensorView& out,
                              const TensorView& lse, Options options = {});
  static PreparedCall backward(const AttentionArgs& args, const BackwardTensors& grads,
                               Options options = {});

  PreparedCall(PreparedCall&&) noexcept;
  PreparedCall& operator=(PreparedCall&&) noexcept;
  ~PreparedCall();

  const Problem& problem() const { return problem_; }
  // The chosen backend (with autotuning still to time the candidates: the first eligible one,
  // which the tune in run() may replace).
  std::string backend() const;
  // Scratch bytes run() wants; with a tune pending, the largest need among the candidates.
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  // Runs the pass, first timing the candidates when autotune has no winner for this signature.
  // `workspace`: at least workspace_bytes() of scratch on the tensors' device; without one,
  // Options::workspace is used, else the backend allocates on the stream.
  CallInfo run(void* workspace = nullptr, std::size_t workspace_bytes = 0);

 private:
  friend std::size_t workspace_size(const AttentionArgs&, Pass, const Options&);
  struct PendingTune;
  PreparedCall(Pass pass, const AttentionArgs& args, Options options);
  void choose(bool may_tune);

  Pass pass_;
  Problem problem_;
  AttentionArgs args_;
  TensorView out_, lse_;   // forward
  BackwardTensors grads_;  // backward
  Options options_;
  std::shared_ptr<Backend> backend_;
  std::size_t workspace_bytes_ = 0;
  bool compute_ = true;  // false for a forward with nothing to compute (B·Hq·Lq = 0)
  std::unique_ptr<PendingTune> pending_;
};

// Restricts (and orders) the backends for calls on this thread while alive. Nested guards
// apply the innermost; Options::backends on a call still wins over a guard.
class ScopedBackends {
 public:
  explicit ScopedBackends(std::vector<std::string> order);
  ~ScopedBackends();
  ScopedBackends(const ScopedBackends&) = delete;
  ScopedBackends& operator=(const ScopedBackends&) = delete;
};

// One remembered autotune decision.
struct TuneEntry {
  // device and capability, dtype, B·H, Lq, Lk, D, Dv, causal, dropout, bias, GQA, pass, and the
  // candidate set that was timed
  std::string key;
  std::string backend;  // the winner
  std::string config;   // kernel configuration inside the backend ("" for its default)
  double ms = 0.0;      // its measured time
  std::vector<CandidateTime> candidates;  // every timed candidate, fastest first
};

// Entries known in memory (after loading the cache file, if any).
std::vector<TuneEntry> autotune_entries();
// The cache file in use: $MEMEFF_CACHE_DIR/autotune.json, else $XDG_CACHE_HOME/memeff/...,
// else ~/.cache/memeff/...
std::string autotune_cache_path();
// Forgets in-memory decisions (the file is left alone); for tests and long-running tools.
void autotune_reset_memory();
// Whether a call with these options autotunes: Options::autotune when set, else MEMEFF_AUTOTUNE
// ("1", "true", "on" or "yes").
bool autotune_enabled(const Options& options = {});

}  // namespace memeff
