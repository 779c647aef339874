// MEMEFF_HD marks functions shared by host code and CUDA kernels; plain C++ sees inline only.
#pragma once

#if defined(__CUDACC__)
#define MEMEFF_HD __host__ __device__ __forceinline__
#else
#define MEMEFF_HD inline
#endif
