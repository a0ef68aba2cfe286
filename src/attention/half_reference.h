#pragma once
// The reference backend on a call with bfloat16 or float16 operands (the check path, which the
// fused backends are tested against): the operands and options copied to float, the float call
// (sdpa_forward_into / sdpa_backward_into with Backend::reference), its results stored in the
// call's type. The outputs are checked (and zero where asked) already; the sinks' gradient is the
// caller's (sink_gradients, after the backend).
#include "mha/attention/attention.h"

namespace mha::attention::detail {

template <class T, class Kv>
void forward_in_float(View<const T> query, View<const Kv> key, View<const Kv> value, const ForwardOutputs<T>& out,
                      const Options<T>& options);

template <class T>
void backward_in_float(View<const T> query, View<const T> key, View<const T> value, View<const T> output,
                       View<const double> logsumexp, View<const T> grad_output, const GradientOutputs<T>& grads,
                       const Options<T>& options);

}  // namespace mha::attention::detail
