// The dispatcher's memory for the hot path: per thread, the backend (and its workspace size) last
// chosen for a call signature, so that a repeated call skips the walk over every backend's
// reasons and the texts that go with it. The signature is everything a decision depends on:
// the Problem (sizes, dtypes, device, flags, bias pattern, alignment class, packed sequences and
// their packed row counts, which a packed pass's workspace may scale with, global coordinates,
// window, ALiBi and softcap),
// the pass, the backend order and where it came from, and whether autotuning and the dispatch
// log are on. Entries are dropped when the registry or the autotune memory changes (a
// process-wide generation counter).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memeff/attention.h"
#include "memeff/backend.h"

namespace memeff::detail {

enum class OrderSource : std::uint8_t { options, scoped_guard, environment, device_default };

// Which order a call walks, without building it: the names of Options::backends or of the
// innermost guard, or the raw MEMEFF_BACKENDS text; nothing for the device's default order.
// The pointers are valid for the duration of the call.
struct OrderRef {
  OrderSource source = OrderSource::device_default;
  const std::vector<std::string>* names = nullptr;  // options, scoped_guard
  const char* env = nullptr;                        // environment
};

struct DecisionKey {
  std::array<std::uint64_t, 20> words{};
  friend bool operator==(const DecisionKey&, const DecisionKey&) = default;
};

DecisionKey decision_key(const Problem& problem, Pass pass, const OrderRef& order, bool autotune,
                         bool log);

struct CachedDecision {
  std::shared_ptr<Backend> backend;
  std::size_t workspace_bytes = 0;
};

// The decision remembered for `key` on this thread, if the order it was made for is `order`
// (names compared, so a hash collision of two orders never mixes them up); null otherwise.
const CachedDecision* cached_decision(const DecisionKey& key, const OrderRef& order);

// The current generation: read it before deciding and pass it to remember_decision, which drops
// a decision made while the registry or the autotune memory changed.
std::uint64_t decision_generation();
void remember_decision(const DecisionKey& key, const OrderRef& order, CachedDecision decision,
                       std::uint64_t generation);

// Forgets every thread's decisions (lazily: each thread clears its cache at its next lookup).
// Called when a backend is registered or removed and when the autotune memory changes.
void invalidate_decisions();

}  // namespace memeff::detail
