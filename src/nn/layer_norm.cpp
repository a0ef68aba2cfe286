#include "mha/nn/layer_norm.h"

#include "layer_norm_kernels.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstddef>
#include <utility>

namespace mha::nn {
namespace {

// x read as double (bfloat16 widened first).
template <class T>
double wide(T x) {
  return static_cast<double>(widen(x));
}

}  // namespace

template <class T>
LayerNorm<T>::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool use_bias)
    : normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      affine_(elementwise_affine),
      has_bias_(elementwise_affine && use_bias) {
  check(!normalized_shape_.empty(),
        "LayerNorm: normalized_shape: expected at least one dimension, got []");
  for (int64_t d : normalized_shape_)
    check(d >= 1, "LayerNorm: normalized_shape: expected dimensions >= 1, got ",
          to_string(normalized_shape_));
  group_size_ = checked_numel(normalized_shape_, "LayerNorm: normalized_shape");
  check(std::isfinite(eps) && eps >= 0, "LayerNorm: eps: expected a finite value >= 0, got ", eps);
  if (affine_) {
    weight = Tensor<T>(normalized_shape_, narrow<T>(1.0));
    grad_weight = Tensor<T>(normalized_shape_);
    if (has_bias_) {
      bias = Tensor<T>(normalized_shape_, narrow<T>(0.0));
      grad_bias = Tensor<T>(normalized_shape_);
    }
  }
}

template <class T>
LayerNorm<T>::LayerNorm(int64_t normalized_size, double eps, bool elementwise_affine, bool use_bias)
    : LayerNorm(Shape{normalized_size}, eps, elementwise_affine, use_bias) {}

template <class T>
void LayerNorm<T>::check_parameters() const {
  if (affine_) check_shape(weight.shape(), normalized_shape_, "LayerNorm: weight");
  if (has_bias_) check_shape(bias.shape(), normalized_shape_, "LayerNorm: bias");
}

template <class T>
Tensor<T> LayerNorm<T>::forward(const Tensor<T>& x, Cache* cache) const {
  check_parameters();
  const size_t k = normalized_shape_.size();
  check(x.defined(), "LayerNorm: input: expected a tensor whose trailing dimensions are ",
        to_string(normalized_shape_), " (normalized_shape), got an undefined tensor");
  check(x.shape().size() >= k && Shape(x.shape().end() - static_cast<std::ptrdiff_t>(k),
                                       x.shape().end()) == normalized_shape_,
        "LayerNorm: input: expected trailing dimensions ", to_string(normalized_shape_),
        " (normalized_shape), got shape ", to_string(x.shape()));

  const int64_t n = group_size_;
  const int64_t groups = x.numel() / n;
  Tensor<T> y = Tensor<T>::uninitialized(x.shape());
  // Without a cache (inference) nothing is kept for backward.
  using W = widened_t<T>;
  Tensor<W> normalized = cache != nullptr ? Tensor<W>::uninitialized(x.shape()) : Tensor<W>();
  Tensor<W> rstd(Shape(x.shape().begin(), x.shape().end() - static_cast<std::ptrdiff_t>(k)));
  const T* px = x.data();
  const T* w = affine_ ? weight.data() : nullptr;
  const T* b = has_bias_ ? bias.data() : nullptr;
  // Groups are independent: any split between threads gives the same bits.
  if constexpr (!std::is_same_v<T, double>) {  // float, bfloat16: the vectorised kernel
    constexpr int64_t kChunk = 16;               // rows per task
#pragma omp parallel for schedule(static) if (x.numel() >= 65536)
    for (int64_t g0 = 0; g0 < groups; g0 += kChunk)
      detail::layer_norm_rows(px + g0 * n, std::min(kChunk, groups - g0), n, w, b, eps_, y.data() + g0 * n,
                              normalized.defined() ? normalized.data() + g0 * n : nullptr, rstd.data() + g0);
  } else {  // double: in index order, the reference the others are held to
#pragma omp parallel for schedule(static) if (x.numel() >= 65536)
    for (int64_t g = 0; g < groups; ++g) {
      const T* xr = px + g * n;
      double mean = 0;
      for (int64_t i = 0; i < n; ++i) mean += wide(xr[i]);
      mean /= static_cast<double>(n);
      double var = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double d = wide(xr[i]) - mean;
        var += d * d;
      }
      var /= static_cast<double>(n);
      const double r = 1.0 / std::sqrt(var + eps_);
      rstd[g] = static_cast<W>(r);
      W* nr = normalized.defined() ? normalized.data() + g * n : nullptr;
      T* yr = y.data() + g * n;
      for (int64_t i = 0; i < n; ++i) {
        const double xhat = (wide(xr[i]) - mean) * r;
        if (nr != nullptr) nr[i] = static_cast<W>(xhat);
        double v = xhat;
        if (w != nullptr) v *= wide(w[i]);
        if (b != nullptr) v += wide(b[i]);
        yr[i] = narrow<T>(v);
      }
    }
  }
  if (cache != nullptr) {
    cache->normalized = std::move(normalized);
    cache->rstd = std::move(rstd);
  }
  return y;
}

