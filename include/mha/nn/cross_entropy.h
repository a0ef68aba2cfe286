#pragma once
// Cross-entropy of logits against class indices, averaged over the batch
// (torch.nn.functional.cross_entropy(logits, targets) with reduction="mean"):
//
//   log_softmax(z)_c = z_c − m − log Σ_k exp(z_k − m),   m = max_k z_k  (never overflows)
//   loss             = −(1/N) Σ_n log_softmax(z_n)_{t_n}
//   d loss / d z_nc  = (softmax(z_n)_c − [c == t_n]) / N
//
// The sums are accumulated in double for float and double.
#include <cstdint>

#include "mha/core/tensor.h"

namespace mha::nn {

template <class T>
struct CrossEntropyCache {
  Tensor<T> log_probabilities;  // (N, C)
  Tensor<int64_t> targets;      // (N)
};

// logits (N, C) with N >= 1, C >= 1; targets (N), each in [0, C). Non-finite logits are refused
// (mha::Error naming the row). Returns the mean loss; fills `cache` for backward when given.
template <class T>
T cross_entropy(const Tensor<T>& logits, const Tensor<int64_t>& targets, CrossEntropyCache<T>* cache = nullptr);

// d (grad_loss · loss) / d logits, (N, C).
template <class T>
Tensor<T> cross_entropy_backward(const CrossEntropyCache<T>& cache, T grad_loss = T(1));

}  // namespace mha::nn
