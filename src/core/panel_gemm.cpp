// panel_gemm.h's kernels, once per SIMD target (foreach_target), dispatched by Highway (chosen
// once, at the first call; mha::pin_simd_target in mha/core/simd.h pins it). The targets are the
// library's (HWY_DISABLED_TARGETS in CMakeLists.txt): the micro-kernel keeps its accumulators in
// an array of vectors, which the scalable-vector targets (SVE, RVV) left out there do not allow.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/panel_gemm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "mha/core/panel_gemm.h"
#include "packed_linear_args.h"

HWY_BEFORE_NAMESPACE();
namespace mha::panel_gemm::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_HAVE_SCALABLE
#error "the micro-kernel holds arrays of vectors: scalable-vector targets are disabled in CMakeLists.txt"
#endif

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// ------------------------------------------------------------------------------------------
// Micro-kernel shape: kRows rows of C × kVectors vectors of columns, all held in registers.
// With 32 vector registers (AVX-512, NEON): 6 × 4 = 24 accumulators + 4 B vectors + 1
// broadcast A element = 29 registers, and per step of k 4 loads + 6 broadcasts feed 24 FMAs.
// With 16 (AVX2, SSE4): 6 × 2 = 12 + 2 + 1 = 15 (the shape ggml and OpenBLAS use).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kRows = 6, kVectors = 2;
#else
constexpr size_t kRows = 6, kVectors = 4;
#endif
// Steps of k per pass over C: the B chunk (kDepth × W floats, 32 KiB with AVX-512) stays in
// L1 while every row strip of A streams past it.
constexpr size_t kDepth = 128;
// Each step prefetches B's row one chunk ahead: Gemm runs the chunks of a panel one after the
// other, so that is the next chunk of the panel, the next bytes in memory. With few rows of A
// (one sentence's tokens: three 6-row strips) the first strip over a chunk had waited on memory
// for every line of B: measured on AVX2, 2 threads, the sentence encoder's projections at 19 rows
// went from 111 to 218 GFLOP/s (AVX-512: 280 to 333; many rows: unchanged).
constexpr size_t kPrefetchRows = kDepth;

size_t PanelWidth() { return kVectors * hn::Lanes(DF()); }
size_t PanelStep() { return hn::Lanes(DF()); }

