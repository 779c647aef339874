// Masking and the additive bias, shared by both kernel families: the mask policy (KeyMask: the
// trip counts of the kernels' loops under a causal mask), the masking of a score fragment (the
// m16n8 C layout of common/softmax.cuh: keys past the end of the sequence and, with a causal
// mask, keys after the shifted diagonal become -inf), the bias read per element with its
// broadcast strides, and rows that see a single key (dS exactly 0).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/hostdevice.h"
#include "core/visible_keys.h"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/types.cuh"

namespace memeff::cuda {

// The column 8n + e of a thread's fragment (its columns start at `first` + 2t) where position
// `pos` (a key, or a query of an Sᵀ fragment) falls, clamped to [0, 8·kNT].
template <int kNT>
__device__ __forceinline__ int fragment_column(std::int64_t pos, std::int64_t first, int t) {
  return static_cast<int>(
      max(min(pos - first - 2 * t, static_cast<std::int64_t>(8 * kNT)), std::int64_t{0}));
}

// One row (half hh: row g or g + 8) of a score fragment whose columns start at absolute key n0:
// columns j >= j_limit become -inf (j_limit: the row's first invisible key).
template <int kNT>
__device__ __forceinline__ void mask_row(float (&s)[kNT][4], int hh, std::int64_t j_limit,
                                         std::int64_t n0, int t) {
  // Visible columns of this lane within the fragment: 8n + e < lim.
  const int lim = fragment_column<kNT>(j_limit, n0, t);
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (8 * n + e >= lim) s[n][2 * hh + e] = -INFINITY;
    }
}

// Rows row0 (thread's row g) and row0 + 8; columns start at absolute key n0. Query i sees key j
// iff j < Lk and, when causal, j <= i + causal_shift.
template <int kNT>
__device__ __forceinline__ void mask_scores(float (&s)[kNT][4], std::int64_t row0, std::int64_t n0,
                                            int t, std::int64_t Lk, bool causal,
                                            std::int64_t causal_shift) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const std::int64_t i = row0 + 8 * hh;
    mask_row(s, hh, causal ? min(Lk, i + causal_shift + 1) : Lk, n0, t);
  }
}

using detail::sees_one_key;  // rows whose dS is exactly 0 (core/visible_keys.h)

// A range [begin, end) of tiles or blocks; empty when end <= begin.
struct BlockRange {
  int begin = 0, end = 0;
  MEMEFF_HD int count() const { return end > begin ? end - begin : 0; }
};

// The mask of one sequence as a policy over tiles: the trip counts of the kernels' loops, so no
// kernel spells out the causal arithmetic of its bounds. Query i sees key j iff j < Lk, when
// causal j <= i + shift, and within a window (ScoreMods) i + shift - left <= j <= i + shift +
// right; left and right default to no bound. Inside the main loops the kernels test a tile (does
// it cross the end of the keys or the diagonal?) and mask it with mask_scores in place: built
// there, a KeyMask kept its copies of Lk and the shift in registers through the loop (ptxas,
// sm_90a: the sm90 backward with bias spilled up to 440 bytes more), while the trip counts below,
// taken once per CTA or work item, compile to the code they replaced. A window's tile test and
// mask (tile_needs_mask, score_modifiers.cuh) build one inside the window's own branch.
struct KeyMask {
  bool causal;
  std::int64_t Lk;     // keys of the sequence
  std::int64_t shift;  // the diagonal: key i + shift (the last key query i sees, when causal)
  std::int64_t left = ScoreMods::kUnbounded, right = ScoreMods::kUnbounded;  // the window's reach

  // How far right of the diagonal a row sees: a causal mask caps the window's side at 0.
  MEMEFF_HD std::int64_t right_reach() const { return causal ? 0 : right; }

