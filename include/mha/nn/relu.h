#pragma once
// ReLU: y = max(x, 0), elementwise on a tensor of any shape. The gradient at x == 0 is 0, as in
// PyTorch.
#include <vector>

#include "mha/core/tensor.h"
#include "mha/nn/module.h"

namespace mha::nn {

template <class T>
Tensor<T> relu(const Tensor<T>& x);
// grad_output ∘ (x > 0). grad_output must have x's shape.
template <class T>
Tensor<T> relu_backward(const Tensor<T>& x, const Tensor<T>& grad_output);

template <class T>
class ReLU : public Module<T> {
 public:
  struct Cache {
    Tensor<T> input;
  };
  Tensor<T> forward(const Tensor<T>& x, Cache* cache = nullptr) const;
  Tensor<T> backward(const Tensor<T>& grad_output, const Cache& cache) const;
  std::vector<Parameter<T>> parameters() override { return {}; }
};

}  // namespace mha::nn
