// The reference on a bfloat16 or float16 call, run in float (half_reference.h).
#include "half_reference.h"

#include <type_traits>
#include <vector>

#include "mha/core/half.h"

namespace mha::attention::detail {
namespace {

// f(offset, n) for the n-th element of v in row-major order (any rank, any strides), offset its
// place in v's memory.
template <class V, class F>
void for_each_element(const V& v, F f) {
  const int64_t d = v.dim();
  for (int64_t n = 0; n < v.numel(); ++n) {
    int64_t offset = 0, rest = n;
    for (int64_t a = d - 1; a >= 0; --a) {
      offset += (rest % v.size(a)) * v.stride(a);
      rest /= v.size(a);
    }
    f(offset, n);
  }
}

// A contiguous float copy of a view (any rank and strides; a broadcast one is made whole): the
// reference's operands in a bfloat16 or float16 call.
template <class H>
Tensor<float> to_float(const View<const H>& v) {
  Tensor<float> t(v.shape());
  for_each_element(v, [&](int64_t offset, int64_t n) { t.data()[n] = widen(v.data()[offset]); });
  return t;
}

// dst (+)= src, stored as T: the reference's float results into a bfloat16 or float16 call's outputs.
template <class T>
void store(const View<T>& dst, const Tensor<float>& src, bool accumulate) {
  for_each_element(dst, [&](int64_t offset, int64_t n) {
    T& x = dst.data()[offset];
    x = narrow<T>(accumulate ? widen(x) + src.data()[n] : src.data()[n]);
  });
}

// A half-precision call's options for the reference, which runs it in float: every view by the
// list (Options::visit_views), those of T (a mask, the sinks, the slopes) copied to float (`held`
// keeps the copies), the others (bool, int64) as they are.
template <class T>
Options<float> float_options(const Options<T>& options, std::vector<Tensor<float>>& held) {
  Options<float> o;
  static_cast<Scoring&>(o) = options;
  o.need_weights = options.need_weights;
  o.backend = Backend::reference;
  int index = 0;  // the two lists' entries are the same views in the same order
  Options<T>::visit_views([&](const char*, auto from) {
    int other = 0;
    Options<float>::visit_views([&](const char*, auto to) {
      if (other++ != index) return;
      const auto& v = options.*from;
      using From = std::remove_cvref_t<decltype(v)>;
      using To = std::remove_cvref_t<decltype(o.*to)>;
      if constexpr (std::is_same_v<From, View<const T>> && std::is_same_v<To, View<const float>>) {
        if (v.defined()) o.*to = held.emplace_back(to_float(v));
      } else if constexpr (std::is_same_v<From, To>) {
        o.*to = v;
      }
    });
    ++index;
  });
  return o;
}

}  // namespace

template <class T, class Kv>
void forward_in_float(View<const T> query, View<const Kv> key, View<const Kv> value, const ForwardOutputs<T>& out,
                      const Options<T>& options) {
  std::vector<Tensor<float>> held;
  const Options<float> o = float_options(options, held);
  const Tensor<float> k = to_float(key), v = to_float(value);
  if constexpr (std::is_same_v<T, float>) {  // float queries, bfloat16 or float16 keys and values
    sdpa_forward_into<float>(query, k, v, out, o);
  } else {
    const Tensor<float> q = to_float(query);
    Tensor<float> output(out.output.shape());
    Tensor<float> weights(out.weights.defined() ? out.weights.shape() : Shape{0});
    sdpa_forward_into<float>(q, k, v, {output, out.logsumexp, out.weights.defined() ? View<float>(weights) : View<float>()},
                             o);
    store(out.output, output, false);
    if (out.weights.defined()) store(out.weights, weights, false);
  }
}

template <class T>
void backward_in_float(View<const T> query, View<const T> key, View<const T> value, View<const T> output,
                       View<const double> logsumexp, View<const T> grad_output, const GradientOutputs<T>& grads,
                       const Options<T>& options) {
  std::vector<Tensor<float>> held;
  const Options<float> o = float_options(options, held);
  Tensor<float> dq(query.shape()), dk(key.shape()), dv(value.shape());
  sdpa_backward_into<float>(to_float(query), to_float(key), to_float(value), to_float(output), logsumexp,
                           to_float(grad_output), {dq, dk, dv, false, {}}, o);
  store(grads.grad_query, dq, grads.accumulate);
  store(grads.grad_key, dk, grads.accumulate);
  store(grads.grad_value, dv, grads.accumulate);
}

template void forward_in_float(View<const bfloat16>, View<const bfloat16>, View<const bfloat16>,
                               const ForwardOutputs<bfloat16>&, const Options<bfloat16>&);
template void forward_in_float(View<const float16>, View<const float16>, View<const float16>,
                               const ForwardOutputs<float16>&, const Options<float16>&);
template void forward_in_float(View<const float>, View<const bfloat16>, View<const bfloat16>,
                               const ForwardOutputs<float>&, const Options<float>&);
template void forward_in_float(View<const float>, View<const float16>, View<const float16>,
                               const ForwardOutputs<float>&, const Options<float>&);
template void backward_in_float(View<const bfloat16>, View<const bfloat16>, View<const bfloat16>, View<const bfloat16>,
                                View<const double>, View<const bfloat16>, const GradientOutputs<bfloat16>&,
                                const Options<bfloat16>&);
template void backward_in_float(View<const float16>, View<const float16>, View<const float16>, View<const float16>,
                                View<const double>, View<const float16>, const GradientOutputs<float16>&,
                                const Options<float16>&);

}  // namespace mha::attention::detail
