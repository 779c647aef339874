// cuda_math: attention on the GPU from cuBLAS strided-batched products and small kernels. It
// materializes the fp32 Lq×Lk scores of a chunk of heads, so it is the fallback for what the
// fused kernels refuse and the accurate GPU baseline: inputs are copied to fp32, every product
// runs in fp32 (no TF32), dropout draws the same mask as every backend (core/dropout_map.h), and
// the window, ALiBi and the softcap (docs/window.md) change the scores where the mask does.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/builtin_backends.h"
#include "core/dropout_map.h"
#include "cuda/backends/cuda_backend_base.h"
#include "cuda/backends/cuda_math_kernels.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/device.h"
#include "cuda/runtime/fill.h"
#include "cuda/runtime/workspace.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff::detail {
namespace {

using namespace cuda_math;  // the kernels and their parameter structs

// Heads are processed in chunks whose fp32 score buffers stay below this many bytes in total.
constexpr std::size_t kScoreBudgetBytes = std::size_t{1} << 30;

void cublas_check(cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::cuda_error,
                std::string("cuda_math: ") + call + " failed: " + cublasGetStatusString(st));
  }
}
#define MEMEFF_CUBLAS(call) cublas_check((call), #call)
#define MEMEFF_LAUNCHED(what) cuda::check_launch("cuda_math: launch of " what)

// ------------------------------------------------------------------------------------------
// Host side.

// One cuBLAS handle per (thread, device), created on first use and kept for the thread's life
// (destroying handles during process teardown races the CUDA runtime's own shutdown).
cublasHandle_t cublas_handle(int device) {
  thread_local std::vector<cublasHandle_t> handles;
  if (static_cast<int>(handles.size()) <= device) handles.resize(device + 1, nullptr);
  if (!handles[device]) MEMEFF_CUBLAS(cublasCreate(&handles[device]));
  return handles[device];
}

