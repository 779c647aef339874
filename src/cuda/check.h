// Host-side helpers of the kernel launchers: the one CUDA error check (a failed runtime call
// becomes memeff::Error with ErrorCode::cuda_error, naming the call) and the once-per-device
// setup of a kernel (its dynamic shared-memory opt-in).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "memeff/error.h"

namespace memeff::cuda {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(ErrorCode::cuda_error, std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// Runs `setup` the first time it is asked for on the current device; `done` remembers the
// devices (one bit per ordinal) and belongs to one kernel.
template <class Setup>
void once_per_device(std::atomic<unsigned long long>& done, Setup&& setup) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const unsigned long long bit = 1ull << (device & 63);
  if (done.load(std::memory_order_acquire) & bit) return;
  setup();
  done.fetch_or(bit, std::memory_order_acq_rel);
}

}  // namespace memeff::cuda
