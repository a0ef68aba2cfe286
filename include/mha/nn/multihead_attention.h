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
#include <functional>
#include <optional>
#include <span>
#include <type_traits>
#include <variant>

#include "mha/attention/attention.h"
#include "mha/core/random.h"
#include "mha/nn/kv_cache.h"
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
  // mha's own: the attention core's settings (attention::Scoring: the sliding window, the logit
  // soft-cap, chunks, a scale other than 1/sqrt(head_dim)), applied by every call of the module:
  // forward, backward, forward_cached and the packed inference twin (module_scoring). Causality,
  // dropout and its seed are each call's (is_causal and the masks, `dropout` in training), and a
  // module is never a block of a larger call: those fields keep their defaults.
  attention::Scoring scoring;
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
  // mha's own, per call: attention sinks, one logit per head (num_heads) (attention::Options::sinks;
  // their gradient is MultiheadAttentionGradients::grad_sinks), and ALiBi slopes, (num_heads) or
  // (N, num_heads) (attention::Options::alibi_slopes; keys appended by add_bias_kv / add_zero_attn
  // are positions S, S + 1).
  std::optional<Tensor<T>> sinks, alibi_slopes;

  // The per-call views, in order, as (name, member pointer): the list the Python module door takes
  // them in and builds its keywords from (as attention::Options::visit_views for the functions).
  template <class Visitor>
  static constexpr void visit_views(Visitor&& v) {
    v("sinks", &MultiheadAttentionArgs::sinks);
    v("alibi_slopes", &MultiheadAttentionArgs::alibi_slopes);
  }
};

template <class T>
struct MultiheadAttentionOutput {
  Tensor<T> output;                       // same layout as query, last dim embed_dim
  std::optional<Tensor<T>> attn_weights;  // (N, L, S) averaged or (N, H, L, S); no N unbatched
};

// The parameters, as views of memory the caller owns (a MultiheadAttention's tensors, torch's
// nn.Parameters), each contiguous and named and shaped as in PyTorch's state_dict
// (E = embed_dim). Which are given follows the options, and the functions below check it:
//   in_proj_weight (3E, E)                     when kdim == vdim == E (packed), else undefined
//   q_proj_weight (E, E), k_proj_weight (E, kdim), v_proj_weight (E, vdim)
//                                              when not packed, else undefined
//   in_proj_bias (3E), out_proj_bias (E)       exactly when options.bias
//   bias_k, bias_v (1, 1, E)                   exactly when options.add_bias_kv
//   out_proj_weight (E, E)                     always
template <class T>
struct MultiheadAttentionWeights {
  View<const T> in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight;
  View<const T> in_proj_bias, bias_k, bias_v;
  View<const T> out_proj_weight, out_proj_bias;
};

// Where backward ADDS the parameter gradients: views of the weights' shapes, contiguous, no two
// overlapping. Any may be left undefined (that gradient is not computed); a defined one must
// belong to a given weight.
template <class T>
struct MultiheadAttentionWeightGradients {
  View<T> in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight;
  View<T> in_proj_bias, bias_k, bias_v;
  View<T> out_proj_weight, out_proj_bias;
};

// The masks as the attention core takes them, for the forward's query (N, L, ·) and key
// (N, S, ·) shapes: at most one bool mask in the core's polarity (true = may attend) and one
// float mask added to the scores, each rank 4 (N|1, H|1, L|1, S') with S' counting the
// add_bias_kv / add_zero_attn columns; plus the causality the is_causal hint turns into, and the
// call's sinks and ALiBi slopes.
template <class T>
struct MultiheadAttentionMasks {
  std::optional<Tensor<bool>> attend_mask;
  std::optional<Tensor<T>> additive_mask;
  attention::Causal causal = attention::Causal::none;
  std::optional<Tensor<T>> sinks, alibi_slopes;  // the call's (MultiheadAttentionArgs), as given

  // The attention core's options: these masks (as views: they must outlive the options) and their
  // causality on top of `scoring` (module_scoring).
  attention::Options<T> core_options(const attention::Scoring& scoring) const;
};

// The attention core's settings of a call of the module: its window and this dropout, the seed 0
// without dropout (so that calls that draw nothing compare equal). With core_options, the one
// place the module's core calls (forward, backward, forward_cached, the packed inference twin)
// get their settings from.
attention::Scoring module_scoring(const MultiheadAttentionOptions& options, double dropout_p, uint64_t dropout_seed);

// What backward reads, as views: the forward's inputs in the caller's layout, what the forward
// computed (its cache), and the attention core's options it ran with (masks as views, causality,
// dropout). Views let a caller that keeps these itself (the Python binding: in torch tensors) run
// backward without copies.
template <class T>
struct MultiheadAttentionSaved {
  View<const T> query, key, value;  // as passed to forward, contiguous
  View<const T> q, k, v;            // projections (N, L, E) and (N, S', E), S' counting appended keys
  View<const double> logsumexp;     // (N, H, L)
  View<const T> merged;             // the attention's output, heads merged, (N, L, E)
  attention::Options<T> core;       // masks.core_options(scoring) (backend: backward's own)
};

