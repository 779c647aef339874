// The kernel-image probe (device.h): an empty kernel compiled for the same targets as every other
// kernel of the library, whose attributes the runtime can read only where one of them loads.
#include <cuda_runtime.h>

#include "cuda/runtime/device.h"

namespace memeff::cuda {
namespace {

__global__ void kernel_image_probe() {}

}  // namespace

int probe_kernel_image() {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, kernel_image_probe);
  if (err != cudaSuccess) cudaGetLastError();  // not sticky; keep it from later calls
  return static_cast<int>(err);
}

}  // namespace memeff::cuda