template <class T>
Tensor<T> LayerNorm<T>::backward(const Tensor<T>& grad_output, const Cache& cache) {
  check(cache.normalized.defined() && cache.rstd.defined(),
        "LayerNorm::backward: cache: expected the cache filled by forward, got an empty cache");
  check_parameters();
  if (affine_) check_shape(grad_weight.shape(), normalized_shape_, "LayerNorm: grad_weight");
  if (has_bias_) check_shape(grad_bias.shape(), normalized_shape_, "LayerNorm: grad_bias");
  check(grad_output.defined(), "LayerNorm::backward: grad_output: expected shape ",
        to_string(cache.normalized.shape()), ", got an undefined tensor");
  check_shape(grad_output.shape(), cache.normalized.shape(), "LayerNorm::backward: grad_output");

  const int64_t n = group_size_;
  const int64_t groups = grad_output.numel() / n;
  check(cache.rstd.numel() == groups,
        "LayerNorm::backward: cache: rstd does not match the cached input");
  Tensor<T> grad_x(grad_output.shape());
  const T* w = affine_ ? weight.data() : nullptr;
  std::vector<double> gw(affine_ ? static_cast<size_t>(n) : 0, 0.0);
  std::vector<double> gb(has_bias_ ? static_cast<size_t>(n) : 0, 0.0);
  for (int64_t g = 0; g < groups; ++g) {
    const T* gy = grad_output.data() + g * n;
    const widened_t<T>* xh = cache.normalized.data() + g * n;
    // dxhat = grad_y · weight; grad_x = rstd · (dxhat − mean(dxhat) − xhat · mean(dxhat · xhat))
    double sum_d = 0, sum_dx = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d =
          wide(gy[i]) * (w != nullptr ? wide(w[i]) : 1.0);
      sum_d += d;
      sum_dx += d * static_cast<double>(xh[i]);
    }
    const double mean_d = sum_d / static_cast<double>(n);
    const double mean_dx = sum_dx / static_cast<double>(n);
    const double r = static_cast<double>(cache.rstd[g]);
    T* gx = grad_x.data() + g * n;
    for (int64_t i = 0; i < n; ++i) {
      const double d =
          wide(gy[i]) * (w != nullptr ? wide(w[i]) : 1.0);
      gx[i] = narrow<T>(r * (d - mean_d - static_cast<double>(xh[i]) * mean_dx));
      if (affine_)
        gw[static_cast<size_t>(i)] += wide(gy[i]) * static_cast<double>(xh[i]);
      if (has_bias_) gb[static_cast<size_t>(i)] += wide(gy[i]);
    }
  }
  for (int64_t i = 0; i < (affine_ ? n : 0); ++i)
    accumulate(grad_weight[i], gw[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < (has_bias_ ? n : 0); ++i)
    accumulate(grad_bias[i], gb[static_cast<size_t>(i)]);
  return grad_x;
}

template <class T>
std::vector<Parameter<T>> LayerNorm<T>::parameters() {
  std::vector<Parameter<T>> out;
  if (affine_) out.push_back({"weight", &weight, &grad_weight});
  if (has_bias_) out.push_back({"bias", &bias, &grad_bias});
  return out;
}

template class LayerNorm<float>;
template class LayerNorm<double>;
template class LayerNorm<bfloat16>;

}  // namespace mha::nn
