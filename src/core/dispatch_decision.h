// Backend selection, one code path for forward, backward, workspace_size and explain(): resolve
// the priority order (Options::backends > innermost ScopedBackends > MEMEFF_BACKENDS > the
// per-device heuristic), ask every backend for its reasons, take the first eligible one, or the
// autotuned winner when tuning is on, and otherwise throw an error listing every reason.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/autotune.h"
#include "memeff/attention.h"
#include "memeff/backend.h"
#include "memeff/dispatch.h"

namespace memeff::detail {

// A copy of the registered backends, the built-ins first (src/core/registry.cpp).
std::vector<std::shared_ptr<Backend>> registry_snapshot();

// The dispatcher's words (src/core/dispatch_report.cpp).
const char* pass_name(Pass pass);
const char* device_type_name(DeviceType t);
std::string join(const std::vector<std::string>& items, const char* sep = ", ");
std::string format_ms(double ms);
// One stderr line per distinct decision when MEMEFF_LOG_DISPATCH is set (and not 0).
void log_decision(const Explanation& ex);
// ErrorCode::unsupported listing the order walked and every backend with its reasons.
[[noreturn]] void throw_unsupported(const Explanation& ex);

// The per-device default order and why it is what it is (one sentence).
struct HeuristicOrder {
  std::vector<std::string> order;
  std::string why;
};
HeuristicOrder default_order(const Problem& problem);

struct Decision {
  Explanation explanation;                         // what explain() returns
  std::shared_ptr<Backend> backend;                // the choice; null when none qualifies
  std::vector<std::shared_ptr<Backend>> eligible;  // candidates, in the order walked
  bool tune_pending = false;  // autotune is on, several candidates, no remembered winner
};

// Decides without running anything (explain, workspace_size). Throws only for a malformed
// MEMEFF_BACKENDS.
Decision decide(const Problem& problem, Pass pass, const Options& options);

// decide(), then, when a tune is pending and `run` is given, times the candidates with it and
// takes the winner; throws ErrorCode::unsupported (every backend with its reasons) when nothing
// qualifies. Logs the decision once per shape key when MEMEFF_LOG_DISPATCH=1.
Decision dispatch(const Problem& problem, Pass pass, const Options& options, const PassRunner* run);

struct Choice {
  std::shared_ptr<Backend> backend;
  std::string why;
};
// dispatch() without tuning, for callers that only need the backend.
Choice choose_backend(const Problem& problem, Pass pass, const Options& options);

}  // namespace memeff::detail
