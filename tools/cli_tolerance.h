// The tolerances `memeff run` checks a backend against the reference with, in one place: a
// tensor passes when max |backend - reference| <= atol + rtol · max |reference|.
#pragma once

#include "memeff/tensor.h"

namespace memeff::cli {

// The reference ran in double on the same (already rounded) inputs with the same dropout mask,
// so the budget covers only the backend's own arithmetic: roundings of P and of the outputs to
// the storage dtype and fp32 accumulation. Gradients get twice the forward budget (one more
// product and the softmax derivative).

struct CheckTolerance {
  double rtol = 0.0;
  double atol = 0.0;
  double bound(double max_ref) const { return atol + rtol * max_ref; }
};

inline CheckTolerance check_tolerance(DType dtype, bool gradient) {
  double rtol = 1e-4;  // fp32 (and fp64): fp32 accumulation over up to ~16k terms
  switch (dtype) {
    case DType::f32: rtol = 1e-4; break;
    case DType::f64: rtol = 1e-4; break;
    case DType::i32: break;  // not attention data
    case DType::f16: rtol = 5e-3; break;   // ~10 ulp of fp16 (2^-11) relative to max |ref|
    case DType::bf16: rtol = 2e-2; break;  // ~5 ulp of bf16 (2^-8) relative to max |ref|
  }
  if (gradient) rtol *= 2.0;
  return {rtol, rtol * 1e-3};
}

// The tolerance table as text, for --help.
inline const char* tolerance_help() {
  return "tolerances (max |backend - reference| <= rtol * max |reference| + rtol/1000):\n"
         "  fp32: out 1e-4, gradients 2e-4    fp16: out 5e-3, gradients 1e-2\n"
         "  bf16: out 2e-2, gradients 4e-2    (gradients: dq, dk, dv, dbias; lse is checked with the out tolerance)";
}

}  // namespace memeff::cli
