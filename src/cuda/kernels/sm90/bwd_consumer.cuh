// Pieces of the sm90 backward's consumer mainloop (bwd_kernel.cuh): the permuted rows of K and V
// and their load, dropout's keep bits in the Sᵀ orientation, the mask's visible columns, and the
// Sᵀ-layout accumulators as wgmma A fragments.
#pragma once

#include <cstdint>

#include "cuda/kernels/common/cp_async.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// The eight 2-bit fields of x (16 bits) moved to the low halves of eight nibbles.
__device__ __forceinline__ std::uint32_t spread_bit_pairs(std::uint32_t x) {
  x = (x | (x << 8)) & 0x00FF00FFu;
  x = (x | (x << 4)) & 0x0F0F0F0Fu;
  return (x | (x << 2)) & 0x33333333u;
}

// An 8 x 8 matrix of nibbles over the eight lanes of a lane column (lanes 4g + t, g = 0..7):
// lane g holds row g, nibble d of its word is column d. Returns the transpose: lane g then holds
// column g, nibble s being row s's. Three butterfly steps, each swapping the nibbles whose index
// bit k differs from the lane's g bit k with the partner lane (lane ^ (4 << k)).
__device__ __forceinline__ std::uint32_t transpose_nibbles8(std::uint32_t w, int g) {
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const int shift = 4 << k;
    const std::uint32_t low = k == 0 ? 0x0F0F0F0Fu : (k == 1 ? 0x00FF00FFu : 0x0000FFFFu);
    const bool upper = (g >> k) & 1;
    const std::uint32_t send = upper ? (w & low) << shift : (w >> shift) & low;
    const std::uint32_t recv = __shfl_xor_sync(0xFFFFFFFFu, send, 4 << k);
    w = (upper ? (w & ~low) : (w & low)) | recv;
  }
  return w;
}

// The key (within the CTA's kBlockN) held by shared-memory row `row` of K and V: inside each
// 64-key block, row 16w + 8h + g holds key 8g + 2w + h.
__device__ __forceinline__ int bwd_key_of_row(int row) {
  const int r = row & 63;
  return (row & ~63) + 8 * (r & 7) + 2 * (r >> 4) + ((r >> 3) & 1);
}

// A tile's K and V into shared memory (kOffK, kOffV of `smem`) by the consumers (warpgroup wg,
// thread ctid of it): the key block's kBlockN keys from n0 on of (b, kvh), counted from key row
// k0() (the sequence's first when packed), rows permuted inside each 64-key block
// (bwd_key_of_row), 16-byte chunks placed as the 128-byte swizzle wants them; keys from seq_lk()
// on and columns past D / Dv are zero. Returns once both warpgroups' copies have landed.
template <class T, class Tr, class K0, class SeqLk>
__device__ __forceinline__ void load_key_block(unsigned char* smem, const BackwardParams& p, int b,
                                               int kvh, std::int64_t n0, K0&& k0, SeqLk&& seq_lk,
                                               int wg, int ctid) {
  const T* kg =
      static_cast<const T*>(p.k) + b * p.k_stride.b + kvh * p.k_stride.h + k0() * p.k_stride.l;
  const T* vg =
      static_cast<const T*>(p.v) + b * p.v_stride.b + kvh * p.v_stride.h + k0() * p.v_stride.l;
  constexpr int kChunks = Tr::kDBlocks * Tr::kBlockN * 8;
  for (int c = ctid + 128 * wg; c < kChunks; c += 128 * Tr::kConsumers) {
    const int db = c / (Tr::kBlockN * 8), row = (c / 8) % Tr::kBlockN, chunk = c % 8;
    const std::int64_t key = n0 + bwd_key_of_row(row);
    const int col = 64 * db + 8 * chunk;
    const int dst = db * Tr::kKVBlockBytes + row * 128 + ((chunk ^ (row & 7)) << 4);
    const bool row_ok = key < seq_lk();
    const std::int64_t kc = row_ok ? key : 0;
    cp_async_16(smem + Tr::kOffK + dst, kg + kc * p.k_stride.l + (col < p.D ? col : 0),
                row_ok && col < p.D ? 16 : 0);
    cp_async_16(smem + Tr::kOffV + dst, vg + kc * p.v_stride.l + (col < p.Dv ? col : 0),
                row_ok && col < p.Dv ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_smem();  // written by ordinary copies, read by wgmma
  named_bar_sync(Tr::kConsumerBarrier, 128 * Tr::kConsumers);
}

// The columns [lo[hh], hi[hh]) of a thread's Sᵀ fragment (c = 8n + e: query m0 + 2t + c) whose
// queries see its key key0 + hh under `mask` (KeyMask::rows_of_key), clamped to the fragment.
template <int kNT>
__device__ __forceinline__ void visible_columns(const KeyMask& mask, std::int64_t m0, int t,
                                                std::int64_t key0, int (&lo)[2], int (&hi)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const detail::KeySpan rows = mask.rows_of_key(key0 + hh);
    lo[hh] = fragment_column<kNT>(rows.begin, m0, t);
    hi[hh] = fragment_column<kNT>(rows.end, m0, t);
  }
}

// dS = 0 in the columns of a thread's Sᵀ fragment whose query sees a single key (bit 2n + e of
// `single`: KeyMask::single_key_rows, the window's rule; core/visible_keys.h). dS is 0 but for a
// NaN or Inf, which is the data's, not rounding's (docs/api.md): x·0 is 0 for finite x and NaN
// otherwise.
template <int kNT>
__device__ __forceinline__ void zero_single_key_columns(float (&ds)[kNT][4], std::uint32_t single) {
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if ((single >> (2 * n + e)) & 1u) {
        ds[n][e] *= 0.0f;
        ds[n][2 + e] *= 0.0f;
      }
    }
}

