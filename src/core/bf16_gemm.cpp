// bf16 × bf16 → float products (mha/core/bf16_gemm.h): libxsmm's JIT kernels where the CPU has
// AVX512_BF16, the float32 panel micro-kernel on widened operands elsewhere.
#include "mha/core/bf16_gemm.h"

#include <immintrin.h>
#include <libxsmm.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mha/core/panel_gemm.h"
#include "packed_linear_args.h"

namespace mha::bf16_gemm {

namespace {

std::atomic<bool> forced_fallback{false};

// libxsmm's view of the CPU: Cooper Lake ("cpx") and every later x86 target it knows have
// AVX512_BF16 (an AMD Zen 4 reports "cpx").
bool cpu_has_bf16() {
  static const bool has = [] {
    libxsmm_init();
    return libxsmm_get_target_archid() >= LIBXSMM_X86_AVX512_CPX;
  }();
  return has;
}

// B[kk][c] of a packed B of ldb columns.
bfloat16 packed_at(const bfloat16* b, size_t ldb, size_t kk, size_t c) { return b[kk / 2 * 2 * ldb + 2 * c + kk % 2]; }

// The row-major product C = A·B is libxsmm's column-major Cᵀ = Bᵀ·Aᵀ: its A is our packed B (n ×
// k, pairs of k interleaved: the VNNI_A layout), its B our A (k × m, leading dimension lda). The
// JIT kernels take an even depth (an odd k's last row of B is added on its own) and read A's rows
// in pairs from the row start, which needs an even lda (measured: an odd one gives wrong rows).
bool multiply_native(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b, size_t ldb,
                     float* c, size_t ldc, bool accumulate) {
  if (lda % 2 != 0) return false;
  const size_t even = k / 2 * 2;
  if (even > 0) {
    const auto M = static_cast<libxsmm_blasint>(n), N = static_cast<libxsmm_blasint>(m),
               K = static_cast<libxsmm_blasint>(even), LDA = static_cast<libxsmm_blasint>(ldb),
               LDB = static_cast<libxsmm_blasint>(lda),
               LDC = static_cast<libxsmm_blasint>(ldc);
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const int flags = LIBXSMM_GEMM_FLAG_VNNI_A;
    const libxsmm_bsmmfunction kernel = libxsmm_bsmmdispatch(M, N, K, &LDA, &LDB, &LDC, &alpha, &beta, &flags, nullptr);
    if (kernel == nullptr) return false;
    kernel(reinterpret_cast<const libxsmm_bfloat16*>(b), reinterpret_cast<const libxsmm_bfloat16*>(a), c);
  } else if (!accumulate) {
    for (size_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, 0.0f);
  }
  if (even < k)
    for (size_t r = 0; r < m; ++r) {
      const float x = to_float(a[r * lda + even]);
      for (size_t col = 0; col < n; ++col) c[r * ldc + col] += x * to_float(packed_at(b, ldb, even, col));
    }
  return true;
}

// A and B widened to float (B into panels), the product into a scratch C of whole vectors, then
// written or added to C's n columns.
void multiply_float32(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b, size_t ldb,
                      float* c, size_t ldc, bool accumulate) {
  const size_t W = panel_gemm::panel_width(), n_padded = (n + W - 1) / W * W;
  thread_local std::vector<float> a32, b32, b_panels, c32;
  a32.resize(m * k);
  b32.resize(k * n);
  b_panels.resize(n_padded * k);
  c32.resize(m * n_padded);
  for (size_t r = 0; r < m; ++r) convert(a + r * lda, a32.data() + r * k, k);
  for (size_t kk = 0; kk < k; ++kk)
    for (size_t col = 0; col < n; ++col) b32[kk * n + col] = to_float(packed_at(b, ldb, kk, col));
  panel_gemm::pack_rows(b32.data(), n, k, n, b_panels.data());
  panel_gemm::multiply(m, n, k, {a32.data(), k}, {b_panels.data(), W, k * W}, {c32.data(), n_padded}, false);
  for (size_t r = 0; r < m; ++r)
    for (size_t col = 0; col < n; ++col)
      c[r * ldc + col] = accumulate ? c[r * ldc + col] + c32[r * n_padded + col] : c32[r * n_padded + col];
}

// out = in rounded to bfloat16 by VCVTNEPS2BF16 (to nearest even; a subnormal input becomes 0),
// compiled for AVX512_BF16 by a function attribute and called only where the CPU has it: one
// instruction per 16 floats where convert()'s integer rounding takes nine (5 % of the bfloat16
// sentence encoder's time, perf).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_native(const float* in, bfloat16* out,
                                                                                    size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(in + i)));
  if (i < n) {
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(out + i, mask, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, in + i)));
  }
}

}  // namespace

size_t packed_size(size_t k, size_t n) { return (k + 1) / 2 * 2 * n; }

// Rows kk and kk + 1 interleaved (a zero row after an odd k's last), as 16-bit integers: a loop
// the compiler vectorizes.
void pack_b(const bfloat16* x, size_t ld, size_t k, size_t n, bfloat16* dst) {
  static_assert(sizeof(bfloat16) == sizeof(uint16_t));
  for (size_t kk = 0; kk < k; kk += 2) {
    uint16_t* pairs = reinterpret_cast<uint16_t*>(dst + kk * n);
    const uint16_t* first = reinterpret_cast<const uint16_t*>(x + kk * ld);
    if (kk + 1 < k) {
      const uint16_t* second = reinterpret_cast<const uint16_t*>(x + (kk + 1) * ld);
      for (size_t col = 0; col < n; ++col) {
        pairs[2 * col] = first[col];
        pairs[2 * col + 1] = second[col];
      }
    } else {
      for (size_t col = 0; col < n; ++col) {
        pairs[2 * col] = first[col];
        pairs[2 * col + 1] = 0;
      }
    }
  }
}

