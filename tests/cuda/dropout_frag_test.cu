// The kernels' dropout fragment helpers (S and Sᵀ orientations) against the host definition of
// the mask, element by element, on coordinates that include huge rows, heads and offsets.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/kernels/common/dropout_frag.cuh"
#include "memeff/dropout.h"

namespace {

struct Case {
  std::uint64_t seed, offset, bh, row0, block64;
  std::uint32_t threshold;
};

// One warp: lane writes its S bits (2 rows) and Sᵀ bits (one n8 query tile) for the case.
__global__ void frag_bits_kernel(Case c, std::uint32_t* s_bits, std::uint32_t* st_bits) {
  const int lane = threadIdx.x;
  const auto key = memeff::detail::dropout_key(c.seed, c.offset);
  const std::uint64_t g = lane >> 2;
  s_bits[2 * lane] = memeff::cuda::keep_bits_s(key, c.threshold, c.bh, c.row0 + g, c.block64, lane);
  s_bits[2 * lane + 1] =
      memeff::cuda::keep_bits_s(key, c.threshold, c.bh, c.row0 + g + 8, c.block64, lane);
  st_bits[lane] = memeff::cuda::keep_bits_st(key, c.threshold, c.bh, c.row0 & ~std::uint64_t{7},
                                             c.block64, lane);
}

bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(DropoutFragment, BothOrientationsMatchTheHostMask) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device";
  const Case cases[] = {
      {0, 0, 0, 0, 0, 230},
      {42, 7, 5, 17, 3, 128},
      {0xDEADBEEFCAFEF00Dull, 0xFFFFFFFFFFFFFFF0ull, 0xFFFFFFFFull, 0x7FFFFFF0ull, 0x3FFFFFFull, 26},
      {1, 1ull << 40, 1ull << 32, 0xFFFFFFE0ull, 1, 250},
  };
  std::uint32_t *d_s, *d_st;
  ASSERT_EQ(cudaMalloc(&d_s, 64 * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_st, 32 * 4), cudaSuccess);
  for (const Case& c : cases) {
    frag_bits_kernel<<<1, 32>>>(c, d_s, d_st);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<std::uint32_t> s(64), st(32);
    ASSERT_EQ(cudaMemcpy(s.data(), d_s, 64 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(st.data(), d_st, 32 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    // Heads are addressed through bh = b·heads + h: use heads = 1, b = bh.
    const double p = 1.0 - c.threshold / 256.0;
    auto keep = [&](std::uint64_t i, std::uint64_t j) {
      return memeff::dropout_keep(c.seed, c.offset, p, 1, static_cast<std::int64_t>(c.bh), 0,
                                  static_cast<std::int64_t>(i), static_cast<std::int64_t>(j));
    };
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int half = 0; half < 2; ++half) {
        for (int n = 0; n < 8; ++n) {
          for (int e = 0; e < 2; ++e) {
            const std::uint64_t i = c.row0 + g + 8 * half, j = c.block64 * 64 + 8 * n + 2 * t + e;
            EXPECT_EQ(((s[2 * lane + half] >> (2 * n + e)) & 1u) != 0, keep(i, j))
                << "S lane " << lane << " row " << i << " col " << j;
          }
        }
      }
      for (int m = 0; m < 4; ++m) {
        for (int h = 0; h < 2; ++h) {
          for (int e = 0; e < 2; ++e) {
            const std::uint64_t j = c.block64 * 64 + 16 * m + 8 * h + g;
            const std::uint64_t i = (c.row0 & ~std::uint64_t{7}) + 2 * t + e;
            EXPECT_EQ(((st[lane] >> (8 * e + 2 * m + h)) & 1u) != 0, keep(i, j))
                << "S^T lane " << lane << " query " << i << " key " << j;
          }
        }
      }
    }
  }
  cudaFree(d_s);
  cudaFree(d_st);
}

}  // namespace
