// The fused backends' shared reasons and errors (fused_backend.h).
#include "cuda/backends/fused_backend.h"

#include <sstream>
#include <string>
#include <vector>

#include "core/strings.h"

namespace memeff::detail {
namespace {

cuda::DeviceCaps caps_of(const cuda::ComputeCapability& cc) {
  return cuda::DeviceCaps{cc.major, cc.minor, cc.multiprocessors};
}

}  // namespace

std::vector<std::string> fused_problem_reasons(const Problem& pb, const char* backend,
                                               bool score_modifiers, cuda::DeviceCaps& caps,
                                               bool& usable) {
  std::vector<std::string> reasons;
  usable = false;
  if (pb.device.type != DeviceType::cuda) {
    reasons.push_back("tensors are on " + device_name(pb.device) + ", not a CUDA device");
    return reasons;
  }
  if (pb.dtype == DType::f32) {
    reasons.push_back("fp32 inputs: use cuda_math (the fused kernels take fp16/bf16)");
  } else if (pb.dtype != DType::f16 && pb.dtype != DType::bf16) {
    reasons.push_back(std::string(dtype_name(pb.dtype)) +
                      " inputs: the fused kernels take fp16/bf16");
  }
  if (!pb.vector_aligned) {
    reasons.push_back(
        "tensors not 16-byte aligned (pointers, or B/H/L strides not multiples of 16 bytes)");
  }
  if (pb.has_bias && pb.bias_dtype != DType::f32 && pb.bias_dtype != pb.dtype) {
    reasons.push_back(std::string("bias dtype ") + dtype_name(pb.bias_dtype) +
                      ": must be fp32 or the dtype of q");
  }
  // Window, ALiBi and softcap (issue 26): the sm90 and sm80 kernels (kScoreModifiers) and the
  // split-KV forward run them; a backend without them refuses them here rather than ignore them.
  if (!score_modifiers) {
    const std::vector<std::string> modifiers = score_modifier_reasons(pb, backend);
    reasons.insert(reasons.end(), modifiers.begin(), modifiers.end());
  }
  if (pb.has_dropout() && pb.k_start % 64 != 0) {
    reasons.push_back("k_start " + std::to_string(pb.k_start) +
                      " with dropout: the fused kernels draw the mask in whole 64-key blocks of "
                      "the global keys, so k_start must be a multiple of 64 (cuda_math takes any)");
  }
  const cuda::ComputeCapability cc = cuda::compute_capability(pb.device.index);
  if (!cc.ok) {
    reasons.push_back(cc.error);
    return reasons;
  }
  caps = caps_of(cc);
  usable = true;
  return reasons;
}

cuda::DeviceCaps device_caps(int device) { return caps_of(cuda::compute_capability(device)); }

void add_fused_backward_reasons(const Problem& pb, std::vector<std::string>& reasons) {
  if (pb.has_bias && !(pb.scale > 0.0)) {
    std::ostringstream os;
    os << "a bias with scale " << pb.scale
       << " <= 0: the backward's -inf bias masking needs a positive scale";
    reasons.push_back(os.str());
  }
}

void throw_cannot_run(const char* backend, Pass pass, const std::vector<std::string>& reasons) {
  throw Error(ErrorCode::unsupported, std::string(backend) + " " +
                                          (pass == Pass::forward ? "forward" : "backward") +
                                          " cannot run these tensors: " + join(reasons, "; "));
}

}  // namespace memeff::detail
