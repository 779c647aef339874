// The shared memory of the sm90 forward (fwd_kernel.cuh) as its pieces address it: the Q buffers,
// the K/V ring, the bias-tile ring, the mbarriers and the staged key-bias entries, in the order
// and sizes FwdTraits::smem_bytes counts for the launcher.
#pragma once

#include <cstdint>

#include "cuda/kernels/common/types.cuh"
#include "cuda/kernels/sm90/fwd_variant.cuh"
#include "cuda/kernels/sm90/ptx.cuh"

namespace memeff::cuda::sm90 {

// Shared-window addresses (what TMA, the mbarriers and the wgmma descriptors take) of one CTA's
// dynamic shared memory, and the barriers' setup.
template <class V>
struct ForwardSmem {
  using Tr = typename V::Tr;
  static constexpr int kQStages = V::kQStages, kStages = Tr::kStages;
  static constexpr int kQBars = 2 * kQStages;

  unsigned char* const raw;  // the kernel's dynamic shared memory
  const std::uint32_t sQ;    // kQStages buffers of kQBytes, aligned to the swizzle's period
  const std::uint32_t sK;    // kStages buffers of kKVBytes
  const std::uint32_t sV;    // kStages buffers of kKVBytes
  const std::uint32_t sB;    // kBiasTiles: kStages bias tiles
  const std::uint32_t bars;

  __device__ __forceinline__ explicit ForwardSmem(unsigned char* raw)
      : raw(raw),
        sQ((smem_addr(raw) + 1023u) & ~1023u),
        sK(sQ + kQStages * Tr::kQBytes),
        sV(sK + kStages * Tr::kKVBytes),
        sB(sV + kStages * Tr::kKVBytes),
        bars(sB + (V::kBiasTiles ? kStages * Tr::kBiasTileBytes : 0)) {}

  // Work item `local` of the CTA uses Q buffer local % kQStages, in phase (local / kQStages) & 1.
  __device__ __forceinline__ std::uint32_t q_full(int s) const { return bars + 8u * s; }
  __device__ __forceinline__ std::uint32_t q_empty(int s) const {
    return bars + 8u * (kQStages + s);
  }
  __device__ __forceinline__ std::uint32_t k_full(int s) const { return bars + 8u * (kQBars + s); }
  __device__ __forceinline__ std::uint32_t k_empty(int s) const {
    return bars + 8u * (kQBars + kStages + s);
  }
  __device__ __forceinline__ std::uint32_t v_full(int s) const {
    return bars + 8u * (kQBars + 2 * kStages + s);
  }
  __device__ __forceinline__ std::uint32_t v_empty(int s) const {
    return bars + 8u * (kQBars + 3 * kStages + s);
  }
  __device__ __forceinline__ std::uint32_t b_full(int s) const {
    return bars + 8u * (kQBars + 4 * kStages + s);
  }
  __device__ __forceinline__ std::uint32_t b_empty(int s) const {
    return bars + 8u * (kQBars + 5 * kStages + s);
  }
  // Then the staged key-bias tiles (Tr::kKeyBiasBytes, BiasRead::keys): two of kBlockN floats
  // per consumer.
  __device__ __forceinline__ float* key_bias() const {
    return reinterpret_cast<float*>(raw + (bars + 8u * Tr::kBarriers - smem_addr(raw)));
  }
  // The bias tiles (kBiasTiles) as a pointer.
  __device__ __forceinline__ const unsigned char* bias_tiles() const {
    return raw + (sB - smem_addr(raw));
  }

  // One thread's work, before the CTA-wide barrier that makes the barriers visible.
  __device__ __forceinline__ void init_barriers() const {
#pragma unroll
    for (int s = 0; s < kQStages; ++s) {
      mbar_init(q_full(s), 1);
      mbar_init(q_empty(s), 4 * Tr::kConsumers);  // one arrival per consumer warp
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * Tr::kConsumers);
      mbar_init(v_empty(s), 4 * Tr::kConsumers);
      if constexpr (V::kBiasTiles) {
        mbar_init(b_full(s), 1);
        mbar_init(b_empty(s), 4 * Tr::kConsumers);
      }
    }
    fence_barrier_init();
  }
};

}  // namespace memeff::cuda::sm90
