// Shared pieces of the CUDA backends (see backend_util.h).
#include "cuda/backend_util.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/sm80/fwd_dispatch.cuh"
#include "memeff/error.h"

namespace memeff::detail {

void check(cudaError_t err, const char* what) { cuda::check_cuda(err, what); }

DeviceScope::DeviceScope(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    switched_ = true;
  }
}

DeviceScope::~DeviceScope() {
  if (switched_) cudaSetDevice(previous_);
}

ComputeCapability compute_capability(int device) {
  static std::mutex mutex;
  static std::map<int, ComputeCapability> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  ComputeCapability cc;
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err == cudaSuccess) {
    cc.major = prop.major;
    cc.minor = prop.minor;
    cc.multiprocessors = prop.multiProcessorCount;
    cc.name = prop.name;
    // A device newer than every target of the build runs it only through the PTX; a device
    // older than compute_80 (or a build without PTX) has nothing to load.
    int previous = 0;
    cudaError_t image = cudaGetDevice(&previous);
    if (image == cudaSuccess) image = cudaSetDevice(device);
    if (image == cudaSuccess) image = cuda::probe_kernel_image();
    cudaSetDevice(previous);
    // Only "nothing to load" refuses; another failure of the probe leaves the decision to the
    // kernels' own launch checks.
    cc.ok = image != cudaErrorNoKernelImageForDevice && image != cudaErrorInvalidDeviceFunction &&
            image != cudaErrorUnsupportedPtxVersion && image != cudaErrorInvalidPtx;
    if (!cc.ok) {
      cudaGetLastError();
      cc.error = "this build has no device code for " + std::string(prop.name) +
                 " (compute capability " + std::to_string(prop.major) + "." +
                 std::to_string(prop.minor) + "): " + cudaGetErrorString(image) +
                 "; rebuild with CMAKE_CUDA_ARCHITECTURES (or TORCH_CUDA_ARCH_LIST) covering it";
    }
  } else {
    cudaGetLastError();  // clear the (non-sticky) error so later launches are not blamed
    cc.error = std::string("cudaGetDeviceProperties(") + std::to_string(device) +
               "): " + cudaGetErrorString(err);
  }
  cache.emplace(device, cc);
  return cc;
}

cuda::ElemType elem_type(DType dtype) {
  return dtype == DType::bf16 ? cuda::ElemType::bf16 : cuda::ElemType::fp16;
}

cuda::Strides strides_of(const TensorView& t) {
  if (t.rank == 3) {  // packed [total, H, last]: sequence b adds its first row (params.h)
    return cuda::Strides{0, t.shape[1] == 1 ? 0 : t.stride[1], t.stride[0]};
  }
  // Broadcast (size-1) dimensions read index 0 only: stride 0 keeps the kernels' math uniform.
  return cuda::Strides{t.shape[0] == 1 ? 0 : t.stride[0], t.shape[1] == 1 ? 0 : t.stride[1],
                       t.shape[2] == 1 ? 0 : t.stride[2]};
}

void fill_from_problem(cuda::ForwardParams& p, const Problem& pb) {
  p.B = static_cast<int>(pb.B);
  p.Hq = static_cast<int>(pb.Hq);
  p.Hkv = static_cast<int>(pb.Hkv);
  p.group = pb.Hkv > 0 ? static_cast<int>(pb.Hq / pb.Hkv) : 1;
  p.Lq = pb.Lq;
  p.Lk = pb.Lk;
  p.D = static_cast<int>(pb.D);
  p.Dv = static_cast<int>(pb.Dv);
  p.bias_is_fp32 = pb.has_bias && pb.bias_dtype == DType::f32;
  p.scale = static_cast<float>(pb.scale);
  p.scale_log2 = static_cast<float>(pb.scale * 1.4426950408889634);
  p.causal = pb.causal == CausalMode::none ? 0 : (pb.causal == CausalMode::top_left ? 1 : 2);
  p.causal_shift = pb.causal_shift();
  p.has_dropout = pb.has_dropout();
  p.keep_threshold = pb.dropout.threshold;
  p.keep_scale = static_cast<float>(pb.dropout.keep_scale);
  p.total_q = pb.total_q;  // packed calls (the offsets' pointers come with the views)
  p.total_k = pb.total_k;
  p.q_start = static_cast<std::uint32_t>(pb.q_start);         // < 2^32 (validation)
  p.k_block64 = static_cast<std::uint32_t>(pb.k_start / 64);  // exact where it matters (reasons)
  p.kv_block = pb.kv_block;
}

