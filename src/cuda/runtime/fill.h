// The one fill of the library: every element of a view (any dtype, rank 1 to 4, any strides) set
// to a value on a stream: the empty-problem edges of the CUDA backends and the ring's
// accumulators.
#pragma once

#include <cuda_runtime.h>

#include "memeff/tensor.h"

namespace memeff::cuda {

// On the current device; nothing for an undefined or empty view.
void fill(const TensorView& t, double value, cudaStream_t stream);

}  // namespace memeff::cuda
