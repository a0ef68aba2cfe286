// gelu_kernels.h's kernel, once per SIMD target (foreach_target), dispatched by Highway.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "nn/gelu_kernels.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

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

// mha::nn::gelu_for_bfloat16: x·Φ(x) with erfc(a) = t·exp(−a² + P(t)), t = 1 / (1 + a/2), a ≥ 0
// (Numerical Recipes' erfcc, fractional error below 1.2e-7 for every a); Φ(x) = erfc(a)/2 for
// x < 0 and 1 − erfc(a)/2 for x ≥ 0, a = |x|/√2. Every lane takes the same path (the tail too,
// through a whole vector): any split of a row gives the same bits.
void GeluErfcApproxForward(const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f), half = hn::Set(d, 0.5f), zero = hn::Zero(d);
  const auto inv_sqrt2 = hn::Set(d, -kMinusSqrt1_2);
  auto phi = [&](hn::Vec<decltype(d)> v) {
    const auto a = hn::Mul(hn::Abs(v), inv_sqrt2);
    const auto t = hn::Div(one, hn::MulAdd(half, a, one));
    auto p = hn::Set(d, 0.17087277f);
    for (float c : {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f, 0.09678418f, 0.37409196f,
                    1.00002368f, -1.26551223f})
      p = hn::MulAdd(p, t, hn::Set(d, c));
    // (A NaN lane's exponent is 0 here: Highway's scalar Exp converts it to an integer, undefined
    // behaviour; that lane's result is NaN anyway, x·Φ with x NaN.)
    const auto exponent = hn::NegMulAdd(a, a, p);
    const auto half_erfc = hn::Mul(half, hn::Mul(t, hn::Exp(d, hn::IfThenElse(hn::IsNaN(exponent), zero, exponent))));
    return hn::IfThenElse(hn::Lt(v, zero), half_erfc, hn::Sub(one, half_erfc));
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    hn::StoreU(hn::Mul(v, phi(v)), d, y + i);
  }
  if (i < n) {  // the tail through a whole vector (zeros past it)
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)] = {};
    std::copy(x + i, x + n, tail);
    const auto v = hn::Load(d, tail);
    hn::Store(hn::Mul(v, phi(v)), d, tail);
    std::copy(tail, tail + (n - i), y + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mha::nn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "gelu_kernels.h"
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

HWY_EXPORT(GeluErfcApproxForward);

}  // namespace mha::nn::detail

namespace mha::nn {

void gelu_for_bfloat16(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(detail::GeluErfcApproxForward)(x, y, n); }

}  // namespace mha::nn::detail
#endif  // HWY_ONCE
