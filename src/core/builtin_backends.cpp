// The backends compiled into this build: the two host backends always, the CUDA ones when the
// build has CUDA. The registry (registry.cpp) starts from this list, so a new built-in backend
// is added here and nowhere else.
#include "core/builtin_backends.h"

namespace memeff::detail {

std::vector<std::shared_ptr<Backend>> builtin_backends() {
  std::vector<std::shared_ptr<Backend>> all;
  all.push_back(make_reference_backend());
  all.push_back(make_cpu_backend());
#if defined(MEMEFF_WITH_CUDA)
  all.push_back(make_cuda_sm90_backend());
  all.push_back(make_cuda_backend());
  all.push_back(make_cuda_math_backend());
  all.push_back(make_cuda_splitkv_backend());
#endif
  return all;
}

}  // namespace memeff::detail
