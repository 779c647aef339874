// Global coordinates (AttentionArgs::q_start, k_start, kv_block: the block calls of context
// parallelism, docs/context_parallel.md) on the CUDA backends (`cuda`, `cuda_sm90`, `cuda_math`,
// and the forward-only `cuda_splitkv`, followed by the `cuda` backward):
// the mask read off the outputs is the map's at the global rows and keys, in the forward's and
// the backward's orientation, up to the map's last rows and keys; block calls (starts, causal
// shifts of both signs, fully hidden blocks, kv_block with a larger attention's out and lse,
// dropout, GQA, head dims 64 and 128, biases and their gradients) against the double-precision
// reference on the same rounded inputs; the fused kernels' refusal of dropout at a key start off
// the 64-key blocks, which cuda_math takes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/attention_case.h"
#include "common/host_tensor.h"
#include "cuda/device_tensor.h"
#include "cuda/near_reference.h"
#include "memeff/attention.h"
#include "memeff/dispatch.h"
#include "memeff/dropout.h"

namespace memeff {
namespace {

using test::Case;
using test::Config;
using test::DeviceTensor;
using test::HostTensor;
using test::only;

struct Starts {
  std::int64_t q_start = 0, k_start = 0;
  bool kv_block = false;
  std::string describe() const {
    return "q_start " + std::to_string(q_start) + " k_start " + std::to_string(k_start) +
           (kv_block ? " kv_block" : "");
  }
};

AttentionArgs at(AttentionArgs a, const Starts& s) {
  a.q_start = s.q_start;
  a.k_start = s.k_start;
  a.kv_block = s.kv_block;
  return a;
}

// The device copies of a case's tensors (and ALiBi slopes).
struct DeviceCase : test::DeviceTensors {
  std::optional<DeviceTensor> bias, dbias, slopes;
  explicit DeviceCase(const Case& c) : DeviceTensors(c) {
    if (c.bias) {
      bias.emplace(*c.bias);
      dbias.emplace(*c.dbias);
    }
    if (c.slopes) slopes.emplace(*c.slopes);
  }
  AttentionArgs args(const Case& c, const Starts& s) const {
    AttentionArgs a = at(c.args(), s);
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    if (bias) a.bias = bias->view;
    if (slopes) a.alibi_slopes = slopes->view;
    return a;
  }
  BackwardTensors grads() const {
    BackwardTensors g{dout.view, out.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
    if (dbias) g.dbias = dbias->view;
    return g;
  }
};

class CudaGlobalCoordinates : public test::PerBackend {
 protected:
  bool fused() const { return GetParam() != "cuda_math"; }
  // The backend of the backward: the forward-only cuda_splitkv is followed by the fused "cuda".
  std::string backward_backend() const {
    return GetParam() == "cuda_splitkv" ? "cuda" : GetParam();
  }

