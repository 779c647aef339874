// The AVX2 and AVX-512 kernels of the cpu backend (simd_kernels.h), written once over Simd<isa>,
// the handful of vector operations they use, spelled for both instruction sets side by side.
// simd_avx2.cpp and simd_avx512.cpp each define MEMEFF_SIMD_TARGET, their target attribute, before
// including this header, so every function here is compiled for that file's instruction set only.
#pragma once

#if !defined(MEMEFF_SIMD_TARGET)
#error "define MEMEFF_SIMD_TARGET (the instruction set's target attribute) before including this"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>

#include "cpu/simd_isa.h"

namespace memeff::detail {
namespace {  // each including file has its own copies, for its own instruction set

// ---------------------------------------------------------------------------------------------
// The vector operations.

// The register types of each instruction set: kLanes floats (F), kLanes 32-bit words (I), and a
// set of lanes (Mask): AVX-512's mask register, for AVX2 a vector with all bits set in the set's
// lanes.
template <CpuIsa kIsa>
struct SimdTypes;
template <>
struct SimdTypes<CpuIsa::avx2> {
  using F = __m256;
  using I = __m256i;
  using Mask = __m256;
};
template <>
struct SimdTypes<CpuIsa::avx512> {
  using F = __m512;
  using I = __m512i;
  using Mask = __mmask16;
};

// How Simd::fold reduces the lanes.
enum class Fold { sum, max };

// Each operation spelled for both instruction sets; only the branch of the including file's own
// is ever instantiated. +, -, * (F) and ^ (I) are the compilers' vector operators.
template <CpuIsa kIsa>
struct Simd {
  static constexpr bool k512 = kIsa == CpuIsa::avx512;
  static constexpr int kLanes = k512 ? 16 : 8;
  // Rows of the product's register block (gemm_block): 6×2 accumulators, two B vectors and a
  // broadcast take 15 of AVX2's 16 registers; 12×2 take 27 of AVX-512's 32 and do 24 FMAs per
  // 14 loads.
  static constexpr int kGemmRows = k512 ? 12 : 6;
  using F = typename SimdTypes<kIsa>::F;
  using I = typename SimdTypes<kIsa>::I;
  using Mask = typename SimdTypes<kIsa>::Mask;

