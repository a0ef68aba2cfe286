#include "mha/nn/gelu.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "gelu_kernels.h"

namespace mha::nn {
namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/√2
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/√(2π)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)
constexpr double kCubic = 0.044715;

void check_approximation(GeluApproximation a, const char* what) {
  check(a == GeluApproximation::none || a == GeluApproximation::tanh, what,
        ": approximation: expected none or tanh, got the value ", static_cast<int>(a));
}

// Φ(x) = 0.5 · erfc(−x/√2) and 0.5 · (1 + tanh z) = σ(2z) avoid the cancellation of 1 + erf and
// 1 + tanh for negative x (which would cost float most of its digits in the left tail).
template <class T>
T normal_cdf(T x) {
  return T(0.5) * std::erfc(-x * T(kSqrt1_2));
}

template <class T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}

template <class T>
T tanh_inner(T x) {
  return T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
}

template <class T>
T gelu_value(T x, GeluApproximation a) {
  if (a == GeluApproximation::none) return x * normal_cdf(x);
  return x * sigmoid(T(2) * tanh_inner(x));
}

template <class T>
T gelu_derivative(T x, GeluApproximation a) {
  if (a == GeluApproximation::none) {
    const T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
    return normal_cdf(x) + x * pdf;
  }
  // d/dx [x · s] with s = σ(2z) = 0.5 (1 + tanh z): s + x · 2 s (1 − s) · dz/dx.
  const T s = sigmoid(T(2) * tanh_inner(x));
  const T dz = T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x);
  return s + T(2) * x * s * (T(1) - s) * dz;
}

}  // namespace

GeluApproximation gelu_approximation_from_string(const std::string& name) {
  if (name == "none") return GeluApproximation::none;
  if (name == "tanh") return GeluApproximation::tanh;
  throw Error("GELU: approximate: expected \"none\" or \"tanh\", got \"" + name + "\"");
}

std::string gelu_approximation_name(GeluApproximation approximation) {
  switch (approximation) {
    case GeluApproximation::none:
      return "none";
    case GeluApproximation::tanh:
      return "tanh";
  }
  throw Error("GELU: approximation: unknown value " +
              std::to_string(static_cast<int>(approximation)));
}

template <class T>
Tensor<T> gelu(const Tensor<T>& x, GeluApproximation approximation) {
  check_approximation(approximation, "gelu");
  check(x.defined(), "gelu: input: expected a tensor, got an undefined tensor");
  if constexpr (is_half_v<T>) {  // in float, each result rounded once (gelu_for_bfloat16 for none)
    Tensor<float> w = cast<float>(x);
    if (approximation == GeluApproximation::none) {
      static_assert(std::is_same_v<T, bfloat16>,
                    "gelu_for_bfloat16 rounds to bfloat16: float16 needs the float GELU");
      constexpr int64_t kChunk = 16384;
      const int64_t chunks = (w.numel() + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
      for (int64_t c = 0; c < chunks; ++c)
        gelu_for_bfloat16(w.data() + c * kChunk, w.data() + c * kChunk,
                          std::min(kChunk, w.numel() - c * kChunk));
    } else {
      for (float& v : w.values()) v = gelu_value(v, approximation);
    }
    return cast<T>(w);
  } else {
    Tensor<T> y = Tensor<T>::uninitialized(x.shape());
    if constexpr (std::is_same_v<T, float>) {
      // The exact GELU is most of a BERT layer's non-GEMM time: vectorised (gelu_kernels.h), and
      // held to gelu_value by the tests on every SIMD target.
      if (approximation == GeluApproximation::none) {
        detail::gelu_erf_forward(x.data(), y.data(), x.numel());
        return y;
      }
    }
    for (int64_t i = 0; i < x.numel(); ++i) y[i] = gelu_value(x[i], approximation);
    return y;
  }
}

template <class T>
Tensor<T> gelu_backward(const Tensor<T>& x, const Tensor<T>& grad_output,
                        GeluApproximation approximation) {
  check_approximation(approximation, "gelu_backward");
  check(x.defined(), "gelu_backward: input: expected a tensor, got an undefined tensor");
  check(grad_output.defined(), "gelu_backward: grad_output: expected shape ", to_string(x.shape()),
        ", got an undefined tensor");
  check_shape(grad_output.shape(), x.shape(), "gelu_backward: grad_output");
  Tensor<T> g(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i)
    g[i] = narrow<T>(widen(grad_output[i]) * gelu_derivative(widen(x[i]), approximation));
  return g;
}

template <class T>
Tensor<T> GELU<T>::forward(const Tensor<T>& x, Cache* cache) const {
  check_approximation(approximation_, "GELU");
  check(x.defined(), "GELU: input: expected a tensor, got an undefined tensor");
  Tensor<T> y = gelu(x, approximation_);
  if (cache != nullptr) cache->input = x;
  return y;
}

template <class T>
Tensor<T> GELU<T>::backward(const Tensor<T>& grad_output, const Cache& cache) const {
  check(cache.input.defined(),
        "GELU::backward: cache: expected the cache filled by forward, got an empty cache");
  check(grad_output.defined(), "GELU::backward: grad_output: expected shape ",
        to_string(cache.input.shape()), ", got an undefined tensor");
  check_shape(grad_output.shape(), cache.input.shape(), "GELU::backward: grad_output");
  return gelu_backward(cache.input, grad_output, approximation_);
}

#define MHA_INSTANTIATE(T)                                                                 \
  template Tensor<T> gelu(const Tensor<T>&, GeluApproximation);                            \
  template Tensor<T> gelu_backward(const Tensor<T>&, const Tensor<T>&, GeluApproximation); \
  template class GELU<T>;
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bfloat16)
#undef MHA_INSTANTIATE

}  // namespace mha::nn
