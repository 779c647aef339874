// The AVX-512 (F, BW, DQ, VL) versions of the cpu backend's kernels (simd_kernels.h), compiled
// with __attribute__((target)) like the AVX2 ones.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/simd_isa.h"

namespace memeff::detail {
namespace {

// ---------------------------------------------------------------------------------------------
// AVX-512 (F, BW, DQ, VL) versions: the same algorithms at 16 lanes, with mask registers for the
// row tails. exp is the AVX2 polynomial step for step, so both give the same bits.

#define MEMEFF_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))

// An MR×(16·NV) register block, MR <= 12 and NV <= 2: up to 24 zmm accumulators, NV B loads and
// MR broadcasts per k step (named accumulators, as in micro_6x16). 12×32 leaves 5 of the 32
// registers for B and the broadcast, and does 24 FMAs per 14 loads.
// clang-format off
#define MEMEFF_ZMM_ROWS(X)                                                                  \
  X(0, c00, c01) X(1, c10, c11) X(2, c20, c21) X(3, c30, c31) X(4, c40, c41) X(5, c50, c51) \
  X(6, c60, c61) X(7, c70, c71) X(8, c80, c81) X(9, c90, c91) X(10, ca0, ca1) X(11, cb0, cb1)
// clang-format on
template <int MR, int NV, bool kAT>
MEMEFF_AVX512 inline void micro_zmm(int k, const float* a, int lda, const float* b, int ldb,
                                    float* c, int ldc, bool accumulate) {
  static_assert(MR >= 1 && MR <= 12 && (NV == 1 || NV == 2));
#define MEMEFF_DECLARE(r, x0, x1) __m512 x0 = _mm512_setzero_ps(), x1 = x0;
  MEMEFF_ZMM_ROWS(MEMEFF_DECLARE)
#undef MEMEFF_DECLARE
#define MEMEFF_LOAD(r, x0, x1)                                    \
  if constexpr (MR > r) {                                         \
    x0 = _mm512_loadu_ps(c + r * ldc);                            \
    if constexpr (NV > 1) x1 = _mm512_loadu_ps(c + r * ldc + 16); \
  }
  if (accumulate) {
    MEMEFF_ZMM_ROWS(MEMEFF_LOAD)
  }
#undef MEMEFF_LOAD
  const std::ptrdiff_t row_step = kAT ? 1 : lda;  // as in micro_6x16
  for (int p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_loadu_ps(b);
    const __m512 b1 = NV > 1 ? _mm512_loadu_ps(b + 16) : b0;
    b += ldb;
    const float* ap = a + (kAT ? static_cast<std::ptrdiff_t>(p) * lda : p);  // row 0's factor
#define MEMEFF_FMA(r, x0, x1)                               \
  if constexpr (MR > r) {                                   \
    const __m512 av = _mm512_set1_ps(ap[r * row_step]);     \
    x0 = _mm512_fmadd_ps(av, b0, x0);                       \
    if constexpr (NV > 1) x1 = _mm512_fmadd_ps(av, b1, x1); \
  }
    MEMEFF_ZMM_ROWS(MEMEFF_FMA)
#undef MEMEFF_FMA
  }
#define MEMEFF_STORE(r, x0, x1)                                   \
  if constexpr (MR > r) {                                         \
    _mm512_storeu_ps(c + r * ldc, x0);                            \
    if constexpr (NV > 1) _mm512_storeu_ps(c + r * ldc + 16, x1); \
  }
  MEMEFF_ZMM_ROWS(MEMEFF_STORE)
#undef MEMEFF_STORE
}
#undef MEMEFF_ZMM_ROWS

// Rows [i, m) in blocks of 12, the last block (1..11 rows) by the matching instantiation.
template <int NV, bool kAT, int MR = 11>
MEMEFF_AVX512 inline void micro_zmm_tail(int rows, int k, const float* a, int lda, const float* b,
                                         int ldb, float* c, int ldc, bool accumulate) {
  if constexpr (MR >= 1) {
    if (rows == MR) {
      micro_zmm<MR, NV, kAT>(k, a, lda, b, ldb, c, ldc, accumulate);
    } else {
      micro_zmm_tail<NV, kAT, MR - 1>(rows, k, a, lda, b, ldb, c, ldc, accumulate);
    }
  }
}

template <int NV, bool kAT>
MEMEFF_AVX512 void gemm_columns_avx512(int m, int k, const float* a, int lda, const float* b,
                                       int ldb, float* c, int ldc, bool accumulate) {
  const std::ptrdiff_t row_step = kAT ? 1 : lda;
  int i = 0;
  for (; i + 12 <= m; i += 12) {
    micro_zmm<12, NV, kAT>(k, a + i * row_step, lda, b, ldb,
                           c + static_cast<std::ptrdiff_t>(i) * ldc, ldc, accumulate);
  }
  if (i < m) {
    micro_zmm_tail<NV, kAT>(m - i, k, a + i * row_step, lda, b, ldb,
                            c + static_cast<std::ptrdiff_t>(i) * ldc, ldc, accumulate);
  }
}

template <bool kAT>
MEMEFF_AVX512 void gemm_avx512_impl(int m, int n, int k, const float* a, int lda, const float* b,
                                    int ldb, float* c, int ldc, bool accumulate) {
  int j = 0;
  for (; j + 32 <= n; j += 32) {
    gemm_columns_avx512<2, kAT>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  }
  if (j < n) gemm_columns_avx512<1, kAT>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
}

MEMEFF_AVX512 void gemm_avx512(int m, int n, int k, const float* a, int lda, const float* b,
                               int ldb, float* c, int ldc, bool accumulate) {
  gemm_avx512_impl<false>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

MEMEFF_AVX512 void gemm_at_avx512(int m, int n, int k, const float* at, int ldat, const float* b,
                                  int ldb, float* c, int ldc, bool accumulate) {
  gemm_avx512_impl<true>(m, n, k, at, ldat, b, ldb, c, ldc, accumulate);
}

// The AVX2 polynomial, with 2^n applied by one vscalefps: p·2^n is exact, or (subnormal results)
// rounded once, as p·2^⌊n/2⌋·2^⌈n/2⌉ is in exp_avx2, so both give the same bits.
MEMEFF_AVX512 inline __m512 exp_avx512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __mmask16 normal = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);  // false for NaN and below
  x = _mm512_min_ps(x, _mm512_set1_ps(88.37626f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(normal, p, n);
}

// Lanes [0, count) of a 16-lane step, count in 0..16.
MEMEFF_AVX512 inline __mmask16 first_lanes(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF)
                     : static_cast<__mmask16>((1u << std::max(count, 0)) - 1u);
}

MEMEFF_AVX512 void exp_avx512_array(const float* x, float* y, int n) {
  for (int c = 0; c < n; c += 16) {
    const __mmask16 in_row = first_lanes(n - c);
    _mm512_mask_storeu_ps(y + c, in_row, exp_avx512(_mm512_maskz_loadu_ps(in_row, x + c)));
  }
}

// The row in four registers: one pass for scale, bias, mask and max, one for exp and sum.
MEMEFF_AVX512 void online_softmax64_avx512(float* s, float scale, const float* bias, int valid,
                                           float* m, float* l, float* o, int n) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __m512 x[4];
  __m512 mx = neg_inf;
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __mmask16 live = first_lanes(valid - 16 * q);
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * q), vscale);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(live, bias + 16 * q));
    x[q] = _mm512_mask_blend_ps(live, neg_inf, v);
    mx = _mm512_max_ps(mx, x[q]);
  }
  const float m_new = std::max(*m, _mm512_reduce_max_ps(mx));
  if (m_new == kNegInf) {
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(s + 16 * q, _mm512_setzero_ps());
    return;
  }
  const __m512 vsub = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512 y = exp_avx512(_mm512_sub_ps(x[q], vsub));
    _mm512_storeu_ps(s + 16 * q, y);
    sum = _mm512_add_ps(sum, y);
  }
  if (*m != m_new) {
    const __m512 alpha = exp_avx512(_mm512_set1_ps(*m - m_new));
    for (int e = 0; e < n; e += 16) {
      _mm512_storeu_ps(o + e, _mm512_mul_ps(_mm512_loadu_ps(o + e), alpha));
    }
    *l *= _mm512_cvtss_f32(alpha);
  }
  *l += _mm512_reduce_add_ps(sum);
  *m = m_new;
}

