#pragma once
// GELU, elementwise on a tensor of any shape (torch.nn.GELU / F.gelu):
//   approximate none: y = x · Φ(x) = 0.5 · x · (1 + erf(x / √2))
//   approximate tanh: y = 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))
// The backward is the exact derivative of whichever formula the forward used.
#include <string>
#include <vector>

#include "mha/core/tensor.h"
#include "mha/nn/module.h"

namespace mha::nn {

enum class GeluApproximation { none, tanh };

// "none" or "tanh" (PyTorch's `approximate` argument); anything else is an mha::Error.
GeluApproximation gelu_approximation_from_string(const std::string& name);
// "none" / "tanh". (Not named to_string: that would hide mha::to_string(Shape) in mha::nn.)
std::string gelu_approximation_name(GeluApproximation approximation);

template <class T>
Tensor<T> gelu(const Tensor<T>& x, GeluApproximation approximation = GeluApproximation::none);
// grad_output ∘ gelu'(x). grad_output must have x's shape.
template <class T>
Tensor<T> gelu_backward(const Tensor<T>& x, const Tensor<T>& grad_output,
                        GeluApproximation approximation = GeluApproximation::none);

// The exact GELU (approximate none) on float values whose results are rounded to bfloat16 next,
// on the calling thread: y[i] = x[i]·Φ(x[i]) with erfc by Numerical Recipes' erfcc (fractional
// error < 1.2e-7; Press et al., §6.2) and Highway's Exp, every lane the same code on every SIMD
// target. Within (1.2e-7 + (5a² + 16)·2⁻²⁴)·|y| of the exact value, a = |x|/√2 (tested): far
// below bfloat16's 2⁻⁹. Why a second GELU: SLEEF's erfc (gelu's, 1.5 ULP) was 17 % of the
// bfloat16 sentence encoder's time (perf, all-MiniLM-L6-v2, batch 32); this one takes 0.95 ns a
// value against 3.1 (one Zen 4 core). The bfloat16 Transformer layers use it.
void gelu_for_bfloat16(const float* x, float* y, int64_t n);

template <class T>
class GELU : public Module<T> {
 public:
  struct Cache {
    Tensor<T> input;
  };
  explicit GELU(GeluApproximation approximation = GeluApproximation::none)
      : approximation_(approximation) {}
  explicit GELU(const std::string& approximate)
      : approximation_(gelu_approximation_from_string(approximate)) {}

  GeluApproximation approximation() const { return approximation_; }

  Tensor<T> forward(const Tensor<T>& x, Cache* cache = nullptr) const;
  Tensor<T> backward(const Tensor<T>& grad_output, const Cache& cache) const;
  std::vector<Parameter<T>> parameters() override { return {}; }

 private:
  GeluApproximation approximation_;
};

}  // namespace mha::nn
