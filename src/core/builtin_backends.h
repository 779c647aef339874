// Factories of the backends that ship with memeff, one per backend source file, and the list of
// them (builtin_backends.cpp) that the registry adds on first use: core names the backends
// without including any backend's header.
#pragma once

#include <memory>
#include <vector>

#include "memeff/backend.h"

namespace memeff::detail {

std::shared_ptr<Backend> make_reference_backend();  // src/cpu/reference.cpp
std::shared_ptr<Backend> make_cpu_backend();        // src/cpu/cpu_backend.cpp
#if defined(MEMEFF_WITH_CUDA)
std::shared_ptr<Backend> make_cuda_backend();          // src/cuda/backends/sm80_backend.cpp
std::shared_ptr<Backend> make_cuda_sm90_backend();     // src/cuda/backends/sm90_backend.cpp
std::shared_ptr<Backend> make_cuda_math_backend();     // src/cuda/backends/cuda_math.cu
std::shared_ptr<Backend> make_cuda_splitkv_backend();  // src/cuda/backends/splitkv_backend.cpp
#endif

// Every built-in backend this build has, in no particular order.
std::vector<std::shared_ptr<Backend>> builtin_backends();

}  // namespace memeff::detail
