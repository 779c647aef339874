// The two fused backends, "cuda" (sm80 family) and "cuda_sm90" (sm90 family), as one template
// over the kernel family (kernels/common/family.h): the problem-level reasons both share, the
// family's own, the workspace, the device scope, the packed offsets' check and the empty edges,
// written once. Each backend file instantiates it.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/backends/cuda_backend_base.h"
#include "cuda/kernels/common/family.h"
#include "cuda/runtime/device.h"
#include "cuda/runtime/problem_params.h"
#include "cuda/runtime/workspace.h"
#include "memeff/error.h"

namespace memeff::detail {

// Reasons any fused kernel refuses a problem before its family's own checks: not a CUDA device,
// fp32 or other dtypes, misaligned views, a bias of a third dtype, window/ALiBi/softcap where the
// kernels lack them (`score_modifiers` false; `backend` names the kernels in the reason), dropout
// at a k_start off the 64-key blocks, no device code for the device. Sets `caps` when the device
// could be read (then `usable` is true).
std::vector<std::string> fused_problem_reasons(const Problem& pb, const char* backend,
                                               bool score_modifiers, cuda::DeviceCaps& caps,
                                               bool& usable);
// ErrorCode::unsupported: "<backend> <pass> cannot run these tensors: <reasons>".
[[noreturn]] void throw_cannot_run(const char* backend, Pass pass,
                                   const std::vector<std::string>& reasons);
// The backward's reason of every fused family: a bias with scale <= 0 (the kernels clamp a score
// before they add the bias, which needs scale > 0: common/mask.cuh, bias_safe_score).
void add_fused_backward_reasons(const Problem& pb, std::vector<std::string>& reasons);
cuda::DeviceCaps device_caps(int device);

template <class Family>
class FusedBackend final : public CudaBackendBase {
 public:
  std::string name() const override { return Family::kBackend; }

  std::vector<std::string> reasons_unsupported(const Problem& pb, Pass pass) const override {
    cuda::DeviceCaps caps;
    bool usable = false;
    std::vector<std::string> reasons =
        fused_problem_reasons(pb, Family::kBackend, Family::kScoreModifiers, caps, usable);
    if (!usable) return reasons;
    const std::vector<std::string> family =
        pass == Pass::forward ? Family::forward_reasons(cuda::forward_params(pb), caps)
                              : Family::backward_reasons(cuda::backward_params(pb), caps);
    reasons.insert(reasons.end(), family.begin(), family.end());
    if (pass == Pass::backward) add_fused_backward_reasons(pb, reasons);
    return reasons;
  }

  std::size_t workspace_bytes(const Problem& pb, Pass pass) const override {
    if (pb.B == 0 || pb.Hq == 0 || pb.Lq == 0) return 0;
    if (pass == Pass::forward) return Family::forward_workspace_bytes(cuda::forward_params(pb));
    if (pb.Lk == 0) return 0;
    // dbias may be asked for: its accumulator counts when the bias's shape reduces it.
    return Family::backward_workspace_bytes(cuda::backward_params(pb));
  }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    cuda::DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    cuda::check_packed_offsets(args, pb, stream);
    if (pb.B == 0 || pb.Hq == 0 || pb.Lq == 0) return;
    const cuda::ForwardParams p = cuda::forward_params(pb, args, out, lse);
    // Alignment and strides are known only now: refuse with the kernels' reasons.
    const cuda::DeviceCaps caps = device_caps(pb.device.index);
    const std::vector<std::string> reasons = Family::forward_reasons(p, caps);
    if (!reasons.empty()) throw_cannot_run(Family::kBackend, Pass::forward, reasons);
    // Lk == 0 (packed: a sequence without keys) writes out 0, lse -inf.
    cuda::Workspace workspace(workspace_owner(Pass::forward), Family::forward_workspace_bytes(p),
                              options, stream);
    Family::forward(p, workspace.data(), cuda::elem_type(pb.dtype), caps, stream);
    workspace.release();
  }

  void backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g,
                const Options& options) override {
    cuda::DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    cuda::check_packed_offsets(args, pb, stream);
    // Packed calls with Lq, Lk the longest sequence's: all sequences empty on one side. Single
    // empty sequences are the kernels' (a sequence without queries still gets its key blocks'
    // CTAs, which write dk = dv = 0; one without keys gets its dq rows from the zeroed
    // accumulator).
    if (cuda::backward_empty_edges(pb, g, stream)) return;
    const cuda::BackwardParams p = cuda::backward_params(pb, args, g, options);
    const cuda::DeviceCaps caps = device_caps(pb.device.index);
    std::vector<std::string> reasons = Family::backward_reasons(p, caps);
    add_fused_backward_reasons(pb, reasons);
    if (!reasons.empty()) throw_cannot_run(Family::kBackend, Pass::backward, reasons);
    cuda::Workspace workspace(workspace_owner(Pass::backward),
                              Family::backward_workspace_bytes(p), options, stream);
    Family::backward(p, workspace.data(), cuda::elem_type(pb.dtype), caps, stream);
    workspace.release();
  }

 private:
  // "<backend> forward" or "... backward", what a workspace's errors name: built once, not on
  // every call.
  static const char* workspace_owner(Pass pass) {
    static const std::string names[2] = {std::string(Family::kBackend) + " forward",
                                         std::string(Family::kBackend) + " backward"};
    return names[pass == Pass::backward ? 1 : 0].c_str();
  }
};

template <class Family>
std::shared_ptr<Backend> make_fused_backend() {
  return std::make_shared<FusedBackend<Family>>();
}

}  // namespace memeff::detail
