// After mha's first BLAS call, OpenBLAS runs kernels for this CPU, not the generic fallback
// ("Prescott") it picks for CPU models newer than itself (src/core/blas_setup.h).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>

#include "mha/core/gemm.h"

namespace {

TEST(BlasSetup, OpenBlasUsesKernelsForThisCpu) {
  using CoreName = char* (*)();
  auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!corename) GTEST_SKIP() << "the BLAS is not OpenBLAS";
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2: the generic kernels are right here";
#else
  GTEST_SKIP() << "not x86: OpenBLAS's own choice of kernels stands (blas_setup.cpp)";
#endif
  const float a[4] = {1, 2, 3, 4};
  float c[4] = {};
  mha::gemm<float>(mha::Transpose::no, mha::Transpose::no, 2, 2, 2, 1.0f, a, 2, a, 2, 0.0f, c, 2);
  EXPECT_EQ(c[0], 7.0f);  // [1 2; 3 4]² = [7 10; 15 22]
  EXPECT_EQ(c[3], 22.0f);
  EXPECT_STRNE(corename(), "Prescott");
}

}  // namespace
