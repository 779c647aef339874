// The base of the CUDA backends (the fused families' FusedBackend and cuda_math): autotuning
// times a candidate with CUDA events on options.stream of the problem's device, and names the
// device by its GPU and compute capability ("NVIDIA H200 sm_90") so that a tuned winner is never
// reused on other hardware.
#pragma once

#include <functional>
#include <string>

#include "memeff/backend.h"

namespace memeff::detail {

class CudaBackendBase : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::cuda; }
  // Every CUDA backend draws the mask and the causal diagonal at the global rows and keys and
  // honours kv_block (the fused kernels refuse dropout at a k_start off the 64-key blocks).
  bool supports_global_coordinates() const override { return true; }
  double time_ms(const Problem& problem, const Options& options,
                 const std::function<void()>& run) override;
  std::string device_label(Device device) const override;
};

}  // namespace memeff::detail