  // Key tiles [first, end) of kBlockN keys of which some row of the query block [m0, m0 + kBlockM)
  // sees a key (every row of the block counts, also rows past the queries' end): the forward's
  // trip count over key tiles. Rows see [i + shift - left, i + shift + right], moving by one key
  // per row, so the block sees [m0 + shift - left, m0 + kBlockM - 1 + shift + right], within
  // [0, Lk).
  template <int kBlockM, int kBlockN>
  MEMEFF_HD BlockRange key_tile_range(std::int64_t m0) const {
    const std::int64_t lo = m0 + shift - left;
    const std::int64_t n_begin = lo > 0 ? lo : 0;
    const std::int64_t n_end = min(Lk, m0 + kBlockM + shift + right_reach());
    if (n_end <= n_begin) return {};
    return {static_cast<int>(n_begin / kBlockN), static_cast<int>((n_end + kBlockN - 1) / kBlockN)};
  }
  // Key tiles [0, n) as key_tile_range without a window (the first is 0), by the right side alone.
  template <int kBlockM, int kBlockN>
  MEMEFF_HD int key_tiles(std::int64_t m0) const {
    std::int64_t n_end = Lk;  // keys [0, n_end) can be visible to some row of the block
    if (causal) n_end = min(n_end, m0 + kBlockM + shift);
    return n_end > 0 ? static_cast<int>((n_end + kBlockN - 1) / kBlockN) : 0;
  }

  // The query blocks of kBlockM rows (of `m_blocks`) with a row that sees a key of the key block
  // [n0, n0 + kBlockN): the backward's trip count over query blocks. The same pairs as
  // key_tile_range: query block m is in the range of key block n0 / kBlockN exactly when that
  // key tile is in block m's range (kernel_host_logic_test.cu checks both against the rule).
  template <int kBlockM, int kBlockN>
  MEMEFF_HD BlockRange query_blocks(std::int64_t n0, int m_blocks) const {
    BlockRange r{first_query_block<kBlockM>(n0, m_blocks), m_blocks};
    // The last row that sees a key of the block: i + shift - left <= min(n0 + kBlockN, Lk) - 1.
    const std::int64_t last_row = min(n0 + kBlockN, Lk) - 1 - shift + left;
    if (last_row < 0) return {r.begin, 0};
    if (last_row / kBlockM + 1 < m_blocks) r.end = static_cast<int>(last_row / kBlockM + 1);
    return r;
  }

  // The first of `m_blocks` query blocks of kBlockM rows with a row that sees key n0 (and so
  // any key of the block starting there), by the right side alone (m_blocks when none does).
  template <int kBlockM>
  MEMEFF_HD int first_query_block(std::int64_t n0, int m_blocks) const {
    if (!causal && right >= ScoreMods::kUnbounded) return 0;
    // The smallest m·kBlockM it takes: some row i <= m·kBlockM + kBlockM - 1 has n0 <= i + shift
    // + right_reach().
    const std::int64_t need = n0 - shift - right_reach() - (kBlockM - 1);
    if (need <= 0) return 0;
    return static_cast<int>(
        min((need + kBlockM - 1) / kBlockM, static_cast<std::int64_t>(m_blocks)));
  }

  // Whether some (row, key) of the tile rows [m0, m0 + kRows) x keys [n0, n0 + kCols) is not
  // visible, so the tile needs an element mask.
  template <int kRows, int kCols>
  MEMEFF_HD bool tile_needs_mask(std::int64_t m0, std::int64_t n0) const {
    return n0 + kCols > Lk || n0 + kCols - 1 > m0 + shift + right_reach() ||
           n0 < m0 + (kRows - 1) + shift - left;
  }

  // The keys query row i sees (core/visible_keys.h; a side at kUnbounded bounds nothing).
  MEMEFF_HD detail::KeySpan keys_of_row(std::int64_t i) const {
    return detail::visible_key_span(i, Lk, causal, shift, left, right);
  }
  // Bit 2n + e: query row i0 + 8n + e sees exactly one key (n < kNT, e < 2: the columns of a
  // thread's Sᵀ fragment when i0 = m0 + 2t; kNT <= 16). Row i sees [max(0, X), min(Lk, Y)) with
  // X = i + shift - left, Y = i + shift + right + 1: one key when X >= 0 and min(Lk - X, Y - X)
  // is 1, or when X < 0 and min(Lk, Y) is 1. 64-bit arithmetic once, then 32-bit compares per
  // column with clamped values (what a test of c < 128 columns needs of them): the per-row
  // keys_of_row spilled in the sm90 backward.
  template <int kNT>
  MEMEFF_HD std::uint32_t single_key_rows(std::int64_t i0) const {
    auto clamp256 = [](std::int64_t v) {
      return static_cast<int>(v < -256 ? -256 : (v > 256 ? 256 : v));
    };
    const std::int64_t x = i0 + shift - left;
    const int x32 = clamp256(x), fit32 = clamp256(Lk - x),
              y32 = clamp256(i0 + shift + right_reach() + 1);
    const bool width_one = left + right_reach() == 0, one_key = Lk == 1, any_key = Lk >= 1;
    std::uint32_t bits = 0;
#pragma unroll
    for (int c2 = 0; c2 < 2 * kNT; ++c2) {
      const int c = 8 * (c2 / 2) + (c2 & 1);
      const bool single = x32 + c >= 0 ? fit32 - c == 1 || (width_one && fit32 - c >= 1)
                                       : (one_key && y32 + c >= 1) || (any_key && y32 + c == 1);
      if (single) bits |= 1u << c2;
    }
    return bits;
  }

