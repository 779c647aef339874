// The entry points of the sm90 instantiations (inst/: one file per dtype x head-dim bucket, so
// builds run in parallel and a kernel change recompiles only what it touches), declared for the
// launchers (fwd_launch.cu, bwd_launch.cu) that encode the TMA descriptors and pick one.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/sm90/bwd_traits.cuh"
#include "cuda/kernels/sm90/fwd_traits.cuh"

namespace memeff::cuda::sm90 {

// `multiprocessors`: the device's SM count, the persistent grid's size and the one the grids'
// heaviest-first order plans with (common/block_order.h).
template <class T, int kHeadDim>
void run_forward(const ForwardTmaParams& params, int multiprocessors, cudaStream_t stream);

template <class T, int kHeadDim>
void run_backward(BackwardTmaParams params, const BackwardWorkspace& workspace, int multiprocessors,
                  cudaStream_t stream);

// The wide tile, head-dim bucket 256 (bwd_wide_run.cuh).
template <class T>
void run_backward_wide(BackwardTmaParams params, const BackwardWorkspace& workspace,
                       int multiprocessors, cudaStream_t stream);

}  // namespace memeff::cuda::sm90
