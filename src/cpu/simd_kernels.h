// The vector kernels of the cpu backend: tile products, the fused softmax row steps, a fast exp
// and a vectorized Philox (the dropout calls' rounds) that yields the keep-bits of the shared RNG
// contract.
// Each exists as a scalar version (simd_scalar.cpp) and as AVX2+FMA and AVX-512 versions written
// once over the vector width (simd_vector_kernels.h); the table is chosen at run time.
#pragma once

#include <cstdint>

#include "core/dropout_map.h"

namespace memeff::detail {

// Columns of one key tile; equal to the dropout map's 64-column block so one tile's keep-bits of
// a row are one 64-bit word.
inline constexpr int kCpuKeyTile = 64;
// Widths (output columns) must be multiples of this: the product kernel works on 16 columns.
inline constexpr int kCpuColumnQuantum = 16;

enum class CpuIsa : std::uint8_t { scalar, avx2, avx512 };  // AVX-512: F, BW, DQ, VL

struct CpuKernels {
  CpuIsa isa = CpuIsa::scalar;
  const char* name = "scalar";

  // C[m×n] = (accumulate ? C : 0) + A[m×k]·B[k×n]; all row-major with leading dimensions in
  // floats. n must be a multiple of kCpuColumnQuantum.
  void (*gemm)(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
               int ldc, bool accumulate) = nullptr;

  // The same with the left factor stored transposed: A is k×m, element (i, p) at at[p·ldat + i].
  // For products with a transposed tile (Pᵀ·dO, dSᵀ·Q) without transposing it.
  void (*gemm_at)(int m, int n, int k, const float* at, int ldat, const float* b, int ldb, float* c,
                  int ldc, bool accumulate) = nullptr;

  // One query row of the backward over a 64-key tile, from its raw scores s: P[c] = exp(s[c]·scale
  // + bias[c] − lse) for c < valid and 0 beyond (bias may be null; lse = +inf gives P = 0);
  // z[c] = keep_scale where bit c of keep is set and 0 elsewhere (1 everywhere when !dropout):
  // ds[c] = P[c]·(z[c]·dp[c] − d), and s[c] ← P[c]·z[c].
  void (*softmax_grad64)(float* s, const float* dp, float* ds, float scale, const float* bias,
                         int valid, float lse, float d, std::uint64_t keep, float keep_scale,
                         bool dropout) = nullptr;

  // One query row's online-softmax step over a 64-key tile (the forward): s[c] ← s[c]·scale +
  // bias[c] for c < valid, −inf beyond (bias may be null); m_new = max(*m, max s); s[c] ←
  // exp(s[c] − m_new); with α = exp(*m − m_new): o[0..n) ← α·o (n a multiple of 16), *l ← α·*l +
  // Σ s, *m ← m_new. When m_new is −inf (nothing visible yet) s becomes 0 and m, l, o stay.
  void (*online_softmax64)(float* s, float scale, const float* bias, int valid, float* m, float* l,
                           float* o, int n) = nullptr;

  // y[c] = exp(x[c]) for c < n (n a multiple of 8); the fast exp on its own (for tests).
  void (*exp)(const float* x, float* y, int n) = nullptr;

  // x[c] = bit c of keep ? x[c]·factor : 0, for c < 64 (one key tile).
  void (*apply_keep64)(float* x, std::uint64_t keep, float factor) = nullptr;

  // Keep-bits of `rows` consecutive query rows starting at row0 in the 64-column block
  // col_block64 of head bh: bit c of masks[r] is column 64·col_block64 + c of row row0 + r.
  void (*keep_masks64)(DropoutKey key, std::uint64_t bh, std::uint64_t row0, int rows,
                       std::uint64_t col_block64, std::uint32_t threshold,
                       std::uint64_t* masks) = nullptr;

  // The dropout calls' Philox of n independent counters (c0..c3 arrays) with one key: out[4·t + w]
  // is word w of call t. Used by keep_masks64; exposed to test the vector version bit for bit.
  void (*philox)(const std::uint32_t* c0, const std::uint32_t* c1, const std::uint32_t* c2,
                 const std::uint32_t* c3, std::uint32_t k0, std::uint32_t k1, int n,
                 std::uint32_t* out) = nullptr;
};

// The best table this CPU runs (AVX-512, else AVX2+FMA, else scalar); MEMEFF_CPU_ISA=scalar,
// avx2 or avx512 caps it (read once).
const CpuKernels& cpu_kernels();
// A specific table; throws memeff::Error when this CPU cannot run it.
const CpuKernels& cpu_kernels(CpuIsa isa);
bool cpu_supports(CpuIsa isa);
const char* cpu_isa_name(CpuIsa isa);

// The scalar reference of keep_masks64's spreading step: the 16 keep-bits of the call
// (col_block64, col_class) placed at their columns of the 64-column block.
inline std::uint64_t spread_keep_bits16(std::uint32_t bits16, std::uint32_t col_class) {
  // Bit pair p (bits 2p, 2p+1) goes to bits 8p + 2·col_class: move pairs 4..7 up 32 bits, then
  // nibbles to 16-bit slots, then pairs to bytes.
  std::uint64_t x = bits16 & 0xFFFFu;
  x = (x | (x << 24)) & 0x000000FF000000FFull;
  x = (x | (x << 12)) & 0x000F000F000F000Full;
  x = (x | (x << 6)) & 0x0303030303030303ull;
  return x << (2 * col_class);
}

}  // namespace memeff::detail