  MEMEFF_SIMD_TARGET static F set1(float x) {
    if constexpr (k512) {
      return _mm512_set1_ps(x);
    } else {
      return _mm256_set1_ps(x);
    }
  }
  MEMEFF_SIMD_TARGET static F load(const float* p) {
    if constexpr (k512) {
      return _mm512_loadu_ps(p);
    } else {
      return _mm256_loadu_ps(p);
    }
  }
  MEMEFF_SIMD_TARGET static void store(float* p, F x) {
    if constexpr (k512) {
      _mm512_storeu_ps(p, x);
    } else {
      _mm256_storeu_ps(p, x);
    }
  }
  MEMEFF_SIMD_TARGET static F max(F a, F b) {
    if constexpr (k512) {
      return _mm512_max_ps(a, b);
    } else {
      return _mm256_max_ps(a, b);
    }
  }
  // a·b + c, and c − a·b, with one rounding.
  MEMEFF_SIMD_TARGET static F fmadd(F a, F b, F c) {
    if constexpr (k512) {
      return _mm512_fmadd_ps(a, b, c);
    } else {
      return _mm256_fmadd_ps(a, b, c);
    }
  }
  MEMEFF_SIMD_TARGET static F fnmadd(F a, F b, F c) {
    if constexpr (k512) {
      return _mm512_fnmadd_ps(a, b, c);
    } else {
      return _mm256_fnmadd_ps(a, b, c);
    }
  }
  MEMEFF_SIMD_TARGET static F round_nearest(F x) {
    constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    if constexpr (k512) {
      return _mm512_roundscale_ps(x, kMode);
    } else {
      return _mm256_round_ps(x, kMode);
    }
  }
  // Lane 0.
  MEMEFF_SIMD_TARGET static float first(F x) {
    if constexpr (k512) {
      return _mm512_cvtss_f32(x);
    } else {
      return _mm256_cvtss_f32(x);
    }
  }
  // The lanes' sum or maximum.
  MEMEFF_SIMD_TARGET static float fold(Fold how, F v) {
    if constexpr (k512) {
      return how == Fold::max ? _mm512_reduce_max_ps(v) : _mm512_reduce_add_ps(v);
    } else {
      __m128 s = combine(how, _mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
      s = combine(how, s, _mm_movehl_ps(s, s));
      return _mm_cvtss_f32(combine(how, s, _mm_movehdup_ps(s)));
    }
  }
  MEMEFF_SIMD_TARGET static __m128 combine(Fold how, __m128 a, __m128 b) {
    return how == Fold::max ? _mm_max_ps(a, b) : _mm_add_ps(a, b);
  }

  // Lanes [0, count).
  MEMEFF_SIMD_TARGET static Mask first_lanes(int count) {
    if constexpr (k512) {
      return count >= kLanes ? static_cast<Mask>(0xFFFF)
                             : static_cast<Mask>((1u << std::max(count, 0)) - 1u);
    } else {
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane));
    }
  }
  // Lane l where bit l of `bits` is set (bits above kLanes ignored).
  MEMEFF_SIMD_TARGET static Mask bit_lanes(std::uint64_t bits) {
    if constexpr (k512) {
      return static_cast<Mask>(bits & 0xFFFFu);
    } else {
      const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
      const __m256i byte = _mm256_set1_epi32(static_cast<int>(bits & 0xFFu));
      return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(byte, lane_bit), lane_bit));
    }
  }
  // Loads and stores of the mask's lanes only (the others load as 0).
  MEMEFF_SIMD_TARGET static F load_live(Mask live, const float* p) {
    if constexpr (k512) {
      return _mm512_maskz_loadu_ps(live, p);
    } else {
      return _mm256_maskload_ps(p, _mm256_castps_si256(live));
    }
  }
  MEMEFF_SIMD_TARGET static void store_live(Mask live, float* p, F x) {
    if constexpr (k512) {
      _mm512_mask_storeu_ps(p, live, x);
    } else {
      _mm256_maskstore_ps(p, _mm256_castps_si256(live), x);
    }
  }
  // a in the mask's lanes, b (or 0) in the others.
  MEMEFF_SIMD_TARGET static F blend(Mask m, F a, F b) {
    if constexpr (k512) {
      return _mm512_mask_blend_ps(m, b, a);
    } else {
      return _mm256_blendv_ps(b, a, m);
    }
  }
  MEMEFF_SIMD_TARGET static F zero_unless(Mask m, F a) {
    if constexpr (k512) {
      return _mm512_maskz_mov_ps(m, a);
    } else {
      return _mm256_and_ps(a, m);
    }
  }
  // The lanes where x is NaN, and where x is not -inf (NaN included).
  MEMEFF_SIMD_TARGET static Mask nan_lanes(F x) {
    if constexpr (k512) {
      return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    } else {
      return _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    }
  }
  MEMEFF_SIMD_TARGET static Mask not_minus_inf(F x) {
    if constexpr (k512) {
      return _mm512_cmp_ps_mask(x, set1(kNegInf), _CMP_NEQ_UQ);
    } else {
      return _mm256_cmp_ps(x, set1(kNegInf), _CMP_NEQ_UQ);
    }
  }
  MEMEFF_SIMD_TARGET static Mask mask_and(Mask a, Mask b) {
    if constexpr (k512) {
      return static_cast<Mask>(a & b);
    } else {
      return _mm256_and_ps(a, b);
    }
  }
  MEMEFF_SIMD_TARGET static Mask mask_or(Mask a, Mask b) {
    if constexpr (k512) {
      return static_cast<Mask>(a | b);
    } else {
      return _mm256_or_ps(a, b);
    }
  }
  MEMEFF_SIMD_TARGET static bool any(Mask m) {
    if constexpr (k512) {
      return m != 0;
    } else {
      return _mm256_movemask_ps(m) != 0;
    }
  }

  // The fast exp (exp_reduced). AVX-512 applies 2^n with one vscalefps: p·2^n is exact, or
  // (subnormal results) rounded once, as p·2^⌊n/2⌋·2^⌈n/2⌉ is in the AVX2 version, which splits
  // 2^n in two factors so that n = 128 does not overflow the exponent field. Both give the same
  // bits.
  MEMEFF_SIMD_TARGET static F exp(F x);

  MEMEFF_SIMD_TARGET static I set1_u32(std::uint32_t x) {
    if constexpr (k512) {
      return _mm512_set1_epi32(static_cast<int>(x));
    } else {
      return _mm256_set1_epi32(static_cast<int>(x));
    }
  }
  MEMEFF_SIMD_TARGET static I set1_u8(std::uint8_t x) {  // every byte
    if constexpr (k512) {
      return _mm512_set1_epi8(static_cast<char>(x));
    } else {
      return _mm256_set1_epi8(static_cast<char>(x));
    }
  }
  MEMEFF_SIMD_TARGET static I load_u32(const std::uint32_t* p) {
    if constexpr (k512) {
      return _mm512_loadu_si512(p);
    } else {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    }
  }
  MEMEFF_SIMD_TARGET static void store_u32(std::uint32_t* p, I x) {
    if constexpr (k512) {
      _mm512_storeu_si512(p, x);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
    }
  }
  MEMEFF_SIMD_TARGET static I add_u32(I a, I b) {
    if constexpr (k512) {
      return _mm512_add_epi32(a, b);
    } else {
      return _mm256_add_epi32(a, b);
    }
  }
  // The 32×32 -> 64-bit products of a and m, lane by lane, split into high and low words.
  MEMEFF_SIMD_TARGET static void mulhilo(I a, I m, I& hi, I& lo) {
    if constexpr (k512) {
      const I even = _mm512_mul_epu32(a, m);                        // lanes 0, 2, ..., 14
      const I odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);  // lanes 1, 3, ..., 15
      lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
      hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
    } else {
      const I even = _mm256_mul_epu32(a, m);                        // lanes 0, 2, 4, 6
      const I odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
      lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
      hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    }
  }
  // Per 128-bit quarter, the low (or high) two words of a and b interleaved: a0 b0 a1 b1.
  MEMEFF_SIMD_TARGET static I zip32(bool high, I a, I b) {
    if constexpr (k512) {
      return high ? _mm512_unpackhi_epi32(a, b) : _mm512_unpacklo_epi32(a, b);
    } else {
      return high ? _mm256_unpackhi_epi32(a, b) : _mm256_unpacklo_epi32(a, b);
    }
  }
  // The same with word pairs: a01 b01 (or a23 b23).
  MEMEFF_SIMD_TARGET static I zip64(bool high, I a, I b) {
    if constexpr (k512) {
      return high ? _mm512_unpackhi_epi64(a, b) : _mm512_unpacklo_epi64(a, b);
    } else {
      return high ? _mm256_unpackhi_epi64(a, b) : _mm256_unpacklo_epi64(a, b);
    }
  }
  // Bit b: byte b of x <= byte b of max (unsigned).
  MEMEFF_SIMD_TARGET static std::uint64_t bytes_at_most(I x, I max) {
    if constexpr (k512) {
      return _mm512_cmple_epu8_mask(x, max);
    } else {
      const I le = _mm256_cmpeq_epi8(_mm256_min_epu8(x, max), x);  // min(x, max) == x
      return static_cast<std::uint32_t>(_mm256_movemask_epi8(le));
    }
  }
};

