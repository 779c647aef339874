// The cut and the ring schedule of context parallelism (memeff::cp::Partition, ring_schedule;
// src/cp/partition.cpp) as torch ops, for memeff.torch.context_parallel_attention: the PyTorch
// ring runs the C++ layer's own cut and schedule (which pairs to skip, which run unmasked and
// which cross the diagonal), so both paths shard a sequence and visit its blocks identically.
// Pure functions of integers: no tensors, no dispatch key (a catch-all kernel each).
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "bindings.h"
#include "memeff/context_parallel.h"

namespace memeff_torch {
namespace {

// memeff's names of the layouts (memeff::cp::layout_name), the only spelling.
memeff::cp::Layout parse_layout(c10::string_view layout) {
  using memeff::cp::Layout;
  for (const Layout l : {Layout::zigzag, Layout::contiguous}) {
    if (layout == memeff::cp::layout_name(l)) return l;
  }
  TORCH_CHECK_VALUE(false, "argument `layout`: expected \"",
                    memeff::cp::layout_name(Layout::zigzag), "\" or \"",
                    memeff::cp::layout_name(Layout::contiguous), "\", got \"", layout, "\"");
}

int ranks_of(std::int64_t ranks) {
  // Partition checks the range itself; this only keeps the narrowing to int honest.
  TORCH_CHECK_VALUE(ranks >= 1 && ranks <= (std::int64_t{1} << 20),
                    "argument `ranks`: expected 1 to 2^20, got ", ranks);
  return static_cast<int>(ranks);
}

void append(std::vector<std::int64_t>& out, const memeff::cp::Chunk& c) {
  out.push_back(c.global_start);
  out.push_back(c.local_start);
  out.push_back(c.length);
}

// Every rank's chunks, rank by rank, each as (global_start, local_start, length): one chunk per
// rank for "contiguous", two for "zigzag".
std::vector<std::int64_t> cp_partition(std::int64_t length, std::int64_t ranks,
                                       c10::string_view layout, std::int64_t align) {
  return translate_errors([&] {
    const memeff::cp::Partition part(length, ranks_of(ranks), parse_layout(layout), align);
    std::vector<std::int64_t> out;
    for (int r = 0; r < part.ranks(); ++r) {
      for (const memeff::cp::Chunk& c : part.chunks(r)) append(out, c);
    }
    return out;
  });
}

// The block calls of `rank`, in ring order, nine integers each: step, kv_rank, the query chunk
// and the key chunk (global_start, local_start, length) and 1 where the causal diagonal crosses
// the pair (a top_left call) or 0 (every key visible: no mask). Fully masked pairs are left out.
std::vector<std::int64_t> cp_schedule(std::int64_t q_length, std::int64_t k_length,
                                      std::int64_t ranks, std::int64_t rank,
                                      c10::string_view layout, std::int64_t align,
                                      c10::string_view causal) {
  return translate_errors([&] {
    const int n = ranks_of(ranks);
    const memeff::cp::Layout l = parse_layout(layout);
    const memeff::cp::Partition q(q_length, n, l, align), k(k_length, n, l, align);
    TORCH_CHECK_VALUE(rank >= 0 && rank < n, "argument `rank`: expected [0, ", n, "), got ", rank);
    std::vector<std::int64_t> out;
    for (const memeff::cp::BlockPair& p :
         memeff::cp::ring_schedule(q, k, static_cast<int>(rank), parse_causal(causal))) {
      out.push_back(p.step);
      out.push_back(p.kv_rank);
      append(out, p.q_chunk);
      append(out, p.k_chunk);
      out.push_back(p.causal == memeff::CausalMode::none ? 0 : 1);
    }
    return out;
  });
}

}  // namespace
}  // namespace memeff_torch

TORCH_LIBRARY_FRAGMENT(memeff, m) {
  m.def("cp_partition(int length, int ranks, str layout, int align=1) -> int[]",
        &memeff_torch::cp_partition);
  m.def(
      "cp_schedule(int q_length, int k_length, int ranks, int rank, str layout, int align, "
      "str causal) -> int[]",
      &memeff_torch::cp_schedule);
}
