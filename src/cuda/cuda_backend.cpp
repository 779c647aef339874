// The "cuda" backend: the fused mma.sync kernels (src/cuda/sm80/, launched by src/cuda/launch/). It turns a validated
// Problem and its views into the plain kernel params, says why it cannot run a problem (dtype,
// device, head dim, alignment, strides), handles the empty-length edges itself and owns the
// backward workspace (the caller's, or a stream-ordered allocation).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/builtin_backends.h"
#include "core/dispatch_decision.h"
#include "cuda/backend_util.h"
#include "cuda/launch/launch.h"
#include "cuda/sm80/fwd_dispatch.cuh"
#include "cuda/params.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff::detail {
namespace {

using cuda::BackwardParams;
using cuda::ForwardParams;
using cuda::Strides;

class CudaBackend final : public CudaBackendBase {
 public:
  std::string name() const override { return "cuda"; }

  std::vector<std::string> reasons_unsupported(const Problem& pb, Pass pass) const override {
    ComputeCapability cc;
    std::vector<std::string> reasons = fused_kernel_reasons(pb, cc);
    if (!cc.ok) return reasons;
    std::vector<std::string> kernel_reasons;
    if (pass == Pass::forward) {
      ForwardParams p;
      fill_from_problem(p, pb);
      kernel_reasons = cuda::forward_unsupported(p, cc.major, cc.minor);
    } else {
      BackwardParams p;
      fill_from_problem(p, pb);
      kernel_reasons = cuda::backward_unsupported(p, cc.major, cc.minor);
    }
    reasons.insert(reasons.end(), kernel_reasons.begin(), kernel_reasons.end());
    return reasons;
  }

  std::size_t workspace_bytes(const Problem& pb, Pass pass) const override {
    if (pass != Pass::backward || pb.Lq == 0 || pb.Lk == 0) return 0;
    BackwardParams p;
    fill_from_problem(p, pb);
    fill_dbias_shape(p, pb);  // dbias may be asked for: count its accumulator when it is reduced
    return cuda::backward_workspace_bytes(p);
  }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    check_packed_offsets(args, pb, stream);
    if (pb.B == 0 || pb.Hq == 0 || pb.Lq == 0) return;
    ForwardParams p;
    fill_from_problem(p, pb);
    fill_from_views(p, args, out, lse);
    // Alignment and strides are known only now: refuse with the kernel's reasons.
    const ComputeCapability cc = compute_capability(pb.device.index);
    const std::vector<std::string> reasons = cuda::forward_unsupported(p, cc.major, cc.minor);
    if (!reasons.empty()) {
      throw Error(ErrorCode::unsupported, "cuda forward cannot run these tensors: " + join(reasons, "; "));
    }
    cuda::launch_forward(p, elem_type(pb.dtype), stream);  // Lk == 0 writes out 0, lse -inf
  }

  void backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g,
                const Options& options) override {
    DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    check_packed_offsets(args, pb, stream);
    if (backward_empty_edges(pb, g, stream)) return;
    const BackwardParams p = backward_params(pb, args, g, options);
    const ComputeCapability cc = compute_capability(pb.device.index);
    const std::vector<std::string> reasons = cuda::backward_unsupported(p, cc.major, cc.minor);
    if (!reasons.empty()) {
      throw Error(ErrorCode::unsupported, "cuda backward cannot run these tensors: " + join(reasons, "; "));
    }
    StreamWorkspace workspace("cuda", cuda::backward_workspace_bytes(p), options, stream);
    cuda::launch_backward(p, workspace.data(), elem_type(pb.dtype), stream);
    workspace.release();
  }
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend() { return std::make_shared<CudaBackend>(); }

}  // namespace memeff::detail
