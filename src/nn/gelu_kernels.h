#pragma once
// The exact GELU on float, vectorised: y[i] = x[i] · Φ(x[i]) with Φ(x) = 0.5 · erfc(−x/√2).
// Compiled per SIMD target by Highway and dispatched at run time (mha/core/simd.h pins it). On
// AVX-512 and AVX2 erfc is SLEEF's (1.5 ULP; Highway 1.0 has no erf); every other target, and the
// tail of each call, runs the scalar formula of gelu.cpp, which the tests hold the vector code
// to. Elementwise, so the result does not depend on how the work is split between threads.
#include <cstdint>

namespace mha::nn::detail {

void gelu_erf_forward(const float* x, float* y, int64_t n);
// The same on the calling thread only (inside a parallel region: a block of a matrix product).
void gelu_erf_forward_serial(const float* x, float* y, int64_t n);


}  // namespace mha::nn::detail
