// The sm90 backward kernels for bf16, head-dim bucket 64 (with and without dropout and bias, dense
// and packed). One file per instantiation, so builds run in parallel and a kernel change recompiles
// only what it touches.
#include "cuda/kernels/sm90/bwd_run.cuh"

namespace memeff::cuda::sm90 {
template void run_backward<__nv_bfloat16, 64>(BackwardTmaParams, const BackwardWorkspace&, int,
                                              cudaStream_t);
}  // namespace memeff::cuda::sm90
