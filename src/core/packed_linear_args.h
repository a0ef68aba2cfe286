#pragma once
// The argument checks the two packed linear layers share (panel_gemm::PackedLinear in float,
// bf16_gemm::PackedLinear in bfloat16): one wording for the same mistakes. Not a public API.
#include <algorithm>
#include <cstdint>
#include <string>

#include "mha/core/error.h"
#include "mha/core/tensor.h"
#include "mha/core/view.h"

namespace mha::detail {

// weight: contiguous 2-D (out_features, in_features); bias: undefined or contiguous
// (out_features), copied into `bias_copy`. Sets out and in.
inline void check_packed_linear(View<const float> weight, View<const float> bias, const std::string& what,
                                int64_t& out, int64_t& in, Tensor<float>& bias_copy) {
  check(weight.dim() == 2 && row_major(weight), what, ": weight: expected a contiguous 2-D (out_features, "
        "in_features) view, got shape ", weight.shape(), " with strides ", weight.strides());
  out = weight.size(0);
  in = weight.size(1);
  if (bias.defined()) {
    check(bias.shape() == Shape{out} && row_major(bias), what, ": bias: expected a contiguous (", out,
          ") view, got shape ", bias.shape());
    bias_copy = Tensor<float>::uninitialized({out});
    std::copy_n(bias.data(), out, bias_copy.data());
  }
}

// x (..., in) as y's shape (..., out).
inline Shape packed_linear_output_shape(const Shape& x, int64_t in, int64_t out, const std::string& what) {
  check(!x.empty(), what, ": input: expected (..., ", in, "), got shape ", x);
  Shape y = x;
  y.back() = out;
  return y;
}

// x contiguous (..., in), y contiguous of x's shape with out last: the rows of the product.
template <class T>
int64_t check_packed_linear_io(const View<const T>& x, const View<T>& y, int64_t in, int64_t out,
                               const std::string& what) {
  check(x.dim() >= 1 && x.shape().back() == in && row_major(x), what, ": input: expected a contiguous (..., ", in,
        ") view, got shape ", x.shape(), " with strides ", x.strides());
  const Shape expected = packed_linear_output_shape(x.shape(), in, out, what);
  check(y.shape() == expected && row_major(y), what, ": output: expected a contiguous view of shape ", expected,
        ", got shape ", y.shape(), " with strides ", y.strides());
  return out == 0 ? 0 : y.numel() / out;
}

}  // namespace mha::detail
