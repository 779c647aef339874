// Scalar, AVX2+FMA and AVX-512 versions of the cpu backend's kernels (see simd_kernels.h). The
// vector ones are compiled with __attribute__((target)) so the library needs no per-file flags
// and still runs on CPUs without them; the table is picked once from __builtin_cpu_supports.
#include "cpu/simd_kernels.h"

// GCC 12's AVX-512 headers warn about their own _mm512_undefined_* placeholders once inlined
// (GCC bug 105593, fixed in 13); the warnings point into the header, so silence them there.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "memeff/error.h"

namespace memeff::detail {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Scalar versions.

void gemm_scalar(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                 int ldc, bool accumulate) {
  for (int i = 0; i < m; ++i) {
    float* crow = c + static_cast<std::ptrdiff_t>(i) * ldc;
    if (!accumulate) std::fill(crow, crow + n, 0.0f);
    for (int p = 0; p < k; ++p) {
      const float av = a[static_cast<std::ptrdiff_t>(i) * lda + p];
      const float* brow = b + static_cast<std::ptrdiff_t>(p) * ldb;
      for (int j = 0; j < n; ++j) crow[j] += av * brow[j];
    }
  }
}

void gemm_at_scalar(int m, int n, int k, const float* at, int ldat, const float* b, int ldb,
                    float* c, int ldc, bool accumulate) {
  for (int i = 0; i < m; ++i) {
    float* crow = c + static_cast<std::ptrdiff_t>(i) * ldc;
    if (!accumulate) std::fill(crow, crow + n, 0.0f);
    for (int p = 0; p < k; ++p) {
      const float av = at[static_cast<std::ptrdiff_t>(p) * ldat + i];
      const float* brow = b + static_cast<std::ptrdiff_t>(p) * ldb;
      for (int j = 0; j < n; ++j) crow[j] += av * brow[j];
    }
  }
}

// s[c] = s[c]·scale + bias[c] for c < valid (bias may be null), -inf for valid <= c < n;
// returns the maximum. (The scalar steps the fused row kernels are made of.)
float scale_bias_max_scalar(float* s, int n, float scale, const float* bias, int valid) {
  valid = std::clamp(valid, 0, n);
  float mx = kNegInf;
  for (int c = 0; c < valid; ++c) {
    s[c] = s[c] * scale + (bias ? bias[c] : 0.0f);
    mx = std::max(mx, s[c]);
  }
  for (int c = valid; c < n; ++c) s[c] = kNegInf;
  return mx;
}

void online_softmax64_scalar(float* s, float scale, const float* bias, int valid, float* m,
                             float* l, float* o, int n) {
  const float tile_max = scale_bias_max_scalar(s, 64, scale, bias, valid);
  const float m_new = std::max(*m, tile_max);
  if (m_new == kNegInf) {
    std::fill(s, s + 64, 0.0f);
    return;
  }
  const float alpha = *m == m_new ? 1.0f : std::exp(*m - m_new);
  float sum = 0.0f;
  for (int c = 0; c < 64; ++c) {
    s[c] = std::exp(s[c] - m_new);
    sum += s[c];
  }
  if (alpha != 1.0f) {
    for (int e = 0; e < n; ++e) o[e] *= alpha;
  }
  *l = *l * alpha + sum;
  *m = m_new;
}

// s[c] = exp(s[c] - sub); returns the sum.
float exp_sub_sum_scalar(float* s, int n, float sub) {
  float sum = 0.0f;
  for (int c = 0; c < n; ++c) {
    s[c] = std::exp(s[c] - sub);
    sum += s[c];
  }
  return sum;
}

void softmax_grad64_scalar(float* s, const float* dp, float* ds, float scale, const float* bias,
                           int valid, float lse, float d, std::uint64_t keep, float keep_scale,
                           bool dropout) {
  scale_bias_max_scalar(s, 64, scale, bias, valid);
  exp_sub_sum_scalar(s, 64, lse);
  for (int c = 0; c < 64; ++c) {
    const float z = !dropout ? 1.0f : ((keep >> c) & 1u) ? keep_scale : 0.0f;
    ds[c] = s[c] * (z * dp[c] - d);
    s[c] *= z;
  }
}

void exp_scalar(const float* x, float* y, int n) {
  for (int c = 0; c < n; ++c) y[c] = std::exp(x[c]);
}

void apply_keep64_scalar(float* x, std::uint64_t keep, float factor) {
  for (int c = 0; c < 64; ++c) x[c] = ((keep >> c) & 1u) ? x[c] * factor : 0.0f;
}

void philox_scalar(const std::uint32_t* c0, const std::uint32_t* c1, const std::uint32_t* c2,
                   const std::uint32_t* c3, std::uint32_t k0, std::uint32_t k1, int n,
                   std::uint32_t* out) {
  for (int t = 0; t < n; ++t) {
    const Philox4 r = philox4x32_10(c0[t], c1[t], c2[t], c3[t], k0, k1);
    std::memcpy(out + 4 * t, r.x, sizeof r.x);
  }
}

void keep_masks64_scalar(DropoutKey key, std::uint64_t bh, std::uint64_t row0, int rows,
                         std::uint64_t col_block64, std::uint32_t threshold, std::uint64_t* masks) {
  for (int r = 0; r < rows; ++r) {
    std::uint64_t word = 0;
    for (std::uint32_t cls = 0; cls < 4; ++cls) {
      const Philox4 call =
          dropout_call(key, bh, row0 + static_cast<std::uint64_t>(r), col_block64, cls);
      word |= spread_keep_bits16(dropout_keep_bits16(call, threshold), cls);
    }
    masks[r] = word;
  }
}

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

CpuKernels make_scalar() {
  CpuKernels k;
  k.isa = CpuIsa::scalar;
  k.name = "scalar";
  k.gemm = gemm_scalar;
  k.gemm_at = gemm_at_scalar;
  k.softmax_grad64 = softmax_grad64_scalar;
  k.online_softmax64 = online_softmax64_scalar;
  k.exp = exp_scalar;
  k.keep_masks64 = keep_masks64_scalar;
  k.apply_keep64 = apply_keep64_scalar;
  k.philox = philox_scalar;
  return k;
}

CpuKernels make_avx2() {
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

CpuKernels make_avx512() {
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

}  // namespace

bool cpu_supports(CpuIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::scalar:
      return true;
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::avx512:
      // __builtin_cpu_supports also checks that the OS saves the zmm and mask registers.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             cpu_supports(CpuIsa::avx2);
  }
  return false;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::scalar:
      return "scalar";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
  }
  return "?";
}