  // The query rows that see key j: [j - shift - right, j - shift + left], none when j >= Lk.
  MEMEFF_HD detail::KeySpan rows_of_key(std::int64_t j) const {
    if (j >= Lk) return {};
    return {j - shift - right_reach(), j - shift + left + 1};
  }
};

// The bias entry at `entry` (an fp32 one, or one of T).
template <class T>
__device__ __forceinline__ float load_bias_entry(const void* entry, bool is_fp32) {
  return is_fp32 ? __ldg(static_cast<const float*>(entry))
                 : to_float<T>(*static_cast<const T*>(entry));
}

template <class T>
__device__ __forceinline__ float load_bias(const void* bias, bool is_fp32, std::int64_t index) {
  return is_fp32 ? load_bias_entry<T>(static_cast<const float*>(bias) + index, true)
                 : load_bias_entry<T>(static_cast<const T*>(bias) + index, false);
}

// The bias entries a backward thread reads in one query block: its two keys j_lo and j_lo + 1
// (the rows of its Sᵀ fragment) at the block's queries m0 + c, c = 8n + 2t + e (its columns).
// Built once per block, so the loop over the fragment does no index arithmetic but one
// constant-times-stride add per entry; a bias broadcast over queries (stride 0: a key-padding
// mask) is read here, twice per block, and `per_key` says so. Entries at i >= Lq or j >= Lk
// read as 0 (never loaded).
template <class T>
struct BiasColumns {
  const unsigned char* thread_base = nullptr;  // entry (b, h, m0 + 2t, j_lo), in bytes
  std::int64_t stride = 0;                     // bytes between query rows (0: broadcast)
  int rows = 0;                                // queries m0 + c with c < rows are below Lq
  bool lo_ok = false, hi_ok = false;           // j_lo < Lk, j_lo + 1 < Lk
  bool fp32 = false;
  float key_lo = 0.0f, key_hi = 0.0f;  // the entries when stride == 0

  __device__ __forceinline__ bool per_key() const { return stride == 0; }

  // Entry (m0 + 8n + 2t + e, j_lo + hh); c = 8n + e (the thread's 2t is in thread_base).
  __device__ __forceinline__ float at(int c, int t, int hh) const {
    if (c + 2 * t >= rows || !(hh ? hi_ok : lo_ok)) return 0.0f;
    return load_bias_entry<T>(thread_base + c * stride + hh * (fp32 ? 4 : sizeof(T)), fp32);
  }
};

template <class T>
__device__ __forceinline__ BiasColumns<T> bias_columns(const void* bias, bool is_fp32,
                                                       std::int64_t head_offset,
                                                       std::int64_t stride_l, std::int64_t m0,
                                                       int t, std::int64_t j_lo, std::int64_t Lq,
                                                       std::int64_t Lk) {
  BiasColumns<T> c;
  const int size = is_fp32 ? 4 : static_cast<int>(sizeof(T));
  c.fp32 = is_fp32;
  c.stride = stride_l * size;
  c.rows = static_cast<int>(min(max(Lq - m0, std::int64_t{0}), std::int64_t{1} << 30));
  c.lo_ok = j_lo < Lk;
  c.hi_ok = j_lo + 1 < Lk;
  c.thread_base = static_cast<const unsigned char*>(bias) +
                  (head_offset + (m0 + 2 * t) * stride_l + j_lo) * size;
  if (c.per_key() && c.rows > 0) {
    c.key_lo = c.lo_ok ? load_bias_entry<T>(c.thread_base, is_fp32) : 0.0f;
    c.key_hi = c.hi_ok ? load_bias_entry<T>(c.thread_base + size, is_fp32) : 0.0f;
  }
  return c;
}

