// Per-dtype tolerances for comparing a backend against the reference, in one place, and the
// comparison that applies them: max |actual - expected| <= atol + rtol · max |expected|, the error
// budget of one rounding of the output plus accumulation over the reduction length.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/host_tensor.h"
#include "memeff/tensor.h"

namespace memeff::test {

struct Tolerance {
  double atol;
  double rtol;
  double bound(double max_ref) const { return atol + rtol * max_ref; }
};

// Unit roundoff of each storage dtype.
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f64: return 0x1p-53;
    case DType::f32: return 0x1p-24;
    case DType::f16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
    case DType::i32: break;  // not attention data
  }
  return 1.0;
}

// Forward outputs from the same (already rounded) inputs: a few roundings to the storage dtype
// (P before P·V, the output) plus fp32 accumulation over `reduction` terms (max(D, Lk)), whose
// error grows like sqrt(reduction).
inline Tolerance forward_tolerance(DType dtype, std::int64_t reduction) {
  const double u = dtype == DType::f64 ? 0x1p-24 : unit_roundoff(dtype);  // fp32 arithmetic
  const double growth = std::sqrt(static_cast<double>(std::max<std::int64_t>(reduction, 1)));
  const double rtol = 4.0 * u + 4.0 * 0x1p-24 * growth;
  return {rtol * 1e-2, rtol};
}

// Gradients: one more product and the softmax derivative; twice the forward budget.
inline Tolerance backward_tolerance(DType dtype, std::int64_t reduction) {
  const Tolerance f = forward_tolerance(dtype, reduction);
  return {2.0 * f.atol, 2.0 * f.rtol};
}

// The bar the gpu tests hold a fused CUDA kernel's out and gradients to against the
// double-precision reference on the same rounded inputs: one rounding of dS and of the output
// plus fp32 accumulation, relative to max |ref|.
inline Tolerance fused_kernel_tolerance(DType dtype) {
  return {1e-5, dtype == DType::bf16 ? 2e-2 : 5e-3};
}

// max |a - e| <= atol + rtol·max|e|, and no NaN or misplaced infinity; `what` names the tensor
// (and the case, where no SCOPED_TRACE does), the message the worst element.
inline void expect_close(const HostTensor& actual, const HostTensor& expected, const Tolerance& tol,
                         const std::string& what) {
  const Diff d = compare(actual, expected);
  EXPECT_FALSE(d.nan) << what << ": NaN or non-finite mismatch at " << d.where(actual);
  EXPECT_LE(d.max_abs, tol.bound(d.max_ref))
      << what << ": max |diff| " << d.max_abs << " at " << d.where(actual) << " (max |ref| "
      << d.max_ref << ")";
}

}  // namespace memeff::test
