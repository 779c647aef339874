// Device memory, timing and device discovery for the memeff program: one interface over host
// memory (std::chrono timing) and CUDA memory (cudaMalloc, CUDA events), so the commands are
// written once for both. Without MEMEFF_WITH_CUDA, asking for a CUDA device throws memeff::Error.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "memeff/tensor.h"

namespace memeff::cli {

// Whether CUDA can be used here, and why not.
struct CudaStatus {
  bool compiled = false;  // the build has CUDA
  int device_count = 0;
  std::string why_not;    // empty when a device is usable
};
CudaStatus cuda_status();

// "cpu (16 threads, avx512 kernels)" or "cuda:0 (NVIDIA H200, sm_90, 139 GiB)".
std::string device_description(Device device);

// An owning allocation on the host or a CUDA device. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, std::size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  void upload(const void* host, std::size_t bytes);  // host → buffer, bytes <= size
  void download(void* host, std::size_t bytes) const;  // buffer → host
  void fill_bytes(unsigned char value);               // e.g. 0xFF poisons floats with NaN

 private:
  void release() noexcept;
  // Copies between host memory and this buffer's memory (`to_device`: host to buffer).
  void copy(void* to, const void* from, std::size_t bytes, bool to_device) const;
  Device device_{};
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Times one region: CUDA events on the default stream for a CUDA device, the steady clock on
// the CPU. stop() waits for the work and returns milliseconds.
class Timer {
 public:
  explicit Timer(Device device);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start();
  double stop();

 private:
  Device device_;
  void* start_event_ = nullptr;
  void* stop_event_ = nullptr;
  std::chrono::steady_clock::time_point t0_{};
};

void synchronize(Device device);
// Free bytes of the device (cudaMemGetInfo); 0 on the CPU.
std::size_t device_free_bytes(Device device);

// Evicts the L2 cache between timed calls by writing a buffer larger than it (256 MiB) on the
// default stream. A no-op on the CPU.
class L2Flusher {
 public:
  explicit L2Flusher(Device device);
  void flush();

 private:
  Buffer scratch_;
};

}  // namespace memeff::cli
