// The backend registry: the built-in backends (core/builtin_backends.h) plus what users register,
// behind one mutex; the dispatcher works on snapshots, and a change drops remembered decisions.
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/builtin_backends.h"
#include "core/decision_cache.h"
#include "core/dispatch_decision.h"
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

namespace detail {

std::vector<std::shared_ptr<Backend>> registry_snapshot() {
  Registry& r = Registry::get();
  std::lock_guard lock(r.mutex);
  return r.backends;
}

}  // namespace detail

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
  detail::invalidate_decisions();
}

bool unregister_backend(const std::string& name) {
  Registry& r = Registry::get();
  std::lock_guard lock(r.mutex);
  auto it = std::find_if(r.backends.begin(), r.backends.end(),
                         [&](const auto& b) { return b->name() == name; });
  if (it == r.backends.end()) return false;
  r.backends.erase(it);
  detail::invalidate_decisions();
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
  std::vector<std::string> names;
  for (const auto& b : detail::registry_snapshot()) names.push_back(b->name());
  return names;
}

}  // namespace memeff
