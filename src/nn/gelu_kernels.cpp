// gelu_kernels.h's kernel, once per SIMD target (foreach_target), dispatched by Highway.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "nn/gelu_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "mha/core/half-inl.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if HWY_ARCH_X86
#include <immintrin.h>
// SLEEF's vector erfc for the two x86 widths. sleef.h declares them only when the whole file is
// compiled for that instruction set (#ifdef __AVX512F__ / __AVX2__); here only the Highway target
// that calls one is, so they are declared as sleef.h declares them.
extern "C" {
__m512 Sleef_erfcf16_u15avx512f(__m512);
__m256 Sleef_erfcf8_u15avx2(__m256);
}
#endif

#ifndef MHA_NN_GELU_KERNELS_ONCE
#define MHA_NN_GELU_KERNELS_ONCE
namespace mha::nn::detail {
constexpr float kMinusSqrt1_2 = -0.70710678118654752440f;  // −1/√2
// The scalar formula (gelu.cpp's, in float): x · 0.5 · erfc(−x/√2).
inline float gelu_erf_scalar(float x) { return x * (0.5f * std::erfc(x * kMinusSqrt1_2)); }
}  // namespace mha::nn::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace mha::nn::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void GeluErfForward(const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3 || HWY_TARGET == HWY_AVX2)
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto half = hn::Set(d, 0.5f);
  const auto scale = hn::Set(d, kMinusSqrt1_2);
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    auto e = hn::Mul(v, scale);
#if HWY_TARGET <= HWY_AVX3
    e.raw = Sleef_erfcf16_u15avx512f(e.raw);
#else
    e.raw = Sleef_erfcf8_u15avx2(e.raw);
#endif
    hn::StoreU(hn::Mul(v, hn::Mul(half, e)), d, y + i);
  }
#endif
  for (; i < n; ++i) y[i] = gelu_erf_scalar(x[i]);
}

// mha::nn::gelu_for_bfloat16: each x rounded to bfloat16 (mha/core/half-inl.h's BFloat16Bits, as
// to_bfloat16 rounds), its GELU looked up in `table` (indexed by the bfloat16's bits); NaN stays
// itself. Every lane takes the same path (the tail too, through a whole vector): any split of a
// row gives the same bits.
void GeluOfBfloat16s(const float* table, const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto gelu = [&](hn::Vec<decltype(d)> v) {
    const auto index = hn::BitCast(di, mha::HWY_NAMESPACE::BFloat16Bits(d, v));
    return hn::IfThenElse(hn::IsNaN(v), v, hn::GatherIndex(d, table, index));
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(gelu(hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {  // the tail through a whole vector (zeros past it)
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)] = {};
    std::copy(x + i, x + n, tail);
    hn::Store(gelu(hn::Load(d, tail)), d, tail);
    std::copy(tail, tail + (n - i), y + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mha::nn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <limits>
#include <numbers>
#include <vector>

#include "gelu_kernels.h"
#include "mha/core/half.h"
#include "mha/core/simd.h"
#include "mha/nn/gelu.h"

namespace mha::nn::detail {
HWY_EXPORT(GeluErfForward);

void gelu_erf_forward(const float* x, float* y, int64_t n) {
  // Chunks of 16 Ki elements per OpenMP task: the vector loop then runs long, and small tensors
  // stay on one thread.
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t count = begin + kChunk < n ? kChunk : n - begin;
    HWY_DYNAMIC_DISPATCH(GeluErfForward)(x + begin, y + begin, count);
  }
}

void gelu_erf_forward_serial(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(GeluErfForward)(x, y, n); }

HWY_EXPORT(GeluOfBfloat16s);

// (Dispatched from here, the kernels' namespace: with one target compiled, as on 64-bit Arm,
// HWY_DYNAMIC_DISPATCH names the target's namespace relative to the caller's.)
void gelu_of_bfloat16s(const float* table, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluOfBfloat16s)(table, x, y, n);
}

}  // namespace mha::nn::detail

namespace mha::nn {

// The GELU of every bfloat16 (by its bits): x·0.5·erfc(−x/√2) in double, rounded once to
// bfloat16 (to_bfloat16(double)), 256 KiB built on first use (0.45 ms). Where erfc rounds to 1
// (|x| < 1e-16) the double is x/2, which for the smallest x is halfway between two bfloat16s; the
// exact GELU, x/2 + x·(Φ(x) − ½), lies above x/2 for every x ≠ 0, so the double is nudged up by one
// of its units first: the table is the exact GELU correctly rounded, ties included.
static const float* gelu_bfloat16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t bits = 0; bits < 65536; ++bits) {
      const double x = to_float(bfloat16{static_cast<uint16_t>(bits)}),
                   erfc = std::erfc(-x / std::numbers::sqrt2);
      double gelu = x * 0.5 * erfc;
      if (erfc == 1.0 && x != 0.0) gelu = std::nextafter(gelu, std::numeric_limits<double>::infinity());
      t[bits] = to_float(to_bfloat16(gelu));
    }
    return t;
  }();
  return table.data();
}

void gelu_for_bfloat16(const float* x, float* y, int64_t n) {
  const float* table = gelu_bfloat16_table();
  detail::gelu_of_bfloat16s(table, x, y, n);
}

}  // namespace mha::nn::detail

// MHA_CPU_TARGET's ceiling, set while the program starts, before any dispatch (mha/core/simd.h).
[[maybe_unused]] static const bool cpu_target_applied = mha::detail::apply_cpu_target_from_environment();

#endif  // HWY_ONCE