// s = scale·s + bias(i, j) for one row (half hh) of a fragment: `row_base` is the offset of the
// row's (b, h, i) in the bias; its bias is read only when `row_valid` and j < Lk (0 otherwise).
// kSelect: -inf where the bias is -inf, whatever s holds (a compare and a select per score, for
// kernels bound by memory such as the split-KV forward; the fused ones add, and
// bias_row_repair.cuh repairs what that let through).
template <class T, int kNT, bool kSelect = false>
__device__ __forceinline__ void add_scaled_bias_row(float (&s)[kNT][4], int hh, const void* bias,
                                                    bool is_fp32, std::int64_t row_base,
                                                    bool row_valid, std::int64_t n0, int t,
                                                    std::int64_t Lk, float scale) {
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const std::int64_t j = n0 + 8 * n + 2 * t + e;
      const float bv = (row_valid && j < Lk) ? load_bias<T>(bias, is_fp32, row_base + j) : 0.0f;
      const float x = fmaf(s[n][2 * hh + e], scale, bv);
      s[n][2 * hh + e] = kSelect && bv == -INFINITY ? bv : x;
    }
}

// s = scale·s + bias(i, j) for the fragment's two rows (0 where i >= Lq or j >= Lk). `base` is
// the offset of (b, h) in the bias, `stride_l` its row stride (0 when broadcast over queries).
// A NaN or Inf score at a -inf bias entry gives NaN here: after a biased fused forward a kernel
// recomputes the rows whose lse came out NaN (bias_row_repair.cuh); the backwards clamp the score
// before the bias (bias_safe_score).
template <class T, int kNT>
__device__ __forceinline__ void add_scaled_bias(float (&s)[kNT][4], const void* bias, bool is_fp32,
                                                std::int64_t base, std::int64_t stride_l,
                                                std::int64_t row0, std::int64_t n0, int t,
                                                std::int64_t Lq, std::int64_t Lk, float scale) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const std::int64_t i = row0 + 8 * hh;
    add_scaled_bias_row<T>(s, hh, bias, is_fp32, base + i * stride_l, i < Lq, n0, t, Lk, scale);
  }
}

// s = scale·s + bias for a bias broadcast over queries whose entries for this key tile are
// staged in shared memory (fp32, entry j of the tile at tile[j], 0 past Lk): each n8 tile reads
// its two columns 2t, 2t + 1 once for both rows. Rows at or past Lq add 0, as add_scaled_bias.
template <int kNT>
__device__ __forceinline__ void add_staged_key_bias(float (&s)[kNT][4], const float* tile, int t,
                                                    bool row_lo, bool row_hi, float scale) {
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    const float2 v = *reinterpret_cast<const float2*>(tile + 8 * n + 2 * t);
    s[n][0] = fmaf(s[n][0], scale, row_lo ? v.x : 0.0f);
    s[n][1] = fmaf(s[n][1], scale, row_lo ? v.y : 0.0f);
    s[n][2] = fmaf(s[n][2], scale, row_hi ? v.x : 0.0f);
    s[n][3] = fmaf(s[n][3], scale, row_hi ? v.y : 0.0f);
  }
}

// The backward's score before scale·s + bias: a NaN or +inf score becomes a finite one, so a -inf
// bias entry gives exp(-inf) = 0 there, as the forward's selection does, at one min per score.
// What it changes elsewhere cannot show: a row whose scores reach a NaN or +inf at a key it sees
// has a NaN lse, and exp(x - NaN) is NaN. Needs scale > 0 (the fused backwards refuse a bias with
// scale <= 0: -inf·scale would turn over); `limit` is bias_score_limit(scale).
__device__ __forceinline__ float bias_safe_score(float s, float limit) { return fminf(s, limit); }
// FLT_MAX / max(1, scale): the largest score whose product with scale is finite.
__device__ __forceinline__ float bias_score_limit(float scale) {
  return 3.4e38f / fmaxf(1.0f, scale);
}

}  // namespace memeff::cuda
