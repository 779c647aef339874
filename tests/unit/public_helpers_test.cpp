// Small public helpers the memeff program uses instead of private headers: element access by
// dtype (load_element / store_element) and the cpu backend's instruction set.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "memeff/backend.h"
#include "memeff/tensor.h"

namespace memeff {
namespace {

TEST(PublicHelpers, ElementsRoundTripAndRoundToTheirDtype) {
  std::uint64_t buffer[4] = {};
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    store_element(buffer, dtype, 3, -2.5);  // exact in every dtype
    EXPECT_EQ(load_element(buffer, dtype, 3), -2.5);
  }
  // 1 + 2^-9 lies halfway between two bf16 values: ties to the even one, 1.
  store_element(buffer, DType::bf16, 0, 1.0 + 0x1p-9);
  EXPECT_EQ(load_element(buffer, DType::bf16, 0), 1.0);
  // fp16 has 10 fraction bits: 1 + 2^-10 is exact, 1 + 2^-12 rounds to 1.
  store_element(buffer, DType::f16, 1, 1.0 + 0x1p-10);
  EXPECT_EQ(load_element(buffer, DType::f16, 1), 1.0 + 0x1p-10);
  store_element(buffer, DType::f16, 1, 1.0 + 0x1p-12);
  EXPECT_EQ(load_element(buffer, DType::f16, 1), 1.0);
}

TEST(PublicHelpers, CpuKernelIsaIsOneOfTheKnownSets) {
  const std::string isa = cpu_kernel_isa();
  EXPECT_TRUE(isa == "avx512" || isa == "avx2" || isa == "scalar") << isa;
}

}  // namespace
}  // namespace memeff