// ---------------------------------------------------------------------------------------------
// exp(x) for fp32: x = n·ln2 + r with |r| <= ln2/2, exp(r) by a degree-6 polynomial (Cephes expf
// coefficients, about 1 ulp), then 2^n applied by Simd::exp, which also maps inputs below
// kExpMinArg to exactly 0 (so −inf gives 0) and saturates those above kExpMaxArg.

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kExpMinArg = -87.33654f;  // ln 2^−126: the smallest normal result
inline constexpr float kExpMaxArg = 88.37626f;   // ln 2^127.5: n stays <= 128
// ln 2 in two parts (Cody–Waite): kLn2Hi has few mantissa bits, so n·kLn2Hi is exact.
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
// exp(r) ≈ 1 + r + r²·P(r); P's coefficients from the highest power down.
inline constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// For x in [kExpMinArg, kExpMaxArg]: n = round(x·log2 e) and the returned p ≈ exp(x − n·ln 2).
template <class V>
MEMEFF_SIMD_TARGET inline typename V::F exp_reduced(typename V::F x, typename V::F& n) {
  using F = typename V::F;
  n = V::round_nearest(x * V::set1(kLog2e));
  F r = V::fnmadd(n, V::set1(kLn2Hi), x);
  r = V::fnmadd(n, V::set1(kLn2Lo), r);
  F p = V::set1(kExpPoly[0]);
  for (std::size_t c = 1; c < std::size(kExpPoly); ++c) p = V::fmadd(p, r, V::set1(kExpPoly[c]));
  return V::fmadd(p, r * r, r + V::set1(1.0f));
}

