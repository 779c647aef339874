// The one workspace holder of the CUDA code: `bytes` of device scratch for one call, either the
// caller's (Options::workspace, checked for size and 16-byte alignment) or a stream-ordered
// allocation freed on the same stream, so the memory is reused as soon as the call's work is done.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "memeff/attention.h"

namespace memeff::cuda {

class Workspace {
 public:
  // The caller's workspace when `options` has one, else an allocation; `who` ("cuda_sm90
  // backward") names the call in the errors.
  Workspace(const char* who, std::size_t bytes, const Options& options, cudaStream_t stream);
  // Always an allocation (scratch that is not the caller's business, e.g. the ring's buffers).
  Workspace(const char* who, std::size_t bytes, cudaStream_t stream);
  // Frees an allocation on the stream, unchecked (release() checks).
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void* data() const { return data_; }
  // Frees an allocation on the stream now, checking the call; the caller's memory stays.
  void release();

 private:
  void allocate(const char* who, std::size_t bytes);

  void* data_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owned_ = false;
};

// The stream-ordered allocation under Workspace, for holders of their own (the ring's buffers):
// `bytes` on the current device, freed by stream_free on the same stream.
void* stream_allocate(const char* who, std::size_t bytes, cudaStream_t stream);
void stream_free(void* data, cudaStream_t stream) noexcept;

// Carves consecutive pieces out of a workspace, each rounded up to `align` bytes.
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(void* base, std::size_t align = 256)
      : base_(static_cast<unsigned char*>(base)), align_(align) {}
  template <class T>
  T* take(std::size_t count) {
    if (count == 0) return nullptr;
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += (count * sizeof(T) + align_ - 1) / align_ * align_;
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  unsigned char* base_;
  std::size_t align_;
  std::size_t used_ = 0;
};

}  // namespace memeff::cuda