// Row-major C[M×N] = alpha·op(A)[M×K]·op(B)[K×N] + beta·C, batched with element strides, all
// fp32 with fp32 compute. cuBLAS is column-major: compute Cᵀ = op(B)ᵀ·op(A)ᵀ.
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
          std::int64_t K, float alpha, const float* A, std::int64_t lda, std::int64_t stride_a,
          const float* B, std::int64_t ldb, std::int64_t stride_b, float* C, std::int64_t ldc,
          std::int64_t stride_c, std::int64_t batch, cudaStream_t stream) {
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) {
    cuda::check_cuda(cudaMemsetAsync(C, 0, sizeof(float) * stride_c * batch, stream),
                     "cuda_math: cudaMemsetAsync(C)");
    return;
  }
  const float beta = 0.f;
  MEMEFF_CUBLAS(cublasGemmStridedBatchedEx(
      handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B, CUDA_R_32F,
      static_cast<int>(ldb), stride_b, A, CUDA_R_32F, static_cast<int>(lda), stride_a, &beta, C,
      CUDA_R_32F, static_cast<int>(ldc), stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

// Sizes of the scratch buffers (in floats) for a pass, with the chunk in kv heads.
struct Plan {
  std::int64_t kv_chunk = 1;  // key/value heads (each with its `group` query heads) per chunk
  // Lq×Lk buffers of a chunk: S (forward); P and dP (backward), and the cap's derivative with
  // a softcap. `scores` is the size of one.
  int score_buffers = 1;
  std::size_t q, k, v, dout, dsum, scores, o_chunk, dq_chunk, dk_chunk, dv_chunk, dbias;
  std::size_t total_floats() const {
    return q + k + v + dout + dsum + scores * score_buffers + o_chunk + dq_chunk + dk_chunk +
           dv_chunk + dbias;
  }
  std::size_t total_bytes() const { return total_floats() * sizeof(float); }
};

std::size_t round_up(std::size_t n) { return (n + 63) / 64 * 64; }  // 256-byte alignment

Plan make_plan(const Problem& p, Pass pass) {
  const bool bwd = pass == Pass::backward;
  const std::int64_t G = std::max<std::int64_t>(p.group_size(), 1);
  const std::int64_t kv_heads = p.B * p.Hkv;
  Plan plan;
  plan.score_buffers = bwd ? (p.has_softcap() ? 3 : 2) : 1;
  const std::size_t score_per_kv = static_cast<std::size_t>(G * p.Lq * p.Lk) * plan.score_buffers;
  plan.kv_chunk = std::max<std::int64_t>(
      1, std::min<std::int64_t>(kv_heads,
                                static_cast<std::int64_t>(kScoreBudgetBytes / sizeof(float) /
                                                          std::max<std::size_t>(score_per_kv, 1))));
  const std::int64_t c = plan.kv_chunk;
  plan.q = round_up(static_cast<std::size_t>(p.B * p.Hq * p.Lq * p.D));
  plan.k = round_up(static_cast<std::size_t>(kv_heads * p.Lk * p.D));
  plan.v = round_up(static_cast<std::size_t>(kv_heads * p.Lk * p.Dv));
  plan.dout = bwd ? round_up(static_cast<std::size_t>(p.B * p.Hq * p.Lq * p.Dv)) : 0;
  plan.dsum = bwd ? round_up(static_cast<std::size_t>(p.B * p.Hq * p.Lq)) : 0;
  plan.scores = round_up(static_cast<std::size_t>(c * G * p.Lq * p.Lk));
  plan.o_chunk = bwd ? 0 : round_up(static_cast<std::size_t>(c * G * p.Lq * p.Dv));
  plan.dq_chunk = bwd ? round_up(static_cast<std::size_t>(c * G * p.Lq * p.D)) : 0;
  plan.dk_chunk = bwd ? round_up(static_cast<std::size_t>(c * p.Lk * p.D)) : 0;
  plan.dv_chunk = bwd ? round_up(static_cast<std::size_t>(c * p.Lk * p.Dv)) : 0;
  plan.dbias = bwd && p.has_bias ? round_up(static_cast<std::size_t>(
                                       (p.bias_bcast_b ? 1 : p.B) * (p.bias_bcast_h ? 1 : p.Hq) *
                                       (p.bias_bcast_q ? 1 : p.Lq) * p.Lk))
                                 : 0;
  return plan;
}

RowParams row_params(const Problem& pb, const AttentionArgs& args, const TensorView& lse) {
  RowParams p{};
  p.Hq = pb.Hq;
  p.Lq = pb.Lq;
  p.Lk = pb.Lk;
  p.group = pb.group_size();
  if (args.bias) {
    const TensorView& bias = *args.bias;
    p.has_bias = true;
    p.bias = cuda::strided_view(bias);
    for (int d = 0; d < 3; ++d) {
      if (bias.shape[d] == 1) p.bias.s[d] = 0;  // broadcast: read index 0
    }
  }
  p.causal = pb.causal != CausalMode::none;
  p.shift = pb.position_shift();
  p.window_left = pb.window_left;
  p.window_right = pb.window_right;
  if (pb.has_alibi) {  // [Hq] or [B, Hq] (validation), fp32
    const TensorView& slopes = *args.alibi_slopes;
    p.slopes = static_cast<const float*>(slopes.data);
    p.slope_sb = pb.alibi_per_batch ? slopes.stride[0] : 0;
    p.slope_sh = slopes.stride[slopes.rank - 1];
  }
  p.softcap = pb.has_softcap() ? static_cast<float>(pb.softcap) : 0.f;
  p.kv_block = pb.kv_block;
  p.q_start = pb.q_start;
  p.k_start = pb.k_start;
  p.dropout = pb.has_dropout();
  p.threshold = pb.dropout.threshold;
  p.keep_scale = static_cast<float>(pb.dropout.keep_scale);
  p.seed = args.rng.seed;
  p.offset = args.rng.offset;
  p.seed_ptr = args.rng.device_seed;
  p.offset_ptr = args.rng.device_offset;
  p.lse = static_cast<float*>(lse.data);
  p.lse_sb = lse.stride[0];
  p.lse_sh = lse.stride[1];
  return p;
}

class CudaMathBackend final : public CudaBackendBase {
 public:
  std::string name() const override { return "cuda_math"; }

  std::vector<std::string> reasons_unsupported(const Problem& p, Pass pass) const override {
    std::vector<std::string> reasons;
    if (p.device.type != DeviceType::cuda) reasons.push_back("needs CUDA tensors");
    if (p.packed) {
      reasons.push_back("packed sequences (cu_seqlens): cuda_math runs dense batches only");
    }
    if (p.dtype == DType::f64) reasons.push_back("fp64 is not supported (fp32, fp16 and bf16 are)");
    if (p.has_softcap() && std::fpclassify(static_cast<float>(p.softcap)) != FP_NORMAL) {
      reasons.push_back("softcap = " + std::to_string(p.softcap) +
                        " is outside fp32's normal range (cuda_math caps the scores in fp32)");
    }
    const std::int64_t G = std::max<std::int64_t>(p.group_size(), 1);
    if (G * p.Lq > INT_MAX || p.Lk > INT_MAX || p.D > INT_MAX || p.Dv > INT_MAX) {
      reasons.push_back("a matrix dimension exceeds cuBLAS's 32-bit sizes");
    }
    if (!reasons.empty()) return reasons;
    if (const cuda::ComputeCapability cc = cuda::compute_capability(p.device.index); !cc.ok) {
      return {cc.error};
    }
    const std::size_t need = workspace_bytes(p, pass);
    int previous = 0;
    std::size_t free_bytes = 0, total_bytes = 0;
    cudaError_t err = cudaGetDevice(&previous);
    if (err == cudaSuccess) err = cudaSetDevice(p.device.index);
    if (err == cudaSuccess) err = cudaMemGetInfo(&free_bytes, &total_bytes);
    cudaSetDevice(previous);
    if (err != cudaSuccess) {
      cudaGetLastError();
      reasons.push_back("cannot query " + device_name(p.device) + ": " + cudaGetErrorString(err));
    } else if (need > free_bytes) {
      reasons.push_back("needs " + std::to_string(need) + " bytes of device memory for its fp32 " +
                        "copies and Lq×Lk buffers, " + std::to_string(free_bytes) + " free on " +
                        device_name(p.device));
    }
    return reasons;
  }

  std::size_t workspace_bytes(const Problem& p, Pass pass) const override {
    return make_plan(p, pass).total_bytes();
  }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    if (pb.B * pb.Hq * pb.Lq == 0) return;
    cuda::DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    if (pb.Lk == 0) {  // no key: out = 0, lse = -inf
      cuda::fill(out, 0.0, stream);
      cuda::fill(lse, -INFINITY, stream);
      return;
    }
    const Plan plan = make_plan(pb, Pass::forward);
    cuda::Workspace workspace("cuda_math forward", plan.total_bytes(), options, stream);
    cuda::WorkspaceCarver ws(workspace.data());
    float* q = ws.take<float>(plan.q);
    float* k = ws.take<float>(plan.k);
    float* v = ws.take<float>(plan.v);
    float* S = ws.take<float>(plan.scores);
    float* o = ws.take<float>(plan.o_chunk);
    copy_inputs(pb, args, q, k, v, stream);
    cublasHandle_t handle = cublas_handle(pb.device.index);
    MEMEFF_CUBLAS(cublasSetStream(handle, stream));
    const std::int64_t G = pb.group_size(), GL = G * pb.Lq;
    RowParams rp = row_params(pb, args, lse);
    for (std::int64_t kv0 = 0; kv0 < pb.B * pb.Hkv; kv0 += plan.kv_chunk) {
      const std::int64_t c = std::min(plan.kv_chunk, pb.B * pb.Hkv - kv0);
      // S[GL × Lk] = scale · Q[GL × D] · Kᵀ, per key/value head (its query heads stacked).
      gemm(handle, false, true, GL, pb.Lk, pb.D, static_cast<float>(pb.scale), q + kv0 * GL * pb.D,
           pb.D, GL * pb.D, k + kv0 * pb.Lk * pb.D, pb.D, pb.Lk * pb.D, S, pb.Lk, GL * pb.Lk, c,
           stream);
      rp.bh0 = kv0 * G;
      softmax_forward_kernel<<<static_cast<unsigned>(c * GL), kThreads, 0, stream>>>(S, rp);
      MEMEFF_LAUNCHED("softmax_forward_kernel");
      // O[GL × Dv] = (P∘Z)[GL × Lk] · V[Lk × Dv]
      gemm(handle, false, false, GL, pb.Dv, pb.Lk, 1.f, S, pb.Lk, GL * pb.Lk,
           v + kv0 * pb.Lk * pb.Dv, pb.Dv, pb.Lk * pb.Dv, o, pb.Dv, GL * pb.Dv, c, stream);
      scatter_kernel<<<grid_for(c * GL * pb.Dv), kThreads, 0, stream>>>(o, cuda::strided_view(out),
                                                                        kv0 * G, c * G, 1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
    }
    workspace.release();
  }

  void backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g,
                const Options& options) override {
    cuda::DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    const std::int64_t G = std::max<std::int64_t>(pb.group_size(), 1), GL = G * pb.Lq;
    if (pb.B * pb.Hq * pb.Lq == 0 || pb.Lk == 0) {  // every gradient is zero
      cuda::fill(g.dq, 0.0, stream);
      cuda::fill(g.dk, 0.0, stream);
      cuda::fill(g.dv, 0.0, stream);
      if (g.dbias) cuda::fill(*g.dbias, 0.0, stream);
      return;
    }
    const Plan plan = make_plan(pb, Pass::backward);
    cuda::Workspace workspace("cuda_math backward", plan.total_bytes(), options, stream);
    cuda::WorkspaceCarver ws(workspace.data());
    float* q = ws.take<float>(plan.q);
    float* k = ws.take<float>(plan.k);
    float* v = ws.take<float>(plan.v);
    float* dout = ws.take<float>(plan.dout);
    float* dsum = ws.take<float>(plan.dsum);
    float* A = ws.take<float>(plan.scores);
    float* dP = ws.take<float>(plan.scores);
    // With the softcap: 1 - tanh² from step 1, then dS for dbias (dsoftmax_kernel).
    float* cap_grad = pb.has_softcap() ? ws.take<float>(plan.scores) : nullptr;
    float* dq = ws.take<float>(plan.dq_chunk);
    float* dk = ws.take<float>(plan.dk_chunk);
    float* dv = ws.take<float>(plan.dv_chunk);
    float* dbias = ws.take<float>(plan.dbias);
    copy_inputs(pb, args, q, k, v, stream);
    gather_kernel<<<grid_for(pb.B * pb.Hq * pb.Lq * pb.Dv), kThreads, 0, stream>>>(
        cuda::strided_view(g.dout), dout, 0, pb.B * pb.Hq);
    MEMEFF_LAUNCHED("gather_kernel");
    const std::int64_t rows = pb.B * pb.Hq * pb.Lq;
    rowdot_kernel<<<static_cast<unsigned>((rows * 32 + kThreads - 1) / kThreads), kThreads, 0,
                    stream>>>(cuda::strided_view(g.dout), cuda::strided_view(g.out), dsum, rows);
    MEMEFF_LAUNCHED("rowdot_kernel");
    const bool want_dbias = g.dbias.has_value();
    DbiasParams dp{};
    if (want_dbias) {
      cuda::check_cuda(cudaMemsetAsync(dbias, 0, plan.dbias * sizeof(float), stream),
                       "cuda_math: cudaMemsetAsync(dbias accumulator)");
      dp.Hq = pb.Hq;
      dp.Lq = pb.Lq;
      dp.Lk = pb.Lk;
      dp.B = pb.B;
      dp.db_B = g.dbias->shape[0];
      dp.db_H = g.dbias->shape[1];
      dp.db_Q = g.dbias->shape[2];
    }
    cublasHandle_t handle = cublas_handle(pb.device.index);
    MEMEFF_CUBLAS(cublasSetStream(handle, stream));
    RowParams rp = row_params(pb, args, g.lse);
    const float scale = static_cast<float>(pb.scale);
    for (std::int64_t kv0 = 0; kv0 < pb.B * pb.Hkv; kv0 += plan.kv_chunk) {
      const std::int64_t c = std::min(plan.kv_chunk, pb.B * pb.Hkv - kv0);
      const float* qc = q + kv0 * GL * pb.D;
      const float* kc = k + kv0 * pb.Lk * pb.D;
      const float* vc = v + kv0 * pb.Lk * pb.Dv;
      const float* doc = dout + kv0 * GL * pb.Dv;
      gemm(handle, false, true, GL, pb.Lk, pb.D, scale, qc, pb.D, GL * pb.D, kc, pb.D, pb.Lk * pb.D,
           A, pb.Lk, GL * pb.Lk, c, stream);
      rp.bh0 = kv0 * G;
      probs_backward_kernel<<<static_cast<unsigned>(c * GL), kThreads, 0, stream>>>(A, cap_grad,
                                                                                    rp);
      MEMEFF_LAUNCHED("probs_backward_kernel");
      // dP' = dO · Vᵀ
      gemm(handle, false, true, GL, pb.Lk, pb.Dv, 1.f, doc, pb.Dv, GL * pb.Dv, vc, pb.Dv,
           pb.Lk * pb.Dv, dP, pb.Lk, GL * pb.Lk, c, stream);
      dsoftmax_kernel<<<static_cast<unsigned>(c * GL), kThreads, 0, stream>>>(A, dP, cap_grad, dsum,
                                                                              rp);
      MEMEFF_LAUNCHED("dsoftmax_kernel");
      // dV = (P∘Z)ᵀ · dO, dQ = scale · dS · K, dK = scale · dSᵀ · Q (sums over the group; with
      // the softcap, dS∘(1 - tanh²) in dP).
      gemm(handle, true, false, pb.Lk, pb.Dv, GL, 1.f, A, pb.Lk, GL * pb.Lk, doc, pb.Dv, GL * pb.Dv,
           dv, pb.Dv, pb.Lk * pb.Dv, c, stream);
      gemm(handle, false, false, GL, pb.D, pb.Lk, scale, dP, pb.Lk, GL * pb.Lk, kc, pb.D,
           pb.Lk * pb.D, dq, pb.D, GL * pb.D, c, stream);
      gemm(handle, true, false, pb.Lk, pb.D, GL, scale, dP, pb.Lk, GL * pb.Lk, qc, pb.D, GL * pb.D,
           dk, pb.D, pb.Lk * pb.D, c, stream);
      scatter_kernel<<<grid_for(c * GL * pb.D), kThreads, 0, stream>>>(dq, cuda::strided_view(g.dq),
                                                                       kv0 * G, c * G, 1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
      scatter_kernel<<<grid_for(c * pb.Lk * pb.D), kThreads, 0, stream>>>(
          dk, cuda::strided_view(g.dk), kv0, c, 1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
      scatter_kernel<<<grid_for(c * pb.Lk * pb.Dv), kThreads, 0, stream>>>(
          dv, cuda::strided_view(g.dv), kv0, c, 1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
      if (want_dbias) {
        dp.bh0 = kv0 * G;
        dp.heads = c * G;
        const dim3 grid(
            static_cast<unsigned>((pb.Lk + 31) / 32),
            static_cast<unsigned>(std::min<std::int64_t>(dp.db_B * dp.db_H * dp.db_Q, 65535)));
        dbias_kernel<<<grid, dim3(32, 8), 0, stream>>>(cap_grad ? cap_grad : dP, dbias, dp);
        MEMEFF_LAUNCHED("dbias_kernel");
      }
    }
    if (want_dbias) {
      const cuda::StridedView db = cuda::strided_view(*g.dbias);
      const std::int64_t outer = dp.db_B * dp.db_H;
      scatter_kernel<<<grid_for(outer * db.n[2] * db.n[3]), kThreads, 0, stream>>>(dbias, db, 0,
                                                                                   outer, 1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
    }
    workspace.release();
  }

 private:
  static void copy_inputs(const Problem& pb, const AttentionArgs& args, float* q, float* k,
                          float* v, cudaStream_t stream) {
    gather_kernel<<<grid_for(pb.B * pb.Hq * pb.Lq * pb.D), kThreads, 0, stream>>>(
        cuda::strided_view(args.q), q, 0, pb.B * pb.Hq);
    MEMEFF_LAUNCHED("gather_kernel");
    gather_kernel<<<grid_for(pb.B * pb.Hkv * pb.Lk * pb.D), kThreads, 0, stream>>>(
        cuda::strided_view(args.k), k, 0, pb.B * pb.Hkv);
    MEMEFF_LAUNCHED("gather_kernel");
    gather_kernel<<<grid_for(pb.B * pb.Hkv * pb.Lk * pb.Dv), kThreads, 0, stream>>>(
        cuda::strided_view(args.v), v, 0, pb.B * pb.Hkv);
    MEMEFF_LAUNCHED("gather_kernel");
  }
};

}  // namespace

std::shared_ptr<Backend> make_cuda_math_backend() { return std::make_shared<CudaMathBackend>(); }

}  // namespace memeff::detail
