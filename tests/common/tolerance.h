// Per-dtype tolerances for comparing a backend against the reference, in one place. A
// comparison passes when max |actual - expected| <= atol + rtol · max |expected|: the error
// budget of one rounding of the output plus accumulation over the reduction length.
#pragma once

#include <cmath>
#include <cstdint>

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

}  // namespace memeff::test
