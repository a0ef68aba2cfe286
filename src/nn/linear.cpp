#include <vector>
#include "mha/nn/linear.h"

#include <cmath>

#include "mha/core/gemm.h"

namespace mha::nn {
namespace {

// Leading dimensions of x flattened: x is (rows, in).
template <class T>
int64_t check_input(const View<const T>& x, int64_t in_features, const std::string& what) {
  check(x.defined(), what, ": input: expected a tensor of shape (..., ", in_features,
        "), got an undefined (default-constructed) tensor");
  check(row_major(x), what, ": input: expected contiguous (row-major) memory, got shape ", x.shape(),
        " with strides ", x.strides());
  check(x.dim() >= 1, what, ": input: expected a tensor of rank >= 1 with last dimension ",
        in_features, " (in_features), got shape ", x.shape());
  check(x.size(x.dim() - 1) == in_features, what, ": input: expected last dimension ", in_features,
        " (in_features), got shape ", x.shape());
  return in_features == 0 ? checked_numel(Shape(x.shape().begin(), x.shape().end() - 1))
                          : x.numel() / in_features;
}

template <class T>
void check_view(WeightView<T> weight, const std::string& what) {
  check(weight.rows >= 0 && weight.cols >= 0, what, ": weight: expected sizes >= 0, got (",
        weight.rows, ", ", weight.cols, ")");
  check(weight.data != nullptr || weight.rows * weight.cols == 0, what,
        ": weight: expected a pointer to ", weight.rows, " x ", weight.cols,
        " values, got nullptr");
}

// A tensor as a view; an undefined tensor as an undefined view, which check_input names.
template <class T>
View<const T> input_view(const Tensor<T>& x) {
  return x.defined() ? View<const T>(x) : View<const T>();
}

template <class T>
Shape output_shape(const View<const T>& x, int64_t out_features) {
  Shape s = x.shape();
  s.back() = out_features;
  return s;
}

}  // namespace

template <class T>
WeightView<T> weight_view(const Tensor<T>& weight, const std::string& what) {
  check(
      weight.defined() && weight.dim() == 2, what,
      ": expected a 2-D tensor (out_features, in_features), got ",
      weight.defined() ? "shape " + to_string(weight.shape()) : std::string("an undefined tensor"));
  return {weight.data(), weight.size(0), weight.size(1)};
}

template <class T>
WeightView<T> weight_rows(const Tensor<T>& weight, int64_t row_begin, int64_t row_count,
                          const std::string& what) {
  WeightView<T> all = weight_view(weight, what);
  check(row_begin >= 0 && row_count >= 0 && row_begin <= all.rows - row_count, what,
        ": expected rows [", row_begin, ", ", row_begin + row_count, ") inside a tensor of shape ",
        weight.shape());
  return {all.data + row_begin * all.cols, row_count, all.cols};
}

template <class T>
Tensor<T> linear_forward(View<const T> x, WeightView<T> weight, const std::type_identity_t<T>* bias,
                         const std::string& what) {
  check_view(weight, what);
  const int64_t rows = check_input(x, weight.cols, what);
  const int64_t in = weight.cols;
  const int64_t out = weight.rows;
  // Every element is written: the bias (or 0 when there is no product to write it), then the
  // product, which overwrites when there is no bias.
  auto y = Tensor<T>::uninitialized(output_shape(x, out));
  T* py = y.data();
  if (bias == nullptr && in == 0) std::fill_n(py, y.numel(), T{0});
  if (bias != nullptr) {
    // In parallel: on a fresh output this is the first touch, where the kernel clears the pages
    // (a third of `mha attention`'s samples when one thread did it all).
#pragma omp parallel for schedule(static) if (rows * out >= (int64_t{1} << 18))
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) py[r * out + o] = bias[o];
  }
  if (in > 0) {
    // y (rows, out) += x (rows, in) · Wᵀ (in, out)
    gemm<T>(Transpose::no, Transpose::yes, rows, out, in, narrow<T>(1.0), x.data(), in, weight.data, in,
            narrow<T>(bias != nullptr ? 1.0 : 0.0), py, out);
  }
  return y;
}

