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

// The exact GELU (approximate none) as a bfloat16 layer computes it, on the calling thread: y[i] =
// GELU(x[i] rounded to bfloat16) rounded to bfloat16 (to nearest, ties to even), as PyTorch's
// bfloat16 layers compute it from a bfloat16 input. NaN stays NaN; a float that rounds past
// bfloat16's largest is ±inf first (GELU(−inf) = NaN, as PyTorch's of a bfloat16 −inf). Looked up
// in a table of all 65 536 bfloat16s' exact GELU correctly rounded (256 KiB, built on first use),
// on every SIMD target (tested on every bfloat16 against erfc in long double). Why a second GELU:
// the float one (SLEEF's erfc) was 17 % of the bfloat16 sentence encoder's time on Zen 4, and a
// polynomial erfc after it still 20 % on an Intel host; the table takes 0.21–0.25 ns a value
// against that polynomial's 0.79–0.86 (one core, session 41). The bfloat16 Transformer layers and
// gelu<bfloat16> use it.
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
