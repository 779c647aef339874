// The sm90 forward kernels for bf16, head-dim bucket 96 (with and without dropout and bias, dense
// and packed). One file per instantiation, so builds run in parallel and a kernel change recompiles
// only what it touches.
#include "cuda/kernels/sm90/fwd_run.cuh"

namespace memeff::cuda::sm90 {
template void run_forward<__nv_bfloat16, 96>(const ForwardTmaParams&, int, cudaStream_t);
}  // namespace memeff::cuda::sm90
