// The AVX-512 (F, BW, DQ, VL) table of the cpu backend's kernels: the vector kernels
// (simd_vector_kernels.h) at 16 lanes, with mask registers for the row tails; compiled with
// __attribute__((target)) like the AVX2 ones.
#define MEMEFF_SIMD_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
#include "cpu/simd_vector_kernels.h"

namespace memeff::detail {

CpuKernels make_avx512_kernels() { return vector_kernels<CpuIsa::avx512>("avx512"); }

}  // namespace memeff::detail

#undef MEMEFF_SIMD_TARGET
