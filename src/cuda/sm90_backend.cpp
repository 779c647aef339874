// The "cuda_sm90" backend: the Hopper-native forward and backward (warp-specialized, TMA and
// wgmma; src/cuda/sm90/, launched by src/cuda/launch/sm90_fwd_launch.cu and sm90_bwd_launch.cu).
// First in the default order on compute capability 9.0; it computes the same function with the
// same dropout mask as every other backend, so a pass it refuses (the backward for head dims
// above 128) goes to the next backend in the order, which works with this forward's out and lse.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "core/builtin_backends.h"
#include "core/dispatch_decision.h"
#include "cuda/backend_util.h"
#include "cuda/launch/launch.h"
#include "cuda/params.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff::detail {
namespace {

class CudaSm90Backend final : public CudaBackendBase {
 public:
  std::string name() const override { return "cuda_sm90"; }

  std::vector<std::string> reasons_unsupported(const Problem& pb, Pass pass) const override {
    ComputeCapability cc;
    std::vector<std::string> reasons = fused_kernel_reasons(pb, cc);
    if (!cc.ok) return reasons;
    if (pass == Pass::backward) {
      cuda::BackwardParams p;
      fill_from_problem(p, pb);
      const std::vector<std::string> kernel =
          cuda::sm90_backward_unsupported(p, cc.major, cc.minor, pb.packed);
      reasons.insert(reasons.end(), kernel.begin(), kernel.end());
      return reasons;
    }
    cuda::ForwardParams p;
    fill_from_problem(p, pb);
    const std::vector<std::string> kernel =
        cuda::sm90_forward_unsupported(p, cc.major, cc.minor, pb.packed);
    reasons.insert(reasons.end(), kernel.begin(), kernel.end());
    return reasons;
  }

  std::size_t workspace_bytes(const Problem& pb, Pass pass) const override {
    if (pass != Pass::backward || pb.B == 0 || pb.Hq == 0 || pb.Lq == 0 || pb.Lk == 0) return 0;
    cuda::BackwardParams p;
    fill_from_problem(p, pb);
    fill_dbias_shape(p, pb);  // dbias may be asked for: count its accumulator when it is reduced
    return cuda::sm90_backward_workspace_bytes(p, pb.packed);
  }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    check_packed_offsets(args, pb, stream);
    if (pb.B == 0 || pb.Hq == 0 || pb.Lq == 0) return;
    cuda::ForwardParams p;
    fill_from_problem(p, pb);
    fill_from_views(p, args, out, lse);
    // Alignment and strides are known only now: refuse with the kernel's reasons.
    const ComputeCapability cc = compute_capability(pb.device.index);
    const std::vector<std::string> reasons = cuda::sm90_forward_unsupported(p, cc.major, cc.minor);
    if (!reasons.empty()) {
      throw Error(ErrorCode::unsupported,
                  "cuda_sm90 forward cannot run these tensors: " + join(reasons, "; "));
    }
    // Lk == 0 (packed: a sequence without keys) writes out 0, lse -inf.
    cuda::launch_forward_sm90(p, elem_type(pb.dtype), cc.multiprocessors, stream);
  }

  void backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g,
                const Options& options) override {
    DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    check_packed_offsets(args, pb, stream);
    // Packed calls with Lq, Lk the longest sequence's: all sequences empty on one side. Single
    // empty sequences need nothing here: a sequence without queries still gets its key blocks'
    // CTAs (they write dk = dv = 0), one without keys none (its dq rows come from the zeroed
    // accumulator).
    if (backward_empty_edges(pb, g, stream)) return;
    const cuda::BackwardParams p = backward_params(pb, args, g, options);
    const ComputeCapability cc = compute_capability(pb.device.index);
    const std::vector<std::string> reasons = cuda::sm90_backward_unsupported(p, cc.major, cc.minor);
    if (!reasons.empty()) {
      throw Error(ErrorCode::unsupported,
                  "cuda_sm90 backward cannot run these tensors: " + join(reasons, "; "));
    }
    StreamWorkspace workspace("cuda_sm90", cuda::sm90_backward_workspace_bytes(p, pb.packed),
                              options, stream);
    cuda::launch_backward_sm90(p, workspace.data(), elem_type(pb.dtype), stream);
    workspace.release();
  }
};

}  // namespace

std::shared_ptr<Backend> make_cuda_sm90_backend() { return std::make_shared<CudaSm90Backend>(); }

}  // namespace memeff::detail
