// gelu_kernels.h's kernel, once per SIMD target (foreach_target), dispatched by Highway.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "nn/gelu_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

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

}  // namespace HWY_NAMESPACE
}  // namespace mha::nn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "gelu_kernels.h"

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

}  // namespace mha::nn::detail
#endif  // HWY_ONCE
