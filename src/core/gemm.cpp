#include "mha/core/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "blas_setup.h"
#include "mha/core/bf16_gemm.h"
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

template <>
void gemm<bfloat16>(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, bfloat16 alpha,
                    const bfloat16* a, int64_t lda, const bfloat16* b, int64_t ldb, bfloat16 beta, bfloat16* c,
                    int64_t ldc) {
  check(m >= 0 && n >= 0 && k >= 0, "gemm: expected sizes >= 0, got m = ", m, ", n = ", n, ", k = ", k);
  if (m == 0 || n == 0) return;
  const float fa = to_float(alpha), fb = to_float(beta);
  if (k == 0) {  // no products: C = beta·C (BLAS ignores C when beta is 0)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = to_bfloat16(fb == 0.0f ? 0.0f : fb * to_float(c[r * ldc + j]));
    return;
  }
  const auto M = static_cast<size_t>(m), N = static_cast<size_t>(n), K = static_cast<size_t>(k);
  // op(A) row-major with an even stride (the bf16 kernels read its rows in pairs).
  std::vector<bfloat16> a_copy;
  size_t a_stride = static_cast<size_t>(lda);
  if (ta == Transpose::yes) {
    a_stride = (K + 1) / 2 * 2;
    a_copy.assign(M * a_stride, bfloat16{0});
    for (size_t kk = 0; kk < K; ++kk)
      for (size_t r = 0; r < M; ++r) a_copy[r * a_stride + kk] = a[kk * static_cast<size_t>(lda) + r];
    a = a_copy.data();
  }
  std::vector<bfloat16> packed(bf16_gemm::packed_size(K, N));
  if (tb == Transpose::yes) bf16_gemm::pack_b_transposed(b, static_cast<size_t>(ldb), N, K, packed.data());
  else bf16_gemm::pack_b(b, static_cast<size_t>(ldb), K, N, packed.data());
  bf16_gemm::multiply_blocks(M, N, K, a, a_stride, packed.data(), N,
                             [&](int64_t row, int64_t col, const float* values, int64_t count) {
                               bfloat16* out = c + row * ldc + col;
                               for (int64_t j = 0; j < count; ++j)  // beta = 0 ignores C, as BLAS does (NaN there)
                                 out[j] = to_bfloat16(fb == 0.0f ? fa * values[j] : fa * values[j] + fb * to_float(out[j]));
                             });
}

// float16 has no faster instruction on the CPUs mha targets (no AVX512-FP16 here): the operands
// widened to float, sgemm, each element rounded once.
template <>
void gemm<float16>(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float16 alpha, const float16* a,
                   int64_t lda, const float16* b, int64_t ldb, float16 beta, float16* c, int64_t ldc) {
  check(m >= 0 && n >= 0 && k >= 0, "gemm: expected sizes >= 0, got m = ", m, ", n = ", n, ", k = ", k);
  if (m == 0 || n == 0) return;
  const int64_t a_rows = ta == Transpose::no ? m : k, b_rows = tb == Transpose::no ? k : n;
  auto widened = [](const float16* x, int64_t rows, int64_t ld) {
    std::vector<float> out(static_cast<size_t>(rows * ld));
    convert(x, out.data(), out.size());
    return out;
  };
  const std::vector<float> a32 = widened(a, a_rows, lda), b32 = widened(b, b_rows, ldb);
  std::vector<float> c32(static_cast<size_t>(m * n));
  const float fb = to_float(beta);
  if (fb != 0.0f)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c32[static_cast<size_t>(r * n + j)] = to_float(c[r * ldc + j]);
  gemm<float>(ta, tb, m, n, k, to_float(alpha), a32.data(), lda, b32.data(), ldb, fb, c32.data(), n);
  for (int64_t r = 0; r < m; ++r) convert(c32.data() + r * n, c + r * ldc, static_cast<size_t>(n));
}

}  // namespace mha
