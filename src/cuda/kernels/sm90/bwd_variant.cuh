// Which code one sm90 backward instantiation has: attention_backward_kernel's template arguments
// (bwd_kernel.cuh) and what follows from them, in one type the kernel's pieces take (the
// scheduler, the producer, the dQ writers and the consumers).
#pragma once

#include "cuda/kernels/sm90/bwd_traits.cuh"

namespace memeff::cuda::sm90 {

// The softcap of a modifiers' kernel (kCap of attention_backward_kernel, whose comment says which
// kernels have which): the params' at run time, or fixed off or on at compile time.
enum class ModsCap { run_time, off, on };

// The instantiations that can run on a persistent grid (tp.persist_tiles, set by the launcher
// for dense calls without a causal mask): head dim 64's plain kernel without dropout. Each CTA
// takes every gridDim.x-th tile (a key block of a (batch, kv head)), and the producer loads the
// next tile's first Q and dO while the consumers write this one's dK and dV, which go out through
// the K and V buffers. The other kernels compile the single tile of their block. With dropout the
// persistent kernel spilled 60/84 bytes (32/32 without its code) and ran 1-11% slower than the
// single-tile one (H100, nineteenth session in docs/benchmarks.md), so it stays without.
template <class Tr, bool kDropout, bool kBias, bool kPacked, bool kBiasTiles, bool kMods, bool kDet>
constexpr bool backward_persists() {
  return Tr::kHeadDim == 64 && !kDropout && !kBias && !kPacked && !kBiasTiles && !kMods && !kDet;
}

// T: the 16-bit element type; Tr: the tile shape (BwdTraits); the rest as
// attention_backward_kernel's template arguments.
template <class T_, class Tr_, bool kDropout_, bool kBias_, bool kPacked_, bool kBiasTiles_,
          bool kMods_, ModsCap kCap_, bool kAlibi_, bool kDet_>
struct BackwardVariant {
  using T = T_;
  using Tr = Tr_;
  static constexpr bool kDropout = kDropout_;
  static constexpr bool kBias = kBias_;
  static constexpr bool kPacked = kPacked_;
  static constexpr bool kBiasTiles = kBiasTiles_;
  static constexpr bool kMods = kMods_;
  static constexpr ModsCap kCap = kCap_;
  static constexpr bool kAlibi = kAlibi_;
  static constexpr bool kDet = kDet_;
  static_assert(!(kPacked && kBias), "packed calls take no bias");
  static_assert(kBias || !kBiasTiles, "bias tiles are a bias");
  static_assert(
      !kMods || (!kPacked && !kBiasTiles &&
                 (kBias ? kDropout && kCap == ModsCap::run_time : kCap != ModsCap::run_time)),
      "the score-modifier kernels take packing (with a bias: dropout, the cap) at run time");
  static_assert(kMods || kCap == ModsCap::run_time, "the cap is the modifiers' kernels'");
  static_assert(kAlibi || (kMods && !kBias && kCap == ModsCap::off),
                "the kernels without ALiBi's term are the window's alone");
  // The modifiers' kernels with a bias or the cap: dropout as the params say.
  static constexpr bool kRuntimeDropout = kMods && (kBias || kCap == ModsCap::on);
  static_assert(!kRuntimeDropout || kDropout, "run-time dropout is compiled with dropout");
  // Instantiations with the window's code: the modifiers' kernels, the packed ones and those of
  // bias tiles. The dense ones without a bias have none (on the H100 their window tests cost calls
  // without a window 1-5%; bwd_run.cuh sends windows to the modifiers' kernels).
  static constexpr bool kWindowCode = kMods || kPacked || kBiasTiles;
  static constexpr bool kPersist =
      backward_persists<Tr, kDropout, kBias, kPacked, kBiasTiles, kMods, kDet>();
  static_assert(!kPersist || Tr::kOutBytes <= Tr::kKVBytes, "dK and dV staged in K and V");
  static_assert(!kBiasTiles || Tr::kStages == 2,
                "the bias of step it lands in dS buffer it % 2, freed with Q/dO stage it % 2");
};

}  // namespace memeff::cuda::sm90