// What forward computes for backward (the module keeps it; the free forward fills it).
template <class T>
struct MultiheadAttentionCache {
  Tensor<T> query, key, value;  // copies of the inputs; filled by MultiheadAttention::forward only
  Tensor<T> q, k, v;            // projections (N, L, E) and (N, S', E), S' counting appended keys;
                                // the attention core reads them as heads (N, H, ·, hd) in place
  Tensor<double> logsumexp;     // (N, H, L)
  Tensor<T> merged;             // the attention's output, heads merged, (N, L, E): out_proj's input
  MultiheadAttentionMasks<T> masks;
  attention::Scoring scoring;  // module_scoring of the forward

  // Views of all of it (query, key, value included: this cache must be the module's).
  MultiheadAttentionSaved<T> saved() const;
};

template <class T>
struct MultiheadAttentionGradients {
  Tensor<T> grad_query, grad_key, grad_value;  // same shapes as the inputs
  std::optional<Tensor<T>> grad_sinks;         // (num_heads), when the forward had sinks
};

// Checks the options (num_heads, divisibility, dropout, widths) and fills kdim and vdim in;
// throws mha::Error naming the option.
MultiheadAttentionOptions resolved_options(MultiheadAttentionOptions options);

// Everything multi_head_attention_forward does to attn_mask and key_padding_mask, checked
// against the batch-first shapes query (N, L, ·), key (N, S, ·); `unbatched`: the masks come
// without N (key_padding_mask (S), attn_mask (num_heads, L, S)).
template <class T>
MultiheadAttentionMasks<T> multihead_attention_masks(const MultiheadAttentionOptions& options,
                                                     const MultiheadAttentionArgs<T>& args, int64_t n, int64_t len,
                                                     int64_t src_len, bool unbatched);

// The attention core the module calls between its projections: sdpa_forward_into and
// sdpa_backward_into (attention.h) unless a caller puts another implementation of the same
// contract, with the same arguments, in their place (mha::distributed's context-parallel
// attention). Either both functions or neither.
template <class T>
struct AttentionCore {
  std::function<void(View<const T>, View<const T>, View<const T>, const attention::ForwardOutputs<T>&,
                     const attention::Options<T>&)>
      forward;
  std::function<void(View<const T>, View<const T>, View<const T>, View<const T>, View<const double>, View<const T>,
                     const attention::GradientOutputs<T>&, const attention::Options<T>&)>
      backward;
};

// The module's computation on parameters the caller owns; MultiheadAttention's forward and
// backward are these on views of its own tensors. Inputs are contiguous views in the layout of
// the options (batch_first or not, or unbatched 2-D). In training, dropout is options.dropout
// with mask seed `dropout_seed`; otherwise none. `cache` (optional) receives what backward needs
// except the inputs, which the caller keeps.
template <class T>
MultiheadAttentionOutput<T> multihead_attention_forward(const MultiheadAttentionOptions& options,
                                                        const MultiheadAttentionWeights<T>& weights,
                                                        View<const std::type_identity_t<T>> query,
                                                        View<const std::type_identity_t<T>> key,
                                                        View<const std::type_identity_t<T>> value,
                                                        const MultiheadAttentionArgs<T>& args, bool training,
                                                        uint64_t dropout_seed,
                                                        attention::Backend backend = attention::Backend::automatic,
                                                        MultiheadAttentionCache<T>* cache = nullptr,
                                                        const AttentionCore<T>& core = {});

// Gradients of sum(output ∘ grad_output) for query, key and value (returned), and for the
// parameters (added into `grads`). `options`, `weights` and `backend` must be the forward's.
template <class T>
MultiheadAttentionGradients<T> multihead_attention_backward(const MultiheadAttentionOptions& options,
                                                            const MultiheadAttentionWeights<T>& weights,
                                                            View<const std::type_identity_t<T>> grad_output,
                                                            const MultiheadAttentionSaved<T>& saved,
                                                            const MultiheadAttentionWeightGradients<T>& grads,
                                                            attention::Backend backend = attention::Backend::automatic,
                                                            const AttentionCore<T>& core = {});

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

  // Generation: the self-attention of new tokens x ((N, T, E) batch_first, (T, N, E) otherwise,
  // (T, E) unbatched) over the tokens before them, whose keys and values `cache` holds, and over
  // themselves. Projects x, appends its keys and values to the cache (sequence n takes its first
  // counts[n] tokens, all T when counts is empty: KVCache::append), attends causally (attend in
  // kv_cache.h; padding tokens give 0 before out_proj), then out_proj; returns x's layout.
  // Token by token it gives what forward() gives for the whole sequence with a causal attn_mask.
  // One cache per layer, of batch N (1 unbatched), num_heads kv heads, head_dim both sizes.
  // Float modules only; inference: no dropout, no weights; kdim = vdim = embed_dim, no
  // add_bias_kv or add_zero_attn (each a clear mha::Error).
  template <class Kv>
  Tensor<T> forward_cached(const Tensor<T>& x, KVCache<Kv>& cache, std::span<const int64_t> counts = {});

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
  // Another implementation of the attention core, when set (AttentionCore).
  AttentionCore<T> core;

 private:
  struct Param {
    Tensor<T> value, grad;
  };
  MultiheadAttentionWeights<T> weights() const;
  MultiheadAttentionWeightGradients<T> weight_gradients();

  MultiheadAttentionOptions options_;
  Generator generator_;
  Param in_proj_weight_, q_proj_weight_, k_proj_weight_, v_proj_weight_;
  Param in_proj_bias_, bias_k_, bias_v_, out_proj_weight_, out_proj_bias_;
};

}  // namespace mha::nn
