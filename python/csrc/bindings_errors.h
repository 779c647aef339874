// memeff::Error -> torch error translation (a template, so it lives in a header): the Python user
// sees the C++ message unchanged, as ValueError, NotImplementedError or RuntimeError.
#pragma once

#include <c10/util/Exception.h>

#include "memeff/error.h"

namespace memeff_torch {

template <class Body>
auto translate_errors(Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const memeff::Error& e) {
    switch (e.code()) {
      case memeff::ErrorCode::invalid_argument:
        TORCH_CHECK_VALUE(false, e.what());
      case memeff::ErrorCode::unsupported:
        TORCH_CHECK_NOT_IMPLEMENTED(false, e.what());
      default:
        TORCH_CHECK(false, e.what());
    }
  }
}

}  // namespace memeff_torch
