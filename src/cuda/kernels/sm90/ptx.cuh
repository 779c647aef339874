// The Hopper (sm_90a) instructions the sm90 kernels are built from, as thin inline-PTX wrappers:
// mbarriers (arrive, expect-tx, parity wait), the tensor memory accelerator (TMA: 4-d tiled loads
// into shared memory completing on an mbarrier), bulk reductions, proxy fences, named barriers,
// setmaxnreg, the wgmma fence / commit / wait and the shared-memory matrix descriptors wgmma reads
// its operands through.
//
// Shared-memory tiles are stored the way TMA's 128-byte swizzle writes them: rows of 64 16-bit
// elements (128 bytes), 16-byte chunk c of row r at chunk c ^ (r % 8), tiles 1024-byte aligned.
// That is wgmma's canonical "128B swizzle" layout in both operand orientations:
//   K-major (Q, K: the reduction dimension is contiguous): 8-row groups 1024 bytes apart (SBO);
//     the k16 step s inside a 64-column block starts 32·s bytes in.
//   MN-major (V for P·V: N = head dim is contiguous): 8-row (k) groups 1024 bytes apart (SBO),
//     64-column blocks of N `block_bytes` apart (LBO).
#pragma once

#include <cstdint>

namespace memeff::cuda::sm90 {

// ---- mbarrier ------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Arrives and announces `bytes` of asynchronous transactions (TMA) the phase must also wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Waits until the phase with the given parity has completed. A freshly initialized barrier is in
// phase 0, so waiting for parity 1 returns at once (how producers see empty buffers as free).
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- TMA -----------------------------------------------------------------------------------
// Loads the box at element coordinates (c0 innermost .. c3) of the tensor map into shared memory
// at `dst` and completes `bytes`-worth of transactions on `bar`. Out-of-bounds elements are zero.
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, const void* tensor_map,
                                            std::uint32_t bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(tensor_map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(tensor_map))
               : "memory");
}

// ---- bulk reductions (no tensor map) -------------------------------------------------------
// Adds `bytes` of fp32 values in shared memory element-wise into global memory (one asynchronous
// bulk reduction, performed in L2); grouped by bulk_commit and waited for with bulk_wait*.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, std::uint32_t src,
                                                    std::uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                   reinterpret_cast<std::uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Waits until at most kPending bulk groups may still read their shared-memory source.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// Waits until at most kPending bulk groups are incomplete (their writes performed).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

// ---- reductions into global memory ---------------------------------------------------------
// Adds four fp32 values to dst[0..3] (16-byte aligned global memory) in one reduction performed
// in L2, returning nothing (sm_90; atomicAdd on a float4 compiles to an atom that returns the old
// values into registers).
__device__ __forceinline__ void red_add_f32x4(float* dst, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}
// Orders this thread's ordinary shared-memory writes before later asynchronous-proxy accesses
// (wgmma operand reads, bulk copies) of the same memory.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The same for global memory: orders asynchronous-proxy writes (bulk reductions) the thread has
// waited for with its later ordinary accesses, and the other way round.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// ---- ordered flags in global memory (the deterministic backward's turn counters) -------------
__device__ __forceinline__ int ld_acquire(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* ptr, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}
// Relaxed accesses at gpu scope: values polled for themselves, ordering nothing else (the
// forward walk's item slots).
__device__ __forceinline__ int ld_relaxed(const int* ptr) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(int* ptr, int v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}
// Raises *ptr to at least v with release semantics: a counter that never goes back, for turn
// counters that several writers may share (packed calls with unchecked, overlapping offsets).
__device__ __forceinline__ void red_release_max(int* ptr, int v) {
  asm volatile("red.release.gpu.global.max.s32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}

// ---- named barriers and register reallocation ----------------------------------------------
// bar.sync waits for `threads` arrivals (its own warp's included); bar.arrive only arrives.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- wgmma ordering ------------------------------------------------------------------------
// Orders this thread's earlier register writes before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Tells the compiler the registers may have changed here (an async wgmma wrote them), so no read
// of them moves above the wait that precedes this.
template <int kRows, int kCols>
__device__ __forceinline__ void fence_operands(float (&r)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
}
template <int kRows, int kCols>
__device__ __forceinline__ void fence_operands(std::uint32_t (&r)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// ---- shared-memory matrix descriptors ------------------------------------------------------
// 128-byte swizzle; start address, leading and stride byte offsets in 16-byte units (bits 0-13,
// 16-29, 32-45), swizzle mode 1 in bits 62-63. Base offset 0: tiles are 1024-byte aligned.
__device__ __forceinline__ std::uint64_t smem_desc_sw128(std::uint32_t addr,
                                                         std::uint32_t leading_bytes,
                                                         std::uint32_t stride_bytes) {
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) |
         (static_cast<std::uint64_t>((leading_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<std::uint64_t>((stride_bytes >> 4) & 0x3FFFu) << 32) |
         (std::uint64_t{1} << 62);
}
// The same descriptor moved `bytes` (a multiple of 16) further into shared memory.
__device__ __forceinline__ std::uint64_t desc_advance(std::uint64_t desc, std::uint32_t bytes) {
  return desc + (bytes >> 4);
}

}  // namespace memeff::cuda::sm90