// Dropout's mask of element (n, r) of an Sᵀ fragment from the step's keep words (nibble n % 8 of
// word n / 8, bit 2e + hh): all ones where kept, 0 where dropped (the bit moved to the sign, then
// replicated).
__device__ __forceinline__ std::uint32_t kept_mask(const std::uint32_t* keep, int n, int r) {
  return static_cast<std::uint32_t>(
      static_cast<std::int32_t>(keep[n / 8] << (31 - (4 * (n % 8) + 2 * (r & 1) + (r >> 1)))) >>
      31);
}

// An Sᵀ-layout accumulator as wgmma A fragments (16 queries per k-step).
template <class T, int kNT>
__device__ __forceinline__ void pack_fragments(std::uint32_t (&f)[kNT / 2][4],
                                               const float (&a)[kNT][4]) {
#pragma unroll
  for (int kk = 0; kk < kNT / 2; ++kk) {
    f[kk][0] = pack2<T>(a[2 * kk][0], a[2 * kk][1]);
    f[kk][1] = pack2<T>(a[2 * kk][2], a[2 * kk][3]);
    f[kk][2] = pack2<T>(a[2 * kk + 1][0], a[2 * kk + 1][1]);
    f[kk][3] = pack2<T>(a[2 * kk + 1][2], a[2 * kk + 1][3]);
  }
}

// A consumer warpgroup's dSᵀ fragments (pack_fragments' layout) into the dS buffer `ds_buf`:
// [query / 64][key row][64 queries], its 64 key rows from 64·wg on, 16-byte chunks swizzled by
// the row.
template <class Tr>
__device__ __forceinline__ void store_ds_fragments(unsigned char* ds_buf,
                                                   const std::uint32_t (&dsf)[Tr::kKVSteps][4],
                                                   int wg, int warp, int g, int t) {
#pragma unroll
  for (int n = 0; n < Tr::kNT; ++n)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = 64 * wg + 16 * warp + 8 * hh + g;
      const int off = (n / 8) * (Tr::kBlockN * 128) + row * 128 + (((n % 8) ^ g) << 4) + 4 * t;
      *reinterpret_cast<std::uint32_t*>(ds_buf + off) = dsf[n / 2][(n % 2) * 2 + hh];
    }
}

}  // namespace memeff::cuda::sm90
