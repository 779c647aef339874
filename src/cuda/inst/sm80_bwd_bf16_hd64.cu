// Backward kernels for bf16, head dims up to 64. One file per instantiation so builds run in
// parallel and a kernel change recompiles only what it touches.
#include "cuda/sm80/bwd_run.cuh"

namespace memeff::cuda {
template void run_backward<__nv_bfloat16, 64>(BackwardParams, void*, cudaStream_t);
}  // namespace memeff::cuda
