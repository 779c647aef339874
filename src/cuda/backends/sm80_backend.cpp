// The "cuda" backend: the fused mma.sync kernels of the sm80 family (kernels/sm80/; compute
// capability 8.0 and newer), the fallback of the Hopper kernels, and the backward for head dims
// above 128 with a bias, a window, ALiBi, a softcap or packed sequences.
#include "core/builtin_backends.h"
#include "cuda/backends/fused_backend.h"
#include "cuda/kernels/sm80/family.h"

namespace memeff::detail {

std::shared_ptr<Backend> make_cuda_backend() { return make_fused_backend<cuda::sm80::Family>(); }

}  // namespace memeff::detail
