// Bit-for-bit comparison of two host tensors of one shape and dtype, for results that must repeat
// exactly (the same call on another thread, stream or run): the first element whose stored bits
// differ, or that is NaN (poisoned outputs the call never wrote), named by its coordinates.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>

#include "common/host_tensor.h"

namespace memeff::test {

// "" when `got` holds the bits of `want` and no NaN; else where and what the first difference is.
inline std::string bitwise_difference(const HostTensor& got, const HostTensor& want) {
  const std::size_t width = dtype_size(got.view.dtype);
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const std::uint8_t* a = got.storage.data() + got.element_offset(i) * width;
    const std::uint8_t* b = want.storage.data() + want.element_offset(i) * width;
    if (std::memcmp(a, b, width) == 0 && !std::isnan(got.get(i))) continue;
    Diff at;
    at.worst = i;
    std::ostringstream os;
    os << std::setprecision(std::numeric_limits<double>::max_digits10) << "differs at "
       << at.where(got) << ": " << got.get(i) << ", expected " << want.get(i);
    return os.str();
  }
  return {};
}

// The same, as a test expectation; `what` names the tensor and the case.
inline void expect_bitwise_equal(const HostTensor& got, const HostTensor& want,
                                 const std::string& what) {
  const std::string diff = bitwise_difference(got, want);
  EXPECT_TRUE(diff.empty()) << what << " " << diff;
}

}  // namespace memeff::test
