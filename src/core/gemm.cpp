#include "mha/core/gemm.h"

#include <cblas.h>

#include <limits>

#include "blas_setup.h"
#include "mha/core/error.h"

namespace mha {
namespace {

CBLAS_TRANSPOSE to_cblas(Transpose t) { return t == Transpose::yes ? CblasTrans : CblasNoTrans; }

// BLAS takes int (blasint) sizes; refuse sizes it cannot represent rather than wrap them.
int blas_int(int64_t v, const char* what) {
  check(v >= 0 && v <= std::numeric_limits<int>::max(), "gemm: ", what,
        " must fit in a BLAS int, got ", v);
  return static_cast<int>(v);
}

}  // namespace

template <>
void gemm<float>(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (m == 0 || n == 0) return;
  detail::choose_blas_kernels();
  cblas_sgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), blas_int(m, "m"), blas_int(n, "n"),
              blas_int(k, "k"), alpha, a, blas_int(std::max<int64_t>(lda, 1), "lda"), b,
              blas_int(std::max<int64_t>(ldb, 1), "ldb"), beta, c, blas_int(ldc, "ldc"));
}

template <>
void gemm<double>(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                  double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  detail::choose_blas_kernels();
  cblas_dgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), blas_int(m, "m"), blas_int(n, "n"),
              blas_int(k, "k"), alpha, a, blas_int(std::max<int64_t>(lda, 1), "lda"), b,
              blas_int(std::max<int64_t>(ldb, 1), "ldb"), beta, c, blas_int(ldc, "ldc"));
}

}  // namespace mha
