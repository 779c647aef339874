// Host-side conversions between fp32 and the 16-bit formats (round to nearest even), and typed
// element access on TensorViews for the CPU backends.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "memeff/tensor.h"

namespace memeff::detail {

// IEEE fields: fp32 sign 1, exponent 8 (bias 127), mantissa 23; fp16 1, 5 (bias 15), 10; bf16 is
// the upper half of an fp32.
inline constexpr std::uint32_t kF32ExpBits = 0x7F800000u;  // also the bits of +inf
inline constexpr std::uint32_t kF32MantBits = 0x007FFFFFu;
inline constexpr std::uint32_t kF32AbsBits = 0x7FFFFFFFu;  // all but the sign
inline constexpr int kF32MantWidth = 23;
inline constexpr std::uint32_t kF16SignBit = 0x8000u;
inline constexpr std::uint32_t kF16ExpBits = 0x7C00u;  // also the bits of +inf
inline constexpr std::uint32_t kF16MantBits = 0x03FFu;
inline constexpr std::uint32_t kF16QuietBit = 0x0200u;  // a NaN's top mantissa bit
inline constexpr int kF16MantWidth = 10;
// 127 − 15: what the exponent changes by between the formats.
inline constexpr std::uint32_t kF32MinusF16Bias = 112;

inline float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & kF32ExpBits) == kF32ExpBits && (bits & kF32MantBits)) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  }
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round the lower half away, to nearest even
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & kF16SignBit) << 16;
  const std::uint32_t exp = (h & kF16ExpBits) >> kF16MantWidth;
  std::uint32_t mant = h & kF16MantBits;
  constexpr int kShift = kF32MantWidth - kF16MantWidth;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & (kF16MantBits + 1)) == 0);
      bits = sign | (kF32MinusF16Bias - e) << kF32MantWidth | (mant & kF16MantBits) << kShift;
    }
  } else if (exp == kF16ExpBits >> kF16MantWidth) {  // inf or NaN
    bits = sign | kF32ExpBits | mant << kShift;
  } else {
    bits = sign | (exp + kF32MinusF16Bias) << kF32MantWidth | mant << kShift;
  }
  return std::bit_cast<float>(bits);
}

inline std::uint16_t float_to_fp16(float f) {
  // fp32 bits of 65520, the smallest magnitude that rounds to fp16's inf, and of 2^-14, fp16's
  // smallest normal.
  constexpr std::uint32_t kOverflowBits = 0x477FF000u;
  constexpr std::uint32_t kMinNormalBits = 0x38800000u;
  constexpr int kShift = kF32MantWidth - kF16MantWidth;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (bits >> 16) & kF16SignBit;
  const std::uint32_t abs = bits & kF32AbsBits;
  if (abs >= kF32ExpBits) {  // inf or NaN
    return static_cast<std::uint16_t>(sign | kF16ExpBits | (abs > kF32ExpBits ? kF16QuietBit : 0u));
  }
  if (abs >= kOverflowBits) return static_cast<std::uint16_t>(sign | kF16ExpBits);
  if (abs < kMinNormalBits) {  // subnormal or zero in fp16: scale into integer range
    // 2^24: fp16's subnormal ulp is 2^-24.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    const auto m = static_cast<std::uint32_t>(std::nearbyint(scaled));
    return static_cast<std::uint16_t>(sign | m);
  }
  // Round the 13 dropped bits to nearest even, then move the exponent to fp16's bias.
  const std::uint32_t rounded = abs + ((1u << (kShift - 1)) - 1u) + ((abs >> kShift) & 1u);
  const std::uint32_t rebiased = rounded - (kF32MinusF16Bias << kF32MantWidth);
  return static_cast<std::uint16_t>(sign | (rebiased >> kShift));
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
