// The device side of the cuda_math backend (src/cuda/cuda_math.cu, its host side): gathers of
// strided views into dense fp32 buffers and scatters back, the row-wise softmax passes over the
// score matrices cuBLAS writes (bias, mask, window, ALiBi, softcap, dropout), the backward's row
// dot products and the bias-gradient reduction. Included by cuda_math.cu alone.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/dropout_map.h"
#include "core/visible_keys.h"
#include "cuda/runtime/strided_view.cuh"
#include "memeff/backend.h"

namespace memeff::detail::cuda_math {

inline constexpr int kThreads = 256;

// dst[(bh - bh0), l, w] (contiguous fp32) = src[b, h, l, w] for bh in [bh0, bh0 + count).
// A [B, H, L, W] view's rows are numbered (b·H + h)·L + l, as cuda::offset_of counts them.
__global__ void gather_kernel(cuda::StridedView src, float* dst, std::int64_t bh0,
                              std::int64_t count) {
  const std::int64_t W = src.n[3], L = src.n[2];
  const std::int64_t n = count * L * W;
  for (std::int64_t x = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; x < n;
       x += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[x] = static_cast<float>(cuda::load(src, cuda::offset_of(src, bh0 * L + x / W, x % W)));
  }
}

// dst[b, h, l, w] = scale · src[(bh - bh0), l, w] for bh in [bh0, bh0 + count).
__global__ void scatter_kernel(const float* src, cuda::StridedView dst, std::int64_t bh0,
                               std::int64_t count, float scale) {
  const std::int64_t W = dst.n[3], L = dst.n[2];
  const std::int64_t n = count * L * W;
  for (std::int64_t x = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; x < n;
       x += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    cuda::store(dst, cuda::offset_of(dst, bh0 * L + x / W, x % W), scale * src[x]);
  }
}

// What the row kernels need to know about a chunk of rows.
struct RowParams {
  std::int64_t Hq, Lq, Lk, group;
  std::int64_t bh0;  // first query head (b·Hq + h) of the chunk
  bool has_bias;
  cuda::StridedView bias;  // strides 0 on broadcast dimensions
  // The keys a row sees (visible_key_span): the causal mask and the window's sides (-1:
  // unbounded) around the diagonal, key i + shift (Problem::position_shift(); the causal shift
  // where causal).
  bool causal;
  std::int64_t shift, window_left, window_right;
  // Score modifiers (docs/window.md): ALiBi's slope of (b, h) at slopes[b·slope_sb +
  // h·slope_sh] (null: no ALiBi; slope_sb 0 for slopes [Hq]), and the softcap of s = scale·q·k
  // (0: none).
  const float* slopes;
  std::int64_t slope_sb, slope_sh;
  float softcap;
  // The backward's out and lse are a larger attention's (Problem::kv_block): a row's softmax
  // spans other key blocks too, so a row with one key here is no single-key row.
  bool kv_block;
  // Global coordinates (Problem::q_start, k_start): row i and key j draw the map's row
  // q_start + i and key k_start + j (any k_start: the map is read element by element).
  std::int64_t q_start, k_start;
  bool dropout;
  std::uint32_t threshold;
  float keep_scale;
  std::uint64_t seed, offset;
  const std::uint64_t* seed_ptr;
  const std::uint64_t* offset_ptr;
  float* lse;  // [B, Hq, Lq] strided view
  std::int64_t lse_sb, lse_sh;
};

__device__ __forceinline__ DropoutKey row_key(const RowParams& p) {
  const std::uint64_t seed = p.seed_ptr ? *p.seed_ptr : p.seed;
  const std::uint64_t offset = p.offset_ptr ? *p.offset_ptr : p.offset;
  return dropout_key(seed, offset);
}

// Row r of a chunk (r = local head · Lq + i): its head, its keys and its ALiBi slope.
struct Row {
  std::int64_t bh, b, h, i;
  KeySpan keys;  // keys [begin, end) that the causal mask and the window leave
  float slope;   // 0 without ALiBi
};

__device__ __forceinline__ Row row_of(const RowParams& p, std::int64_t r) {
  Row row;
  row.bh = p.bh0 + r / p.Lq;
  row.i = r % p.Lq;
  row.b = row.bh / p.Hq;
  row.h = row.bh % p.Hq;
  row.keys = visible_key_span(row.i, p.Lk, p.causal, p.shift, p.window_left, p.window_right);
  row.slope = p.slopes ? p.slopes[row.b * p.slope_sb + row.h * p.slope_sh] : 0.f;
  return row;
}

// The score of key j from s = scale·q·k (docs/window.md): cap(s) + bias - slope·|i + shift - j|,
// or -inf where the causal mask, the window or a -inf bias hides the key (whatever s holds).
// With the softcap, *cap_grad (when given) receives the cap's derivative 1 - tanh²(s / softcap)
// of a key the mask and window leave.
__device__ __forceinline__ float masked_score(const RowParams& p, const Row& row, float s,
                                              std::int64_t j, float* cap_grad = nullptr) {
  if (j < row.keys.begin || j >= row.keys.end) return -INFINITY;
  if (p.softcap > 0.f) {  // Gemma-2's order: the scaled product alone, before everything else
    const float t = tanhf(s / p.softcap);
    s = p.softcap * t;
    if (cap_grad) *cap_grad = 1.f - t * t;
  }
  if (p.slopes) {  // distances in fp32: exact below 2^24
    const std::int64_t d = row.i + p.shift - j;
    s = fmaf(-row.slope, static_cast<float>(d < 0 ? -d : d), s);
  }
  if (p.has_bias) {
    const float bias = static_cast<float>(
        cuda::load(p.bias, row.b * p.bias.s[0] + row.h * p.bias.s[1] + row.i * p.bias.s[2] + j));
    s = bias == -INFINITY ? bias : s + bias;
  }
  return s;
}

// The maximum, NaN when either is (fmaxf drops a NaN, which would hide a NaN row).
__device__ __forceinline__ float nan_max(float a, float b) {
  return isnan(a) || isnan(b) ? NAN : fmaxf(a, b);
}

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float shared[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? nan_max(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared[] may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? shared[lane] : (is_max ? -INFINITY : 0.f);
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? nan_max(v, other) : v + other;
  }
  return v;
}

// Forward: one block per row r of the chunk (r = local head · Lq + i). S holds scale·q·k; it
// becomes P∘Z (the dropped, rescaled probabilities) and lse is written.
__global__ void softmax_forward_kernel(float* S, RowParams p) {
  const std::int64_t r = blockIdx.x;
  const Row row = row_of(p, r);
  float* s_row = S + r * p.Lk;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < p.Lk; j += blockDim.x) {
    const float s = masked_score(p, row, s_row[j], j);
    s_row[j] = s;
    m = nan_max(m, s);
  }
  m = block_reduce(m, true);
  float sum = 0.f;
  if (m != -INFINITY) {
    for (std::int64_t j = threadIdx.x; j < p.Lk; j += blockDim.x) sum += expf(s_row[j] - m);
  }
  sum = block_reduce(sum, false);
  const float lse = m == -INFINITY ? -INFINITY : m + logf(sum);
  if (threadIdx.x == 0) p.lse[row.b * p.lse_sb + row.h * p.lse_sh + row.i] = lse;
  const DropoutKey key = row_key(p);
  for (std::int64_t j = threadIdx.x; j < p.Lk; j += blockDim.x) {
    float prob = m == -INFINITY ? 0.f : expf(s_row[j] - m) / sum;
    if (p.dropout) {
      prob = dropout_keep_element(key, p.threshold, row.bh, p.q_start + row.i, p.k_start + j)
                 ? prob * p.keep_scale
                 : 0.f;
    }
    s_row[j] = prob;
  }
}

