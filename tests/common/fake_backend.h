// A backend for tests of the dispatcher, the hot path and autotuning: a name and a device type,
// Backend's defaults otherwise (no reason to refuse, no workspace, no global coordinates); it
// computes nothing and counts its passes. Tests derive from it to refuse, take time or record.
#pragma once

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "memeff/backend.h"

namespace memeff::test {

class FakeBackend : public Backend {
 public:
  explicit FakeBackend(std::string name, DeviceType device = DeviceType::cpu)
      : name_(std::move(name)), device_(device) {}
  std::string name() const override { return name_; }
  DeviceType device_type() const override { return device_; }
  std::vector<std::string> reasons_unsupported(const Problem&, Pass) const override { return {}; }
  void forward(const Problem&, const AttentionArgs&, const TensorView&, const TensorView&,
               const Options&) override {
    ++forward_calls;
  }
  void backward(const Problem&, const AttentionArgs&, const BackwardTensors&,
                const Options&) override {
    ++backward_calls;
  }

  std::atomic<int> forward_calls{0}, backward_calls{0};

 private:
  std::string name_;
  DeviceType device_;
};

}  // namespace memeff::test
