// The device a call runs on: a scope that makes it current and restores the caller's device, and
// its compute capability, multiprocessor count and name, read once per device and cached, with
// whether this build has device code that loads on it (the kernel-image probe).
#pragma once

#include <string>

namespace memeff::cuda {

// Makes `device` current for the scope of a call and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

struct ComputeCapability {
  bool ok = false;  // the properties were read and this build's device code loads on the device
  int major = 0, minor = 0;
  int multiprocessors = 0;  // SMs (the persistent sm90 grid's size)
  std::string name;         // "NVIDIA H200"; empty when the properties could not be read
  std::string error;        // why not ok
};
// Cached per device ordinal (cudaGetDeviceProperties takes tens of microseconds).
ComputeCapability compute_capability(int device);

// Whether this build's device code loads on the current device: cudaSuccess when one of its
// kernel images (sm_80, sm_90a) or its PTX (compute_80, compiled by the driver) fits, else the
// error (cudaErrorNoKernelImageForDevice for a device none of them covers). probe.cu.
int probe_kernel_image();

}  // namespace memeff::cuda
