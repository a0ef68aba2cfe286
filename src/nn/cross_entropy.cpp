#include "mha/nn/cross_entropy.h"

#include <cmath>

namespace mha::nn {

template <class T>
T cross_entropy(const Tensor<T>& logits, const Tensor<int64_t>& targets, CrossEntropyCache<T>* cache) {
  check(logits.defined() && logits.dim() == 2 && logits.size(0) >= 1 && logits.size(1) >= 1,
        "cross_entropy: logits: expected a 2-D tensor (N, C) with N >= 1 and C >= 1, got ",
        logits.defined() ? "shape " + to_string(logits.shape()) : std::string("an undefined tensor"));
  const int64_t n = logits.size(0), classes = logits.size(1);
  check(targets.defined(), "cross_entropy: targets: expected shape [", n, "], got an undefined tensor");
  check_shape(targets.shape(), {n}, "cross_entropy: targets");
  for (int64_t i = 0; i < n; ++i)
    check(targets[i] >= 0 && targets[i] < classes, "cross_entropy: targets[", i, "]: expected a class in [0, ",
          classes, "), got ", targets[i]);

  Tensor<T> log_p(logits.shape());
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* z = logits.data() + i * classes;
    T* out = log_p.data() + i * classes;
    T max = z[0];
    for (int64_t c = 0; c < classes; ++c) {
      check(std::isfinite(z[c]), "cross_entropy: logits[", i, ", ", c, "]: expected a finite value, got ", z[c]);
      max = std::max(max, z[c]);
    }
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c]) - static_cast<double>(max));
    const double log_sum = std::log(sum);
    for (int64_t c = 0; c < classes; ++c)
      out[c] = static_cast<T>(static_cast<double>(z[c]) - static_cast<double>(max) - log_sum);
    total -= static_cast<double>(z[targets[i]]) - static_cast<double>(max) - log_sum;
  }
  if (cache != nullptr) {
    cache->log_probabilities = std::move(log_p);
    cache->targets = targets;
  }
  return static_cast<T>(total / static_cast<double>(n));
}

template <class T>
Tensor<T> cross_entropy_backward(const CrossEntropyCache<T>& cache, T grad_loss) {
  const Tensor<T>& log_p = cache.log_probabilities;
  check(log_p.defined() && log_p.dim() == 2 && cache.targets.defined(),
        "cross_entropy_backward: cache: expected the cache filled by cross_entropy, got an empty cache");
  const int64_t n = log_p.size(0), classes = log_p.size(1);
  check_shape(cache.targets.shape(), {n}, "cross_entropy_backward: cache.targets");
  check(std::isfinite(grad_loss), "cross_entropy_backward: grad_loss: expected a finite value, got ", grad_loss);
  Tensor<T> grad(log_p.shape());
  const double scale = static_cast<double>(grad_loss) / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = cache.targets[i];
    check(t >= 0 && t < classes, "cross_entropy_backward: cache.targets[", i, "]: expected a class in [0, ",
          classes, "), got ", t);
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp(static_cast<double>(log_p[i * classes + c]));
      grad[i * classes + c] = static_cast<T>((p - (c == t ? 1.0 : 0.0)) * scale);
    }
  }
  return grad;
}

template float cross_entropy(const Tensor<float>&, const Tensor<int64_t>&, CrossEntropyCache<float>*);
template double cross_entropy(const Tensor<double>&, const Tensor<int64_t>&, CrossEntropyCache<double>*);
template Tensor<float> cross_entropy_backward(const CrossEntropyCache<float>&, float);
template Tensor<double> cross_entropy_backward(const CrossEntropyCache<double>&, double);

}  // namespace mha::nn
