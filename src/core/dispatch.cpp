// The backend registry and the dispatcher behind forward/backward.
#include "core/dispatch.h"

#include <algorithm>
#include <mutex>
#include <sstream>

#include "core/builtin_backends.h"
#include "memeff/error.h"

namespace memeff {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<Backend>> backends;

  static Registry& get() {
    static Registry* registry = [] {
      auto* r = new Registry;
      r->backends = detail::builtin_backends();
      return r;
    }();
    return *registry;
  }
};

}  // namespace

void register_backend(std::shared_ptr<Backend> backend) {
  if (!backend) throw Error(ErrorCode::invalid_argument, "argument `backend`: null");
  Registry& r = Registry::get();
  std::lock_guard lock(r.mutex);
  const std::string name = backend->name();
  auto it = std::find_if(r.backends.begin(), r.backends.end(),
                         [&](const auto& b) { return b->name() == name; });
  if (it != r.backends.end()) {
    *it = std::move(backend);
  } else {
    r.backends.push_back(std::move(backend));
  }
}

bool unregister_backend(const std::string& name) {
  Registry& r = Registry::get();
  std::lock_guard lock(r.mutex);
  auto it = std::find_if(r.backends.begin(), r.backends.end(),
                         [&](const auto& b) { return b->name() == name; });
  if (it == r.backends.end()) return false;
  r.backends.erase(it);
  return true;
}

std::shared_ptr<Backend> find_backend(const std::string& name) {
  Registry& r = Registry::get();
  std::lock_guard lock(r.mutex);
  for (const auto& b : r.backends) {
    if (b->name() == name) return b;
  }
  return nullptr;
}

std::vector<std::string> backend_names() {
  Registry& r = Registry::get();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& b : r.backends) names.push_back(b->name());
  return names;
}

namespace detail {

std::vector<std::string> default_order(const Problem& problem) {
  if (problem.device.type == DeviceType::cuda) return {"cuda", "cuda_math"};
  return {"cpu", "reference"};
}

Choice choose_backend(const Problem& problem, Pass pass, const Options& options) {
  const bool user_order = !options.backends.empty();
  const std::vector<std::string> order = user_order ? options.backends : default_order(problem);
  std::ostringstream reasons;
  for (const std::string& name : order) {
    std::shared_ptr<Backend> backend = find_backend(name);
    if (!backend) {
      reasons << "\n  " << name << ": not a backend of this build";
      continue;
    }
    std::vector<std::string> why_not;
    if (backend->device_type() != problem.device.type) {
      why_not.push_back(std::string("runs on ") +
                        (backend->device_type() == DeviceType::cuda ? "cuda" : "cpu") +
                        ", the tensors are on " + device_name(problem.device));
    } else {
      why_not = backend->reasons_unsupported(problem, pass);
    }
    if (why_not.empty()) {
      return {backend, user_order ? "first eligible in the caller's order"
                                  : "first eligible in the default order"};
    }
    reasons << "\n  " << name << ":";
    for (const std::string& r : why_not) reasons << " " << r << ";";
  }
  throw Error(ErrorCode::unsupported,
              std::string("no backend can run this ") +
                  (pass == Pass::forward ? "forward" : "backward") + " (" + problem.describe() +
                  "); tried:" + reasons.str());
}

}  // namespace detail

CallInfo forward(const AttentionArgs& args, const TensorView& out, const TensorView& lse,
                 const Options& options) {
  const Problem problem = validate_forward(args, out, lse);
  CallInfo info;
  info.p_effective = problem.dropout.p_effective;
  const detail::Choice choice = detail::choose_backend(problem, Pass::forward, options);
  info.backend = choice.backend->name();
  if (problem.B * problem.Hq * problem.Lq == 0) return info;  // nothing to compute
  choice.backend->forward(problem, args, out, lse, options);
  return info;
}

CallInfo backward(const AttentionArgs& args, const BackwardTensors& grads,
                  const Options& options) {
  const Problem problem = validate_backward(args, grads);
  CallInfo info;
  info.p_effective = problem.dropout.p_effective;
  const detail::Choice choice = detail::choose_backend(problem, Pass::backward, options);
  info.backend = choice.backend->name();
  choice.backend->backward(problem, args, grads, options);
  return info;
}

std::size_t workspace_size(const AttentionArgs& args, Pass pass, const Options& options) {
  const Problem problem = validate_inputs(args);
  return detail::choose_backend(problem, pass, options).backend->workspace_bytes(problem, pass);
}

}  // namespace memeff
