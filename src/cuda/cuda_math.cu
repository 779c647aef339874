// cuda_math: attention on the GPU from cuBLAS strided-batched products and small kernels. It
// materializes the fp32 Lq×Lk scores of a chunk of heads, so it is the fallback for what the
// fused kernels refuse and the accurate GPU baseline: inputs are copied to fp32, every product
// runs in fp32 (no TF32), and dropout draws the same mask as every backend (core/dropout_map.h).
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
#include "cuda/backend_util.h"
#include "cuda/cuda_math_kernels.cuh"
#include "core/dropout_map.h"
#include "memeff/backend.h"
#include "memeff/error.h"

namespace memeff::detail {
namespace {

using namespace cuda_math;  // the kernels and their parameter structs

// Heads are processed in chunks whose fp32 score buffers stay below this many bytes in total.
constexpr std::size_t kScoreBudgetBytes = std::size_t{1} << 30;

#define MEMEFF_CUDA(call) check((call), "cuda_math: " #call)

void cublas_check(cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::cuda_error,
                std::string("cuda_math: ") + call + " failed: " + cublasGetStatusString(st));
  }
}
#define MEMEFF_CUBLAS(call) cublas_check((call), #call)
#define MEMEFF_LAUNCHED(what) check(cudaGetLastError(), "cuda_math: launch of " what)

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
    MEMEFF_CUDA(cudaMemsetAsync(C, 0, sizeof(float) * stride_c * batch, stream));
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
  std::size_t q, k, v, dout, dsum, scores, o_chunk, dq_chunk, dk_chunk, dv_chunk, dbias;
  std::size_t total_floats() const {
    return q + k + v + dout + dsum + scores + o_chunk + dq_chunk + dk_chunk + dv_chunk + dbias;
  }
};

std::size_t round_up(std::size_t n) { return (n + 63) / 64 * 64; }  // 256-byte alignment

