// CudaGenerator (include/memeff/cuda_generator.h): a device-side offset counter advanced by a
// one-thread kernel in the stream, so seed/offset reach the attention kernels through device
// memory and CUDA-graph replays draw fresh masks while eager runs stay reproducible.
#include <cuda_runtime.h>

#include <string>

#include "memeff/cuda_generator.h"
#include "memeff/error.h"

namespace memeff {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(ErrorCode::cuda_error, std::string(what) + ": " + cudaGetErrorString(err));
  }
}

__global__ void draw_kernel(std::uint64_t seed, std::uint64_t* counter, std::uint64_t* state) {
  state[0] = seed;
  state[1] = *counter;
  *counter += 1;
}

// Restores the caller's current device when it leaves scope.
struct DeviceGuard {
  int previous = 0;
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous), "cudaGetDevice");
    if (previous != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous); }
};

}  // namespace

CudaGenerator::CudaGenerator(std::uint64_t seed, int device, std::uint64_t offset)
    : seed_(seed), device_(device) {
  if (device < 0) {
    throw Error(ErrorCode::invalid_argument,
                "argument `device`: expected a CUDA ordinal >= 0, got " + std::to_string(device));
  }
  DeviceGuard guard(device);
  check(cudaMalloc(&counter_, sizeof(std::uint64_t)), "cudaMalloc(generator counter)");
  try {
    set_offset(offset);
  } catch (...) {
    cudaFree(counter_);
    throw;
  }
}

CudaGenerator::~CudaGenerator() {
  if (counter_ == nullptr) return;
  int previous = 0;
  if (cudaGetDevice(&previous) == cudaSuccess) {
    cudaSetDevice(device_);
    cudaFree(counter_);
    cudaSetDevice(previous);
  }
}

RngState CudaGenerator::draw(void* stream, std::uint64_t* state) {
  if (state == nullptr) {
    throw Error(ErrorCode::invalid_argument, "argument `state`: expected two device words, got null");
  }
  DeviceGuard guard(device_);
  draw_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(seed_, counter_, state);
  check(cudaGetLastError(), "CudaGenerator::draw kernel launch");
  RngState rng;
  rng.seed = seed_;
  rng.offset = 0;
  rng.device_seed = state;
  rng.device_offset = state + 1;
  return rng;
}

std::uint64_t CudaGenerator::offset() const {
  DeviceGuard guard(device_);
  std::uint64_t value = 0;
  check(cudaMemcpy(&value, counter_, sizeof(value), cudaMemcpyDeviceToHost),
        "cudaMemcpy(generator counter -> host)");
  return value;
}

void CudaGenerator::set_offset(std::uint64_t offset) {
  DeviceGuard guard(device_);
  check(cudaMemcpy(counter_, &offset, sizeof(offset), cudaMemcpyHostToDevice),
        "cudaMemcpy(host -> generator counter)");
}

}  // namespace memeff
