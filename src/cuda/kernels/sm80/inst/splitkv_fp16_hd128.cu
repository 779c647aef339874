// The split-KV forward kernels for fp16, head-dim bucket 128 (with and without dropout), and
// their combine. One file per instantiation, as the fused kernels' inst/ files.
#include "cuda/kernels/sm80/splitkv_run.cuh"

namespace memeff::cuda::sm80 {
template void run_splitkv_forward<__half, 128>(const ForwardParams&, const SplitKvPlan&, bool,
                                               cudaStream_t);
template int splitkv_ctas_per_sm<__half, 128>(const ForwardParams&);
}  // namespace memeff::cuda::sm80
