#pragma once
// Matrix products with bfloat16 operands and float32 results, for the tiles of attention in
// bfloat16 (issue 26's building block): C (float) = or += A (bfloat16) · B (bfloat16).
//
// Where the CPU has AMX-BF16 (Intel Sapphire Rapids on) the products run on its tiles
// (TDPBF16PS: a 16 × 32 by 32 × 16 bf16 product per instruction); where it has AVX512_BF16 without
// them (AMD Zen 4, Intel Cooper Lake), on VDPBF16PS (two bf16 products into each float lane, twice
// the float32 FMA's rate on Zen 4) through libxsmm's JIT kernels (Debian's libxsmm-dev 1.17, which
// emits them for "cpx" and knows no AMX); elsewhere, or when a test forces it, the operands are
// widened to float and multiplied by the float32 panel micro-kernel (mha/core/panel_gemm.h). All
// paths compute every product exactly (a bf16 × bf16 product fits a float) and add them in float:
// they differ only in the order of the float additions.
//
// B is packed once per matrix (a kv head's keys or values) into the pair layout VDPBF16PS and the
// AMX tiles read (libxsmm's "VNNI" layout): rows kk and kk + 1 interleaved, B[kk][c] at
// packed[(kk / 2)·2n + 2c + kk % 2], k rounded up to even with a zero row. A is any row-major
// bfloat16 matrix (a row stride, no copy).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mha/core/half.h"
#include "mha/core/panel_gemm.h"
#include "mha/core/tensor.h"
#include "mha/core/view.h"

namespace mha::bf16_gemm {

// bfloat16s that pack_b and pack_b_transposed write for a k × n B.
size_t packed_size(size_t k, size_t n);

// B = X, X k × n (row stride ld) / B = Xᵀ, X n × k (row stride ld): packed into dst
// (packed_size(k, n) elements).
void pack_b(const bfloat16* x, size_t ld, size_t k, size_t n, bfloat16* dst);
void pack_b_transposed(const bfloat16* x, size_t ld, size_t n, size_t k, bfloat16* dst);

// float16 on the same products (cpu_flash's float16 attention on AMX tiles): every float16 x is
// exactly hi + lo with hi = x rounded to bfloat16 and lo = x − hi (x has 11 significant bits, hi
// the top 8, lo the other 3, and both lie in bfloat16's range), so x·y = hi·hi' + lo·hi' + hi·lo'
// + lo·lo', four exact bf16 products. A product on split operands is the float16 product with
// every term exact, summed in float, as the float path's is, at four times the depth.
//   split_depth(k)            that depth: 4·(k rounded up to 8), a multiple of the tiles' 32;
//   split_a(x, k, dst)        one row of A: dst[0, split_depth(k)) = [hi | lo | hi | lo], each
//                             part zero-padded to k rounded up to 8;
//   pack_split_b_transposed   B = [Xhiᵀ; Xhiᵀ; Xloᵀ; Xloᵀ] (split_depth(k) × n) of X n × k (row
//                             stride ld), packed as pack_b packs for ldb ≥ n columns (the columns
//                             past n zero): packed_size(split_depth(k), ldb) elements. Then
//                             multiply(m, n, split_depth(k), A, ·, B, ldb, C, ·) is C = X_A·Xᵀ.
//   pack_split_b              X k × n as two packed B (pack_b's layout), Xhi and Xlo:
//                             packed_size(k, n) elements each;
//   split(x, n, hi, lo)       floats x[0, n) as hi and lo apart: exact where x holds float16s;
//                             any float within 2⁻¹⁶·|x| (lo rounded too). Where the CPU has
//                             AVX512_BF16 by VCVTNEPS2BF16, which rounds a float subnormal to 0.
size_t split_depth(size_t k);
void split_a(const float16* x, size_t k, bfloat16* dst);
void pack_split_b_transposed(const float16* x, size_t ld, size_t n, size_t k, bfloat16* dst, size_t ldb);
void pack_split_b(const float16* x, size_t ld, size_t k, size_t n, bfloat16* hi, bfloat16* lo);
void split(const float* x, size_t n, bfloat16* hi, bfloat16* lo);

// C[r][c] (row stride ldc, n columns) = (accumulate: C[r][c] +) Σ_kk A[r][kk]·B[kk][c], A m × k
// (row stride lda), B packed by pack_b or pack_b_transposed for ldb ≥ n columns. B may be a block
// of a larger packed matrix: its rows from an even row kk0 and its columns from c0 are at
// b_packed + kk0·ldb + 2·c0. (An odd lda takes the float32 path: the bf16 kernels read A's rows
// in pairs.)
void multiply(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b_packed, size_t ldb,
              float* c, size_t ldc, bool accumulate);

// The same product in float, in blocks of up to 64 rows × 64 columns split between OpenMP threads
// the same way for any thread count: `finish(row, col, values, count)` gets each row segment of
// each block, C[row][col, col + count), on the thread that computed it, and stores it (a packed
// linear layer's bias and epilogue, gemm<bfloat16>'s alpha and beta).
using RowSegment = std::function<void(int64_t row, int64_t col, float* values, int64_t count)>;
void multiply_blocks(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b_packed,
                     size_t ldb, const RowSegment& finish);

// How multiply computes, best last: the float32 fallback (operands widened, panel micro-kernel);
// VDPBF16PS through libxsmm (AVX512_BF16: AMD Zen 4, Intel Cooper Lake on); Intel's AMX tiles
// (TDPBF16PS: Sapphire Rapids on, where VDPBF16PS is measured at half the float32 FMA's rate and
// the tiles at several times it; docs/bfloat16.md). All compute every product exactly and add in
// float; they differ in the order of the additions.
enum class Path { float32 = 0, vdpbf16ps = 1, amx = 2 };
// The paths this CPU (and its kernel) can run, float32 first, the best last: float32 alone while
// a SIMD target below AVX3 is pinned or MHA_CPU_TARGET caps it there (mha/core/simd.h).
std::vector<Path> paths();
// The path multiply takes now: the best, or lower while a ScopedPath lives.
Path path();
const char* name(Path p);
// Whether multiply runs on the CPU's bf16 instructions (path() is not float32).
bool native();

// Caps the path at `limit` while it lives (tests of each path, and of the path a CPU without the
// bf16 instructions takes); not thread-safe against concurrent multiply calls.
class ScopedPath {
 public:
  explicit ScopedPath(Path limit);
  ~ScopedPath();
  ScopedPath(const ScopedPath&) = delete;
  ScopedPath& operator=(const ScopedPath&) = delete;