MEMEFF_AVX512 void softmax_grad64_avx512(float* s, const float* dp, float* ds, float scale,
                                         const float* bias, int valid, float lse, float d,
                                         std::uint64_t keep, float keep_scale, bool dropout) {
  const __m512 vscale = _mm512_set1_ps(scale), vlse = _mm512_set1_ps(lse);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const __m512 vd = _mm512_set1_ps(d);
  const __m512 vkeep = _mm512_set1_ps(dropout ? keep_scale : 1.0f);
  for (int c = 0; c < 64; c += 16) {
    const __mmask16 live = first_lanes(valid - c);
    __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + c), vscale);
    if (bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(live, bias + c));
    const __m512 pv = exp_avx512(_mm512_sub_ps(_mm512_mask_blend_ps(live, neg_inf, x), vlse));
    const auto on =
        dropout ? static_cast<__mmask16>((keep >> c) & 0xFFFFu) : static_cast<__mmask16>(0xFFFF);
    const __m512 z = _mm512_maskz_mov_ps(on, vkeep);
    const __m512 zdp = _mm512_mul_ps(z, _mm512_loadu_ps(dp + c));
    _mm512_storeu_ps(ds + c, _mm512_mul_ps(pv, _mm512_sub_ps(zdp, vd)));
    _mm512_storeu_ps(s + c, _mm512_mul_ps(pv, z));
  }
}

MEMEFF_AVX512 void apply_keep64_avx512(float* x, std::uint64_t keep, float factor) {
  const __m512 vf = _mm512_set1_ps(factor);
  for (int c = 0; c < 64; c += 16) {
    const auto on = static_cast<__mmask16>((keep >> c) & 0xFFFFu);
    _mm512_storeu_ps(x + c, _mm512_maskz_mul_ps(on, _mm512_loadu_ps(x + c), vf));
  }
}

