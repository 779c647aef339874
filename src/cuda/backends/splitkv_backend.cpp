// The "cuda_splitkv" backend: the split-KV forward (kernels/sm80/splitkv.h) for calls with few
// queries per kv head (decode, chunked prefill), where the fused kernels fill a few rows of their
// 128-row tiles and launch too few CTAs. Forward only: its out and lse are the fused forward's, so
// the backward of cuda_sm90 or cuda runs after it. Windows, ALiBi and softcaps run in the kernel's
// modifiers' instantiations. The dispatcher puts it first for such shapes (core/dispatch.cpp);
// Options::backends or MEMEFF_BACKENDS force or avoid it.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "core/builtin_backends.h"
#include "cuda/backends/cuda_backend_base.h"
#include "cuda/backends/fused_backend.h"
#include "cuda/kernels/sm80/splitkv.h"
#include "cuda/runtime/device.h"
#include "cuda/runtime/problem_params.h"
#include "cuda/runtime/workspace.h"

namespace memeff::detail {
namespace {

using cuda::sm80::SplitKv;

class SplitKvBackend final : public CudaBackendBase {
 public:
  std::string name() const override { return SplitKv::kBackend; }

  std::vector<std::string> reasons_unsupported(const Problem& pb, Pass pass) const override {
    if (pass == Pass::backward) {
      return {
          "forward only: the backward of cuda_sm90 or cuda runs after this forward (its out "
          "and lse are theirs)"};
    }
    cuda::DeviceCaps caps;
    bool usable = false;
    std::vector<std::string> reasons =
        fused_problem_reasons(pb, SplitKv::kBackend, /*score_modifiers=*/true, caps, usable);
    if (!usable) return reasons;
    const std::vector<std::string> own = SplitKv::forward_reasons(cuda::forward_params(pb), caps);
    reasons.insert(reasons.end(), own.begin(), own.end());
    return reasons;
  }

  std::size_t workspace_bytes(const Problem& pb, Pass pass) const override {
    if (pass != Pass::forward || pb.B == 0 || pb.Hq == 0 || pb.Lq == 0) return 0;
    cuda::DeviceScope device(pb.device.index);
    const cuda::ForwardParams p = cuda::forward_params(pb);
    return SplitKv::plan(p, device_caps(pb.device.index),
                         SplitKv::ctas_per_sm(p, cuda::elem_type(pb.dtype)))
        .workspace_bytes;
  }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    cuda::DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    if (pb.B == 0 || pb.Hq == 0 || pb.Lq == 0) return;
    const cuda::ForwardParams p = cuda::forward_params(pb, args, out, lse);
    const cuda::DeviceCaps caps = device_caps(pb.device.index);
    const std::vector<std::string> reasons = SplitKv::forward_reasons(p, caps);
    if (!reasons.empty()) throw_cannot_run(SplitKv::kBackend, Pass::forward, reasons);
    // Lk == 0, or no key any query sees: one empty split per row block writes 0 and -inf.
    cuda::Workspace workspace(
        "cuda_splitkv forward",
        SplitKv::plan(p, caps, SplitKv::ctas_per_sm(p, cuda::elem_type(pb.dtype))).workspace_bytes,
        options, stream);
    SplitKv::forward(p, workspace.data(), cuda::elem_type(pb.dtype), caps, stream);
    workspace.release();
  }

  void backward(const Problem&, const AttentionArgs&, const BackwardTensors&,
                const Options&) override {
    throw_cannot_run(SplitKv::kBackend, Pass::backward,
                     reasons_unsupported(Problem{}, Pass::backward));
  }
};

}  // namespace

std::shared_ptr<Backend> make_cuda_splitkv_backend() { return std::make_shared<SplitKvBackend>(); }

}  // namespace memeff::detail
