// The one CUDA error check of the library: a failed runtime call or launch becomes memeff::Error
// (ErrorCode::cuda_error) naming what failed, and a once-per-device guard for the setup a kernel
// needs before its first launch on a device (its dynamic shared-memory opt-in), and the occupancy
// a launcher plans its grid order with.
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

// After a launch: the launch's own error (bad configuration, no kernel image), named `what`.
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

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

// A kernel's opt-in to `bytes` of dynamic shared memory (above the default 48 KB), once per
// device; `done` belongs to the kernel, `name` goes into the error.
template <class Kernel>
void opt_in_shared_memory(std::atomic<unsigned long long>& done, Kernel kernel, int bytes,
                          const char* name) {
  once_per_device(done, [&] {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
               (std::string("cudaFuncSetAttribute(") + name + ", max dynamic shared memory)")
                   .c_str());
  });
}

// How many CTAs of `kernel` (threads, dynamic shared memory as launched) an SM holds at once, as
// the runtime's occupancy calculator says, asked once and kept in `cached` (the kernel's own): a
// scheduling hint, so the first device asked answers for all. At least 1.
template <class Kernel>
int resident_ctas_per_sm(std::atomic<int>& cached, Kernel kernel, int threads, int smem_bytes) {
  int n = cached.load(std::memory_order_relaxed);
  if (n > 0) return n;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  n = n > 0 ? n : 1;
  cached.store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace memeff::cuda
