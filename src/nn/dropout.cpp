#include "mha/nn/dropout.h"

#include <cmath>

#include "mha/core/random.h"

namespace mha::nn {
namespace {

void check_p(double p, const char* what) {
  check(std::isfinite(p) && p >= 0.0 && p <= 1.0, what,
        ": p: expected a probability in [0, 1], got ", p);
}

}  // namespace

Tensor<bool> dropout_mask(const Shape& shape, double p, uint64_t seed, uint64_t counter) {
  check_p(p, "dropout_mask");
  Tensor<bool> keep(shape);
  const int64_t n = keep.numel();
  const auto c0 = static_cast<uint32_t>(counter);
  const auto c1 = static_cast<uint32_t>(counter >> 32);
  for (int64_t block = 0; block * 4 < n; ++block) {
    const auto b = static_cast<uint64_t>(block);
    const PhiloxCounter r =
        philox4x32({static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), c0, c1}, seed);
    for (int64_t j = 0; j < 4 && block * 4 + j < n; ++j)
      keep[block * 4 + j] = uniform_from_bits(r[static_cast<size_t>(j)]) >= p;
  }
  return keep;
}

template <class T>
Tensor<T> dropout_apply(const Tensor<T>& x, const Tensor<bool>& keep, double p) {
  check_p(p, "dropout_apply");
  check(x.defined(), "dropout_apply: input: expected a tensor, got an undefined tensor");
  check(keep.defined(), "dropout_apply: keep: expected a mask of shape ", to_string(x.shape()),
        ", got an undefined tensor");
  check_shape(keep.shape(), x.shape(), "dropout_apply: keep");
  using W = widened_t<T>;  // bfloat16: scaled in float, rounded once
  const W scale = p < 1.0 ? static_cast<W>(1.0 / (1.0 - p)) : W{0};
  Tensor<T> y(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = keep[i] ? narrow<T>(widen(x[i]) * scale) : narrow<T>(0.0);
  return y;
}

template <class T>
Dropout<T>::Dropout(double p, uint64_t seed) : p_(p), seed_(seed) {
  check_p(p, "Dropout");
}

template <class T>
Tensor<T> Dropout<T>::forward(const Tensor<T>& x, Cache* cache) {
  check(x.defined(), "Dropout: input: expected a tensor, got an undefined tensor");
  Tensor<bool> keep;
  Tensor<T> y;
  if (this->is_training()) {
    keep = dropout_mask(x.shape(), p_, seed_, counter_++);
    y = dropout_apply(x, keep, p_);
  } else {
    y = x;
  }
  if (cache != nullptr) {
    cache->keep = std::move(keep);
    cache->p = p_;
    cache->shape = x.shape();
    cache->filled = true;
  }
  return y;
}

template <class T>
Tensor<T> Dropout<T>::backward(const Tensor<T>& grad_output, const Cache& cache) const {
  check(cache.filled,
        "Dropout::backward: cache: expected the cache filled by forward, got an empty cache");
  check(grad_output.defined(), "Dropout::backward: grad_output: expected shape ",
        to_string(cache.shape), ", got an undefined tensor");
  check_shape(grad_output.shape(), cache.shape, "Dropout::backward: grad_output");
  if (!cache.keep.defined()) return grad_output;
  return dropout_apply(grad_output, cache.keep, cache.p);
}

template Tensor<float> dropout_apply(const Tensor<float>&, const Tensor<bool>&, double);
template Tensor<double> dropout_apply(const Tensor<double>&, const Tensor<bool>&, double);
template Tensor<bfloat16> dropout_apply(const Tensor<bfloat16>&, const Tensor<bool>&, double);
template class Dropout<float>;
template class Dropout<double>;
template class Dropout<bfloat16>;

}  // namespace mha::nn
