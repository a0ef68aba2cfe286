#pragma once
// The reference backend: the definition of attention written as plainly as possible, one query
// row at a time. Every faster backend is tested against it; it is templated on the scalar type
// so the tests can run it in double.
#include "mha/attention/attention.h"
#include "problem.h"

namespace mha::attention::detail {

template <class T>
void reference_forward(const Problem& p, const ScoreAdditions<T>& additions, const ForwardArgs<T>& a);

template <class T>
void reference_backward(const Problem& p, const ScoreAdditions<T>& additions, const BackwardArgs<T>& a);

}  // namespace mha::attention::detail
