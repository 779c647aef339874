// Pieces the CUDA backends share (cuda: the sm80 mma.sync kernels, cuda_sm90: the Hopper
// kernels): CUDA error checks, the device scope of a call, the cached compute capability, the
// eligibility checks that do not depend on the kernel family, and the translation of a validated
// Problem and its views into the plain kernel params.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "cuda/launch/launch.h"
#include "cuda/params.h"
#include "memeff/attention.h"
#include "memeff/backend.h"

namespace memeff::detail {

void check(cudaError_t err, const char* what);

// Makes `device` current for the scope of a call and restores the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

struct ComputeCapability {
  bool ok = false;
  int major = 0, minor = 0;
  int multiprocessors = 0;  // SMs (the persistent sm90 grid's size)
  std::string name;         // "NVIDIA H200"; empty when the properties could not be read
  std::string error;
};
// Cached per device ordinal (cudaGetDeviceProperties takes tens of microseconds).
ComputeCapability compute_capability(int device);

cuda::ElemType elem_type(DType dtype);
// Strides of a view for the kernels: broadcast (size-1) dimensions get stride 0; a packed
// [total, H, last] view gets b stride 0 and its row stride as l (params.h).
cuda::Strides strides_of(const TensorView& t);
// Sizes, flags and RNG values only: what reasons_unsupported can know without views.
void fill_from_problem(cuda::ForwardParams& p, const Problem& pb);
void fill_from_views(cuda::ForwardParams& p, const AttentionArgs& args, const TensorView& out,
                     const TensorView& lse);

// The backward's parameters from a validated problem and its views: sizes, flags, RNG, the
// gradients and dbias (with its shape), the deterministic flag.
cuda::BackwardParams backward_params(const Problem& pb, const AttentionArgs& args,
                                     const BackwardTensors& g, const Options& options);
// The dbias shape a problem's bias gives (what workspace sizes depend on before views exist).
void fill_dbias_shape(cuda::BackwardParams& p, const Problem& pb);
// A packed call's offsets, when PackedSequences::check_offsets asks for it: copied to the host
// (a synchronization of `stream`) and validated; skipped while the stream captures a graph.
void check_packed_offsets(const AttentionArgs& args, const Problem& pb, cudaStream_t stream);
// The backward's empty edges, alike for every CUDA backend: B·Hq = 0 does nothing, Lk = 0 or
// Lq = 0 gives dq = dk = dv = dbias = 0 (those of them that have elements: packed calls, whose
// Lq and Lk are maximum lengths, can have both). Returns whether the call was one of them.
bool backward_empty_edges(const Problem& pb, const BackwardTensors& g, cudaStream_t stream);
// A backward's `needed` bytes of workspace: the caller's (Options::workspace, checked for size
// and 16-byte alignment) or a stream-ordered allocation, which release() frees on the stream (and
// the destructor, unchecked, when a launch threw). `backend` names it in the errors.
class StreamWorkspace {
 public:
  StreamWorkspace(const char* backend, std::size_t needed, const Options& options,
                  cudaStream_t stream);
  ~StreamWorkspace();
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;
  void* data() const { return data_; }
  void release();

 private:
  void* data_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owned_ = false;
};

// Reasons any fused CUDA kernel refuses a problem before its own checks: not a CUDA device,
// fp32 or other dtypes, misaligned views, a bias of a third dtype. Returns the device's compute
// capability in `cc` (cc.ok false: its error is already among the reasons).
std::vector<std::string> fused_kernel_reasons(const Problem& pb, ComputeCapability& cc);
// The base of the CUDA backends: autotuning times a candidate with CUDA events recorded on
// options.stream around it (on problem.device), and names the device by its GPU and compute
// capability ("NVIDIA H200 sm_90") so that a tuned winner is never reused on other hardware.
class CudaBackendBase : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::cuda; }
  // Every CUDA backend draws the mask and the causal diagonal at the global rows and keys and
  // honours kv_block (the fused kernels refuse dropout at a k_start off the 64-key blocks).
  bool supports_global_coordinates() const override { return true; }
  double time_ms(const Problem& problem, const Options& options,
                 const std::function<void()>& run) override;
  std::string device_label(Device device) const override;
};

}  // namespace memeff::detail
