#pragma once
// Linear layer: y = x Wᵀ + b (torch.nn.Linear), plus the same math as free functions so other
// layers can reuse it on part of a bigger weight (MultiheadAttention's packed in_proj_weight).
//
// Functional API. The weight is passed as a WeightView: a pointer to a contiguous row-major
// (out_features, in_features) block. Any block of consecutive rows of a bigger row-major matrix
// with in_features columns is such a block, so the q/k/v projections of a packed (3E, E)
// in_proj_weight are
//     weight_rows(in_proj_weight, 0, E), weight_rows(in_proj_weight, E, E),
//     weight_rows(in_proj_weight, 2 * E, E)
// with bias pointers in_proj_bias.data() + {0, E, 2E} and, for backward, gradient pointers
// grad_in_proj_weight.data() + {0, E·E, 2·E·E} and grad_in_proj_bias.data() + {0, E, 2E}.
//
//   linear_forward(x, weight, bias)       x (..., in) of any rank >= 1 -> y (..., out)
//   linear_backward(x, weight, grad_y, grad_weight, grad_bias) -> grad_x (..., in)
//       grad_weight (out·in values) and grad_bias (out values) are ADDED INTO (not overwritten)
//       when non-null; pass nullptr to skip either.
// `what` prefixes error messages (e.g. "MultiheadAttention: q projection").
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "mha/core/random.h"
#include "mha/core/tensor.h"
#include "mha/core/view.h"
#include "mha/nn/module.h"

namespace mha::nn {

// A contiguous row-major (rows = out_features, cols = in_features) matrix that is not owned.
template <class T>
struct WeightView {
  const T* data = nullptr;
  int64_t rows = 0;  // out_features
  int64_t cols = 0;  // in_features
};

// The whole of a 2-D tensor as a view; throws mha::Error unless `weight` is 2-D.
template <class T>
WeightView<T> weight_view(const Tensor<T>& weight, const std::string& what = "linear: weight");

// Rows [row_begin, row_begin + row_count) of a 2-D tensor; throws mha::Error when the range is
// outside the tensor.
template <class T>
WeightView<T> weight_rows(const Tensor<T>& weight, int64_t row_begin, int64_t row_count,
                          const std::string& what = "linear: weight");

// y = x Wᵀ + b. bias: nullptr or weight.rows values.
template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, WeightView<T> weight,
                         const std::type_identity_t<T>* bias, const std::string& what = "linear");

// Gradient of sum(y ∘ grad_y) for y = linear_forward(x, weight, ·). Returns grad_x; adds
// grad_yᵀ x into grad_weight (rows·cols values) and the sum of grad_y over the leading
// dimensions into grad_bias (rows values) when they are non-null.
template <class T>
Tensor<T> linear_backward(const Tensor<T>& x, WeightView<T> weight, const Tensor<T>& grad_y,
                          std::type_identity_t<T>* grad_weight, std::type_identity_t<T>* grad_bias,
                          const std::string& what = "linear");

// The same two on memory the caller owns: x and grad_y contiguous (row-major) views.
template <class T>
Tensor<T> linear_forward(View<const T> x, WeightView<T> weight, const std::type_identity_t<T>* bias,
                         const std::string& what = "linear");
template <class T>
Tensor<T> linear_backward(View<const T> x, WeightView<T> weight, View<const T> grad_y,
                          std::type_identity_t<T>* grad_weight, std::type_identity_t<T>* grad_bias,
                          const std::string& what = "linear");

// Tensor conveniences: weight (out, in), bias (out) or nullptr; grad tensors (same shapes as
// weight / bias) are added into when non-null.
template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& weight,
                         const std::type_identity_t<Tensor<T>>* bias = nullptr);
template <class T>
Tensor<T> linear_backward(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& grad_y,
                          std::type_identity_t<Tensor<T>>* grad_weight,
                          std::type_identity_t<Tensor<T>>* grad_bias);

// torch.nn.Linear. Parameters "weight" (out_features, in_features) and, with use_bias (PyTorch's
// bias=True, the default), "bias"
// (out_features), both initialised uniform(-1/sqrt(in_features), 1/sqrt(in_features)) from
// `gen` (weight first, row-major, then bias), which is what PyTorch's
// kaiming_uniform_(a=sqrt(5)) gives. in_features == 0 leaves an empty weight and a zero bias.
template <class T>
class Linear : public Module<T> {
 public:
  struct Cache {
    Tensor<T> input;
  };

  Linear(int64_t in_features, int64_t out_features, Generator& gen);
  Linear(int64_t in_features, int64_t out_features, bool use_bias, Generator& gen);

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  bool has_bias() const { return has_bias_; }

  // x (..., in_features), any rank >= 1 -> (..., out_features). Saves the input in `cache`.
  Tensor<T> forward(const Tensor<T>& x, Cache* cache = nullptr) const;
  // Returns grad_input; adds into grad_weight and grad_bias.
  Tensor<T> backward(const Tensor<T>& grad_output, const Cache& cache);

  std::vector<Parameter<T>> parameters() override;

  Tensor<T> weight;       // (out_features, in_features)
  Tensor<T> bias;         // (out_features); undefined when has_bias() is false
  Tensor<T> grad_weight;  // same shapes, zero at construction
  Tensor<T> grad_bias;

 private:
  int64_t in_features_;
  int64_t out_features_;
  bool has_bias_;
};

}  // namespace mha::nn
