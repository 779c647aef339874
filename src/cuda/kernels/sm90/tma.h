// Host side of the tensor memory accelerator: builds the TMA descriptor (CUtensorMap) of a
// [B, H, L, D] tensor with free B/H/L strides for the sm90 kernels. The driver's encoder is
// reached through the runtime's entry-point query, so nothing links libcuda directly.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "cuda/kernels/common/params.h"

namespace memeff::cuda::sm90 {

struct TmaTensor {
  const void* data = nullptr;
  bool bf16 = true;  // else fp16
  std::int64_t B = 0, H = 0, L = 0, D = 0;
  std::int64_t stride_b = 0, stride_h = 0, stride_l = 0;  // elements; the last dim is contiguous
};

// A map over dims (D, L, H, B) with boxes of 64 columns × box_rows rows and the 128-byte swizzle
// (the layout wgmma reads); elements outside the tensor load as zeros. Returns an empty string on
// success, else why the driver refused (the encoder's error names nothing itself).
std::string encode_tma_4d(CUtensorMap& map, const TmaTensor& t, int box_rows);

// The same, throwing memeff::Error (unsupported) that names `what` ("cuda_sm90 forward: `q`")
// when the driver refuses.
void encode_tma_4d_or_throw(CUtensorMap& map, const TmaTensor& t, int box_rows,
                            const std::string& what);

// A [B, H, L, D] tensor with the kernels' strides (cuda/params.h), as encode_tma_4d takes it.
inline TmaTensor tma_tensor(const void* data, bool bf16, int B, int H, std::int64_t L, int D,
                            const Strides& s) {
  return {data, bf16, B, H, L, D, s.b, s.h, s.l};
}

// A packed [total, H, D] tensor (params.h: b stride 0) as [1, H, total, D]: the kernels address
// sequence rows as packed rows (its first row plus the row inside it). A box that crosses the
// sequence's end reads the next sequence's rows, which the kernels mask by index or never store;
// only the tensor's own end zero-fills.
inline TmaTensor tma_tensor_packed(const void* data, bool bf16, int H, std::int64_t total, int D,
                                   const Strides& s) {
  return {data, bf16, 1, H, total, D, 0, s.h, s.l};
}

}  // namespace memeff::cuda::sm90
