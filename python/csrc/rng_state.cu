// The device side of draw_rng_state on CUDA: one thread copies torch's Philox seed and offset
// (values, or the graph-capture pointers plus the intra-graph increment) into the call's
// int64[2] rng_state tensor, which the forward and the backward kernels then read.
#include "rng_state.h"

namespace memeff_torch {
namespace {

__global__ void write_rng_state_kernel(bool captured, std::uint64_t seed_value,
                                       const std::int64_t* seed_ptr, std::uint64_t offset_value,
                                       const std::int64_t* offset_ptr,
                                       std::uint64_t offset_intragraph, std::uint64_t* state) {
  if (captured) {
    state[0] = static_cast<std::uint64_t>(*seed_ptr);
    state[1] = static_cast<std::uint64_t>(*offset_ptr) + offset_intragraph;
  } else {
    state[0] = seed_value;
    state[1] = offset_value;
  }
}

}  // namespace

cudaError_t launch_write_rng_state(bool captured, std::uint64_t seed_value,
                                   const std::int64_t* seed_ptr, std::uint64_t offset_value,
                                   const std::int64_t* offset_ptr, std::uint64_t offset_intragraph,
                                   std::uint64_t* state, cudaStream_t stream) {
  write_rng_state_kernel<<<1, 1, 0, stream>>>(captured, seed_value, seed_ptr, offset_value,
                                              offset_ptr, offset_intragraph, state);
  return cudaGetLastError();
}

}  // namespace memeff_torch