MEMEFF_AVX512 inline void mulhilo_avx512(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);                        // lanes 0,2,...,14
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);  // lanes 1,3,...,15
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

MEMEFF_AVX512 inline void philox16_avx512(__m512i c[4], std::uint32_t k0, std::uint32_t k1) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(kPhiloxM1));
  for (int round = 0; round < kPhiloxRounds; ++round) {
    __m512i hi0, lo0, hi1, lo1;
    mulhilo_avx512(c[0], m0, hi0, lo0);
    mulhilo_avx512(c[2], m1, hi1, lo1);
    const __m512i vk0 = _mm512_set1_epi32(static_cast<int>(k0));
    const __m512i vk1 = _mm512_set1_epi32(static_cast<int>(k1));
    c[0] = _mm512_xor_si512(_mm512_xor_si512(hi1, c[1]), vk0);
    c[1] = lo1;
    c[2] = _mm512_xor_si512(_mm512_xor_si512(hi0, c[3]), vk1);
    c[3] = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

MEMEFF_AVX512 void philox_avx512(const std::uint32_t* c0, const std::uint32_t* c1,
                                 const std::uint32_t* c2, const std::uint32_t* c3, std::uint32_t k0,
                                 std::uint32_t k1, int n, std::uint32_t* out) {
  int t = 0;
  for (; t + 16 <= n; t += 16) {
    __m512i c[4] = {_mm512_loadu_si512(c0 + t), _mm512_loadu_si512(c1 + t),
                    _mm512_loadu_si512(c2 + t), _mm512_loadu_si512(c3 + t)};
    philox16_avx512(c, k0, k1);
    alignas(64) std::uint32_t w[4][16];
    for (int q = 0; q < 4; ++q) _mm512_store_si512(w[q], c[q]);
    for (int l = 0; l < 16; ++l) {
      for (int q = 0; q < 4; ++q) out[4 * (t + l) + q] = w[q][l];
    }
  }
  philox_scalar(c0 + t, c1 + t, c2 + t, c3 + t, k0, k1, n - t, out + 4 * t);
}

// Four rows per vector: lane = 4·(row - r) + column class, so each 128-bit quarter is one row.
MEMEFF_AVX512 void keep_masks64_avx512(DropoutKey key, std::uint64_t bh, std::uint64_t row0,
                                       int rows, std::uint64_t col_block64, std::uint32_t threshold,
                                       std::uint64_t* masks) {
  const auto cb = static_cast<std::uint32_t>(col_block64 * 4u);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(cb)),
                                      _mm512_and_si512(lane, _mm512_set1_epi32(3)));
  const __m512i row_of_lane = _mm512_srli_epi32(lane, 2);
  const __m512i c2 = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(bh)));
  const __m512i c3 = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(bh >> 32)));
  // byte < threshold  <=>  byte <= threshold - 1, for threshold in 1..256.
  const __m512i tmax = _mm512_set1_epi8(static_cast<char>(threshold - 1));
  for (int r = 0; r < rows; r += 4) {
    const auto row = static_cast<std::uint32_t>(row0 + static_cast<std::uint64_t>(r));
    __m512i c[4] = {c0, _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(row)), row_of_lane), c2,
                    c3};
    philox16_avx512(c, key.k0, key.k1);
    // Per 128-bit quarter (one row), transpose 4 words × 4 classes into 4 calls of 16 bytes.
    const __m512i t0 = _mm512_unpacklo_epi32(c[0], c[1]), t1 = _mm512_unpacklo_epi32(c[2], c[3]);
    const __m512i t2 = _mm512_unpackhi_epi32(c[0], c[1]), t3 = _mm512_unpackhi_epi32(c[2], c[3]);
    const __m512i calls[4] = {_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1),
                              _mm512_unpacklo_epi64(t2, t3), _mm512_unpackhi_epi64(t2, t3)};
    std::uint64_t words[4] = {0, 0, 0, 0};
    for (std::uint32_t cls = 0; cls < 4; ++cls) {
      const std::uint64_t bits = _mm512_cmple_epu8_mask(calls[cls], tmax);
      for (int q = 0; q < 4; ++q) {
        words[q] |= spread_keep_bits16(static_cast<std::uint32_t>(bits >> (16 * q)) & 0xFFFFu, cls);
      }
    }
    for (int q = 0; q < 4 && r + q < rows; ++q) masks[r + q] = words[q];
  }
}

#undef MEMEFF_AVX512

}  // namespace

CpuKernels make_avx512_kernels() {
  CpuKernels k;
  k.isa = CpuIsa::avx512;
  k.name = "avx512";
  k.gemm = gemm_avx512;
  k.gemm_at = gemm_at_avx512;
  k.softmax_grad64 = softmax_grad64_avx512;
  k.online_softmax64 = online_softmax64_avx512;
  k.exp = exp_avx512_array;
  k.keep_masks64 = keep_masks64_avx512;
  k.apply_keep64 = apply_keep64_avx512;
  k.philox = philox_avx512;
  return k;
}

}  // namespace memeff::detail
