// The Backend interface's defaults for autotuning: host timing and the device label. They keep
// core free of any device runtime; a GPU backend overrides both with its device's own answers.
#include "memeff/backend.h"

#include <chrono>
#include <fstream>
#include <functional>
#include <string>

#include "core/autotune.h"
#include "memeff/error.h"

namespace memeff {
namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string model = line.substr(colon + 1);
        model.erase(0, model.find_first_not_of(" \t"));
        return model;
      }
    }
  }
  return "unknown";
}

}  // namespace

namespace detail {

std::string device_label(Device device) {
  if (device.type == DeviceType::cpu) {
    static const std::string label = "cpu " + cpu_model();
    return label;
  }
  return "cuda:" + std::to_string(device.index);
}

}  // namespace detail

double Backend::time_ms(const Problem&, const Options&, const std::function<void()>& run) {
  if (device_type() != DeviceType::cpu) {
    throw Error(ErrorCode::unsupported,
                "backend `" + name() +
                    "` cannot be timed: it runs on a device and does not override "
                    "Backend::time_ms, and a host clock would time only the launches");
  }
  const auto t0 = std::chrono::steady_clock::now();
  run();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

std::string Backend::device_label(Device device) const { return detail::device_label(device); }

}  // namespace memeff
