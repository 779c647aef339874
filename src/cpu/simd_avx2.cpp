// The AVX2 + FMA versions of the cpu backend's kernels (simd_kernels.h), compiled with
// __attribute__((target)) so the library needs no per-file flags and still loads on CPUs
// without them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/simd_isa.h"

namespace memeff::detail {
namespace {

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA versions.

#define MEMEFF_AVX2 __attribute__((target("avx2,fma")))

// A 6×16 register block: 12 accumulators, two B loads and six broadcasts per k step. The
// accumulators are named variables, not an array: GCC kept an array on the stack (a store per
// FMA, half the speed).
// kAT: A is stored transposed (k×m, row p at a + p·lda): row r's factor at step p is a[p·lda + r].
template <int MR, bool kAT>
MEMEFF_AVX2 inline void micro_6x16(int k, const float* a, int lda, const float* b, int ldb,
                                   float* c, int ldc, bool accumulate) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define MEMEFF_ROW(r, x0, x1)              \
  if constexpr (MR > r) {                  \
    x0 = _mm256_loadu_ps(c + r * ldc);     \
    x1 = _mm256_loadu_ps(c + r * ldc + 8); \
  }
  if (accumulate) {
    MEMEFF_ROW(0, c00, c01)
    MEMEFF_ROW(1, c10, c11)
    MEMEFF_ROW(2, c20, c21) MEMEFF_ROW(3, c30, c31) MEMEFF_ROW(4, c40, c41) MEMEFF_ROW(5, c50, c51)
  }
#undef MEMEFF_ROW
  const std::ptrdiff_t row_step = kAT ? 1 : lda;  // from one row's factors to the next
  const float* a0 = a;
  const float* a1 = a + row_step;
  const float* a2 = a + 2 * row_step;
  const float* a3 = a + 3 * row_step;
  const float* a4 = a + 4 * row_step;
  const float* a5 = a + 5 * row_step;
  for (int p = 0; p < k; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b);
    const __m256 b1 = _mm256_loadu_ps(b + 8);
    b += ldb;
    const std::ptrdiff_t at = kAT ? static_cast<std::ptrdiff_t>(p) * lda : p;
#define MEMEFF_ROW(r, ar, x0, x1)                   \
  if constexpr (MR > r) {                           \
    const __m256 av = _mm256_broadcast_ss(ar + at); \
    x0 = _mm256_fmadd_ps(av, b0, x0);               \
    x1 = _mm256_fmadd_ps(av, b1, x1);               \
  }
    MEMEFF_ROW(0, a0, c00, c01)
    MEMEFF_ROW(1, a1, c10, c11)
    MEMEFF_ROW(2, a2, c20, c21)
    MEMEFF_ROW(3, a3, c30, c31) MEMEFF_ROW(4, a4, c40, c41) MEMEFF_ROW(5, a5, c50, c51)
#undef MEMEFF_ROW
  }
#define MEMEFF_ROW(r, x0, x1)              \
  if constexpr (MR > r) {                  \
    _mm256_storeu_ps(c + r * ldc, x0);     \
    _mm256_storeu_ps(c + r * ldc + 8, x1); \
  }
  MEMEFF_ROW(0, c00, c01)
  MEMEFF_ROW(1, c10, c11)
  MEMEFF_ROW(2, c20, c21) MEMEFF_ROW(3, c30, c31) MEMEFF_ROW(4, c40, c41) MEMEFF_ROW(5, c50, c51)
#undef MEMEFF_ROW
}

template <bool kAT>
MEMEFF_AVX2 void gemm_avx2_impl(int m, int n, int k, const float* a, int lda, const float* b,
                                int ldb, float* c, int ldc, bool accumulate) {
  const std::ptrdiff_t row_step = kAT ? 1 : lda;
  for (int j = 0; j < n; j += 16) {
    int i = 0;
    for (; i + 6 <= m; i += 6) {
      micro_6x16<6, kAT>(k, a + i * row_step, lda, b + j, ldb,
                         c + static_cast<std::ptrdiff_t>(i) * ldc + j, ldc, accumulate);
    }
    const float* ai = a + i * row_step;
    float* ci = c + static_cast<std::ptrdiff_t>(i) * ldc + j;
    switch (m - i) {
      case 5:
        micro_6x16<5, kAT>(k, ai, lda, b + j, ldb, ci, ldc, accumulate);
        break;
      case 4:
        micro_6x16<4, kAT>(k, ai, lda, b + j, ldb, ci, ldc, accumulate);
        break;
      case 3:
        micro_6x16<3, kAT>(k, ai, lda, b + j, ldb, ci, ldc, accumulate);
        break;
      case 2:
        micro_6x16<2, kAT>(k, ai, lda, b + j, ldb, ci, ldc, accumulate);
        break;
      case 1:
        micro_6x16<1, kAT>(k, ai, lda, b + j, ldb, ci, ldc, accumulate);
        break;
      default:
        break;
    }
  }
}

