#pragma once
// The reference backend: the definition of attention written as plainly as possible, one query
// row at a time. Every faster backend is tested against it; it is templated on the scalar type
// so the tests can run it in double.
#include "mha/attention/attention.h"
#include "problem.h"

namespace mha::attention::detail {

template <class T>
ForwardResult<T> reference_forward(const Problem& p, const Masks<T>& masks, const Tensor<T>& query,
                                   const Tensor<T>& key, const Tensor<T>& value, bool need_weights);

template <class T>
Gradients<T> reference_backward(const Problem& p, const Masks<T>& masks, const Tensor<T>& query,
                                const Tensor<T>& key, const Tensor<T>& value, const Tensor<T>& output,
                                const Tensor<double>& logsumexp, const Tensor<T>& grad_output);

}  // namespace mha::attention::detail
