#pragma once
// Elementwise helpers shared by the nn layers' own code (not a public API).
#include <cstdint>

#include "mha/core/tensor.h"

namespace mha::nn::detail {

// x += y, elementwise (same number of elements; bfloat16 added in float, rounded once); split
// between threads when large.
template <class T>
void add_into(Tensor<T>& x, const Tensor<T>& y) {
  T* px = x.data();
  const T* py = y.data();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) px[i] = narrow<T>(widen(px[i]) + widen(py[i]));
}

// a + b (a's storage reused).
template <class T>
Tensor<T> sum(Tensor<T> a, const Tensor<T>& b) {
  add_into(a, b);
  return a;
}

}  // namespace mha::nn::detail