 private:
  Path saved_;
};
// The float32 fallback while it lives.
class ScopedFloat32Fallback : public ScopedPath {
 public:
  ScopedFloat32Fallback() : ScopedPath(Path::float32) {}
};

// y = x·Wᵀ + b with x and y in bfloat16: torch.nn.Linear's weight (out_features, in_features)
// rounded to bfloat16 once (what PyTorch's .to(torch.bfloat16) does) and packed once in pairs,
// the bias kept in float; the inference twin of panel_gemm::PackedLinear for the bfloat16
// sentence encoder. Each block of y (up to 64 rows × 64 columns) is one multiply into a float
// tile, the bias added, handed to the epilogue, then rounded once to y: with no epilogue, y is
// the product of the bfloat16 operands summed in float, rounded once (where the products run on
// the bf16 instructions, by VCVTNEPS2BF16, which rounds a subnormal to 0).
// Where the products run in float (a CPU without the bf16 instructions, or a pinned target below
// AVX3 when the layer is built) the rounded weight is also kept widened, as float panels
// (panel_gemm::PackedLinear): multiply's float32 path would widen and pack it again on every call,
// which made the bfloat16 sentence encoder slower than the float32 one. The results are the same
// bits either way (the same products, summed in the same order). Then the pairs are kept only if
// the CPU has the bf16 instructions (a later pin may select them); without them the layer holds
// the float weight alone, as the float32 layer does.
class PackedLinear {
 public:
  PackedLinear() = default;
  // weight: contiguous (out_features, in_features); bias: undefined or (out_features).
  // Throws mha::Error naming `what` and the argument on a bad shape.
  PackedLinear(View<const float> weight, View<const float> bias, const std::string& what = "PackedLinear");

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  // panel_gemm::PackedLinear's contract: `values` are y[row][col, col + count) in float, the bias
  // added, on the thread that computed them; what the epilogue leaves there is rounded to y.
  using Epilogue = RowSegment;

  // y (M, out_features) = x (M, in_features) · Wᵀ + bias, both contiguous, on multiply_blocks:
  // bitwise the same for any thread count. (Not for any
  // M: libxsmm's kernels block a product, and so order its additions, by its shape, so a row's
  // last bits may change with the rows around it.)
  void forward(View<const bfloat16> x, View<bfloat16> y, const Epilogue& epilogue = {}) const;
  Tensor<bfloat16> forward(View<const bfloat16> x) const;

 private:
  int64_t in_ = 0, out_ = 0;
  Tensor<bfloat16> packed_;             // Wᵀ in pairs: packed_size(in, out), where the CPU has bf16
  panel_gemm::PackedLinear widened_;    // the rounded W in float panels, bias included (see above;
                                        // packed_width() 0: not kept)
  Tensor<float> bias_;                  // (out) or undefined
  std::string what_;
};

}  // namespace mha::bf16_gemm
