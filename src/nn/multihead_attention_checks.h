#pragma once
// MultiheadAttention's checks of its parameters and of their gradients against the options
// (not a public API; multihead_attention_checks.cpp). resolved_options, the options' own checks,
// is public (mha/nn/multihead_attention.h).
#include "mha/nn/multihead_attention.h"

namespace mha::nn::detail {

// Every parameter given exactly when the options say, with the shape they imply, contiguous.
template <class T>
void check_weights(const MultiheadAttentionOptions& o, const MultiheadAttentionWeights<T>& w);

// A gradient may be absent (not computed); a given one has its weight's shape and overlaps no
// other gradient (each is added into).
template <class T>
void check_gradients(const MultiheadAttentionOptions& o, const MultiheadAttentionWeightGradients<T>& g);

}  // namespace mha::nn::detail
