#include "mha/nn/relu.h"

namespace mha::nn {

template <class T>
Tensor<T> relu(const Tensor<T>& x) {
  check(x.defined(), "relu: input: expected a tensor, got an undefined tensor");
  Tensor<T> y(x.shape());
  // !(x <= 0): a NaN is kept, as PyTorch's relu (clamp_min) keeps it.
  for (int64_t i = 0; i < x.numel(); ++i) y[i] = !(widen(x[i]) <= 0) ? x[i] : narrow<T>(0.0);
  return y;
}

template <class T>
Tensor<T> relu_backward(const Tensor<T>& x, const Tensor<T>& grad_output) {
  check(x.defined(), "relu_backward: input: expected a tensor, got an undefined tensor");
  check(grad_output.defined(), "relu_backward: grad_output: expected shape ", to_string(x.shape()),
        ", got an undefined tensor");
  check_shape(grad_output.shape(), x.shape(), "relu_backward: grad_output");
  Tensor<T> g(x.shape());
  // PyTorch's threshold_backward: 0 where the output is <= 0, the gradient elsewhere (at a NaN too).
  for (int64_t i = 0; i < x.numel(); ++i) g[i] = !(widen(x[i]) <= 0) ? grad_output[i] : narrow<T>(0.0);
  return g;
}

template <class T>
Tensor<T> ReLU<T>::forward(const Tensor<T>& x, Cache* cache) const {
  check(x.defined(), "ReLU: input: expected a tensor, got an undefined tensor");
  Tensor<T> y = relu(x);
  if (cache != nullptr) cache->input = x;
  return y;
}

template <class T>
Tensor<T> ReLU<T>::backward(const Tensor<T>& grad_output, const Cache& cache) const {
  check(cache.input.defined(),
        "ReLU::backward: cache: expected the cache filled by forward, got an empty cache");
  check(grad_output.defined(), "ReLU::backward: grad_output: expected shape ",
        to_string(cache.input.shape()), ", got an undefined tensor");
  check_shape(grad_output.shape(), cache.input.shape(), "ReLU::backward: grad_output");
  return relu_backward(cache.input, grad_output);
}

template Tensor<float> relu(const Tensor<float>&);
template Tensor<double> relu(const Tensor<double>&);
template Tensor<bfloat16> relu(const Tensor<bfloat16>&);
template Tensor<float> relu_backward(const Tensor<float>&, const Tensor<float>&);
template Tensor<double> relu_backward(const Tensor<double>&, const Tensor<double>&);
template Tensor<bfloat16> relu_backward(const Tensor<bfloat16>&, const Tensor<bfloat16>&);
template class ReLU<float>;
template class ReLU<double>;
template class ReLU<bfloat16>;

}  // namespace mha::nn
