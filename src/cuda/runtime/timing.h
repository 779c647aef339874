// Event timing of work on a stream (autotuning's measurements): CUDA events recorded around
// `run` on `stream` of `device`, synchronized, in milliseconds.
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace memeff::cuda {

double time_on_stream_ms(int device, cudaStream_t stream, const std::function<void()>& run);

}  // namespace memeff::cuda