template <class T>
Tensor<T> linear_backward(View<const T> x, WeightView<T> weight, View<const T> grad_y,
                          std::type_identity_t<T>* grad_weight, std::type_identity_t<T>* grad_bias,
                          const std::string& what) {
  check_view(weight, what);
  const int64_t rows = check_input(x, weight.cols, what);
  const int64_t in = weight.cols;
  const int64_t out = weight.rows;
  check(grad_y.defined(), what, ": grad_output: expected shape ", output_shape(x, out),
        ", got an undefined tensor");
  check_shape(grad_y.shape(), output_shape(x, out), what + ": grad_output");
  check(row_major(grad_y), what, ": grad_output: expected contiguous (row-major) memory, got strides ",
        grad_y.strides());

  Tensor<T> grad_x(x.shape());
  if (in > 0 && out > 0) {
    // grad_x (rows, in) = grad_y (rows, out) · W (out, in)
    gemm<T>(Transpose::no, Transpose::no, rows, in, out, narrow<T>(1.0), grad_y.data(), out, weight.data, in,
            narrow<T>(0.0), grad_x.data(), in);
    // grad_W (out, in) += grad_yᵀ (out, rows) · x (rows, in)
    if (grad_weight != nullptr && rows > 0)
      gemm<T>(Transpose::yes, Transpose::no, out, in, rows, narrow<T>(1.0), grad_y.data(), out, x.data(), in,
              narrow<T>(1.0), grad_weight, in);
  }
  if (grad_bias != nullptr) {
    // Summed in double: a bias gradient is often a long sum that cancels to ~0 (e.g. a key bias,
    // which softmax ignores), and a float running sum's rounding would dominate it. (PyTorch's
    // sum is a pairwise reduction, far more accurate than a sequential float sum.)
    const T* gy = grad_y.data();
    std::vector<double> sum(static_cast<size_t>(out), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) sum[static_cast<size_t>(o)] += widen(gy[r * out + o]);
    for (int64_t o = 0; o < out; ++o) accumulate(grad_bias[o], sum[static_cast<size_t>(o)]);
  }
  return grad_x;
}

template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, WeightView<T> weight, const std::type_identity_t<T>* bias,
                         const std::string& what) {
  return linear_forward<T>(input_view(x), weight, bias, what);
}

template <class T>
Tensor<T> linear_backward(const Tensor<T>& x, WeightView<T> weight, const Tensor<T>& grad_y,
                          std::type_identity_t<T>* grad_weight, std::type_identity_t<T>* grad_bias,
                          const std::string& what) {
  return linear_backward<T>(input_view(x), weight, input_view(grad_y), grad_weight, grad_bias, what);
}

template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& weight,
                         const std::type_identity_t<Tensor<T>>* bias) {
  const WeightView<T> w = weight_view(weight, "linear: weight");
  if (bias != nullptr) {
    check(bias->defined(), "linear: bias: expected shape [", w.rows, "], got an undefined tensor");
    check_shape(bias->shape(), Shape{w.rows}, "linear: bias");
  }
  return linear_forward<T>(x, w, bias != nullptr ? bias->data() : nullptr, "linear");
}

template <class T>
Tensor<T> linear_backward(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& grad_y,
                          std::type_identity_t<Tensor<T>>* grad_weight,
                          std::type_identity_t<Tensor<T>>* grad_bias) {
  const WeightView<T> w = weight_view(weight, "linear: weight");
  if (grad_weight != nullptr) {
    check(grad_weight->defined(), "linear: grad_weight: expected shape ", weight.shape(),
          ", got an undefined tensor");
    check_shape(grad_weight->shape(), weight.shape(), "linear: grad_weight");
  }
  if (grad_bias != nullptr) {
    check(grad_bias->defined(), "linear: grad_bias: expected shape [", w.rows,
          "], got an undefined tensor");
    check_shape(grad_bias->shape(), Shape{w.rows}, "linear: grad_bias");
  }
  return linear_backward<T>(x, w, grad_y, grad_weight != nullptr ? grad_weight->data() : nullptr,
                            grad_bias != nullptr ? grad_bias->data() : nullptr, "linear");
}

