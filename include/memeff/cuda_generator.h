// Graph-safe dropout randomness for the CUDA backends: a generator keeps its offset counter in
// device memory and advances it inside the stream, so a captured forward+backward replayed N
// times draws N different masks and each backward reads the state its forward used.
// No CUDA types here: streams are passed as void* (a cudaStream_t; null is the default stream).
#pragma once

#include <cstdint>

#include "memeff/attention.h"

namespace memeff {

class CudaGenerator {
 public:
  // Allocates the 8-byte device counter on CUDA device `device` and sets it to `offset`.
  CudaGenerator(std::uint64_t seed, int device, std::uint64_t offset = 0);
  ~CudaGenerator();
  CudaGenerator(const CudaGenerator&) = delete;
  CudaGenerator& operator=(const CudaGenerator&) = delete;

  // Enqueues on `stream` one tiny kernel that writes state[0] = seed, state[1] = counter and
  // advances the counter by one. `state` is two 64-bit words of device memory on the
  // generator's device, owned by the caller. The returned RngState points at them
  // (device_seed = state, device_offset = state + 1); seed is also filled in by value and
  // offset is left 0, since the drawn offset is known only on the device. Capturable.
  RngState draw(void* stream, std::uint64_t* state);

  std::uint64_t seed() const { return seed_; }
  int device() const { return device_; }
  // Host reads and writes of the counter; they synchronize with the device (not capturable).
  std::uint64_t offset() const;
  void set_offset(std::uint64_t offset);

 private:
  std::uint64_t seed_;
  int device_;
  std::uint64_t* counter_ = nullptr;  // device memory
};

}  // namespace memeff
