// The bar the gpu tests hold a fused CUDA kernel's result to against the double-precision
// reference on the same rounded inputs: max |diff| <= 1e-5 + rtol · max |ref|, rtol 2e-2 for bf16
// and 5e-3 for fp16, and no NaN or misplaced infinity.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>

#include "common/host_tensor.h"
#include "common/tolerance.h"

namespace memeff::test {

inline double near_reference_rtol(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 5e-3; }

inline void expect_near_reference(const HostTensor& got, const HostTensor& ref, DType dtype,
                                  const char* what) {
  const Diff d = compare(got, ref);
  EXPECT_FALSE(d.nan) << what << ": NaN or non-finite mismatch at " << d.where(got);
  EXPECT_LE(d.max_abs, 1e-5 + near_reference_rtol(dtype) * d.max_ref)
      << what << ": max |diff| " << d.max_abs << " at " << d.where(got) << " (max |ref| "
      << d.max_ref << ")";
}

// lse (fp32, natural log) within 1e-3 · max(1, max |ref|), -inf where the reference has it.
inline void expect_lse_near_reference(const HostTensor& got, const HostTensor& ref) {
  const Diff d = compare(got, ref);
  EXPECT_FALSE(d.nan) << "lse at " << d.where(got);
  EXPECT_LE(d.max_abs, 1e-3 * std::max(1.0, d.max_ref)) << "lse at " << d.where(got);
}

}  // namespace memeff::test