MEMEFF_AVX2 void gemm_avx2(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                           float* c, int ldc, bool accumulate) {
  gemm_avx2_impl<false>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

MEMEFF_AVX2 void gemm_at_avx2(int m, int n, int k, const float* at, int ldat, const float* b,
                              int ldb, float* c, int ldc, bool accumulate) {
  gemm_avx2_impl<true>(m, n, k, at, ldat, b, ldb, c, ldc, accumulate);
}

// exp(x) for fp32: x = n·ln2 + r with |r| <= ln2/2, exp(r) by a degree-6 polynomial (Cephes
// expf coefficients, about 1 ulp), 2^n put into the exponent bits. Inputs below -87.3 (the
// normal range) give exactly 0, so -inf maps to 0; inputs above 88.3 saturate.
MEMEFF_AVX2 inline __m256 exp_avx2(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.37626f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n: n in [-126, 128]; split in two factors so n = 128 does not overflow the exponent field.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, _mm256_set1_epi32(127)), 23));
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  return _mm256_andnot_ps(underflow, y);
}

MEMEFF_AVX2 float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

MEMEFF_AVX2 float hmax_avx2(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

MEMEFF_AVX2 void exp_avx2_array(const float* x, float* y, int n) {
  for (int c = 0; c < n; c += 8) _mm256_storeu_ps(y + c, exp_avx2(_mm256_loadu_ps(x + c)));
}

// The row in eight registers: one pass for scale, bias, mask and max, one for exp and sum.
MEMEFF_AVX2 void online_softmax64_avx2(float* s, float scale, const float* bias, int valid,
                                       float* m, float* l, float* o, int n) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 x[8];
  __m256 mx = neg_inf;
#pragma GCC unroll 8
  for (int q = 0; q < 8; ++q) {
    const __m256 live = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(valid - 8 * q), lane));  // lane < valid - 8q
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + 8 * q), vscale);
    if (bias) v = _mm256_add_ps(v, _mm256_maskload_ps(bias + 8 * q, _mm256_castps_si256(live)));
    x[q] = _mm256_blendv_ps(neg_inf, v, live);
    mx = _mm256_max_ps(mx, x[q]);
  }
  const float m_new = std::max(*m, hmax_avx2(mx));
  if (m_new == kNegInf) {
    for (int q = 0; q < 8; ++q) _mm256_storeu_ps(s + 8 * q, _mm256_setzero_ps());
    return;
  }
  const __m256 vsub = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int q = 0; q < 8; ++q) {
    const __m256 y = exp_avx2(_mm256_sub_ps(x[q], vsub));
    _mm256_storeu_ps(s + 8 * q, y);
    sum = _mm256_add_ps(sum, y);
  }
  if (*m != m_new) {
    const __m256 alpha = exp_avx2(_mm256_set1_ps(*m - m_new));
    for (int e = 0; e < n; e += 8)
      _mm256_storeu_ps(o + e, _mm256_mul_ps(_mm256_loadu_ps(o + e), alpha));
    *l *= _mm256_cvtss_f32(alpha);
  }
  *l += hsum_avx2(sum);
  *m = m_new;
}

MEMEFF_AVX2 void softmax_grad64_avx2(float* s, const float* dp, float* ds, float scale,
                                     const float* bias, int valid, float lse, float d,
                                     std::uint64_t keep, float keep_scale, bool dropout) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 vscale = _mm256_set1_ps(scale), vlse = _mm256_set1_ps(lse);
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  const __m256 vd = _mm256_set1_ps(d);
  const __m256 vkeep = _mm256_set1_ps(dropout ? keep_scale : 1.0f);
  for (int c = 0; c < 64; c += 8) {
    const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(valid - c), lane));
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + c), vscale);
    if (bias) x = _mm256_add_ps(x, _mm256_maskload_ps(bias + c, _mm256_castps_si256(live)));
    const __m256 pv = exp_avx2(_mm256_sub_ps(_mm256_blendv_ps(neg_inf, x, live), vlse));
    __m256 z = vkeep;
    if (dropout) {
      const __m256i byte = _mm256_set1_epi32(static_cast<int>((keep >> c) & 0xFFu));
      const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(byte, lane_bit), lane_bit);
      z = _mm256_and_ps(z, _mm256_castsi256_ps(on));
    }
    const __m256 zdp = _mm256_mul_ps(z, _mm256_loadu_ps(dp + c));
    _mm256_storeu_ps(ds + c, _mm256_mul_ps(pv, _mm256_sub_ps(zdp, vd)));
    _mm256_storeu_ps(s + c, _mm256_mul_ps(pv, z));
  }
}

MEMEFF_AVX2 void apply_keep64_avx2(float* x, std::uint64_t keep, float factor) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 vf = _mm256_set1_ps(factor);
  for (int c = 0; c < 64; c += 8) {
    const __m256i byte = _mm256_set1_epi32(static_cast<int>((keep >> c) & 0xFFu));
    const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(byte, lane_bit), lane_bit);
    const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + c), vf);
    _mm256_storeu_ps(x + c, _mm256_and_ps(y, _mm256_castsi256_ps(on)));
  }
}

