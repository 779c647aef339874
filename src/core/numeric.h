// Host-side conversions between fp32 and the 16-bit formats (round to nearest even), and typed
// element access on TensorViews for the CPU backends.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "memeff/tensor.h"

namespace memeff::detail {

inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  }
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FFu) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline std::uint16_t float_to_fp16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // overflow
  if (abs < 0x38800000u) {  // subnormal or zero in fp16: scale into integer range
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // 2^24: fp16 subnormal ulp is 2^-24
    const auto m = static_cast<std::uint32_t>(std::nearbyint(scaled));
    return static_cast<std::uint16_t>(sign | m);
  }
  const std::uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

// Reads element `index` (in elements from data) of a view as double.
inline double load_as_double(const TensorView& t, std::int64_t index) {
  switch (t.dtype) {
    case DType::f32: return static_cast<const float*>(t.data)[index];
    case DType::f64: return static_cast<const double*>(t.data)[index];
    case DType::i32: return static_cast<const std::int32_t*>(t.data)[index];
    case DType::f16: return fp16_to_float(static_cast<const std::uint16_t*>(t.data)[index]);
    case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(t.data)[index]);
  }
  return 0.0;
}

inline void store_from_double(const TensorView& t, std::int64_t index, double value) {
  switch (t.dtype) {
    case DType::f32: static_cast<float*>(t.data)[index] = static_cast<float>(value); break;
    case DType::f64: static_cast<double*>(t.data)[index] = value; break;
    case DType::i32: static_cast<std::int32_t*>(t.data)[index] = static_cast<std::int32_t>(value); break;
    case DType::f16:
      static_cast<std::uint16_t*>(t.data)[index] = float_to_fp16(static_cast<float>(value));
      break;
    case DType::bf16:
      static_cast<std::uint16_t*>(t.data)[index] = float_to_bf16(static_cast<float>(value));
      break;
  }
}

}  // namespace memeff::detail
