// Host-side entry points of the fused CUDA kernels, called by the cuda and cuda_sm90 backends
// (src/cuda/cuda_backend.cpp, src/cuda/sm90_backend.cpp). They take the plain params structs,
// choose tile shapes and grids, launch on the given stream and check the launch. No API types cross this line.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "cuda/params.h"

namespace memeff::cuda {

enum class ElemType { bf16, fp16 };

// Forward: writes out and lse. src/cuda/launch/fwd_launch.cu
void launch_forward(const ForwardParams& params, ElemType type, cudaStream_t stream);
// Reasons the forward kernels cannot run these params (head dim, alignment ...); empty if they can.
std::vector<std::string> forward_unsupported(const ForwardParams& params, int sm_major, int sm_minor);

// The sm90 (Hopper) forward: writes out and lse like launch_forward. src/cuda/launch/sm90_fwd_launch.cu
// `multiprocessors`: the device's SM count, the persistent grid's size.
void launch_forward_sm90(const ForwardParams& params, ElemType type, int multiprocessors,
                         cudaStream_t stream);
// `packed`: a packed call whose params came from the Problem alone (params filled from views say
// so themselves: cu_seqlens_q set).
std::vector<std::string> sm90_forward_unsupported(const ForwardParams& params, int sm_major,
                                                  int sm_minor, bool packed = false);
// Whether this build compiled the sm90 kernels for sm_90a (else they are stubs).
bool sm90_kernels_built();
// Whether this build's device code loads on the current device: cudaSuccess when one of its
// kernel images (sm_80, sm_90a) or its PTX (compute_80, JIT-compiled by the driver) fits, else
// the error (cudaErrorNoKernelImageForDevice for a device none of them covers).
cudaError_t probe_kernel_image();

// The sm90 (Hopper) backward: writes dq, dk, dv and dbias like launch_backward, with its own
// workspace (sm90_backward_workspace_bytes, 16-byte aligned). src/cuda/launch/sm90_bwd_launch.cu
void launch_backward_sm90(const BackwardParams& params, void* workspace, ElemType type,
                          cudaStream_t stream);
// `packed` as for sm90_forward_unsupported; the workspace's layout depends on it.
std::size_t sm90_backward_workspace_bytes(const BackwardParams& params, bool packed = false);
std::vector<std::string> sm90_backward_unsupported(const BackwardParams& params, int sm_major,
                                                   int sm_minor, bool packed = false);

// Backward: writes dq, dk, dv and dbias. `workspace` holds backward_workspace_bytes(params)
// bytes (16-byte aligned); the launcher carves softmax_d, dq_accum and its other scratch from it.
// src/cuda/launch/bwd_launch.cu
void launch_backward(BackwardParams params, void* workspace, ElemType type, cudaStream_t stream);
std::size_t backward_workspace_bytes(const BackwardParams& params);
std::vector<std::string> backward_unsupported(const BackwardParams& params, int sm_major, int sm_minor);

}  // namespace memeff::cuda
