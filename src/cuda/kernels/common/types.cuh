// Element types shared by both kernel families (sm80 mma.sync, sm90 wgmma): the 16-bit input types,
// their conversions to and from fp32, packing of fp32 pairs into one 32-bit operand register, a
// lane's share of a row's dot product, and the 32-bit shared-memory address of a pointer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace memeff::cuda {

// 16-bit element types and their paired forms.
template <class T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct Pair<__half> {
  using type = __half2;
};

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// Packs two fp32 values into one 32-bit register of two 16-bit elements (lo = first).
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// The first (lo, lower address) and second (hi) 16-bit element of a 32-bit word, as fp32: bf16 is
// the upper half of an fp32, so a shift or a mask gives it exactly.
template <class T>
__device__ __forceinline__ float unpack_lo(std::uint32_t w);
template <class T>
__device__ __forceinline__ float unpack_hi(std::uint32_t w);
template <>
__device__ __forceinline__ float unpack_lo<__nv_bfloat16>(std::uint32_t w) {
  return __uint_as_float(w << 16);
}
template <>
__device__ __forceinline__ float unpack_hi<__nv_bfloat16>(std::uint32_t w) {
  return __uint_as_float(w & 0xFFFF0000u);
}
template <>
__device__ __forceinline__ float unpack_lo<__half>(std::uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
}
template <>
__device__ __forceinline__ float unpack_hi<__half>(std::uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

// The 16 bits of a 16-bit value.
__device__ __forceinline__ std::uint16_t bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ std::uint16_t bits16(__half x) { return __half_as_ushort(x); }

// This lane's share of Σ_e a[e]·b[e] over n elements (n a multiple of 8, rows 16-byte aligned)
// when `lanes` lanes share the row: 16-byte loads of both at lane·8, lane·8 + 8·lanes, ...
template <class T>
__device__ __forceinline__ float row_dot_share(const T* a, const T* b, int n, int lane, int lanes) {
  float acc = 0.f;
  for (int e0 = lane * 8; e0 < n; e0 += lanes * 8) {
    const uint4 av = *reinterpret_cast<const uint4*>(a + e0);
    const uint4 bv = *reinterpret_cast<const uint4*>(b + e0);
    const T* ae = reinterpret_cast<const T*>(&av);
    const T* be = reinterpret_cast<const T*>(&bv);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc += to_float(ae[k]) * to_float(be[k]);
  }
  return acc;
}

__device__ __forceinline__ std::uint32_t smem_addr(const void* ptr) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
}

}  // namespace memeff::cuda
