// Which code one sm90 forward instantiation has: attention_forward_kernel's template arguments
// (fwd_kernel.cuh) and what follows from them, in one type the kernel's pieces take (the
// scheduler, the producer and the consumers).
#pragma once

#include "cuda/kernels/sm90/fwd_traits.cuh"

namespace memeff::cuda::sm90 {

// T: the 16-bit element type; Tr: the tile shape (FwdTraits); kDropout, kBiasRead, kPacked and
// kMods as attention_forward_kernel's.
template <class T_, class Tr_, bool kDropout_, BiasRead kBiasRead_, bool kPacked_, bool kMods_>
struct ForwardVariant {
  using T = T_;
  using Tr = Tr_;
  static constexpr bool kDropout = kDropout_;
  static constexpr BiasRead kBiasRead = kBiasRead_;
  static constexpr bool kPacked = kPacked_;
  static constexpr bool kMods = kMods_;
  static constexpr bool kBias = kBiasRead != BiasRead::none;
  static constexpr bool kBiasTiles = kBiasRead == BiasRead::tiles;
  static_assert(!(kPacked && kBias), "packed calls take no bias");
  static_assert(!kMods || (!kPacked && (kBiasRead == BiasRead::none ||
                                        (kDropout && kBiasRead == BiasRead::global))),
                "the score-modifier kernels take packing (and, with a bias, dropout) at run time");
  // The modifiers' kernel with a bias: dropout and the bias as the params say.
  static constexpr bool kRuntimeDropout = kMods && kBias;
  // Instantiations with the window's code: the modifiers' kernels, the packed ones and those of a
  // key-padding bias and bias tiles. The dense ones without a bias have none (on the H100 their
  // window test cost calls without a window 1-4%; fwd_run.cuh sends windows to the modifiers').
  static constexpr bool kWindowCode =
      kMods || kPacked || kBiasRead == BiasRead::keys || kBiasRead == BiasRead::tiles;
  static constexpr int kQStages = Tr::kQStages;
};

}  // namespace memeff::cuda::sm90
