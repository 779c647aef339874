// The entry points of the sm80 instantiations (inst/: one file per dtype x head-dim bucket, so
// builds run in parallel and a kernel change recompiles only what it touches), declared for the
// launchers (fwd_launch.cu, bwd_launch.cu) that pick one.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/common/params.h"

namespace memeff::cuda::sm80 {

template <class T, int kHeadDim>
void run_forward(const ForwardParams& params, cudaStream_t stream);

// `workspace`: backward_workspace_layout(params).total bytes (bwd_traits.cuh), 16-byte aligned;
// `multiprocessors`: the device's SM count, which the grid's order plans with
// (common/block_order.h).
template <class T, int kHeadDim>
void run_backward(BackwardParams params, void* workspace, int multiprocessors, cudaStream_t stream);

}  // namespace memeff::cuda::sm80