template <CpuIsa kIsa>
MEMEFF_SIMD_TARGET typename Simd<kIsa>::F Simd<kIsa>::exp(F x) {
  if constexpr (k512) {
    // NaN stays NaN: it counts as normal, and min_ps returns its second operand when one is NaN.
    const Mask normal = _mm512_cmp_ps_mask(x, set1(kExpMinArg), _CMP_NLT_UQ);
    x = _mm512_min_ps(set1(kExpMaxArg), x);
    F n;
    const F p = exp_reduced<Simd>(x, n);
    return _mm512_maskz_scalef_ps(normal, p, n);
  } else {
    const F lo = set1(kExpMinArg);
    const F underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);  // false for NaN
    // NaN stays NaN: min_ps and max_ps return their second operand when one is NaN.
    x = _mm256_min_ps(set1(kExpMaxArg), _mm256_max_ps(lo, x));
    F n;
    const F p = exp_reduced<Simd>(x, n);
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(ni, 1);
    const __m256i rest = _mm256_sub_epi32(ni, half);
    const __m256i bias = _mm256_set1_epi32(127);  // the fp32 exponent bias
    const F s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    const F s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
    return _mm256_andnot_ps(underflow, p * s1 * s2);
  }
}

// ---------------------------------------------------------------------------------------------
// Products. An MR×(NV·kLanes) register block of C (+)= A·B: MR·NV accumulators, NV B loads and
// MR broadcasts per k step. The accumulators are named variables, not an array: GCC kept an
// array on the stack (a store per FMA, half the speed).
// kAT: A is stored transposed (k×m, row p at a + p·lda): row r's factor at step p is a[p·lda + r].

// clang-format off
#define MEMEFF_BLOCK_ROWS(X)                                                                \
  X(0, c00, c01) X(1, c10, c11) X(2, c20, c21) X(3, c30, c31) X(4, c40, c41) X(5, c50, c51) \
  X(6, c60, c61) X(7, c70, c71) X(8, c80, c81) X(9, c90, c91) X(10, ca0, ca1) X(11, cb0, cb1)
// clang-format on
template <class V, int MR, int NV, bool kAT>
MEMEFF_SIMD_TARGET inline void gemm_block(int k, const float* a, int lda, const float* b, int ldb,
                                          float* c, int ldc, bool accumulate) {
  static_assert(MR >= 1 && MR <= 12 && (NV == 1 || NV == 2));
  using F = typename V::F;
  constexpr int W = V::kLanes;
#define MEMEFF_DECLARE(r, x0, x1) F x0{}, x1{};
  MEMEFF_BLOCK_ROWS(MEMEFF_DECLARE)
#undef MEMEFF_DECLARE
#define MEMEFF_LOAD(r, x0, x1)                           \
  if constexpr (MR > r) {                                \
    x0 = V::load(c + r * ldc);                           \
    if constexpr (NV > 1) x1 = V::load(c + r * ldc + W); \
  }
  if (accumulate) {
    MEMEFF_BLOCK_ROWS(MEMEFF_LOAD)
  }
#undef MEMEFF_LOAD
  const std::ptrdiff_t row_step = kAT ? 1 : lda;  // from one row's factors to the next
  for (int p = 0; p < k; ++p) {
    const F b0 = V::load(b);
    const F b1 = NV > 1 ? V::load(b + W) : b0;
    b += ldb;
    const float* ap = a + (kAT ? static_cast<std::ptrdiff_t>(p) * lda : p);  // row 0's factor
#define MEMEFF_FMA(r, x0, x1)                        \
  if constexpr (MR > r) {                            \
    const F av = V::set1(ap[r * row_step]);          \
    x0 = V::fmadd(av, b0, x0);                       \
    if constexpr (NV > 1) x1 = V::fmadd(av, b1, x1); \
  }
    MEMEFF_BLOCK_ROWS(MEMEFF_FMA)
#undef MEMEFF_FMA
  }
#define MEMEFF_STORE(r, x0, x1)                          \
  if constexpr (MR > r) {                                \
    V::store(c + r * ldc, x0);                           \
    if constexpr (NV > 1) V::store(c + r * ldc + W, x1); \
  }
  MEMEFF_BLOCK_ROWS(MEMEFF_STORE)
#undef MEMEFF_STORE
}
#undef MEMEFF_BLOCK_ROWS

