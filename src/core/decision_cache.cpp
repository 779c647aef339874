// The per-thread decision cache of the hot path (see decision_cache.h). Thread-local, so a hit
// takes no lock: one atomic load for the generation, a hash of the key's words and a comparison.
#include "core/decision_cache.h"

#include <atomic>
#include <bit>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace memeff::detail {
namespace {

// Bumped whenever remembered decisions may be stale.
std::atomic<std::uint64_t> g_generation{1};

// A thread that has seen this many signatures starts over (a bound for programs that sweep
// shapes; a training loop sees a handful).
constexpr std::size_t kMaxEntries = 1024;

// The hashes' published constants: 2^64 / golden ratio, splitmix64's two multipliers, and 64-bit
// FNV-1a's prime and offset basis.
constexpr std::uint64_t kGoldenRatio64 = 0x9e3779b97f4a7c15ull;
constexpr std::uint64_t kSplitMixM1 = 0xbf58476d1ce4e5b9ull;
constexpr std::uint64_t kSplitMixM2 = 0x94d049bb133111ebull;
constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;
constexpr std::uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ull;

std::uint64_t mix(std::uint64_t h, std::uint64_t word) {
  // splitmix64's finalizer over a running combination: cheap and well spread.
  h ^= word + kGoldenRatio64 + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= kSplitMixM1;
  h ^= h >> 27;
  h *= kSplitMixM2;
  return h ^ (h >> 31);
}

std::uint64_t hash_text(std::uint64_t h, std::string_view text) {
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * kFnvPrime;  // FNV-1a
  return mix(h, text.size());
}

std::uint64_t order_hash(const OrderRef& order) {
  std::uint64_t h = kFnvOffsetBasis;
  if (order.names) {
    for (const std::string& name : *order.names) h = hash_text(h, name);
  } else if (order.env) {
    h = hash_text(h, order.env);
  }
  return h;
}

struct KeyHash {
  std::size_t operator()(const DecisionKey& key) const {
    std::uint64_t h = 0;
    for (const std::uint64_t w : key.words) h = mix(h, w);
    return static_cast<std::size_t>(h);
  }
};

struct Entry {
  CachedDecision decision;
  std::vector<std::string> names;  // the order's names, or the raw MEMEFF_BACKENDS text
};

struct ThreadCache {
  std::uint64_t generation = 0;
  std::unordered_map<DecisionKey, Entry, KeyHash> entries;
};

ThreadCache& thread_cache() {
  thread_local ThreadCache cache;
  const std::uint64_t now = g_generation.load(std::memory_order_acquire);
  if (cache.generation != now) {
    cache.entries.clear();
    cache.generation = now;
  }
  return cache;
}

bool same_order(const Entry& entry, const OrderRef& order) {
  if (order.names) return entry.names == *order.names;
  if (order.env) return entry.names.size() == 1 && entry.names[0] == order.env;
  return entry.names.empty();
}

}  // namespace

DecisionKey decision_key(const Problem& p, Pass pass, const OrderRef& order, bool autotune,
                         bool log) {
  DecisionKey key;
  auto& w = key.words;
  w[0] = static_cast<std::uint64_t>(p.B);
  w[1] = static_cast<std::uint64_t>(p.Hq);
  w[2] = static_cast<std::uint64_t>(p.Hkv);
  w[3] = static_cast<std::uint64_t>(p.Lq);
  w[4] = static_cast<std::uint64_t>(p.Lk);
  w[5] = static_cast<std::uint64_t>(p.D);
  w[6] = static_cast<std::uint64_t>(p.Dv);
  const std::uint64_t flags = (p.has_bias ? 1u : 0u) | (p.bias_bcast_b ? 2u : 0u) |
                              (p.bias_bcast_h ? 4u : 0u) | (p.bias_bcast_q ? 8u : 0u) |
                              (p.vector_aligned ? 16u : 0u) | (autotune ? 32u : 0u) |
                              (log ? 64u : 0u) | (p.packed ? 128u : 0u) | (p.kv_block ? 256u : 0u) |
                              (p.has_alibi ? 512u : 0u) | (p.alibi_per_batch ? 1024u : 0u);
  w[7] = static_cast<std::uint64_t>(p.dtype) | static_cast<std::uint64_t>(p.device.type) << 8 |
         static_cast<std::uint64_t>(p.bias_dtype) << 16 |
         static_cast<std::uint64_t>(p.causal) << 24 | static_cast<std::uint64_t>(pass) << 32 |
         static_cast<std::uint64_t>(order.source) << 40 | flags << 48;
  w[8] = static_cast<std::uint64_t>(static_cast<std::int64_t>(p.device.index));
  w[9] = std::bit_cast<std::uint64_t>(p.scale);
  w[10] = std::bit_cast<std::uint64_t>(p.dropout_p);
  w[11] = p.dropout.threshold;
  w[12] = order_hash(order);
  w[13] = static_cast<std::uint64_t>(p.total_q);  // packed calls (0 otherwise)
  w[14] = static_cast<std::uint64_t>(p.total_k);
  // The starts themselves, not a class of them: a backend may refuse some (the fused CUDA
  // kernels refuse dropout at a k_start off the 64-key blocks), and a ring step meets only a
  // handful of distinct values.
  w[15] = static_cast<std::uint64_t>(p.q_start);
  w[16] = static_cast<std::uint64_t>(p.k_start);
  // Window, ALiBi and softcap: backends without them refuse the call (score_modifier_reasons).
  w[17] = static_cast<std::uint64_t>(p.window_left);
  w[18] = static_cast<std::uint64_t>(p.window_right);
  w[19] = std::bit_cast<std::uint64_t>(p.softcap);
  return key;
}

const CachedDecision* cached_decision(const DecisionKey& key, const OrderRef& order) {
  ThreadCache& cache = thread_cache();
  const auto it = cache.entries.find(key);
  if (it == cache.entries.end() || !same_order(it->second, order)) return nullptr;
  return &it->second.decision;
}

std::uint64_t decision_generation() { return g_generation.load(std::memory_order_acquire); }

void remember_decision(const DecisionKey& key, const OrderRef& order, CachedDecision decision,
                       std::uint64_t generation) {
  ThreadCache& cache = thread_cache();
  if (cache.generation != generation) return;  // decided on a registry that has changed since
  if (cache.entries.size() >= kMaxEntries) cache.entries.clear();
  Entry entry{std::move(decision), {}};
  if (order.names) {
    entry.names = *order.names;
  } else if (order.env) {
    entry.names.emplace_back(order.env);
  }
  cache.entries.insert_or_assign(key, std::move(entry));
}

void invalidate_decisions() { g_generation.fetch_add(1, std::memory_order_acq_rel); }

}  // namespace memeff::detail
