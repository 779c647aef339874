// The "cuda_sm90" backend: the Hopper-native forward and backward of the sm90 family
// (kernels/sm90/: warp-specialized, TMA and wgmma). First in the default order on compute
// capability 9.0; it computes the same function with the same dropout mask as every other
// backend, so a pass it refuses (e.g. the backward at head dims above 128 with a bias) goes to the
// next backend in the order, which works with this forward's out and lse.
#include "core/builtin_backends.h"
#include "cuda/backends/fused_backend.h"
#include "cuda/kernels/sm90/family.h"

namespace memeff::detail {

std::shared_ptr<Backend> make_cuda_sm90_backend() {
  return make_fused_backend<cuda::sm90::Family>();
}

}  // namespace memeff::detail
