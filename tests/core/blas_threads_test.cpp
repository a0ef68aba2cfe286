// One thread pool (mha/core/blas_threads.h): the build links OpenBLAS's OpenMP build when CMake
// found it, and the thread guards never change OpenMP's own thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include "mha/core/blas_threads.h"
#include "mha/core/gemm.h"

namespace {

TEST(BlasThreads, LinkedOpenBlasRunsOnOpenMpThreads) {
#ifdef MHA_OPENBLAS_OPENMP
  EXPECT_EQ(mha::blas_threading(), mha::BlasThreading::openmp)
      << "CMake linked " MHA_OPENBLAS_OPENMP " but OpenBLAS reports " << mha::to_string(mha::blas_threading());
#else
  GTEST_SKIP() << "this build links another BLAS than OpenBLAS's OpenMP build";
#endif
}

// With the OpenMP build, openblas_set_num_threads(n) is omp_set_num_threads(n) for the whole
// process; the guards must not call it, or every kernel of mha would run on one thread after them.
TEST(BlasThreads, GuardsLeaveOpenMpThreadCountAlone) {
  if (mha::blas_threading() != mha::BlasThreading::openmp) GTEST_SKIP() << "not the OpenMP build";
  omp_set_num_threads(2);
  {
    const mha::SingleThreadedBlas guard;
    EXPECT_EQ(omp_get_max_threads(), 2);
    const float a[4] = {1, 2, 3, 4};
    float c[4] = {};
    mha::gemm<float>(mha::Transpose::no, mha::Transpose::no, 2, 2, 2, 1.0f, a, 2, a, 2, 0.0f, c, 2);
    EXPECT_EQ(c[0], 7.0f);  // [[1, 2], [3, 4]]²
    EXPECT_EQ(c[3], 22.0f);
  }
  EXPECT_EQ(omp_get_max_threads(), 2);
  mha::keep_blas_single_threaded();
  EXPECT_EQ(omp_get_max_threads(), 2);
}

TEST(BlasThreads, NamesTheThreading) {
  EXPECT_EQ(mha::to_string(mha::BlasThreading::openmp), "openmp");
  EXPECT_EQ(mha::to_string(mha::BlasThreading::pthreads), "pthreads");
  EXPECT_EQ(mha::to_string(mha::BlasThreading::sequential), "sequential");
}

}  // namespace
