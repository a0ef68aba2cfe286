#pragma once
// Finite-difference gradient checking for gtest, in double.
//
// For a function f: Tensor<double> -> Tensor<double> and a fixed grad_output g, the scalar
//   L(x) = sum(f(x) ∘ g)
// has gradient dL/dx = (vector-Jacobian product of f at x with g), which is what every backward
// in mha returns. numerical_gradient estimates it by central differences,
//   dL/dx_i ≈ (L(x + h e_i) − L(x − h e_i)) / (2h),
// and check_gradient compares that with an analytic gradient elementwise:
//   |analytic − numeric| <= atol + rtol · max(|analytic|, |numeric|).
//
// Usage (input gradient):
//   auto f = [&](const Tensor<double>& x) { return layer.forward(x); };
//   EXPECT_TRUE(mha::testing::check_gradient(f, x, grad_out, grad_x_from_backward));
// Parameter gradient: `replacing` builds an f that swaps the parameter for its argument:
//   EXPECT_TRUE(check_gradient(replacing(layer.weight, [&] { return layer.forward(x); }),
//                              layer.weight, grad_out, layer.grad_weight));
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <utility>

#include "mha/core/random.h"
#include "mha/core/tensor.h"

namespace mha::testing {

using TensorFn = std::function<Tensor<double>(const Tensor<double>&)>;

struct GradCheckOptions {
  double h = 1e-6;     // central-difference step
  double rtol = 1e-6;  // relative tolerance
  double atol = 1e-7;  // absolute tolerance (for entries whose true gradient is ~0)
};

// L(x) = sum(f(x) ∘ grad_output), accumulated in long double to keep rounding below the
// difference quotient's resolution.
inline long double weighted_sum(const Tensor<double>& y, const Tensor<double>& grad_output) {
  long double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i)
    s += static_cast<long double>(y[i]) * static_cast<long double>(grad_output[i]);
  return s;
}

// Central-difference estimate of d sum(f(x) ∘ grad_output) / dx. f(x) must have
// grad_output's shape.
inline Tensor<double> numerical_gradient(const TensorFn& f, const Tensor<double>& x,
                                         const Tensor<double>& grad_output, double h = 1e-6) {
  Tensor<double> grad(x.shape());
  Tensor<double> probe = x;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double xi = x[i];
    probe[i] = xi + h;
    const Tensor<double> plus = f(probe);
    probe[i] = xi - h;
    const Tensor<double> minus = f(probe);
    probe[i] = xi;
    if (plus.shape() != grad_output.shape() || minus.shape() != grad_output.shape())
      throw std::runtime_error("numerical_gradient: f(x) has shape " + to_string(plus.shape()) +
                               ", grad_output has shape " + to_string(grad_output.shape()));
    grad[i] =
        static_cast<double>((weighted_sum(plus, grad_output) - weighted_sum(minus, grad_output)) /
                            (2.0L * static_cast<long double>(h)));
  }
  return grad;
}

// Elementwise comparison; the failure message names the shapes, the number of mismatches and
// the worst entries.
inline ::testing::AssertionResult gradients_close(const Tensor<double>& analytic,
                                                  const Tensor<double>& numeric, double rtol = 1e-6,
                                                  double atol = 1e-7) {
  if (analytic.shape() != numeric.shape())
    return ::testing::AssertionFailure()
           << "analytic gradient has shape " << to_string(analytic.shape())
           << ", numerical gradient has shape " << to_string(numeric.shape());
  int64_t bad = 0;
  int64_t worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < analytic.numel(); ++i) {
    const double a = analytic[i], n = numeric[i];
    const double tol = atol + rtol * std::max(std::abs(a), std::abs(n));
    const double err = std::abs(a - n);
    if (!(err <= tol)) {  // also catches NaN
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err / tol;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg.precision(12);
  msg << bad << " of " << analytic.numel() << " entries differ (shape "
      << to_string(analytic.shape()) << ", rtol " << rtol << ", atol " << atol
      << "); worst at flat index " << worst << ": analytic " << analytic[worst] << ", numerical "
      << numeric[worst] << ", |diff| " << std::abs(analytic[worst] - numeric[worst]);
  return ::testing::AssertionFailure() << msg.str();
}

// numerical_gradient(f, x, grad_output) vs `analytic`.
inline ::testing::AssertionResult check_gradient(const TensorFn& f, const Tensor<double>& x,
                                                 const Tensor<double>& grad_output,
                                                 const Tensor<double>& analytic,
                                                 const GradCheckOptions& options = {}) {
  return gradients_close(analytic, numerical_gradient(f, x, grad_output, options.h), options.rtol,
                         options.atol);
}

// f(v): set `target` to v, run forward(), restore `target`, return the output. For checking the
// gradient of a parameter (or any tensor a closure reads by reference).
template <class Forward>
TensorFn replacing(Tensor<double>& target, Forward forward) {
  return [&target, forward](const Tensor<double>& v) {
    Tensor<double> saved = target;
    target = v;
    Tensor<double> y = forward();
    target = std::move(saved);
    return y;
  };
}

// Uniform values in [low, high) from gen.
template <class T = double>
Tensor<T> random_tensor(const Shape& shape, Generator& gen, double low = -1.0, double high = 1.0) {
  Tensor<T> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(gen.uniform(low, high));
  return t;
}

// Random integer in [low, high].
inline int64_t random_int(Generator& gen, int64_t low, int64_t high) {
  return low + static_cast<int64_t>(gen.next_u32() % static_cast<uint32_t>(high - low + 1));
}

// A shape of rank `rank` with every dimension in [min_size, max_size].
inline Shape random_shape(Generator& gen, int64_t rank, int64_t min_size = 1,
                          int64_t max_size = 7) {
  Shape s(static_cast<size_t>(rank));
  for (auto& d : s) d = random_int(gen, min_size, max_size);
  return s;
}

}  // namespace mha::testing
