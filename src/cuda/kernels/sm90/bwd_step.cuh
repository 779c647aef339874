// The sm90 backward's step from the products Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (bwd_kernel.cuh: issued,
// not waited for) to the wgmma A fragments of Pᵀ∘Z and dSᵀ, with dbias written on the way: the
// plain step (bias tiles, a bias read per score, the window's element mask in the kernels with
// window code) and the modifiers' step (ALiBi, softcap, window; kMods). Both wait for Sᵀ, then
// compute P (exp2 of the scaled score minus the row's lse·log2 e, 0 where masked) while dPᵀ
// still runs, then dS = P∘(Z∘dPᵀ − delta) and zero dS where a query sees a single key.
//
// Their arguments, one thread's: sacc and dpacc the accumulators of Sᵀ and dPᵀ (Pᵀ∘Z and dSᵀ on
// return, before packing), lse_s and delta_s the step's lse·log2(e) and delta in shared memory,
// keep the step's dropout keep words (bwd_consumer.cuh's kept_mask), smem and buf the dS buffer
// (bias tiles), b and h the batch and query head, m0 the step's first query, key0 the thread's
// first key (its rows hold key0 and key0 + 1), need_mask whether the tile needs the element mask
// (window: the window's, else the causal mask's and the sequence end's), seq_Lk() the sequence's
// keys; wg, warp, g, t the thread's warpgroup, warp and lane coordinates.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/common/bwd_dbias.cuh"
#include "cuda/kernels/common/mask.cuh"
#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/score_modifiers.cuh"
#include "cuda/kernels/common/softmax.cuh"
#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/sm90/bwd_consumer.cuh"
#include "cuda/kernels/sm90/bwd_traits.cuh"
#include "cuda/kernels/sm90/bwd_variant.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// The modifiers' step (the kMods kernels): kCap and kAlibi as the kernel's template
// (bwd_kernel.cuh).
template <class T, class Tr, bool kDropout, ModsCap kCap, bool kAlibi, class SeqLk>
__device__ __forceinline__ void modifiers_step_fragments(
    const BackwardTmaParams& tp, const BackwardParams& p, float (&sacc)[Tr::kNT][4],
    float (&dpacc)[Tr::kNT][4], std::uint32_t (&pf)[Tr::kKVSteps][4],
    std::uint32_t (&dsf)[Tr::kKVSteps][4], const float* lse_s, const float* delta_s,
    const std::uint32_t* keep, const unsigned char* smem, int buf, bool has_bias,
    DbiasMode dbias_mode, float ds_scale, float score_limit, std::int64_t bias_b, int b, int h,
    std::int64_t m0, std::int64_t key0, bool need_mask, bool window, bool causal,
    std::int64_t causal_shift, bool packed_call, SeqLk&& seq_Lk, int wg, int warp, int g, int t) {
  constexpr int kNT = Tr::kNT;
  // The modifiers' step from Sᵀ and dPᵀ (waiting for them) to pf = Pᵀ∘Z and dsf = dSᵀ of the
  // scaled product, with dbias written on the way: the score is cap(scale·s) + bias -
  // slope·|i + shift - j| (each where the call has it), masked by the window, the causal
  // mask and Lk (need_mask), and the cap's derivative 1 - tanh² multiplies dS after dbias
  // took it. Without a cap P is computed while dPᵀ is still on the tensor cores, as in the
  // plain step; with one, the cap, P and dS of each element in one pass after it (ptxas,
  // sm_90a, head dim 64: capping first, while dPᵀ ran, spilled half as much again).
  const KeyMask mask{causal, seq_Lk(), causal_shift, p.mods.left_reach, p.mods.right_reach};
  const bool cap = kCap == ModsCap::on ||
                   (kCap == ModsCap::run_time && (p.mods.flags & ScoreMods::kSoftcap) != 0);
  [[maybe_unused]] float slope = 0.0f, diagonal = 0.0f;
  if constexpr (kAlibi) {
    slope = (p.mods.flags & ScoreMods::kAlibi) ? alibi_slope(p.mods, b, h) : 0.0f;
    // i + shift - j of element (0, 0): query m0 + 2t, key key0 (fp32: exact below 2^24).
    diagonal = static_cast<float>(m0 + 2 * t + causal_shift - key0);
  }
  BiasColumns<T> bc;
  if (has_bias) {
    bc = bias_columns<T>(p.bias, p.bias_is_fp32, bias_b + h * p.bias_stride.h, p.bias_stride.l, m0,
                         t, key0, p.Lq, p.Lk);
  }
  int lo[2] = {0, 0}, hi[2] = {8 * kNT, 8 * kNT};
  if (need_mask) visible_columns<kNT>(mask, m0, t, key0, lo, hi);
  // P of element (n, r) from its score sv in units of q·k (capped already where the call
  // has a cap); 0 where masked. A -inf bias masks the key whatever sv holds (mask.cuh).
  auto p_of = [&](int n, int r, float sv) {
    const int c = 8 * n + (r & 1), hh = r >> 1;
    float pv;
    if constexpr (kAlibi) {
      float x = sv * p.scale;
      if (has_bias) {
        const float entry = bc.per_key()
                                ? (c + 2 * t < bc.rows ? (hh ? bc.key_hi : bc.key_lo) : 0.0f)
                                : bc.at(c, t, hh);
        x = fmaf(bias_safe_score(sv, score_limit), p.scale, entry);
      }
      x = fmaf(-slope, fabsf(diagonal + static_cast<float>(c - hh)), x);
      pv = fast_exp2(fmaf(x, kLog2e, -lse_s[c + 2 * t]));
    } else {  // the plain step's P (no bias, no cap)
      pv = fast_exp2(fmaf(sv, p.scale_log2, -lse_s[c + 2 * t]));
    }
    return c < lo[hh] || c >= hi[hh] ? 0.0f : pv;
  };
  wgmma_wait<1>();
  fence_operands(sacc);
  if (!cap) {  // P while dPᵀ is still on the tensor cores
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) sacc[n][r] = p_of(n, r, sacc[n][r]);
  }
  wgmma_wait<0>();
  fence_operands(dpacc);
  // dS as the plain step has it (Pᵀ∘(M∘dPᵀ − delta / keep_scale), dropout's mask all ones
  // without dropout), 0 in the columns of a query that sees a single key (bit 2n + e of
  // `single`; kv_block: it may see other keys elsewhere, never packed). dbias takes it from
  // the fragment after the loop, before the cap's derivative: with a cap, Pᵀ∘Z and 1 - tanh²
  // share each element's register in sacc meanwhile (pack_p_and_cap_grad), so no fragment
  // beyond the plain step's is held (ptxas, sm_90a, head dim 64: a separate one serialized
  // the wgmmas; writing dbias element by element took ptxas 15 s).
  const std::uint32_t single =
      need_mask && (packed_call || !p.kv_block) ? mask.single_key_rows<kNT>(m0 + 2 * t) : 0u;
  auto ds_loop = [&](auto with_cap) {
    constexpr bool kWithCap = decltype(with_cap)::value;
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int e = r & 1;
        float pv = sacc[n][r], cap_grad = 1.0f;
        if constexpr (kWithCap) {
          const float capped = softcap_score(sacc[n][r], p.mods);
          const float th = capped * p.mods.softcap_in;  // tanh(scale·s / softcap)
          pv = p_of(n, r, capped);
          cap_grad = fmaf(-th, th, 1.0f);
        }
        // Without dropout (a kernel compiled without it has no keep words) all kept.
        const std::uint32_t kept = kDropout ? kept_mask(keep, n, r) : ~0u;
        dpacc[n][r] = pv * (__uint_as_float(__float_as_uint(dpacc[n][r]) & kept) -
                            delta_s[8 * n + 2 * t + e]);
        if ((single >> (2 * n + e)) & 1u) dpacc[n][r] *= 0.0f;  // NaN stays (docs/api.md)
        const float pz = __uint_as_float(__float_as_uint(pv) & kept);
        sacc[n][r] = kWithCap ? pack_p_and_cap_grad<T>(pz, cap_grad) : pz;
      }
    }
  };
  if (cap) {  // a constant but in the general kernel (kCap)
    ds_loop(std::true_type{});
  } else {
    ds_loop(std::false_type{});
  }
  if (has_bias) {
    write_dbias<T>(p, dbias_mode, tp.dbias_accum, dpacc, ds_scale, b, h, m0, key0, key0 + 1, t);
  }
  if (cap) {
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) dpacc[n][r] *= cap_grad_of(sacc[n][r]);
      // pf pairs (element 0 low, 1 high) from the upper halves (pack_p_and_cap_grad's P∘Z).
      pf[n / 2][2 * (n % 2)] =
          __byte_perm(__float_as_uint(sacc[n][0]), __float_as_uint(sacc[n][1]), 0x7632);
      pf[n / 2][2 * (n % 2) + 1] =
          __byte_perm(__float_as_uint(sacc[n][2]), __float_as_uint(sacc[n][3]), 0x7632);
    }
  } else {
    pack_fragments<T>(pf, sacc);
  }
  pack_fragments<T>(dsf, dpacc);
}

