// The one exception type of memeff. Messages name the argument, what was expected and what was
// given; the code lets callers branch without parsing text.
#pragma once

#include <stdexcept>
#include <string>

namespace memeff {

enum class ErrorCode {
  invalid_argument,  // a caller's argument is malformed (shape, dtype, range, aliasing ...)
  unsupported,       // valid, but no allowed backend can run it; the message lists why
  cuda_error,        // a CUDA runtime or library call failed
  io_error,          // a file (autotune cache, mask output) could not be read or written
  internal,          // a bug in memeff
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace memeff
