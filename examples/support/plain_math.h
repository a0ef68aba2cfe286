#pragma once
// The pieces of the plain formulas the examples check mha against, in double on row-major
// std::vector data: a linear layer over a block of a weight's rows, a dot product, a softmax.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mha/core/tensor.h"

namespace mha::examples::plain {

// x (rows, in) times the rows [first, first + count) of weight (·, in), transposed, plus those
// biases: x Wᵀ + b, (rows, count). A whole layer (first 0, count its outputs), or one of the q, k,
// v blocks of a fused projection.
inline std::vector<double> linear(const std::vector<double>& x, int64_t rows, int64_t in, const Tensor<float>& weight,
                                  const Tensor<float>& bias, int64_t first, int64_t count) {
  std::vector<double> y(static_cast<size_t>(rows * count));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < count; ++o) {
      double s = bias[first + o];
      for (int64_t i = 0; i < in; ++i) s += x[static_cast<size_t>(r * in + i)] * weight[(first + o) * in + i];
      y[static_cast<size_t>(r * count + o)] = s;
    }
  return y;
}

// Σ_c a[c]·b[c], c < n, in order.
inline double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// One row of scores to its softmax, in place: exp(s − max) / Σ exp(s − max); a −inf score gives 0.
inline void softmax(std::vector<double>& p) {
  double max = -std::numeric_limits<double>::infinity(), sum = 0;
  for (double s : p) max = std::max(max, s);
  for (auto& s : p) sum += (s = std::exp(s - max));
  for (auto& s : p) s /= sum;
}

}  // namespace mha::examples::plain
