#pragma once
// Matrix products with bfloat16 operands and float32 results, for the tiles of attention in
// bfloat16 (issue 26's building block): C (float) = or += A (bfloat16) · B (bfloat16).
//
// Where the CPU has AVX512_BF16 the products run on VDPBF16PS (two bf16 products into each float
// lane, twice the float32 FMA's rate) through libxsmm's JIT kernels (Debian's libxsmm-dev, which
// emits them for "cpx" and later targets); elsewhere, or when a test forces it, the operands are
// widened to float and multiplied by the float32 panel micro-kernel (mha/core/panel_gemm.h). Both
// paths compute every product exactly (a bf16 × bf16 product fits a float) and add them in float:
// they differ only in the order of the float additions.
//
// B is packed once per matrix (a kv head's keys or values) into the pair layout VDPBF16PS reads
// (libxsmm's "VNNI" layout): rows kk and kk + 1 interleaved, B[kk][c] at
// packed[(kk / 2)·2n + 2c + kk % 2], k rounded up to even with a zero row. A is any row-major
// bfloat16 matrix (a row stride, no copy).
#include <cstddef>

#include "mha/core/half.h"

namespace mha::bf16_gemm {

// bfloat16s that pack_b and pack_b_transposed write for a k × n B.
size_t packed_size(size_t k, size_t n);

// B = X, X k × n (row stride ld) / B = Xᵀ, X n × k (row stride ld): packed into dst
// (packed_size(k, n) elements).
void pack_b(const bfloat16* x, size_t ld, size_t k, size_t n, bfloat16* dst);
void pack_b_transposed(const bfloat16* x, size_t ld, size_t n, size_t k, bfloat16* dst);

// C[r][c] (row stride ldc, n columns) = (accumulate: C[r][c] +) Σ_kk A[r][kk]·B[kk][c], A m × k
// (row stride lda), B packed by pack_b or pack_b_transposed for ldb ≥ n columns. B may be a block
// of a larger packed matrix: its rows from an even row kk0 and its columns from c0 are at
// b_packed + kk0·ldb + 2·c0. (An odd lda takes the float32 path: the bf16 kernels read A's rows
// in pairs.)
void multiply(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b_packed, size_t ldb,
              float* c, size_t ldc, bool accumulate);

// Whether multiply runs on the CPU's bf16 instructions (false: the float32 fallback).
bool native();

// Forces the float32 fallback while it lives (tests of the path a CPU without AVX512_BF16 takes);
// not thread-safe against concurrent multiply calls.
class ScopedFloat32Fallback {
 public:
  ScopedFloat32Fallback();
  ~ScopedFloat32Fallback();
  ScopedFloat32Fallback(const ScopedFloat32Fallback&) = delete;
  ScopedFloat32Fallback& operator=(const ScopedFloat32Fallback&) = delete;

 private:
  bool saved_;
};

}  // namespace mha::bf16_gemm
