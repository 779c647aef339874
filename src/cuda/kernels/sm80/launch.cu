// The sm80 family's host interface (family.h): the reasons its kernels cannot run params (the
// checks shared with sm90 in common/reasons.h, the softcap's range among them, then its own
// device and grid bounds), the backward's workspace size, and the pick of the dtype x head-dim
// instantiation.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels/common/instances.cuh"
#include "cuda/kernels/common/varlen.cuh"
#include "cuda/kernels/sm80/bwd_traits.cuh"
#include "cuda/kernels/sm80/family.h"
#include "cuda/kernels/sm80/fwd_traits.cuh"
#include "cuda/kernels/sm80/instances.h"
#include "memeff/error.h"

namespace memeff::cuda::sm80 {
namespace {

void add_device_reasons(std::vector<std::string>& reasons, const DeviceCaps& dev) {
  if (dev.major < 8) {
    reasons.push_back(
        "needs compute capability 8.0 or newer (mma.sync bf16, cp.async); device has " +
        std::to_string(dev.major) + "." + std::to_string(dev.minor));
  }
}

[[noreturn]] void no_kernel(const char* pass, const ForwardParams& p, int largest) {
  throw Error(ErrorCode::unsupported,
              std::string("cuda ") + pass + ": head dims D = " + std::to_string(p.D) +
                  ", Dv = " + std::to_string(p.Dv) + " have no kernel (multiples of 8 up to " +
                  std::to_string(largest) + ")");
}

}  // namespace

std::vector<std::string> Family::forward_reasons(const ForwardParams& p, const DeviceCaps& dev) {
  std::vector<std::string> reasons;
  add_device_reasons(reasons, dev);
  add_common_reasons(reasons, p, ForwardHeadDims::largest);
  add_score_modifier_reasons(reasons, p);
  if (packed_layout(p)) {  // grid: (query tiles of all sequences, Hq)
    if (p.Hq > kMaxGridY) {
      reasons.push_back("Hq = " + std::to_string(p.Hq) +
                        " exceeds the grid's 65535 heads of a packed call");
    }
    if (varlen_tile_bound(p.total_q, p.B, p.Lq, kForwardBlockM) > kMaxGridX) {
      reasons.push_back(std::to_string(p.B) + " sequences of " + std::to_string(p.total_q) +
                        " query rows exceed the grid's 2^31 - 1 query tiles");
    }
  } else {  // grid: (B·Hq, query blocks)
    if (static_cast<std::int64_t>(p.B) * p.Hq > kMaxGridX) {
      reasons.push_back("B·Hq = " + std::to_string(static_cast<std::int64_t>(p.B) * p.Hq) +
                        " exceeds the grid's 2^31 - 1 blocks");
    }
    if (p.Lq > kMaxGridY * kForwardBlockM) {
      reasons.push_back("Lq = " + std::to_string(p.Lq) + " exceeds 65535 query blocks of " +
                        std::to_string(kForwardBlockM) + " rows");
    }
  }
  return reasons;
}

std::size_t Family::forward_workspace_bytes(const ForwardParams&) { return 0; }

void Family::forward(const ForwardParams& p, void*, ElemType type, const DeviceCaps&,
                     cudaStream_t stream) {
  if (p.Lq == 0 || p.B == 0 || p.Hq == 0) return;
  const int bucket = ForwardHeadDims::bucket_of(std::max(p.D, p.Dv));
  const bool ran = switch_instance(ForwardHeadDims{}, type, bucket, [&](auto inst) {
    using I = decltype(inst);
    run_forward<typename I::T, I::kHeadDim>(p, stream);  // Lk == 0 writes out 0, lse -inf
  });
  if (!ran) no_kernel("forward", p, ForwardHeadDims::largest);
}

std::vector<std::string> Family::backward_reasons(const BackwardParams& p, const DeviceCaps& dev) {
  std::vector<std::string> reasons;
  add_device_reasons(reasons, dev);
  add_common_reasons(reasons, p, BackwardHeadDims::largest, "", 2);  // dq, dk, dv: 4-byte pairs
  add_score_modifier_reasons(reasons, p);
  if (packed_layout(p)) {  // grid: (key tiles of all sequences, or the sequences; Hkv)
    if (p.Hkv > kMaxGridY) {
      reasons.push_back("Hkv = " + std::to_string(p.Hkv) +
                        " exceeds the grid's 65535 kv heads of a packed call");
    }
    if (varlen_tile_bound(p.total_k, p.B, p.Lk, kBackwardMinBlockN) > kMaxGridX) {
      reasons.push_back(std::to_string(p.B) + " sequences of " + std::to_string(p.total_k) +
                        " key rows exceed the grid's 2^31 - 1 key tiles");
    }
  } else {
    add_dense_backward_grid_reasons(reasons, p, kBackwardMinBlockN);
  }
  if (p.Lk > kMaxGridX || p.Lq > kMaxGridX) {
    reasons.push_back("Lq and Lk must be below 2^31");
  }
  return reasons;
}

std::size_t Family::backward_workspace_bytes(const BackwardParams& p) {
  return backward_workspace_layout(p).total;
}

void Family::backward(const BackwardParams& p, void* workspace, ElemType type,
                      const DeviceCaps& dev, cudaStream_t stream) {
  if (p.B == 0 || p.Hq == 0 || p.Lq == 0 || p.Lk == 0) {
    throw Error(ErrorCode::internal,
                "cuda backward: empty problems are handled by the backend, not the kernels");
  }
  if (workspace == nullptr) {
    throw Error(ErrorCode::invalid_argument, "argument `workspace`: the cuda backward needs " +
                                                 std::to_string(backward_workspace_bytes(p)) +
                                                 " bytes, got a null pointer");
  }
  const int bucket = BackwardHeadDims::bucket_of(std::max(p.D, p.Dv));
  const bool ran = switch_instance(BackwardHeadDims{}, type, bucket, [&](auto inst) {
    using I = decltype(inst);
    run_backward<typename I::T, I::kHeadDim>(p, workspace, dev.multiprocessors, stream);
  });
  if (!ran) no_kernel("backward", p, BackwardHeadDims::largest);
}

}  // namespace memeff::cuda::sm80
