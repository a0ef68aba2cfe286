#pragma once
// torch.nn.LayerNorm: normalise over the trailing dimensions `normalized_shape`,
//   y = (x − mean) / sqrt(var + eps) · weight + bias
// with the biased variance (divide by the number of normalised elements), as PyTorch does.
// Mean and variance are accumulated in double for float, double and bfloat16 (whose values are
// widened as they are read, and each result rounded once as it is written: the cache keeps the
// normalised input in float).
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "mha/core/tensor.h"
#include "mha/nn/module.h"

namespace mha::nn {

template <class T>
class LayerNorm : public Module<T> {
 public:
  struct Cache {
    Tensor<widened_t<T>> normalized;  // (x − mean) · rstd, the input's shape
    Tensor<widened_t<T>> rstd;        // 1 / sqrt(var + eps), one per normalised group (leading dims)
  };

  // normalized_shape: the trailing dimensions to normalise over (non-empty, each >= 1).
  // eps: finite and >= 0. elementwise_affine=false: no parameters. use_bias=false (PyTorch's
  // bias=False): weight only.
  // Parameters "weight" (initialised to 1) and "bias" (to 0), shaped normalized_shape.
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool use_bias = true);
  // LayerNorm<float>({2, 3}): without this overload the braces could also mean (size 2, eps 3).
  explicit LayerNorm(std::initializer_list<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true, bool use_bias = true)
      : LayerNorm(Shape(normalized_shape), eps, elementwise_affine, use_bias) {}
  // Normalise over the last dimension of size `normalized_size`.
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true,
                     bool use_bias = true);

  const Shape& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }
  bool elementwise_affine() const { return affine_; }
  bool has_bias() const { return has_bias_; }

  // x: any tensor whose trailing dimensions equal normalized_shape. Same shape out.
  Tensor<T> forward(const Tensor<T>& x, Cache* cache = nullptr) const;
  // Returns grad_input (exact); adds into grad_weight / grad_bias.
  Tensor<T> backward(const Tensor<T>& grad_output, const Cache& cache);

  std::vector<Parameter<T>> parameters() override;

  Tensor<T> weight;  // normalized_shape; undefined without elementwise_affine
  Tensor<T> bias;    // normalized_shape; undefined without elementwise_affine or bias
  Tensor<T> grad_weight;
  Tensor<T> grad_bias;

 private:
  void check_parameters() const;

  Shape normalized_shape_;
  int64_t group_size_ = 1;  // product of normalized_shape
  double eps_;
  bool affine_;
  bool has_bias_;
};

}  // namespace mha::nn
