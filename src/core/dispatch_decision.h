// Backend selection: resolve the priority order (Options::backends > innermost ScopedBackends >
// MEMEFF_BACKENDS > the per-device heuristic), ask every backend for its reasons, take the first
// eligible one, or the autotuned winner when tuning is on, and otherwise throw an error listing
// every reason. explain() reports this decision; calls reuse it through the per-thread decision
// cache (core/decision_cache.h) of PreparedCall, which forward, backward and workspace_size use.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/autotune.h"
#include "core/strings.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"

namespace memeff::detail {

// A copy of the registered backends, the built-ins first (src/core/registry.cpp).
std::vector<std::shared_ptr<Backend>> registry_snapshot();

// The dispatcher's words (src/core/dispatch_report.cpp).
const char* pass_name(Pass pass);
const char* device_type_name(DeviceType t);
std::string format_ms(double ms);
// Whether MEMEFF_LOG_DISPATCH is set (and not 0).
bool log_dispatch_enabled();
// One stderr line per distinct decision when MEMEFF_LOG_DISPATCH is set (and not 0).
void log_decision(const Explanation& ex);
// ErrorCode::unsupported listing the order walked and every backend with its reasons.
[[noreturn]] void throw_unsupported(const Explanation& ex);

// The per-device default order of a pass and why it is what it is (one sentence).
struct HeuristicOrder {
  std::vector<std::string> order;
  std::string why;
};
HeuristicOrder default_order(const Problem& problem, Pass pass = Pass::forward);

// The order a call walks and where it comes from ("options", "scoped guard", "MEMEFF_BACKENDS",
// "default"; heuristic_why only for the default). Throws for a MEMEFF_BACKENDS naming an
// unregistered backend.
struct ResolvedOrder {
  std::vector<std::string> order;
  std::string source;
  std::string heuristic_why;
};
ResolvedOrder resolve_order(const Problem& problem, Pass pass, const Options& options,
                            const std::vector<std::shared_ptr<Backend>>& registered);

struct Decision {
  Explanation explanation;                         // what explain() returns
  std::shared_ptr<Backend> backend;                // the choice; null when none qualifies
  std::vector<std::shared_ptr<Backend>> eligible;  // candidates, in the order walked
  bool tune_pending = false;  // autotune is on, several candidates, no remembered winner
};

// Decides without running anything, with every backend's reasons (explain(), and calls that log
// or autotune). Throws only for a malformed MEMEFF_BACKENDS.
Decision decide(const Problem& problem, Pass pass, const Options& options);

// Times the candidates of a decision whose tune is pending with `run`, records the winner and
// makes it the choice (its reason: the measured times).
void finish_tune(Decision& d, const Problem& problem, Pass pass, const Options& options,
                 const PassRunner& run);

}  // namespace memeff::detail