// The last `rows` rows (1 .. kGemmRows − 1) of a column block, by the block of exactly that height.
template <class V, int NV, bool kAT, int MR = V::kGemmRows - 1>
MEMEFF_SIMD_TARGET inline void gemm_block_tail(int rows, int k, const float* a, int lda,
                                               const float* b, int ldb, float* c, int ldc,
                                               bool accumulate) {
  if constexpr (MR >= 1) {
    if (rows == MR) {
      gemm_block<V, MR, NV, kAT>(k, a, lda, b, ldb, c, ldc, accumulate);
    } else {
      gemm_block_tail<V, NV, kAT, MR - 1>(rows, k, a, lda, b, ldb, c, ldc, accumulate);
    }
  }
}

// Every row of NV·kLanes columns.
template <class V, int NV, bool kAT>
MEMEFF_SIMD_TARGET void gemm_columns(int m, int k, const float* a, int lda, const float* b, int ldb,
                                     float* c, int ldc, bool accumulate) {
  constexpr int MR = V::kGemmRows;
  const std::ptrdiff_t row_step = kAT ? 1 : lda;
  int i = 0;
  for (; i + MR <= m; i += MR) {
    gemm_block<V, MR, NV, kAT>(k, a + i * row_step, lda, b, ldb,
                               c + static_cast<std::ptrdiff_t>(i) * ldc, ldc, accumulate);
  }
  if (i < m) {
    gemm_block_tail<V, NV, kAT>(m - i, k, a + i * row_step, lda, b, ldb,
                                c + static_cast<std::ptrdiff_t>(i) * ldc, ldc, accumulate);
  }
}

