// The bar the gpu tests hold a fused CUDA kernel's result to against the double-precision
// reference on the same rounded inputs: test::fused_kernel_tolerance (tests/common/tolerance.h),
// max |diff| <= 1e-5 + rtol · max |ref| with rtol 2e-2 for bf16 and 5e-3 for fp16, and no NaN or
// misplaced infinity; lse to 1e-3 relative.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>

#include "common/host_tensor.h"
#include "common/tolerance.h"

namespace memeff::test {

inline void expect_near_reference(const HostTensor& got, const HostTensor& ref, DType dtype,
                                  const char* what) {
  expect_close(got, ref, fused_kernel_tolerance(dtype), what);
}

// lse (fp32, natural log) within 1e-3 · max(1, max |ref|), -inf where the reference has it.
inline void expect_lse_near_reference(const HostTensor& got, const HostTensor& ref) {
  const Diff d = compare(got, ref);
  EXPECT_FALSE(d.nan) << "lse at " << d.where(got);
  EXPECT_LE(d.max_abs, 1e-3 * std::max(1.0, d.max_ref)) << "lse at " << d.where(got);
}

}  // namespace memeff::test
