// Launcher of the one-thread kernel that materializes a call's dropout (seed, offset) on the
// device from torch's PhiloxCudaState. Plain types only, so ops_cuda.cpp (torch) and
// rng_state.cu (nvcc, no torch) share it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace memeff_torch {

// Writes state[0] = seed and state[1] = offset on `stream`. When `captured` (CUDA-graph capture),
// seed is read from *seed_ptr and offset is *offset_ptr + offset_intragraph at kernel run time,
// so each replay of the graph sees the generator's fresh offset; else the values are used.
cudaError_t launch_write_rng_state(bool captured, std::uint64_t seed_value,
                                   const std::int64_t* seed_ptr, std::uint64_t offset_value,
                                   const std::int64_t* offset_ptr, std::uint64_t offset_intragraph,
                                   std::uint64_t* state, cudaStream_t stream);

}  // namespace memeff_torch
