// What the dispatcher says: explain()'s text and JSON, the MEMEFF_LOG_DISPATCH lines and the
// error when no backend qualifies (every backend with its reasons).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "core/dispatch_decision.h"
#include "core/json_text.h"
#include "memeff/error.h"

namespace memeff {
namespace detail {
namespace {

Json problem_json(const Problem& p) {
  return {{"dtype", dtype_name(p.dtype)},
          {"device", device_name(p.device)},
          {"B", p.B},
          {"Hq", p.Hq},
          {"Hkv", p.Hkv},
          {"Lq", p.Lq},
          {"Lk", p.Lk},
          {"D", p.D},
          {"Dv", p.Dv},
          {"causal", causal_mode_name(p.causal)},
          {"bias", p.bias_pattern()},
          {"dropout_p", p.dropout_p},
          {"scale", p.scale}};
}

}  // namespace

bool log_dispatch_enabled() {
  const char* v = std::getenv("MEMEFF_LOG_DISPATCH");
  return v && *v && std::strcmp(v, "0") != 0;
}

const char* pass_name(Pass pass) { return pass == Pass::forward ? "forward" : "backward"; }
const char* device_type_name(DeviceType t) { return t == DeviceType::cuda ? "cuda" : "cpu"; }

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string format_ms(double ms) {
  std::ostringstream os;
  os << std::setprecision(3) << ms << " ms";
  return os.str();
}

// One stderr line per distinct (pass, shape, order, choice).
void log_decision(const Explanation& ex) {
  if (!log_dispatch_enabled()) return;
  static std::mutex mutex;
  static std::set<std::string> seen;
  const std::string key = std::string(pass_name(ex.pass)) + "|" + ex.problem.describe() + "|" +
                          join(ex.order, ",") + "|" + ex.order_source + "|" + ex.chosen;
  {
    std::lock_guard lock(mutex);
    if (!seen.insert(key).second) return;
  }
  std::ostringstream os;
  os << "memeff: dispatch " << pass_name(ex.pass) << " " << ex.problem.describe() << " -> "
     << ex.chosen << " (" << ex.reason << ")";
  for (const BackendReport& r : ex.backends) {
    if (!r.eligible) os << "; " << r.name << ": " << join(r.reasons, "; ");
  }
  std::cerr << os.str() << std::endl;
}

void throw_unsupported(const Explanation& ex) {
  std::ostringstream os;
  os << "no backend can run this " << pass_name(ex.pass) << " (" << ex.problem.describe()
     << "); order walked (" << ex.order_source << "): " << join(ex.order)
     << "; every backend and why not:";
  for (const BackendReport& r : ex.backends)
    os << "\n  " << r.name << ": " << join(r.reasons, "; ");
  throw Error(ErrorCode::unsupported, os.str());
}

}  // namespace detail

using detail::format_ms;
using detail::join;
using detail::Json;
using detail::pass_name;
using detail::problem_json;

std::string Explanation::to_string() const {
  std::ostringstream os;
  os << "memeff dispatch for " << pass_name(pass) << ": " << problem.describe() << "\n";
  os << "order (" << order_source << "): " << join(order) << "\n";
  std::size_t width = 0;
  for (const BackendReport& r : backends) width = std::max(width, r.name.size());
  for (const BackendReport& r : backends) {
    os << "  " << std::left << std::setw(static_cast<int>(width)) << r.name << "  ";
    if (r.eligible) {
      os << "eligible";
    } else {
      os << "not eligible: " << join(r.reasons, "; ");
    }
    os << "\n";
  }
  if (autotune) os << "autotune: on, key " << key << "\n";
  for (const CandidateTime& t : timings)
    os << "  timed " << t.backend << ": " << format_ms(t.ms) << "\n";
  if (chosen.empty()) {
    os << "chosen: none (no backend qualifies)\n";
  } else {
    os << "chosen: " << chosen << " (" << reason << ")\n";
  }
  return os.str();
}

std::string Explanation::to_json() const {
  Json list = Json::array();
  for (const BackendReport& r : backends) {
    list.push_back(
        Json::object({{"name", r.name}, {"eligible", r.eligible}, {"reasons", r.reasons}}));
  }
  Json times = Json::array();
  for (const CandidateTime& t : timings) {
    times.push_back(Json::object({{"backend", t.backend}, {"ms", t.ms}}));
  }
  Json v = {{"pass", pass_name(pass)},
            {"problem", problem_json(problem)},
            {"order", order},
            {"order_source", order_source},
            {"backends", std::move(list)},
            {"chosen", chosen.empty() ? Json() : Json(chosen)},
            {"reason", reason},
            {"autotune", autotune},
            {"timings", std::move(times)}};
  if (!key.empty()) v["key"] = key;
  return detail::json_text(v);
}

}  // namespace memeff
