// CudaBackendBase (cuda_backend_base.h).
#include "cuda/backends/cuda_backend_base.h"

#include <cuda_runtime.h>

#include "cuda/runtime/device.h"
#include "cuda/runtime/timing.h"

namespace memeff::detail {

double CudaBackendBase::time_ms(const Problem& problem, const Options& options,
                                const std::function<void()>& run) {
  return cuda::time_on_stream_ms(problem.device.index, static_cast<cudaStream_t>(options.stream),
                                 run);
}

std::string CudaBackendBase::device_label(Device device) const {
  if (device.type != DeviceType::cuda) return Backend::device_label(device);
  const cuda::ComputeCapability cc = cuda::compute_capability(device.index);
  if (cc.name.empty()) return "cuda:" + std::to_string(device.index) + " (unknown GPU)";
  return cc.name + " sm_" + std::to_string(cc.major) + std::to_string(cc.minor);
}

}  // namespace memeff::detail
