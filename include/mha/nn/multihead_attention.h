#pragma once
// mha::nn::MultiheadAttention: torch.nn.MultiheadAttention, argument for argument, with the
// same state_dict names, shapes and initialisation, plus backward.
//
// Layouts (as PyTorch): query (L, N, E), key (S, N, kdim), value (S, N, vdim) by default;
// (N, L, E) ... with batch_first; unbatched (L, E), (S, kdim), (S, vdim) for 2-D input.
// Masks (MHA polarity): a bool True means "may NOT attend"; a float mask is ADDED to the
// scores. key_padding_mask (N, S) or (S) unbatched; attn_mask (L, S) or (N·num_heads, L, S)
// (index n·num_heads + h) or (num_heads, L, S) unbatched.
//
// One deliberate difference: a query row whose keys are all masked gives output 0 (and zero
// gradient) on every path, as PyTorch's need_weights=False (SDPA) path does. PyTorch's
// need_weights=True path returns NaN for such rows (pytorch/pytorch#41508, #152028).
#include <cstdint>
#include <optional>
#include <variant>

#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/nn/linear.h"
#include "mha/nn/module.h"

namespace mha::nn {

struct MultiheadAttentionOptions {
  int64_t embed_dim = 0;
  int64_t num_heads = 0;
  double dropout = 0.0;
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  std::optional<int64_t> kdim;  // defaults to embed_dim
  std::optional<int64_t> vdim;  // defaults to embed_dim
  bool batch_first = false;
};

// A mask is bool (True = blocked) or float (added), as in PyTorch's MHA.
template <class T>
using Mask = std::variant<Tensor<bool>, Tensor<T>>;

template <class T>
struct MultiheadAttentionArgs {
  std::optional<Mask<T>> key_padding_mask;
  bool need_weights = true;
  std::optional<Mask<T>> attn_mask;
  bool average_attn_weights = true;
  // A hint that attn_mask is the causal mask; like PyTorch it requires attn_mask, and with
  // need_weights=false and no key_padding_mask the mask is replaced by top-left causality.
  bool is_causal = false;
};

template <class T>
struct MultiheadAttentionOutput {
  Tensor<T> output;                       // same layout as query, last dim embed_dim
  std::optional<Tensor<T>> attn_weights;  // (N, L, S) averaged or (N, H, L, S); no N unbatched
};

// Everything backward needs, saved by forward.
template <class T>
struct MultiheadAttentionCache {
  Tensor<T> query, key, value;  // inputs, batch-first (N, L, ·)
  Tensor<T> q, k, v;            // projections (N, L, E) and (N, S', E), S' counting appended keys;
                                // the attention core reads them as heads (N, H, ·, hd) in place
  Tensor<double> logsumexp;     // (N, H, L)
  Tensor<T> merged;             // the attention's output, heads merged, (N, L, E): out_proj's input
  std::optional<Tensor<bool>> attend_mask;
  std::optional<Tensor<T>> additive_mask;
  attention::Causal causal = attention::Causal::none;
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  bool unbatched = false;
  bool batch_first = false;
};

template <class T>
struct MultiheadAttentionGradients {
  Tensor<T> grad_query, grad_key, grad_value;  // same shapes as the inputs
};

template <class T>
class MultiheadAttention : public Module<T> {
 public:
  // Parameters are initialised as PyTorch does, from `seed`; later forward calls in training
  // mode draw their dropout seeds from the same stream.
  explicit MultiheadAttention(const MultiheadAttentionOptions& options, uint64_t seed = 0);

  MultiheadAttentionOutput<T> forward(const Tensor<T>& query, const Tensor<T>& key,
                                      const Tensor<T>& value,
                                      const MultiheadAttentionArgs<T>& args = {},
                                      MultiheadAttentionCache<T>* cache = nullptr);

  // Gradients of sum(output ∘ grad_output) for query, key and value; parameter gradients are
  // added to the grad tensors listed by parameters().
  MultiheadAttentionGradients<T> backward(const Tensor<T>& grad_output,
                                          const MultiheadAttentionCache<T>& cache);

  std::vector<Parameter<T>> parameters() override;

  const MultiheadAttentionOptions& options() const { return options_; }
  int64_t head_dim() const { return options_.embed_dim / options_.num_heads; }
  int64_t kdim() const { return *options_.kdim; }
  int64_t vdim() const { return *options_.vdim; }
  // PyTorch's _qkv_same_embed_dim: one packed in_proj_weight instead of three.
  bool packed_in_projection() const { return kdim() == options_.embed_dim && vdim() == options_.embed_dim; }

  // The backend the attention core runs on (automatic: cpu_flash for float, reference for double).
  attention::Backend backend = attention::Backend::automatic;

 private:
  struct Param {
    Tensor<T> value, grad;
  };
  // The input projection for which = 0 (q), 1 (k), 2 (v): rows [E·which, E·(which+1)) of the
  // packed in_proj_weight, or the separate weight.
  WeightView<T> projection_weight(int which) const;
  T* projection_weight_grad(int which);

  MultiheadAttentionOptions options_;
  Generator generator_;
  Param in_proj_weight_, q_proj_weight_, k_proj_weight_, v_proj_weight_;
  Param in_proj_bias_, bias_k_, bias_v_, out_proj_weight_, out_proj_bias_;
};

}  // namespace mha::nn
