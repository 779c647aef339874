// The device side of the forward's dropout draw under CUDA-graph capture: one thread copies
// torch's captured Philox seed and offset (plus the intra-graph increment) into the call's
// int64[2] rng_state tensor, which the forward and the backward kernels then read. Outside
// capture the forward reads the values on the host and launches nothing for them.
#include "rng_state.h"

namespace memeff_torch {
namespace {

__global__ void write_captured_rng_state_kernel(const std::int64_t* seed_ptr,
                                                const std::int64_t* offset_ptr,
                                                std::uint64_t offset_intragraph,
                                                std::uint64_t* state) {
  state[0] = static_cast<std::uint64_t>(*seed_ptr);
  state[1] = static_cast<std::uint64_t>(*offset_ptr) + offset_intragraph;
}

}  // namespace

cudaError_t launch_write_captured_rng_state(const std::int64_t* seed_ptr,
                                            const std::int64_t* offset_ptr,
                                            std::uint64_t offset_intragraph, std::uint64_t* state,
                                            cudaStream_t stream) {
  write_captured_rng_state_kernel<<<1, 1, 0, stream>>>(seed_ptr, offset_ptr, offset_intragraph,
                                                       state);
  return cudaGetLastError();
}

}  // namespace memeff_torch
