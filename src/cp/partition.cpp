// The cut of a sequence over the ranks (contiguous or zig-zag) and the ring schedule: which
// block calls a rank makes at each step, with masked pairs skipped and fully visible ones run
// without a mask (see include/memeff/context_parallel.h and docs/context_parallel.md).
#include <algorithm>
#include <string>
#include <vector>

#include "memeff/context_parallel.h"
#include "memeff/error.h"

namespace memeff::cp {
namespace {

constexpr int kMaxRanks = 1 << 20;  // keeps chunk arithmetic (c · (length mod 2N)) in 64 bits

[[noreturn]] void fail(const std::string& arg, const std::string& what) {
  throw Error(ErrorCode::invalid_argument, "argument `" + arg + "`: " + what);
}

}  // namespace

const char* layout_name(Layout layout) {
  return layout == Layout::zigzag ? "zigzag" : "contiguous";
}

Layout default_layout(CausalMode causal) {
  return causal == CausalMode::none ? Layout::contiguous : Layout::zigzag;
}

Partition::Partition(std::int64_t length, int ranks, Layout layout, std::int64_t align)
    : length_(length), ranks_(ranks), layout_(layout) {
  if (length < 0) fail("length", "expected >= 0 rows, got " + std::to_string(length));
  if (ranks < 1 || ranks > kMaxRanks) {
    fail("ranks", "expected 1 to " + std::to_string(kMaxRanks) + ", got " + std::to_string(ranks));
  }
  if (align < 1) fail("align", "expected >= 1, got " + std::to_string(align));
  if (layout != Layout::contiguous && layout != Layout::zigzag) {
    fail("layout", "expected contiguous or zigzag");
  }
  const std::int64_t count = layout == Layout::zigzag ? 2 * std::int64_t{ranks} : ranks;
  // Boundary c = floor(c·length / count) rounded down to `align`, computed without forming
  // c·length (which could overflow): c·(length div count) + floor(c·(length mod count) / count).
  auto boundary = [&](std::int64_t c) -> std::int64_t {
    if (c == count) return length;
    const std::int64_t exact = c * (length / count) + c * (length % count) / count;
    return exact / align * align;
  };
  chunks_.assign(static_cast<std::size_t>(ranks), {});
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::int64_t> ids{r};
    if (layout == Layout::zigzag) ids.push_back(count - 1 - r);
    std::int64_t local = 0;
    for (const std::int64_t c : ids) {
      const std::int64_t a = boundary(c), b = boundary(c + 1);
      chunks_[r].push_back(Chunk{a, local, b - a});
      local += b - a;
    }
  }
}

const std::vector<Chunk>& Partition::chunks(int rank) const {
  if (rank < 0 || rank >= ranks_) {
    fail("rank",
         "expected a rank in [0, " + std::to_string(ranks_) + "), got " + std::to_string(rank));
  }
  return chunks_[static_cast<std::size_t>(rank)];
}

std::int64_t Partition::local_length(int rank) const {
  std::int64_t n = 0;
  for (const Chunk& c : chunks(rank)) n += c.length;
  return n;
}

std::int64_t Partition::max_local_length() const {
  std::int64_t n = 0;
  for (int r = 0; r < ranks_; ++r) n = std::max(n, local_length(r));
  return n;
}

std::int64_t Partition::max_chunk_length() const {
  std::int64_t n = 0;
  for (const auto& rank_chunks : chunks_)
    for (const Chunk& c : rank_chunks) n = std::max(n, c.length);
  return n;
}

std::vector<BlockPair> ring_schedule(const Partition& q, const Partition& k, int rank,
                                     CausalMode causal) {
  if (q.ranks() != k.ranks()) {
    fail("k_partition", "expected " + std::to_string(q.ranks()) + " ranks (as q_partition), got " +
                            std::to_string(k.ranks()));
  }
  if (causal == CausalMode::bottom_right) {
    if (q.length() != k.length()) {
      fail("causal",
           "bottom_right with context parallelism needs a square attention (Lq = Lk "
           "in total, where it is top_left); got Lq = " +
               std::to_string(q.length()) + ", Lk = " + std::to_string(k.length()));
    }
    causal = CausalMode::top_left;
  }
  const int n = q.ranks();
  std::vector<BlockPair> pairs;
  for (int step = 0; step < n; ++step) {
    const int kv_rank = (rank - step + n) % n;
    for (const Chunk& qc : q.chunks(rank)) {
      for (const Chunk& kc : k.chunks(kv_rank)) {
        if (qc.length == 0 || kc.length == 0) continue;  // nothing to compute or to merge
        BlockPair p{step, kv_rank, qc, kc, CausalMode::none};
        if (causal == CausalMode::top_left) {
          // Global row i sees global key j iff j <= i.
          const std::int64_t first_row = qc.global_start, last_row = first_row + qc.length - 1;
          const std::int64_t first_key = kc.global_start, last_key = first_key + kc.length - 1;
          if (first_key > last_row) continue;                         // every key masked
          if (last_key > first_row) p.causal = CausalMode::top_left;  // the diagonal crosses
        }
        pairs.push_back(p);
      }
    }
  }
  return pairs;
}

}  // namespace memeff::cp
