// Launcher of the one-thread kernel that materializes a call's dropout (seed, offset) on the
// device while a CUDA graph is being captured. Plain types only, so ops_cuda.cpp (torch) and
// rng_state.cu (nvcc, no torch) share it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace memeff_torch {

// Writes state[0] = *seed_ptr and state[1] = *offset_ptr + offset_intragraph on `stream` when
// the kernel runs: torch's generator keeps its captured seed and offset in device memory and
// sets them before each replay, so every replay of the graph sees a fresh offset.
cudaError_t launch_write_captured_rng_state(const std::int64_t* seed_ptr,
                                            const std::int64_t* offset_ptr,
                                            std::uint64_t offset_intragraph, std::uint64_t* state,
                                            cudaStream_t stream);

}  // namespace memeff_torch