// 32×32 -> 64-bit products of 8 lanes, split into high and low words.
MEMEFF_AVX2 inline void mulhilo_avx2(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);                        // lanes 0,2,4,6
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1,3,5,7
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// Ten Philox rounds on 8 counters at once; c[0..3] in, the 4 output words out.
MEMEFF_AVX2 inline void philox8_avx2(__m256i c[4], std::uint32_t k0, std::uint32_t k1) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kPhiloxM1));
  for (int round = 0; round < kPhiloxRounds; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mulhilo_avx2(c[0], m0, hi0, lo0);
    mulhilo_avx2(c[2], m1, hi1, lo1);
    const __m256i vk0 = _mm256_set1_epi32(static_cast<int>(k0));
    const __m256i vk1 = _mm256_set1_epi32(static_cast<int>(k1));
    c[0] = _mm256_xor_si256(_mm256_xor_si256(hi1, c[1]), vk0);
    c[1] = lo1;
    c[2] = _mm256_xor_si256(_mm256_xor_si256(hi0, c[3]), vk1);
    c[3] = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
}

MEMEFF_AVX2 void philox_avx2(const std::uint32_t* c0, const std::uint32_t* c1,
                             const std::uint32_t* c2, const std::uint32_t* c3, std::uint32_t k0,
                             std::uint32_t k1, int n, std::uint32_t* out) {
  int t = 0;
  for (; t + 8 <= n; t += 8) {
    __m256i c[4] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + t)),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + t)),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c2 + t)),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c3 + t))};
    philox8_avx2(c, k0, k1);
    alignas(32) std::uint32_t w[4][8];
    for (int q = 0; q < 4; ++q) _mm256_store_si256(reinterpret_cast<__m256i*>(w[q]), c[q]);
    for (int l = 0; l < 8; ++l) {
      for (int q = 0; q < 4; ++q) out[4 * (t + l) + q] = w[q][l];
    }
  }
  philox_scalar(c0 + t, c1 + t, c2 + t, c3 + t, k0, k1, n - t, out + 4 * t);
}

// Two rows per vector: lane = 4·(row parity) + column class.
MEMEFF_AVX2 void keep_masks64_avx2(DropoutKey key, std::uint64_t bh, std::uint64_t row0, int rows,
                                   std::uint64_t col_block64, std::uint32_t threshold,
                                   std::uint64_t* masks) {
  const auto cb = static_cast<std::uint32_t>(col_block64 * 4u);
  const __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(cb)),
                                      _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3));
  const __m256i c2 = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(bh)));
  const __m256i c3 = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(bh >> 32)));
  // byte < threshold  <=>  min(byte, threshold - 1) == byte, for threshold in 1..256.
  const __m256i tmax = _mm256_set1_epi8(static_cast<char>(threshold - 1));
  for (int r = 0; r < rows; r += 2) {
    const auto row = static_cast<std::uint32_t>(row0 + static_cast<std::uint64_t>(r));
    __m256i c[4] = {c0,
                    _mm256_setr_epi32(static_cast<int>(row), static_cast<int>(row),
                                      static_cast<int>(row), static_cast<int>(row),
                                      static_cast<int>(row + 1), static_cast<int>(row + 1),
                                      static_cast<int>(row + 1), static_cast<int>(row + 1)),
                    c2, c3};
    philox8_avx2(c, key.k0, key.k1);
    // Transpose the 4 words × 8 lanes so each 128-bit half holds one call's 16 bytes in byte
    // order: r[cls] = call (row, cls) in the low half, (row + 1, cls) in the high half.
    const __m256i t0 = _mm256_unpacklo_epi32(c[0], c[1]), t1 = _mm256_unpacklo_epi32(c[2], c[3]);
    const __m256i t2 = _mm256_unpackhi_epi32(c[0], c[1]), t3 = _mm256_unpackhi_epi32(c[2], c[3]);
    const __m256i calls[4] = {_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1),
                              _mm256_unpacklo_epi64(t2, t3), _mm256_unpackhi_epi64(t2, t3)};
    std::uint64_t word0 = 0, word1 = 0;
    for (std::uint32_t cls = 0; cls < 4; ++cls) {
      const __m256i keep = _mm256_cmpeq_epi8(_mm256_min_epu8(calls[cls], tmax), calls[cls]);
      const auto bits = static_cast<std::uint32_t>(_mm256_movemask_epi8(keep));
      word0 |= spread_keep_bits16(bits & 0xFFFFu, cls);
      word1 |= spread_keep_bits16(bits >> 16, cls);
    }
    masks[r] = word0;
    if (r + 1 < rows) masks[r + 1] = word1;
  }
}

#undef MEMEFF_AVX2

}  // namespace

CpuKernels make_avx2_kernels() {
  CpuKernels k;
  k.isa = CpuIsa::avx2;
  k.name = "avx2";
  k.gemm = gemm_avx2;
  k.gemm_at = gemm_at_avx2;
  k.softmax_grad64 = softmax_grad64_avx2;
  k.online_softmax64 = online_softmax64_avx2;
  k.exp = exp_avx2_array;
  k.keep_masks64 = keep_masks64_avx2;
  k.apply_keep64 = apply_keep64_avx2;
  k.philox = philox_avx2;
  return k;
}

}  // namespace memeff::detail
