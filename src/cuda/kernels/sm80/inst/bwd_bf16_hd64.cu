// The sm80 backward kernels for bf16, head-dim bucket 64 (with and without dropout, dense and
// packed). One file per instantiation, so builds run in parallel and a kernel change recompiles
// only what it touches.
#include "cuda/kernels/sm80/bwd_run.cuh"

namespace memeff::cuda::sm80 {
template void run_backward<__nv_bfloat16, 64>(BackwardParams, void*, int, cudaStream_t);
}  // namespace memeff::cuda::sm80