// Row col of X is B's column col, and a pair of it is two neighbours of that row: the pairs are
// X's rows read as 32-bit words, transposed. Blocks of 16 rows keep the reads in a few cache
// lines each and the writes contiguous.
void pack_b_transposed(const bfloat16* x, size_t ld, size_t n, size_t k, bfloat16* dst) {
  constexpr size_t kBlock = 16;
  const size_t pairs = k / 2;
  for (size_t col0 = 0; col0 < n; col0 += kBlock) {
    const size_t cols = std::min(kBlock, n - col0);
    for (size_t p = 0; p < pairs; ++p) {
      bfloat16* out = dst + 2 * (p * n + col0);
      for (size_t c = 0; c < cols; ++c) std::memcpy(out + 2 * c, x + (col0 + c) * ld + 2 * p, 2 * sizeof(bfloat16));
    }
    if (k % 2 != 0)
      for (size_t c = 0; c < cols; ++c) {
        dst[2 * (pairs * n + col0 + c)] = x[(col0 + c) * ld + k - 1];
        dst[2 * (pairs * n + col0 + c) + 1] = bfloat16{0};
      }
  }
}

void multiply(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b_packed, size_t ldb,
              float* c, size_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (native() && multiply_native(m, n, k, a, lda, b_packed, ldb, c, ldc, accumulate)) return;
  multiply_float32(m, n, k, a, lda, b_packed, ldb, c, ldc, accumulate);
}

bool native() { return !forced_fallback.load(std::memory_order_relaxed) && cpu_has_bf16(); }

ScopedFloat32Fallback::ScopedFloat32Fallback() : saved_(forced_fallback.exchange(true)) {}
ScopedFloat32Fallback::~ScopedFloat32Fallback() { forced_fallback.store(saved_); }

void multiply_blocks(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b_packed,
                     size_t ldb, const RowSegment& finish) {
  // Jobs in row-major order (a thread's consecutive jobs share the rows of A); B's block for 64
  // columns is 64·k bfloat16s (48 KiB at k = 384).
  constexpr size_t kBlock = 64;
  const size_t row_blocks = (m + kBlock - 1) / kBlock, col_blocks = (n + kBlock - 1) / kBlock;
  const auto jobs = static_cast<int64_t>(row_blocks * col_blocks);
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && omp_get_max_threads() > 1 && jobs > 1)
  for (int64_t job = 0; job < jobs; ++job) {
    const size_t r0 = static_cast<size_t>(job) / col_blocks * kBlock, c0 = static_cast<size_t>(job) % col_blocks * kBlock;
    const size_t rows = std::min(kBlock, m - r0), cols = std::min(kBlock, n - c0);
    thread_local std::vector<float> tile;
    tile.resize(rows * cols);
    const bfloat16* b = k > 0 ? b_packed + 2 * c0 : nullptr;  // k = 0 reads no B
    multiply(rows, cols, k, a + r0 * lda, lda, b, ldb, tile.data(), cols, false);
    for (size_t r = 0; r < rows; ++r)
      finish(static_cast<int64_t>(r0 + r), static_cast<int64_t>(c0), tile.data() + r * cols, static_cast<int64_t>(cols));
  }
}

PackedLinear::PackedLinear(View<const float> weight, View<const float> bias, const std::string& what) : what_(what) {
  detail::check_packed_linear(weight, bias, what, out_, in_, bias_);
  Tensor<bfloat16> rounded = Tensor<bfloat16>::uninitialized({out_, in_});
  convert(weight.data(), rounded.data(), static_cast<size_t>(out_ * in_));
  const auto in = static_cast<size_t>(in_), out = static_cast<size_t>(out_);
  packed_ = Tensor<bfloat16>::uninitialized({static_cast<int64_t>(packed_size(in, out))});
  if (packed_.numel() > 0) pack_b_transposed(rounded.data(), in, out, in, packed_.data());
}

Tensor<bfloat16> PackedLinear::forward(View<const bfloat16> x) const {
  Tensor<bfloat16> y = Tensor<bfloat16>::uninitialized(detail::packed_linear_output_shape(x.shape(), in_, out_, what_));
  forward(x, y);
  return y;
}

void PackedLinear::forward(View<const bfloat16> x, View<bfloat16> y, const Epilogue& epilogue) const {
  const int64_t m = detail::check_packed_linear_io<bfloat16>(x, y, in_, out_, what_);
  if (m == 0) return;
  const bool bf16_path = native();
  multiply_blocks(static_cast<size_t>(m), static_cast<size_t>(out_), static_cast<size_t>(in_), x.data(),
                  static_cast<size_t>(in_), packed_.data(), static_cast<size_t>(out_),
                  [&](int64_t row, int64_t col, float* values, int64_t count) {
                    if (bias_.defined())
                      for (int64_t j = 0; j < count; ++j) values[j] += bias_[col + j];
                    if (epilogue) epilogue(row, col, values, count);
                    bfloat16* out = y.data() + row * out_ + col;
                    if (bf16_path) round_native(values, out, static_cast<size_t>(count));
                    else convert(values, out, static_cast<size_t>(count));
                  });
}

}  // namespace mha::bf16_gemm