// CpuKernels::gemm (kAT false) and gemm_at (kAT true).
template <class V, bool kAT>
MEMEFF_SIMD_TARGET void gemm(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                             float* c, int ldc, bool accumulate) {
  static_assert(kCpuColumnQuantum % V::kLanes == 0);
  constexpr int kWide = 2 * V::kLanes;
  int j = 0;
  for (; j + kWide <= n; j += kWide) {
    gemm_columns<V, 2, kAT>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  }
  // n is a multiple of kCpuColumnQuantum: when that is narrower than two vectors (AVX-512), one
  // vector of columns is left at most.
  if constexpr (kCpuColumnQuantum % kWide != 0) {
    if (j < n) gemm_columns<V, 1, kAT>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax rows over one 64-key tile (kCpuKeyTile).

// The row in 64 / kLanes registers: one pass for scale, bias, mask and max, one for exp and sum.
template <class V>
MEMEFF_SIMD_TARGET void online_softmax64(float* s, float scale, const float* bias, int valid,
                                         float* m, float* l, float* o, int n) {
  using F = typename V::F;
  constexpr int W = V::kLanes, kVectors = kCpuKeyTile / W;
  const F vscale = V::set1(scale);
  const F neg_inf = V::set1(kNegInf);
  F x[kVectors];
  F mx = neg_inf;
#pragma GCC unroll 8
  for (int q = 0; q < kVectors; ++q) {
    typename V::Mask live = V::first_lanes(valid - W * q);
    F v = V::load(s + W * q) * vscale;
    if (bias) {
      const F bv = V::load_live(live, bias + W * q);
      live = V::mask_and(live, V::not_minus_inf(bv));  // a -inf bias removes the key
      v = v + bv;
    }
    x[q] = V::blend(live, v, neg_inf);
    mx = V::max(mx, x[q]);
  }
  // A NaN score needs no check on the way: exp(NaN - m) is NaN, and so is the row sum (std::max
  // keeps a NaN *m, its first argument). Only where the max dropped every NaN and found nothing
  // else (max_ps returns its second operand) would the row pass for one that sees no key.
  float m_new = std::max(*m, V::fold(Fold::max, mx));
  if (m_new == kNegInf) {
    typename V::Mask nan{};
    for (int q = 0; q < kVectors; ++q) nan = V::mask_or(nan, V::nan_lanes(x[q]));
    if (!V::any(nan)) {
      for (int q = 0; q < kVectors; ++q) V::store(s + W * q, F{});
      return;
    }
    m_new = std::numeric_limits<float>::quiet_NaN();
  }
  const F vsub = V::set1(m_new);
  F sum{};
#pragma GCC unroll 8
  for (int q = 0; q < kVectors; ++q) {
    const F y = V::exp(x[q] - vsub);
    V::store(s + W * q, y);
    sum = sum + y;
  }
  if (*m != m_new) {
    const F alpha = V::exp(V::set1(*m - m_new));
    for (int e = 0; e < n; e += W) V::store(o + e, V::load(o + e) * alpha);
    *l *= V::first(alpha);
  }
  *l += V::fold(Fold::sum, sum);
  *m = m_new;
}

template <class V>
MEMEFF_SIMD_TARGET void softmax_grad64(float* s, const float* dp, float* ds, float scale,
                                       const float* bias, int valid, float lse, float d,
                                       std::uint64_t keep, float keep_scale, bool dropout) {
  using F = typename V::F;
  const F vscale = V::set1(scale), vlse = V::set1(lse);
  const F neg_inf = V::set1(kNegInf);
  const F vd = V::set1(d);
  const F vkeep = V::set1(dropout ? keep_scale : 1.0f);
  for (int c = 0; c < kCpuKeyTile; c += V::kLanes) {
    typename V::Mask live = V::first_lanes(valid - c);
    F x = V::load(s + c) * vscale;
    if (bias) {
      const F bv = V::load_live(live, bias + c);
      live = V::mask_and(live, V::not_minus_inf(bv));  // a -inf bias removes the key
      x = x + bv;
    }
    const F pv = V::exp(V::blend(live, x, neg_inf) - vlse);
    const F z = dropout ? V::zero_unless(V::bit_lanes(keep >> c), vkeep) : vkeep;
    V::store(ds + c, pv * (z * V::load(dp + c) - vd));
    V::store(s + c, pv * z);
  }
}

template <class V>
MEMEFF_SIMD_TARGET void apply_keep64(float* x, std::uint64_t keep, float factor) {
  const typename V::F vf = V::set1(factor);
  for (int c = 0; c < kCpuKeyTile; c += V::kLanes) {
    V::store(x + c, V::zero_unless(V::bit_lanes(keep >> c), V::load(x + c) * vf));
  }
}

template <class V>
MEMEFF_SIMD_TARGET void exp_array(const float* x, float* y, int n) {
  for (int c = 0; c < n; c += V::kLanes) {
    const typename V::Mask in_row = V::first_lanes(n - c);
    V::store_live(in_row, y + c, V::exp(V::load_live(in_row, x + c)));
  }
}

// ---------------------------------------------------------------------------------------------
// The dropout calls' Philox (kDropoutCallRounds rounds) on kLanes counters at once, and the
// keep-bits made from it.

// c[0..3] in, the 4 output words out.
template <class V>
MEMEFF_SIMD_TARGET inline void philox_rounds(typename V::I c[4], std::uint32_t k0,
                                             std::uint32_t k1) {
  using I = typename V::I;
  const I m0 = V::set1_u32(kPhiloxM0);
  const I m1 = V::set1_u32(kPhiloxM1);
  for (int round = 0; round < kDropoutCallRounds; ++round) {
    I hi0, lo0, hi1, lo1;
    V::mulhilo(c[0], m0, hi0, lo0);
    V::mulhilo(c[2], m1, hi1, lo1);
    c[0] = hi1 ^ c[1] ^ V::set1_u32(k0);
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ V::set1_u32(k1);
    c[3] = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

template <class V>
MEMEFF_SIMD_TARGET void philox(const std::uint32_t* c0, const std::uint32_t* c1,
                               const std::uint32_t* c2, const std::uint32_t* c3, std::uint32_t k0,
                               std::uint32_t k1, int n, std::uint32_t* out) {
  constexpr int W = V::kLanes;
  int t = 0;
  for (; t + W <= n; t += W) {
    typename V::I c[4] = {V::load_u32(c0 + t), V::load_u32(c1 + t), V::load_u32(c2 + t),
                          V::load_u32(c3 + t)};
    philox_rounds<V>(c, k0, k1);
    std::uint32_t w[4][W];
    for (int q = 0; q < 4; ++q) V::store_u32(w[q], c[q]);
    for (int l = 0; l < W; ++l) {
      for (int q = 0; q < 4; ++q) out[4 * (t + l) + q] = w[q][l];
    }
  }
  philox_scalar(c0 + t, c1 + t, c2 + t, c3 + t, k0, k1, n - t, out + 4 * t);
}

// The four calls of a row (column classes 0..3) sit in one 128-bit quarter of a vector: lane
// 4·q + cls holds row r + q, class cls, so a vector serves kLanes / 4 rows.
template <class V>
MEMEFF_SIMD_TARGET void keep_masks64(DropoutKey key, std::uint64_t bh, std::uint64_t row0, int rows,
                                     std::uint64_t col_block64, std::uint32_t threshold,
                                     std::uint64_t* masks) {
  using I = typename V::I;
  constexpr int kRows = V::kLanes / 4;
  static constexpr std::uint32_t kClassOfLane[16] = {0, 1, 2, 3, 0, 1, 2, 3,
                                                     0, 1, 2, 3, 0, 1, 2, 3};
  static constexpr std::uint32_t kRowOfLane[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  const I c0 = V::add_u32(V::set1_u32(static_cast<std::uint32_t>(col_block64 * 4u)),
                          V::load_u32(kClassOfLane));
  const I row_of_lane = V::load_u32(kRowOfLane);
  const I c2 = V::set1_u32(static_cast<std::uint32_t>(bh));
  const I c3 = V::set1_u32(static_cast<std::uint32_t>(bh >> 32));
  // byte < threshold  <=>  byte <= threshold − 1, for threshold in 1..256.
  const I tmax = V::set1_u8(static_cast<std::uint8_t>(threshold - 1));
  for (int r = 0; r < rows; r += kRows) {
    const auto row = static_cast<std::uint32_t>(row0 + static_cast<std::uint64_t>(r));
    I c[4] = {c0, V::add_u32(V::set1_u32(row), row_of_lane), c2, c3};
    philox_rounds<V>(c, key.k0, key.k1);
    std::uint64_t words[kRows] = {};
    for (std::uint32_t cls = 0; cls < 4; ++cls) {
      // Per quarter, the 4 × 4 transpose of words × classes: class cls's call in byte order.
      const I call =
          V::zip64(cls % 2, V::zip32(cls >= 2, c[0], c[1]), V::zip32(cls >= 2, c[2], c[3]));
      const std::uint64_t bits = V::bytes_at_most(call, tmax);
      for (int q = 0; q < kRows; ++q) {
        words[q] |= spread_keep_bits16(static_cast<std::uint32_t>(bits >> (16 * q)) & 0xFFFFu, cls);
      }
    }
    for (int q = 0; q < kRows && r + q < rows; ++q) masks[r + q] = words[q];
  }
}

// The table of one instruction set.
template <CpuIsa kIsa>
CpuKernels vector_kernels(const char* name) {
  using V = Simd<kIsa>;
  CpuKernels k;
  k.isa = kIsa;
  k.name = name;
  k.gemm = gemm<V, false>;
  k.gemm_at = gemm<V, true>;
  k.softmax_grad64 = softmax_grad64<V>;
  k.online_softmax64 = online_softmax64<V>;
  k.exp = exp_array<V>;
  k.keep_masks64 = keep_masks64<V>;
  k.apply_keep64 = apply_keep64<V>;
  k.philox = philox<V>;
  return k;
}

}  // namespace
}  // namespace memeff::detail
