// CudaGenerator (include/memeff/cuda_generator.h): a device-side offset counter advanced by a
// one-thread kernel in the stream, so seed/offset reach the attention kernels through device
// memory and CUDA-graph replays draw fresh masks while eager runs stay reproducible.
#include <cuda_runtime.h>

#include <string>

#include "cuda/runtime/check.h"
#include "cuda/runtime/device.h"
#include "memeff/cuda_generator.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using cuda::check_cuda;

// Atomic, so draws on streams that the device runs at once (threads sharing a generator, each on
// a stream of its own) still take distinct offsets; a read and a separate increment could give
// two of them one offset, hence one mask.
__global__ void draw_kernel(std::uint64_t seed, std::uint64_t* counter, std::uint64_t* state) {
  static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long));
  state[0] = seed;
  state[1] = atomicAdd(reinterpret_cast<unsigned long long*>(counter), 1ull);
}

using cuda::DeviceScope;

}  // namespace

CudaGenerator::CudaGenerator(std::uint64_t seed, int device, std::uint64_t offset)
    : seed_(seed), device_(device) {
  if (device < 0) {
    throw Error(ErrorCode::invalid_argument,
                "argument `device`: expected a CUDA ordinal >= 0, got " + std::to_string(device));
  }
  DeviceScope guard(device);
  check_cuda(cudaMalloc(&counter_, sizeof(std::uint64_t)), "cudaMalloc(generator counter)");
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
    throw Error(ErrorCode::invalid_argument,
                "argument `state`: expected two device words, got null");
  }
  DeviceScope guard(device_);
  draw_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(seed_, counter_, state);
  check_cuda(cudaGetLastError(), "CudaGenerator::draw kernel launch");
  RngState rng;
  rng.seed = seed_;
  rng.offset = 0;
  rng.device_seed = state;
  rng.device_offset = state + 1;
  return rng;
}

std::uint64_t CudaGenerator::offset() const {
  DeviceScope guard(device_);
  std::uint64_t value = 0;
  check_cuda(cudaMemcpy(&value, counter_, sizeof(value), cudaMemcpyDeviceToHost),
             "cudaMemcpy(generator counter -> host)");
  return value;
}

void CudaGenerator::set_offset(std::uint64_t offset) {
  DeviceScope guard(device_);
  check_cuda(cudaMemcpy(counter_, &offset, sizeof(offset), cudaMemcpyHostToDevice),
             "cudaMemcpy(host -> generator counter)");
}

}  // namespace memeff
