#pragma once
// torch.nn.Dropout: in training, each element is zeroed with probability p and the survivors are
// scaled by 1 / (1 − p); in eval mode (or p == 0) the layer is the identity.
//
// p must be in [0, 1]. p == 1 is allowed, as in PyTorch: every element is dropped, the output
// and the input gradient are all zeros (no division by zero happens).
//
// The mask is counter-based (Philox4x32-10 from mha/core/random.h), so it is a pure function of
// (seed, counter, element index):
//   element i is kept  iff  uniform_from_bits(philox4x32({lo(i/4), hi(i/4), lo(counter),
//                                                          hi(counter)}, seed)[i % 4]) >= p
// The layer holds a seed and a counter; every forward in training mode uses the current counter
// and then increments it, so consecutive calls draw different masks and a run started from the
// same (seed, counter) is reproduced exactly (float and double draw the same masks). Eval-mode
// forwards do not advance the counter.
#include <cstdint>
#include <vector>

#include "mha/core/tensor.h"
#include "mha/nn/module.h"

namespace mha::nn {

// The keep mask (true = kept) for a tensor of `shape`, as described above. p in [0, 1].
Tensor<bool> dropout_mask(const Shape& shape, double p, uint64_t seed, uint64_t counter);

// x ∘ keep / (1 − p) (zeros when p == 1). keep must have x's shape.
template <class T>
Tensor<T> dropout_apply(const Tensor<T>& x, const Tensor<bool>& keep, double p);

template <class T>
class Dropout : public Module<T> {
 public:
  struct Cache {
    Tensor<bool> keep;  // the mask used; undefined when the forward was the identity
    double p = 0.0;
    Shape shape;  // the input's shape
    bool filled = false;
  };

  explicit Dropout(double p = 0.5, uint64_t seed = 0);

  double p() const { return p_; }
  uint64_t seed() const { return seed_; }
  // The counter the next training-mode forward will use.
  uint64_t counter() const { return counter_; }
  void set_counter(uint64_t counter) { counter_ = counter; }
  // New seed; the counter restarts at `counter`.
  void reseed(uint64_t seed, uint64_t counter = 0) {
    seed_ = seed;
    counter_ = counter;
  }

  // Any shape (rank 0 included). Not const: a training-mode call advances the counter.
  Tensor<T> forward(const Tensor<T>& x, Cache* cache = nullptr);
  // grad_output ∘ keep / (1 − p), or grad_output unchanged when the forward was the identity.
  Tensor<T> backward(const Tensor<T>& grad_output, const Cache& cache) const;

  std::vector<Parameter<T>> parameters() override { return {}; }

 private:
  double p_;
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace mha::nn