Plan make_plan(const Problem& p, Pass pass) {
  const bool bwd = pass == Pass::backward;
  const std::int64_t G = std::max<std::int64_t>(p.group_size(), 1);
  const std::int64_t kv_heads = p.B * p.Hkv;
  const std::size_t score_per_kv = static_cast<std::size_t>(G * p.Lq * p.Lk) * (bwd ? 2 : 1);
  Plan plan;
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
  plan.scores = round_up(static_cast<std::size_t>(c) * score_per_kv);
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

// The workspace of a call: the caller's, or one allocated (and freed) on the stream.
class Workspace {
 public:
  Workspace(std::size_t bytes, const Options& o, cudaStream_t stream) : stream_(stream) {
    if (bytes == 0) return;
    if (o.workspace) {
      if (o.workspace_bytes < bytes) {
        throw Error(ErrorCode::invalid_argument,
                    "argument `workspace_bytes`: cuda_math needs " + std::to_string(bytes) +
                        " bytes for this call (see workspace_size), got " +
                        std::to_string(o.workspace_bytes));
      }
      data_ = static_cast<float*>(o.workspace);
    } else {
      MEMEFF_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&data_), bytes, stream));
      owned_ = true;
    }
  }
  ~Workspace() {
    if (owned_) cudaFreeAsync(data_, stream_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  float* take(std::size_t floats) {
    float* p = data_ + used_;
    used_ += floats;
    return floats ? p : nullptr;
  }

 private:
  cudaStream_t stream_;
  float* data_ = nullptr;
  std::size_t used_ = 0;
  bool owned_ = false;
};

RowParams row_params(const Problem& pb, const AttentionArgs& args, const TensorView& lse) {
  RowParams p{};
  p.Hq = pb.Hq;
  p.Lq = pb.Lq;
  p.Lk = pb.Lk;
  p.group = pb.group_size();
  if (args.bias) {
    const TensorView& bias = *args.bias;
    p.bias = bias.data;
    p.bias_dtype = dtype_code(bias.dtype);
    p.bias_sb = bias.shape[0] == 1 ? 0 : bias.stride[0];
    p.bias_sh = bias.shape[1] == 1 ? 0 : bias.stride[1];
    p.bias_sq = bias.shape[2] == 1 ? 0 : bias.stride[2];
  }
  p.causal = pb.causal == CausalMode::none ? 0 : 1;
  p.causal_shift = pb.causal_shift();
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
    const std::int64_t G = std::max<std::int64_t>(p.group_size(), 1);
    if (G * p.Lq > INT_MAX || p.Lk > INT_MAX || p.D > INT_MAX || p.Dv > INT_MAX) {
      reasons.push_back("a matrix dimension exceeds cuBLAS's 32-bit sizes");
    }
    if (!reasons.empty()) return reasons;
    if (const ComputeCapability cc = compute_capability(p.device.index); !cc.ok) {
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
    return make_plan(p, pass).total_floats() * sizeof(float);
  }

  void forward(const Problem& pb, const AttentionArgs& args, const TensorView& out,
               const TensorView& lse, const Options& options) override {
    if (pb.B * pb.Hq * pb.Lq == 0) return;
    DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    if (pb.Lk == 0) {  // no key: out = 0, lse = -inf
      empty_rows(pb, out, lse, stream);
      return;
    }
    const Plan plan = make_plan(pb, Pass::forward);
    Workspace ws(plan.total_floats() * sizeof(float), options, stream);
    float* q = ws.take(plan.q);
    float* k = ws.take(plan.k);
    float* v = ws.take(plan.v);
    float* S = ws.take(plan.scores);
    float* o = ws.take(plan.o_chunk);
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
      scatter_kernel<<<grid_for(c * GL * pb.Dv), kThreads, 0, stream>>>(o, view4(out), kv0 * G,
                                                                        c * G, 1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
    }
  }

  void backward(const Problem& pb, const AttentionArgs& args, const BackwardTensors& g,
                const Options& options) override {
    DeviceScope device(pb.device.index);
    const auto stream = static_cast<cudaStream_t>(options.stream);
    const std::int64_t G = std::max<std::int64_t>(pb.group_size(), 1), GL = G * pb.Lq;
    if (pb.B * pb.Hq * pb.Lq == 0 || pb.Lk == 0) {  // every gradient is zero
      zero(g.dq, stream);
      zero(g.dk, stream);
      zero(g.dv, stream);
      if (g.dbias) zero(*g.dbias, stream);
      return;
    }
    const Plan plan = make_plan(pb, Pass::backward);
    Workspace ws(plan.total_floats() * sizeof(float), options, stream);
    float* q = ws.take(plan.q);
    float* k = ws.take(plan.k);
    float* v = ws.take(plan.v);
    float* dout = ws.take(plan.dout);
    float* dsum = ws.take(plan.dsum);
    float* scores = ws.take(plan.scores);
    float* dq = ws.take(plan.dq_chunk);
    float* dk = ws.take(plan.dk_chunk);
    float* dv = ws.take(plan.dv_chunk);
    float* dbias = ws.take(plan.dbias);
    copy_inputs(pb, args, q, k, v, stream);
    gather_kernel<<<grid_for(pb.B * pb.Hq * pb.Lq * pb.Dv), kThreads, 0, stream>>>(
        view4(g.dout), dout, 0, pb.B * pb.Hq);
    MEMEFF_LAUNCHED("gather_kernel");
    const std::int64_t rows = pb.B * pb.Hq * pb.Lq;
    rowdot_kernel<<<static_cast<unsigned>((rows * 32 + kThreads - 1) / kThreads), kThreads, 0,
                    stream>>>(view4(g.dout), view4(g.out), dsum, rows);
    MEMEFF_LAUNCHED("rowdot_kernel");
    const bool want_dbias = g.dbias.has_value();
    DbiasParams dp{};
    if (want_dbias) {
      MEMEFF_CUDA(cudaMemsetAsync(dbias, 0, plan.dbias * sizeof(float), stream));
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
    const std::size_t chunk_scores = plan.scores / 2;
    const float scale = static_cast<float>(pb.scale);
    for (std::int64_t kv0 = 0; kv0 < pb.B * pb.Hkv; kv0 += plan.kv_chunk) {
      const std::int64_t c = std::min(plan.kv_chunk, pb.B * pb.Hkv - kv0);
      float* A = scores;
      float* dP = scores + chunk_scores;
      const float* qc = q + kv0 * GL * pb.D;
      const float* kc = k + kv0 * pb.Lk * pb.D;
      const float* vc = v + kv0 * pb.Lk * pb.Dv;
      const float* doc = dout + kv0 * GL * pb.Dv;
      gemm(handle, false, true, GL, pb.Lk, pb.D, scale, qc, pb.D, GL * pb.D, kc, pb.D, pb.Lk * pb.D,
           A, pb.Lk, GL * pb.Lk, c, stream);
      rp.bh0 = kv0 * G;
      probs_backward_kernel<<<static_cast<unsigned>(c * GL), kThreads, 0, stream>>>(A, rp);
      MEMEFF_LAUNCHED("probs_backward_kernel");
      // dP' = dO · Vᵀ
      gemm(handle, false, true, GL, pb.Lk, pb.Dv, 1.f, doc, pb.Dv, GL * pb.Dv, vc, pb.Dv,
           pb.Lk * pb.Dv, dP, pb.Lk, GL * pb.Lk, c, stream);
      dsoftmax_kernel<<<static_cast<unsigned>(c * GL), kThreads, 0, stream>>>(A, dP, dsum, rp);
      MEMEFF_LAUNCHED("dsoftmax_kernel");
      // dV = (P∘Z)ᵀ · dO, dQ = scale · dS · K, dK = scale · dSᵀ · Q (sums over the group).
      gemm(handle, true, false, pb.Lk, pb.Dv, GL, 1.f, A, pb.Lk, GL * pb.Lk, doc, pb.Dv, GL * pb.Dv,
           dv, pb.Dv, pb.Lk * pb.Dv, c, stream);
      gemm(handle, false, false, GL, pb.D, pb.Lk, scale, dP, pb.Lk, GL * pb.Lk, kc, pb.D,
           pb.Lk * pb.D, dq, pb.D, GL * pb.D, c, stream);
      gemm(handle, true, false, pb.Lk, pb.D, GL, scale, dP, pb.Lk, GL * pb.Lk, qc, pb.D,
           GL * pb.D, dk, pb.D, pb.Lk * pb.D, c, stream);
      scatter_kernel<<<grid_for(c * GL * pb.D), kThreads, 0, stream>>>(dq, view4(g.dq), kv0 * G,
                                                                       c * G, 1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
      scatter_kernel<<<grid_for(c * pb.Lk * pb.D), kThreads, 0, stream>>>(dk, view4(g.dk), kv0, c,
                                                                          1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
      scatter_kernel<<<grid_for(c * pb.Lk * pb.Dv), kThreads, 0, stream>>>(dv, view4(g.dv), kv0, c,
                                                                           1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
      if (want_dbias) {
        dp.bh0 = kv0 * G;
        dp.heads = c * G;
        const dim3 grid(
            static_cast<unsigned>((pb.Lk + 31) / 32),
            static_cast<unsigned>(std::min<std::int64_t>(dp.db_B * dp.db_H * dp.db_Q, 65535)));
        dbias_kernel<<<grid, dim3(32, 8), 0, stream>>>(dP, dbias, dp);
        MEMEFF_LAUNCHED("dbias_kernel");
      }
    }
    if (want_dbias) {
      View4 db = view4(*g.dbias);
      const std::int64_t outer = dp.db_B * dp.db_H;
      scatter_kernel<<<grid_for(outer * db.L * db.W), kThreads, 0, stream>>>(dbias, db, 0, outer,
                                                                             1.f);
      MEMEFF_LAUNCHED("scatter_kernel");
    }
  }

 private:
  static void copy_inputs(const Problem& pb, const AttentionArgs& args, float* q, float* k,
                          float* v, cudaStream_t stream) {
    gather_kernel<<<grid_for(pb.B * pb.Hq * pb.Lq * pb.D), kThreads, 0, stream>>>(view4(args.q), q,
                                                                                  0, pb.B * pb.Hq);
    MEMEFF_LAUNCHED("gather_kernel");
    gather_kernel<<<grid_for(pb.B * pb.Hkv * pb.Lk * pb.D), kThreads, 0, stream>>>(
        view4(args.k), k, 0, pb.B * pb.Hkv);
    MEMEFF_LAUNCHED("gather_kernel");
    gather_kernel<<<grid_for(pb.B * pb.Hkv * pb.Lk * pb.Dv), kThreads, 0, stream>>>(
        view4(args.v), v, 0, pb.B * pb.Hkv);
    MEMEFF_LAUNCHED("gather_kernel");
  }

  static void zero(const TensorView& t, cudaStream_t stream) {
    const std::int64_t outer = t.shape[0] * t.shape[1];
    if (outer * t.shape[2] * t.shape[3] == 0) return;
    scatter_kernel<<<grid_for(outer * t.shape[2] * t.shape[3]), kThreads, 0, stream>>>(
        nullptr, view4(t), 0, outer, 1.f);
    MEMEFF_LAUNCHED("scatter_kernel (zero)");
  }

  static void empty_rows(const Problem& pb, const TensorView& out, const TensorView& lse,
                         cudaStream_t stream) {
    zero(out, stream);
    const std::int64_t n = pb.B * pb.Hq * pb.Lq;
    lse_fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<float*>(lse.data), lse.stride[0], lse.stride[1], pb.Hq, pb.Lq, n, -INFINITY);
    MEMEFF_LAUNCHED("lse_fill_kernel");
  }
};

}  // namespace

std::shared_ptr<Backend> make_cuda_math_backend() { return std::make_shared<CudaMathBackend>(); }

}  // namespace memeff::detail
