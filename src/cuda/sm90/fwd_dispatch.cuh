// Declarations shared by the sm90 forward launcher (src/cuda/launch/sm90_fwd_launch.cu) and the
// per-instantiation files (src/cuda/inst/sm90_fwd_*.cu): one run_forward per dtype x head-dim
// bucket, taking the TMA descriptors the launcher encoded.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/fwd_traits.cuh"

namespace memeff::cuda::sm90 {

template <class T, int kHeadDim>
void run_forward(const ForwardTmaParams& params, int multiprocessors, cudaStream_t stream);

}  // namespace memeff::cuda::sm90
