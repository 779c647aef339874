// Backend selection: walks the priority order (the caller's allow-list or the per-device
// default), returns the first backend with no reasons, and otherwise throws an error listing
// every candidate with its reasons.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "memeff/attention.h"
#include "memeff/backend.h"

namespace memeff::detail {

struct Choice {
  std::shared_ptr<Backend> backend;
  std::string why;  // "first eligible in the default order", ...
};

// The priority order used for a problem when the caller names none.
std::vector<std::string> default_order(const Problem& problem);

Choice choose_backend(const Problem& problem, Pass pass, const Options& options);

}  // namespace memeff::detail
