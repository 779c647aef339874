// Workspace (workspace.h).
#include "cuda/runtime/workspace.h"

#include <cstdint>
#include <string>

#include "cuda/runtime/check.h"
#include "memeff/error.h"

namespace memeff::cuda {

Workspace::Workspace(const char* who, std::size_t bytes, const Options& options,
                     cudaStream_t stream)
    : stream_(stream) {
  if (bytes == 0) return;
  if (options.workspace == nullptr) {
    allocate(who, bytes);
    return;
  }
  if (options.workspace_bytes < bytes) {
    throw Error(ErrorCode::invalid_argument, std::string("argument `workspace_bytes`: the ") + who +
                                                 " needs " + std::to_string(bytes) +
                                                 " bytes of workspace (see workspace_size), got " +
                                                 std::to_string(options.workspace_bytes));
  }
  if ((reinterpret_cast<std::uintptr_t>(options.workspace) & 15u) != 0) {
    throw Error(ErrorCode::invalid_argument,
                "argument `workspace`: expected a 16-byte aligned pointer");
  }
  data_ = options.workspace;
}

Workspace::Workspace(const char* who, std::size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes > 0) allocate(who, bytes);
}

void* stream_allocate(const char* who, std::size_t bytes, cudaStream_t stream) {
  void* data = nullptr;
  check_cuda(
      cudaMallocAsync(&data, bytes, stream),
      ("cudaMallocAsync(" + std::to_string(bytes) + " bytes of " + who + " workspace)").c_str());
  return data;
}

void stream_free(void* data, cudaStream_t stream) noexcept { cudaFreeAsync(data, stream); }

void Workspace::allocate(const char* who, std::size_t bytes) {
  data_ = stream_allocate(who, bytes, stream_);
  owned_ = true;
}

void Workspace::release() {
  if (!owned_) return;
  owned_ = false;
  check_cuda(cudaFreeAsync(data_, stream_), "cudaFreeAsync(workspace)");
}

Workspace::~Workspace() {
  if (owned_) stream_free(data_, stream_);
}

}  // namespace memeff::cuda
