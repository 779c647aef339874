// The AVX2 + FMA table of the cpu backend's kernels: the vector kernels (simd_vector_kernels.h)
// at 8 lanes, compiled with __attribute__((target)) so the library needs no per-file flags and
// still loads on CPUs without AVX2.
#define MEMEFF_SIMD_TARGET __attribute__((target("avx2,fma")))
#include "cpu/simd_vector_kernels.h"

namespace memeff::detail {

CpuKernels make_avx2_kernels() { return vector_kernels<CpuIsa::avx2>("avx2"); }

}  // namespace memeff::detail

#undef MEMEFF_SIMD_TARGET
