// Host-side setup shared by the warp-specialized sm90 kernels (forward and backward): once per
// device and kernel, the dynamic shared-memory opt-in and the check that the launch allocates the
// registers the kernel's setmaxnreg split redistributes.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "cuda/runtime/check.h"
#include "memeff/error.h"

namespace memeff::cuda::sm90 {

// `Traits` gives kThreads and the split kProducerRegs + kConsumers·kConsumerRegs
// (per thread of each 128-thread warpgroup), `smem_bytes` the kernel's dynamic shared memory.
// The consumers' setmaxnreg.inc would wait forever if the launch allocated fewer registers than
// the split needs: refuse instead. `done` belongs to one kernel; `name` ("sm90 forward kernel")
// goes into the messages.
template <class Traits, class Kernel>
void setup_warp_specialized(std::atomic<unsigned long long>& done, Kernel kernel, int smem_bytes,
                            const char* name) {
  once_per_device(done, [&] {
    check_cuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
        (std::string("cudaFuncSetAttribute(") + name + ", max dynamic shared memory)").c_str());
    cudaFuncAttributes attr{};
    check_cuda(cudaFuncGetAttributes(&attr, kernel),
               (std::string("cudaFuncGetAttributes(") + name + ")").c_str());
    if (128 * (Traits::kProducerRegs + Traits::kConsumers * Traits::kConsumerRegs) >
        attr.numRegs * Traits::kThreads) {
      throw Error(ErrorCode::unsupported,
                  std::string("cuda_sm90: the ") + name + " was built with " +
                      std::to_string(attr.numRegs) +
                      " registers per thread, too few for its setmaxnreg split");
    }
  });
}

}  // namespace memeff::cuda::sm90
