#pragma once
// The error measure of the attention tests and of the attention fuzz target (no gtest here: the
// fuzz target includes it too).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "mha/core/tensor.h"

namespace mha::testing {

// max |a − b| where equal infinities and NaN against NaN count as 0 and a NaN on one side only
// as infinite.
template <class A, class B>
double max_diff(const Tensor<A>& a, const Tensor<B>& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    const double d = std::abs(x - y);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst;
}

}  // namespace mha::testing
