// The scalar versions of the cpu backend's kernels (simd_kernels.h): the reference every
// vector version is tested against, and what runs on CPUs without AVX2.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/simd_isa.h"

namespace memeff::detail {
namespace {

// CpuKernels::gemm (kAT false) and gemm_at (kAT true: A stored transposed, k×m).
template <bool kAT>
void gemm_scalar(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                 int ldc, bool accumulate) {
  for (int i = 0; i < m; ++i) {
    float* crow = c + static_cast<std::ptrdiff_t>(i) * ldc;
    if (!accumulate) std::fill(crow, crow + n, 0.0f);
    for (int p = 0; p < k; ++p) {
      const float av = kAT ? a[static_cast<std::ptrdiff_t>(p) * lda + i]
                           : a[static_cast<std::ptrdiff_t>(i) * lda + p];
      const float* brow = b + static_cast<std::ptrdiff_t>(p) * ldb;
      for (int j = 0; j < n; ++j) crow[j] += av * brow[j];
    }
  }
}

// s[c] = s[c]·scale + bias[c] for c < valid (bias may be null), -inf for valid <= c < n and
// where the bias is -inf (whatever the score holds); returns the maximum of the scores that are
// not NaN. (The scalar steps the fused row kernels are made of.)
float scale_bias_max_scalar(float* s, int n, float scale, const float* bias, int valid) {
  valid = std::clamp(valid, 0, n);
  float mx = kNegInf;
  for (int c = 0; c < valid; ++c) {
    s[c] = bias && bias[c] == kNegInf ? kNegInf : s[c] * scale + (bias ? bias[c] : 0.0f);
    mx = std::max(mx, s[c]);
  }
  for (int c = valid; c < n; ++c) s[c] = kNegInf;
  return mx;
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

void online_softmax64_scalar(float* s, float scale, const float* bias, int valid, float* m,
                             float* l, float* o, int n) {
  const float tile_max = scale_bias_max_scalar(s, kCpuKeyTile, scale, bias, valid);
  // As the vector kernels: a NaN score makes the row sum NaN through exp; only a tile whose
  // scores are all NaN or -inf needs the check, lest it pass for one that sees no key.
  float m_new = std::max(*m, tile_max);
  if (m_new == kNegInf) {
    if (std::none_of(s, s + kCpuKeyTile, [](float x) { return std::isnan(x); })) {
      std::fill(s, s + kCpuKeyTile, 0.0f);
      return;
    }
    m_new = std::numeric_limits<float>::quiet_NaN();
  }
  const float alpha = *m == m_new ? 1.0f : std::exp(*m - m_new);  // NaN once m_new is
  const float sum = exp_sub_sum_scalar(s, kCpuKeyTile, m_new);
  if (alpha != 1.0f) {
    for (int e = 0; e < n; ++e) o[e] *= alpha;
  }
  *l = *l * alpha + sum;
  *m = m_new;
}

void softmax_grad64_scalar(float* s, const float* dp, float* ds, float scale, const float* bias,
                           int valid, float lse, float d, std::uint64_t keep, float keep_scale,
                           bool dropout) {
  scale_bias_max_scalar(s, kCpuKeyTile, scale, bias, valid);
  exp_sub_sum_scalar(s, kCpuKeyTile, lse);
  for (int c = 0; c < kCpuKeyTile; ++c) {
    const float z = !dropout ? 1.0f : ((keep >> c) & 1u) ? keep_scale : 0.0f;
    ds[c] = s[c] * (z * dp[c] - d);
    s[c] *= z;
  }
}

void exp_scalar(const float* x, float* y, int n) {
  for (int c = 0; c < n; ++c) y[c] = std::exp(x[c]);
}

void apply_keep64_scalar(float* x, std::uint64_t keep, float factor) {
  for (int c = 0; c < kCpuKeyTile; ++c) x[c] = ((keep >> c) & 1u) ? x[c] * factor : 0.0f;
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

}  // namespace

void philox_scalar(const std::uint32_t* c0, const std::uint32_t* c1, const std::uint32_t* c2,
                   const std::uint32_t* c3, std::uint32_t k0, std::uint32_t k1, int n,
                   std::uint32_t* out) {
  for (int t = 0; t < n; ++t) {
    const Philox4 r = philox4x32<kDropoutCallRounds>(c0[t], c1[t], c2[t], c3[t], k0, k1);
    std::memcpy(out + 4 * t, r.x, sizeof r.x);
  }
}

CpuKernels make_scalar_kernels() {
  CpuKernels k;
  k.isa = CpuIsa::scalar;
  k.name = "scalar";
  k.gemm = gemm_scalar<false>;
  k.gemm_at = gemm_scalar<true>;
  k.softmax_grad64 = softmax_grad64_scalar;
  k.online_softmax64 = online_softmax64_scalar;
  k.exp = exp_scalar;
  k.keep_masks64 = keep_masks64_scalar;
  k.apply_keep64 = apply_keep64_scalar;
  k.philox = philox_scalar;
  return k;
}

}  // namespace memeff::detail
