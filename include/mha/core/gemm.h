#pragma once
// gemm: C = alpha * op(A) * op(B) + beta * C on row-major matrices, through BLAS
// (sgemm/dgemm). op(X) is X or its transpose. A is (M, K) after op, B is (K, N), C is (M, N);
// lda/ldb/ldc are the row strides of the matrices as stored.
//
// gemm<bfloat16> (the bfloat16 layers' products): op(B) packed in pairs and multiplied by
// bf16_gemm (VDPBF16PS where the CPU has AVX512_BF16, float products of the same values
// elsewhere), op(A) read in place (a transposed A is copied once); each element of C is
// alpha·Σ + beta·C in float, rounded once to bfloat16. Blocks of C are split between OpenMP
// threads the same way for any thread count: bitwise the same results. gemm<float16>: the
// operands widened to float, sgemm, each element rounded once (no float16 instruction here).
#include <cstdint>

#include "mha/core/half.h"

namespace mha {

enum class Transpose { no, yes };

template <class T>
void gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, T alpha,
          const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace mha
