// The small pieces around a call that tests of every kind repeat: Options restricted to named
// backends, what a call threw (a memeff::Error's code and message, or nothing), a substring check
// for the messages, and the names of tests that run once per backend.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "memeff/attention.h"
#include "memeff/error.h"

namespace memeff::test {

// Options that allow only these backends, in this order.
inline Options only(std::vector<std::string> backends) {
  Options o;
  o.backends = std::move(backends);
  return o;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// What a call threw: `error` false when it returned (other exceptions pass through).
struct Thrown {
  bool error = false;
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

template <typename Call>
Thrown thrown_by(Call&& call) {
  try {
    std::forward<Call>(call)();
  } catch (const Error& e) {
    return {true, e.code(), e.what()};
  }
  return {};
}

// The message of the memeff::Error a call throws ("" when it throws none).
template <typename Call>
std::string error_message(Call&& call) {
  return thrown_by(std::forward<Call>(call)).message;
}

// A test run once per backend names its instance after the backend: Suite.Test/cpu.
inline std::string backend_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

}  // namespace memeff::test
