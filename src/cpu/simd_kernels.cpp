// The cpu backend's kernel tables (simd_kernels.h): one per instruction set, built in
// simd_scalar.cpp, simd_avx2.cpp and simd_avx512.cpp, and picked once from
// __builtin_cpu_supports (MEMEFF_CPU_ISA caps the choice).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cpu/simd_isa.h"
#include "memeff/error.h"

namespace memeff::detail {

bool cpu_supports(CpuIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::scalar:
      return true;
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::avx512:
      // __builtin_cpu_supports also checks that the OS saves the zmm and mask registers.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             cpu_supports(CpuIsa::avx2);
  }
  return false;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar:
      return "scalar";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
  }
  return "?";
}

const CpuKernels& cpu_kernels(CpuIsa isa) {
  static const CpuKernels scalar = make_scalar_kernels();
  static const CpuKernels avx2 = make_avx2_kernels();
  static const CpuKernels avx512 = make_avx512_kernels();
  if (!cpu_supports(isa)) {
    throw Error(ErrorCode::unsupported, std::string("cpu kernels: this CPU cannot run the ") +
                                            cpu_isa_name(isa) + " kernels");
  }
  switch (isa) {
    case CpuIsa::avx512:
      return avx512;
    case CpuIsa::avx2:
      return avx2;
    default:
      return scalar;
  }
}

namespace {
CpuIsa best_cpu_isa() {
  for (CpuIsa isa : {CpuIsa::avx512, CpuIsa::avx2}) {
    if (cpu_supports(isa)) return isa;
  }
  return CpuIsa::scalar;
}
}  // namespace

const CpuKernels& cpu_kernels() {
  static const CpuKernels& best = [&]() -> const CpuKernels& {
    // MEMEFF_CPU_ISA=scalar|avx2|avx512 caps the instruction set (for comparisons and tests);
    // a level this CPU lacks, or an unknown name, falls back to the best one with a warning.
    const CpuIsa best_isa = best_cpu_isa();
    const char* env = std::getenv("MEMEFF_CPU_ISA");
    if (env == nullptr || *env == '\0') return cpu_kernels(best_isa);
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
      if (std::string(env) == cpu_isa_name(isa) && cpu_supports(isa)) return cpu_kernels(isa);
    }
    std::fprintf(stderr,
                 "memeff: MEMEFF_CPU_ISA=%s is not scalar, avx2 or avx512 runnable on this CPU; "
                 "using %s\n",
                 env, cpu_isa_name(best_isa));
    return cpu_kernels(best_isa);
  }();
  return best;
}

}  // namespace memeff::detail
