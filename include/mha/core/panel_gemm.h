#pragma once
// The float matrix product of mha's kernels: a Highway micro-kernel (6 rows × 4 vectors on
// AVX-512, 6 × 2 on AVX2/SSE4; dispatched at run time, pinned by mha/core/simd.h) over B stored
// in column panels, plus the packers that put a matrix in panel form. The cpu_flash attention
// backend runs all six of its products on it; PackedLinear (below) runs y = x·Wᵀ + b on it with W
// packed once, for inference, where a BLAS call would pack W again on every call (measured: that
// repacking halves sgemm's rate at the few rows of one sentence).
//
//   C[m × n] (+)= A[m × k] · B[k × n]
//
// A is any row-major matrix (a row stride, no copy). B is read in column panels of
// panel_width() = W floats: within a panel, row kk is W contiguous floats, so the micro-kernel
// streams B with whole-vector loads while it broadcasts A one element at a time. A packed
// matrix (pack_rows, pack_transposed) stores its panels one after the other; a row-major tile
// is already in panel form (panel p starts at column p·W, rows keep the tile's stride).
//
// Every function here has the same contract on every target; only W and the speed differ. Each
// element of C is summed over k in the same order whatever the target's W, so results depend
// on the target (vector width, FMA) but never on threads.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "mha/core/half.h"
#include "mha/core/tensor.h"
#include "mha/core/view.h"

namespace mha::panel_gemm {

// A[r][kk] = data[r·stride + kk].
struct MatrixA {
  const float* data;
  size_t stride;
};

// B[kk][p·W + c − first_column] = data[p·panel_stride + kk·stride + c], 0 <= c < W: B's columns
// start at column first_column of the first panel, a multiple of panel_step() below W (a band of
// keys that starts inside a packed panel).
struct PanelsB {
  const float* data;
  size_t stride;
  size_t panel_stride;
  size_t first_column = 0;
};

// C[r][c] = data[r·stride + c].
struct MatrixC {
  float* data;
  size_t stride;
};

// Floats per B panel on the chosen target: 64 with AVX-512 (6 × 4 vectors micro-kernel), 16 with
// AVX2, 8 with SSE4 (6 × 2), 2 for scalar code. Always a divisor of 64.
size_t panel_width();
// The columns of one vector on the chosen target (W / 4 with AVX-512, W / 2 with AVX2 and SSE4, 1
// for scalar code): where PanelsB::first_column may start.
size_t panel_step();

// C = A·B, or C += A·B when `accumulate`. The micro-kernel writes whole vectors: every row of C
// must have room for n rounded up to a multiple of W; the extra columns get A·(B's extra
// columns), so B must hold finite numbers there (the packers write zeros), and then an
// accumulating C keeps its values in them.
void multiply(size_t m, size_t n, size_t k, MatrixA a, PanelsB b, MatrixC c, bool accumulate);

// Panel layouts (panel_stride = k·W, columns beyond n zero-filled up to the panel's end):
//   pack_rows:       B = X,  X is k × n (row stride ld);  dst[p·k·W + kk·W + c] = X[kk][p·W + c]
//   pack_transposed: B = Xᵀ, X is n × k (row stride ld);  dst[p·k·W + kk·W + c] = X[p·W + c][kk]
// dst must hold round_up(n, W)·k floats. X may be bfloat16 or float16 (a KV cache's), widened to
// float as it is packed: the packing is where a half-precision operand becomes float, never a
// float copy of the whole of it.
void pack_rows(const float* x, size_t ld, size_t k, size_t n, float* dst);
void pack_transposed(const float* x, size_t ld, size_t n, size_t k, float* dst);
void pack_rows(const bfloat16* x, size_t ld, size_t k, size_t n, float* dst);
void pack_rows(const float16* x, size_t ld, size_t k, size_t n, float* dst);
void pack_transposed(const bfloat16* x, size_t ld, size_t n, size_t k, float* dst);
void pack_transposed(const float16* x, size_t ld, size_t n, size_t k, float* dst);

// W (out_features, in_features) row-major, as torch.nn.Linear stores it, packed once as Wᵀ's
// panels for the SIMD target chosen at packing time.
class PackedLinear {
 public:
  PackedLinear() = default;
  // weight: contiguous (out_features, in_features); bias: undefined or (out_features).
  // Throws mha::Error naming `what` and the argument on a bad shape.
  PackedLinear(View<const float> weight, View<const float> bias, const std::string& what = "PackedLinear");

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // panel_width() when packed: forward needs the SIMD target's panels to be this wide.
  size_t packed_width() const { return width_; }

  // Called for each row of each block of y that a thread has finished: `values` are y[row][col,
  // col + count) in float, the bias added, before they are stored; it may rewrite them (an
  // activation, a residual added) on the thread that computed them, while they are in cache.
  // The same contract as bf16_gemm::PackedLinear's (there `values` are a float tile, stored in
  // bfloat16 after it), so a layer runs either one.
  using Epilogue = std::function<void(int64_t row, int64_t col, float* values, int64_t count)>;

  // y (M, out_features) = x (M, in_features) · Wᵀ + bias, both contiguous; y is overwritten,
  // then `epilogue` (if any) runs on each row of each block. Rows and panels are split between OpenMP
  // threads; every element is computed by one thread in a fixed order, so the result is bitwise
  // the same for any thread count. Throws mha::Error when the shapes do not match or the SIMD
  // target changed since packing.
  void forward(View<const float> x, View<float> y, const Epilogue& epilogue = {}) const;
  Tensor<float> forward(View<const float> x) const;

 private:
  int64_t in_ = 0, out_ = 0;
  size_t width_ = 0;      // panel_width() when packed
  Tensor<float> panels_;  // round_up(out, W) · in floats
  Tensor<float> bias_;    // (out) or undefined
  std::string what_;
};

}  // namespace mha::panel_gemm