// ---------------------------------------------------------------------------------------------

template <class T>
Linear<T>::Linear(int64_t in_features, int64_t out_features, Generator& gen)
    : Linear(in_features, out_features, true, gen) {}

template <class T>
Linear<T>::Linear(int64_t in_features, int64_t out_features, bool use_bias, Generator& gen)
    : in_features_(in_features), out_features_(out_features), has_bias_(use_bias) {
  check(in_features >= 0, "Linear: in_features: expected >= 0, got ", in_features);
  check(out_features >= 0, "Linear: out_features: expected >= 0, got ", out_features);
  const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
  weight = Tensor<T>({out_features, in_features});
  for (T& v : weight.values()) v = narrow<T>(gen.uniform(-bound, bound));
  grad_weight = Tensor<T>(weight.shape());
  if (use_bias) {
    bias = Tensor<T>({out_features});
    for (T& v : bias.values()) v = narrow<T>(gen.uniform(-bound, bound));
    grad_bias = Tensor<T>(bias.shape());
  }
}

template <class T>
Tensor<T> Linear<T>::forward(const Tensor<T>& x, Cache* cache) const {
  check_shape(weight.shape(), Shape{out_features_, in_features_}, "Linear: weight");
  if (has_bias_) check_shape(bias.shape(), Shape{out_features_}, "Linear: bias");
  Tensor<T> y = linear_forward<T>(x, WeightView<T>{weight.data(), out_features_, in_features_},
                                  has_bias_ ? bias.data() : nullptr, "Linear");
  if (cache != nullptr) cache->input = x;
  return y;
}

template <class T>
Tensor<T> Linear<T>::backward(const Tensor<T>& grad_output, const Cache& cache) {
  check(cache.input.defined(),
        "Linear::backward: cache: expected the cache filled by forward, "
        "got an empty cache");
  check_shape(weight.shape(), Shape{out_features_, in_features_}, "Linear: weight");
  check_shape(grad_weight.shape(), weight.shape(), "Linear: grad_weight");
  if (has_bias_) check_shape(grad_bias.shape(), Shape{out_features_}, "Linear: grad_bias");
  return linear_backward<T>(cache.input, WeightView<T>{weight.data(), out_features_, in_features_},
                            grad_output, grad_weight.data(), has_bias_ ? grad_bias.data() : nullptr,
                            "Linear::backward");
}

template <class T>
std::vector<Parameter<T>> Linear<T>::parameters() {
  std::vector<Parameter<T>> out{{"weight", &weight, &grad_weight}};
  if (has_bias_) out.push_back({"bias", &bias, &grad_bias});
  return out;
}

#define MHA_INSTANTIATE(T)                                                                      \
  template WeightView<T> weight_view(const Tensor<T>&, const std::string&);                     \
  template WeightView<T> weight_rows(const Tensor<T>&, int64_t, int64_t, const std::string&);   \
  template Tensor<T> linear_forward(View<const T>, WeightView<T>, const T*, const std::string&);  \
  template Tensor<T> linear_backward(View<const T>, WeightView<T>, View<const T>, T*, T*,       \
                                     const std::string&);                                       \
  template Tensor<T> linear_forward(const Tensor<T>&, WeightView<T>, const T*,                  \
                                    const std::string&);                                        \
  template Tensor<T> linear_backward(const Tensor<T>&, WeightView<T>, const Tensor<T>&, T*, T*, \
                                     const std::string&);                                       \
  template Tensor<T> linear_forward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>*);      \
  template Tensor<T> linear_backward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,      \
                                     Tensor<T>*, Tensor<T>*);                                   \
  template class Linear<T>;
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
#undef MHA_INSTANTIATE

}  // namespace mha::nn
