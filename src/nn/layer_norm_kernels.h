#pragma once
// LayerNorm<float> and LayerNorm<bfloat16>'s forward over whole rows, vectorised: compiled per SIMD
// target by Highway and dispatched at run time (mha/core/simd.h pins it).
//
// Each row of n values (read as double): mean = Σx / n and var = Σ(x − mean)² / n, each sum taken
// as eight partial sums (element i into partial i mod 8, in index order) added as
// ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)): the same order, so the same bits, on every
// target and in the scalar tail. r = 1 / √(var + eps); then per element, in double,
// x̂ = (x − mean)·r, v = x̂·w (when w), v = v + b (when b), y = v rounded once to T (to nearest
// even; bfloat16's normal range from the double's bits, the rest by to_bfloat16(double)).
// normalized (x̂ as float) and rstd (r as float) are written when not null (the training cache).
// Rows are independent: the result does not depend on how rows are split between threads.
#include <cstdint>

#include "mha/core/half.h"

namespace mha::nn::detail {

void layer_norm_rows(const float* x, int64_t rows, int64_t n, const float* w, const float* b, double eps, float* y,
                     float* normalized, float* rstd);
void layer_norm_rows(const bfloat16* x, int64_t rows, int64_t n, const bfloat16* w, const bfloat16* b, double eps,
                     bfloat16* y, float* normalized, float* rstd);

}  // namespace mha::nn::detail
