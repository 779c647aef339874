// Context-parallel ring attention on the CPU (include/memeff/context_parallel.h): the partition
// and the ring schedule; for N = 1..4 ranks, causal or not, with dropout (and GQA, Dv != D, a
// bias), the sharded run over LocalRing equals the single-device run; the dropout mask of the
// sharded run is the single-device mask, read off its outputs in both orientations; argument
// errors; a failing rank releases the others.
//
// Equality: the ring changes the arithmetic (partial outputs merged through lse, gradients summed
// per block), so results are compared within tolerances, not bit for bit, except where nothing
// changes (one rank holding the whole sequence: the block call is the whole call and the merge a
// copy). cpu backend, fp32: the tests' forward/backward budgets (tests/common/tolerance.h), the
// same that bound the cpu backend against the reference. Reference backend, fp64: the only
// rounding left is lse's fp32 storage (the API's lse is always fp32), which the merge's weights
// and the backward's P = exp(s - lse) see: a bound of 8·max|lse|·2^-24, relative.
#include "memeff/context_parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/attention_case.h"
#include "common/call_helpers.h"
#include "common/tolerance.h"
#include "memeff/attention.h"
#include "memeff/dropout.h"
#include "memeff/error.h"

namespace memeff {
namespace {

using cp::Layout;
using cp::Partition;
using test::Case;
using test::Config;
using test::contains;
using test::expect_close;
using test::HostTensor;

TEST(Partition, ZigzagGivesRankRChunksRAnd2NMinus1MinusR) {
  const Partition p(100, 3, Layout::zigzag);
  ASSERT_EQ(p.chunks(0).size(), 2u);
  // Boundaries floor(c·100/6): 0 16 33 50 66 83 100.
  EXPECT_EQ(p.chunks(0)[0].global_start, 0);
  EXPECT_EQ(p.chunks(0)[0].length, 16);
  EXPECT_EQ(p.chunks(0)[1].global_start, 83);
  EXPECT_EQ(p.chunks(0)[1].local_start, 16);
  EXPECT_EQ(p.chunks(0)[1].length, 17);
  EXPECT_EQ(p.chunks(2)[0].global_start, 33);
  EXPECT_EQ(p.chunks(2)[1].global_start, 50);
  EXPECT_EQ(p.local_length(1), 17 + 17);
  const Partition c(100, 3, Layout::contiguous);
  ASSERT_EQ(c.chunks(1).size(), 1u);
  EXPECT_EQ(c.chunks(1)[0].global_start, 33);
  EXPECT_EQ(c.chunks(1)[0].length, 33);
  EXPECT_EQ(c.max_local_length(), 34);
  // Every row belongs to exactly one rank, for any length, rank count, layout and alignment.
  for (std::int64_t length : {0, 1, 7, 64, 130, 1000}) {
    for (int ranks = 1; ranks <= 5; ++ranks) {
      for (Layout layout : {Layout::contiguous, Layout::zigzag}) {
        for (std::int64_t align : {1, 64}) {
          const Partition part(length, ranks, layout, align);
          std::vector<int> owner(static_cast<std::size_t>(length), 0);
          for (int r = 0; r < ranks; ++r) {
            std::int64_t local = 0;
            for (const cp::Chunk& ch : part.chunks(r)) {
              EXPECT_EQ(ch.local_start, local);
              local += ch.length;
              if (ch.length > 0 && ch.global_start + ch.length != length) {
                EXPECT_EQ(ch.global_start % align, 0);
              }
              for (std::int64_t i = 0; i < ch.length; ++i) ++owner[ch.global_start + i];
            }
          }
          for (std::int64_t i = 0; i < length; ++i) {
            ASSERT_EQ(owner[i], 1) << "row " << i << " of " << length << ", " << ranks << " ranks, "
                                   << cp::layout_name(layout) << ", align " << align;
          }
        }
      }
    }
  }
}

TEST(Partition, BadArgumentsAreNamed) {
  using test::error_message;
  EXPECT_TRUE(
      contains(error_message([] { Partition(-1, 2, Layout::zigzag); }), "argument `length`"));
  EXPECT_TRUE(
      contains(error_message([] { Partition(10, 0, Layout::zigzag); }), "argument `ranks`"));
  EXPECT_TRUE(
      contains(error_message([] { Partition(10, 2, Layout::zigzag, 0); }), "argument `align`"));
  EXPECT_TRUE(contains(error_message([] { Partition(10, 2, Layout::zigzag).chunks(2); }),
                       "argument `rank`"));
}

// Over all ranks and steps, every visible (row, key) pair is computed exactly once; skipped
// pairs are fully masked; pairs run without a mask are fully visible. With zig-zag every rank
// has the same causal work at every step (L a multiple of 2N).
TEST(RingSchedule, CoversEveryVisiblePairOnceAndBalancesCausalWork) {
  for (CausalMode causal : {CausalMode::none, CausalMode::top_left}) {
    for (int n = 1; n <= 4; ++n) {
      for (std::int64_t L : {std::int64_t{8} * n, std::int64_t{37}}) {
        const Partition p(L, n, cp::default_layout(causal));
        std::vector<int> seen(static_cast<std::size_t>(L * L), 0);
        std::set<std::int64_t> work_per_rank;
        for (int r = 0; r < n; ++r) {
          std::int64_t work = 0;
          int last_step = 0;
          for (const cp::BlockPair& bp : cp::ring_schedule(p, p, r, causal)) {
            EXPECT_GE(bp.step, last_step);  // ring order
            last_step = bp.step;
            EXPECT_EQ(bp.kv_rank, (r - bp.step + n) % n);
            for (std::int64_t i = 0; i < bp.q_chunk.length; ++i) {
              for (std::int64_t j = 0; j < bp.k_chunk.length; ++j) {
                const std::int64_t gi = bp.q_chunk.global_start + i,
                                   gj = bp.k_chunk.global_start + j;
                const bool visible = causal == CausalMode::none || gj <= gi;
                if (bp.causal == CausalMode::none) {
                  EXPECT_TRUE(visible) << "unmasked pair with a masked element";
                }
                if (visible) {
                  ++seen[gi * L + gj];
                  ++work;
                }
              }
            }
          }
          work_per_rank.insert(work);
        }
        for (std::int64_t i = 0; i < L; ++i) {
          for (std::int64_t j = 0; j < L; ++j) {
            const bool visible = causal == CausalMode::none || j <= i;
            ASSERT_EQ(seen[i * L + j], visible ? 1 : 0)
                << "row " << i << " key " << j << ", " << n << " ranks";
          }
        }
        if (L % (2 * n) == 0) {
          EXPECT_EQ(work_per_rank.size(), 1u) << n << " ranks, L " << L;
        }
      }
    }
  }
}

// Rows of dimension 2 that `rank` holds (a tensor with 1 row where the sequence has more is
// broadcast: every rank's as it is).
HostTensor shard(const HostTensor& whole, const Partition& part, int rank) {
  const TensorView& w = whole.view;
  if (w.shape[2] == 1 && part.length() != 1) return whole;
  std::vector<std::int64_t> shape(w.shape.begin(), w.shape.begin() + w.rank);
  shape[2] = part.local_length(rank);
  HostTensor local(w.dtype, shape);
  const std::int64_t outer = shape[0] * shape[1], inner = w.rank == 4 ? shape[3] : 1;
  for (std::int64_t o = 0; o < outer; ++o)
    for (const cp::Chunk& c : part.chunks(rank))
      for (std::int64_t i = 0; i < c.length; ++i)
        for (std::int64_t e = 0; e < inner; ++e)
          local.set(((o * shape[2]) + c.local_start + i) * inner + e,
                    whole.get(((o * w.shape[2]) + c.global_start + i) * inner + e));
  return local;
}

// One rank's tensors.
struct RankTensors {
  HostTensor q, k, v, dout, out, lse, dq, dk, dv;
  std::optional<HostTensor> bias, dbias;
};

struct RingResult {
  std::vector<RankTensors> ranks;
  Partition qp, kp;
  std::vector<CallInfo> infos;
};

// The whole problem of `whole`, sharded over `n` ranks and run through the ring on `backend`.
RingResult run_ring(const Case& whole, int n, Layout layout, const std::string& backend,
                    bool with_workspace = false) {
  const Config& cfg = whole.cfg;
  RingResult res;
  res.qp = Partition(cfg.Lq, n, layout);
  res.kp = Partition(cfg.Lk, n, layout);
  for (int r = 0; r < n; ++r) {
    RankTensors t;
    t.q = shard(whole.q, res.qp, r);
    t.k = shard(whole.k, res.kp, r);
    t.v = shard(whole.v, res.kp, r);
    t.dout = shard(whole.dout, res.qp, r);
    t.out = shard(whole.out, res.qp, r);  // poisoned, as whole's outputs are
    t.lse = shard(whole.lse, res.qp, r);
    t.dq = t.q;
    t.dk = t.k;
    t.dv = t.v;
    for (HostTensor* g : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv}) test::poison(*g);
    if (whole.bias) {
      t.bias = shard(*whole.bias, res.qp, r);
      t.dbias = *t.bias;
      test::poison(*t.dbias);
    }
    res.ranks.push_back(std::move(t));
  }
  res.infos.resize(static_cast<std::size_t>(2 * n));
  cp::LocalRing ring(n);
  ring.run([&](cp::Transport& transport) {
    const int r = transport.rank();
    RankTensors& t = res.ranks[r];
    cp::ContextParallelArgs args;
    args.local = test::attention_args(t.q, t.k, t.v);
    if (t.bias) args.local.bias = t.bias->view;
    args.local.causal = cfg.causal;
    args.local.dropout_p = cfg.dropout;
    args.local.rng = {cfg.seed, cfg.offset};
    args.q_partition = res.qp;
    args.k_partition = res.kp;
    const Options o = test::only({backend});
    std::vector<std::uint8_t> ws_f, ws_b;
    Options fo = o, bo = o;
    if (with_workspace) {
      ws_f.resize(cp::ring_workspace_size(args, Pass::forward, r, o));
      ws_b.resize(cp::ring_workspace_size(args, Pass::backward, r, o));
      fo.workspace = ws_f.data();
      fo.workspace_bytes = ws_f.size();
      bo.workspace = ws_b.data();
      bo.workspace_bytes = ws_b.size();
    }
    res.infos[2 * r] = cp::ring_forward(args, t.out.view, t.lse.view, transport, fo);
    BackwardTensors g{t.dout.view, t.out.view, t.lse.view,  t.dq.view,
                      t.dk.view,   t.dv.view,  std::nullopt};
    if (t.dbias) g.dbias = t.dbias->view;
    res.infos[2 * r + 1] = cp::ring_backward(args, g, transport, bo);
  });
  return res;
}

struct Tolerances {
  test::Tolerance fwd, bwd;
};

// Every rank's rows of out, lse, dq and its dk, dv (and dbias) against the whole run's.
void expect_ring_equals_whole(const RingResult& res, const Case& whole, const Tolerances& tol,
                              const std::string& what) {
  const int n = res.qp.ranks();
  std::optional<HostTensor> dbias_sum;
  for (int r = 0; r < n; ++r) {
    const RankTensors& t = res.ranks[r];
    const std::string at = what + ", rank " + std::to_string(r) + " of " + std::to_string(n);
    expect_close(t.out, shard(whole.out, res.qp, r), tol.fwd, at + ": out");
    expect_close(t.lse, shard(whole.lse, res.qp, r), tol.fwd, at + ": lse");
    expect_close(t.dq, shard(whole.dq, res.qp, r), tol.bwd, at + ": dq");
    expect_close(t.dk, shard(whole.dk, res.kp, r), tol.bwd, at + ": dk");
    expect_close(t.dv, shard(whole.dv, res.kp, r), tol.bwd, at + ": dv");
    if (!t.dbias) continue;
    if (whole.dbias->view.shape[2] == 1 && whole.cfg.Lq != 1) {
      // Broadcast over the query rows: each rank has its rows' part; the sum is the whole's.
      if (!dbias_sum) {
        dbias_sum = *t.dbias;
        for (std::int64_t i = 0; i < dbias_sum->numel(); ++i) dbias_sum->set(i, 0.0);
      }
      for (std::int64_t i = 0; i < dbias_sum->numel(); ++i)
        dbias_sum->set(i, dbias_sum->get(i) + t.dbias->get(i));
    } else {
      expect_close(*t.dbias, shard(*whole.dbias, res.qp, r), tol.bwd, at + ": dbias");
    }
  }
  if (dbias_sum)
    expect_close(*dbias_sum, *whole.dbias, tol.bwd, what + ": dbias summed over ranks");
}

Tolerances cpu_tolerances(const Config& cfg) {
  const std::int64_t reduction = std::max(cfg.D, cfg.Lk);
  return {test::forward_tolerance(cfg.dtype, reduction),
          test::backward_tolerance(cfg.dtype, reduction)};
}

// The grid CI runs: N = 1..4, causal none and top_left, dropout, uneven chunk lengths (L not a
// multiple of 2N, chunk starts off the 64-key dropout blocks), on the cpu backend.
TEST(RingAttention, ShardedEqualsSingleDeviceOnTheCpuBackend) {
  for (CausalMode causal : {CausalMode::none, CausalMode::top_left}) {
    const Config cfg{.Lq = 150, .Lk = 150, .D = 24, .causal = causal, .dropout = 0.3};
    Case whole(cfg, 11);
    whole.run_forward("cpu");
    whole.run_backward("cpu");
    for (int n = 1; n <= 4; ++n) {
      const RingResult res = run_ring(whole, n, cp::default_layout(causal), "cpu");
      EXPECT_EQ(res.infos[0].backend, "cpu");
      EXPECT_DOUBLE_EQ(res.infos[0].p_effective, dropout_threshold(0.3).p_effective);
      expect_ring_equals_whole(res, whole, cpu_tolerances(cfg),
                               cfg.describe() + ", " + std::to_string(n) + " ranks");
    }
  }
}

// GQA with Dv != D, Lq != Lk (non-causal), a full bias and one broadcast over the query rows
// (whose dbias each rank holds a part of), the zig-zag layout without a causal mask, and the
// caller's workspace (ring_workspace_size).
TEST(RingAttention, GqaBiasAndLayoutsOnTheCpuBackend) {
  struct Variant {
    std::int64_t Lq, Lk;
    CausalMode causal;
    std::string bias;
    Layout layout;
    int n;
  };
  const Variant variants[] = {
      {97, 160, CausalMode::none, "bhqk", Layout::contiguous, 3},
      {97, 160, CausalMode::none, "b11k", Layout::zigzag, 2},
      {130, 130, CausalMode::top_left, "1hqk", Layout::zigzag, 4},
      {130, 130, CausalMode::top_left, "11qk", Layout::contiguous, 3},
  };
  for (const Variant& var : variants) {
    Config cfg{.Hq = 4, .Hkv = 2, .Lq = var.Lq, .Lk = var.Lk, .D = 24, .Dv = 40, .dropout = 0.2};
    cfg.causal = var.causal;
    cfg.bias = var.bias;
    Case whole(cfg, 12);
    whole.run_forward("cpu");
    whole.run_backward("cpu");
    const RingResult res = run_ring(whole, var.n, var.layout, "cpu", /*with_workspace=*/true);
    const Tolerances tol = cpu_tolerances(cfg);
    expect_ring_equals_whole(res, whole, tol,
                             cfg.describe() + ", " + cp::layout_name(var.layout) + ", " +
                                 std::to_string(var.n) + " ranks");
  }
}

// A NaN in one query row reaches that row's out, lse and dq through the ring as in the
// single-device run (docs/api.md, non-finite inputs): the merge of partial results through lse
// keeps a NaN lse instead of dropping it, and no other row is touched.
TEST(RingAttention, ANaNRowStaysNaNThroughTheMerge) {
  const Config cfg{.Lq = 150, .Lk = 150, .D = 24, .causal = CausalMode::top_left};
  Case whole(cfg, 11);
  const std::int64_t row = 120;
  whole.q.set(((0 * cfg.Hq + 1) * cfg.Lq + row) * cfg.D + 3, std::nan(""));
  whole.run_forward("cpu");
  whole.run_backward("cpu");
  for (int n = 2; n <= 3; ++n) {
    const RingResult res = run_ring(whole, n, cp::default_layout(cfg.causal), "cpu");
    std::int64_t nan_rows = 0;
    for (int r = 0; r < n; ++r) {
      const RankTensors& t = res.ranks[r];
      const HostTensor lse = shard(whole.lse, res.qp, r), out = shard(whole.out, res.qp, r),
                       dq = shard(whole.dq, res.qp, r);
      for (std::int64_t x = 0; x < lse.numel(); ++x) {
        ASSERT_EQ(std::isnan(t.lse.get(x)), std::isnan(lse.get(x))) << "rank " << r << " lse " << x;
        nan_rows += std::isnan(t.lse.get(x)) ? 1 : 0;
        if (!std::isnan(lse.get(x))) {
          EXPECT_NEAR(t.lse.get(x), lse.get(x), 1e-4) << x;
        }
      }
      for (std::int64_t x = 0; x < out.numel(); ++x) {
        ASSERT_EQ(std::isnan(t.out.get(x)), std::isnan(out.get(x))) << "rank " << r << " out " << x;
        ASSERT_EQ(std::isnan(t.dq.get(x)), std::isnan(dq.get(x))) << "rank " << r << " dq " << x;
      }
    }
    EXPECT_EQ(nan_rows, 1) << n << " ranks";
  }
}

// The reference in fp64: the ring and the single-device run agree to the rounding of lse to fp32.
TEST(RingAttention, ShardedEqualsSingleDeviceOnTheReferenceInFp64) {
  for (CausalMode causal : {CausalMode::none, CausalMode::top_left}) {
    Config cfg{.Hq = 4, .Hkv = 2, .Lq = 45, .Lk = 45, .D = 16, .Dv = 8, .bias = "1hqk"};
    cfg.causal = causal;
    cfg.dropout = 0.25;
    cfg.dtype = DType::f64;
    Case whole(cfg, 13);
    whole.run_forward("reference");
    whole.run_backward("reference");
    double max_lse = 0.0;
    for (std::int64_t i = 0; i < whole.lse.numel(); ++i)
      max_lse = std::max(max_lse, std::fabs(whole.lse.get(i)));
    const double rtol = 8.0 * max_lse * 0x1p-24;
    for (int n : {2, 3}) {
      const RingResult res = run_ring(whole, n, cp::default_layout(causal), "reference");
      expect_ring_equals_whole(res, whole, {{rtol * 1e-3, rtol}, {rtol * 1e-3, 2 * rtol}},
                               cfg.describe() + ", " + std::to_string(n) + " ranks");
    }
  }
}

// One rank holding the whole sequence in one chunk: the block call is the whole call, the merge
// a copy and each accumulator receives one block: bit for bit (the reference is deterministic).
TEST(RingAttention, OneRankWithOneChunkIsTheSingleDeviceRunBitForBit) {
  Case whole({.Lq = 70, .Lk = 70, .causal = CausalMode::top_left, .dropout = 0.3}, 14);
  whole.run_forward("reference");
  whole.run_backward("reference");
  const RingResult res = run_ring(whole, 1, Layout::contiguous, "reference");
  const RankTensors& t = res.ranks[0];
  for (const auto& [name, got, want] :
       {std::tuple{"out", &t.out, &whole.out}, std::tuple{"lse", &t.lse, &whole.lse},
        std::tuple{"dq", &t.dq, &whole.dq}, std::tuple{"dk", &t.dk, &whole.dk},
        std::tuple{"dv", &t.dv, &whole.dv}}) {
    const test::Diff d = test::compare(*got, *want);
    EXPECT_FALSE(d.nan) << name;
    EXPECT_EQ(d.max_abs, 0.0) << name << " at " << d.where(*got);
  }
}

// How many elements a mask check saw, and how many of them the mask keeps.
struct MaskCount {
  std::int64_t checked = 0, kept = 0;
};

// One rank's tensor `t` [1, H, local rows, columns] read as a mask, against dropout_keep at the
// global (i, j) of every element the causal mask shows: its rows are `part`'s rows of `rank`,
// queries (forward: out[i, j]) or keys (backward: dv[j, i]); an element is nonzero exactly where
// (i, j) is kept.
void expect_mask(const HostTensor& t, const Partition& part, int rank, bool rows_are_queries,
                 const Config& cfg, const std::string& what, MaskCount& count) {
  const std::int64_t local_rows = t.view.shape[2], columns = t.view.shape[3];
  for (std::int64_t h = 0; h < cfg.Hq; ++h) {
    for (const cp::Chunk& c : part.chunks(rank)) {
      for (std::int64_t l = 0; l < c.length; ++l) {
        for (std::int64_t other = 0; other < columns; ++other) {
          const std::int64_t i = rows_are_queries ? c.global_start + l : other;
          const std::int64_t j = rows_are_queries ? other : c.global_start + l;
          if (cfg.causal == CausalMode::top_left && j > i) continue;
          const bool want = dropout_keep(cfg.seed, cfg.offset, cfg.dropout, cfg.Hq, 0, h, i, j);
          const bool got = t.get((h * local_rows + c.local_start + l) * columns + other) != 0.0;
          ASSERT_EQ(got, want) << what << (rows_are_queries ? ", forward" : ", backward")
                               << ", head " << h << " row " << i << " key " << j;
          ++count.checked;
          count.kept += want;
        }
      }
    }
  }
}

class RingAttentionOnHost : public ::testing::TestWithParam<std::string> {};

// The mask of the sharded run, read off its outputs, is dropout_mask's single-device mask. With
// q = 0 every visible score is equal, so P is uniform over the visible keys; with V the identity
// (Dv = Lk) out[i, j] = P_ij·Z_ij: nonzero exactly where (i, j) is kept (forward orientation);
// with dO the identity (Dv = Lq) dv[j, i] = P_ij·Z_ij (the backward's Sᵀ orientation).
// N = 1..4 ranks, causal (zig-zag) and not (contiguous), on each host backend.
TEST_P(RingAttentionOnHost, TheShardedMaskIsTheSingleDeviceMask) {
  const std::string backend = GetParam();
  for (CausalMode causal : {CausalMode::none, CausalMode::top_left}) {
    Config cfg{.Lq = 96, .Lk = 96, .D = 8, .Dv = 96, .causal = causal, .dropout = 0.5};
    cfg.seed = 1234;
    cfg.offset = 77;
    Case whole(cfg, 15);
    test::fill_value(whole.q, 0.0);
    test::fill_identity(whole.v);
    test::fill_identity(whole.dout);
    for (int n = 1; n <= 4; ++n) {
      const RingResult res = run_ring(whole, n, cp::default_layout(causal), backend);
      const std::string what = backend + ", " + std::to_string(n) + " ranks";
      MaskCount forward, backward;  // the statistics below count the forward's elements
      for (int r = 0; r < n; ++r) {
        ASSERT_NO_FATAL_FAILURE(expect_mask(res.ranks[r].out, res.qp, r, true, cfg, what, forward));
        ASSERT_NO_FATAL_FAILURE(
            expect_mask(res.ranks[r].dv, res.kp, r, false, cfg, what, backward));  // Hkv = Hq
      }
      EXPECT_GT(forward.checked, 5000);
      // p = 0.5: about half kept, so both outcomes were seen.
      EXPECT_GT(forward.kept, forward.checked / 3);
      EXPECT_LT(forward.kept, 2 * forward.checked / 3);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HostBackends, RingAttentionOnHost, ::testing::Values("cpu", "reference"),
                         test::backend_name);

// A ring whose ranks disagree with their arguments says which argument is wrong.
TEST(RingAttention, ArgumentErrorsNameTheArgument) {
  Case whole({.Lq = 40, .Lk = 40}, 16);
  const Partition p(40, 2, Layout::zigzag);
  auto run_rank0 = [&](auto&& edit) {
    std::string message;
    cp::LocalRing ring(1);
    ring.run([&](cp::Transport& transport) {
      HostTensor q = shard(whole.q, p, 0), k = shard(whole.k, p, 0), v = shard(whole.v, p, 0);
      HostTensor out = shard(whole.out, p, 0), lse = shard(whole.lse, p, 0);
      cp::ContextParallelArgs args;
      args.local = test::attention_args(q, k, v);
      args.local.causal = CausalMode::top_left;
      args.q_partition = p;
      args.k_partition = p;
      edit(args);
      try {
        cp::ring_forward(args, out.view, lse.view, transport);
      } catch (const Error& e) {
        message = e.what();
      }
    });
    return message;
  };
  // The partitions are for 2 ranks, the ring has 1.
  EXPECT_TRUE(contains(run_rank0([](cp::ContextParallelArgs&) {}),
                       "argument `q_partition`: expected 1 ranks"));
  const Partition one(40, 1, Layout::zigzag);
  auto with_one = [&](auto&& more) {
    return [&, more](cp::ContextParallelArgs& a) {
      a.q_partition = one;
      a.k_partition = one;
      more(a);
    };
  };
  EXPECT_TRUE(contains(run_rank0(with_one([](cp::ContextParallelArgs&) {})),
                       "argument `local.q`: expected 40 query rows"));
  EXPECT_TRUE(contains(run_rank0([&](cp::ContextParallelArgs& a) {
                         a.q_partition = one;
                         a.k_partition = one;
                         a.local.q_start = 3;
                       }),
                       "argument `local.q_start`: must be unset"));
  try {  // bottom_right is top_left only for a square attention
    cp::ring_schedule(Partition(40, 2, Layout::zigzag), Partition(41, 2, Layout::zigzag), 0,
                      CausalMode::bottom_right);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(
        e.what(),
        "argument `causal`: bottom_right with context parallelism needs a square attention"))
        << e.what();
  }
  EXPECT_EQ(cp::ring_schedule(p, p, 0, CausalMode::bottom_right).size(),
            cp::ring_schedule(p, p, 0, CausalMode::top_left).size());
}

TEST(RingAttention, AFailingRankReleasesTheOthersAndItsErrorIsReported) {
  cp::LocalRing ring(3);
  std::atomic<int> released{0};
  try {
    ring.run([&](cp::Transport& t) {
      if (t.rank() == 1) throw Error(ErrorCode::invalid_argument, "rank 1 fails");
      std::vector<std::uint8_t> a(8), b(8);
      const cp::SendBuffer send[] = {{a.data(), a.size()}};
      const cp::RecvBuffer recv[] = {{b.data(), b.size()}};
      try {
        t.end_exchange(t.begin_exchange(send, recv, nullptr), nullptr);
      } catch (const Error&) {
        ++released;
        throw;
      }
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1 fails");
  }
  EXPECT_EQ(released.load(), 2);
}

TEST(RingAttention, LocalRingMovesBuffersAroundTheRing) {
  for (int n : {1, 2, 5}) {
    cp::LocalRing ring(n);
    std::vector<std::vector<int>> got(static_cast<std::size_t>(n));
    ring.run([&](cp::Transport& t) {
      std::vector<int> mine(3, t.rank()), from(3, -1), second(2, -1), twice(2, 10 * t.rank());
      const cp::SendBuffer s1[] = {{mine.data(), 3 * sizeof(int)}};
      const cp::RecvBuffer r1[] = {{from.data(), 3 * sizeof(int)}};
      const cp::SendBuffer s2[] = {{twice.data(), 2 * sizeof(int)}};
      const cp::RecvBuffer r2[] = {{second.data(), 2 * sizeof(int)}};
      const std::uint64_t a = t.begin_exchange(s1, r1, nullptr);
      const std::uint64_t b = t.begin_exchange(s2, r2, nullptr);  // two in flight
      t.end_exchange(a, nullptr);
      t.end_exchange(b, nullptr);
      got[t.rank()] = {from[0], from[2], second[1]};
    });
    for (int r = 0; r < n; ++r) {
      const int prev = (r - 1 + n) % n;
      EXPECT_EQ(got[r], (std::vector<int>{prev, prev, 10 * prev})) << n << " ranks, rank " << r;
    }
  }
}

TEST(RingAttention, TooSmallAWorkspaceIsAnError) {
  Case whole({.Lq = 20, .Lk = 20}, 17);
  cp::LocalRing ring(1);
  std::string message;
  ring.run([&](cp::Transport& t) {
    cp::ContextParallelArgs args;
    args.local = whole.args();
    args.q_partition = Partition(20, 1, Layout::contiguous);
    args.k_partition = args.q_partition;
    std::vector<std::uint8_t> ws(16);
    Options o;
    o.workspace = ws.data();
    o.workspace_bytes = ws.size();
    try {
      cp::ring_forward(args, whole.out.view, whole.lse.view, t, o);
    } catch (const Error& e) {
      message = e.what();
    }
  });
  EXPECT_TRUE(contains(message, "argument `workspace`: the ring needs")) << message;
}

// Without NCCL in the build every entry point says so; with it, the transport checks its
// arguments before touching a device (so this runs on CI's GPU-less machine either way).
TEST(RingAttention, NcclEntryPointsCheckTheirArgumentsOrSayTheBuildHasNoNccl) {
  auto code_and_message = [](auto&& call) {
    const test::Thrown thrown = test::thrown_by(call);
    return thrown.error ? std::pair{thrown.code, thrown.message}
                        : std::pair{ErrorCode::internal, std::string("no error")};
  };
  if (!cp::nccl_available()) {
    const auto [code, message] =
        code_and_message([] { cp::make_nccl_transport(nullptr, Device::cuda(0)); });
    EXPECT_EQ(code, ErrorCode::unsupported);
    EXPECT_TRUE(contains(message, "no NCCL")) << message;
    return;
  }
  const auto [null_code, null_message] =
      code_and_message([] { cp::make_nccl_transport(nullptr, Device::cuda(0)); });
  EXPECT_EQ(null_code, ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(null_message, "argument `nccl_comm`")) << null_message;
  int fake_comm = 0;
  const auto [cpu_code, cpu_message] =
      code_and_message([&] { cp::make_nccl_transport(&fake_comm, Device::cpu()); });
  EXPECT_EQ(cpu_code, ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(cpu_message, "argument `device`")) << cpu_message;
  const auto [id_code, id_message] = code_and_message([] {
    cp::nccl_comm_init({1, 2, 3}, 2, 0, Device::cuda(0));
  });
  EXPECT_EQ(id_code, ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(id_message, "argument `unique_id`: expected 128 bytes")) << id_message;
}

}  // namespace
}  // namespace memeff