void fill_from_views(cuda::ForwardParams& p, const AttentionArgs& args, const TensorView& out,
                     const TensorView& lse) {
  p.q = args.q.data;
  p.k = args.k.data;
  p.v = args.v.data;
  p.out = out.data;
  p.lse = static_cast<float*>(lse.data);
  p.q_stride = strides_of(args.q);
  p.k_stride = strides_of(args.k);
  p.v_stride = strides_of(args.v);
  p.out_stride = strides_of(out);
  if (args.packed) {  // lse [Hq, total_q]: rows are contiguous, sequence b adds its first row
    p.lse_stride_b = 0;
    p.lse_stride_h = lse.shape[0] == 1 ? 0 : lse.stride[0];
    p.cu_seqlens_q = static_cast<const int*>(args.packed->cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const int*>(args.packed->cu_seqlens_k.data);
    p.total_q = args.q.shape[0];
    p.total_k = args.k.shape[0];
  } else {
    p.lse_stride_b = lse.shape[0] == 1 ? 0 : lse.stride[0];
    p.lse_stride_h = lse.shape[1] == 1 ? 0 : lse.stride[1];
  }
  if (args.bias) {
    p.bias = args.bias->data;
    p.bias_stride = strides_of(*args.bias);
  }
  p.seed = args.rng.seed;
  p.offset = args.rng.offset;
  p.seed_ptr = args.rng.device_seed;
  p.offset_ptr = args.rng.device_offset;
}

namespace {

cuda::FillKind fill_kind(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return cuda::FillKind::bf16;
    case DType::f16:
      return cuda::FillKind::f16;
    default:
      return cuda::FillKind::f32;
  }
}

void fill_view(const TensorView& t, float value, cudaStream_t stream) {
  if (!t.defined() || t.numel() == 0) return;
  std::int64_t shape[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 1};
  const int pad = 4 - t.rank;  // views of rank < 4 (lse) get leading unit dimensions
  for (int d = 0; d < t.rank; ++d) {
    shape[pad + d] = t.shape[d];
    stride[pad + d] = t.stride[d];
  }
  if (shape[3] > 1 && stride[3] != 1) {
    throw Error(ErrorCode::internal,
                "fill_view: last dimension of " + t.describe() + " is not contiguous");
  }
  cuda::fill_strided(t.data, fill_kind(t.dtype), shape, stride, value, stream);
}

}  // namespace

void fill_dbias_shape(cuda::BackwardParams& p, const Problem& pb) {
  if (!pb.has_bias) return;
  p.dbias_shape[0] = pb.bias_bcast_b ? 1 : static_cast<int>(pb.B);
  p.dbias_shape[1] = pb.bias_bcast_h ? 1 : static_cast<int>(pb.Hq);
  p.dbias_shape[2] = pb.bias_bcast_q ? 1 : static_cast<int>(pb.Lq);
}

cuda::BackwardParams backward_params(const Problem& pb, const AttentionArgs& args,
                                     const BackwardTensors& g, const Options& options) {
  cuda::BackwardParams p;
  fill_from_problem(p, pb);
  fill_from_views(p, args, g.out, g.lse);
  p.dout = g.dout.data;
  p.dq = g.dq.data;
  p.dk = g.dk.data;
  p.dv = g.dv.data;
  p.dout_stride = strides_of(g.dout);
  p.dq_stride = strides_of(g.dq);
  p.dk_stride = strides_of(g.dk);
  p.dv_stride = strides_of(g.dv);
  if (g.dbias) {
    p.dbias = g.dbias->data;
    p.dbias_stride = strides_of(*g.dbias);
    for (int d = 0; d < 3; ++d) p.dbias_shape[d] = static_cast<int>(g.dbias->shape[d]);
  }
  p.deterministic = options.deterministic;
  return p;
}

