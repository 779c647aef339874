// The sm80 family (mma.sync, FlashAttention-2 style; compute capability 8.0 and newer) behind
// the "cuda" backend: the interface of common/family.h. fwd_launch.cu and bwd_launch.cu.
#pragma once

#include "cuda/kernels/common/family.h"

namespace memeff::cuda::sm80 {

struct Family {
  static constexpr const char* kBackend = "cuda";
  static constexpr bool kScoreModifiers = true;  // window, ALiBi, softcap (ScoreMods)
  static std::vector<std::string> forward_reasons(const ForwardParams& p, const DeviceCaps& dev);
  static std::vector<std::string> backward_reasons(const BackwardParams& p, const DeviceCaps& dev);
  static std::size_t forward_workspace_bytes(const ForwardParams& p);
  static std::size_t backward_workspace_bytes(const BackwardParams& p);
  static void forward(const ForwardParams& p, void* workspace, ElemType type,
                      const DeviceCaps& dev, cudaStream_t stream);
  static void backward(const BackwardParams& p, void* workspace, ElemType type,
                       const DeviceCaps& dev, cudaStream_t stream);
};

}  // namespace memeff::cuda::sm80