// The plain step: kBias (a bias, read per score unless kBiasTiles: from the dS buffer, where the
// producer loaded it) and kWindowCode (the window's element mask when the call has one) as the
// kernel's template.
template <class T, class Tr, bool kDropout, bool kBias, bool kBiasTiles, bool kWindowCode,
          class SeqLk>
__device__ __forceinline__ void plain_step_fragments(
    const BackwardTmaParams& tp, const BackwardParams& p, float (&sacc)[Tr::kNT][4],
    float (&dpacc)[Tr::kNT][4], std::uint32_t (&pf)[Tr::kKVSteps][4],
    std::uint32_t (&dsf)[Tr::kKVSteps][4], const float* lse_s, const float* delta_s,
    const std::uint32_t* keep, const unsigned char* smem, int buf, bool has_bias,
    DbiasMode dbias_mode, float ds_scale, float score_limit, std::int64_t bias_b, int b, int h,
    std::int64_t m0, std::int64_t key0, bool need_mask, bool window, bool causal,
    std::int64_t causal_shift, bool packed_call, SeqLk&& seq_Lk, int wg, int warp, int g, int t) {
  constexpr int kNT = Tr::kNT, kBlockN = Tr::kBlockN;
  // Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e) (+ bias·log2 e), masked. bias_at(n, r): the
  // entry of fragment element (n, r).
  auto scores_to_p = [&](auto bias_at) {
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse_s + 8 * n + 2 * t);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float lse2 = (r & 1) ? l2.y : l2.x;
        float x;
        if constexpr (kBias) {
          // A -inf bias masks the key whatever the score holds (mask.cuh, bias_safe_score).
          x = fmaf(fmaf(bias_safe_score(sacc[n][r], score_limit), p.scale, bias_at(n, r)), kLog2e,
                   -lse2);
        } else {
          x = fmaf(sacc[n][r], p.scale_log2, -lse2);
        }
        sacc[n][r] = fast_exp2(x);
      }
    }
  };
  if constexpr (kBiasTiles) {
    // This warpgroup's entries in the dS buffer (the producer's boxes): query 8n + 2t + e of
    // the block in row 8(n % 8) + 2t + e of box n / 8, its keys key0, key0 + 1 (8g + 2·warp
    // of the warpgroup's 64) in one 4-byte word of 16-byte chunk g, swizzled by the row.
    const unsigned char* const tile = smem + Tr::kOffDs + buf * Tr::kDsBytes + wg * 64 * 128;
    wgmma_wait<1>();
    fence_operands(sacc);
    scores_to_p([&](int n, int r) {
      const int row = 8 * (n % 8) + 2 * t + (r & 1);
      const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(
          tile + (n / 8) * (kBlockN * 128) + row * 128 + (((g ^ row) & 7) << 4) + 4 * warp);
      return (r >> 1) ? unpack_hi<T>(w) : unpack_lo<T>(w);
    });
  } else if constexpr (kBias) {
    const BiasColumns<T> bc = bias_columns<T>(p.bias, p.bias_is_fp32, bias_b + h * p.bias_stride.h,
                                              p.bias_stride.l, m0, t, key0, p.Lq, p.Lk);
    wgmma_wait<1>();
    fence_operands(sacc);
    if (bc.per_key()) {  // a key-padding mask: the two entries read above
      scores_to_p([&](int n, int r) {
        return 8 * n + 2 * t + (r & 1) < bc.rows ? ((r >> 1) ? bc.key_hi : bc.key_lo) : 0.0f;
      });
    } else {
      scores_to_p([&](int n, int r) { return bc.at(8 * n + (r & 1), t, r >> 1); });
    }
  } else {
    wgmma_wait<1>();
    fence_operands(sacc);
    scores_to_p([](int, int) { return 0.0f; });
  }
  if constexpr (kWindowCode) {
    if (need_mask && window) {  // the window's span of queries per key row, as columns
      int lo[2], hi[2];
      visible_columns<kNT>(
          KeyMask{causal, seq_Lk(), causal_shift, p.mods.left_reach, p.mods.right_reach}, m0, t,
          key0, lo, hi);
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int c = 8 * n + (r & 1);
          if (c < lo[r >> 1] || c >= hi[r >> 1]) sacc[n][r] = 0.0f;
        }
    }
  }
  if (need_mask && !window) {
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const std::int64_t i = m0 + 8 * n + 2 * t + (r & 1), j = key0 + (r >> 1);
        if (j >= seq_Lk() || (causal && j > i + causal_shift)) sacc[n][r] = 0.0f;
      }
  }

  // dSᵀ = Pᵀ ∘ (Z ∘ dPᵀ − delta) into dpacc, Pᵀ ∘ Z into sacc. With dropout Z = M·keep_scale
  // (M the 0/1 mask) and both are kept divided by keep_scale: Pᵀ∘M and Pᵀ∘(M∘dPᵀ − delta /
  // keep_scale) (the preprocess stores delta / keep_scale), a mask and two ANDs per element
  // more than without dropout; the epilogues, the dQ conversion and dbias multiply keep_scale
  // back in (ds_scale).
  wgmma_wait<0>();
  fence_operands(dpacc);
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    const float2 dl = *reinterpret_cast<const float2*>(delta_s + 8 * n + 2 * t);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int e = r & 1;
      const float pv = sacc[n][r];
      if constexpr (kDropout) {
        const std::uint32_t kept = kept_mask(keep, n, r);
        sacc[n][r] = __uint_as_float(__float_as_uint(pv) & kept);
        dpacc[n][r] =
            pv * (__uint_as_float(__float_as_uint(dpacc[n][r]) & kept) - (e ? dl.y : dl.x));
      } else {
        dpacc[n][r] = pv * (dpacc[n][r] - (e ? dl.y : dl.x));
      }
    }
  }
  // kv_block: the row may see other keys elsewhere (never packed: validation).
  if (need_mask && (packed_call || !p.kv_block)) {
    if (window) {  // false where the instantiation has no window code (kWindowCode)
      zero_single_key_columns(
          dpacc, KeyMask{causal, seq_Lk(), causal_shift, p.mods.left_reach, p.mods.right_reach}
                     .template single_key_rows<kNT>(m0 + 2 * t));
    } else {
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // dS is 0 but for a NaN or Inf, which is the data's, not rounding's (docs/api.md):
          // x·0 is 0 for finite x and NaN otherwise.
          if (sees_one_key(m0 + 8 * n + 2 * t + e, seq_Lk(), causal, causal_shift)) {
            dpacc[n][e] *= 0.0f;
            dpacc[n][2 + e] *= 0.0f;
          }
        }
    }
  }
  if constexpr (kBias) {
    write_dbias<T>(p, dbias_mode, tp.dbias_accum, dpacc, ds_scale, b, h, m0, key0, key0 + 1, t);
  }
  pack_fragments<T>(pf, sacc);
  pack_fragments<T>(dsf, dpacc);
}

}  // namespace memeff::cuda::sm90