  // Forward and backward of one block call on the backend against the reference in double on
  // the same rounded inputs. The backward takes the block's own out and lse, or with kv_block a
  // larger attention's (here: out · 0.75 and lse + 0.3, what a block of half the row's mass has).
  void check(const Config& cfg, const Starts& s) {
    SCOPED_TRACE(GetParam() + " " + cfg.describe() + " " + s.describe());
    Case c(cfg, 31);
    Config c64 = cfg;
    c64.dtype = DType::f64;
    Case r(c64, 1);
    r.q = test::converted(c.q, DType::f64);
    r.k = test::converted(c.k, DType::f64);
    r.v = test::converted(c.v, DType::f64);
    r.dout = test::converted(c.dout, DType::f64);
    if (c.bias) r.bias = test::converted(*c.bias, DType::f64);
    r.slopes = c.slopes;
    const AttentionArgs ra = at(r.args(), s);
    forward(ra, r.out.view, r.lse.view, only({"reference"}));

    HostTensor out_b = test::converted(r.out, cfg.dtype), lse_b = r.lse;
    if (s.kv_block) {
      for (std::int64_t i = 0; i < out_b.numel(); ++i) out_b.set(i, 0.75 * out_b.get(i));
      for (std::int64_t i = 0; i < lse_b.numel(); ++i) {
        if (std::isfinite(lse_b.get(i))) lse_b.set(i, lse_b.get(i) + 0.3);
      }
    }
    const HostTensor out_b64 = test::converted(out_b, DType::f64);
    BackwardTensors rg{r.dout.view, out_b64.view, lse_b.view,  r.dq.view,
                       r.dk.view,   r.dv.view,    std::nullopt};
    if (r.dbias) rg.dbias = r.dbias->view;
    backward(ra, rg, only({"reference"}));

    DeviceCase dev(c);
    const AttentionArgs a = dev.args(c, s);
    EXPECT_EQ(forward(a, dev.out.view, dev.lse.view, only({GetParam()})).backend, GetParam());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    test::expect_near_reference(dev.out.to_host(c.out), r.out, cfg.dtype, "out");
    test::expect_lse_near_reference(dev.lse.to_host(c.lse), r.lse);

    dev.out.upload(out_b);
    dev.lse.upload(lse_b);
    EXPECT_EQ(backward(a, dev.grads(), only({backward_backend()})).backend, backward_backend());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    test::expect_near_reference(dev.dq.to_host(c.dq), r.dq, cfg.dtype, "dq");
    test::expect_near_reference(dev.dk.to_host(c.dk), r.dk, cfg.dtype, "dk");
    test::expect_near_reference(dev.dv.to_host(c.dv), r.dv, cfg.dtype, "dv");
    if (dev.dbias) {
      test::expect_near_reference(dev.dbias->to_host(*c.dbias), *r.dbias, cfg.dtype, "dbias");
    }
  }
};

// q = 0 makes every visible score equal; with V the identity (Dv = Lk) out[i, j] is nonzero
// exactly where key j is visible to row i and kept, and with dO the identity (Dv = Lq) so is
// dv[j, i]: the forward's and the backward's orientation of the mask, compared element by element
// with the map at (b, h, q_start + i, k_start + j).
TEST_P(CudaGlobalCoordinates, MaskIsTheMapsAtTheGlobalRowsAndKeys) {
  Config cfg{.B = 2, .Lq = 128, .Lk = 128, .D = 128, .dropout = 0.5, .dtype = DType::bf16};
  const std::int64_t n = 128;
  const std::vector<Starts> starts = {
      {0, 0, false},
      {192, 128, false},
      {5000, 64 * 77, true},
      {(std::int64_t{1} << 32) - n, (std::int64_t{1} << 36) - n, false}};
  for (CausalMode causal : {CausalMode::none, CausalMode::top_left}) {
    for (const Starts& s : starts) {
      SCOPED_TRACE(GetParam() + " " + causal_mode_name(causal) + " " + s.describe());
      cfg.causal = causal;
      Case c(cfg, 3);
      test::fill_value(c.q, 0.0);
      test::fill_identity(c.v);
      test::fill_identity(c.dout);
      DeviceCase dev(c);
      const AttentionArgs a = dev.args(c, s);
      EXPECT_EQ(forward(a, dev.out.view, dev.lse.view, only({GetParam()})).backend, GetParam());
      EXPECT_EQ(backward(a, dev.grads(), only({backward_backend()})).backend, backward_backend());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const HostTensor out = dev.out.to_host(c.out), dv = dev.dv.to_host(c.dv);
      const std::int64_t shift = s.q_start - s.k_start;
      std::int64_t visible = 0, kept = 0;
      for (std::int64_t b = 0; b < cfg.B; ++b)
        for (std::int64_t h = 0; h < cfg.Hq; ++h)
          for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              const bool seen = causal == CausalMode::none || j <= i + shift;
              const bool want = seen && dropout_keep(cfg.seed, cfg.offset, cfg.dropout, cfg.Hq, b,
                                                     h, s.q_start + i, s.k_start + j);
              const std::int64_t bh = b * cfg.Hq + h;
              ASSERT_EQ(out.get((bh * n + i) * n + j) != 0.0, want)
                  << "forward: b " << b << " h " << h << " row " << i << " key " << j;
              ASSERT_EQ(dv.get((bh * n + j) * n + i) != 0.0, want)
                  << "backward: b " << b << " h " << h << " row " << i << " key " << j;
              visible += seen;
              kept += want;
            }
      // The check had something to find: about half of the visible elements kept (under a
      // causal mask the last starts hide the whole block: nothing visible, nothing written).
      if (causal == CausalMode::none || shift > -n) {
        EXPECT_GT(kept, visible / 3);
        EXPECT_LT(kept, 2 * visible / 3);
      } else {
        EXPECT_EQ(visible, 0);
      }
    }
  }
}

TEST_P(CudaGlobalCoordinates, BlockCallsMatchTheReference) {
  const std::vector<Starts> starts = {
      {0, 0, true},       // kv_block alone: no single-key shortcut on the diagonal's first row
      {384, 128, false},  // causal shift +256: every key visible
      {128, 64, true},    // shift +64
      {64, 128, true},    // shift -64: the first rows see no key of the block
      {0, 256, false},    // shift -256: the whole block hidden under a causal mask
      {(std::int64_t{1} << 31) + 64, std::int64_t{1} << 33, false}};  // far rows and keys
  Config cfg{.B = 2, .Hq = 4, .Hkv = 2, .Lq = 200, .Lk = 192};
  for (const auto& [D, dtype] : {std::pair{64, DType::bf16}, std::pair{128, DType::f16}}) {
    cfg.D = D;
    cfg.dtype = dtype;
    for (CausalMode causal : {CausalMode::none, CausalMode::top_left}) {
      for (double p : {0.0, 0.2}) {
        cfg.causal = causal;
        cfg.dropout = p;
        for (const Starts& s : starts) check(cfg, s);
      }
    }
  }
  // A bias with the block's own rows and keys, and one broadcast over batch and queries (its
  // gradient summed across CTAs), with dropout.
  cfg.D = 64;
  cfg.dtype = DType::bf16;
  cfg.causal = CausalMode::top_left;
  cfg.dropout = 0.2;
  for (const std::string bias : {"bhqk", "1h1k"}) {
    cfg.bias = bias;
    check(cfg, {128, 64, true});
    check(cfg, {384, 128, false});
  }
}

// Top-left block calls with a window, ALiBi and a softcap (every backend here runs them;
// docs/window.md): the window and the distances count from the global diagonal, in blocks that
// the window cuts, hides and leaves whole, with kv_block, dropout and a bias with its gradient;
// cuda_math in fp32 too.
TEST_P(CudaGlobalCoordinates, WindowAlibiAndSoftcapAtGlobalPositions) {
  Config cfg{.B = 2, .Hq = 4, .Hkv = 2, .Lq = 200, .Lk = 192, .D = 64};
  cfg.dtype = DType::bf16;
  cfg.causal = CausalMode::top_left;
  cfg.dropout = 0.2;
  cfg.window = Window{100, -1};
  for (const Starts& s : {Starts{384, 128, false}, Starts{128, 64, true}, Starts{512, 64, false},
                          Starts{64, 128, true}}) {
    cfg.alibi = "none";
    cfg.softcap = 0.0;
    check(cfg, s);  // the window alone
    cfg.alibi = "h";
    cfg.softcap = 4.0;
    check(cfg, s);
  }
  cfg.bias = "bhqk";
  cfg.alibi = "bh";
  check(cfg, {128, 64, true});
  if (fused()) return;
  cfg.dtype = DType::f32;  // cuda_math alone takes fp32
  check(cfg, {384, 128, false});
  check(cfg, {64, 128, true});
}

// Keys starting off the dropout map's 64-key blocks: the fused kernels take them without dropout
// (the shift is all they need) and refuse them with it, naming the constraint; cuda_math draws
// the map element by element and takes them.
TEST_P(CudaGlobalCoordinates, KeyStartsOffTheDropoutBlocks) {
  Config cfg{.Hkv = 1, .Lq = 100, .Lk = 150, .D = 64, .causal = CausalMode::top_left};
  cfg.dtype = DType::bf16;
  const Starts s{170, 37, true};
  check(cfg, s);  // no dropout: every backend
  cfg.dropout = 0.3;
  if (!fused()) {
    check(cfg, s);
    return;
  }
  Case c(cfg, 2);
  DeviceCase dev(c);
  const Explanation ex = explain(dev.args(c, s), Pass::forward, only({GetParam()}));
  bool named = false;
  for (const auto& report : ex.backends) {
    if (report.name != GetParam()) continue;
    EXPECT_FALSE(report.eligible);
    for (const std::string& r : report.reasons)
      named = named || r.find("multiple of 64") != std::string::npos;
  }
  EXPECT_TRUE(named) << "no reason names the 64-key blocks";
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaGlobalCoordinates,
                         ::testing::Values("cuda", "cuda_sm90", "cuda_math", "cuda_splitkv"),
                         test::backend_name);

}  // namespace
}  // namespace memeff
