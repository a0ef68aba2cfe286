#pragma once
// gemm: C = alpha * op(A) * op(B) + beta * C on row-major matrices, through BLAS
// (sgemm/dgemm). op(X) is X or its transpose. A is (M, K) after op, B is (K, N), C is (M, N);
// lda/ldb/ldc are the row strides of the matrices as stored.
#include <cstdint>

namespace mha {

enum class Transpose { no, yes };

template <class T>
void gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, T alpha,
          const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace mha