HWY_INLINE size_t round_up_to(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// C[kM × kV·N] (+)= A[kM × k] · B[k × kV·N]: B row kk is kV vectors at b + kk·ldb; each A
// element is broadcast once and multiplies the kV vectors of its B row.
template <size_t kM, size_t kV>
HWY_INLINE void MicroKernel(const float* HWY_RESTRICT a, size_t lda, const float* HWY_RESTRICT b, size_t ldb,
                            size_t k, float* HWY_RESTRICT c, size_t ldc, bool accumulate) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF acc[kM][kV];
  HWY_UNROLL(8)
  for (size_t r = 0; r < kM; ++r) {
    HWY_UNROLL(8)
    for (size_t v = 0; v < kV; ++v) acc[r][v] = accumulate ? hn::LoadU(d, c + r * ldc + v * N) : hn::Zero(d);
  }
  for (size_t kk = 0; kk < k; ++kk) {
    // (as an address: past the last panel it points beyond B, which a prefetch may, a pointer not)
    hwy::Prefetch(reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(b + kk * ldb) +
                                                 kPrefetchRows * ldb * sizeof(float)));
    VF bv[kV];
    HWY_UNROLL(8)
    for (size_t v = 0; v < kV; ++v) bv[v] = hn::LoadU(d, b + kk * ldb + v * N);
    HWY_UNROLL(8)
    for (size_t r = 0; r < kM; ++r) {
      const VF av = hn::Set(d, a[r * lda + kk]);
      HWY_UNROLL(8)
      for (size_t v = 0; v < kV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  HWY_UNROLL(8)
  for (size_t r = 0; r < kM; ++r) {
    HWY_UNROLL(8)
    for (size_t v = 0; v < kV; ++v) hn::StoreU(acc[r][v], d, c + r * ldc + v * N);
  }
}

// The ragged edges (fewer rows, fewer vectors) use smaller instances of the same kernel.
using MicroKernelFn = void (*)(const float*, size_t, const float*, size_t, size_t, float*, size_t, bool);

template <size_t kM, size_t... kV>
constexpr std::array<MicroKernelFn, sizeof...(kV)> MicroKernelRow(std::index_sequence<kV...>) {
  return {&MicroKernel<kM, kV + 1>...};
}
template <size_t... kM>
constexpr std::array<std::array<MicroKernelFn, kVectors>, kRows> MicroKernelTable(std::index_sequence<kM...>) {
  return {MicroKernelRow<kM + 1>(std::make_index_sequence<kVectors>())...};
}

void Gemm(size_t m, size_t n, size_t k, MatrixA a, PanelsB b, MatrixC c, bool accumulate) {
  static constexpr auto kEdgeKernels = MicroKernelTable(std::make_index_sequence<kRows>());
  const size_t N = hn::Lanes(DF()), W = PanelWidth();
  const size_t skipped = b.first_column / N;  // vectors of the first panel before B's column 0
  HWY_DASSERT(b.first_column % N == 0 && skipped < kVectors);
  // Panel p holds C's columns from c0 on: (W − first_column) of them for the first, W after.
  for (size_t p = 0, c0 = 0; c0 < n; c0 += W - (p == 0 ? b.first_column : 0), ++p) {
    const size_t skip = p == 0 ? skipped : 0;
    const size_t vectors = std::min(kVectors - skip, (n - c0 + N - 1) / N);
    float* c_panel = c.data + c0;
    // k = 0 still has to write C = 0 when not accumulating: one pass with an empty depth.
    for (size_t k0 = 0; k0 < k || (k0 == 0 && !accumulate); k0 += kDepth) {
      const size_t depth = std::min(kDepth, k - k0);
      const bool add = accumulate || k0 > 0;
      const float* panel = b.data + p * b.panel_stride + k0 * b.stride + skip * N;
      size_t r0 = 0;
      if (vectors == kVectors) {
        for (; r0 + kRows <= m; r0 += kRows)
          MicroKernel<kRows, kVectors>(a.data + r0 * a.stride + k0, a.stride, panel, b.stride, depth,
                                       c_panel + r0 * c.stride, c.stride, add);
      }
      for (; r0 < m; r0 += kRows) {
        const size_t rows = std::min(kRows, m - r0);
        kEdgeKernels[rows - 1][vectors - 1](a.data + r0 * a.stride + k0, a.stride, panel, b.stride, depth,
                                            c_panel + r0 * c.stride, c.stride, add);
      }
      if (k == 0) break;
    }
  }
}

// ------------------------------------------------------------------------------------------
// Packers (O(rows·cols) copies, done once per head: plain loops suffice).

// A whole panel's row is copied as vectors (perf: a memcpy call per row of 16 floats had taken 4 %
// of an AVX2 forward at L = 512, causal; the loop takes 2 %); a ragged last panel's, then zeros.
void PackRows(const float* x, size_t ld, size_t k, size_t n, float* dst) {
  const DF d;
  const size_t W = PanelWidth(), N = hn::Lanes(d);
  for (size_t p = 0; p * W < n; ++p) {
    const size_t width = std::min(W, n - p * W);
    float* panel = dst + p * k * W;
    const float* columns = x + p * W;
    if (width == W) {
      for (size_t kk = 0; kk < k; ++kk)
        for (size_t c = 0; c < W; c += N) hn::StoreU(hn::LoadU(d, columns + kk * ld + c), d, panel + kk * W + c);
      continue;
    }
    for (size_t kk = 0; kk < k; ++kk) {
      std::copy_n(columns + kk * ld, width, panel + kk * W);
      std::fill(panel + kk * W + width, panel + (kk + 1) * W, 0.0f);
    }
  }
}

// x's rows [c0, c0 + 4) × columns [kk, kk + 4), transposed into rows kk.. of a panel of width W.
// (HWY_SCALAR has no 128-bit vectors, and its panels are 2 wide: it packs element by element.)
#if HWY_TARGET != HWY_SCALAR
HWY_INLINE void Transpose4x4(const float* x, size_t ld, size_t c0, size_t kk, float* panel, size_t W) {
  const hn::Full128<float> d;
  const hn::Full128<double> dd;
  const auto r0 = hn::LoadU(d, x + c0 * ld + kk), r1 = hn::LoadU(d, x + (c0 + 1) * ld + kk);
  const auto r2 = hn::LoadU(d, x + (c0 + 2) * ld + kk), r3 = hn::LoadU(d, x + (c0 + 3) * ld + kk);
  const auto t0 = hn::BitCast(dd, hn::InterleaveLower(d, r0, r1)), t1 = hn::BitCast(dd, hn::InterleaveLower(d, r2, r3));
  const auto t2 = hn::BitCast(dd, hn::InterleaveUpper(d, r0, r1)), t3 = hn::BitCast(dd, hn::InterleaveUpper(d, r2, r3));
  hn::StoreU(hn::BitCast(d, hn::InterleaveLower(dd, t0, t1)), d, panel + kk * W + c0);
  hn::StoreU(hn::BitCast(d, hn::InterleaveUpper(dd, t0, t1)), d, panel + (kk + 1) * W + c0);
  hn::StoreU(hn::BitCast(d, hn::InterleaveLower(dd, t2, t3)), d, panel + (kk + 2) * W + c0);
  hn::StoreU(hn::BitCast(d, hn::InterleaveUpper(dd, t2, t3)), d, panel + (kk + 3) * W + c0);
}
#endif

// Whole panels go 4 × 4 at a time (measured: the scalar loop's strided stores took 8 % of a
// windowed attention forward, which packs its keys as its walk slides; AVX-512 gathers 5 %).
void PackTransposed(const float* x, size_t ld, size_t n, size_t k, float* dst) {
  const size_t W = PanelWidth();
  for (size_t p = 0; p * W < n; ++p) {
    const size_t width = std::min(W, n - p * W);
    float* panel = dst + p * k * W;
#if HWY_TARGET != HWY_SCALAR
    if (width == W) {
      const float* rows = x + p * W * ld;
      const size_t k4 = k / 4 * 4;
      for (size_t c = 0; c < W; c += 4)
        for (size_t kk = 0; kk < k4; kk += 4) Transpose4x4(rows, ld, c, kk, panel, W);
      for (size_t c = 0; c < W; ++c)
        for (size_t kk = k4; kk < k; ++kk) panel[kk * W + c] = rows[c * ld + kk];
      continue;
    }
#endif
    for (size_t c = 0; c < width; ++c) {
      const float* row = x + (p * W + c) * ld;
      for (size_t kk = 0; kk < k; ++kk) panel[kk * W + c] = row[kk];
    }
    for (size_t kk = 0; kk < k; ++kk) std::fill(panel + kk * W + width, panel + (kk + 1) * W, 0.0f);
  }
}

}  // namespace mha::panel_gemm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <string>
#include <vector>

#include "mha/core/simd.h"

namespace mha::panel_gemm {

HWY_EXPORT(PanelWidth);
HWY_EXPORT(PanelStep);
HWY_EXPORT(Gemm);
HWY_EXPORT(PackRows);
HWY_EXPORT(PackTransposed);

size_t panel_width() { return HWY_DYNAMIC_DISPATCH(PanelWidth)(); }
size_t panel_step() { return HWY_DYNAMIC_DISPATCH(PanelStep)(); }

void multiply(size_t m, size_t n, size_t k, MatrixA a, PanelsB b, MatrixC c, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(Gemm)(m, n, k, a, b, c, accumulate);
}

void pack_rows(const float* x, size_t ld, size_t k, size_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(PackRows)(x, ld, k, n, dst);
}

void pack_transposed(const float* x, size_t ld, size_t n, size_t k, float* dst) {
  HWY_DYNAMIC_DISPATCH(PackTransposed)(x, ld, n, k, dst);
}

namespace {

// The half-precision packers: X's rows widened into a float scratch (a panel's rows at a time for
// pack_transposed, one row at a time for pack_rows), then placed as the float packers place them.
template <class Half>
void pack_rows_widened(const Half* x, size_t ld, size_t k, size_t n, float* dst) {
  const size_t W = panel_width();
  thread_local std::vector<float> row;
  row.resize(n);
  for (size_t kk = 0; kk < k; ++kk) {
    convert(x + kk * ld, row.data(), n);
    for (size_t p = 0; p * W < n; ++p) {
      const size_t width = std::min(W, n - p * W);
      float* out = dst + p * k * W + kk * W;
      std::copy_n(row.data() + p * W, width, out);
      std::fill(out + width, out + W, 0.0f);
    }
  }
}

template <class Half>
void pack_transposed_widened(const Half* x, size_t ld, size_t n, size_t k, float* dst) {
  const size_t W = panel_width();
  thread_local std::vector<float> rows;
  rows.resize(W * k);
  for (size_t p = 0; p * W < n; ++p) {
    const size_t width = std::min(W, n - p * W);
    for (size_t c = 0; c < width; ++c) convert(x + (p * W + c) * ld, rows.data() + c * k, k);
    HWY_DYNAMIC_DISPATCH(PackTransposed)(rows.data(), k, width, k, dst + p * k * W);
  }
}

}  // namespace

void pack_rows(const bfloat16* x, size_t ld, size_t k, size_t n, float* dst) { pack_rows_widened(x, ld, k, n, dst); }
void pack_rows(const float16* x, size_t ld, size_t k, size_t n, float* dst) { pack_rows_widened(x, ld, k, n, dst); }
void pack_transposed(const bfloat16* x, size_t ld, size_t n, size_t k, float* dst) {
  pack_transposed_widened(x, ld, n, k, dst);
}
void pack_transposed(const float16* x, size_t ld, size_t n, size_t k, float* dst) {
  pack_transposed_widened(x, ld, n, k, dst);
}

PackedLinear::PackedLinear(View<const float> weight, View<const float> bias, const std::string& what)
    : what_(what) {
  detail::check_packed_linear(weight, bias, what, out_, in_, bias_);
  width_ = panel_width();
  const auto width = static_cast<int64_t>(width_);
  panels_ = Tensor<float>::uninitialized({(out_ + width - 1) / width * width * in_});
  if (panels_.numel() > 0) pack_transposed(weight.data(), in_, out_, in_, panels_.data());
}

Tensor<float> PackedLinear::forward(View<const float> x) const {
  Tensor<float> y = Tensor<float>::uninitialized(detail::packed_linear_output_shape(x.shape(), in_, out_, what_));
  forward(x, y);
  return y;
}

void PackedLinear::forward(View<const float> x, View<float> y, const Epilogue& epilogue) const {
  const int64_t m = detail::check_packed_linear_io<float>(x, y, in_, out_, what_);
  check(width_ == panel_width(), what_, ": the weight was packed for panels of ", width_,
        " floats, but the SIMD target now uses ", panel_width(), ": pack it again after pinning a target");
  if (m == 0) return;
  const auto W = static_cast<int64_t>(width_);
  const int64_t panels = (out_ + W - 1) / W;
  // Jobs: blocks of rows (a multiple of the micro-kernel's 6) × groups of
  // panels, enough of them to share between the threads, the panels split as evenly as they go
  // (few rows: one sentence's tokens); each job owns its part of y.
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Row blocks of about 96 rows, as many as a multiple of the thread count.
  int64_t row_blocks = (m + 95) / 96;
  if (row_blocks > 1) row_blocks = (row_blocks + threads - 1) / threads * threads;
  const int64_t row_block = ((m + row_blocks - 1) / row_blocks + 5) / 6 * 6;
  row_blocks = (m + row_block - 1) / row_block;
  const int64_t panel_groups = std::min(panels, std::max<int64_t>(1, (threads + row_blocks - 1) / row_blocks));
  const bool ragged = out_ % W != 0;  // the last panel's extra columns must not land in the next row
#pragma omp parallel for schedule(static) collapse(2) if (threads > 1 && row_blocks * panel_groups > 1)
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    for (int64_t g = 0; g < panel_groups; ++g) {
      const int64_t r0 = rb * row_block, nrows = std::min(row_block, m - r0);
      const int64_t p0 = g * panels / panel_groups, p1 = (g + 1) * panels / panel_groups;
      if (p0 >= p1) continue;
      const int64_t full_end = ragged && p1 == panels ? p1 - 1 : p1;  // panels written in place
      const float* a = x.data() + r0 * in_;
      float* c = y.data() + r0 * out_;
      const auto k = static_cast<size_t>(in_);
      if (full_end > p0)
        multiply(static_cast<size_t>(nrows), static_cast<size_t>((full_end - p0) * W), k, {a, k},
             {panels_.data() + p0 * in_ * W, static_cast<size_t>(W), k * static_cast<size_t>(W)},
             {c + p0 * W, static_cast<size_t>(out_)}, false);
      if (full_end < p1) {  // the ragged last panel, through a scratch tile as wide as the panel
        const int64_t c0 = full_end * W, cols = out_ - c0;
        std::vector<float> tile(static_cast<size_t>(nrows * W));
        multiply(static_cast<size_t>(nrows), static_cast<size_t>(cols), k, {a, k},
             {panels_.data() + full_end * in_ * W, static_cast<size_t>(W), k * static_cast<size_t>(W)},
             {tile.data(), static_cast<size_t>(W)}, false);
        for (int64_t r = 0; r < nrows; ++r)
          std::copy_n(tile.data() + r * W, cols, c + r * out_ + c0);
      }
      if (bias_.defined()) {
        const int64_t c0 = p0 * W, c1 = std::min(out_, p1 * W);
        for (int64_t r = 0; r < nrows; ++r)
          for (int64_t j = c0; j < c1; ++j) c[r * out_ + j] += bias_[j];
      }
      if (epilogue) {
        const int64_t c0 = p0 * W, c1 = std::min(out_, p1 * W);
        for (int64_t r = 0; r < nrows; ++r) epilogue(r0 + r, c0, c + r * out_ + c0, c1 - c0);
      }
    }
  }
}

}  // namespace mha::panel_gemm

// MHA_CPU_TARGET's ceiling, set while the program starts, before any dispatch (mha/core/simd.h).
[[maybe_unused]] static const bool cpu_target_applied = mha::detail::apply_cpu_target_from_environment();

#endif  // HWY_ONCE
