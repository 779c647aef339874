// TMA descriptor encoding for the sm90 kernels (see tma.h).
#include "cuda/kernels/sm90/tma.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "memeff/error.h"

namespace memeff::cuda::sm90 {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder(std::string& error) {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                             cudaEnableDefault, &status);
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr) {
      cudaGetLastError();
      failure = std::string("the driver has no cuTensorMapEncodeTiled (") +
                (err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found") + ")";
      return;
    }
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  });
  error = failure;
  return fn;
}

}  // namespace

std::string encode_tma_4d(CUtensorMap& map, const TmaTensor& t, int box_rows) {
  std::string error;
  const auto encode = encoder(error);
  if (!encode) return error;
  constexpr std::uint64_t kElem = 2;  // bytes
  // Size-1 dimensions are never stepped over; give them a stride the encoder accepts.
  auto stride_bytes = [](std::int64_t size, std::int64_t stride, std::uint64_t fallback) {
    return size == 1 ? fallback : static_cast<std::uint64_t>(stride) * kElem;
  };
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.D), static_cast<cuuint64_t>(t.L),
                              static_cast<cuuint64_t>(t.H), static_cast<cuuint64_t>(t.B)};
  const std::uint64_t row_bytes = (static_cast<std::uint64_t>(t.D) * kElem + 15) / 16 * 16;
  const std::uint64_t s_l = stride_bytes(t.L, t.stride_l, row_bytes);
  const std::uint64_t s_h = stride_bytes(t.H, t.stride_h, s_l * static_cast<std::uint64_t>(t.L));
  const std::uint64_t s_b = stride_bytes(t.B, t.stride_b, s_h * static_cast<std::uint64_t>(t.H));
  const cuuint64_t strides[3] = {s_l, s_h, s_b};
  // The encoder's own limits, checked here so that a tensor TMA cannot describe (a bias whose
  // rows are not whole 16-byte units, say) is refused with a reason and never reaches the driver
  // as an invalid call: a 16-byte aligned base, strides multiples of 16 bytes below 2^40.
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) {
    return "the base address is not 16-byte aligned";
  }
  for (const std::uint64_t s : {s_l, s_h, s_b}) {
    if (s % 16 != 0 || s >= (std::uint64_t{1} << 40)) {
      return "byte strides (" + std::to_string(s_l) + ", " + std::to_string(s_h) + ", " +
             std::to_string(s_b) + ") are not all multiples of 16 below 2^40";
    }
  }
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  auto encode_map = [&] {
    return encode(&map, t.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                  4, const_cast<void*>(t.data), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult r = encode_map();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // The driver call needs a current context, which a thread gets from its first runtime call
    // (seen on the H200: PyTorch's autograd device thread reaching the backward before any
    // runtime call of its own). cudaFree(nullptr) binds the current device's primary context.
    cudaFree(nullptr);
    r = encode_map();
  }
  if (r != CUDA_SUCCESS) {
    return "cuTensorMapEncodeTiled refused dims (" + std::to_string(t.D) + ", " +
           std::to_string(t.L) + ", " + std::to_string(t.H) + ", " + std::to_string(t.B) +
           ") with byte strides (" + std::to_string(s_l) + ", " + std::to_string(s_h) + ", " +
           std::to_string(s_b) + "): CUresult " + std::to_string(static_cast<int>(r));
  }
  return {};
}

void encode_tma_4d_or_throw(CUtensorMap& map, const TmaTensor& t, int box_rows,
                            const std::string& what) {
  const std::string error = encode_tma_4d(map, t, box_rows);
  if (!error.empty()) throw Error(ErrorCode::unsupported, what + ": TMA descriptor: " + error);
}

}  // namespace memeff::cuda::sm90
