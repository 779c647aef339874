// The sm90 backward's wide tile for bf16, head dims 129-256 (with and without dropout). One file
// per dtype, so builds run in parallel and a kernel change recompiles only what it touches.
#include "cuda/kernels/sm90/bwd_wide_run.cuh"

namespace memeff::cuda::sm90 {
template void run_backward_wide<__nv_bfloat16>(BackwardTmaParams, const BackwardWorkspace&, int,
                                               cudaStream_t);
}  // namespace memeff::cuda::sm90
