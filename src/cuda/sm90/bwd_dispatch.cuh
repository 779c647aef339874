// Declarations shared by the sm90 backward launcher (src/cuda/launch/sm90_bwd_launch.cu) and the
// per-instantiation files (src/cuda/inst/sm90_bwd_*.cu): one run_backward per dtype x head-dim
// bucket, taking the TMA descriptors and workspace pointers the launcher filled in.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/bwd_traits.cuh"

namespace memeff::cuda::sm90 {

template <class T, int kHeadDim>
void run_backward(BackwardTmaParams params, const BwdWorkspace& workspace, cudaStream_t stream);

}  // namespace memeff::cuda::sm90
