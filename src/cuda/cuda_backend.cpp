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

cuda::FillKind fill_kind(DType dtype) {
  switch (dtype) {
    case DType::bf16: return cuda::FillKind::bf16;
    case DType::f16: return cuda::FillKind::f16;
    default: return cuda::FillKind::f32;
  }
}

void fill_view(const TensorView& t, float value, cudaStream_t stream) {
  if (!t.defined() || t.numel() == 0) return;
  std::int64_t shape[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 1};
  const int pad = 4 - t.rank;  // views of rank < 4 (lse) get leading unit dimensions
  for (int d = 0; d < t.rank; ++d) {
    shape[pad + d] = t.shape[d];
    stride[pad + d] = t.stride[d];
  }
  if (shape[3] > 1 && stride[3] != 1) {
    throw Error(ErrorCode::internal, "fill_view: last dimension of " + t.describe() +
                                         " is not contiguous");
  }
  cuda::fill_strided(t.data, fill_kind(t.dtype), shape, stride, value, stream);
}

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
    if (pb.has_bias) {  // dbias may be asked for: count its accumulator when it is reduced
      p.dbias_shape[0] = pb.bias_bcast_b ? 1 : static_cast<int>(pb.B);
      p.dbias_shape[1] = pb.bias_bcast_h ? 1 : static_cast<int>(pb.Hq);
      p.dbias_shape[2] = pb.bias_bcast_q ? 1 : static_cast<int>(pb.Lq);
    }
    return cuda::backward_workspace_bytes(p);
  }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    if (pb.B == 0 || pb.Hq == 0 || pb.Lq == 0) return;
    ForwardParams p;
    fill_from_problem(p, pb);
    fill_from_views(p, args, out, lse);
    if (pb.Lq > 1 && lse.stride[2] != 1) {
      throw Error(ErrorCode::unsupported,
                  "cuda forward: lse must have a contiguous last dimension, got " + lse.describe());
    }
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
    if (pb.B == 0 || pb.Hq == 0) return;
    if (pb.Lk == 0) {  // no keys: every gradient is zero (dk, dv and dbias are empty)
      fill_view(g.dq, 0.0f, stream);
      return;
    }
    if (pb.Lq == 0) {  // no queries: dq is empty, nothing flows into k, v or the bias
      fill_view(g.dk, 0.0f, stream);
      fill_view(g.dv, 0.0f, stream);
      if (g.dbias) fill_view(*g.dbias, 0.0f, stream);
      return;
    }
    BackwardParams p;
    fill_from_problem(p, pb);
    fill_from_views(p, args, g.out, g.lse);
    p.dout = g.dout.data;
    p.dq = g.dq.data;
    p.dk = g.dk.data;
    p.dv = g.dv.data;
    p.dout_stride = strides_of(g.dout);
    p.dq_stride = strides_of(g.dq);
    p.dk_stride = strides_of(g.dk);
    p.dv_stride = strides_of(g.dv);
    if (g.dbias) {
      p.dbias = g.dbias->data;
      p.dbias_stride = strides_of(*g.dbias);
      for (int d = 0; d < 3; ++d) p.dbias_shape[d] = static_cast<int>(g.dbias->shape[d]);
    }
    p.deterministic = options.deterministic;
    if (pb.Lq > 1 && g.lse.stride[2] != 1) {
      throw Error(ErrorCode::unsupported,
                  "cuda backward: lse must have a contiguous last dimension, got " + g.lse.describe());
    }
    const ComputeCapability cc = compute_capability(pb.device.index);
    const std::vector<std::string> reasons = cuda::backward_unsupported(p, cc.major, cc.minor);
    if (!reasons.empty()) {
      throw Error(ErrorCode::unsupported, "cuda backward cannot run these tensors: " + join(reasons, "; "));
    }

    const std::size_t needed = cuda::backward_workspace_bytes(p);
    void* workspace = options.workspace;
    bool owned = false;
    if (needed > 0) {
      if (workspace != nullptr) {
        if (options.workspace_bytes < needed) {
          throw Error(ErrorCode::invalid_argument,
                      "argument `workspace_bytes`: the cuda backward needs " + std::to_string(needed) +
                          " bytes of workspace, got " + std::to_string(options.workspace_bytes));
        }
        if ((reinterpret_cast<std::uintptr_t>(workspace) & 15u) != 0) {
          throw Error(ErrorCode::invalid_argument,
                      "argument `workspace`: expected a 16-byte aligned pointer");
        }
      } else {
        check(cudaMallocAsync(&workspace, needed, stream), "cudaMallocAsync(backward workspace)");
        owned = true;
      }
    }
    try {
      cuda::launch_backward(p, workspace, elem_type(pb.dtype), stream);
    } catch (...) {
      if (owned) cudaFreeAsync(workspace, stream);
      throw;
    }
    if (owned) check(cudaFreeAsync(workspace, stream), "cudaFreeAsync(backward workspace)");
  }
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend() { return std::make_shared<CudaBackend>(); }

}  // namespace memeff::detail