// Backward step 1: S (scale·q·k) becomes P = exp(score - lse), 0 where masked. With the softcap,
// cap_grad (the chunk's third Lq×Lk buffer, else null) receives d cap(s) / ds: 1 - tanh², and 1
// where the key is masked (its P is 0).
__global__ void probs_backward_kernel(float* S, float* cap_grad, RowParams p) {
  const std::int64_t r = blockIdx.x;
  const Row row = row_of(p, r);
  const float lse = p.lse[row.b * p.lse_sb + row.h * p.lse_sh + row.i];
  float* s_row = S + r * p.Lk;
  float* g_row = cap_grad ? cap_grad + r * p.Lk : nullptr;
  for (std::int64_t j = threadIdx.x; j < p.Lk; j += blockDim.x) {
    float g = 1.f;
    const float s = masked_score(p, row, s_row[j], j, &g);
    s_row[j] = (lse == -INFINITY || s == -INFINITY) ? 0.f : expf(s - lse);
    if (g_row) g_row[j] = g;
  }
}

// Backward step 2: with P in A and dP' = dO·Vᵀ in dP, A becomes P∘Z and dP becomes
// dS = P∘(Z∘dP' - D_i), D_i = rowsum(dO∘O): the gradient of the score, which the bias gets. dS is
// exactly 0 on a row that sees one key (core/visible_keys.h), but within a larger attention
// (kv_block); x·0 keeps a NaN of the data. With the softcap (cap_grad from step 1), cap_grad
// becomes dS (for dbias) and dP the gradient of scale·q·k, dS∘cap_grad.
__global__ void dsoftmax_kernel(float* A, float* dP, float* cap_grad, const float* Dsum,
                                RowParams p) {
  const std::int64_t r = blockIdx.x;
  const Row row = row_of(p, r);
  const float d = Dsum[row.bh * p.Lq + row.i];
  const bool one_key = !p.kv_block && row.keys.size() == 1;
  const DropoutKey key = row_key(p);
  float* a = A + r * p.Lk;
  float* dp = dP + r * p.Lk;
  float* g = cap_grad ? cap_grad + r * p.Lk : nullptr;
  for (std::int64_t j = threadIdx.x; j < p.Lk; j += blockDim.x) {
    const float prob = a[j];
    float z = 1.f;
    if (p.dropout)
      z = dropout_keep_element(key, p.threshold, row.bh, p.q_start + row.i, p.k_start + j)
              ? p.keep_scale
              : 0.f;
    a[j] = prob * z;
    float ds = prob * (z * dp[j] - d);
    if (one_key) ds *= 0.f;
    if (g) {
      const float cap_derivative = g[j];
      g[j] = ds;
      ds *= cap_derivative;
    }
    dp[j] = ds;
  }
}

