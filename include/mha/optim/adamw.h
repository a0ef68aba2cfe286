#pragma once
// AdamW (Loshchilov and Hutter, "Decoupled weight decay regularization", ICLR 2019), exactly as
// torch.optim.AdamW (foreach=False, amsgrad=False) computes it, operation for operation in the
// parameter's precision, so a twin run in PyTorch follows the same trajectory:
//
//   step   += 1
//   p      *= 1 − lr · weight_decay                       (decoupled weight decay, first)
//   m       = m + (1 − β1) · (g − m)                      (torch's lerp_)
//   v       = v · β2 + (1 − β2) · g · g
//   denom   = sqrt(v) / sqrt(1 − β2^step) + eps            (eps outside the square root)
//   p      += −(lr / (1 − β1^step)) · m / denom
//
// The learning rate may change between steps (set_lr, e.g. from a schedule). State per
// parameter: step, exp_avg (m), exp_avg_sq (v), saved and restored by state_dict /
// load_state_dict under "<parameter name>.exp_avg", "<parameter name>.exp_avg_sq" and
// "<parameter name>.step", so a resumed run continues bitwise as an uninterrupted one.
#include <cstdint>
#include <vector>

#include "mha/nn/module.h"

namespace mha::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // PyTorch's AdamW default
};

// Throws mha::Error naming the option unless lr >= 0, 0 <= β1, β2 < 1, eps >= 0 and
// weight_decay >= 0, all finite (PyTorch's checks).
void check_options(const AdamWOptions& options);

template <class T>
class AdamW {
 public:
  // `parameters` (from Module::parameters()) must outlive the optimizer; names must be unique
  // and every gradient must have its value's shape.
  AdamW(std::vector<nn::Parameter<T>> parameters, const AdamWOptions& options = {});

  // One update of every parameter from its current gradient.
  void step();
  // Zeroes every gradient.
  void zero_grad();

  double lr() const { return options_.lr; }
  void set_lr(double lr);
  const AdamWOptions& options() const { return options_; }
  // Number of step() calls so far (restored by load_state_dict).
  int64_t steps() const { return steps_; }

  nn::StateDict<T> state_dict() const;
  // Strict: exactly the names state_dict() writes, with the parameters' shapes; every step the
  // same. mha::Error lists what does not match.
  void load_state_dict(const nn::StateDict<T>& state);

 private:
  struct Slot {
    Tensor<T> exp_avg, exp_avg_sq;
  };
  std::vector<nn::Parameter<T>> parameters_;
  std::vector<Slot> slots_;
  AdamWOptions options_;
  int64_t steps_ = 0;
};

}  // namespace mha::optim
