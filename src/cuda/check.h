// The one CUDA error check of the library's host code: a failed runtime call becomes
// memeff::Error with ErrorCode::cuda_error, naming the call.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "memeff/error.h"

namespace memeff::cuda {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(ErrorCode::cuda_error, std::string(what) + ": " + cudaGetErrorString(err));
  }
}

}  // namespace memeff::cuda