void check_packed_offsets(const AttentionArgs& args, const Problem& pb, cudaStream_t stream) {
  if (!pb.packed || !args.packed->check_offsets) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;  // no synchronization inside a capture
  const std::size_t n = static_cast<std::size_t>(pb.B) + 1;
  std::vector<std::int32_t> host(2 * n);
  check(cudaMemcpyAsync(host.data(), args.packed->cu_seqlens_q.data, n * sizeof(std::int32_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(cu_seqlens_q to the host)");
  check(cudaMemcpyAsync(host.data() + n, args.packed->cu_seqlens_k.data,
                        n * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(cu_seqlens_k to the host)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(reading cu_seqlens)");
  validate_packed_offsets(host.data(), host.data() + n, pb);
}

bool backward_empty_edges(const Problem& pb, const BackwardTensors& g, cudaStream_t stream) {
  if (pb.B == 0 || pb.Hq == 0) return true;
  if (pb.Lk == 0 || pb.Lq == 0) {
    // No keys or no queries: every gradient is zero. Dense, the side without rows is empty;
    // packed (Lq and Lk are the maximum lengths), the other side's rows still need their zeros.
    fill_view(g.dq, 0.0f, stream);
    fill_view(g.dk, 0.0f, stream);
    fill_view(g.dv, 0.0f, stream);
    if (g.dbias) fill_view(*g.dbias, 0.0f, stream);
    return true;
  }
  return false;
}

StreamWorkspace::StreamWorkspace(const char* backend, std::size_t needed, const Options& options,
                                 cudaStream_t stream)
    : data_(options.workspace), stream_(stream) {
  if (needed == 0) return;
  if (data_ != nullptr) {
    if (options.workspace_bytes < needed) {
      throw Error(ErrorCode::invalid_argument,
                  std::string("argument `workspace_bytes`: the ") + backend + " backward needs " +
                      std::to_string(needed) + " bytes of workspace, got " +
                      std::to_string(options.workspace_bytes));
    }
    if ((reinterpret_cast<std::uintptr_t>(data_) & 15u) != 0) {
      throw Error(ErrorCode::invalid_argument,
                  "argument `workspace`: expected a 16-byte aligned pointer");
    }
    return;
  }
  const cudaError_t err = cudaMallocAsync(&data_, needed, stream);
  if (err != cudaSuccess) {
    data_ = nullptr;
    check(err, (std::string("cudaMallocAsync(") + backend + " backward workspace)").c_str());
  }
  owned_ = true;
}

void StreamWorkspace::release() {
  if (!owned_) return;
  owned_ = false;
  check(cudaFreeAsync(data_, stream_), "cudaFreeAsync(backward workspace)");
}

StreamWorkspace::~StreamWorkspace() {
  if (owned_) cudaFreeAsync(data_, stream_);
}

std::vector<std::string> fused_kernel_reasons(const Problem& pb, ComputeCapability& cc) {
  std::vector<std::string> reasons;
  if (pb.device.type != DeviceType::cuda) {
    reasons.push_back("tensors are on " + device_name(pb.device) + ", not a CUDA device");
    cc.ok = false;
    return reasons;
  }
  if (pb.dtype == DType::f32) {
    reasons.push_back("fp32 inputs: use cuda_math (the fused kernels take fp16/bf16)");
  } else if (pb.dtype != DType::f16 && pb.dtype != DType::bf16) {
    reasons.push_back(std::string(dtype_name(pb.dtype)) +
                      " inputs: the fused kernels take fp16/bf16");
  }
  if (!pb.vector_aligned) {
    reasons.push_back(
        "tensors not 16-byte aligned (pointers, or B/H/L strides not multiples of 16 bytes)");
  }
  if (pb.has_bias && pb.bias_dtype != DType::f32 && pb.bias_dtype != pb.dtype) {
    reasons.push_back(std::string("bias dtype ") + dtype_name(pb.bias_dtype) +
                      ": must be fp32 or the dtype of q");
  }
  if (pb.has_dropout() && pb.k_start % 64 != 0) {
    reasons.push_back("k_start " + std::to_string(pb.k_start) +
                      " with dropout: the fused kernels draw the mask in whole 64-key blocks of "
                      "the global keys, so k_start must be a multiple of 64 (cuda_math takes any)");
  }
  cc = compute_capability(pb.device.index);
  if (!cc.ok) reasons.push_back(cc.error);
  return reasons;
}

double CudaBackendBase::time_ms(const Problem& problem, const Options& options,
                                const std::function<void()>& run) {
  DeviceScope device(problem.device.index);
  const auto stream = static_cast<cudaStream_t>(options.stream);
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate while autotuning");
  const cudaError_t created = cudaEventCreate(&stop);
  if (created != cudaSuccess) cudaEventDestroy(start);
  check(created, "cudaEventCreate while autotuning");
  struct Events {
    cudaEvent_t a, b;
    ~Events() {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  } events{start, stop};
  check(cudaEventRecord(start, stream), "cudaEventRecord while autotuning");
  run();
  check(cudaEventRecord(stop, stream), "cudaEventRecord while autotuning");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize while autotuning");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime while autotuning");
  return static_cast<double>(ms);
}

std::string CudaBackendBase::device_label(Device device) const {
  if (device.type != DeviceType::cuda) return Backend::device_label(device);
  const ComputeCapability cc = compute_capability(device.index);
  if (cc.name.empty()) return "cuda:" + std::to_string(device.index) + " (unknown GPU)";
  return cc.name + " sm_" + std::to_string(cc.major) + std::to_string(cc.minor);
}

}  // namespace memeff::detail
