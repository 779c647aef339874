// MEMEFF_HD marks functions shared by host code and CUDA kernels (the Philox generator and the
// dropout map), so the CPU backends and the kernels compile the same source: nvcc sees
// __host__ __device__, plain C++ sees inline only.
#pragma once

#if defined(__CUDACC__)
#define MEMEFF_HD __host__ __device__ __forceinline__
#else
#define MEMEFF_HD inline
#endif