const CpuKernels& cpu_kernels(CpuIsa isa) {
  static const CpuKernels scalar = make_scalar();
  static const CpuKernels avx2 = make_avx2();
  static const CpuKernels avx512 = make_avx512();
  if (!cpu_supports(isa)) {
    throw Error(ErrorCode::unsupported, std::string("cpu kernels: this CPU cannot run the ") +
                                            cpu_isa_name(isa) + " kernels");
  }
  switch (isa) {
    case CpuIsa::avx512:
      return avx512;
    case CpuIsa::avx2:
      return avx2;
    default:
      return scalar;
  }
}

namespace {
CpuIsa best_cpu_isa() {
  for (CpuIsa isa : {CpuIsa::avx512, CpuIsa::avx2}) {
    if (cpu_supports(isa)) return isa;
  }
  return CpuIsa::scalar;
}
}  // namespace

const CpuKernels& cpu_kernels() {
  static const CpuKernels& best = [&]() -> const CpuKernels& {
    // MEMEFF_CPU_ISA=scalar|avx2|avx512 caps the instruction set (for comparisons and tests);
    // a level this CPU lacks, or an unknown name, falls back to the best one with a warning.
    const CpuIsa best_isa = best_cpu_isa();
    const char* env = std::getenv("MEMEFF_CPU_ISA");
    if (env == nullptr || *env == '\0') return cpu_kernels(best_isa);
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
      if (std::string(env) == cpu_isa_name(isa) && cpu_supports(isa)) return cpu_kernels(isa);
    }
    std::fprintf(stderr,
                 "memeff: MEMEFF_CPU_ISA=%s is not scalar, avx2 or avx512 runnable on this CPU; "
                 "using %s\n",
                 env, cpu_isa_name(best_isa));
    return cpu_kernels(best_isa);
  }();
  return best;
}

}  // namespace memeff::detail
