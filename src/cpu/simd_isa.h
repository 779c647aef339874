// Internal to the cpu backend's kernels: the per-instruction-set tables and what their files
// share. simd_kernels.h is the interface.
#pragma once

// GCC 12's AVX-512 headers warn about their own _mm512_undefined_* placeholders once inlined
// (GCC bug 105593, fixed in 13); the warnings point into the header, so silence them there.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <cstdint>
#include <limits>

#include "cpu/simd_kernels.h"

namespace memeff::detail {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

CpuKernels make_scalar_kernels();  // simd_scalar.cpp
CpuKernels make_avx2_kernels();    // simd_avx2.cpp
CpuKernels make_avx512_kernels();  // simd_avx512.cpp

// The dropout calls' Philox of n counters one by one (the vector versions' tail); simd_scalar.cpp.
void philox_scalar(const std::uint32_t* c0, const std::uint32_t* c1, const std::uint32_t* c2,
                   const std::uint32_t* c3, std::uint32_t k0, std::uint32_t k1, int n,
                   std::uint32_t* out);

}  // namespace memeff::detail
