// What a fused kernel family (sm80/, sm90/) offers the fused backend (src/cuda/backends/
// fused_backend.h), each as a struct `Family` of static functions in its own namespace:
//
//   static constexpr const char* kBackend;             // the backend's name ("cuda")
//   static constexpr bool kScoreModifiers;             // runs window, ALiBi, softcap (ScoreMods)
//   static std::vector<std::string> forward_reasons(const ForwardParams&, const DeviceCaps&);
//   static std::vector<std::string> backward_reasons(const BackwardParams&, const DeviceCaps&);
//   static std::size_t forward_workspace_bytes(const ForwardParams&);
//   static std::size_t backward_workspace_bytes(const BackwardParams&);
//   static void forward(const ForwardParams&, void* workspace, ElemType, const DeviceCaps&,
//                       cudaStream_t);
//   static void backward(const BackwardParams&, void* workspace, ElemType, const DeviceCaps&,
//                        cudaStream_t);
//
// Reasons take params filled from the problem alone (null pointers pass) or from the views; an
// empty list means the family runs them. forward and backward take non-empty problems whose
// params passed the reasons; each pass's workspace holds its *_workspace_bytes, 16-byte aligned
// (null where that is 0). Packed calls are told apart by their params (packed_layout in
// common/varlen.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "cuda/kernels/common/params.h"
#include "cuda/kernels/common/reasons.h"
