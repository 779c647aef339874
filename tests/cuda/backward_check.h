// A fused-kernel backward case run on the device and checked against the double-precision
// reference backward (test::KernelCase) on the same rounded inputs and dropout mask: the device
// backward reads the reference's out (rounded) and lse, its gradients are poisoned with NaN
// first, and dq, dk, dv (and dbias) must lie within test::fused_kernel_tolerance. Shared by the
// fused backwards' tests and the window, ALiBi and softcap ones.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/host_tensor.h"
#include "common/kernel_case.h"
#include "common/tolerance.h"
#include "cuda/device_tensor.h"
#include "memeff/attention.h"

namespace memeff::test {

// A case's inputs (with dout), the reference's results, and the reference's out rounded to the
// case's dtype and layout: the out the device backward reads with the reference's lse.
struct BwdProblem {
  KernelInputs in;
  KernelReference ref;
  HostTensor out;
  BwdProblem(const KernelCase& c, std::uint64_t data_seed)
      : in(c, data_seed, /*with_dout=*/true),
        ref(c, in),
        out(converted(ref.out, c.dtype, c.layout)) {}
};

// The backend's gradients, copied back from the device (storage dtype); dbias with a bias.
struct Grads {
  HostTensor dq, dk, dv;
  std::optional<HostTensor> dbias;
};

// Runs the case's backend's backward on device copies of the problem's inputs.
inline Grads run_backward_case(const KernelCase& c, const BwdProblem& pr) {
  Grads out{HostTensor(c.dtype, {c.B, c.Hq, c.Lq, c.D}, c.layout),
            HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.D}, c.layout),
            HostTensor(c.dtype, {c.B, c.Hkv, c.Lk, c.dv()}, c.layout), std::nullopt};
  for (HostTensor* g : {&out.dq, &out.dk, &out.dv}) poison(*g);
  DeviceTensor q(pr.in.q), k(pr.in.k), v(pr.in.v), dout(*pr.in.dout), o(pr.out), lse(pr.ref.lse),
      dq(out.dq), dk(out.dk), dv(out.dv);
  std::optional<DeviceTensor> bias, dbias, slopes;
  if (pr.in.bias) {
    bias.emplace(*pr.in.bias);
    out.dbias = *pr.in.bias;
    poison(*out.dbias);
    dbias.emplace(*out.dbias);
  }
  if (pr.in.slopes) slopes.emplace(*pr.in.slopes);
  AttentionArgs args =
      c.args(q.view, k.view, v.view, bias ? std::optional(bias->view) : std::nullopt,
             slopes ? std::optional(slopes->view) : std::nullopt);
  std::uint64_t* rng_dev = nullptr;
  if (c.device_rng) {
    const std::uint64_t vals[2] = {c.seed, c.offset};
    if (cudaMalloc(&rng_dev, sizeof vals) != cudaSuccess ||
        cudaMemcpy(rng_dev, vals, sizeof vals, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("device rng state");
    }
    args.rng.seed = c.seed ^ 0xDEADBEEFull;  // must be ignored
    args.rng.offset = c.offset + 977;
    args.rng.device_seed = rng_dev;
    args.rng.device_offset = rng_dev + 1;
  }
  BackwardTensors g{dout.view, o.view, lse.view, dq.view, dk.view, dv.view, std::nullopt};
  if (dbias) g.dbias = dbias->view;
  Options opt = only({c.backend});
  opt.deterministic = c.deterministic;
  const CallInfo info = backward(args, g, opt);
  EXPECT_EQ(info.backend, c.backend);
  const cudaError_t err = cudaDeviceSynchronize();
  if (rng_dev) cudaFree(rng_dev);
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("kernel failed: ") + cudaGetErrorString(err));
  dq.copy_to(out.dq);
  dk.copy_to(out.dk);
  dv.copy_to(out.dv);
  if (dbias) dbias->copy_to(*out.dbias);
  return out;
}

inline bool within_fused_tolerance(const Diff& d, DType dtype) {
  return !d.nan && d.max_abs <= fused_kernel_tolerance(dtype).bound(d.max_ref);
}

inline void expect_grad_close(const KernelCase& c, const char* name, const HostTensor& actual,
                              const HostTensor& ref) {
  expect_close(actual, ref, fused_kernel_tolerance(c.dtype), c.describe() + ": " + name);
}

// dq, dk, dv (and dbias) against the reference's.
inline void expect_grads_match(const KernelCase& c, const Grads& got, const KernelReference& ref) {
  expect_grad_close(c, "dq", got.dq, ref.dq);
  expect_grad_close(c, "dk", got.dk, ref.dk);
  expect_grad_close(c, "dv", got.dv, ref.dv);
  if (got.dbias) expect_grad_close(c, "dbias", *got.dbias, ref.dbias);
}

inline void check_backward_case(const KernelCase& c, std::uint64_t data_seed = 11) {
  SCOPED_TRACE(c.describe());
  const BwdProblem pr(c, data_seed);
  expect_grads_match(c, run_backward_case(c, pr), pr.ref);
}

inline bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  return a.storage.size() == b.storage.size() &&
         std::memcmp(a.storage.data(), b.storage.data(), a.storage.size()) == 0;
}

}  // namespace memeff::test
