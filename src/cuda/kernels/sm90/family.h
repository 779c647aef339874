// The sm90 family (Hopper: TMA, wgmma, warp specialization; compute capability 9.0 and an
// sm_90a build) behind the "cuda_sm90" backend: the interface of common/family.h.
// fwd_launch.cu and bwd_launch.cu.
#pragma once

#include "cuda/kernels/common/family.h"

namespace memeff::cuda::sm90 {

struct Family {
  static constexpr const char* kBackend = "cuda_sm90";
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

// Whether this build compiled the sm90 kernels for sm_90a (else they are stubs).
bool kernels_built();

}  // namespace memeff::cuda::sm90
