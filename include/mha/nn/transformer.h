#pragma once
// torch.nn.TransformerEncoderLayer and torch.nn.TransformerEncoder, argument for argument, with
// PyTorch's state_dict names and initialisation, plus backward.
//
// One layer (x is src; sa = self-attention block, ff = feed-forward block):
//   norm_first = false (post-norm, the default; BERT's layer):
//     x = norm1(x + sa(x));  x = norm2(x + ff(x))
//   norm_first = true (pre-norm; tutorial 001's block is its first half, x + sa(norm1(x))):
//     x = x + sa(norm1(x));  x = x + ff(norm2(x))
//   sa(x) = dropout1(self_attn(x, x, x, attn_mask=src_mask, key_padding_mask=src_key_padding_mask,
//                              need_weights=False, is_causal=is_causal))
//   ff(x) = dropout2(linear2(dropout(activation(linear1(x)))))
//
// Layouts as PyTorch: src (S, N, E), or (N, S, E) with batch_first, or unbatched (S, E).
// Masks in PyTorch's polarity: bool True = "may NOT attend"; float masks are added.
//   src_mask (S, S) or (N·nhead, S, S); src_key_padding_mask (N, S), or (S) unbatched.
//
// Parameters (PyTorch's names): self_attn.in_proj_weight, self_attn.in_proj_bias,
// self_attn.out_proj.weight, self_attn.out_proj.bias, linear1.weight, linear1.bias,
// linear2.weight, linear2.bias, norm1.weight, norm1.bias, norm2.weight, norm2.bias (the biases
// only with bias = true). TransformerEncoder prefixes them with "layers.<i>." and adds
// "norm.weight", "norm.bias" for the optional final norm.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mha/core/tensor.h"
#include "mha/nn/dropout.h"
#include "mha/nn/gelu.h"
#include "mha/nn/layer_norm.h"
#include "mha/nn/linear.h"
#include "mha/nn/module.h"
#include "mha/nn/multihead_attention.h"

namespace mha::nn {

// The feed-forward activation: PyTorch's "relu" or "gelu" (exact, erf-based).
enum class Activation { relu, gelu };
// "relu" or "gelu"; anything else is an mha::Error naming the value.
Activation activation_from_string(const std::string& name);
std::string activation_name(Activation activation);

struct TransformerEncoderLayerOptions {
  int64_t d_model = 0;
  int64_t nhead = 0;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  Activation activation = Activation::relu;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  bool bias = true;
};

// forward's arguments besides src (PyTorch's src_mask, src_key_padding_mask, is_causal).
template <class T>
struct TransformerEncoderArgs {
  std::optional<Mask<T>> src_mask;
  std::optional<Mask<T>> src_key_padding_mask;
  // A hint that src_mask is the causal mask (PyTorch requires src_mask with it).
  bool is_causal = false;
};

// What one layer's forward saves for backward (filled when a cache is passed).
template <class T>
struct TransformerEncoderLayerCache {
  MultiheadAttentionCache<T> self_attn;
  typename LayerNorm<T>::Cache norm1, norm2;
  typename Linear<T>::Cache linear1, linear2;
  typename Dropout<T>::Cache dropout, dropout1, dropout2;  // after the activation, sa, ff
  Tensor<T> activation_input;                              // linear1's output
  bool filled = false;
};

template <class T>
class TransformerEncoderLayer : public Module<T> {
 public:
  // Parameters initialised as PyTorch initialises them (self_attn as MultiheadAttention does,
  // linear1/linear2 as Linear does, norms to 1 and 0), from `seed`; the three dropouts draw
  // their masks from seeds derived from it. Options are checked (mha::Error naming the option).
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options, uint64_t seed = 0);

  // Same shape out as src. In eval mode with no cache this is the inference path: nothing is
  // kept for backward. Bad shapes and masks are mha::Error naming the argument. The submodules
  // run in this layer's train/eval mode.
  Tensor<T> forward(const Tensor<T>& src, const TransformerEncoderArgs<T>& args = {},
                    TransformerEncoderLayerCache<T>* cache = nullptr);
  // Gradient of sum(output ∘ grad_output) for src; parameter gradients are added.
  Tensor<T> backward(const Tensor<T>& grad_output, const TransformerEncoderLayerCache<T>& cache);

  std::vector<Parameter<T>> parameters() override;
  const TransformerEncoderLayerOptions& options() const { return options_; }

  MultiheadAttention<T> self_attn;
  Linear<T> linear1, linear2;
  LayerNorm<T> norm1, norm2;
  Dropout<T> dropout, dropout1, dropout2;

 private:
  Tensor<T> self_attention_block(const Tensor<T>& x, const TransformerEncoderArgs<T>& args,
                                 TransformerEncoderLayerCache<T>* cache);
  Tensor<T> feed_forward_block(const Tensor<T>& x, TransformerEncoderLayerCache<T>* cache);
  Tensor<T> self_attention_backward(const Tensor<T>& grad, const TransformerEncoderLayerCache<T>& cache);
  Tensor<T> feed_forward_backward(const Tensor<T>& grad, const TransformerEncoderLayerCache<T>& cache);

  TransformerEncoderLayerOptions options_;
};

struct TransformerEncoderOptions {
  int64_t num_layers = 1;
  bool final_norm = false;  // PyTorch's norm=LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
};

template <class T>
struct TransformerEncoderCache {
  std::vector<TransformerEncoderLayerCache<T>> layers;
  typename LayerNorm<T>::Cache norm;
  bool filled = false;
};

// torch.nn.TransformerEncoder(encoder_layer, num_layers, norm): num_layers copies of
// `encoder_layer` (as PyTorch's deepcopy: every layer starts with the same weights).
template <class T>
class TransformerEncoder : public Module<T> {
 public:
  TransformerEncoder(const TransformerEncoderLayer<T>& encoder_layer, const TransformerEncoderOptions& options);

  Tensor<T> forward(const Tensor<T>& src, const TransformerEncoderArgs<T>& args = {},
                    TransformerEncoderCache<T>* cache = nullptr);
  Tensor<T> backward(const Tensor<T>& grad_output, const TransformerEncoderCache<T>& cache);

  std::vector<Parameter<T>> parameters() override;
  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  TransformerEncoderLayer<T>& layer(int64_t i);

  std::vector<TransformerEncoderLayer<T>> layers;
  std::optional<LayerNorm<T>> norm;
};

}  // namespace mha::nn