// Dsum[bh, i] = Σ_e dO[b,h,i,e]·O[b,h,i,e]; one warp per row.
__global__ void rowdot_kernel(cuda::StridedView dout, cuda::StridedView out, float* Dsum,
                              std::int64_t rows) {
  const std::int64_t row = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float acc = 0.f;
  for (std::int64_t e = lane; e < out.n[3]; e += 32) {
    acc += static_cast<float>(cuda::load(dout, cuda::offset_of(dout, row, e))) *
           static_cast<float>(cuda::load(out, cuda::offset_of(out, row, e)));
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) Dsum[row] = acc;
}

// dbias_acc[bb, hh, ii, j] += Σ over the chunk's rows that broadcast onto it of dS[row, j].
// Each target (bb, hh, ii) visits only the rows that map to it. Deterministic: a block is 32
// columns × 8 row slices, reduced over the slices in a fixed order; chunks run in stream order.
struct DbiasParams {
  std::int64_t Hq, Lq, Lk, bh0, heads;  // the chunk: query heads [bh0, bh0 + heads)
  std::int64_t B, db_B, db_H, db_Q;     // dbias sizes along B, H, Lq (1 where broadcast)
};
__global__ void dbias_kernel(const float* dS, float* acc, DbiasParams p) {
  __shared__ float part[8][32];
  const std::int64_t j = blockIdx.x * 32 + threadIdx.x;
  const std::int64_t targets = p.db_B * p.db_H * p.db_Q;
  for (std::int64_t target = blockIdx.y; target < targets; target += gridDim.y) {
    const std::int64_t ii = target % p.db_Q, hh = (target / p.db_Q) % p.db_H,
                       bb = target / (p.db_Q * p.db_H);
    const std::int64_t nb = p.db_B == 1 ? p.B : 1, nh = p.db_H == 1 ? p.Hq : 1,
                       ni = p.db_Q == 1 ? p.Lq : 1;
    float sum = 0.f;
    if (j < p.Lk) {
      for (std::int64_t t = threadIdx.y; t < nb * nh * ni; t += 8) {
        const std::int64_t i = p.db_Q == 1 ? t % ni : ii;
        const std::int64_t h = p.db_H == 1 ? (t / ni) % nh : hh;
        const std::int64_t b = p.db_B == 1 ? t / (ni * nh) : bb;
        const std::int64_t local = b * p.Hq + h - p.bh0;
        if (local >= 0 && local < p.heads) sum += dS[(local * p.Lq + i) * p.Lk + j];
      }
    }
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && j < p.Lk) {
      float total = 0.f;
      for (int y = 0; y < 8; ++y) total += part[y][threadIdx.x];
      acc[target * p.Lk + j] += total;
    }
    __syncthreads();
  }
}

inline int grid_for(std::int64_t n) {
  return static_cast<int>(std::clamp<std::int64_t>((n + kThreads - 1) / kThreads, 1, 65535 * 8));
}

}  // namespace memeff::detail::cuda_math
