// DeviceScope and the cached compute capability of each device (device.h).
#include "cuda/runtime/device.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "cuda/runtime/check.h"

namespace memeff::cuda {

DeviceScope::DeviceScope(int device) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    switched_ = true;
  }
}

DeviceScope::~DeviceScope() {
  if (switched_) cudaSetDevice(previous_);
}

namespace {

// Whether the probe's answer means "no device code of this build loads here"; another failure
// leaves the decision to the kernels' own launch checks.
bool no_kernel_image(cudaError_t err) {
  return err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction ||
         err == cudaErrorUnsupportedPtxVersion || err == cudaErrorInvalidPtx;
}

ComputeCapability read_capability(int device) {
  ComputeCapability cc;
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error so later launches are not blamed
    cc.error =
        "cudaGetDeviceProperties(" + std::to_string(device) + "): " + cudaGetErrorString(err);
    return cc;
  }
  cc.major = prop.major;
  cc.minor = prop.minor;
  cc.multiprocessors = prop.multiProcessorCount;
  cc.name = prop.name;
  // A device newer than every target of the build runs it only through the PTX; a device older
  // than compute_80 (or a build without PTX) has nothing to load.
  int previous = 0;
  cudaError_t image = cudaGetDevice(&previous);
  if (image == cudaSuccess) image = cudaSetDevice(device);
  if (image == cudaSuccess) image = static_cast<cudaError_t>(probe_kernel_image());
  cudaSetDevice(previous);
  cc.ok = !no_kernel_image(image);
  if (!cc.ok) {
    cudaGetLastError();
    cc.error = "this build has no device code for " + std::string(prop.name) +
               " (compute capability " + std::to_string(prop.major) + "." +
               std::to_string(prop.minor) + "): " + cudaGetErrorString(image) +
               "; rebuild with CMAKE_CUDA_ARCHITECTURES (or TORCH_CUDA_ARCH_LIST) covering it";
  }
  return cc;
}

}  // namespace

ComputeCapability compute_capability(int device) {
  static std::mutex mutex;
  static std::map<int, ComputeCapability> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it == cache.end()) it = cache.emplace(device, read_capability(device)).first;
  return it->second;
}

}  // namespace memeff::cuda
