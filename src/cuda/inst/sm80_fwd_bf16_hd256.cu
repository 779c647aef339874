// Forward kernels for bf16, head dims up to 256 (with and without dropout). One file per
// instantiation so builds run in parallel and a kernel change recompiles only what it touches.
#include "cuda/sm80/fwd_run.cuh"

namespace memeff::cuda {
template void run_forward<__nv_bfloat16, 256>(const ForwardParams&, cudaStream_t);
}  // namespace memeff::cuda
